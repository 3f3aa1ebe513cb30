//! What members send each other, compressed as the job says:
//! - `none`: f32 values;
//! - `fp16`: half precision;
//! - `int8`: one f32 scale per chunk of 256 values, then one signed byte per value. The sender
//!   carries each value's rounding error into its next encoding (error feedback), so what
//!   receivers average tracks the sender's parameters over rounds instead of adding fresh
//!   rounding noise to the consensus every round (without it the D-Cliques example lost 0.85
//!   point; with it 0.07). The state is the sender's alone: receivers keep none, so a missed
//!   round or a new neighbour costs nothing;
//! - `int4`: as int8 with 4-bit values (−7..7), two a byte, the first in the low nibble: with
//!   outer steps every 8 steps, 121× fewer bytes than per-step clique averaging on the
//!   D-Cliques example (docs/benchmarks.md, "Outer steps");
//! - `topK{ratio}` with error feedback: the sender sends the largest `ratio` share of the
//!   difference between its parameters and what its receivers last reconstructed; whatever is not
//!   sent stays in that difference and goes out in later rounds (CHOCO-style), so nothing is lost.
//!
//! Encoders and decoders are byte-exact and hostile-input safe: a malformed payload is an error.

use half::f16;
use murmur_core::api::{CompressionKind, CompressionSpec};

use crate::algorithms::Payload;

pub const INT8_CHUNK: usize = 256;

/// Bytes of an int8 (or, `packed`, int4) encoding of `values` values.
fn quantized_size(values: usize, packed: bool) -> usize {
    let body = if packed {
        // Each chunk packs its own values: an odd last chunk ends in half a byte.
        (values / INT8_CHUNK) * INT8_CHUNK / 2 + (values % INT8_CHUNK).div_ceil(2)
    } else {
        values
    };
    body + 4 * values.div_ceil(INT8_CHUNK)
}

/// No NaN or infinity in `values` (both decode paths check with it): the largest exponent field
/// of each block, with no early exit inside a block, so that it vectorises. On a received 40 MB
/// model the pass is bound by reading memory either way (9-10% of a ring round's profile, as
/// with `iter().any(..)`).
#[multiversion::multiversion(targets = "simd")]
fn all_finite(values: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    values.chunks(4096).all(|block| {
        let worst = block
            .iter()
            .fold(0u32, |worst, v| worst.max(v.to_bits() & EXPONENT));
        worst != EXPONENT
    })
}

/// One chunk of an int8 or int4 encoding: `chunk` plus what rounding left out last time
/// (`carried`), scaled so its largest magnitude is `levels` and rounded half away from zero into
/// `q`; `carried` becomes what this rounding leaves out. Returns the scale. Compiled for the
/// CPU's vector units (`multiversion`), since the baseline x86-64 build has no vector rounding
/// and calls libm's `roundf` per value; the packing into bytes stays outside, as its pushes
/// would keep the loop scalar.
#[multiversion::multiversion(targets = "simd")]
fn quantize_chunk(chunk: &[f32], carried: &mut [f32], levels: f32, q: &mut [i8]) -> f32 {
    for (c, v) in carried.iter_mut().zip(chunk) {
        *c += v;
    }
    let wanted = carried;
    let max = wanted.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if max > 0.0 { max / levels } else { 0.0 };
    if scale > 0.0 {
        for (w, q) in wanted.iter_mut().zip(q.iter_mut()) {
            let v = (*w / scale).round().clamp(-levels, levels);
            *w -= v * scale;
            *q = v as i8;
        }
    } else {
        // Nothing to send: every value is zero (or not a number), and stays carried.
        q.fill(0);
    }
    scale
}

/// Decoded values ([`Decoder::decode_payload`]): the payload itself, read as f32s, or a buffer
/// decoded from it.
pub struct Decoded(Values);

enum Values {
    /// The payload's first `.1` bytes. Only built once `bytemuck::try_cast_slice` accepted them
    /// (the buffer in an `Arc` never moves or changes, so the cast stays valid).
    View(Payload, usize),
    Owned(Vec<f32>),
}

impl std::ops::Deref for Decoded {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.0 {
            Values::View(payload, body) => bytemuck::cast_slice(&payload[..*body]),
            Values::Owned(values) => values,
        }
    }
}

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compression {
    None,
    Fp16,
    Int8,
    /// As int8, with 4-bit values (−7..7), two a byte.
    Int4,
    TopK {
        ratio: f64,
    },
}

