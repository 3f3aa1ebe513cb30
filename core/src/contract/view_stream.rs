//! The view stream: a member's own view pushed to it as it changes, over one connection the
//! trainer opened and the control plane holds.
//!
//! The trainer sends `GET {view_path}?after=V` signed as any of its requests, with
//! `Connection: upgrade` and `Upgrade: murmur-view/1`. The control plane answers
//! `101 Switching Protocols` and from then on writes frames, the first as soon as it has a view
//! newer than `V`:
//! - `{length} {signature}\n` and then `length` bytes: the view as JSON, signed as a
//!   long-polled view is ([`topology_signature`](super::control::topology_signature) over the
//!   view path and the bytes);
//! - `\n` alone, every [`LONG_POLL_HOLD_SECONDS`](super::control::LONG_POLL_HOLD_SECONDS) without
//!   a new view: the stream is alive.
//!
//! The trainer sends nothing more; anything it sends, or its close, ends the stream. A control
//! plane that does not stream answers the request as a long-poll (200 or 204).
//!
//! Why: a long-poll holds an HTTP connection, and the server's per-connection buffers with it,
//! for every member; an upgraded stream holds the socket alone, and a change is one write to the
//! members it touches instead of an answer and a new request from each.

use thiserror::Error;

/// What a trainer asks to upgrade to.
pub const PROTOCOL: &str = "murmur-view/1";

/// The most bytes a frame's view may take (a view holds a member's neighbours, not the job).
pub const MAX_VIEW_BYTES: usize = 16 << 20;

/// The most bytes a frame's head may take: a length and a hex HMAC-SHA256.
const MAX_HEAD_BYTES: usize = 128;

/// A frame that says the stream is alive.
pub const ALIVE: &[u8] = b"\n";

/// One frame on the wire: `body` with its `signature`.
pub fn frame(signature: &str, body: &[u8]) -> Vec<u8> {
    let head = format!("{} {signature}\n", body.len());
    let mut bytes = Vec::with_capacity(head.len() + body.len());
    bytes.extend_from_slice(head.as_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// A frame as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Nothing changed; the stream is alive.
    Alive,
    /// A view (JSON) and its signature, not yet verified.
    View { signature: String, body: Vec<u8> },
}

/// A stream that is not frames of views; the trainer drops the connection and opens another.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a view stream frame's head is not '<length> <signature>': {0:?}")]
    BadHead(String),
    #[error("a view stream frame of {0} bytes is over the {MAX_VIEW_BYTES} a view may take")]
    TooLong(usize),
    #[error("a view stream frame's head runs past {MAX_HEAD_BYTES} bytes without a line end")]
    HeadTooLong,
}

/// The frames in the bytes read so far: push what arrives, take frames while there are.
#[derive(Debug, Default)]
pub struct Frames {
    buffer: Vec<u8>,
}

impl Frames {
    /// Bytes as they came off the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame, `None` until one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(end) = self.buffer.iter().position(|&b| b == b'\n') else {
            return if self.buffer.len() > MAX_HEAD_BYTES {
                Err(FrameError::HeadTooLong)
            } else {
                Ok(None)
            };
        };
        if end > MAX_HEAD_BYTES {
            return Err(FrameError::HeadTooLong);
        }
        if end == 0 {
            self.buffer.drain(..1);
            return Ok(Some(Frame::Alive));
        }
        let head = &self.buffer[..end];
        let bad = || FrameError::BadHead(String::from_utf8_lossy(head).into_owned());
        let text = std::str::from_utf8(head).map_err(|_| bad())?;
        let (length, signature) = text.split_once(' ').ok_or_else(bad)?;
        let length: usize = length.parse().map_err(|_| bad())?;
        if signature.is_empty() || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if length > MAX_VIEW_BYTES {
            return Err(FrameError::TooLong(length));
        }
        let start = end + 1;
        if self.buffer.len() < start + length {
            return Ok(None);
        }
        let signature = signature.to_string();
        let body = self.buffer[start..start + length].to_vec();
        self.buffer.drain(..start + length);
        Ok(Some(Frame::View { signature, body }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames_of(bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
        let mut frames = Frames::default();
        frames.push(bytes);
        std::iter::from_fn(|| frames.next_frame().transpose()).collect()
    }

    fn any_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            Just(Frame::Alive),
            (
                "[0-9a-f]{1,64}",
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(signature, body)| Frame::View { signature, body }),
        ]
    }

    fn encoded(frame: &Frame) -> Vec<u8> {
        match frame {
            Frame::Alive => ALIVE.to_vec(),
            Frame::View { signature, body } => super::frame(signature, body),
        }
    }

    proptest! {
        /// However the connection cuts the bytes, the frames come out whole and in order.
        #[test]
        fn frames_cut_anywhere_come_out_as_they_were_sent(
            sent in proptest::collection::vec(any_frame(), 0..8),
            cuts in proptest::collection::vec(1usize..64, 0..40),
        ) {
            let bytes: Vec<u8> = sent.iter().flat_map(encoded).collect();
            let mut frames = Frames::default();
            let mut got = Vec::new();
            let mut rest = &bytes[..];
            for cut in cuts.into_iter().chain(std::iter::once(usize::MAX)) {
                let (now, later) = rest.split_at(cut.min(rest.len()));
                frames.push(now);
                while let Some(frame) = frames.next_frame().unwrap() {
                    got.push(frame);
                }
                rest = later;
            }
            prop_assert_eq!(got, sent);
        }
    }

    #[test]
    fn a_frame_arrives_only_when_all_its_bytes_have() {
        let bytes = frame("ab12", b"{\"version\":3}");
        let mut frames = Frames::default();
        frames.push(&bytes[..bytes.len() - 1]);
        assert_eq!(frames.next_frame(), Ok(None));
        frames.push(&bytes[bytes.len() - 1..]);
        assert_eq!(
            frames.next_frame(),
            Ok(Some(Frame::View {
                signature: "ab12".into(),
                body: b"{\"version\":3}".to_vec()
            }))
        );
        assert_eq!(frames.next_frame(), Ok(None));
    }

    #[test]
    fn what_is_not_a_frame_is_named() {
        assert_eq!(
            frames_of(b"HTTP/1.1 200 OK\r\n"),
            Err(FrameError::BadHead("HTTP/1.1 200 OK\r".into()))
        );
        assert_eq!(frames_of(b"12\n"), Err(FrameError::BadHead("12".into())));
        assert_eq!(
            frames_of(b"-1 ab\n"),
            Err(FrameError::BadHead("-1 ab".into()))
        );
        assert_eq!(
            frames_of(b"3 not-hex\nabc"),
            Err(FrameError::BadHead("3 not-hex".into()))
        );
        assert_eq!(
            frames_of(b"99999999999 ab\n"),
            Err(FrameError::TooLong(99_999_999_999))
        );
        assert_eq!(frames_of(&[b'7'; 200]), Err(FrameError::HeadTooLong));
        let long_head = format!("1 {}\nx", "a".repeat(200));
        assert_eq!(
            frames_of(long_head.as_bytes()),
            Err(FrameError::HeadTooLong)
        );
    }
}
