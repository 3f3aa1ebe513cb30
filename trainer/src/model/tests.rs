use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig, momentum::MomentumConfig};
use burn::tensor::{Int, Tensor, TensorData};
use murmur_core::api::ModelKind;

use super::*;

type AB = crate::backend::Cpu;
type B = <AB as burn::tensor::backend::AutodiffBackend>::InnerBackend;

fn device() -> burn::tensor::Device<B> {
    Default::default()
}

#[test]
fn each_model_has_the_documented_shape() {
    let expected = [
        (
            ModelKind::LogisticRegression,
            7_850,
            vec!["linear.weight", "linear.bias"],
        ),
        (
            ModelKind::Mlp,
            784 * 256 + 256 + 256 * 10 + 10,
            vec![
                "hidden.weight",
                "hidden.bias",
                "output.weight",
                "output.bias",
            ],
        ),
    ];
    for (kind, params, paths) in expected {
        let model = Model::<B>::new(kind, &device());
        let l = layout(&model);
        assert_eq!(l.len(), params, "{kind:?}");
        assert_eq!(
            l.slots.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(),
            paths
        );
        let logits = model.forward(Tensor::zeros([3, IMAGE_PIXELS], &device()));
        assert_eq!(logits.dims(), [3, CLASSES]);
    }
    let lenet = Model::<B>::new(ModelKind::GnLenet, &device());
    let l = layout(&lenet);
    assert_eq!(l.slots[0].path, "blocks.0.conv.weight");
    assert_eq!(l.slots[0].shape, vec![32, 1, 5, 5]);
    assert!(
        l.slots
            .iter()
            .any(|s| s.path == "blocks.2.norm.gamma" && s.shape == vec![64])
    );
    assert_eq!(l.slots.last().unwrap().path, "output.bias");
    assert_eq!(
        lenet
            .forward(Tensor::zeros([2, IMAGE_PIXELS], &device()))
            .dims(),
        [2, CLASSES]
    );
}

#[test]
fn flat_export_import_round_trips_and_checks_the_layout() {
    let a = Model::<B>::new(ModelKind::Mlp, &device());
    let b = Model::<B>::new(ModelKind::Mlp, &device());
    let (_, values_a, layout_a) = export(a);
    let (b, values_b, _) = export(b);
    assert_ne!(values_a, values_b, "two initialisations differ");
    let b = import(b, &values_a, &layout_a).unwrap();
    let (b, values_b_after, _) = export(b);
    assert_eq!(values_b_after, values_a);

    let logistic = Model::<B>::new(ModelKind::LogisticRegression, &device());
    let err = import(logistic, &values_a, &layout_a).unwrap_err();
    assert!(
        matches!(err, FlatError::LayoutMismatch(ref d) if d.contains("linear.weight")),
        "{err}"
    );
    let err = import(b, &values_a[1..], &layout_a).unwrap_err();
    assert_eq!(
        err,
        FlatError::Length {
            expected: values_a.len(),
            found: values_a.len() - 1
        }
    );
    assert_ne!(
        layout_a.fingerprint(),
        layout(&Model::<B>::new(ModelKind::LogisticRegression, &device())).fingerprint()
    );
}

#[test]
fn import_keeps_parameter_ids_so_optimizer_state_stays_attached() {
    let dev = device();
    let model = Model::<AB>::new(ModelKind::LogisticRegression, &dev);
    let ids_before: Vec<_> = {
        let mut ids = Vec::new();
        model.visit(&mut IdCollector(&mut ids));
        ids
    };
    let (model, values, l) = export(model);
    let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    let model = import(model, &doubled, &l).unwrap();
    let mut ids_after = Vec::new();
    model.visit(&mut IdCollector(&mut ids_after));
    assert_eq!(ids_before, ids_after);

    // Still trainable after import: a step with momentum changes the parameters, and the
    // gradient round-trips through a flat buffer.
    let mut optim = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_dampening(0.0)))
        .init::<AB, Model<AB>>();
    let x = Tensor::<AB, 2>::ones([4, IMAGE_PIXELS], &dev);
    let y = Tensor::<AB, 1, Int>::from_data(TensorData::from([1i64, 2, 3, 4]), &dev);
    let loss = CrossEntropyLossConfig::new()
        .init(&dev)
        .forward(model.forward(x), y);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let flat = export_gradients(&model, &grads).unwrap();
    assert_eq!(flat.len(), l.len());
    assert!(flat.iter().any(|g| *g != 0.0));
    let rebuilt = gradients_from_flat(&model, &flat, &l).unwrap();
    let model = optim.step(0.1, model, rebuilt);
    assert_ne!(export(model).1, doubled);
}

struct IdCollector<'a>(&'a mut Vec<burn::module::ParamId>);

impl<B2: Backend> burn::module::ModuleVisitor<B2> for IdCollector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B2, D>>) {
        self.0.push(param.id);
    }
}

#[test]
fn the_fast_group_norm_matches_burns_bit_for_bit_forward_and_backward() {
    use burn::nn::GroupNormConfig;
    use burn::tensor::Distribution;
    let device = Default::default();
    <AB as burn::tensor::backend::Backend>::seed(&device, 7);
    let mut norm = GroupNormConfig::new(2, 6).init::<AB>(&device);
    // Scale and shift away from their initial ones and zeros, so both matter.
    norm.gamma = moved(norm.gamma.take(), 1.0);
    norm.beta = moved(norm.beta.take(), 0.0);
    let x = Tensor::<AB, 4>::random([3, 6, 5, 4], Distribution::Normal(0.3, 2.0), &device)
        .require_grad();
    let weights = Tensor::<AB, 4>::random([3, 6, 5, 4], Distribution::Uniform(-1.0, 1.0), &device);
    let ours = super::group_norm(&norm, x.clone());
    let theirs = norm.forward(x.clone());
    assert_eq!(values(ours.clone()), values(theirs.clone()));
    let grads_ours = (ours * weights.clone()).sum().backward();
    let grads_theirs = (theirs * weights).sum().backward();
    assert_eq!(
        values(x.grad(&grads_ours).unwrap()),
        values(x.grad(&grads_theirs).unwrap())
    );
    for (p, what) in [
        (&norm.gamma, "scale gradient"),
        (&norm.beta, "shift gradient"),
    ] {
        let p = p.as_ref().unwrap().val();
        // The per-channel sums run over rows in another order: equal to rounding.
        assert_close(
            values(p.grad(&grads_ours).unwrap()),
            values(p.grad(&grads_theirs).unwrap()),
            1e-4,
            what,
        );
    }
}

