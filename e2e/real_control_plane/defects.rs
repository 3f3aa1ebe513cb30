//! Defects found by reading the operator against the API server's rules, each shown here on the
//! real API server (each of these failed before its fix).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::{NodeShape, stdout_of};
use super::crd::{example, merge};
use super::scene::{MINUTE, Scene, attempt_of, condition_of, has_condition, member_of, tail};

async fn nodes(s: &mut Scene<'_>, prefix: &str) {
    let shapes: Vec<NodeShape> = (0..4)
        .map(|i| NodeShape::spot(&format!("{prefix}-{i}"), ["zone-a", "zone-b"][i % 2], "eks"))
        .collect();
    s.add_nodes(&shapes).await;
}

/// Numbers and durations beyond what the operator decodes are refused at the door, by the API
/// server and by `murmur validate` alike.
pub async fn bounded_numbers(env: &Env) {
    let cases = [
        (
            "spec.algorithm.averageEvery",
            json!({"spec": {"algorithm": {"averageEvery": 5_000_000_000u64}}}),
        ),
        (
            "spec.algorithm.roundTimeout",
            json!({"spec": {"algorithm": {"roundTimeout": "99999999999h"}}}),
        ),
        (
            "spec.training.epochs",
            json!({"spec": {"training": {"steps": null, "epochs": 5_000_000_000u64}}}),
        ),
        (
            "spec.recovery.maxRestarts",
            json!({"spec": {"recovery": {"maxRestarts": 3_000_000_000u64}}}),
        ),
        (
            "weight",
            json!({"spec": {"scheduling": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5_000_000_000u64, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}}]}}}}}),
        ),
        (
            "spec.trainer.resources.cpu",
            json!({"spec": {"trainer": {"resources": {"cpu": "lots"}}}}),
        ),
    ];
    let dir = env.dir.path().join("bounds");
    std::fs::create_dir_all(&dir).unwrap();
    for (field, patch) in cases {
        let mut job = example("dcliques-spot-cpu.yaml");
        merge(&mut job, &patch);
        let file = dir.join(format!("{}.json", field.replace('.', "-")));
        std::fs::write(&file, job.to_string()).unwrap();
        let server = env.cp.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            "default",
            "-f",
            file.to_str().unwrap(),
        ]);
        assert!(
            !server.status.success(),
            "the API server stored {field} = {patch} (the operator cannot decode it)"
        );
        let said = String::from_utf8_lossy(&server.stderr);
        assert!(said.contains(field), "{field}: {said}");
        let local = std::process::Command::new(env!("CARGO_BIN_EXE_murmur"))
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(
            local.status.code(),
            Some(2),
            "murmur validate accepted {field} = {patch}: {}",
            String::from_utf8_lossy(&local.stdout)
        );
    }
}

