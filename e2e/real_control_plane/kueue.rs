//! Kueue for real: its controller and webhooks (`e2e/controlplane/kueue.sh`, built from its Go
//! module) admit a job labelled with a queue as one gang, and evict the whole gang for a workload
//! of higher priority. The job waits in the queue with a `Queued` condition while no member is
//! counted as pending for a node; an eviction is a preemption of every member (never a restart),
//! and the replacements wait for the gang to be admitted again. A member lost while the gang is
//! admitted is replaced inside the group, without a new admission.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::{NodeShape, eventually};
use super::scene::{MINUTE, Scene, attempt_of, condition_of, has_condition, node_of, tail};

const JOB: &str = "gang";
const GATE: &str = "kueue.x-k8s.io/admission";

fn queues(ns: &str, cpus: u32) -> String {
    format!(
        r#"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: default-flavor}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: training}}
spec:
  namespaceSelector: {{}}
  preemption: {{withinClusterQueue: LowerPriority}}
  resourceGroups:
  - coveredResources: ["cpu", "memory"]
    flavors:
    - name: default-flavor
      resources:
      - {{name: cpu, nominalQuota: "{cpus}"}}
      - {{name: memory, nominalQuota: 64Gi}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{name: team, namespace: {ns}}}
spec: {{clusterQueue: training}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {{name: urgent}}
value: 1000
"#
    )
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .into_iter()
        .flatten()
        .map(|g| g.name.clone())
        .collect()
}

/// The job's Workload, as Kueue keeps it (named after the pod group).
fn workload(s: &Scene<'_>) -> Option<Value> {
    let out = s
        .env
        .cp
        .kubectl_ok(&["get", "workloads", "-n", &s.ns, "-o", "json"]);
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()?
        .iter()
        .find(|w| {
            w["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{JOB}-")))
        })
        .cloned()
}

fn admitted(w: &Value) -> bool {
    has_condition(&w["status"], "Admitted", "True")
}

