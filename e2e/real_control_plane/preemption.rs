//! Preemption as the cluster does it: evictions through the Eviction API (as many at once as the
//! job's PodDisruptionBudget allows, and no more), `kubectl drain` of a
//! spot node, a `NoExecute` taint as a cloud's node controller puts on a reclaimed node, and a
//! node deleted outright. Each must end as a preemption in the job's status (never a restart),
//! with a `Preempted` event naming the pod, a replacement, and the topology republished. Which of
//! them gave the pod a `DisruptionTarget` condition, and with which reason, is printed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::EvictParams;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::NodeShape;
use super::scene::{MINUTE, Scene, attempt_of, member_of, node_of};

const JOB: &str = "storm";

/// `DisruptionTarget` reasons seen on each pod, by name (a pod watch that outlives the pods).
type Disruptions = Arc<Mutex<BTreeMap<String, String>>>;

fn watch_disruptions(s: &Scene<'_>) -> Disruptions {
    let seen: Disruptions = Arc::default();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let out = seen.clone();
    tokio::spawn(async move {
        let mut pods = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(pod)) = pods.next().await {
            let reason = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))
                .and_then(|c| c.reason.clone());
            if let (Some(name), Some(reason)) = (pod.metadata.name.clone(), reason) {
                out.lock().insert(name, reason);
            }
        }
    });
    seen
}