/// An object stored under a looser (older) CRD that the operator cannot decode costs only
/// itself: the other jobs reconcile, and an event names the bad one and its field.
pub async fn undecodable_costs_only_itself(env: &Env) {
    let cp = &env.cp;
    // An older CRD: no bounds on numbers or durations, no CEL rules.
    let mut loose: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(
            super::super::support::control_plane::repository()
                .join("crds/decentralizedtrainingjobs.murmur.dev.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    fn loosen(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("maximum");
                map.remove("maxLength");
                map.remove("x-kubernetes-validations");
                if map.get("pattern").is_some() {
                    map.insert("pattern".into(), json!(".*"));
                }
                map.values_mut().for_each(loosen);
            }
            Value::Array(items) => items.iter_mut().for_each(loosen),
            _ => {}
        }
    }
    loosen(&mut loose);
    cp.kubectl_with(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&loose.to_string()),
    );
    cp.kubectl_ok(&["create", "namespace", "decode"]);
    let mut bad = example("dcliques-spot-cpu.yaml");
    bad["metadata"]["name"] = json!("unreadable");
    merge(
        &mut bad,
        &json!({"spec": {"algorithm": {"averageEvery": 5_000_000_000u64}}}),
    );
    stdout_of(
        "apply the unreadable job under the loose CRD",
        cp.kubectl_with(
            &["apply", "-n", "decode", "-f", "-"],
            Some(&bad.to_string()),
        ),
    );
    // Back to the real CRD: stored objects are not checked again.
    cp.kubectl_ok(&["apply", "--server-side", "--force-conflicts", "-f", "crds/"]);

    let mut s = Scene::new(env, "decode-good", &[]).await;
    nodes(&mut s, "decode").await;
    s.job(
        "ring-cpu.yaml",
        "readable",
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    s.running("readable", 4).await;
    let deadline = Instant::now() + MINUTE;
    loop {
        let events = cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", "decode", "-o", "json"]);
        let events: Value = serde_json::from_str(&events).unwrap();
        let named = events["items"].as_array().unwrap().iter().any(|e| {
            e["regarding"]["name"] == "unreadable"
                && e["note"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("averageEvery")
        });
        if named {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no event names the unreadable job's field; operator log:\n{}",
            tail(&s.operator.logs())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cp.kubectl_ok(&["delete", "namespace", "decode", "--wait=false"]);
    s.finish().await;
}

/// What only a Pod creation checks (a priority class that does not exist, a bad quantity)
/// shows in the job's conditions and events, instead of a silent retry forever.
pub async fn pods_rejected_say_why(env: &Env) {
    let mut s = Scene::new(env, "rejected", &[]).await;
    nodes(&mut s, "rejected").await;
    s.job(
        "ring-cpu.yaml",
        "unschedulable",
        json!({"spec": {"scheduling": {"capacity": "spot", "priorityClassName": "no-such-class"}}}),
    );
    let status = s
        .until_status("unschedulable", "a PodsRejected condition", MINUTE, |st| {
            has_condition(st, "PodsRejected", "True")
        })
        .await;
    let condition = condition_of(&status, "PodsRejected");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("no-such-class"),
        "{condition}"
    );
    s.event(
        "unschedulable",
        "a PodsRejected event naming the class",
        |e| {
            e.reason.as_deref() == Some("PodsRejected")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("no-such-class"))
        },
    )
    .await;
    // Fixed by the cluster's admin: the members start and the condition clears.
    env.cp.apply(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: no-such-class}\nvalue: 1000\n",
    );
    s.running("unschedulable", 4).await;
    s.until_status("unschedulable", "PodsRejected cleared", MINUTE, |st| {
        has_condition(st, "PodsRejected", "False")
    })
    .await;
    env.cp
        .kubectl_ok(&["delete", "priorityclass", "no-such-class"]);
    s.finish().await;
}