/// A per-channel parameter (a bias, scale or shift) drawn away from its initial values, around
/// `mean`, so that it matters in a comparison.
fn moved(
    p: Option<burn::module::Param<Tensor<AB, 1>>>,
    mean: f64,
) -> Option<burn::module::Param<Tensor<AB, 1>>> {
    use burn::tensor::Distribution;
    p.map(|p| {
        p.map(|t| {
            t.random_like(Distribution::Normal(mean, 0.5))
                .require_grad()
        })
    })
}

/// A tensor's values, on any backend (gradients live on the inner one).
fn values<B2: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B2, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// Equal up to `tolerance`, relative to the expected value (absolute near zero).
fn assert_close(ours: Vec<f32>, theirs: Vec<f32>, tolerance: f32, what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (a, b) in ours.iter().zip(&theirs) {
        assert!(
            (a - b).abs() <= tolerance * (1.0 + b.abs()),
            "{what}: {a} vs {b}\n{ours:?}\nvs {theirs:?}"
        );
    }
}

#[test]
fn the_conv_block_matches_burns_modules_forward_and_backward() {
    use burn::module::AutodiffModule;
    use burn::tensor::Distribution;
    let device = Default::default();
    <AB as burn::tensor::backend::Backend>::seed(&device, 11);
    let mut block = ConvBlock::<AB>::new(3, 8, &device);
    // A bias, scale and shift away from their initial values, so they matter.
    block.conv.bias = moved(block.conv.bias.take(), 0.0);
    block.norm.gamma = moved(block.norm.gamma.take(), 1.0);
    block.norm.beta = moved(block.norm.beta.take(), 0.0);
    let x = Tensor::<AB, 4>::random([4, 3, 7, 7], Distribution::Normal(0.0, 1.0), &device)
        .require_grad();
    let weights = Tensor::<AB, 4>::random([4, 8, 3, 3], Distribution::Uniform(-1.0, 1.0), &device);
    let ours = block.forward(x.clone());
    // burn's modules in the documented order: conv (bias inside), GroupNorm, ReLU, pool.
    let theirs = block.pool.forward(
        block
            .activation
            .forward(block.norm.forward(block.conv.forward(x.clone()))),
    );
    let theirs_plain = theirs.clone().inner();
    let close = |ours, theirs, what| assert_close(ours, theirs, 1e-5, what);
    close(values(ours.clone()), values(theirs.clone()), "output");
    let grads_ours = (ours * weights.clone()).sum().backward();
    let grads_theirs = (theirs * weights).sum().backward();
    close(
        values(x.grad(&grads_ours).unwrap()),
        values(x.grad(&grads_theirs).unwrap()),
        "input gradient",
    );
    let weight = block.conv.weight.val();
    close(
        values(weight.grad(&grads_ours).unwrap()),
        values(weight.grad(&grads_theirs).unwrap()),
        "weight gradient",
    );
    for (p, what) in [
        (&block.conv.bias, "bias gradient"),
        (&block.norm.gamma, "scale gradient"),
        (&block.norm.beta, "shift gradient"),
    ] {
        let p = p.as_ref().unwrap().val();
        close(
            values(p.grad(&grads_ours).unwrap()),
            values(p.grad(&grads_theirs).unwrap()),
            what,
        );
    }
    // Without autodiff (evaluation), the same output.
    let plain = block.valid().forward(x.inner());
    close(values(plain), values(theirs_plain), "plain output");
}

#[test]
fn the_dense_layer_matches_burns_linear_forward_and_backward() {
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;
    let device = Default::default();
    <AB as burn::tensor::backend::Backend>::seed(&device, 13);
    let mut layer = LinearConfig::new(20, 7).init::<AB>(&device);
    layer.bias = moved(layer.bias.take(), 0.0);
    let x =
        Tensor::<AB, 2>::random([5, 20], Distribution::Normal(0.0, 1.0), &device).require_grad();
    let weights = Tensor::<AB, 2>::random([5, 7], Distribution::Uniform(-1.0, 1.0), &device);
    let ours = super::dense(&layer, x.clone());
    let theirs = layer.forward(x.clone());
    let close = |ours, theirs, what| assert_close(ours, theirs, 1e-5, what);
    close(values(ours.clone()), values(theirs.clone()), "output");
    let grads_ours = (ours * weights.clone()).sum().backward();
    let grads_theirs = (theirs * weights).sum().backward();
    close(
        values(x.grad(&grads_ours).unwrap()),
        values(x.grad(&grads_theirs).unwrap()),
        "input gradient",
    );
    let weight = layer.weight.val();
    close(
        values(weight.grad(&grads_ours).unwrap()),
        values(weight.grad(&grads_theirs).unwrap()),
        "weight gradient",
    );
    let bias = layer.bias.as_ref().unwrap().val();
    close(
        values(bias.grad(&grads_ours).unwrap()),
        values(bias.grad(&grads_theirs).unwrap()),
        "bias gradient",
    );
}
