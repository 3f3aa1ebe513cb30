//! One member: its model, optimizer, shard and codec state, and the step that every algorithm
//! shares — local gradient, (clique-averaged gradient,) optimizer step, averaging round.

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use murmur_core::api::{AlgorithmKind, OptimizerKind};
use murmur_core::topology::MemberId;

use super::async_gossip::{self, GossipCounts, Letter, LetterKind, Mailbox, Requests};
use super::cadence::{self, Averaging, Cadence, Outcome};
use super::mixing::{distance, gossip_partner, mean, weighted_average_and_disagreement};
use super::sgd::InPlaceSgd;
use super::{Exchange, Neighbourhood, Payload, Purpose};
use crate::compression::{Compression, Decoded, Decoder, Encoder};
use crate::data::{Dataset, IMAGE_PIXELS};
use crate::model::{self, FlatError, Layout, Model};

#[derive(Clone, Debug, PartialEq)]
pub struct MemberConfig {
    pub algorithm: AlgorithmKind,
    pub averaging: Averaging,
    pub compression: Compression,
    pub optimizer: OptimizerKind,
    pub momentum: f64,
    pub learning_rate: f64,
    pub batch_size: usize,
    pub seed: u64,
    /// Moshpit grid side.
    pub group_size: usize,
    /// Asynchronous gossip: replies to requests older than this many steps are dropped.
    pub max_staleness: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error(transparent)]
    Flat(#[from] FlatError),
    #[error("member {member} has no training examples")]
    EmptyShard { member: MemberId },
    #[error("{what} record: {message}")]
    Record { what: &'static str, message: String },
}

fn record_error(what: &'static str) -> impl Fn(burn::record::RecorderError) -> MemberError {
    move |e| MemberError::Record {
        what,
        message: e.to_string(),
    }
}

pub enum Optim<B: AutodiffBackend> {
    Sgd(OptimizerAdaptor<InPlaceSgd, Model<B>, B>),
    Adam(OptimizerAdaptor<Adam, Model<B>, B>),
}

impl<B: AutodiffBackend> Optim<B> {
    fn new(kind: OptimizerKind, momentum: f64) -> Self {
        match kind {
            OptimizerKind::Sgd => Optim::Sgd(InPlaceSgd::new(momentum.max(0.0)).init()),
            OptimizerKind::Adam => Optim::Adam(AdamConfig::new().init()),
        }
    }

    fn step(&mut self, lr: f64, model: Model<B>, grads: GradientsParams) -> Model<B> {
        match self {
            Optim::Sgd(o) => o.step(lr, model, grads),
            Optim::Adam(o) => o.step(lr, model, grads),
        }
    }

    /// The optimizer state (momentum, Adam moments) as bytes, keyed by parameter id.
    fn to_bytes(&self) -> Result<Vec<u8>, MemberError> {
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        match self {
            Optim::Sgd(o) => Recorder::<B>::record(&recorder, o.to_record(), ()),
            Optim::Adam(o) => Recorder::<B>::record(&recorder, o.to_record(), ()),
        }
        .map_err(record_error("optimizer"))
    }

    fn load_bytes(self, bytes: Vec<u8>, device: &B::Device) -> Result<Self, MemberError> {
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        Ok(match self {
            Optim::Sgd(o) => Optim::Sgd(
                o.load_record(
                    recorder
                        .load(bytes, device)
                        .map_err(record_error("optimizer"))?,
                ),
            ),
            Optim::Adam(o) => Optim::Adam(
                o.load_record(
                    recorder
                        .load(bytes, device)
                        .map_err(record_error("optimizer"))?,
                ),
            ),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    pub loss: f64,
    /// Peers that delivered in this step's rounds.
    pub heard_from: usize,
    /// Whether this step exchanged anything at all (not so between rounds).
    pub exchanged: bool,
    /// Distance from this member's parameters to the mean of its own and what its peers sent,
    /// when an averaging round took place: what one member can see of the consensus distance.
    pub local_disagreement: Option<f64>,
}

pub struct Member<B: AutodiffBackend> {
    pub id: MemberId,
    config: MemberConfig,
    model: Option<Model<B>>,
    optim: Optim<B>,
    layout: Layout,
    shard: Dataset,
    order: Vec<usize>,
    cursor: usize,
    rng: ChaCha8Rng,
    /// Top-k: one encoder per destination.
    encoders: BTreeMap<(MemberId, Purpose), Encoder>,
    /// The other codecs: one encoding for every destination (int8 carries its rounding error).
    shared_encoders: BTreeMap<Purpose, Encoder>,
    decoders: BTreeMap<(MemberId, Purpose), Decoder>,
    /// Auto averaging: each edge's schedule.
    cadence: Option<Cadence>,
    /// Auto averaging: this step's mini-batch, on which neighbours' models are scored.
    last_batch: Option<Batch<B::InnerBackend>>,
    /// Asynchronous gossip: requests waiting for their replies.
    requests: Requests,
    pub bytes_sent: u64,
    /// `bytes_sent` by destination: what crossed each link (cross-zone traffic is summed from it).
    pub bytes_sent_to: BTreeMap<MemberId, u64>,
    pub bytes_received: u64,
    device: B::Device,
    scratch: Vec<f32>,
}

/// A mini-batch: images and their labels.
type Batch<B> = (Tensor<B, 2>, Tensor<B, 1, Int>);

impl<B: AutodiffBackend> Member<B> {
    pub fn new(
        id: MemberId,
        config: MemberConfig,
        initial: Model<B>,
        shard: Dataset,
        device: B::Device,
    ) -> Result<Self, MemberError> {
        if shard.is_empty() {
            return Err(MemberError::EmptyShard { member: id });
        }
        let layout = model::layout(&initial);
        let rng = ChaCha8Rng::seed_from_u64(config.seed ^ (u64::from(id) << 32) ^ 0x5eed);
        let cadence = match config.averaging {
            Averaging::Auto(policy) => Some(Cadence::new(id, policy)),
            Averaging::Every(_) => None,
        };
        Ok(Self {
            cadence,
            last_batch: None,
            requests: Requests::default(),
            id,
            optim: Optim::new(config.optimizer, config.momentum),
            config,
            model: Some(initial),
            layout,
            order: (0..shard.len()).collect(),
            cursor: usize::MAX,
            shard,
            rng,
            encoders: BTreeMap::new(),
            shared_encoders: BTreeMap::new(),
            decoders: BTreeMap::new(),
            bytes_sent: 0,
            bytes_sent_to: BTreeMap::new(),
            bytes_received: 0,
            device,
            scratch: Vec::new(),
        })
    }

    pub fn model(&self) -> &Model<B> {
        self.model.as_ref().expect("model present between steps")
    }

    pub fn parameters(&mut self) -> Vec<f32> {
        let (model, values, _) = model::export(self.model.take().expect("model present"));
        self.model = Some(model);
        values
    }

    /// Replace the parameters (state transfer from a peer); the optimizer state stays.
    pub fn set_parameters(&mut self, values: &[f32]) -> Result<(), MemberError> {
        let model = self.model.take().expect("model present");
        match model::import(model.clone(), values, &self.layout) {
            Ok(m) => {
                self.model = Some(m);
                Ok(())
            }
            Err(e) => {
                self.model = Some(model);
                Err(e.into())
            }
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Model and optimizer state as burn records (named MessagePack), for checkpoints.
    pub fn records(&self) -> Result<(Vec<u8>, Vec<u8>), MemberError> {
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let model = Recorder::<B>::record(&recorder, self.model().clone().into_record(), ())
            .map_err(record_error("model"))?;
        Ok((model, self.optim.to_bytes()?))
    }

    /// Restore what [`records`](Self::records) wrote. Parameter ids come back with the model,
    /// so the optimizer state, keyed by them, attaches again.
    pub fn restore(&mut self, model: Vec<u8>, optimizer: Vec<u8>) -> Result<(), MemberError> {
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let record = recorder
            .load(model, &self.device)
            .map_err(record_error("model"))?;
        let restored = self.model().clone().load_record(record);
        if model::layout(&restored) != self.layout {
            return Err(MemberError::Record {
                what: "model",
                message: "its parameter shapes differ from this model's".into(),
            });
        }
        let optim = std::mem::replace(
            &mut self.optim,
            Optim::new(self.config.optimizer, self.config.momentum),
        );
        self.optim = optim.load_bytes(optimizer, &self.device)?;
        self.model = Some(restored);
        Ok(())
    }

    /// Test accuracy and mean cross-entropy of this member's model.
    pub fn evaluate(&self, test: &Dataset) -> (f64, f64) {
        let model = self.model().valid();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (mut correct, mut loss_sum) = (0usize, 0f64);
        for start in (0..test.len()).step_by(500) {
            let end = (start + 500).min(test.len());
            let n = end - start;
            let x = Tensor::<B::InnerBackend, 2>::from_data(
                TensorData::new(
                    test.pixels[start * IMAGE_PIXELS..end * IMAGE_PIXELS].to_vec(),
                    [n, IMAGE_PIXELS],
                ),
                &device,
            );
            let labels: Vec<i64> = test.labels[start..end]
                .iter()
                .map(|&l| i64::from(l))
                .collect();
            let y = Tensor::<B::InnerBackend, 1, Int>::from_data(
                TensorData::new(labels.clone(), [n]),
                &device,
            );
            let logits = model.forward(x);
            let loss = CrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits.clone(), y);
            loss_sum += loss.into_data().iter::<f64>().next().unwrap_or(f64::NAN) * n as f64;
            let predicted: Vec<i64> = logits.argmax(1).into_data().iter::<i64>().collect();
            correct += predicted
                .iter()
                .zip(&labels)
                .filter(|(p, l)| p == l)
                .count();
        }
        let n = test.len().max(1) as f64;
        (correct as f64 / n, loss_sum / n)
    }

    pub fn label_histogram(&self) -> Vec<u64> {
        self.shard.label_histogram()
    }

    /// The next mini-batch, reshuffling the shard at every epoch.
    fn next_batch(&mut self) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = self.config.batch_size.min(self.shard.len()).max(1);
        let mut pixels = Vec::with_capacity(n * IMAGE_PIXELS);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            if self.cursor >= self.order.len() {
                self.order.shuffle(&mut self.rng);
                self.cursor = 0;
            }
            let i = self.order[self.cursor];
            self.cursor += 1;
            pixels.extend_from_slice(self.shard.image(i));
            labels.push(i64::from(self.shard.labels[i]));
        }
        (
            Tensor::from_data(TensorData::new(pixels, [n, IMAGE_PIXELS]), &self.device),
            Tensor::from_data(TensorData::new(labels, [n]), &self.device),
        )
    }

    /// Loss and gradients of `model` on the next mini-batch.
    fn gradients(&mut self, model: &Model<B>) -> (f64, GradientsParams) {
        let (x, y) = self.next_batch();
        if self.cadence.is_some() {
            self.last_batch = Some((x.clone().inner(), y.clone().inner()));
        }
        let loss = CrossEntropyLossConfig::new()
            .init(&self.device)
            .forward(model.forward(x), y);
        let value: f64 = loss
            .clone()
            .into_data()
            .iter::<f64>()
            .next()
            .unwrap_or(f64::NAN);
        (value, GradientsParams::from_grads(loss.backward(), model))
    }

    /// How differently each of `theirs` (flat models) scores from `model` on this step's
    /// mini-batch: |L_theirs − L_mine| in nats — after SkewScout's accuracy loss of a neighbour's
    /// model on local data, which grows with label skew long before the parameters look far
    /// apart. NaN when it cannot be scored.
    fn skews(&self, model: &Model<B>, theirs: &[&[f32]]) -> Vec<f64> {
        let Some((x, y)) = &self.last_batch else {
            return vec![f64::NAN; theirs.len()];
        };
        let mine = model.valid();
        let loss = |m: &Model<B::InnerBackend>| -> f64 {
            let device = x.device();
            CrossEntropyLossConfig::new()
                .init(&device)
                .forward(m.forward(x.clone()), y.clone())
                .into_data()
                .iter::<f64>()
                .next()
                .unwrap_or(f64::NAN)
        };
        let base = loss(&mine);
        theirs
            .iter()
            .map(
                |values| match model::import(mine.clone(), values, &self.layout) {
                    Ok(neighbour) => (loss(&neighbour) - base).abs(),
                    Err(_) => f64::NAN,
                },
            )
            .collect()
    }

    /// A step on local data only, with no communication (warm-up). Returns the loss.
    pub fn local_step(&mut self) -> f64 {
        let model = self.model.take().expect("model present");
        let (loss, grads) = self.gradients(&model);
        self.model = Some(self.optim.step(self.config.learning_rate, model, grads));
        loss
    }

    /// Mean softmax output on the shared proxy batch: what this member's model has learnt to
    /// predict, without revealing a label (the proxy-clumps join report).
    pub fn proxy_vector(&self, proxy: &Dataset) -> Vec<f32> {
        let model = self.model().valid();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let n = proxy.len().max(1);
        let x = Tensor::<B::InnerBackend, 2>::from_data(
            TensorData::new(proxy.pixels.clone(), [proxy.len(), IMAGE_PIXELS]),
            &device,
        );
        let probs = burn::tensor::activation::softmax(model.forward(x), 1).sum_dim(0) / n as f32;
        probs.into_data().iter::<f32>().collect()
    }

    /// Payloads of `values` for each of `peers`. Top-k keeps codec state per destination, so its
    /// estimates stay exact; the other codecs keep receivers stateless, so one encoding is shared
    /// by all (int8's sender-side carry belongs to that one stream).
    /// `trailer` (the cadence's, possibly empty) follows each encoding.
    fn encode(
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
            Compression::None | Compression::Fp16 | Compression::Int8 => {
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
    fn decode_all(
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

    /// Send `values` to `to` and receive from `from` (the same members, except on a one-peer
    /// schedule); `trailer` (auto averaging) follows each payload.
    async fn share<E: Exchange>(
        &mut self,
        ex: &mut E,
        round: u64,
        purpose: Purpose,
        (to, from): (&[MemberId], &[MemberId]),
        values: &[f32],
        trailer: Option<&[u8]>,
    ) -> Vec<(MemberId, Decoded, Option<u64>)> {
        // Gradients are never top-k'd: an estimate of a gradient stream is meaningless.
        let compression = match (purpose, self.config.compression) {
            (Purpose::Gradients, Compression::TopK { .. }) => Compression::None,
            (_, c) => c,
        };
        let outgoing = self.encode(to, purpose, compression, values, trailer.unwrap_or(&[]));
        let received = ex.exchange(round, purpose, outgoing, from).await;
        self.decode_all(purpose, compression, received, trailer.is_some())
    }

    /// One local step, then (every `average_every` steps, or on the edges the cadence says are
    /// due) an averaging round.
    pub async fn step<E: Exchange>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        ex: &mut E,
    ) -> Result<StepReport, MemberError> {
        let model = self.model.take().expect("model present");
        let (loss_value, mut grads) = self.gradients(&model);
        let mut heard_from = 0;
        let mut exchanged = false;
        let mut local_disagreement = None;

        if self.config.algorithm == AlgorithmKind::CliqueAveraging && !hood.clique_mates.is_empty()
        {
            // Clique averaging: the clique's mean gradient, before the momentum step, removes the
            // label skew of any one member.
            let own = model::export_gradients(&model, &grads)?;
            let received = self
                .share(
                    ex,
                    step,
                    Purpose::Gradients,
                    (&hood.clique_mates, &hood.clique_mates),
                    &own,
                    None,
                )
                .await;
            heard_from += received.len();
            exchanged = true;
            let refs: Vec<&[f32]> = received.iter().map(|(_, g, _)| &**g).collect();
            grads = model::gradients_from_flat(&model, &mean(&own, &refs), &self.layout)?;
        }
        let mut model = self.optim.step(self.config.learning_rate, model, grads);

        // Auto averaging labels a round by its step: at most one a step, and both ends of an
        // edge agree on its steps.
        let round = match self.config.averaging {
            Averaging::Every(n) => (step + 1).is_multiple_of(n.max(1)).then(|| step / n.max(1)),
            Averaging::Auto(_) => Some(step),
        };
        let plan = round.map(|round| (round, self.averaging_plan(step, round, hood)));
        if let Some((round, plan)) = plan
            && !plan.from.is_empty()
        {
            // The scratch buffer keeps its pages between rounds: no page faults on every export.
            let mut own = std::mem::take(&mut self.scratch);
            let (exported, _) = model::export_into(model, &mut own);
            model = exported;
            let trailer = self
                .cadence
                .as_ref()
                .filter(|_| plan.paced)
                .map(|c| c.trailer(&plan.to));
            let received = self
                .share(
                    ex,
                    round,
                    Purpose::Parameters,
                    (&plan.to, &plan.from),
                    &own,
                    trailer.as_deref(),
                )
                .await;
            heard_from += received.len();
            exchanged = true;
            // The local disagreement is the distance to the plain mean of what was averaged;
            // computed in the same pass over the received models as the mix itself.
            let (mixed, disagreement) = if plan.weighted {
                let weight = |id: MemberId| {
                    hood.neighbours
                        .iter()
                        .find(|(n, _)| *n == id)
                        .map_or(0.0, |(_, w)| *w)
                };
                let weighted: Vec<(f64, &[f32])> = received
                    .iter()
                    .map(|(id, x, _)| (weight(*id), &**x))
                    .collect();
                weighted_average_and_disagreement(&own, plan.self_weight, &weighted)
            } else {
                let refs: Vec<&[f32]> = received.iter().map(|(_, x, _)| &**x).collect();
                let mixed = mean(&own, &refs);
                let disagreement = distance(&own, &mixed);
                (mixed, disagreement)
            };
            if !received.is_empty() {
                local_disagreement = Some(disagreement);
            }
            if plan.paced {
                // Scored only on the edges I decide: the other end's gap comes in its trailer.
                let decides = |id: MemberId| self.cadence.as_ref().is_some_and(|c| c.decides(id));
                let (ids, values): (Vec<MemberId>, Vec<&[f32]>) = received
                    .iter()
                    .filter(|(id, _, _)| decides(*id))
                    .map(|(id, x, _)| (*id, &**x))
                    .unzip();
                let skews: BTreeMap<MemberId, f64> =
                    ids.into_iter().zip(self.skews(&model, &values)).collect();
                let outcomes: Vec<(MemberId, Outcome)> = plan
                    .from
                    .iter()
                    .map(|&id| {
                        let outcome = match received.iter().find(|(from, _, _)| *from == id) {
                            Some((_, _, announced)) => Outcome::Delivered {
                                announced: *announced,
                                skew: skews.get(&id).copied(),
                            },
                            None => Outcome::Missed,
                        };
                        (id, outcome)
                    })
                    .collect();
                if let Some(cadence) = &mut self.cadence {
                    cadence.settle(step, &outcomes);
                }
            }
            drop(received);
            self.scratch = own;
            model = model::import(model, &mixed, &self.layout)?;
        }
        self.model = Some(model);
        Ok(StepReport {
            loss: loss_value,
            heard_from,
            exchanged,
            local_disagreement,
        })
    }

    /// Asynchronous gossip's step: a local step; then answer the requests and settle the replies
    /// that have arrived, and (every `average_every` steps) send a request to one neighbour
    /// chosen at random among those without one in flight. Never waits for anybody.
    pub fn gossip_step<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
    ) -> Result<StepReport, MemberError> {
        self.gossip(step, hood, mail, true)
    }

    /// Asynchronous gossip after the last step: answer requests with this model, which no longer
    /// changes. Neighbours still training keep a partner to mix with, so a member that finishes
    /// late does not spend its last steps alone on its own shard; and the finished model does not
    /// follow them (a model that only mixes with one late member, training on its own classes,
    /// would become a copy of it: measured, that cost the late member 20 to 35 points). The
    /// pair's sum is no longer kept: training is over here. Returns how many requests were
    /// answered.
    pub fn gossip_serve<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
    ) -> Result<usize, MemberError> {
        Ok(self.gossip(step, hood, mail, false)?.heard_from)
    }

    fn gossip<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
        train: bool,
    ) -> Result<StepReport, MemberError> {
        let loss = if train { self.local_step() } else { f64::NAN };
        let mut model = self.model.take().expect("model present");
        let neighbours: Vec<MemberId> = hood.neighbours.iter().map(|(id, _)| *id).collect();
        let max_staleness = self.config.max_staleness;
        let letters = mail.collect();
        self.requests.expire(step, max_staleness, &neighbours);
        let every = match self.config.averaging {
            Averaging::Every(n) => n.max(1),
            Averaging::Auto(_) => 1,
        };
        let free = self.requests.free(step, neighbours.iter().copied());
        let ask = train && (step + 1).is_multiple_of(every) && !free.is_empty();
        let mut report = StepReport {
            loss,
            heard_from: 0,
            exchanged: ask || !letters.is_empty(),
            local_disagreement: None,
        };
        if !report.exchanged {
            self.model = Some(model);
            return Ok(report);
        }
        let mut own = std::mem::take(&mut self.scratch);
        let (exported, _) = model::export_into(model, &mut own);
        model = exported;
        let before = (!letters.is_empty()).then(|| own.clone());
        let compression = self.config.compression;
        for (from, letter) in letters {
            // A letter from a member that is not (or no longer) a neighbour is ignored: its
            // request goes unanswered and is given up at the other end.
            if !neighbours.contains(&from) {
                continue;
            }
            let Some((_, theirs, _)) = self
                .decode_all(
                    Purpose::Parameters,
                    compression,
                    vec![(from, letter.payload)],
                    false,
                )
                .pop()
            else {
                continue;
            };
            match letter.kind {
                LetterKind::Request => {
                    // The reply carries the model the move is taken from, so the pair's sum holds.
                    let payload = self.encode_for(from, compression, &own);
                    mail.post(
                        from,
                        Letter {
                            kind: LetterKind::Reply,
                            seq: letter.seq,
                            payload,
                        },
                    );
                    if train {
                        async_gossip::meet_halfway(&mut own, &theirs);
                    }
                    self.requests.counts.served += 1;
                    report.heard_from += 1;
                }
                LetterKind::Reply if train => {
                    if let Some(sent) = self.requests.close(from, letter.seq, step, max_staleness) {
                        async_gossip::settle(&mut own, &sent, &theirs);
                        report.heard_from += 1;
                    }
                }
                LetterKind::Reply => {}
            }
        }
        if ask {
            let to = free[self.rng.random_range(0..free.len())];
            let payload = self.encode_for(to, compression, &own);
            let seq = self.requests.open(to, step, own.clone());
            mail.post(
                to,
                Letter {
                    kind: LetterKind::Request,
                    seq,
                    payload,
                },
            );
        }
        if let Some(before) = before
            && report.heard_from > 0
        {
            report.local_disagreement = Some(distance(&before, &own));
        }
        model = model::import(model, &own, &self.layout)?;
        self.scratch = own;
        self.model = Some(model);
        Ok(report)
    }

    /// Parameters for one member (asynchronous gossip's letters carry no trailer).
    fn encode_for(&mut self, to: MemberId, compression: Compression, values: &[f32]) -> Payload {
        let (_, payload) = self
            .encode(&[to], Purpose::Parameters, compression, values, &[])
            .pop()
            .expect("one destination, one payload");
        payload
    }

    /// What asynchronous gossip has done so far.
    pub fn gossip_counts(&self) -> GossipCounts {
        self.requests.counts
    }

    /// Who to send to and hear from in this averaging round, and whether W's weights or a plain
    /// mean apply.
    fn averaging_plan(&mut self, step: u64, round: u64, hood: &Neighbourhood) -> AveragingPlan {
        let plain = |to: Vec<MemberId>, from: Vec<MemberId>| AveragingPlan {
            to,
            from,
            weighted: false,
            self_weight: 1.0,
            paced: false,
        };
        match self.config.algorithm {
            AlgorithmKind::Dpsgd | AlgorithmKind::CliqueAveraging => match hood.one_peer(round) {
                // Half mine, half my one in-peer's: a plain mean of the two.
                Some(p) => plain(vec![p.send_to], vec![p.receive_from]),
                None => {
                    let all = hood.neighbours.iter().map(|(id, _)| *id);
                    match &mut self.cadence {
                        None => {
                            let all: Vec<MemberId> = all.collect();
                            AveragingPlan {
                                to: all.clone(),
                                from: all,
                                weighted: true,
                                self_weight: hood.self_weight,
                                paced: false,
                            }
                        }
                        Some(cadence) => {
                            let due = cadence.due(step, all);
                            // A skipped edge's weight stays here: W stays doubly stochastic.
                            let skipped: f64 = hood
                                .neighbours
                                .iter()
                                .filter(|(id, _)| !due.contains(id))
                                .map(|(_, w)| w)
                                .sum();
                            AveragingPlan {
                                to: due.clone(),
                                from: due,
                                weighted: true,
                                self_weight: hood.self_weight + skipped,
                                paced: true,
                            }
                        }
                    }
                }
            },
            // Asynchronous gossip has no rounds (see `gossip_step`); if asked for one anyway it
            // behaves as gossip.
            AlgorithmKind::Gossip | AlgorithmKind::AsyncGossip => {
                let partner: Vec<MemberId> =
                    gossip_partner(&hood.edges, self.config.seed, round, self.id)
                        .into_iter()
                        .collect();
                plain(partner.clone(), partner)
            }
            AlgorithmKind::Moshpit => {
                let group = hood.moshpit_group(self.config.group_size, round);
                plain(group.clone(), group)
            }
        }
    }
}

/// One averaging round's plan.
struct AveragingPlan {
    to: Vec<MemberId>,
    from: Vec<MemberId>,
    /// W's weights (with `self_weight` for W_ii) rather than a plain mean.
    weighted: bool,
    self_weight: f64,
    /// The edges follow the cadence (auto averaging): payloads carry its trailer.
    paced: bool,
}