impl Compression {
    pub fn from_spec(spec: &CompressionSpec) -> Self {
        match spec.kind {
            CompressionKind::None => Compression::None,
            CompressionKind::Fp16 => Compression::Fp16,
            CompressionKind::Int8 => Compression::Int8,
            CompressionKind::Int4 => Compression::Int4,
            CompressionKind::TopK => Compression::TopK {
                ratio: spec.ratio.unwrap_or(0.1),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("payload of {found} bytes, expected {expected} for {values} values")]
    Size {
        expected: usize,
        found: usize,
        values: usize,
    },
    #[error("top-k entry {entry} names coordinate {index}, but there are only {values}")]
    Index {
        entry: usize,
        index: usize,
        values: usize,
    },
    #[error("payload holds a non-finite value")]
    NonFinite,
}

/// The sender's side: for top-k, what receivers currently reconstruct.
#[derive(Clone, Debug, Default)]
pub struct Encoder {
    estimate: Vec<f32>,
    /// int8: what rounding left out of the last encoding, added to the next one.
    carried: Vec<f32>,
}

/// The receiver's side, one per sender: for top-k, the sender's reconstructed parameters.
#[derive(Clone, Debug, Default)]
pub struct Decoder {
    estimate: Vec<f32>,
}

impl Encoder {
    /// int8 and int4: a scale per chunk, then each value (with the rounding error carried from
    /// the last encoding) as a whole multiple of it in `-levels..=levels`; int4 packs two a
    /// byte, the first in the low nibble.
    fn quantize(&mut self, x: &[f32], levels: f32) -> Vec<u8> {
        if self.carried.len() != x.len() {
            self.carried = vec![0.0; x.len()];
        }
        let packed = levels < 8.0;
        let mut out = Vec::with_capacity(quantized_size(x.len(), packed));
        let mut quantized = [0i8; INT8_CHUNK];
        for (chunk, carried) in x
            .chunks(INT8_CHUNK)
            .zip(self.carried.chunks_mut(INT8_CHUNK))
        {
            let q = &mut quantized[..chunk.len()];
            let scale = quantize_chunk(chunk, carried, levels, q);
            out.extend(scale.to_le_bytes());
            if packed {
                out.extend(q.chunks(2).map(|pair| {
                    (pair[0] as u8 & 0x0f) | pair.get(1).map_or(0, |&high| (high as u8) << 4)
                }));
            } else {
                out.extend(q.iter().map(|&v| v as u8));
            }
        }
        out
    }

    pub fn encode(&mut self, compression: Compression, x: &[f32]) -> Vec<u8> {
        match compression {
            // The wire is little endian, as the f32s in memory are here: one copy. (Zeroing a
            // buffer and writing it four bytes at a time took 16% of the pair exchange bench's
            // profile.)
            #[cfg(target_endian = "little")]
            Compression::None => bytemuck::cast_slice::<f32, u8>(x).to_vec(),
            #[cfg(not(target_endian = "little"))]
            Compression::None => {
                let mut out = vec![0u8; 4 * x.len()];
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
                out
            }
            Compression::Fp16 => {
                let mut out = vec![0u8; 2 * x.len()];
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                }
                out
            }
            Compression::Int8 => self.quantize(x, 127.0),
            Compression::Int4 => self.quantize(x, 7.0),
            Compression::TopK { ratio } => {
                if self.estimate.len() != x.len() {
                    self.estimate = vec![0.0; x.len()];
                }
                let k = ((x.len() as f64 * ratio).ceil() as usize).clamp(1, x.len().max(1));
                let mut order: Vec<usize> = (0..x.len()).collect();
                let diff = |i: usize| (x[i] - self.estimate[i]).abs();
                if k < x.len() {
                    order.select_nth_unstable_by(k - 1, |&a, &b| diff(b).total_cmp(&diff(a)));
                    order.truncate(k);
                }
                order.sort_unstable();
                let mut out = Vec::with_capacity(8 * order.len());
                for i in order {
                    let delta = x[i] - self.estimate[i];
                    self.estimate[i] += delta;
                    out.extend((i as u32).to_le_bytes());
                    out.extend(delta.to_le_bytes());
                }
                out
            }
        }
    }
}

impl Decoder {
    /// As [`decode`](Self::decode), but an uncompressed payload whose bytes already are the
    /// f32 values in memory order (little-endian, 4-byte aligned, as an allocator's buffers are)
    /// is read where it lies: no copy of the model (decoding into a new, zeroed vector was 8% of
    /// a ring round's profile, with a share of the 9% in memset).
    ///
    /// The encoding is the payload's first `body` bytes (anything after it is the caller's).
    pub fn decode_payload(
        &mut self,
        compression: Compression,
        payload: Payload,
        body: usize,
        values: usize,
    ) -> Result<Decoded, DecodeError> {
        let Some(bytes) = payload.get(..body) else {
            return Err(DecodeError::Size {
                expected: body,
                found: payload.len(),
                values,
            });
        };
        if compression == Compression::None
            && cfg!(target_endian = "little")
            && body == 4 * values
            && let Ok(view) = bytemuck::try_cast_slice::<u8, f32>(bytes)
        {
            if !all_finite(view) {
                return Err(DecodeError::NonFinite);
            }
            return Ok(Decoded(Values::View(payload, body)));
        }
        self.decode(compression, bytes, values)
            .map(|v| Decoded(Values::Owned(v)))
    }

