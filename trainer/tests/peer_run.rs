//! Real trainer processes on loopback: training over TCP through a SIGKILL and a restart.

mod support;

use std::time::{Duration, Instant};

use murmur_core::api::TopologyKind;
use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: loopback}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, averageEvery: 1, roundTimeout: 2s}
  training:
    model: mlp
    dataset: {source: embedded}
    partition: {kind: iid}
    seed: 7
    batchSize: 32
    optimizer: {kind: sgd, momentum: 0.9}
    learningRate: 0.05
    steps: 600
";

const MEMBERS: u32 = 4;

/// [`MANIFEST`] for the joiner tests: long enough that the two members started first are still
/// training (and can answer) when the joiners ask beyond their neighbours. At 600 steps they
/// could finish in the two seconds or so the joiners take to start.
fn joining_manifest() -> String {
    MANIFEST.replace("steps: 600", "steps: 3000")
}

/// Mean final accuracy of a finished run, from each process's "done" log line.
fn final_accuracy(job: &LocalJob, attempts: &[(u32, u32)]) -> f64 {
    let accs: Vec<f64> = attempts
        .iter()
        .map(|&(id, attempt)| {
            let lines = job.log(id, attempt);
            logged(&lines, "done")
                .unwrap_or_else(|| panic!("member {id} (attempt {attempt}) never logged done"))
                ["accuracy"]
                .as_f64()
                .unwrap()
        })
        .collect();
    accs.iter().sum::<f64>() / accs.len() as f64
}

/// The first attempt of every member of `job`, started.
fn start_every_member(job: &LocalJob) -> Reaper {
    Reaper((0..MEMBERS).map(|id| job.spawn(id, 0, &[])).collect())
}

/// Start every member of `job`, and SIGKILL member 2 once member 0 is at step 100.
fn start_then_kill_member_2(job: &LocalJob) -> Reaper {
    let mut procs = start_every_member(job);
    wait_for(Duration::from_secs(120), "step 100", || {
        job.step(0).is_some_and(|s| s >= 100)
    });
    procs.0[2].kill().unwrap();
    procs.0[2].wait().unwrap();
    procs
}

#[test]
fn a_ring_trains_through_a_sigkill_and_a_restart() {
    // Undisturbed run.
    let calm = LocalJob::new(MEMBERS, TopologyKind::Ring, MANIFEST);
    let mut procs = start_every_member(&calm);
    procs.all_succeed(Duration::from_secs(240));
    let calm_accuracy = final_accuracy(&calm, &[(0, 0), (1, 0), (2, 0), (3, 0)]);
    println!("undisturbed: {calm_accuracy:.4}");
    assert!(
        calm_accuracy >= 0.85,
        "undisturbed accuracy {calm_accuracy}"
    );

    // Same seed; member 2 is SIGKILLed mid-run and restarted.
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, MANIFEST);
    let mut procs = start_then_kill_member_2(&job);
    let killed_at = Instant::now();
    let steps_then: Vec<u64> = [1, 3].iter().map(|&id| job.step(id).unwrap()).collect();
    // The survivors next to it keep training within one round timeout.
    wait_for(Duration::from_secs(2), "survivors to go on", || {
        [1, 3]
            .iter()
            .zip(&steps_then)
            .all(|(&id, &then)| job.step(id).is_some_and(|s| s > then + 1))
    });
    println!(
        "survivors stepped on {:?} after the kill",
        killed_at.elapsed()
    );

    // Replaced at once, as the control plane would: it must catch up mid-run.
    let replacement = job.spawn(2, 1, &[]);
    procs.0.push(replacement);
    procs.all_but_succeed(&[2], Duration::from_secs(240));
    let lines = job.log(2, 1);
    let transferred = logged(&lines, "state transferred from a neighbour")
        .expect("the replacement did not fetch state from a neighbour");
    let joined_at = transferred["step"].as_u64().unwrap();
    assert!(
        (100..500).contains(&joined_at),
        "joined at step {joined_at}"
    );
    let spawned = lines.first().expect("the replacement logged nothing")["timestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let first = lines
        .iter()
        .find(|l| l["fields"]["message"] == "first averaging round with peers")
        .expect("the replacement never averaged with a peer");
    println!(
        "replacement: first log line {spawned}, first averaging round {}",
        first["timestamp"]
    );
    let survivors: Vec<_> = [1, 3].iter().map(|&id| job.log(id, 0)).collect();
    assert!(
        survivors.iter().all(|l| l.iter().any(|line| {
            line["fields"]["message"] == "neighbour dropped from the round"
                && line["fields"]["reason"] == "disconnected"
        })),
        "the survivors never dropped the killed member"
    );
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 1), (3, 0)]);
    println!("with a SIGKILL and a restart: {accuracy:.4}");
    assert!(accuracy >= 0.85, "accuracy {accuracy}");
    assert!(
        (accuracy - calm_accuracy).abs() <= 0.01,
        "{accuracy} vs undisturbed {calm_accuracy}"
    );
}

