//! Frame authentication candidates, single thread, in GB/s of payload: what the wire's choice of
//! MAC rests on (see the `frame` module docs).
//!
//! Run: `cargo bench -p murmur-wire --bench mac` (`BENCH_SECONDS`, default 1, per cell).
//!
//! - HMAC-SHA256 (`hmac` + `sha2`): protocol version 1's tag.
//! - keyed BLAKE3 (`blake3`).
//! - AES-256-GCM and ChaCha20-Poly1305 from `ring`, two ways each: tag only (the payload as
//!   associated data, left in the clear) and sealing (the payload encrypted in place, the tag
//!   over the ciphertext), and the receiver's open (each run copies the sealed bytes back first).

use std::hint::black_box;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use ring::aead::{AES_256_GCM, Aad, Algorithm, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;

fn gbps(bytes: usize, budget: Duration, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let (start, mut n) = (Instant::now(), 0usize);
    while start.elapsed() < budget {
        f();
        n += 1;
    }
    (n * bytes) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

fn main() {
    let budget = Duration::from_secs_f64(
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1.0),
    );
    let key = [7u8; 32];
    let header = [3u8; 56];
    println!(
        "{:<40} {:>10} {:>10}",
        "candidate (GB/s, one core)", "64 KiB", "1 MiB"
    );
    let sizes = [64 << 10, 1 << 20];
    let row = |name: &str, f: &dyn Fn(&mut [u8]) -> f64| {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&len| {
                let mut payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
                format!("{:>10.2}", f(&mut payload))
            })
            .collect();
        println!("{name:<40} {}", cells.join(" "));
    };

    row("HMAC-SHA256", &|p| {
        let keyed = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        gbps(p.len(), budget, || {
            let mut mac = keyed.clone();
            mac.update(&header);
            mac.update(p);
            black_box(mac.finalize().into_bytes());
        })
    });
    row("keyed BLAKE3", &|p| {
        gbps(p.len(), budget, || {
            let mut h = blake3::Hasher::new_keyed(&key);
            h.update(&header);
            h.update(p);
            black_box(h.finalize());
        })
    });
    for (name, alg) in [
        ("AES-256-GCM", &AES_256_GCM),
        ("ChaCha20-Poly1305", &CHACHA20_POLY1305),
    ] {
        let key = || LessSafeKey::new(UnboundKey::new(alg as &Algorithm, &key).unwrap());
        row(&format!("{name} tag only (ring)"), &|p| {
            let key = key();
            let mut counter = 0;
            gbps(p.len(), budget, || {
                counter += 1;
                let tag = key.seal_in_place_separate_tag(nonce(counter), Aad::from(&*p), &mut []);
                let _ = black_box(tag.unwrap());
            })
        });
        row(&format!("{name} seal in place (ring)"), &|p| {
            let key = key();
            let mut counter = 0;
            gbps(p.len(), budget, || {
                counter += 1;
                let tag = key.seal_in_place_separate_tag(nonce(counter), Aad::from(header), p);
                let _ = black_box(tag.unwrap());
            })
        });
        row(&format!("{name} open in place (ring)"), &|p| {
            let key = key();
            let sealed = p.to_vec();
            let mut sealed = sealed;
            let tag = key
                .seal_in_place_separate_tag(nonce(0), Aad::from(header), &mut sealed)
                .unwrap();
            gbps(p.len(), budget, || {
                p.copy_from_slice(&sealed);
                let opened =
                    key.open_in_place_separate_tag(nonce(0), Aad::from(header), tag, p, 0..);
                black_box(opened.unwrap());
            })
        });
    }
    row("memcpy (for scale)", &|p| {
        let mut dst = vec![0u8; p.len()];
        gbps(p.len(), budget, || {
            dst.copy_from_slice(black_box(&*p));
            black_box(&dst);
        })
    });
}