    /// Reconstruct the sender's `values`-long vector.
    pub fn decode(
        &mut self,
        compression: Compression,
        bytes: &[u8],
        values: usize,
    ) -> Result<Vec<f32>, DecodeError> {
        let size = |expected| {
            if bytes.len() == expected {
                Ok(())
            } else {
                Err(DecodeError::Size {
                    expected,
                    found: bytes.len(),
                    values,
                })
            }
        };
        let out: Vec<f32> = match compression {
            Compression::None => {
                size(4 * values)?;
                let mut out = vec![0f32; values];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes(b.try_into().expect("4"));
                }
                out
            }
            Compression::Fp16 => {
                size(2 * values)?;
                let mut out = vec![0f32; values];
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
                out
            }
            Compression::Int8 | Compression::Int4 => {
                let packed = compression == Compression::Int4;
                size(quantized_size(values, packed))?;
                let mut out = Vec::with_capacity(values);
                let mut rest = bytes;
                let mut left = values;
                while left > 0 {
                    let scale = f32::from_le_bytes(rest[..4].try_into().expect("4"));
                    let n = left.min(INT8_CHUNK);
                    let body = if packed { n.div_ceil(2) } else { n };
                    let body_bytes = &rest[4..4 + body];
                    if packed {
                        // Sign-extend each nibble: shift it to the top of an i8, then back.
                        let nibbles = body_bytes.iter().flat_map(|&b| [b << 4, b & 0xf0]);
                        out.extend(nibbles.take(n).map(|q| f32::from((q as i8) >> 4) * scale));
                    } else {
                        out.extend(body_bytes.iter().map(|&q| f32::from(q as i8) * scale));
                    }
                    rest = &rest[4 + body..];
                    left -= n;
                }
                out
            }
            Compression::TopK { .. } => {
                if !bytes.len().is_multiple_of(8) || bytes.len() / 8 > values {
                    return Err(DecodeError::Size {
                        expected: 8 * values.min(bytes.len() / 8),
                        found: bytes.len(),
                        values,
                    });
                }
                if self.estimate.len() != values {
                    self.estimate = vec![0.0; values];
                }
                let mut updates = Vec::with_capacity(bytes.len() / 8);
                for (entry, e) in bytes.chunks_exact(8).enumerate() {
                    let index = u32::from_le_bytes(e[..4].try_into().expect("4")) as usize;
                    let delta = f32::from_le_bytes(e[4..].try_into().expect("4"));
                    if index >= values {
                        return Err(DecodeError::Index {
                            entry,
                            index,
                            values,
                        });
                    }
                    if !delta.is_finite() {
                        return Err(DecodeError::NonFinite);
                    }
                    updates.push((index, delta));
                }
                // Apply only once the whole payload checked out.
                for (i, d) in updates {
                    self.estimate[i] += d;
                }
                self.estimate.clone()
            }
        };
        if !all_finite(&out) {
            return Err(DecodeError::NonFinite);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn roundtrip(c: Compression, x: &[f32]) -> (Vec<f32>, usize) {
        let bytes = Encoder::default().encode(c, x);
        (
            Decoder::default().decode(c, &bytes, x.len()).unwrap(),
            bytes.len(),
        )
    }

    #[test]
    fn sizes_are_as_documented() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        assert_eq!(roundtrip(Compression::None, &x), (x.clone(), 4000));
        assert_eq!(roundtrip(Compression::Fp16, &x).1, 2000);
        assert_eq!(roundtrip(Compression::Int8, &x).1, 1000 + 4 * 4);
        assert_eq!(roundtrip(Compression::Int4, &x).1, 500 + 4 * 4);
        // An odd last chunk ends in half a byte.
        assert_eq!(roundtrip(Compression::Int4, &x[..257]).1, 128 + 1 + 4 * 2);
        assert_eq!(roundtrip(Compression::TopK { ratio: 0.1 }, &x).1, 100 * 8);
    }

