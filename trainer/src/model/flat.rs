//! Parameters as one flat f32 buffer, in module-path order: the order `Module::visit` walks the
//! fields as declared (for an MLP: hidden.weight, hidden.bias, output.weight, output.bias). A shape
//! manifest (the layout) goes with every buffer and is checked before import: a mismatch is an
//! error, never a silent reshape. Import keeps each parameter's id, so the local optimizer state
//! (keyed by parameter id) stays attached. [`with_slot_ids`] makes those ids the same in every
//! member, so one member's optimizer state attaches to another's model (state transfer).

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

/// One parameter's place in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSlot {
    /// Module path, e.g. `hidden.weight` or `blocks.0.norm.gamma`.
    pub path: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl ParamSlot {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The shape manifest of a model's flat buffer.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Layout {
    pub slots: Vec<ParamSlot>,
}

impl Layout {
    /// Number of values in the buffer.
    pub fn len(&self) -> usize {
        self.slots.last().map_or(0, |s| s.offset + s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A stable fingerprint of paths and shapes (FNV-1a), for frame headers and logs.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for s in &self.slots {
            let dims = s.shape.iter().flat_map(|d| (*d as u64).to_le_bytes());
            for b in s.path.bytes().chain([0]).chain(dims) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    /// Where `self` and `other` first differ, for error messages.
    fn first_difference(&self, other: &Layout) -> String {
        self.slots
            .iter()
            .zip(&other.slots)
            .find(|(a, b)| a.path != b.path || a.shape != b.shape)
            .map(|(a, b)| {
                format!(
                    "{} {:?} here, {} {:?} in the buffer",
                    a.path, a.shape, b.path, b.shape
                )
            })
            .unwrap_or_else(|| {
                format!(
                    "{} parameters here, {} in the buffer",
                    self.slots.len(),
                    other.slots.len()
                )
            })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlatError {
    #[error("parameter layout differs from this model's: {0}")]
    LayoutMismatch(String),
    #[error("flat buffer holds {found} values, the layout needs {expected}")]
    Length { expected: usize, found: usize },
    #[error("no gradient for parameter {0}")]
    MissingGradient(String),
}

/// The module path of the parameter being visited, e.g. `blocks.0.norm.gamma`.
#[derive(Default)]
struct ModulePath(Vec<String>);

impl ModulePath {
    fn enter(&mut self, name: &str, container: &str) {
        // An enum variant is the model kind, not a field: it adds no path segment.
        if !container.starts_with("Enum:") {
            self.0.push(name.to_string());
        }
    }

    fn exit(&mut self, container: &str) {
        if !container.starts_with("Enum:") {
            self.0.pop();
        }
    }

    fn current(&self) -> String {
        self.0.join(".")
    }
}

/// What a walk over the parameters collects besides the layout.
enum Collect<'a> {
    Nothing,
    Gradients(&'a mut Vec<f32>, &'a GradientsParams),
}

struct Walker<'a, B: Backend> {
    path: ModulePath,
    layout: Layout,
    collect: Collect<'a>,
    missing: Option<String>,
    _backend: std::marker::PhantomData<B>,
}

impl<'a, B: Backend> Walker<'a, B> {
    fn new(collect: Collect<'a>) -> Self {
        Self {
            path: ModulePath::default(),
            layout: Layout::default(),
            collect,
            missing: None,
            _backend: Default::default(),
        }
    }
}

fn append(out: &mut Vec<f32>, data: &TensorData) {
    match data.as_slice::<f32>() {
        Ok(values) => out.extend_from_slice(values),
        Err(_) => out.extend(data.iter::<f32>()),
    }
}

impl<B: Backend> ModuleVisitor<B> for Walker<'_, B> {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name, container);
    }

    fn exit_module(&mut self, _name: &str, container: &str) {
        self.path.exit(container);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape: Vec<usize> = param.shape().dims::<D>().to_vec();
        let slot = ParamSlot {
            path: self.path.current(),
            shape,
            offset: self.layout.len(),
        };
        match &mut self.collect {
            Collect::Nothing => {}
            Collect::Gradients(out, grads) => match grads.get::<B, D>(param.id) {
                Some(g) => append(out, &g.into_data()),
                None => {
                    self.missing.get_or_insert_with(|| slot.path.clone());
                    out.resize(out.len() + slot.len(), 0.0);
                }
            },
        }
        self.layout.slots.push(slot);
    }
}

/// The model's layout, without copying any value.
pub fn layout<B: Backend, M: Module<B>>(model: &M) -> Layout {
    let mut w = Walker::<B>::new(Collect::Nothing);
    model.visit(&mut w);
    w.layout
}

/// Moves every float parameter out of the module and back, copying its values into `out`.
/// Consuming the parameter leaves its storage unshared, so burn hands over the buffer without a
/// copy of its own (a shared one would be copied element by element, ~150x slower than memcpy).
struct Exporter<'a> {
    out: &'a mut Vec<f32>,
    path: ModulePath,
    layout: Layout,
}

impl<B: Backend> ModuleMapper<B> for Exporter<'_> {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name, container);
    }

    fn exit_module(&mut self, _name: &str, container: &str) {
        self.path.exit(container);
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let device = tensor.device();
        let require_grad = tensor.is_require_grad();
        let shape: Vec<usize> = tensor.shape().dims::<D>().to_vec();
        let slot = ParamSlot {
            path: self.path.current(),
            shape,
            offset: self.layout.len(),
        };
        let data = tensor.into_data();
        append(self.out, &data);
        self.layout.slots.push(slot);
        let mut back = Tensor::<B, D>::from_data(data, &device);
        if require_grad {
            back = back.require_grad();
        }
        Param::from_mapped_value(id, back, mapper)
    }
}