/// Until the job's live pods (not being deleted) of attempt `attempt` are `n`, each held by
/// Kueue's gate, on no node.
async fn until_gated(s: &Scene<'_>, attempt: u32, n: usize) -> Vec<Pod> {
    let deadline = std::time::Instant::now() + MINUTE;
    loop {
        let pods: Vec<Pod> = s
            .pods(JOB)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && attempt_of(p) == Some(attempt))
            .collect();
        let held = pods
            .iter()
            .filter(|p| gates(p).iter().any(|g| g == GATE) && node_of(p).is_none())
            .count();
        if pods.len() == n && held == n {
            return pods;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{held} of {} pods of attempt {attempt} held by {GATE}, {n} expected\noperator log:\n{}",
            pods.len(),
            tail(&s.operator.logs())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub async fn kueue(env: &Env) {
    env.cp.start_kueue();
    let mut s = Scene::new(env, "kueue", &[]).await;
    s.add_nodes(&[NodeShape {
        cpu: "8".into(),
        memory: "32Gi".into(),
        ..NodeShape::on_demand("kueue-node", "zone-a")
    }])
    .await;
    // 1. A queue with room for two CPUs: the gang of three one-CPU members waits, all of it.
    env.cp.apply(&queues(&s.ns, 2));
    s.job(
        "ring-cpu.yaml",
        JOB,
        json!({
            "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team"}},
            "spec": {"replicas": {"min": 2, "target": 3, "max": 3}},
        }),
    );
    let pods = until_gated(&s, 0, 3).await;
    for p in &pods {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["kueue.x-k8s.io/queue-name"], "team");
        assert!(labels["kueue.x-k8s.io/pod-group-name"].starts_with("gang-"));
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()["kueue.x-k8s.io/pod-group-total-count"],
            "3"
        );
    }
    s.until_status(JOB, "the job queued", MINUTE, |st| {
        has_condition(st, "Queued", "True")
            && condition_of(st, "Queued")["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("3 members wait for admission"))
    })
    .await;
    // Kueue makes the Workload on its own time, after the pods it gates exist.
    let w = eventually("Kueue makes the pod group's Workload", MINUTE, || async {
        workload(&s)
    })
    .await;
    assert!(!admitted(&w), "admitted beyond the quota: {w:#}");
    assert_eq!(w["spec"]["podSets"][0]["count"], 3, "{w:#}");
    println!(
        "  quota 2 CPUs: 3 pods held by {GATE}, Workload {} not admitted",
        w["metadata"]["name"]
    );

    // 2. Room for four: the gang is admitted at once, and trains.
    env.cp.apply(&queues(&s.ns, 4));
    s.running(JOB, 3).await;
    s.join(JOB, 0..3).await;
    s.until_status(JOB, "running, admitted", MINUTE, |st| {
        st["phase"] == "Running" && has_condition(st, "Queued", "False")
    })
    .await;
    assert!(admitted(&workload(&s).unwrap()));
    let version = s.topology_version(JOB).await.unwrap();
    println!("  quota 4 CPUs: admitted as one gang, running, topology version {version}");

    // 3. A workload of higher priority that needs two CPUs: Kueue evicts the whole gang.
    env.cp.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: urgent
  namespace: {}
  labels: {{kueue.x-k8s.io/queue-name: team, kueue.x-k8s.io/priority-class: urgent}}
spec:
  containers: [{{name: work, image: registry.example/urgent:1, resources: {{requests: {{cpu: "2"}}}}}}]
"#,
        s.ns
    ));
    s.until_status(JOB, "three preemptions", MINUTE, |st| {
        st["preemptions"].as_u64() == Some(3)
    })
    .await;
    let evicted = s
        .event(JOB, "a Preempted event in Kueue's words", |e| {
            e.reason.as_deref() == Some("Preempted")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("Preempted to accommodate a workload"))
        })
        .await;
    println!("  evicted: {}", evicted.note.unwrap_or_default());
    // The replacements wait for the gang's admission again; nothing counts as a failure.
    until_gated(&s, 1, 3).await;
    s.until_status(JOB, "queued again", MINUTE, |st| {
        has_condition(st, "Queued", "True")
    })
    .await;
    let status = s.status(JOB).await;
    assert_eq!(status["restarts"], 0, "{status:#}");
    assert_ne!(status["phase"], "Failed", "{status:#}");
    println!("  the urgent pod runs; 3 replacements held by {GATE}, 0 restarts");

    // 4. The urgent work done: the gang is admitted again and carries on.
    env.cp
        .kubectl_ok(&["delete", "pod", "urgent", "-n", &s.ns, "--wait=false"]);
    let pods = s.running(JOB, 3).await;
    assert!(pods.values().all(|p| attempt_of(p) == Some(1)), "{pods:?}");
    s.join(JOB, 0..3).await;
    s.until_status(JOB, "running again", MINUTE, |st| {
        st["phase"] == "Running"
            && st["topologyVersion"].as_u64() > Some(version)
            && has_condition(st, "Queued", "False")
    })
    .await;
    let status = s.status(JOB).await;
    assert_eq!(status["restarts"], 0);
    assert_eq!(status["preemptions"], 3);
    println!("  re-admitted: 3 members of attempt 1 running, 3 preemptions, 0 restarts");

    // 5. One member lost as on a spot node: its replacement joins the admitted group and runs
    // without waiting for a new admission.
    let lost = s.running(JOB, 3).await[&1].metadata.name.clone().unwrap();
    env.cp
        .kubectl_ok(&["delete", "pod", &lost, "-n", &s.ns, "--wait=false"]);
    let deadline = std::time::Instant::now() + MINUTE;
    loop {
        let pods = s.running(JOB, 3).await;
        if pods.get(&1).and_then(attempt_of) == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "member 1 not replaced"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let w = workload(&s).unwrap();
    assert!(admitted(&w), "the group lost its admission: {w:#}");
    let status = s.status(JOB).await;
    assert_eq!(status["preemptions"], 4, "{status:#}");
    assert_eq!(status["restarts"], 0);
    assert!(has_condition(&status, "Queued", "False"), "{status:#}");
    println!("  a lost member replaced inside the admitted group, without a new admission");
    s.finish().await;
}