    #[test]
    fn int4_packs_two_signed_values_a_byte_low_nibble_first() {
        // Scale 1: the values are their own levels.
        let x = [7.0, -7.0, -1.0, 3.0, 0.0];
        let bytes = Encoder::default().encode(Compression::Int4, &x);
        assert_eq!(&bytes[..4], &1f32.to_le_bytes());
        assert_eq!(&bytes[4..], &[0x97, 0x3f, 0x00]);
        let decoded = Decoder::default()
            .decode(Compression::Int4, &bytes, x.len())
            .unwrap();
        assert_eq!(decoded, x);
    }

    #[test]
    fn int8_rounds_halves_away_from_zero_and_carries_the_rest() {
        // Scale 1 again; ties to even would send 0, 0, 2 and -2.
        let x = [127.0, 0.5, -0.5, 2.5, -2.5, 1.25];
        let mut encoder = Encoder::default();
        let bytes = encoder.encode(Compression::Int8, &x);
        assert_eq!(&bytes[..4], &1f32.to_le_bytes());
        assert_eq!(&bytes[4..], &[127, 1, (-1i8) as u8, 3, (-3i8) as u8, 1]);
        assert_eq!(encoder.carried, [0.0, -0.5, 0.5, -0.5, 0.5, 0.25]);
        // A chunk of zeros sends scale 0 and zeros.
        let zeros = [0.0; 6];
        let bytes = Encoder::default().encode(Compression::Int8, &zeros);
        assert_eq!(bytes, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_payload_decodes_to_the_same_values_read_in_place_or_copied() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        for c in [
            Compression::None,
            Compression::Fp16,
            Compression::Int8,
            Compression::Int4,
            Compression::TopK { ratio: 0.1 },
        ] {
            let bytes = Encoder::default().encode(c, &x);
            let copied = Decoder::default().decode(c, &bytes, x.len()).unwrap();
            let payload = Payload::new(bytes);
            let read = Decoder::default()
                .decode_payload(c, payload.clone(), payload.len(), x.len())
                .unwrap();
            assert_eq!(&*read, copied.as_slice(), "{c:?}");
            // Bytes after the body (the cadence trailer) are not the codec's.
            let mut trailed = (*payload).clone();
            trailed.extend_from_slice(&[7; 12]);
            let trailed = Decoder::default()
                .decode_payload(c, Payload::new(trailed), payload.len(), x.len())
                .unwrap();
            assert_eq!(&*trailed, copied.as_slice(), "{c:?} with a trailer");
            if c == Compression::None {
                assert_eq!(
                    read.as_ptr().cast::<u8>(),
                    payload.as_ptr(),
                    "read in place"
                );
            }
        }
        // The in-place path checks what the copy does: size and finite values.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut y = x.clone();
            y[999] = bad;
            assert!(!all_finite(&y), "{bad}");
        }
        assert!(all_finite(&[
            f32::MAX,
            f32::MIN,
            0.0,
            -0.0,
            f32::MIN_POSITIVE / 2.0
        ]));
        let mut nan = Encoder::default().encode(Compression::None, &x);
        nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
        let mut dec = Decoder::default();
        assert_eq!(
            dec.decode_payload(Compression::None, Payload::new(nan), 4 * x.len(), x.len())
                .err(),
            Some(DecodeError::NonFinite)
        );
        assert!(matches!(
            dec.decode_payload(Compression::None, Payload::new(vec![0; 12]), 12, x.len()),
            Err(DecodeError::Size { found: 12, .. })
        ));
    }

    #[test]
    fn top_k_error_feedback_sends_everything_eventually() {
        let x: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
        let (mut enc, mut dec) = (Encoder::default(), Decoder::default());
        let c = Compression::TopK { ratio: 0.1 };
        let mut seen = Vec::new();
        for _ in 0..10 {
            seen = dec.decode(c, &enc.encode(c, &x), x.len()).unwrap();
        }
        assert_eq!(seen, x, "ten rounds of 10% carry every coordinate");
        // Biggest differences go first.
        let (mut enc, mut dec) = (Encoder::default(), Decoder::default());
        let first = dec.decode(c, &enc.encode(c, &x), x.len()).unwrap();
        assert_eq!(first[0], -50.0);
        assert_eq!(first[50], 0.0);
    }

