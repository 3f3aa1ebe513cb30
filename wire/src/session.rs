//! Frames on a TCP stream: reading and writing sealed, chunked messages, and the handshake
//! (protocol version and challenge nonce from the acceptor, hello from the dialer).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Stats;
use crate::frame::{
    Assembler, CHALLENGE_LEN, CHALLENGE_MAGIC, HEADER_LEN, Header, Kind, MAX_CHUNK, Message, Nonce,
    PROTOCOL_VERSION, Reject, SessionCipher, TAG_LEN, chunks,
};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    #[error("frame rejected: {0}")]
    Rejected(Reject),
    /// The acceptor speaks another protocol version (no frame of ours could pass its checks).
    #[error(
        "the peer speaks murmur wire protocol {theirs}; this trainer speaks {PROTOCOL_VERSION}"
    )]
    PeerVersion { theirs: u8 },
    #[error(transparent)]
    Io(io::Error),
}

/// `read_exact`, telling a clean end before the first byte from a cut in the middle.
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    at_boundary: bool,
) -> Result<(), ReadError> {
    let mut read = 0;
    while read < buf.len() {
        match stream.read(&mut buf[read..]).await {
            Ok(0) if read == 0 && at_boundary => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Rejected(Reject::Truncated)),
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(ReadError::Closed);
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

/// Append exactly `n` bytes of the stream to `buf`, read into its spare capacity (not zeroed
/// first: zeroing received buffers and the decoder's output was 9% of a ring round's profile).
async fn append<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    n: usize,
) -> Result<(), ReadError> {
    let end = buf.len() + n;
    buf.reserve(n);
    while buf.len() < end {
        let mut limited = (&mut *stream).take((end - buf.len()) as u64);
        match limited.read_buf(buf).await {
            Ok(0) => return Err(ReadError::Rejected(Reject::Truncated)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(ReadError::Closed);
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

/// Read frames until one completes a message. Nothing is allocated for a frame whose header
/// fails its checks, and nothing is returned before its tag verifies. Each payload is read
/// straight into the message buffer and decrypted there.
pub async fn read_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    cipher: &mut SessionCipher,
    assembler: &mut Assembler,
    job: u64,
    max_message: u64,
    stats: &Stats,
) -> Result<Message, ReadError> {
    let mut first = true;
    loop {
        let mut header_bytes = [0u8; HEADER_LEN];
        fill(stream, &mut header_bytes, first).await?;
        first = false;
        let header =
            Header::decode(&header_bytes, job, max_message).map_err(ReadError::Rejected)?;
        let message = assembler.begin(&header).map_err(ReadError::Rejected)?;
        let start = message.len();
        append(stream, message, header.payload_len as usize).await?;
        let payload = &mut message[start..];
        let mut tag = [0u8; TAG_LEN];
        fill(stream, &mut tag, false).await?;
        cipher
            .open(&header_bytes, payload, &tag)
            .map_err(ReadError::Rejected)?;
        stats.add_in(HEADER_LEN + payload.len() + TAG_LEN);
        if let Some(message) = assembler.finish() {
            return Ok(message);
        }
    }
}

/// Write a message as sealed frames: each is built whole in one buffer (header, the chunk copied
/// in and encrypted in place, tag) and goes out in one write.
pub async fn write_message<S: AsyncWrite + Unpin>(
    stream: &mut S,
    cipher: &mut SessionCipher,
    template: Header,
    payload: &[u8],
    stats: &Stats,
) -> io::Result<()> {
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len().min(MAX_CHUNK) + TAG_LEN);
    for (header, range) in chunks(template, payload.len()) {
        let header_bytes = header.encode();
        frame.clear();
        frame.extend_from_slice(&header_bytes);
        frame.extend_from_slice(&payload[range]);
        let tag = cipher.seal(&header_bytes, &mut frame[HEADER_LEN..]);
        frame.extend_from_slice(&tag);
        stream.write_all(&frame).await?;
        stats.add_out(frame.len());
    }
    Ok(())
}

pub fn fresh_nonce() -> Nonce {
    rand::random()
}

/// The acceptor's first bytes: the challenge magic, our protocol version, the session nonce.
pub fn challenge(nonce: &Nonce) -> [u8; CHALLENGE_LEN] {
    let mut b = [0u8; CHALLENGE_LEN];
    b[..3].copy_from_slice(&CHALLENGE_MAGIC);
    b[3] = PROTOCOL_VERSION;
    b[4..].copy_from_slice(nonce);
    b
}

pub async fn send_challenge<S: AsyncWrite + Unpin>(
    stream: &mut S,
    nonce: &Nonce,
) -> io::Result<()> {
    stream.write_all(&challenge(nonce)).await
}

/// The acceptor's nonce, once its challenge says it speaks our protocol version.
pub fn parse_challenge(b: &[u8; CHALLENGE_LEN]) -> Result<Nonce, ReadError> {
    let theirs = match (&b[..3], b[3]) {
        (magic, PROTOCOL_VERSION) if magic == CHALLENGE_MAGIC => {
            return Ok(b[4..].try_into().expect("16 bytes"));
        }
        (magic, version) if magic == CHALLENGE_MAGIC => version,
        // Version 1's challenge: `MRMC` and the nonce.
        (b"MRM", b'C') => 1,
        _ => return Err(ReadError::Rejected(Reject::BadMagic)),
    };
    Err(ReadError::PeerVersion { theirs })
}

pub async fn read_challenge<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Nonce, ReadError> {
    let mut b = [0u8; CHALLENGE_LEN];
    fill(stream, &mut b, true).await?;
    parse_challenge(&b)
}

/// A header for a whole message (chunking fills in the lengths and offsets).
pub fn template(kind: Kind, job: u64, sender: u32, agreement: u64, round: u64) -> Header {
    Header {
        kind,
        job,
        sender,
        payload_len: 0,
        agreement,
        round,
        message_len: 0,
        offset: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::NONCE_LEN;

    #[test]
    fn a_challenge_names_the_acceptors_protocol_version() {
        let nonce = [9; NONCE_LEN];
        assert_eq!(parse_challenge(&challenge(&nonce)).unwrap(), nonce);
        let mut v1 = [0u8; CHALLENGE_LEN];
        v1[..4].copy_from_slice(b"MRMC");
        assert!(matches!(
            parse_challenge(&v1),
            Err(ReadError::PeerVersion { theirs: 1 })
        ));
        let mut v3 = challenge(&nonce);
        v3[3] = 3;
        let refused = parse_challenge(&v3).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "the peer speaks murmur wire protocol 3; this trainer speaks {PROTOCOL_VERSION}"
            )
        );
        assert!(matches!(
            parse_challenge(&[0x5a; CHALLENGE_LEN]),
            Err(ReadError::Rejected(Reject::BadMagic))
        ));
    }

    #[tokio::test]
    async fn messages_round_trip_through_sealed_frames_on_a_stream() {
        let payload: Vec<u8> = (0..(2 * MAX_CHUNK + 77)).map(|i| (i % 251) as u8).collect();
        let (job, stats) = (5, Stats::default());
        let mut wire = Vec::new();
        let mut sender = SessionCipher::new(b"k", [3; NONCE_LEN]);
        let t = template(Kind::Parameters, job, 4, 1, 8);
        write_message(&mut wire, &mut sender, t, &payload, &stats)
            .await
            .unwrap();
        write_message(
            &mut wire,
            &mut sender,
            template(Kind::Leave, job, 4, 1, 0),
            &[],
            &stats,
        )
        .await
        .unwrap();
        assert_eq!(stats.bytes_out(), wire.len() as u64);
        // Encrypted: the payload's bytes are not on the wire as they are.
        assert!(!wire.windows(64).any(|w| w == &payload[1000..1064]));

        let mut reader = wire.as_slice();
        let mut receiver = SessionCipher::new(b"k", [3; NONCE_LEN]);
        let mut assembler = Assembler::default();
        let mut read = Vec::new();
        let end = loop {
            match read_message(
                &mut reader,
                &mut receiver,
                &mut assembler,
                job,
                1 << 30,
                &stats,
            )
            .await
            {
                Ok(m) => read.push(m),
                Err(e) => break e,
            }
        };
        assert!(matches!(end, ReadError::Closed), "{end}");
        assert_eq!(read.len(), 2);
        assert_eq!(
            (read[0].kind, read[0].sender, read[0].round),
            (Kind::Parameters, 4, 8)
        );
        assert_eq!(read[0].payload, payload);
        assert_eq!(read[1].kind, Kind::Leave);
        assert_eq!(stats.bytes_in(), stats.bytes_out());
    }
}
