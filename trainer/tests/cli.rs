//! `murmur-trainer` as a user runs it.

use std::process::{Command, Output};

fn trainer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_murmur-trainer"))
        .args(args)
        .output()
        .expect("murmur-trainer runs")
}

/// Runs `murmur-trainer`, which must succeed (its stderr otherwise says why).
fn succeeds(args: &[&str]) -> Output {
    let out = trainer(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What `simulate --output DIR` wrote to `DIR/results.json`.
fn results_json(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap()
}

fn fails_with(args: &[&str], expected: &str) {
    let out = trainer(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(expected), "{args:?}: {err}");
}

/// The simulator's results, from processes whose kernel thread pools differ too, are
/// bit-identical: each curve point is compared as the exact numbers JSON carries.
#[test]
fn simulate_gives_the_same_results_on_one_thread_and_on_two() {
    let dir = tempfile::tempdir().unwrap();
    // GN-LeNet's evaluations dominate: fewer members and steps for it.
    let run = |model: &str, members: &str, steps: &str, threads: &str| {
        let out_dir = dir.path().join(format!("{model}-{threads}"));
        succeeds(&[
            "simulate",
            "--members",
            members,
            "--steps",
            steps,
            "--eval-every",
            steps,
            "--batch-size",
            "8",
            "--topology",
            "dcliques,ring",
            "--clique-size",
            "3",
            "--model",
            model,
            "--threads",
            threads,
            "--output",
            out_dir.to_str().unwrap(),
        ]);
        results_json(&out_dir)["curves"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["topology"].clone(),
                    r["bytes_sent"].clone(),
                    r["curve"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    for (model, members, steps) in [("mlp", "6", "4"), ("gn-lenet", "3", "2")] {
        let one = run(model, members, steps, "1");
        assert_eq!(one.len(), 2);
        assert_eq!(one, run(model, members, steps, "2"), "{model}");
    }
}

#[test]
fn simulate_writes_curves_results_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = succeeds(&[
        "simulate",
        "--members",
        "6",
        "--steps",
        "6",
        "--eval-every",
        "3",
        "--topology",
        "dcliques,ring",
        "--clique-size",
        "3",
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("dcliques") && stdout.contains("CliqueAveraging"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(out_dir.join("curves.csv")).unwrap();
    assert!(csv.starts_with("topology,algorithm,step,time,mean_accuracy"));
    assert_eq!(
        csv.lines().count(),
        1 + 2 * 3,
        "steps 0, 3 and 6 for two topologies"
    );
    let json = results_json(&out_dir);
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        for key in ["final_test_accuracy", "edges", "bytes_sent", "wall_seconds"] {
            assert!(r[key].is_number(), "results.{key}");
        }
    }
    let png = std::fs::read(out_dir.join("accuracy.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "accuracy.png is a PNG");

    // `plot` draws several results on one chart, under the labels given.
    let both = dir.path().join("both.png");
    let labelled = format!("first run={}", out_dir.join("results.json").display());
    let out = succeeds(&[
        "plot",
        "-o",
        both.to_str().unwrap(),
        &labelled,
        out_dir.join("results.json").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("both.png"));
    assert!(std::fs::read(&both).unwrap().starts_with(b"\x89PNG"));
    let bogus = dir.path().join("curves.csv");
    std::fs::copy(out_dir.join("curves.csv"), &bogus).unwrap();
    fails_with(
        &[
            "plot",
            "-o",
            both.to_str().unwrap(),
            bogus.to_str().unwrap(),
        ],
        "curves.csv: not a results.json the simulator wrote",
    );
}

#[test]
fn slow_members_report_virtual_time_to_the_target() {
    let out = succeeds(&[
        "simulate",
        "--members",
        "4",
        "--steps",
        "20",
        "--eval-every",
        "10",
        "--topology",
        "ring",
        "--algorithm",
        "dpsgd",
        "--slow",
        "2:3",
        "--target-accuracy",
        "0.05",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Rounds wait for member 2: the last point, step 20, is at time 60; 5% is reached at
    // once (step 0), by all and by the full-speed members.
    assert!(stdout.contains("    20     60.0"), "{stdout}");
    assert!(stdout.contains("0/0"), "{stdout}");
}

#[test]
fn bad_flags_and_data_exit_2_naming_the_cause() {
    fails_with(&["simulate", "--partition", "dirichlet:-1"], "--partition");
    fails_with(
        &["simulate", "--topology", "ring,hexagon"],
        "unknown topology \"hexagon\"",
    );
    fails_with(&["simulate", "--compression", "top-k:2"], "--compression");
    fails_with(&["simulate", "--learning-rate", "0"], "--learning-rate");
    fails_with(&["simulate", "--threads", "0"], "--threads");
    fails_with(
        &["simulate", "--slow", "3"],
        "--slow \"3\": use MEMBER:FACTOR",
    );
    fails_with(&["simulate", "--slow", "3:-2"], "--slow \"3:-2\"");
    fails_with(
        &["simulate", "--members", "4", "--slow", "4:2"],
        "slow member 4:2",
    );
    fails_with(
        &["simulate", "--target-accuracy", "85"],
        "--target-accuracy 85",
    );
    fails_with(&["simulate", "--max-staleness", "0"], "--max-staleness 0");
    fails_with(&["simulate", "--data", "parquet:/x"], "--data");
    fails_with(
        &["simulate", "--data", "idx:/nonexistent/mnist"],
        "/nonexistent/mnist: none of train-images-idx3-ubyte",
    );
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ] {
        std::fs::write(dir.path().join(name), b"not an idx file").unwrap();
    }
    let data = format!("idx:{}", dir.path().display());
    fails_with(
        &["simulate", "--data", &data],
        "train-images-idx3-ubyte: magic number",
    );
    if !cfg!(feature = "cuda") {
        fails_with(&["simulate", "--backend", "cuda"], "rebuild with");
    }
}
