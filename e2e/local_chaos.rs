//! End to end: `murmur run` on the D-Cliques example, and on it with outer steps, undisturbed
//! and with members SIGKILLed every few seconds. The chaotic run must succeed, land within 1.5 points of the calm one, and
//! the status API must have shown every preemption while it ran. It also measures how fast the
//! job heals: kill → the survivors' first round without the member, and a replacement's spawn →
//! its first averaging round (printed; run with `--nocapture` to read them).

mod support;

use std::collections::BTreeSet;

use support::*;

#[test]
fn a_job_under_preemption_chaos_succeeds_close_to_an_undisturbed_run() {
    // Every 4 s: the example trains in about 25 s here, and the test needs at least three kills.
    chaos_lands_close_to_calm(
        "manifests/examples/dcliques-spot-cpu.yaml",
        "/api/v1/namespaces/default/jobs/mnist-dcliques",
        Some("4s"),
        0.015,
    );
}

/// With outer steps a replacement takes its neighbour's anchor and outer momentum, mid-round.
/// Outer steps lose more to kills than per-step training, and vary more: against about 92.3%
/// calm, 91.27% (4 kills), 88.92% and 82.85% (5), 92.42% and 91.03% (6). A member lost late
/// is not replaced (the job is finishing), and its clique trains on without its two classes
/// for eight local steps a round. Within 10 points is what holds today; closing the gap to
/// per-step's 1.5 is open (issue 33).
#[test]
fn with_outer_steps_a_job_under_preemption_chaos_succeeds_close_to_an_undisturbed_run() {
    // A fifth of the calm run apart: the example takes about 3 s here, and a kill a second
    // left some runs 2 kills where 3 are asked for.
    chaos_lands_close_to_calm(
        "manifests/examples/dcliques-outer-cpu.yaml",
        "/api/v1/namespaces/default/jobs/mnist-dcliques-outer",
        None,
        0.10,
    );
}

/// Each run takes both cores, and the kills come by the wall clock: two at once would each
/// run slower and take more kills than they were sized for.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The chaotic run of `example` (a kill `every`, or a fifth of the calm run apart) succeeds,
/// shows every kill in the status API and heals from each, and ends within `points` of the calm
/// run's accuracy.
fn chaos_lands_close_to_calm(example: &str, job: &str, every: Option<&str>, points: f64) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let calm = Run::start(example, &[]);
    let calm = calm.finish(|_| {});
    assert!(calm.status.success(), "calm run failed:\n{}", calm.stdout);
    let calm_summary = calm.summary();
    assert_eq!(calm_summary["phase"], "Succeeded");
    assert_eq!(calm_summary["preemptionsSurvived"], 0);
    // Without `every`: a fifth of the calm run's wall time, so that about four kills land
    // however fast this machine runs the example.
    let every = every.map_or_else(
        || {
            let wall = calm_summary["wallSeconds"].as_f64().unwrap();
            format!("{}ms", (wall * 1000.0 / 5.0).max(200.0) as u64)
        },
        str::to_string,
    );

    // While the chaotic run goes, read the job the way a user would, every 200 ms.
    let chaos = Run::start(
        example,
        &["--chaos", "preempt", "--every", &every, "--kill"],
    );
    let mut seen = BTreeSet::new();
    let chaos = chaos.finish(|url| {
        if let Some((200, body)) = http_get(url, job) {
            let view: serde_json::Value = serde_json::from_str(&body).unwrap();
            for p in view["preemptionHistory"].as_array().unwrap() {
                seen.insert((
                    p["member"].as_u64().unwrap(),
                    p["attempt"].as_u64().unwrap(),
                ));
            }
        }
    });
    let (summary, preemptions) = chaos.survived_chaos(3);

    let events = chaos.events();
    let at = |e: &serde_json::Value| e["atSeconds"].as_f64().unwrap();
    let kill_times: Vec<((u64, u64), f64)> = events
        .iter()
        .filter(|e| e["reason"] == "Chaos")
        .map(|e| ((e["member"].as_u64().unwrap(), attempt_of(e)), at(e)))
        .collect();
    let kills: BTreeSet<(u64, u64)> = kill_times.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kills.len() as u64,
        preemptions,
        "every preemption was a chaos kill"
    );
    // A kill in the job's last moments may come after the last read (every 200 ms, and the
    // status API goes with the run); one a second before the end must have been shown.
    let ended = events
        .iter()
        .find(|e| e["reason"] == "Succeeded")
        .map(at)
        .expect("a Succeeded event");
    let shown_in_time: BTreeSet<(u64, u64)> = kill_times
        .iter()
        .filter(|(_, t)| *t <= ended - 1.0)
        .map(|(k, _)| *k)
        .collect();
    assert!(
        seen.is_subset(&kills) && shown_in_time.is_subset(&seen),
        "the status API showed every preemption while the job ran: saw {seen:?}, kills {kill_times:?}, ended at {ended} s"
    );

    let calm_accuracy = calm_summary["finalAccuracy"].as_f64().unwrap();
    let accuracy = summary["finalAccuracy"].as_f64().unwrap();
    println!(
        "final accuracy: undisturbed {:.2}%, with {preemptions} members SIGKILLed {:.2}%",
        100.0 * calm_accuracy,
        100.0 * accuracy
    );
    assert!(
        calm_accuracy >= 0.85,
        "the example must reach 85%: {calm_accuracy}"
    );
    assert!(
        (calm_accuracy - accuracy).abs() <= points,
        "chaos cost more than {} points: {calm_accuracy} vs {accuracy}",
        100.0 * points
    );

    // How fast the job healed, from the events and the trainers' own logs.
    let kills = chaos.healing();
    let healing = &kills.healed;
    assert!(!healing.is_empty());
    // A kill as the job finished (no replacement) or whose replacement was retired at the end
    // has nothing to heal, and one whose replacement was killed again before it averaged is
    // measured by the later kill; every other one must have healed.
    assert_eq!(
        healing.len() + kills.nothing_to_heal + kills.killed_again,
        preemptions as usize,
        "{} kills healed, {} with nothing to heal, {} killed again, {preemptions} kills",
        healing.len(),
        kills.nothing_to_heal,
        kills.killed_again
    );
    for h in healing {
        println!(
            "member {}: SIGKILL -> survivors' first round without it {:.3} s; replacement spawn -> first averaging round {:.3} s",
            h.member, h.dropped_after, h.averaged_after
        );
    }
    let worst_drop = healing.iter().map(|h| h.dropped_after).fold(0.0, f64::max);
    let worst_join = healing.iter().map(|h| h.averaged_after).fold(0.0, f64::max);
    println!(
        "worst: {worst_drop:.3} s to drop a killed member, {worst_join:.3} s from spawn to averaging"
    );
}
