//! Server-side apply and ownership against the real API server: an unchanged job costs no write
//! at all (counted in the API server's audit log), a user's label on a pod is left alone,
//! deleting the job garbage-collects everything it owns, and of two replicas one leads through the
//! Lease while the other takes over within the lease's duration when the leader dies. Plus the
//! pod endings kwok fakes driving the job as the mocked tests expect: a termination message
//! "done" completes a member, a non-zero exit counts a crash.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::NodeShape;
use super::helm::{self, NAMESPACE};
use super::scene::{MINUTE, Scene, member_of};

const OPERATOR: &str = "system:serviceaccount:murmur-system:murmur-operator";

/// The operator's writes (not its Lease's) in `namespace`, in the audit log so far. Only the
/// scene's namespace: a job an earlier scene left in a namespace still being deleted is one the
/// operator still reconciles (and tries to recreate pods of) until it is gone.
pub fn operator_writes(namespace: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(super::audit_log()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == OPERATOR)
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| e["objectRef"]["resource"] != "leases")
        .filter(|e| e["objectRef"]["resource"] != "selfsubjectaccessreviews")
        .collect()
}

fn describe(e: &Value) -> String {
    format!(
        "{} {}/{} {}",
        e["verb"].as_str().unwrap_or("?"),
        e["objectRef"]["resource"].as_str().unwrap_or("?"),
        e["objectRef"]["subresource"].as_str().unwrap_or(""),
        e["objectRef"]["name"].as_str().unwrap_or("?")
    )
}

pub async fn ownership(env: &Env) {
    let mut s = Scene::new(env, "ownership", &["--resync", "2s"]).await;
    s.add_nodes(&[
        NodeShape::spot("own-spot-a", "zone-a", "karpenter"),
        NodeShape::spot("own-spot-b", "zone-b", "karpenter"),
        NodeShape::spot("own-spot-c", "zone-a", "karpenter"),
    ])
    .await;
    s.job("dcliques-spot-cpu.yaml", "steady", json!({}));
    s.until_running("steady", 10).await;
    let pods = s.running("steady", 10).await;

    // A user's label: left alone.
    let pod = pods[&0].metadata.name.clone().unwrap();
    env.cp
        .kubectl_ok(&["label", "pod", &pod, "-n", &s.ns, "team=vision"]);

    // Settled: nothing more to write, resync after resync.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = operator_writes(&s.ns).len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let writes = operator_writes(&s.ns);
    let during: Vec<String> = writes[before..].iter().map(describe).collect();
    assert!(
        during.is_empty(),
        "an unchanged job cost {} writes in 12 s (6 resyncs): {during:#?}",
        during.len()
    );
    println!("  unchanged job, 12 s at --resync 2s: 0 writes in the API server's audit log");
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let labelled = api.get(&pod).await.unwrap();
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("vision"),
        "the operator fought the user's label"
    );

    // Deleting the job takes its pods, Service, Secret and ConfigMap with it (owner references).
    env.cp
        .kubectl_ok(&["delete", "dtj", "steady", "-n", &s.ns, "--wait=false"]);
    let deadline = Instant::now() + 2 * MINUTE;
    loop {
        let pods = s.pods("steady").await.len();
        let service = Api::<Service>::namespaced(s.client.clone(), &s.ns)
            .get_opt("steady-peers")
            .await
            .unwrap()
            .is_some();
        let secret = Api::<Secret>::namespaced(s.client.clone(), &s.ns)
            .get_opt("steady-peer-key")
            .await
            .unwrap()
            .is_some();
        let config_map = Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns)
            .get_opt("steady-topology")
            .await
            .unwrap()
            .is_some();
        if pods == 0 && !service && !secret && !config_map {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left after deleting the job: {pods} pods, service {service}, secret {secret}, configmap {config_map}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("  deleting the job garbage-collected its pods, Service, Secret and ConfigMap");

    endings(&s).await;
    leader_election(env).await;
    s.finish().await;
}

