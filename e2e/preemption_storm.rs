//! End to end: a preemption storm. `murmur run` with twelve members in D-Cliques, one member
//! SIGKILLed every 5 s for two minutes — bridges between cliques included — must still succeed
//! within 2 points of the same job undisturbed, with every kill a preemption and none a crash;
//! and the same with outer steps, whose replacements take a neighbour's anchor.
//!
//! The job's length is sized to this machine: a short undisturbed run measures its step rate,
//! and both runs get the steps to outlast the storm by 30% undisturbed. A fixed count sized for the
//! slowest machine ran each job three times longer than its storm on the others.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use support::*;

/// The two storms take the cores one at a time: twenty-four trainers on two cores would test
/// the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Members with an edge into another clique, in a topology document.
fn bridges(doc: &serde_json::Value) -> BTreeSet<u64> {
    let clique: BTreeMap<u64, u64> = doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m["id"].as_u64()?, m["clique"].as_u64()?)))
        .collect();
    let mut out = BTreeSet::new();
    for e in doc["edges"].as_array().unwrap() {
        let (a, b) = (e["a"].as_u64().unwrap(), e["b"].as_u64().unwrap());
        if clique.get(&a) != clique.get(&b) {
            out.extend([a, b]);
        }
    }
    out
}

/// Every run of 64 hex digits (the shape of a job key) in `text`.
fn key_shaped(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut run = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
        } else {
            if run.len() >= 64 {
                found.push(run.clone());
            }
            run.clear();
        }
    }
    found
}

/// Nothing murmur printed or wrote — its output, events, summary, metrics, every trainer's log —
/// holds anything shaped like the job key.
fn assert_no_key_leaked(run: &Finished) {
    let key = murmur::runtime::new_job_key();
    assert_eq!(
        key_shaped(&format!("key={key}\n")),
        vec![key],
        "the search finds a key"
    );
    let mut texts = vec![("stdout".to_string(), run.stdout.clone())];
    let mut dirs = vec![run.dir.path().to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                texts.push((path.display().to_string(), text));
            }
        }
    }
    assert!(texts.len() > 5, "the run wrote its outputs");
    for (name, text) in texts {
        assert!(
            key_shaped(&text).is_empty(),
            "{name} holds a key-shaped string"
        );
    }
}

#[test]
fn a_two_minute_storm_of_kills_costs_at_most_two_points() {
    storm(
        "e2e/manifests/storm-dcliques-12.yaml",
        "/api/v1/namespaces/default/jobs/storm",
        2,
        400,
    );
}

/// A minute: the outer job is shorter in time (measured: 11 kills, 93.68% against 93.44% calm).
#[test]
fn a_one_minute_storm_of_kills_with_outer_steps_costs_at_most_two_points() {
    storm(
        "e2e/manifests/storm-dcliques-12-outer.yaml",
        "/api/v1/namespaces/default/jobs/storm-outer",
        1,
        800,
    );
}

