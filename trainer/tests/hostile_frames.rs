//! Garbage, forged, truncated, oversized, stale, replayed and wrong-job frames thrown at a
//! training member: each is refused and counted by reason, and training goes on unharmed.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use murmur_core::api::{ModelKind, TopologyKind};
use murmur_trainer::model::{Model, layout};
use murmur_wire::frame::{
    self, CHALLENGE_LEN, HEADER_LEN, Header, Hello, Kind, MAX_CHUNK, NONCE_LEN, SessionCipher,
    TAG_LEN,
};
use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: loopback}
spec:
  replicas: {min: 1, target: 2, max: 2}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, roundTimeout: 2s}
  training:
    model: mlp
    dataset: {source: embedded}
    partition: {kind: iid}
    seed: 3
    batchSize: 32
    optimizer: {kind: sgd, momentum: 0.9}
    learningRate: 0.05
    steps: 600
";

fn job_id() -> u64 {
    frame::job_id("test", "loopback")
}

fn mlp_fingerprint() -> u64 {
    let device = Default::default();
    layout(&Model::<murmur_trainer::backend::Cpu>::new(
        ModelKind::Mlp,
        &device,
    ))
    .fingerprint()
}

fn header(kind: Kind, job: u64, round: u64, len: usize) -> Header {
    Header {
        kind,
        job,
        sender: 9,
        payload_len: len as u32,
        agreement: 1,
        round,
        message_len: len as u64,
        offset: 0,
    }
}

/// Connect and read the acceptor's challenge nonce.
fn connect(port: u16) -> (TcpStream, [u8; NONCE_LEN]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut challenge = [0u8; CHALLENGE_LEN];
    s.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..4], b"MRC\x02");
    (s, challenge[4..].try_into().unwrap())
}

fn send(s: &mut TcpStream, cipher: &mut SessionCipher, h: Header, payload: &[u8]) {
    let hb = h.encode();
    let mut sealed = payload.to_vec();
    let tag = cipher.seal(&hb, &mut sealed);
    let _ = s.write_all(&hb);
    let _ = s.write_all(&sealed);
    let _ = s.write_all(&tag);
}

/// Wait until the peer closes the connection (it refused what we sent).
fn closed_by_peer(mut s: TcpStream) {
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn rejected(job: &LocalJob, reason: &str) -> u64 {
    let (_, text) = job.get(0, "/metrics").unwrap();
    let wanted = format!("murmur_trainer_rejected_frames_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn hostile_frames_are_refused_counted_and_harmless() {
    let job = LocalJob::new(2, TopologyKind::Ring, MANIFEST);
    let mut procs = Reaper::default();
    for id in 0..2 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    wait_for(Duration::from_secs(60), "training to start", || {
        job.step(0).is_some_and(|s| s >= 40)
    });
    let port = job.members[0].peer_port;
    let key = KEY.as_bytes();

    // Garbage instead of a hello.
    let (mut s, _) = connect(port);
    s.write_all(&[0x5a; 300]).unwrap();
    closed_by_peer(s);

    // A well-formed hello under the wrong key.
    let (mut s, nonce) = connect(port);
    let hello = Hello {
        nonce: [1; NONCE_LEN],
        layout_fingerprint: mlp_fingerprint(),
    }
    .encode();
    send(
        &mut s,
        &mut SessionCipher::new(b"not the job key", nonce),
        header(Kind::Hello, job_id(), 0, hello.len()),
        &hello,
    );
    closed_by_peer(s);

    // A peer of the previous protocol version (1, HMAC-SHA256 tags): refused at its hello.
    let (mut s, _) = connect(port);
    // One write: the acceptor refuses on the header alone and may close before a second
    // write, which would then fail with a broken pipe (seen once in CI).
    let mut old = header(Kind::Hello, job_id(), 0, hello.len())
        .encode()
        .to_vec();
    old[4] = 1;
    old.extend_from_slice(&hello);
    old.extend_from_slice(&[0u8; 32]);
    s.write_all(&old).unwrap();
    closed_by_peer(s);

    // Another job's frame.
    let (mut s, nonce) = connect(port);
    send(
        &mut s,
        &mut SessionCipher::new(key, nonce),
        header(Kind::Hello, job_id() ^ 1, 0, hello.len()),
        &hello,
    );
    closed_by_peer(s);

    // A frame claiming more than a chunk.
    let (mut s, _) = connect(port);
    let mut big = header(Kind::Hello, job_id(), 0, 0);
    big.payload_len = MAX_CHUNK as u32 + 1;
    big.message_len = u64::from(big.payload_len);
    s.write_all(&big.encode()).unwrap();
    closed_by_peer(s);

    // A frame cut short.
    let (mut s, _) = connect(port);
    s.write_all(&header(Kind::Hello, job_id(), 0, hello.len()).encode()[..HEADER_LEN])
        .unwrap();
    s.write_all(&hello[..5]).unwrap();
    drop(s);

    // A member with another model shape.
    let (mut s, nonce) = connect(port);
    let odd = Hello {
        nonce: [1; NONCE_LEN],
        layout_fingerprint: 12345,
    }
    .encode();
    send(
        &mut s,
        &mut SessionCipher::new(key, nonce),
        header(Kind::Hello, job_id(), 0, odd.len()),
        &odd,
    );
    closed_by_peer(s);

    // A valid session sending parameters for a long-gone round, then the same round again.
    let (mut s, nonce) = connect(port);
    let mut mac = SessionCipher::new(key, nonce);
    send(
        &mut s,
        &mut mac,
        header(Kind::Hello, job_id(), 0, hello.len()),
        &hello,
    );
    let params = vec![0u8; 64];
    send(
        &mut s,
        &mut mac,
        header(Kind::Parameters, job_id(), 0, params.len()),
        &params,
    );
    send(
        &mut s,
        &mut mac,
        header(Kind::Parameters, job_id(), 0, params.len()),
        &params,
    );
    // And a frame whose tag does not match inside the session: the connection is cut.
    let mut forged = header(Kind::Parameters, job_id(), 1_000, params.len())
        .encode()
        .to_vec();
    forged.extend_from_slice(&params);
    forged.extend_from_slice(&[0u8; TAG_LEN]);
    s.write_all(&forged).unwrap();
    closed_by_peer(s);

    for (reason, at_least) in [
        ("bad_magic", 1),
        ("unsupported_version", 1),
        ("forged", 2),
        ("wrong_job", 1),
        ("oversized", 1),
        ("truncated", 1),
        ("shape_mismatch", 1),
        ("stale", 1),
        ("replayed", 1),
    ] {
        wait_for(Duration::from_secs(5), reason, || {
            rejected(&job, reason) >= at_least
        });
    }
    let status = job.status(0).unwrap();
    assert!(status["rejectedFrames"].as_u64().unwrap() >= 10, "{status}");

    procs.all_succeed(Duration::from_secs(120));
    for id in 0..2 {
        let lines = job.log(id, 0);
        let done = logged(&lines, "done").expect("never finished");
        let accuracy = done["accuracy"].as_f64().unwrap();
        assert!(accuracy >= 0.85, "member {id}: {accuracy}");
        // The attacker (member 9) never made it into a round.
        assert!(
            !lines.iter().any(|l| l["fields"]["peer"] == 9
                && l["fields"]["message"] != "sending state to a joining member"),
            "member {id} let the attacker into a round"
        );
    }
}
