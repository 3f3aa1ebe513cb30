//! One member: its model, optimizer, shard and codec state, and the step that every algorithm
//! shares — local gradient, (clique-averaged gradient,) optimizer step, averaging round.
//!
//! - here: the member's configuration, errors, optimizer, state and its access (parameters,
//!   checkpoint records);
//! - [`local`]: mini-batches, loss and gradients, and the step on local data only;
//! - [`eval`]: forward passes that train nothing — test evaluation, proxy vectors, neighbours'
//!   skews;
//! - [`codec`]: payloads — encoding, decoding and sharing them through an [`Exchange`];
//! - [`rounds`]: the synchronous step and its averaging rounds (D-PSGD, gossip, clique
//!   averaging, Moshpit);
//! - [`async_step`]: asynchronous gossip's step through a [`Mailbox`].
//!
//! [`Exchange`]: super::Exchange
//! [`Mailbox`]: super::Mailbox

mod async_step;
mod codec;
mod eval;
mod local;
mod rounds;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use burn::module::{AutodiffModule, Module};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use murmur_core::api::{AlgorithmKind, OptimizerKind};
use murmur_core::topology::MemberId;

use super::Purpose;
use super::async_gossip::Requests;
use super::cadence::{Averaging, Cadence};
use super::outer::{Outer, OuterConfig};
use super::sgd::InPlaceSgd;
use crate::compression::{Compression, Decoder, Encoder};
use crate::model::{self, FlatError, Layout};
use crate::task::{Data, Task};

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
    /// Outer steps: every averaging round moves an anchor by an outer optimizer step.
    /// `averaging` is then `Every(local_steps)`.
    pub outer: Option<OuterConfig>,
    /// Exchange while computing: with `outer`, a round is mixed in `overlap_steps` local steps
    /// after it is posted; without, a round's parameters travel while the step's gradient is
    /// computed.
    pub overlap: bool,
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

pub enum Optim<B: AutodiffBackend, M: AutodiffModule<B>> {
    Sgd(OptimizerAdaptor<InPlaceSgd, M, B>),
    Adam(OptimizerAdaptor<Adam, M, B>),
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Optim<B, M> {
    fn new(kind: OptimizerKind, momentum: f64) -> Self {
        match kind {
            OptimizerKind::Sgd => Optim::Sgd(InPlaceSgd::new(momentum.max(0.0)).init()),
            OptimizerKind::Adam => Optim::Adam(AdamConfig::new().init()),
        }
    }

    /// Forget SGD's momentum at an outer step. Over local steps it points along this member's
    /// own data, and the outer momentum carries the direction the neighbourhood shares: on
    /// the D-Cliques example with outer steps every 8, keeping it cost 0.44 point (mean of
    /// three seeds, docs/benchmarks.md, "Outer steps"). Adam's moments are scales, not a
    /// direction, and stay.
    fn restart_momentum(&mut self, momentum: f64) {
        if let Optim::Sgd(_) = self {
            *self = Optim::new(OptimizerKind::Sgd, momentum);
        }
    }

    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M {
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

pub struct Member<B: AutodiffBackend, T: Task> {
    pub id: MemberId,
    config: MemberConfig,
    task: Arc<T>,
    model: Option<T::Model<B>>,
    optim: Optim<B, T::Model<B>>,
    layout: Layout,
    /// All the training data, and the examples of it that are this member's.
    data: Arc<T::Data>,
    shard: Vec<usize>,
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
    last_batch: Option<Vec<usize>>,
    /// Asynchronous gossip: requests waiting for their replies.
    requests: Requests,
    pub bytes_sent: u64,
    /// `bytes_sent` by destination: what crossed each link (cross-zone traffic is summed from it).
    pub bytes_sent_to: BTreeMap<MemberId, u64>,
    pub bytes_received: u64,
    device: B::Device,
    scratch: Vec<f32>,
    /// Outer steps: the anchor and the outer momentum.
    outer: Option<Outer>,
    /// The run's last step (0-based), where outer steps take a round whatever the cadence.
    last_step: Option<u64>,
    /// Overlap: the round posted and not yet collected.
    pending: Option<rounds::Pending>,
}

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// Member `id` of `task`, from model `initial`, training on the examples `shard` of `data`.
    pub fn new(
        id: MemberId,
        config: MemberConfig,
        task: Arc<T>,
        initial: T::Model<B>,
        data: Arc<T::Data>,
        shard: Vec<usize>,
        device: B::Device,
    ) -> Result<Self, MemberError> {
        if shard.is_empty() {
            return Err(MemberError::EmptyShard { member: id });
        }
        let layout = model::layout(&initial);
        // Ids every member shares, so optimizer state can move between members.
        let initial = model::with_slot_ids(initial);
        let (initial, outer) = match config.outer {
            Some(_) => {
                let (initial, values, _) = model::export(initial);
                (initial, Some(Outer::start(&values)))
            }
            None => (initial, None),
        };
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
            task,
            model: Some(initial),
            layout,
            order: (0..shard.len()).collect(),
            cursor: usize::MAX,
            data,
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
            outer,
            last_step: None,
            pending: None,
        })
    }

