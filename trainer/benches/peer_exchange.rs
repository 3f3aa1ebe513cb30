//! Peer exchange over loopback, through the trainer's own code path: encode, authenticated TCP
//! transport, decode, Metropolis-Hastings average.
//!
//!   pair  two trainers exchange a 10M-parameter fp32 model (both directions at once):
//!         effective GB/s of payload moved.
//!   ring  8 trainer processes do one ring averaging round with the same model: seconds per
//!         round (compare with bench/allreduce_gloo.py: gloo all_reduce of the same tensor).
//!   raw   the floor under `ring`: the same 8 processes only move the round's bytes (the model
//!         to both neighbours, theirs back) over plain TCP: no frames, no authentication, no
//!         averaging.
//!
//! `cargo bench -p murmur-trainer --bench peer_exchange [-- pair|ring|raw] [--params N]
//! [--compression none|fp16|int8]`;
//! `trainer/bench/peer_exchange.sh` runs it beside iperf3 and gloo and prints the ratios.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use murmur_core::topology::MemberId;
use murmur_trainer::algorithms::mixing::weighted_average;
use murmur_trainer::algorithms::{Exchange, Payload, Purpose};
use murmur_trainer::compression::{Compression, Decoded, Decoder, Encoder};
use murmur_trainer::transport::{Transport, TransportConfig, frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &[u8] = b"bench key";
const ROUNDS: u64 = 10;

fn config(me: MemberId, params: usize) -> TransportConfig {
    TransportConfig {
        job: frame::job_id("bench", "exchange"),
        me,
        key: KEY.to_vec(),
        layout_fingerprint: params as u64,
        max_message: params as u64 * 4 + 4096,
        round_timeout: Duration::from_secs(60),
    }
}

/// One averaging round of `me` with `peers`, exactly as a member does it.
async fn round(
    t: &mut Transport,
    round: u64,
    own: &[f32],
    peers: &[MemberId],
    decoders: &mut BTreeMap<MemberId, Decoder>,
    codec: Compression,
) -> Vec<f32> {
    // As the member does: one encoding, shared by every neighbour.
    let shared = Payload::new(Encoder::default().encode(codec, own));
    let outgoing = peers.iter().map(|&p| (p, shared.clone())).collect();
    let got = t
        .exchange(round, Purpose::Parameters, outgoing, peers)
        .await;
    assert_eq!(got.len(), peers.len(), "a peer missed round {round}");
    let decoded: Vec<(f64, Decoded)> = got
        .into_iter()
        .map(|(p, bytes)| {
            let body = bytes.len();
            let x = decoders
                .entry(p)
                .or_default()
                .decode_payload(codec, bytes, body, own.len())
                .unwrap();
            (1.0 / (peers.len() + 1) as f64, x)
        })
        .collect();
    let refs: Vec<(f64, &[f32])> = decoded.iter().map(|(w, x)| (*w, &**x)).collect();
    weighted_average(own, 1.0 / (peers.len() + 1) as f64, &refs)
}

fn params_flag(args: &[String]) -> usize {
    args.iter()
        .position(|a| a == "--params")
        .and_then(|i| args.get(i + 1))
        .map_or(10_000_000, |v| v.parse().expect("--params N"))
}

/// `--compression none|fp16|int8` (default none): the codec on the wire, as a job's
/// `algorithm.compression` sets it.
fn compression_flag(args: &[String]) -> (String, Compression) {
    let name = args
        .iter()
        .position(|a| a == "--compression")
        .and_then(|i| args.get(i + 1))
        .map_or("none", String::as_str);
    let codec = match name {
        "none" => Compression::None,
        "fp16" => Compression::Fp16,
        "int8" => Compression::Int8,
        other => panic!("--compression none|fp16|int8, not {other}"),
    };
    (name.to_string(), codec)
}

fn pair(params: usize, codec: Compression) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut a = Transport::bind("127.0.0.1:0", config(0, params))
            .await
            .unwrap();
        let mut b = Transport::bind("127.0.0.1:0", config(1, params))
            .await
            .unwrap();
        let addresses: BTreeMap<MemberId, String> = [(0, a.local_addr()), (1, b.local_addr())]
            .into_iter()
            .map(|(id, addr)| (id, addr.to_string()))
            .collect();
        a.set_topology(
            murmur_trainer::transport::Agreements::all(1),
            addresses.clone(),
        );
        b.set_topology(murmur_trainer::transport::Agreements::all(1), addresses);
        let xa: Vec<f32> = (0..params).map(|i| i as f32).collect();
        let xb: Vec<f32> = (0..params).map(|i| -(i as f32)).collect();
        // Wire only: encode, send, receive, decode.
        let exchange_only = |t: &mut Transport, x: &Vec<f32>, peer: MemberId, r: u64| {
            let mut t = t.clone();
            let payload = Encoder::default().encode(Compression::None, x);
            async move {
                let got = t
                    .exchange(
                        r,
                        Purpose::Parameters,
                        vec![(peer, payload.into())],
                        &[peer],
                    )
                    .await;
                assert_eq!(got.len(), 1);
            }
        };
        // Warm-up: connections and buffers.
        tokio::join!(
            exchange_only(&mut a, &xa, 1, 0),
            exchange_only(&mut b, &xb, 0, 0)
        );
        let started = Instant::now();
        for r in 1..=ROUNDS {
            let (fa, fb) = (
                exchange_only(&mut a, &xa, 1, r),
                exchange_only(&mut b, &xb, 0, r),
            );
            let (ja, jb) = (tokio::spawn(fa), tokio::spawn(fb));
            ja.await.unwrap();
            jb.await.unwrap();
        }
        let wire = started.elapsed().as_secs_f64() / ROUNDS as f64;
        // The whole round as a member runs it: plus decoding and averaging.
        let mut codecs = (BTreeMap::new(), BTreeMap::new());
        let started = Instant::now();
        for r in ROUNDS + 1..=2 * ROUNDS {
            let (mut ta, mut tb) = (a.clone(), b.clone());
            let (xa2, xb2) = (xa.clone(), xb.clone());
            let (mut da, mut db) = (std::mem::take(&mut codecs.0), std::mem::take(&mut codecs.1));
            let ja = tokio::spawn(async move {
                round(&mut ta, r, &xa2, &[1], &mut da, codec).await;
                da
            });
            let jb = tokio::spawn(async move {
                round(&mut tb, r, &xb2, &[0], &mut db, codec).await;
                db
            });
            codecs = (ja.await.unwrap(), jb.await.unwrap());
        }
        let full = started.elapsed().as_secs_f64() / ROUNDS as f64;
        let bytes = 2.0 * params as f64 * 4.0;
        println!("pair_params={params}");
        println!("pair_exchange_seconds={wire:.4}");
        println!("pair_exchange_gbytes_per_second={:.3}", bytes / wire / 1e9);
        println!("pair_round_seconds={full:.4}");
        println!("pair_round_gbytes_per_second={:.3}", bytes / full / 1e9);
    });
}