/// Pods ended the way kwok (or a kubelet) reports them.
async fn endings(s: &Scene<'_>) {
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let end = |pod: String, phase: &'static str, code: i32, message: Option<&'static str>| {
        let api = api.clone();
        async move {
            let patch = json!({"status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "trainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {
                        "exitCode": code,
                        "reason": if code == 0 { "Completed" } else { "Error" },
                        "message": message,
                        "startedAt": "2026-01-01T00:00:00Z",
                        "finishedAt": "2026-01-01T00:01:00Z",
                    }},
                }],
            }});
            api.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("patch status of {pod}: {e}"));
        }
    };
    // A crash: exit code 1, counted as a restart.
    s.job(
        "ring-cpu.yaml",
        "crash",
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    let pods = s.running("crash", 4).await;
    end(pods[&2].metadata.name.clone().unwrap(), "Failed", 1, None).await;
    s.until_status("crash", "a crash counted", MINUTE, |st| st["restarts"] == 1)
        .await;
    let status = s.status("crash").await;
    assert_eq!(status["preemptions"], 0, "a crash counted as a preemption");

    // Every member says "done": the job succeeds.
    let pods = s.running("crash", 4).await;
    for pod in pods.values() {
        end(
            pod.metadata.name.clone().unwrap(),
            "Succeeded",
            0,
            Some(r#"{"outcome":"done","step":300}"#),
        )
        .await;
    }
    s.until_status("crash", "succeeded", MINUTE, |st| {
        st["phase"] == "Succeeded"
    })
    .await;
    let status = s.status("crash").await;
    assert_eq!(
        (status["restarts"].as_u64(), status["preemptions"].as_u64()),
        (Some(1), Some(0))
    );
    println!(
        "  kwok pod endings: exit 1 counted one restart; termination message \"done\" completed the job"
    );
    assert!(pods.values().all(|p| member_of(p).is_some()));
}

/// Two replicas on one Lease: both Ready (a rolling update needs its new pod Ready), one leads.
/// - The leader stopped with SIGTERM releases the Lease: the other leads within seconds, not
///   after the lease's 15 s.
/// - A leader frozen (SIGSTOP) past its lease: the other takes over after the full duration as
///   its own clock measures it; thawed, the old leader never writes the Lease again and exits.
/// - A leader killed without releasing: the other leads within the lease's duration.
async fn leader_election(env: &Env) {
    const STANDBY: &str = "standby: another replica leads\n";
    let flags = ["--leader-election", "--lease-namespace", NAMESPACE];
    let replica = |name: &str| {
        helm::operator(
            env,
            &format!("lease-{name}.log"),
            &[&flags[..], &["--identity", name]].concat(),
        )
    };
    let readyz = |port: u16| async move {
        match reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    };
    let leads_within = |port: u16, within: Duration| async move {
        let started = Instant::now();
        while readyz(port).await.1 != "leading\n" {
            if started.elapsed() > within {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(started.elapsed().as_secs_f64())
    };
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.cp.client().await, NAMESPACE);
    let holder = || async {
        let lease = leases.get("murmur-operator").await.unwrap();
        let spec = lease.spec.unwrap_or_default();
        (spec.holder_identity, spec.lease_transitions)
    };

    let mut a = replica("replica-a");
    helm::ready(&mut a).await;
    let mut b = replica("replica-b");
    helm::until_readyz(&mut b, STANDBY).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        readyz(b.port).await,
        (200, STANDBY.into()),
        "a standby stays Ready and does not lead:\n{}",
        b.logs()
    );
    assert_eq!(readyz(a.port).await.1, "leading\n");

    // SIGTERM: released on the way out.
    let (code, log) = a.wait_after_term(Duration::from_secs(20));
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("lease released"), "{log}");
    let took = leads_within(b.port, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("replica-b never took the released lease:\n{}", b.logs()));
    println!("  leader stopped (SIGTERM): it released the lease, the other led {took:.1} s later");

    // SIGSTOP past the lease: the standby waits the full duration on its own clock, takes
    // over, and the thawed leader never writes the lease again.
    let mut c = replica("replica-c");
    helm::until_readyz(&mut c, STANDBY).await;
    let frozen = Instant::now();
    b.signal(nix::sys::signal::Signal::SIGSTOP);
    let took = leads_within(c.port, Duration::from_secs(40))
        .await
        .unwrap_or_else(|| panic!("replica-c never took over:\n{}", c.logs()));
    // The frozen leader's last renewal came up to one retry period (about 2 s) before the
    // freeze: the lease stood 15 s from then.
    assert!(
        frozen.elapsed() >= Duration::from_secs(12),
        "took over {took:.1} s after the freeze, before the lease's 15 s could have passed"
    );
    let (taken_by, transitions) = holder().await;
    assert_eq!(taken_by.as_deref(), Some("replica-c"));
    b.signal(nix::sys::signal::Signal::SIGCONT);
    let (code, log) = b.wait(Duration::from_secs(15));
    assert!(
        code.is_some_and(|c| c != 0),
        "the thawed leader did not exit: {code:?}\n{log}"
    );
    assert!(log.contains("lost the leader lease"), "{log}");
    assert_eq!(
        holder().await,
        (Some("replica-c".to_string()), transitions),
        "the thawed leader wrote the lease"
    );
    println!(
        "  leader frozen: the other led {took:.1} s after the freeze (lease 15 s); thawed, the old leader exited without writing"
    );

    // Killed: nothing released, the lease waited out.
    let mut d = replica("replica-d");
    helm::until_readyz(&mut d, STANDBY).await;
    let killed = Instant::now();
    c.kill();
    leads_within(d.port, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("replica-d never took over:\n{}", d.logs()));
    let took = killed.elapsed().as_secs_f64();
    assert!(
        took <= 15.0 + 5.0,
        "took over after {took:.1} s, lease 15 s"
    );
    println!("  leader killed: the other replica led {took:.1} s later (lease 15 s)");
}