    #[test]
    fn malformed_payloads_are_rejected_without_touching_state() {
        let c = Compression::TopK { ratio: 0.5 };
        let mut dec = Decoder::default();
        let mut bad = 7u32.to_le_bytes().to_vec();
        bad.extend(1.0f32.to_le_bytes());
        bad.extend(99u32.to_le_bytes());
        bad.extend(1.0f32.to_le_bytes());
        assert_eq!(
            dec.decode(c, &bad, 10),
            Err(DecodeError::Index {
                entry: 1,
                index: 99,
                values: 10
            })
        );
        assert_eq!(
            dec.decode(c, &[], 10).unwrap(),
            vec![0.0; 10],
            "the bad payload changed nothing"
        );
        assert!(matches!(
            Decoder::default().decode(Compression::None, &[0; 7], 2),
            Err(DecodeError::Size { .. })
        ));
        assert!(matches!(
            Decoder::default().decode(Compression::Int8, &[0; 3], 2),
            Err(DecodeError::Size { .. })
        ));
        assert!(matches!(
            Decoder::default().decode(Compression::Int4, &[0; 6], 2),
            Err(DecodeError::Size {
                expected: 5,
                found: 6,
                ..
            })
        ));
        let nan: Vec<u8> = f32::NAN.to_le_bytes().to_vec();
        assert_eq!(
            Decoder::default().decode(Compression::None, &nan, 1),
            Err(DecodeError::NonFinite)
        );
    }

    proptest! {
        #[test]
        fn lossy_codecs_stay_within_their_error_bounds(x in prop::collection::vec(-100f32..100.0, 1..700)) {
            let (fp16, _) = roundtrip(Compression::Fp16, &x);
            for (a, b) in x.iter().zip(&fp16) {
                prop_assert!((a - b).abs() <= a.abs() * 1e-3 + 1e-4);
            }
            for (c, levels) in [(Compression::Int8, 127.0), (Compression::Int4, 7.0)] {
                let (decoded, _) = roundtrip(c, &x);
                prop_assert_eq!(decoded.len(), x.len());
                for (k, chunk) in x.chunks(INT8_CHUNK).enumerate() {
                    let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (j, a) in chunk.iter().enumerate() {
                        // Half a quantisation step, plus f32 rounding of the scale arithmetic.
                        let error = (a - decoded[k * INT8_CHUNK + j]).abs();
                        prop_assert!(error <= max / (2.0 * levels) + max * 1e-6, "{:?}", c);
                    }
                }
            }
        }

        /// int8 and int4 error feedback: over many encodings of a changing vector, what
        /// receivers decoded sums to what was sent within one rounding error in all, not one per
        /// round.
        #[test]
        fn quantizers_carry_their_rounding_error_into_the_next_encoding(x in prop::collection::vec(-100f32..100.0, 1..700), four_bits: bool) {
            const ROUNDS: usize = 50;
            let (c, levels) = if four_bits { (Compression::Int4, 7.0) } else { (Compression::Int8, 127.0) };
            let mut enc = Encoder::default();
            let (mut sent, mut decoded) = (vec![0f64; x.len()], vec![0f64; x.len()]);
            let mut biggest = 0f32;
            for t in 0..ROUNDS {
                let xt: Vec<f32> = x.iter().map(|v| v * (1.0 + t as f32 / 100.0)).collect();
                biggest = xt.iter().fold(biggest, |m, v| m.max(v.abs()));
                let d = Decoder::default().decode(c, &enc.encode(c, &xt), x.len()).unwrap();
                for i in 0..x.len() {
                    sent[i] += f64::from(xt[i]);
                    decoded[i] += f64::from(d[i]);
                }
            }
            // The carry stays within about half a step of the largest value; f32 arithmetic adds
            // a few ulps per round.
            let bound = f64::from(biggest) * (1.0 / (2.0 * levels - 4.0) + ROUNDS as f64 * 4.0 * f64::from(f32::EPSILON));
            for (s, d) in sent.iter().zip(&decoded) {
                prop_assert!((s - d).abs() <= bound, "sent {s}, decoded {d}, bound {bound}");
            }
        }

        #[test]
        fn decoders_never_panic_on_garbage(bytes in prop::collection::vec(any::<u8>(), 0..600), values in 0usize..200) {
            for c in [Compression::None, Compression::Fp16, Compression::Int8, Compression::Int4, Compression::TopK { ratio: 0.3 }] {
                let _ = Decoder::default().decode(c, &bytes, values);
            }
        }
    }
}
