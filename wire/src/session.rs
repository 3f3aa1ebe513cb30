//! Frames on a TCP stream: reading and writing authenticated, chunked messages, and the
//! handshake (challenge nonce from the acceptor, hello from the dialer).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Stats;
use crate::frame::{
    Assembler, CHALLENGE_MAGIC, HEADER_LEN, Header, Kind, Message, NONCE_LEN, Nonce, Reject,
    SessionMac, TAG_LEN, chunks,
};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    #[error("frame rejected: {0}")]
    Rejected(Reject),
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

/// Read frames until one completes a message. Nothing is allocated for a frame whose header
/// fails its checks, and nothing is returned before its tag verifies.
pub async fn read_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    mac: &mut SessionMac,
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
        let payload = assembler.begin(&header).map_err(ReadError::Rejected)?;
        fill(stream, payload, false).await?;
        let mut tag = [0u8; TAG_LEN];
        fill(stream, &mut tag, false).await?;
        mac.open(&header_bytes, payload, &tag)
            .map_err(ReadError::Rejected)?;
        stats.add_in(HEADER_LEN + payload.len() + TAG_LEN);
        if let Some(message) = assembler.finish() {
            return Ok(message);
        }
    }
}

/// Small frames go out in one write (one packet with NODELAY); big chunks in three, with no copy.
const COALESCE_BELOW: usize = 64 * 1024;

pub async fn write_message<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mac: &mut SessionMac,
    template: Header,
    payload: &[u8],
    stats: &Stats,
) -> io::Result<()> {
    for (header, range) in chunks(template, payload.len()) {
        let header_bytes = header.encode();
        let chunk = &payload[range];
        let tag = mac.seal(&header_bytes, chunk);
        if chunk.len() < COALESCE_BELOW {
            let mut frame = Vec::with_capacity(HEADER_LEN + chunk.len() + TAG_LEN);
            frame.extend_from_slice(&header_bytes);
            frame.extend_from_slice(chunk);
            frame.extend_from_slice(&tag);
            stream.write_all(&frame).await?;
        } else {
            stream.write_all(&header_bytes).await?;
            stream.write_all(chunk).await?;
            stream.write_all(&tag).await?;
        }
        stats.add_out(HEADER_LEN + chunk.len() + TAG_LEN);
    }
    Ok(())
}

pub fn fresh_nonce() -> Nonce {
    rand::random()
}

pub async fn send_challenge<S: AsyncWrite + Unpin>(
    stream: &mut S,
    nonce: &Nonce,
) -> io::Result<()> {
    let mut b = CHALLENGE_MAGIC.to_vec();
    b.extend_from_slice(nonce);
    stream.write_all(&b).await
}

pub async fn read_challenge<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Nonce, ReadError> {
    let mut b = [0u8; 4 + NONCE_LEN];
    fill(stream, &mut b, true).await?;
    if b[..4] != CHALLENGE_MAGIC {
        return Err(ReadError::Rejected(Reject::BadMagic));
    }
    Ok(b[4..].try_into().expect("16 bytes"))
}

/// A header for a whole message (chunking fills in the lengths and offsets).
pub fn template(kind: Kind, job: u64, sender: u32, topology_version: u64, round: u64) -> Header {
    Header {
        kind,
        job,
        sender,
        payload_len: 0,
        topology_version,
        round,
        message_len: 0,
        offset: 0,
    }
}
