//! A model of one's own keeps murmur's elasticity: the language-model example
//! (`examples/charlm`, a trainer built on the library with a task murmur does not know) under
//! `murmur run`, undisturbed and with members SIGKILLed every few seconds. The chaotic run must
//! succeed with its test perplexity at most 5% above the calm one: replacements take a live
//! neighbour's parameters and optimizer state, so they rejoin where the job is.

mod support;

use support::*;

const MANIFEST: &str = "examples/charlm/job.yaml";
/// Fewer steps than the example's 1 200, so both runs take about two minutes here.
const STEPS: &str = "steps: 300";

#[test]
fn a_task_of_ones_own_under_preemption_chaos_succeeds_close_to_an_undisturbed_run() {
    let trainer = binaries().join("charlm-trainer");
    assert!(
        trainer.is_file(),
        "{} is missing: run the tests with `cargo test --workspace`",
        trainer.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("job.yaml");
    let text = std::fs::read_to_string(workspace().join(MANIFEST)).unwrap();
    assert_eq!(text.matches("steps: 1200").count(), 1, "{MANIFEST} changed");
    std::fs::write(&manifest, text.replace("steps: 1200", STEPS)).unwrap();
    let manifest = manifest.to_str().unwrap();
    let trainer = trainer.to_str().unwrap();

    let calm = Run::start(manifest, &["--trainer", trainer]).finish(|_| {});
    assert!(calm.status.success(), "calm run failed:\n{}", calm.stdout);
    let calm_summary = calm.summary();
    assert_eq!(calm_summary["phase"], "Succeeded");

    let chaos = Run::start(
        manifest,
        &[
            "--trainer",
            trainer,
            "--chaos",
            "preempt",
            "--every",
            "10s",
            "--kill",
        ],
    )
    .finish(|_| {});
    let (summary, preemptions) = chaos.survived_chaos(2);

    let perplexity = |s: &serde_json::Value| {
        assert_eq!(s["finalMetric"]["name"], "perplexity", "{s}");
        assert!(s.get("finalAccuracy").is_none_or(|a| a.is_null()), "{s}");
        s["finalMetric"]["mean"].as_f64().unwrap()
    };
    let (calm_perplexity, chaos_perplexity) = (perplexity(&calm_summary), perplexity(&summary));
    println!(
        "final perplexity: undisturbed {calm_perplexity:.3}, with {preemptions} members SIGKILLed {chaos_perplexity:.3}"
    );
    // Well below what byte frequencies alone give on this split (32.4): the model learnt.
    assert!(calm_perplexity < 12.0, "{calm_perplexity}");
    // Lower is better: chaos may not cost more than 5% (a run that ends better, as replacements
    // take the most advanced neighbour's state, costs nothing).
    assert!(
        chaos_perplexity <= 1.05 * calm_perplexity,
        "chaos cost more than 5%: {calm_perplexity} vs {chaos_perplexity}"
    );
}