/// A topology document of `members` joined by `edges`, with Metropolis weights, at `version`,
/// saying the job has come to `step`.
fn document(
    version: u64,
    step: u64,
    members: &[u32],
    edges: &[(u32, u32)],
    address: impl Fn(u32) -> String,
) -> String {
    let degree = |id: u32| edges.iter().filter(|&&(a, b)| a == id || b == id).count();
    let weight = |a: u32, b: u32| 1.0 / (1 + degree(a).max(degree(b))) as f64;
    serde_json::json!({
        "version": version,
        "kind": "ring",
        "step": step,
        "members": members.iter().map(|&id| serde_json::json!({
            "id": id,
            "address": address(id),
            "selfWeight": 1.0 - edges.iter()
                .filter(|&&(a, b)| a == id || b == id)
                .map(|&(a, b)| weight(a, b))
                .sum::<f64>(),
        })).collect::<Vec<_>>(),
        "edges": edges.iter().map(|&(a, b)| serde_json::json!({"a": a, "b": b, "weight": weight(a, b)}))
            .collect::<Vec<_>>(),
    })
    .to_string()
}

/// Members 0 and 1 of `job` training together, alone in topology version 1, until member 0 has
/// reached step 100: their processes, the topology file (for the next versions) and that step.
fn two_members_past_step_100(job: &LocalJob) -> (Reaper, std::path::PathBuf, u64) {
    let address = |id: u32| format!("127.0.0.1:{}", job.members[id as usize].peer_port);
    let topology = job.dir.path().join("topology.json");
    std::fs::write(&topology, document(1, 0, &[0, 1], &[(0, 1)], address)).unwrap();
    let mut procs = Reaper::default();
    for id in 0..2 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    wait_for(Duration::from_secs(120), "step 100", || {
        job.step(0).is_some_and(|s| s >= 100)
    });
    (procs, topology, job.step(0).unwrap())
}

#[test]
fn joiners_whose_neighbours_are_all_new_take_state_from_beyond_them() {
    // Two members train; then two join at once, linked only to each other, as a whole clique
    // replaced at once is: neither has a neighbour that trained.
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, &joining_manifest());
    let address = |id: u32| format!("127.0.0.1:{}", job.members[id as usize].peer_port);
    let (mut procs, topology, step) = two_members_past_step_100(&job);
    let all = [0, 1, 2, 3];
    std::fs::write(
        &topology,
        document(2, step, &all, &[(0, 1), (2, 3)], address),
    )
    .unwrap();
    for id in 2..4 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    procs.all_succeed(Duration::from_secs(240));
    // The first to find its neighbour untrained asks beyond it; the other may then take the
    // state from it.
    assert!(
        (2..4).any(|id| logged(
            &job.log(id, 0),
            "no neighbour has trained yet; asking members beyond them"
        )
        .is_some()),
        "neither joiner looked beyond its new neighbour"
    );
    for id in 2..4 {
        let lines = job.log(id, 0);
        let transferred = logged(&lines, "state transferred from a neighbour")
            .unwrap_or_else(|| panic!("member {id} started without the job's state"));
        assert!(
            transferred["step"].as_u64().unwrap() >= step,
            "member {id} took a state from before the job's step {step}: {transferred}"
        );
    }
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 0), (3, 0)]);
    println!("two members, then two more at once: {accuracy:.4}");
    assert!(accuracy >= 0.85, "accuracy {accuracy}");
}

