//! Payloads: encoding values for peers, decoding what they sent, and sharing them through an
//! [`Exchange`].

use burn::tensor::backend::AutodiffBackend;

use murmur_core::topology::MemberId;

use super::Member;
use crate::algorithms::{Exchange, Payload, Purpose, cadence};
use crate::compression::{Compression, Decoded};
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// Payloads of `values` for each of `peers`. Top-k keeps codec state per destination, so its
    /// estimates stay exact; the other codecs keep receivers stateless, so one encoding is shared
    /// by all (int8's sender-side carry belongs to that one stream).
    /// `trailer` (the cadence's, possibly empty) follows each encoding.
    pub(super) fn encode(
        &mut self,
        peers: &[MemberId],
        purpose: Purpose,
        compression: Compression,
        values: &[f32],
        trailer: &[u8],
    ) -> Vec<(MemberId, Payload)> {
        let with_trailer = |mut bytes: Vec<u8>| {
            bytes.extend_from_slice(trailer);
            Payload::new(bytes)
        };
        let outgoing: Vec<(MemberId, Payload)> = match compression {
            Compression::TopK { .. } => peers
                .iter()
                .map(|&to| {
                    let bytes = self
                        .encoders
                        .entry((to, purpose))
                        .or_default()
                        .encode(compression, values);
                    (to, with_trailer(bytes))
                })
                .collect(),
            Compression::None | Compression::Fp16 | Compression::Int8 | Compression::Int4 => {
                let shared = with_trailer(
                    self.shared_encoders
                        .entry(purpose)
                        .or_default()
                        .encode(compression, values),
                );
                peers.iter().map(|&to| (to, shared.clone())).collect()
            }
        };
        for (to, bytes) in &outgoing {
            self.bytes_sent += bytes.len() as u64;
            *self.bytes_sent_to.entry(*to).or_default() += bytes.len() as u64;
        }
        outgoing
    }

    /// Decoded payloads, with the gap each sender's cadence trailer (when `trailer`) gave me.
    pub(super) fn decode_all(
        &mut self,
        purpose: Purpose,
        compression: Compression,
        received: Vec<(MemberId, Payload)>,
        trailer: bool,
    ) -> Vec<(MemberId, Decoded, Option<u64>)> {
        let values = self.layout.len();
        let me = self.id;
        received
            .into_iter()
            .filter_map(|(from, bytes)| {
                self.bytes_received += bytes.len() as u64;
                // A payload that does not decode is dropped like a missing neighbour.
                let (body, announced) = if trailer {
                    let (body, entries) = cadence::read_trailer(&bytes)?;
                    let mine = entries.iter().find(|(id, _)| *id == me).map(|(_, e)| *e);
                    (body, mine)
                } else {
                    (bytes.len(), None)
                };
                let x = self
                    .decoders
                    .entry((from, purpose))
                    .or_default()
                    .decode_payload(compression, bytes, body, values)
                    .ok()?;
                Some((from, x, announced))
            })
            .collect()
    }

    /// The codec of `purpose`'s payloads: gradients are never top-k'd (an estimate of a
    /// gradient stream is meaningless).
    fn compression_of(&self, purpose: Purpose) -> Compression {
        match (purpose, self.config.compression) {
            (Purpose::Gradients, Compression::TopK { .. }) => Compression::None,
            (_, c) => c,
        }
    }

    /// Encode `values` for `to` and post them for `(round, purpose)`; `trailer` (auto
    /// averaging) follows each payload.
    pub(super) fn post_share<E: Exchange>(
        &mut self,
        ex: &mut E,
        round: u64,
        purpose: Purpose,
        to: &[MemberId],
        values: &[f32],
        trailer: Option<&[u8]>,
    ) {
        let compression = self.compression_of(purpose);
        let outgoing = self.encode(to, purpose, compression, values, trailer.unwrap_or(&[]));
        ex.post_round(round, purpose, outgoing);
    }

    /// Collect and decode what `from` sent for a posted `(round, purpose)`.
    pub(super) async fn collect_share<E: Exchange>(
        &mut self,
        ex: &mut E,
        round: u64,
        purpose: Purpose,
        from: &[MemberId],
        trailer: bool,
    ) -> Vec<(MemberId, Decoded, Option<u64>)> {
        let received = ex.collect_round(round, purpose, from).await;
        self.decode_all(purpose, self.compression_of(purpose), received, trailer)
    }

    /// Send `values` to `to` and receive from `from` (the same members, except on a one-peer
    /// schedule); `trailer` (auto averaging) follows each payload.
    pub(super) async fn share<E: Exchange>(
        &mut self,
        ex: &mut E,
        round: u64,
        purpose: Purpose,
        (to, from): (&[MemberId], &[MemberId]),
        values: &[f32],
        trailer: Option<&[u8]>,
    ) -> Vec<(MemberId, Decoded, Option<u64>)> {
        self.post_share(ex, round, purpose, to, values, trailer);
        self.collect_share(ex, round, purpose, from, trailer.is_some())
            .await
    }
}