/// The operator's status API view of the job (its preemption history carries reasons), read as
/// a user who may get it.
async fn view(s: &Scene<'_>) -> Value {
    let url = format!("{}/api/v1/namespaces/{}/jobs/{JOB}", s.endpoint(), s.ns);
    reqwest::Client::new()
        .get(url)
        .bearer_auth(s.observer_token())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// After `disrupt` took `lost` (pod names): each lost member counted as a preemption, no
/// restart, a Preempted event naming its pod, its replacement created (and joined), and the
/// topology republished.
async fn heals(s: &Scene<'_>, what: &str, lost: &[String], before: &Value, version: u64) {
    let preempted = before["preemptions"].as_u64().unwrap_or(0) + lost.len() as u64;
    s.until_status(
        JOB,
        &format!("{what}: {} preemptions", lost.len()),
        MINUTE,
        |st| st["preemptions"].as_u64() == Some(preempted),
    )
    .await;
    for pod in lost {
        s.event(
            JOB,
            &format!("{what}: a Preempted event naming {pod}"),
            |e| {
                e.reason.as_deref() == Some("Preempted")
                    && e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(pod.as_str())
            },
        )
        .await;
    }
    // The replacements come up on spot nodes and join; the topology moves on.
    let members: Vec<u32> = lost
        .iter()
        .map(|p| p.rsplit('-').nth(1).unwrap().parse().unwrap())
        .collect();
    let deadline = std::time::Instant::now() + MINUTE;
    loop {
        let pods = s.running(JOB, 10).await;
        let replaced = members.iter().all(|m| {
            pods.get(m)
                .is_some_and(|p| !lost.contains(p.metadata.name.as_ref().unwrap()))
        });
        if replaced {
            for m in &members {
                let node = node_of(&pods[m]).unwrap();
                assert!(
                    node.contains("spot"),
                    "{what}: replacement of {m} on {node}"
                );
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: not replaced");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let status = s.status(JOB).await;
    assert_eq!(
        status["restarts"], 0,
        "{what}: a preemption counted as a restart"
    );
    let republished = s.topology_version(JOB).await.unwrap();
    assert!(
        republished > version,
        "{what}: the topology was not republished"
    );
    // Each version is news of its own: an Event saying that version, not a count on the first.
    s.event(
        JOB,
        &format!("{what}: a TopologyChanged event saying version {republished}"),
        |e| {
            e.reason.as_deref() == Some("TopologyChanged")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("topology version {republished}:")))
        },
    )
    .await;
    s.join(JOB, members.iter().copied()).await;
    // The replacements are in the topology before the next disruption: one that takes a
    // replacement whose join is not yet planned leaves the topology as it was, and that step
    // would see no new version.
    let deadline = std::time::Instant::now() + MINUTE;
    while !s
        .topology_members(JOB)
        .await
        .is_some_and(|ids| members.iter().all(|m| ids.contains(m)))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the replacements' joins were not taken into the topology"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn pods_on(s: &Scene<'_>, node: &str) -> Vec<String> {
    s.pods(JOB)
        .await
        .into_iter()
        .filter(|p| node_of(p).as_deref() == Some(node) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect()
}

pub async fn preemption(env: &Env) {
    let mut s = Scene::new(env, "preemption", &["--node-lost-after", "10s"]).await;
    let mut shapes: Vec<NodeShape> = (0..6)
        .map(|i| {
            NodeShape::spot(
                &format!("storm-spot-{i}"),
                ["zone-a", "zone-b"][i % 2],
                "gke",
            )
        })
        .collect();
    shapes.push(NodeShape::on_demand("storm-plain", "zone-a"));
    s.add_nodes(&shapes).await;
    let disruptions = watch_disruptions(&s);
    s.job("dcliques-spot-cpu.yaml", JOB, json!({}));
    s.running(JOB, 10).await;
    s.join(JOB, 0..10).await;
    s.until_status(JOB, "topology built", MINUTE, |st| {
        st["topologyVersion"].as_u64() >= Some(1)
    })
    .await;

    // 1. The Eviction API, under the job's PodDisruptionBudget: evictions in a burst take
    // target − min members (10 − 6), and the rest are refused. First, once the job is still: ten members Ready, none going (zone-aware relocations done; a pod
    // already being deleted is evicted whatever the budget says), and the disruption controller
    // has counted them.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(s.client.clone(), &s.ns);
    let is_ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|st| st.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let deadline = std::time::Instant::now() + MINUTE;
    let mut still = 0;
    let mut last = Vec::new();
    let ready = loop {
        let pods = s.pods(JOB).await;
        let names: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let allowed = budgets
            .get_opt(&format!("{JOB}-members"))
            .await
            .unwrap()
            .and_then(|b| b.status)
            .and_then(|st| st.disruptions_allowed);
        let settled = pods.len() == 10 && names.len() == 10 && allowed == Some(4);
        still = if settled && names == last {
            still + 1
        } else {
            0
        };
        last = names;
        if still >= 2 {
            break last;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job never settled: {} pods, ready {last:?}, budget allows {allowed:?}",
            pods.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let before = s.status(JOB).await;
    let version = s.topology_version(JOB).await.unwrap();
    // The spot nodes cordoned for the burst: a replacement cannot become Ready and give the
    // budget room again before the last eviction is answered (the operator replaces a member
    // within milliseconds, and kwok starts it as fast).
    for i in 0..6 {
        env.cp.kubectl_ok(&["cordon", &format!("storm-spot-{i}")]);
    }
    // kube's client retries a 429 until the budget has room again: this one takes it as the
    // answer.
    let api: Api<Pod> = Api::namespaced(env.cp.client_without_retries().await, &s.ns);
    // All at once, as a drain of several nodes would.
    let answers = futures::future::join_all(ready.iter().take(6).map(|victim| {
        let api = api.clone();
        async move {
            (
                victim.clone(),
                api.evict(victim, &EvictParams::default()).await,
            )
        }
    }))
    .await;
    let mut evicted = Vec::new();
    let mut refused = Vec::new();
    for (victim, answer) in answers {
        match answer {
            Ok(_) => evicted.push(victim),
            Err(kube::Error::Api(e)) if e.code == 429 => refused.push(e.message),
            Err(e) => panic!("evicting {victim}: {e}"),
        }
    }
    assert_eq!(evicted.len(), 4, "evicted {evicted:?}, refused {refused:?}");
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused[0].contains("disruption budget"), "{refused:?}");
    println!(
        "  six evictions at once: 4 taken (target − min), 2 refused: {}",
        refused[0]
    );
    for i in 0..6 {
        env.cp.kubectl_ok(&["uncordon", &format!("storm-spot-{i}")]);
    }
    heals(&s, "eviction", &evicted, &before, version).await;

    // 2. kubectl drain of a spot node holding members.
    let before = s.status(JOB).await;
    let version = s.topology_version(JOB).await.unwrap();
    let node = node_of(&s.running(JOB, 10).await[&5]).unwrap();
    let lost = pods_on(&s, &node).await;
    env.cp.kubectl_ok(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=60s",
    ]);
    heals(&s, "drain", &lost, &before, version).await;

    // 3. A NoExecute taint, as a cloud's node controller marks a reclaimed node.
    let before = s.status(JOB).await;
    let version = s.topology_version(JOB).await.unwrap();
    let node = node_of(&s.running(JOB, 10).await[&7]).unwrap();
    let lost = pods_on(&s, &node).await;
    env.cp.kubectl_ok(&[
        "taint",
        "node",
        &node,
        "example.com/reclaimed=true:NoExecute",
    ]);
    heals(&s, "NoExecute taint", &lost, &before, version).await;

    // 4. The node deleted outright.
    let before = s.status(JOB).await;
    let version = s.topology_version(JOB).await.unwrap();
    let node = node_of(&s.running(JOB, 10).await[&1]).unwrap();
    let lost = pods_on(&s, &node).await;
    env.cp
        .kubectl_ok(&["delete", "node", &node, "--wait=false"]);
    heals(&s, "node deleted", &lost, &before, version).await;

    // What each way of losing a member looked like.
    let seen = disruptions.lock().clone();
    let history = view(&s).await["preemptionHistory"].clone();
    println!(
        "  preemptions as the operator recorded them (DisruptionTarget reason on the pod, if any):"
    );
    for p in history.as_array().unwrap() {
        let pod = format!("{JOB}-{}-{}", p["member"], p["attempt"]);
        println!(
            "    {pod}: {} [DisruptionTarget: {}]",
            p["reason"].as_str().unwrap(),
            seen.get(&pod).map_or("none seen", String::as_str)
        );
    }
    let status = s.status(JOB).await;
    assert_eq!(status["restarts"], 0);
    let pods = s.pods(JOB).await;
    assert!(
        pods.iter()
            .all(|p| attempt_of(p).is_some() && member_of(p).is_some())
    );
    s.finish().await;
}