#[test]
fn joiners_with_no_trained_member_within_reach_start_without_waiting_out_the_timeout() {
    // Two members join a job said to be at step 100, linked only to each other, and the members
    // beyond them are gone (its last members finished, or were preempted with these two's
    // predecessors). Once their dials to those fail, the two train from the start together
    // rather than wait out the startup timeout for answers that cannot come.
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, MANIFEST);
    let gone: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let address = |id: u32| match gone.get(id as usize) {
        Some(at) => at.clone(),
        None => format!("127.0.0.1:{}", job.members[id as usize].peer_port),
    };
    std::fs::write(
        job.dir.path().join("topology.json"),
        document(1, 100, &[0, 1, 2, 3], &[(0, 1), (2, 3)], address),
    )
    .unwrap();
    let mut procs = Reaper::default();
    for id in 2..4 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    procs.all_succeed(Duration::from_secs(240));
    for id in 2..4 {
        let lines = job.log(id, 0);
        assert!(
            logged(
                &lines,
                "not every neighbour showed up in time; starting without them"
            )
            .is_none(),
            "member {id} waited out its startup timeout; its log:\n{}",
            job.log_text(id, 0)
        );
        let done = logged(&lines, "done").expect("never logged done");
        assert_eq!(done["step"], 600, "member {id}: {done}");
    }
    // The first to find everyone beyond out of reach starts; the other may then take the
    // state of its first step from it.
    assert!(
        (2..4).any(|id| logged(
            &job.log(id, 0),
            "the job is under way, but no member within reach has trained"
        )
        .is_some()),
        "neither joiner found that no one within reach had trained; their logs:\n{}\n{}",
        job.log_text(2, 0),
        job.log_text(3, 0)
    );
}

#[test]
fn a_joiner_asks_again_a_neighbour_replaced_while_it_waits() {
    // Members 0 and 1 train. Member 2 joins with one neighbour, member 3, whose address in the
    // topology is that of a process gone (a preempted pod): nothing answers there. Member 3's
    // replacement then starts at a new address, which the next topology version gives. The
    // joiner must follow that version and ask the new process, not wait out its startup
    // timeout for an answer from the old one.
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, &joining_manifest());
    let address = |id: u32| format!("127.0.0.1:{}", job.members[id as usize].peer_port);
    let (mut procs, topology, step) = two_members_past_step_100(&job);
    let all = [0, 1, 2, 3];
    let edges = [(0, 1), (2, 3)];
    let gone = format!("127.0.0.1:{}", free_port());
    let with_3_at = |at: String| move |id: u32| if id == 3 { at.clone() } else { address(id) };
    std::fs::write(&topology, document(2, step, &all, &edges, with_3_at(gone))).unwrap();
    procs.0.push(job.spawn(2, 0, &[]));
    wait_for(
        Duration::from_secs(60),
        "member 2 follows the topology",
        || logged(&job.log(2, 0), "following topology").is_some(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let (peer, status) = (free_port(), free_port());
    std::fs::write(
        &topology,
        document(
            3,
            step,
            &all,
            &edges,
            with_3_at(format!("127.0.0.1:{peer}")),
        ),
    )
    .unwrap();
    procs.0.push(
        program_command(
            &job.trainer,
            &[],
            job.dir.path(),
            "loopback",
            3,
            format!("127.0.0.1:{peer}"),
            format!("127.0.0.1:{status}"),
            &job.log_path(3, 1),
        )
        .spawn()
        .unwrap(),
    );
    procs.all_succeed(Duration::from_secs(240));
    let lines = job.log(2, 0);
    assert!(
        logged(
            &lines,
            "not every neighbour showed up in time; starting without them"
        )
        .is_none(),
        "member 2 waited out its startup timeout; its log:\n{}\nmember 3's:\n{}",
        job.log_text(2, 0),
        job.log_text(3, 1),
    );
    let transferred = logged(&lines, "state transferred from a neighbour")
        .expect("member 2 started without the job's state");
    assert!(
        transferred["step"].as_u64().unwrap() >= step,
        "member 2 took a state from before the job's step {step}: {transferred}"
    );
}

#[test]
fn a_member_left_far_behind_catches_up_with_its_neighbours() {
    left_far_behind_catches_up(false);
}

/// With local steps between rounds, one catch-up brings it back: the rounds it is judged by
/// move with the step it took. Judged by the last round it had completed until its next one,
/// it found the neighbour it had just caught up with far ahead again after every local step,
/// and took another catch-up each time, waiting out a round timeout for the answer (in a
/// whole-job run, one clique went on so for 900 steps and ended at 74-79%).
#[test]
fn with_outer_steps_a_member_left_far_behind_catches_up_once() {
    left_far_behind_catches_up(true);
}

fn left_far_behind_catches_up(outer: bool) {
    // Member 2 is stopped (SIGSTOP: a member starved of CPU, or cut off without its connections
    // closing) for long enough that its neighbours go on dozens of rounds without it, each
    // round waiting a timeout for it. Once it runs again, its rounds and theirs no longer meet;
    // it must take the state of one that went on, or the ring would crawl a timeout a round.
    let mut manifest = MANIFEST
        .replace("roundTimeout: 2s", "roundTimeout: 500ms")
        .replace("steps: 600", "steps: 300");
    // Steps a round: the neighbours go on 40 rounds, past the 16 that make them far ahead.
    let n = if outer { 4 } else { 1 };
    if outer {
        manifest = manifest
            .replace("averageEvery: 1, ", "outer: {localSteps: 4}, ")
            .replace("steps: 300", "steps: 1200");
    }
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, &manifest);
    let mut procs = start_every_member(&job);
    wait_for(Duration::from_secs(120), "step 50", || {
        job.step(2).is_some_and(|s| s >= 50)
    });
    signal(&procs.0[2], "STOP");
    let stopped_at = job.step(1).unwrap();
    wait_for(
        Duration::from_secs(120),
        "the others to go on 40 rounds",
        || job.step(1).is_some_and(|s| s >= stopped_at + 40 * n),
    );
    signal(&procs.0[2], "CONT");
    let resumed = Instant::now();
    let ahead_at_resume = job.step(1).unwrap_or(stopped_at + 40 * n);
    procs.all_succeed(Duration::from_secs(120));
    let finished = resumed.elapsed();
    println!("the ring finished {finished:?} after member 2 resumed");
    // Crawling, the ~200 rounds left would take a round timeout (500 ms) each.
    assert!(
        finished < Duration::from_secs(60),
        "the ring crawled for {finished:?} after member 2 resumed"
    );
    // It takes the state of a neighbour far ahead. Under load it sometimes meets them again
    // without that (seen once in 20-odd runs: it logged no catch-up, and the ring finished as
    // fast); what matters is that the ring goes on at full speed with it, checked either way.
    let lines = job.log(2, 0);
    let back = match logged(&lines, "caught up with a neighbour far ahead") {
        Some(caught) => {
            assert!(caught["behind"].as_u64().unwrap() > 16 * n, "{caught}");
            caught["step"].as_u64().unwrap()
        }
        None => {
            println!("member 2 met its neighbours again without taking a state");
            ahead_at_resume + 16 * n
        }
    };
    let catch_ups = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "caught up with a neighbour far ahead")
        .count();
    println!("catch-ups: {catch_ups}");
    if outer {
        assert!(catch_ups <= 2, "{catch_ups} catch-ups");
    }
    // In step again: its neighbours stop timing out on it.
    let late: usize = [1, 3]
        .iter()
        .map(|&id| {
            job.log(id, 0)
                .iter()
                .map(|l| &l["fields"])
                .filter(|f| {
                    f["message"] == "neighbour dropped from the round"
                        && f["peer"] == 2
                        && f["round"].as_u64().is_some_and(|r| r > back / n + 2)
                })
                .count()
        })
        .sum();
    println!("rounds its neighbours dropped it in after it caught up: {late}");
    assert!(
        late <= 4,
        "{late} rounds without member 2 after it caught up at step {back}"
    );
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 0), (3, 0)]);
    println!("with a member stopped and caught up: {accuracy:.4}");
    assert!(accuracy >= 0.85, "accuracy {accuracy}");
}