/// `text` (a manifest with one `steps:` line) with `steps` steps, written in `dir`.
fn with_steps(text: &str, steps: u64, dir: &Path) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("steps: "))
        .collect();
    assert_eq!(lines.len(), 1, "one steps: line in the manifest: {lines:?}");
    let indent = &lines[0][..lines[0].len() - lines[0].trim_start().len()];
    let path = dir.join(format!("job-{steps}.yaml"));
    std::fs::write(
        &path,
        text.replace(lines[0], &format!("{indent}steps: {steps}")),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// This machine's steps per second for `manifest`'s job undisturbed: a run of `probe` steps,
/// timed from the first step the status API reports to the first report of the last step.
/// Start-up is left out, and so is the final evaluation and shutdown, during which the status
/// still reports the last step: timed to the last poll, the outer job's 800-step probe read
/// 37.5 steps/s for 49.3, and a storm sized from it ended before its kills did.
fn steps_per_second(manifest: &str, job: &str) -> f64 {
    let mut seen: Vec<(Instant, u64)> = Vec::new();
    let probe = Run::start(manifest, &[]).finish(|port| {
        if let Some((200, body)) = http_get(port, job) {
            let view: serde_json::Value = serde_json::from_str(&body).unwrap();
            if let Some(step) = view["status"]["progress"]["step"]
                .as_u64()
                .filter(|&s| s > 0)
            {
                seen.push((Instant::now(), step));
            }
        }
    });
    assert!(
        probe.status.success(),
        "probe run failed:\n{}",
        probe.stdout
    );
    let (Some(first), Some(top)) = (seen.first(), seen.iter().map(|s| s.1).max()) else {
        panic!("the probe reported no step:\n{}", probe.stdout);
    };
    let last = seen.iter().find(|s| s.1 == top).unwrap();
    assert!(
        last.1 > first.1 && last.0 > first.0,
        "the probe's steps did not move: {seen:?}"
    );
    (last.1 - first.1) as f64 / (last.0 - first.0).as_secs_f64()
}

/// A kill every 5 s for `minutes` on `manifest` (job `job` in the status API), its steps sized
/// by a `probe`-step run: the job succeeds within 2 points of the undisturbed run, every kill a
/// preemption, bridges killed too.
fn storm(manifest: &str, job: &str, minutes: u32, probe: u64) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let text = std::fs::read_to_string(workspace().join(manifest)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rate = steps_per_second(&with_steps(&text, probe, dir.path()), job);
    // 30% longer than the storm undisturbed; a storm slows a job rather than speeding it.
    let storm_seconds = f64::from(60 * minutes + 5);
    let steps = ((rate * 1.3 * storm_seconds / 100.0).ceil() as u64 * 100).max(1000);
    println!("{manifest}: {rate:.1} steps/s undisturbed, so {steps} steps");
    let sized = with_steps(&text, steps, dir.path());
    let calm = Run::start(&sized, &[]).finish(|_| {});
    assert!(calm.status.success(), "calm run failed:\n{}", calm.stdout);
    let calm_summary = calm.summary();

    let storm = Run::start(
        &sized,
        &[
            "--chaos",
            "preempt",
            "--every",
            "5s",
            "--kill",
            "--for",
            &format!("{minutes}m"),
        ],
    );
    let mut bridge_members = BTreeSet::new();
    let storm = storm.finish(|port| {
        if let Some((200, body)) = http_get(port, &format!("{job}/topology")) {
            let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
            bridge_members.extend(bridges(&doc));
        }
    });
    assert!(
        storm.status.success(),
        "storm run failed:\n{}",
        storm.stdout
    );
    let summary = storm.summary();
    assert_eq!(summary["phase"], "Succeeded");
    assert_eq!(summary["restarts"], 0, "a kill was counted as a crash");

    // A job that ends first cuts the storm short: say so plainly.
    let wall = summary["wallSeconds"].as_f64().unwrap();
    assert!(
        wall > storm_seconds,
        "the job ended after {wall} s at {steps} steps, before the storm did: the probe's rate was off"
    );
    let events = storm.events();
    let kills: Vec<&serde_json::Value> = events.iter().filter(|e| e["reason"] == "Chaos").collect();
    let killed: BTreeSet<u64> = kills
        .iter()
        .map(|e| e["member"].as_u64().unwrap())
        .collect();
    // One kill every 5 s (a tick is skipped while no member is training).
    assert!(
        kills.len() >= 10 * minutes as usize,
        "only {} kills:\n{}",
        kills.len(),
        storm.stdout
    );
    // Every preemption is one of our kills. If not, name the others (their reasons tell a
    // misclassified exit from a kill we did not make).
    let not_ours: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["reason"] == "Preempted")
        .filter(|e| {
            !e["message"]
                .as_str()
                .is_some_and(|m| m.ends_with("SIGKILL sent by murmur"))
        })
        .collect();
    assert_eq!(
        summary["preemptionsSurvived"].as_u64().unwrap(),
        kills.len() as u64,
        "preemptions that were not our kills: {not_ours:#?}\n{}",
        storm.stdout
    );
    assert!(!bridge_members.is_empty(), "the topology has bridges");
    let bridges_killed: Vec<&u64> = killed.intersection(&bridge_members).collect();
    assert!(
        !bridges_killed.is_empty(),
        "no bridge was killed: {killed:?} vs {bridge_members:?}"
    );

    // Payloads stamped with another topology version were refused, not averaged: each trainer
    // logs every neighbour it dropped from a round, with the reason.
    let mut dropped: BTreeMap<String, usize> = BTreeMap::new();
    for (_, lines) in storm.logs() {
        for l in lines {
            if l["fields"]["message"] == "neighbour dropped from the round" {
                let reason = l["fields"]["reason"].as_str().unwrap_or("?").to_string();
                *dropped.entry(reason).or_default() += 1;
            }
        }
    }
    println!("{manifest}: neighbours dropped from rounds, by reason: {dropped:?}");

    let calm_accuracy = calm_summary["finalAccuracy"].as_f64().unwrap();
    let accuracy = summary["finalAccuracy"].as_f64().unwrap();
    println!(
        "{manifest}: {} kills ({} members, bridges {bridges_killed:?}); accuracy undisturbed {:.2}%, storm {:.2}%; wall {} s vs {} s",
        kills.len(),
        killed.len(),
        100.0 * calm_accuracy,
        100.0 * accuracy,
        summary["wallSeconds"],
        calm_summary["wallSeconds"],
    );
    assert!(
        (calm_accuracy - accuracy).abs() <= 0.02,
        "the storm cost more than 2 points: {calm_accuracy} vs {accuracy}"
    );
    assert_no_key_leaked(&storm);
}