/// The model's parameters as a flat buffer, with its layout. Takes and returns the model so the
/// copy out is a single memcpy per parameter.
pub fn export<B: Backend, M: Module<B>>(model: M) -> (M, Vec<f32>, Layout) {
    let mut out = Vec::new();
    let (model, layout) = export_into(model, &mut out);
    (model, out, layout)
}

/// Like [`export`], into a buffer the caller reuses across rounds: a fresh buffer costs a page
/// fault per 4 KiB on first write, which dominates the copy itself for large models.
pub fn export_into<B: Backend, M: Module<B>>(model: M, out: &mut Vec<f32>) -> (M, Layout) {
    out.clear();
    out.reserve(model.num_params());
    let mut e = Exporter {
        out,
        path: ModulePath::default(),
        layout: Layout::default(),
    };
    let model = model.map(&mut e);
    (model, e.layout)
}

/// The gradients of `model`'s parameters, flat, in the model's layout.
pub fn export_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Result<Vec<f32>, FlatError> {
    let mut out = Vec::with_capacity(model.num_params());
    let mut w = Walker::<B::InnerBackend>::new(Collect::Gradients(&mut out, grads));
    model.valid().visit(&mut w);
    match w.missing {
        Some(path) => Err(FlatError::MissingGradient(path)),
        None => Ok(out),
    }
}

fn check<B: Backend, M: Module<B>>(
    model: &M,
    values: &[f32],
    expected: &Layout,
) -> Result<(), FlatError> {
    let own = layout(model);
    if &own != expected {
        return Err(FlatError::LayoutMismatch(own.first_difference(expected)));
    }
    if values.len() != own.len() {
        return Err(FlatError::Length {
            expected: own.len(),
            found: values.len(),
        });
    }
    Ok(())
}

fn slot_data(values: &[f32], slot: &ParamSlot) -> TensorData {
    TensorData::new(
        values[slot.offset..slot.offset + slot.len()].to_vec(),
        slot.shape.clone(),
    )
}

struct Importer<'a, B: Backend> {
    values: &'a [f32],
    slots: std::slice::Iter<'a, ParamSlot>,
    device: B::Device,
}

impl<B: Backend> ModuleMapper<B> for Importer<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let slot = self.slots.next().expect("layout checked before import");
        let (id, old, mapper) = param.consume();
        let require_grad = old.is_require_grad();
        let values = &self.values[slot.offset..slot.offset + slot.len()];
        // Reuse the old parameter's buffer: its pages are mapped, so the copy runs at memcpy speed
        // instead of faulting in fresh memory. (Unshared storage is handed over without a copy.)
        let data = match old.into_data().into_vec::<f32>() {
            Ok(mut buffer) if buffer.len() == values.len() => {
                buffer.copy_from_slice(values);
                TensorData::new(buffer, slot.shape.clone())
            }
            _ => slot_data(self.values, slot),
        };
        let mut tensor = Tensor::<B, D>::from_data(data, &self.device);
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Parameter ids from here up are slot numbers (see [`with_slot_ids`]); burn's own are random.
const SLOT_ID_BASE: u64 = 0x6d75_726d_0000_0000;

struct SlotIds(u64);

impl<B: Backend> ModuleMapper<B> for SlotIds {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, tensor, mapper) = param.consume();
        let id = ParamId::from(SLOT_ID_BASE + self.0);
        self.0 += 1;
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// `model` with each parameter's id its slot number in the flat buffer, instead of a random one:
/// the same in every member of a job, so optimizer state (keyed by id) moves between them.
pub fn with_slot_ids<B: Backend, M: Module<B>>(model: M) -> M {
    model.map(&mut SlotIds(0))
}

/// Load a flat buffer into `model`, whose layout must equal `expected` (checked first).
pub fn import<B: Backend, M: Module<B>>(
    model: M,
    values: &[f32],
    expected: &Layout,
) -> Result<M, FlatError> {
    check(&model, values, expected)?;
    let device = model.devices().into_iter().next().unwrap_or_default();
    Ok(model.map(&mut Importer::<B> {
        values,
        slots: expected.slots.iter(),
        device,
    }))
}

struct GradientBuilder<'a, B: AutodiffBackend> {
    values: &'a [f32],
    slots: std::slice::Iter<'a, ParamSlot>,
    grads: GradientsParams,
    device: burn::tensor::Device<B::InnerBackend>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradientBuilder<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let slot = self.slots.next().expect("layout checked");
        let g = Tensor::<B::InnerBackend, D>::from_data(slot_data(self.values, slot), &self.device);
        self.grads.register::<B::InnerBackend, D>(param.id, g);
    }
}

/// Gradients for `model`'s parameters from a flat buffer (e.g. averaged inside a clique).
pub fn gradients_from_flat<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    values: &[f32],
    expected: &Layout,
) -> Result<GradientsParams, FlatError> {
    check(model, values, expected)?;
    let device = model
        .valid()
        .devices()
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut b = GradientBuilder::<B> {
        values,
        slots: expected.slots.iter(),
        grads: GradientsParams::new(),
        device,
    };
    model.visit(&mut b);
    Ok(b.grads)
}