/// With outer steps a replacement takes a neighbour's anchor and outer momentum with its
/// parameters, and goes on in step with the ring.
#[test]
fn with_outer_steps_a_replacement_takes_a_neighbours_anchor_and_outer_momentum() {
    let manifest = MANIFEST
        .replace(
            "averageEvery: 1, roundTimeout: 2s",
            "roundTimeout: 2s, outer: {localSteps: 10}",
        )
        .replace("steps: 600", "steps: 400");
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, &manifest);
    let mut procs = start_then_kill_member_2(&job);
    procs.0.push(job.spawn(2, 1, &[]));
    procs.all_but_succeed(&[2], Duration::from_secs(240));
    let lines = job.log(2, 1);
    let transferred = logged(&lines, "state transferred from a neighbour")
        .expect("the replacement did not fetch state from a neighbour");
    assert!(
        (100..400).contains(&transferred["step"].as_u64().unwrap()),
        "{transferred}"
    );
    // After ten or more outer steps the momentum is far from zero; a replacement that
    // restarted its anchor would hold none.
    assert!(
        transferred["outer_momentum_norm"].as_f64().unwrap() > 0.01,
        "{transferred}"
    );
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 1), (3, 0)]);
    println!("outer steps with a SIGKILL and a replacement: {accuracy:.4}");
    assert!(accuracy >= 0.85, "accuracy {accuracy}");
}