    pub fn model(&self) -> &T::Model<B> {
        self.model.as_ref().expect("model present between steps")
    }

    pub fn parameters(&mut self) -> Vec<f32> {
        let (model, values, _) = model::export(self.model.take().expect("model present"));
        self.model = Some(model);
        values
    }

    /// The model this member ends with, the one [`evaluate`](Self::evaluate) scores: with outer
    /// steps the anchor (a member can end part way through its local steps, when a neighbour
    /// reached the stopping target first), otherwise the parameters.
    pub fn final_parameters(&mut self) -> Vec<f32> {
        match &self.outer {
            Some(outer) => outer.anchor.clone(),
            None => self.parameters(),
        }
    }

    /// The optimizer state (momentum, Adam moments) as a burn record, keyed by parameter ids
    /// every member shares: what a joining member takes with a neighbour's parameters, so its
    /// first steps are not those of a fresh optimizer.
    pub fn optimizer_state(&self) -> Result<Vec<u8>, MemberError> {
        self.optim.to_bytes()
    }

    /// Take a neighbour's [`optimizer_state`](Self::optimizer_state). On an error, the state
    /// this member had stays.
    pub fn set_optimizer_state(&mut self, bytes: Vec<u8>) -> Result<(), MemberError> {
        self.optim = Optim::new(self.config.optimizer, self.config.momentum)
            .load_bytes(bytes, &self.device)?;
        Ok(())
    }

    /// Replace the parameters (state transfer from a peer); the optimizer state stays. With
    /// outer steps the anchor restarts from them, with no outer momentum, until
    /// [`set_outer_state`](Self::set_outer_state) says otherwise.
    pub fn set_parameters(&mut self, values: &[f32]) -> Result<(), MemberError> {
        self.import_parameters(values)?;
        if self.outer.is_some() {
            self.outer = Some(Outer::start(values));
        }
        Ok(())
    }

    /// Replace the parameters alone; on an error the model stays as it was. A posted round is
    /// dropped: what it would mix in belongs to the parameters replaced.
    fn import_parameters(&mut self, values: &[f32]) -> Result<(), MemberError> {
        self.pending = None;
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

    /// The run ends after `steps` steps: with outer steps, the last one ends in a round.
    pub fn set_total_steps(&mut self, steps: u64) {
        self.last_step = steps.checked_sub(1);
    }

    /// What a joining or lagging neighbour takes from this member: the parameters, and with
    /// outer steps the anchor and the outer momentum after them (three model lengths), so
    /// that it takes its next outer step as this member will.
    pub fn transferable_state(&mut self) -> Vec<f32> {
        let mut state = self.parameters();
        if let Some(outer) = &self.outer {
            state.extend_from_slice(&outer.anchor);
            state.extend_from_slice(&outer.momentum);
        }
        state
    }

    /// The length of [`transferable_state`](Self::transferable_state).
    pub fn transferable_len(&self) -> usize {
        self.layout.len() * if self.outer.is_some() { 3 } else { 1 }
    }

    /// Take a neighbour's [`transferable_state`](Self::transferable_state); one of another
    /// length (a member without outer steps, another model) is refused and changes nothing.
    pub fn set_transferable_state(&mut self, state: &[f32]) -> Result<(), MemberError> {
        let n = self.layout.len();
        if state.len() != self.transferable_len() {
            return Err(MemberError::Record {
                what: "state",
                message: format!(
                    "{} values, where this member takes {}",
                    state.len(),
                    self.transferable_len()
                ),
            });
        }
        if self.outer.is_none() {
            return self.set_parameters(state);
        }
        self.import_parameters(&state[..n])?;
        self.outer = Some(Outer {
            anchor: state[n..2 * n].to_vec(),
            momentum: state[2 * n..].to_vec(),
        });
        Ok(())
    }

    /// With outer steps: the anchor and the outer momentum.
    pub fn outer_state(&self) -> Option<&Outer> {
        self.outer.as_ref()
    }

    /// Take a neighbour's (or a checkpoint's) [`outer_state`](Self::outer_state). Refused when
    /// this member takes no outer steps or the lengths are not this model's.
    pub fn set_outer_state(&mut self, state: Outer) -> Result<(), MemberError> {
        let expected = self.layout.len();
        if self.outer.is_none() {
            return Err(MemberError::Record {
                what: "outer state",
                message: "this member takes no outer steps".into(),
            });
        }
        if state.anchor.len() != expected || state.momentum.len() != expected {
            return Err(MemberError::Record {
                what: "outer state",
                message: format!(
                    "anchor of {} and momentum of {} values, for a model of {expected}",
                    state.anchor.len(),
                    state.momentum.len()
                ),
            });
        }
        self.outer = Some(state);
        Ok(())
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
        self.pending = None;
        if self.outer.is_some() {
            let values = self.parameters();
            self.outer = Some(Outer::start(&values));
        }
        Ok(())
    }

    /// Examples per class in this member's shard (its join report).
    pub fn label_histogram(&self) -> Vec<u64> {
        self.data.histogram(&self.shard)
    }

    /// The task this member trains.
    pub fn task(&self) -> &T {
        &self.task
    }
}
