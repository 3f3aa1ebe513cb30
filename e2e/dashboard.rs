//! The dashboard in a real headless Chromium: while a job runs (with spot notices), the page
//! draws every member in the topology graph and a curve per member, and its screenshot is kept
//! (`target/e2e-artifacts/dashboard.png`, or `$MURMUR_ARTIFACTS_DIR`).
//!
//! Without Chromium the test says so and passes, unless `MURMUR_REQUIRE_CHROMIUM` is set (CI
//! sets it, after installing Debian's `chromium`).

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: dashboard, namespace: demo}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, roundTimeout: 2s}
  training:
    model: logisticRegression
    partition: {kind: iid}
    batchSize: 16
    # Never reached: the test ends the job with Ctrl-C (20 000 steps once finished first on a
    # busy CI machine, while Chromium took its screenshot).
    steps: 2000000
";

#[test]
fn the_dashboard_draws_the_graph_and_curves_of_a_running_job() {
    let Some(browser) = tools::chromium() else {
        tools::available(
            "the dashboard test",
            &[("chromium", "chromium")],
            "MURMUR_REQUIRE_CHROMIUM",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("dashboard.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let run = Run::start(
        manifest.to_str().unwrap(),
        &["--chaos", "preempt", "--every", "4s", "--eval-every", "10"],
    );
    // Wait until the job has a topology, curves and at least one spot notice behind it.
    let deadline = Instant::now() + Duration::from_secs(180);
    let port = loop {
        assert!(Instant::now() < deadline, "the job never got going");
        std::thread::sleep(Duration::from_millis(300));
        let Some(port) = run.port() else { continue };
        let Some((200, body)) = http_get(port, "/api/v1/namespaces/demo/jobs/dashboard") else {
            continue;
        };
        let view: serde_json::Value = serde_json::from_str(&body).unwrap();
        let accuracy_points = http_get(port, "/api/v1/namespaces/demo/jobs/dashboard/series")
            .map(|(_, b)| b.matches("\"accuracy\"").count())
            .unwrap_or(0);
        if view["status"]["preemptions"].as_u64() >= Some(1)
            && view["status"]["phase"] == "Running"
            && accuracy_points >= 8
        {
            break port;
        }
    };
    let url = format!("http://127.0.0.1:{port}/");
    let dom = tools::headless(browser, &["--dump-dom"], &url);
    let members = dom.matches("class=\"member\"").count();
    assert_eq!(members, 4, "four members in the graph:\n{dom}");
    let accuracy = &dom[dom.find("id=\"quality\"").unwrap()..];
    let accuracy = &accuracy[..accuracy.find("</svg>").unwrap()];
    assert!(
        accuracy.contains("class=\"curve\""),
        "an accuracy curve:\n{dom}"
    );
    assert!(dom.contains("class=\"edge\""), "edges in the graph");
    // Bytes and dollars to date beside the accuracy; local processes have no zone, so their
    // bytes are shown unpriced.
    let stats = &dom[dom.find("id=\"stats\"").unwrap()..];
    let stats = &stats[..stats.find("</div>").unwrap()];
    assert!(
        stats.contains(" sent · $0.00"),
        "bytes and dollars in the stats: {stats}"
    );
    let traffic = &dom[dom.find("id=\"traffic\"").unwrap()..];
    let traffic = &traffic[..traffic.find("</div>").unwrap()];
    assert!(
        traffic.contains("Model traffic: within zones 0.0 MB")
            && traffic.contains("(not priced)")
            && traffic.contains("per GB"),
        "the traffic by locality: {traffic}"
    );
    assert!(
        dom.contains("class=\"preemption\""),
        "the preemption timeline"
    );
    // Running, or Degraded while a preempted member is being replaced (chaos every 4 s: the
    // phase seen by the poll above can change before Chromium loads the page).
    assert!(
        dom.contains("Running") || dom.contains("Degraded"),
        "the job's phase:\n{dom}"
    );

    let artifacts = std::env::var_os("MURMUR_ARTIFACTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/e2e-artifacts"));
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    tools::headless(
        browser,
        &[&format!("--screenshot={}", shot.display())],
        &url,
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    eprintln!("dashboard screenshot: {}", shot.display());

    // Ctrl-C: members leave and checkpoint, murmur says it was interrupted.
    let finished = run.interrupt();
    assert_eq!(finished.status.code(), Some(130), "{}", finished.stdout);
}
