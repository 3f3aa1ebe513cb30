//! The check the `frame` fuzz target (`fuzz/`) runs, shared with the regression test that replays
//! every input that ever failed (`fuzz/regressions/frame/`).
//!
//! What a peer can send a trainer: frames read off the socket, reassembled, authenticated. Random
//! bytes never carry a valid tag, so the input is rewritten into frames that do (magic, version
//! and job fixed, every other header field and the payload as the fuzzer chose, sealed under the
//! session key): header checks, chunk reassembly and hello decoding all see hostile values. An
//! odd first byte sends the rest unchanged instead, for the rejection paths (a forged tag, an
//! unsupported version).

use crate::Stats;
use crate::frame::{Assembler, HEADER_LEN, Hello, MAGIC, PROTOCOL_VERSION, SessionCipher};
use crate::session::read_message;

const KEY: &[u8] = b"fuzz key";
const NONCE: [u8; 16] = [7; 16];
const JOB: u64 = 0x6d75_726d_7572;
const MAX_MESSAGE: u64 = 1 << 22;

fn sealed(input: &[u8]) -> Vec<u8> {
    let mut sender = SessionCipher::new(KEY, NONCE);
    let mut out = Vec::new();
    let mut rest = input;
    // Each frame: the kind byte and the header's 40 bytes after the job id, then the payload.
    while rest.len() > HEADER_LEN - 16 {
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&MAGIC);
        header[4] = PROTOCOL_VERSION;
        header[5] = rest[0];
        header[8..16].copy_from_slice(&JOB.to_le_bytes());
        header[16..].copy_from_slice(&rest[1..=HEADER_LEN - 16]);
        rest = &rest[HEADER_LEN - 15..];
        let payload_len = u32::from_le_bytes(header[20..24].try_into().expect("4 bytes")) as usize;
        let mut payload = rest[..payload_len.min(rest.len())].to_vec();
        rest = &rest[payload.len()..];
        let tag = sender.seal(&header, &mut payload);
        out.extend_from_slice(&header);
        out.extend_from_slice(&payload);
        out.extend_from_slice(&tag);
    }
    out
}

pub fn frames(input: &[u8]) {
    let _ = Hello::decode(input);
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let stream = if mode % 2 == 1 {
        rest.to_vec()
    } else {
        sealed(rest)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut reader = stream.as_slice();
        let mut receiver = SessionCipher::new(KEY, NONCE);
        let mut assembler = Assembler::default();
        let stats = Stats::default();
        while let Ok(message) = read_message(
            &mut reader,
            &mut receiver,
            &mut assembler,
            JOB,
            MAX_MESSAGE,
            &stats,
        )
        .await
        {
            assert!(message.payload.len() as u64 <= MAX_MESSAGE);
            let _ = Hello::decode(&message.payload);
        }
    });
}