/// A ResourceQuota admits only some of a job's pods: the admitted members train (the topology
/// is built from them once `replicas.min` have joined), the job runs `Degraded` with a
/// `PodsRejected` condition naming the quota, the refused pods are retried with backoff (not
/// re-posted at every reconcile: the API server's audit log counts the tries), and once the
/// quota is raised every member runs.
pub async fn partly_admitted_jobs_run_with_what_they_got(env: &Env) {
    let mut s = Scene::new(env, "partial", &["--resync", "2s"]).await;
    nodes(&mut s, "partial").await;
    env.cp.apply(&format!(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {{name: pods, namespace: {}}}\nspec: {{hard: {{pods: \"3\"}}}}\n",
        s.ns
    ));
    // The quota controller has to have counted the namespace before it admits anything.
    let deadline = Instant::now() + MINUTE;
    while env
        .cp
        .kubectl_ok(&[
            "get",
            "resourcequota",
            "pods",
            "-n",
            &s.ns,
            "-o",
            "jsonpath={.status.hard.pods}",
        ])
        .trim()
        != "3"
    {
        assert!(Instant::now() < deadline, "the quota was never counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let began = Instant::now();
    s.job(
        "ring-cpu.yaml",
        "quota",
        json!({"spec": {"scheduling": {"capacity": "spot"}, "replicas": {"min": 3, "target": 5, "max": 5}}}),
    );
    let admitted = s.running("quota", 3).await;
    assert_eq!(admitted.len(), 3, "{:?}", admitted.keys());
    s.join("quota", admitted.keys().copied()).await;
    let status = s
        .until_status(
            "quota",
            "Degraded with the admitted members",
            MINUTE,
            |st| {
                st["phase"] == "Degraded"
                    && st["topologyVersion"].as_u64() >= Some(1)
                    && has_condition(st, "PodsRejected", "True")
            },
        )
        .await;
    let condition = condition_of(&status, "PodsRejected");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains("exceeded quota"), "{condition}");
    println!(
        "  quota of 3 pods for 5 members: Degraded with 3 in the topology {:.1} s after the apply; {message}",
        began.elapsed().as_secs_f64()
    );
    // Retried with backoff (5 s, doubling), not at every 2 s resync. The API server's audit
    // log holds each refused create; the creates of one try arrive together.
    let tries = || {
        let mut at: Vec<Timestamp> = std::fs::read_to_string(super::audit_log())
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("\"verb\":\"create\"")
                    && l.contains(&format!("/namespaces/{}/pods", s.ns))
                    && l.contains("\"code\":403")
            })
            .filter_map(|l| {
                let entry: Value = serde_json::from_str(l).ok()?;
                entry["requestReceivedTimestamp"].as_str()?.parse().ok()
            })
            .collect();
        at.sort();
        at.dedup_by(|later, earlier| later.duration_since(*earlier).as_secs_f64() < 1.0);
        at
    };
    // The first refusal, then tries after 5, 10 and 20 s.
    let deadline = Instant::now() + MINUTE;
    let at = loop {
        let at = tries();
        if at.len() >= 4 {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "{} tries of the refused creates in a minute: {at:?}",
            at.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let gaps: Vec<f64> = at[..4]
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    assert!(
        gaps.iter().all(|&g| g >= 4.0) && gaps[2] >= 2.0 * gaps[0],
        "the refused creates were tried again after {gaps:?} s, not after a doubling backoff from 5 s (resync 2 s)"
    );
    println!(
        "  refused creates tried again after {} s (backoff, doubling)",
        gaps.iter()
            .map(|g| format!("{g:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The admin raises the quota: the rest start, the condition clears, the job runs.
    env.cp.kubectl_ok(&[
        "patch",
        "resourcequota",
        "pods",
        "-n",
        &s.ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"hard":{"pods":"10"}}}"#,
    ]);
    let all = s.running("quota", 5).await;
    s.join("quota", all.keys().copied()).await;
    s.until_status("quota", "Running with every member", 2 * MINUTE, |st| {
        st["phase"] == "Running" && has_condition(st, "PodsRejected", "False")
    })
    .await;
    let status = s.status("quota").await;
    assert_eq!(status["restarts"], 0, "a refusal is not a crash");
    assert_eq!(status["preemptions"], 0, "nor a preemption");
    s.finish().await;
}

/// A force-deleted pod is replaced at once, not at the next resync (the pod watch keeps delete
/// events).
pub async fn deletes_are_seen(env: &Env) {
    let mut s = Scene::new(env, "deletes", &["--resync", "5m"]).await;
    nodes(&mut s, "deletes").await;
    s.job(
        "ring-cpu.yaml",
        "watched",
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    let pods = s.running("watched", 4).await;
    let victim = pods[&1].metadata.name.clone().unwrap();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let began = Instant::now();
    api.delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let replaced = s
            .pods("watched")
            .await
            .iter()
            .any(|p| member_of(p) == Some(1) && attempt_of(p) == Some(1));
        if replaced {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a force-deleted pod was not replaced within 30 s (resync 5 m): pods {:?}, status {:#}",
            s.pods("watched")
                .await
                .iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>(),
            s.status("watched").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "  force-deleted pod replaced {:.1} s later (resync 5 m)",
        began.elapsed().as_secs_f64()
    );
    s.finish().await;
}

/// A job deleted (its children orphaned) and created again under the same name starts afresh:
/// a new key, new memory, and pods whose names do not collide with the leftovers.
pub async fn same_name_again(env: &Env) {
    let mut s = Scene::new(env, "again", &[]).await;
    nodes(&mut s, "again").await;
    let patch = json!({"spec": {"scheduling": {"capacity": "spot"}}});
    s.job("ring-cpu.yaml", "twice", patch.clone());
    s.running("twice", 4).await;
    let old_key = s.key("twice").await;
    env.cp.kubectl_ok(&[
        "delete",
        "dtj",
        "twice",
        "-n",
        &s.ns,
        "--cascade=orphan",
        "--wait=true",
    ]);
    s.job("ring-cpu.yaml", "twice", patch);
    let uid = s.job_object("twice").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    // Four pods of the new job run, beside the four orphans.
    let deadline = Instant::now() + MINUTE;
    loop {
        let owned = s
            .pods("twice")
            .await
            .into_iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .count();
        if owned == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the re-created job has {owned} of 4 pods; operator log:\n{}",
            tail(&s.operator.logs())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_ne!(
        s.key("twice").await,
        old_key,
        "the new job inherited the old key"
    );
    let secret = Api::<Secret>::namespaced(s.client.clone(), &s.ns)
        .get("twice-peer-key")
        .await
        .unwrap();
    assert!(
        secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid)
    );
    let cm = Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns)
        .get("twice-topology")
        .await
        .unwrap();
    assert!(
        cm.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid)
    );
    assert!(
        !s.operator.logs().contains("may not change fields"),
        "an apply onto a leftover pod:\n{}",
        tail(&s.operator.logs())
    );
    s.finish().await;
}

/// A pod that stays Terminating (a finalizer) and its replacement never share a DNS name.
pub async fn attempts_have_their_own_names(env: &Env) {
    let mut s = Scene::new(env, "hostnames", &[]).await;
    nodes(&mut s, "hostnames").await;
    s.job(
        "ring-cpu.yaml",
        "named",
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    let pods = s.running("named", 4).await;
    let old = pods[&2].metadata.name.clone().unwrap();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    api.patch(&old, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    api.delete(&old, &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + MINUTE;
    let replacement = loop {
        if let Some(p) = s
            .pods("named")
            .await
            .into_iter()
            .find(|p| member_of(p) == Some(2) && attempt_of(p) == Some(1))
        {
            break p;
        }
        assert!(Instant::now() < deadline, "member 2 was not replaced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let terminating = api.get(&old).await.unwrap();
    let hostname = |p: &Pod| p.spec.as_ref().unwrap().hostname.clone();
    assert_ne!(
        hostname(&terminating),
        hostname(&replacement),
        "a terminating attempt and its replacement share one DNS name"
    );
    api.patch(
        &old,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    s.finish().await;
}

/// A job whose pods were created but whose other writes failed (here a policy refuses the
/// operator's ConfigMap writes) and whose spec then changed recovers once the writes pass:
/// pods are created, never re-applied onto an existing one (a 422 forever).
pub async fn an_existing_pod_is_never_re_applied(env: &Env) {
    let mut s = Scene::new(env, "reapply", &[]).await;
    nodes(&mut s, "reapply").await;
    let policy = "\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: murmur-test-no-configmaps}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [\"\"]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]
  validations:
  - expression: \"request.userInfo.username != 'system:serviceaccount:murmur-system:murmur-operator'\"
    message: the test holds the operator's ConfigMap writes
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: murmur-test-no-configmaps}
spec:
  policyName: murmur-test-no-configmaps
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: reapply}
";
    env.cp.apply(policy);
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.job(
        "ring-cpu.yaml",
        "edited",
        json!({"spec": {"scheduling": {"capacity": "spot"}}}),
    );
    s.running("edited", 4).await;
    // The spec changes while the job's memory could not be written.
    s.job(
        "ring-cpu.yaml",
        "edited",
        json!({"spec": {"scheduling": {"capacity": "spot"}, "training": {"learningRate": 0.06}}}),
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    env.cp.kubectl_ok(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        "murmur-test-no-configmaps",
    ]);
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    let deadline = Instant::now() + MINUTE;
    while api.get_opt("edited-topology").await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the job never recovered; operator log:\n{}",
            tail(&s.operator.logs())
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !s.operator.logs().contains("may not change fields"),
        "{}",
        tail(&s.operator.logs())
    );
    s.finish().await;
}
