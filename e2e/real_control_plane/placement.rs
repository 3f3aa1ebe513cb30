//! Spot placement as the real scheduler does it, on kwok nodes labelled and tainted as each
//! cloud labels its spot capacity: `spot` lands only on spot nodes (each cloud's label on its
//! own, taints tolerated), `preferSpot` fills them first and still runs when they are full,
//! `onDemand` needs no toleration, and `fallbackToOnDemandAfter` moves a member that stays
//! Pending to an on-demand node.

use std::time::Duration;

use serde_json::json;

use super::super::Env;
use super::super::support::control_plane::NodeShape;
use super::scene::{MINUTE, Scene, attempt_of, node_of};

/// A job of `members` one-CPU members (two fit a node) with `scheduling`.
fn small(members: u32, scheduling: serde_json::Value) -> serde_json::Value {
    json!({"spec": {
        "replicas": {"min": 1, "target": members, "max": members},
        "scheduling": scheduling,
    }})
}

async fn gone(s: &Scene<'_>, job: &str) {
    s.env
        .cp
        .kubectl_ok(&["delete", "dtj", job, "-n", &s.ns, "--wait=true"]);
    let deadline = std::time::Instant::now() + MINUTE;
    while !s.pods(job).await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "pods of {job} linger");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub async fn placement(env: &Env) {
    let mut s = Scene::new(env, "placement", &[]).await;

    for cloud in ["gke", "eks", "karpenter", "aks"] {
        let spot = format!("{cloud}-spot");
        s.add_nodes(&[
            NodeShape::spot(&spot, "zone-a", cloud),
            NodeShape::on_demand("plain-a", "zone-a"),
        ])
        .await;
        let job = format!("spot-{cloud}");
        s.job("ring-cpu.yaml", &job, small(2, json!({"capacity": "spot"})));
        let pods = s.running(&job, 2).await;
        for pod in pods.values() {
            assert_eq!(
                node_of(pod).as_deref(),
                Some(spot.as_str()),
                "{cloud}: a spot member off spot"
            );
        }
        gone(&s, &job).await;
        s.remove_nodes().await;
    }
    println!(
        "  spot: each cloud's label alone places members on its spot node (GKE and AKS taints tolerated)"
    );

    // preferSpot: the spot node takes two, the rest go on-demand.
    s.add_nodes(&[
        NodeShape::spot("prefer-spot", "zone-a", "gke"),
        NodeShape::on_demand("prefer-plain-a", "zone-a"),
        NodeShape::on_demand("prefer-plain-b", "zone-b"),
    ])
    .await;
    s.job(
        "ring-cpu.yaml",
        "prefer",
        small(4, json!({"capacity": "preferSpot"})),
    );
    let pods = s.running("prefer", 4).await;
    let on_spot = pods
        .values()
        .filter(|p| node_of(p).as_deref() == Some("prefer-spot"))
        .count();
    assert_eq!(on_spot, 2, "preferSpot fills the spot node first");
    gone(&s, "prefer").await;

    // onDemand: no toleration, never on the tainted spot node.
    s.job(
        "ring-cpu.yaml",
        "plain",
        small(2, json!({"capacity": "onDemand"})),
    );
    let pods = s.running("plain", 2).await;
    for pod in pods.values() {
        assert_ne!(node_of(pod).as_deref(), Some("prefer-spot"));
        let tolerations = pod
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .clone()
            .unwrap_or_default();
        assert!(
            !tolerations
                .iter()
                .any(|t| t.key.as_deref().is_some_and(|k| k.contains("spot"))),
            "an onDemand member tolerates spot taints: {tolerations:?}"
        );
    }
    gone(&s, "plain").await;
    s.remove_nodes().await;

    // No spot node at all: after fallbackToOnDemandAfter the member runs on-demand.
    s.add_nodes(&[NodeShape::on_demand("fallback-plain", "zone-a")])
        .await;
    let began = std::time::Instant::now();
    s.job(
        "ring-cpu.yaml",
        "fallback",
        small(
            1,
            json!({"capacity": "spot", "fallbackToOnDemandAfter": "5s"}),
        ),
    );
    let pods = s.running("fallback", 1).await;
    let pod = pods.values().next().unwrap();
    assert_eq!(attempt_of(pod), Some(1), "the spot attempt was replaced");
    assert_eq!(node_of(pod).as_deref(), Some("fallback-plain"));
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()["murmur.dev/capacity"],
        "on-demand"
    );
    s.event("fallback", "a FellBackToOnDemand event", |e| {
        e.reason.as_deref() == Some("FellBackToOnDemand")
    })
    .await;
    println!(
        "  fallbackToOnDemandAfter 5s: running on-demand {:.1} s after the job was applied",
        began.elapsed().as_secs_f64()
    );
    gone(&s, "fallback").await;
    s.finish().await;
}