#[test]
fn members_starting_late_in_the_first_round_start_from_the_initial_model() {
    // Member 0 gives up waiting for its neighbours after a second and trains alone, on its own
    // third of the data. Member 1 starts while member 0 is still in its first round, and waits
    // for member 2, which starts a moment later. Member 0's state is the initial model fitted to
    // its own classes, not the job's: members 1 and 2 start from the initial model as member 0
    // did, rather than take that state if its reply came while they still waited.
    let manifest = MANIFEST
        .replace("{min: 2, target: 4, max: 4}", "{min: 1, target: 3, max: 3}")
        .replace(
            "averageEvery: 1, roundTimeout: 2s",
            "roundTimeout: 10s, outer: {localSteps: 250}",
        )
        .replace("steps: 600", "steps: 500");
    let job = LocalJob::new(3, TopologyKind::Ring, &manifest);
    let mut procs = Reaper::default();
    procs
        .0
        .push(job.spawn_with(0, 0, &["--startup-timeout", "1s"]));
    wait_for(Duration::from_secs(120), "member 0 at step 10", || {
        job.step(0).is_some_and(|s| s >= 10)
    });
    let early = job.step(0).unwrap();
    procs.0.push(job.spawn(1, 0, &[]));
    wait_for(Duration::from_secs(60), "member 1 to answer", || {
        job.status(1).is_some()
    });
    std::thread::sleep(Duration::from_millis(300));
    procs.0.push(job.spawn(2, 0, &[]));
    procs.all_succeed(Duration::from_secs(240));
    for id in [1, 2] {
        let transferred = logged(&job.log(id, 0), "state transferred from a neighbour").cloned();
        assert!(
            transferred.is_none(),
            "member {id} took a state trained alone (member 0 started at step {early}): {transferred:?}"
        );
    }
    // All three met at the first round's end, each at its step 250.
    for id in 0..3 {
        let first = logged(&job.log(id, 0), "first averaging round with peers")
            .unwrap_or_else(|| panic!("member {id} never averaged"))
            .clone();
        assert_eq!(first["step"], 249, "member {id}: {first}");
    }
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 0)]);
    println!("members 1 and 2 started while member 0 was past step {early}: {accuracy:.4}");
    assert!(accuracy >= 0.80, "accuracy {accuracy}");
}

/// The end of a job whose members are not all at the same step: two neighbours fall behind
/// (SIGSTOP, as replacements that joined late or a node starved of CPU do), and the others reach
/// the stopping target and leave. The two must end as soon as they hear it, short of the target,
/// with the models they hold: trained on together, each round's outer step would carry both
/// towards their four classes alone (in a whole-job run, two replacements 100 steps behind fell
/// from 93% to 72% that way).
#[test]
fn members_behind_when_a_neighbour_reaches_the_stopping_target_end_there_too() {
    const STEPS: u64 = 300;
    let manifest = MANIFEST
        .replace(
            "averageEvery: 1, roundTimeout: 2s",
            "roundTimeout: 500ms, outer: {localSteps: 10}, compression: {kind: int4}",
        )
        .replace(
            "partition: {kind: iid}",
            "partition: {kind: classesPerMember, k: 2}",
        )
        .replace("steps: 600", &format!("steps: {STEPS}"));
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, &manifest);
    let mut procs = start_every_member(&job);
    wait_for(Duration::from_secs(120), "step 150", || {
        job.step(1).is_some_and(|s| s >= 150)
    });
    // Members 1 and 2 are neighbours in the ring: behind together, they would hear each other.
    signal(&procs.0[1], "STOP");
    signal(&procs.0[2], "STOP");
    wait_for(
        Duration::from_secs(120),
        "members 0 and 3 to finish",
        || {
            [0, 3]
                .iter()
                .all(|&id| logged(&job.log(id, 0), "done").is_some() || job.step(id) == Some(STEPS))
        },
    );
    signal(&procs.0[1], "CONT");
    signal(&procs.0[2], "CONT");
    procs.all_succeed(Duration::from_secs(120));
    for id in 0..MEMBERS {
        let lines = job.log(id, 0);
        let done = logged(&lines, "done").unwrap();
        let step = done["step"].as_u64().unwrap();
        println!(
            "member {id}: ended at step {step} with {:.4}",
            done["accuracy"].as_f64().unwrap()
        );
        if id == 0 || id == 3 {
            assert_eq!(step, STEPS, "member {id}");
            continue;
        }
        let ended = logged(
            &lines,
            "a peer ended the job at its stopping target; ending here",
        )
        .unwrap_or_else(|| panic!("member {id} trained on:\n{}", job.log_text(id, 0)));
        assert_eq!(ended["ended"], STEPS, "{ended}");
        assert_eq!(ended["step"], step, "{ended}");
        assert!(step < STEPS, "member {id} ended at step {step}");
    }
}