/// Child process: member `me` of an `n`-ring on `ports`; prints its mean round time.
fn ring_member(me: MemberId, ports: &[u16], params: usize, codec: Compression) {
    let n = ports.len() as MemberId;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut t = Transport::bind(
            &format!("127.0.0.1:{}", ports[me as usize]),
            config(me, params),
        )
        .await
        .unwrap();
        let addresses: BTreeMap<MemberId, String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| (i as MemberId, format!("127.0.0.1:{p}")))
            .collect();
        t.set_topology(murmur_trainer::transport::Agreements::all(1), addresses);
        let peers = vec![(me + n - 1) % n, (me + 1) % n];
        let mut own: Vec<f32> = (0..params)
            .map(|i| (i as f32) * (me as f32 + 1.0))
            .collect();
        let mut dec = BTreeMap::new();
        // Round 0 waits for everyone to be up and connected.
        own = round(&mut t, 0, &own, &peers, &mut dec, codec).await;
        let mut times = Vec::new();
        for r in 1..=ROUNDS {
            let started = Instant::now();
            own = round(&mut t, r, &own, &peers, &mut dec, codec).await;
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        println!("{}", times[times.len() / 2]);
        t.leave(None, Duration::from_secs(2)).await;
    });
}

/// Child process for `raw`: member `me` dials both ring neighbours and accepts both of theirs,
/// then each round writes `params` f32s' bytes to each and reads as many from each, all at once.
fn raw_member(me: usize, ports: &[u16], params: usize) {
    let n = ports.len();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", ports[me])).await.unwrap();
        let dial = |to: usize| async move {
            let addr: SocketAddr = ([127, 0, 0, 1], ports[to]).into();
            loop {
                if let Ok(s) = TcpStream::connect(addr).await {
                    s.set_nodelay(true).unwrap();
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let accept = async {
            let (a, _) = listener.accept().await.unwrap();
            let (b, _) = listener.accept().await.unwrap();
            (a, b)
        };
        let (mut left, mut right, (mut from_a, mut from_b)) =
            tokio::join!(dial((me + n - 1) % n), dial((me + 1) % n), accept);
        let out = vec![me as u8; params * 4];
        let (mut in_a, mut in_b) = (vec![0u8; params * 4], vec![0u8; params * 4]);
        let mut times = Vec::new();
        for r in 0..=ROUNDS {
            let started = Instant::now();
            let (w1, w2, r1, r2) = tokio::join!(
                left.write_all(&out),
                right.write_all(&out),
                from_a.read_exact(&mut in_a),
                from_b.read_exact(&mut in_b)
            );
            w1.unwrap();
            w2.unwrap();
            r1.unwrap();
            r2.unwrap();
            if r > 0 {
                times.push(started.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        println!("{}", times[times.len() / 2]);
    });
}

fn ring(params: usize, n: usize, compression: &str) {
    let medians = spawn_ring(n, "ring-member", params, compression);
    // A round is done when its slowest member is.
    println!("ring_members={n}");
    println!("ring_params={params}");
    println!("ring_compression={compression}");
    println!("ring_round_seconds={:.4}", medians[n - 1]);
}

fn raw(params: usize, n: usize) {
    let medians = spawn_ring(n, "raw-member", params, "none");
    println!("raw_members={n}");
    println!("raw_round_seconds={:.4}", medians[n - 1]);
}

/// Start `n` children of this bench as `role`, each with its index and the ports; their median
/// round times, sorted.
fn spawn_ring(n: usize, role: &str, params: usize, compression: &str) -> Vec<f64> {
    // Below the kernel's ephemeral range, so no outgoing connection takes one before its
    // member binds it.
    let ports: Vec<u16> = (20_000..32_000)
        .filter(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .take(n)
        .collect();
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|i| {
            Command::new(&exe)
                .args([
                    role,
                    &i.to_string(),
                    &list,
                    "--params",
                    &params.to_string(),
                    "--compression",
                    compression,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut medians: Vec<f64> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    medians
}

fn main() {
    // As the trainer process does (see its doc): model-sized buffers are reused, not re-faulted.
    murmur_trainer::runtime::keep_freed_buffers();
    let args: Vec<String> = std::env::args().collect();
    let params = params_flag(&args);
    let (compression, codec) = compression_flag(&args);
    if let Some(i) = args.iter().position(|a| a == "ring-member") {
        let me: MemberId = args[i + 1].parse().unwrap();
        let ports: Vec<u16> = args[i + 2].split(',').map(|p| p.parse().unwrap()).collect();
        return ring_member(me, &ports, params, codec);
    }
    if let Some(i) = args.iter().position(|a| a == "raw-member") {
        let me: usize = args[i + 1].parse().unwrap();
        let ports: Vec<u16> = args[i + 2].split(',').map(|p| p.parse().unwrap()).collect();
        return raw_member(me, &ports, params);
    }
    let which: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| matches!(*a, "pair" | "ring" | "raw"))
        .collect();
    if which.is_empty() || which.contains(&"pair") {
        pair(params, codec);
    }
    if which.is_empty() || which.contains(&"ring") {
        ring(params, 8, &compression);
    }
    if which.is_empty() || which.contains(&"raw") {
        raw(params, 8);
    }
}
