//! The control plane itself going down mid-job: etcd and kube-apiserver killed (SIGKILL) and
//! started again on the same data, right after a member's pod was deleted. The operator rides
//! it out (its watches reconnect, its writes are retried by the next reconcile), counts that
//! preemption once, replaces the member once, and no status it writes goes backwards.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

use super::super::Env;
use super::super::support::control_plane::NodeShape;
use super::scene::{MINUTE, Scene, member_of};

const JOB: &str = "outlast";

pub async fn control_plane_restart(env: &Env) {
    let mut s = Scene::new(env, "restart", &["--resync", "2s"]).await;
    s.add_nodes(&[
        NodeShape::spot("restart-spot-a", "zone-a", "karpenter"),
        NodeShape::spot("restart-spot-b", "zone-b", "karpenter"),
    ])
    .await;
    s.job(
        "ring-cpu.yaml",
        JOB,
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    s.until_running(JOB, 4).await;
    let before = s.status(JOB).await;
    let version = before["topologyVersion"].as_u64().unwrap();

    // A member's pod deleted, and at once the control plane dies: whether or not the operator
    // saw the deletion before, it must count it once when the cluster is back.
    let pods = s.running(JOB, 4).await;
    let victim = pods[&2].metadata.name.clone().unwrap();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    api.delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let killed = Instant::now();
    let said = env
        .cp
        .restart(&["etcd", "kube-apiserver"], Duration::from_secs(10));
    println!("  {}", said.trim().replace('\n', "; "));
    assert!(
        s.operator.running(),
        "the operator died with the API server"
    );

    // Back: the member replaced once, the preemption counted once, nothing went backwards.
    let status = s
        .until_status(
            JOB,
            "the preemption counted after the restart",
            2 * MINUTE,
            |st| {
                st["preemptions"].as_u64() == Some(before["preemptions"].as_u64().unwrap_or(0) + 1)
            },
        )
        .await;
    println!(
        "  preemption counted {:.1} s after the kill (10 s down)",
        killed.elapsed().as_secs_f64()
    );
    s.until_running(JOB, 4).await;
    let mut live: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for p in s.pods(JOB).await {
        if p.metadata.deletion_timestamp.is_none()
            && let Some(m) = member_of(&p)
        {
            live.entry(m)
                .or_default()
                .push(p.metadata.name.clone().unwrap());
        }
    }
    assert!(
        live.values().all(|pods| pods.len() == 1) && live.len() == 4,
        "one pod per member: {live:?}"
    );
    assert_ne!(live[&2][0], victim, "member 2 was replaced");
    let after = s.status(JOB).await;
    assert!(
        after["topologyVersion"].as_u64().unwrap() > version,
        "the topology went on from v{version}: {after:#}"
    );
    assert_eq!(after["restarts"], 0, "the outage cost no restart");
    assert!(
        after["preemptions"].as_u64() >= status["preemptions"].as_u64(),
        "preemptions went back"
    );
    println!(
        "  after the restart: 4 members, one pod each, 1 preemption, topology v{version} -> v{}",
        after["topologyVersion"]
    );
    s.finish().await;
}
