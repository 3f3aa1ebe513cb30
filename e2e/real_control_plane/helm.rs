//! The chart as a user installs it: `helm lint`, `helm install` into the real API server, then
//! the operator run out of cluster as the chart's ServiceAccount passes its start-up RBAC check
//! with exactly the chart's ClusterRole and Role — and names the permission when any one verb is
//! taken out of them.

use std::time::Duration;

use serde_json::Value;

use super::super::Env;
use super::super::support::control_plane::{Operator, stdout_of};

pub const NAMESPACE: &str = "murmur-system";

/// `helm install murmur charts/murmur`, once (later scenarios reuse the release). Its Deployment
/// at 0 replicas: the operator runs out of cluster, and kwok "ran" the chart's pod on whatever
/// node was free, so when a scenario removed its nodes the pod came back on the next scenario's
/// spot node and took the CPU its members were sized for (`placement` failed on it).
pub fn install(env: &Env) {
    let cp = &env.cp;
    if cp
        .helm(&["status", "murmur", "-n", NAMESPACE])
        .status
        .success()
    {
        return;
    }
    stdout_of(
        "helm install",
        cp.helm(&[
            "install",
            "murmur",
            "charts/murmur",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            "replicaCount=0",
        ]),
    );
}

/// The operator as the chart's ServiceAccount, out of cluster; `extra` flags.
pub fn operator(env: &Env, log: &str, extra: &[&str]) -> Operator {
    install(env);
    let kubeconfig = env
        .cp
        .service_account_kubeconfig(NAMESPACE, "murmur-operator");
    Operator::start(&kubeconfig, env.dir.path().join(log), extra)
}

/// Until the operator leads with its caches listed (`/readyz` says `leading`).
pub async fn ready(operator: &mut Operator) {
    until_readyz(operator, "leading\n").await;
}

/// Until the operator's `/readyz` answers 200 with `body`.
pub async fn until_readyz(operator: &mut Operator, body: &str) {
    let url = format!("http://127.0.0.1:{}/readyz", operator.port);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = reqwest::get(&url).await
            && r.status() == 200
            && r.text().await.is_ok_and(|t| t == body)
        {
            return;
        }
        assert!(
            operator.running(),
            "the operator exited:\n{}",
            operator.logs()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the operator never became ready:\n{}",
            operator.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn helm(env: &Env) {
    let cp = &env.cp;
    let lint = cp.helm(&["lint", "charts/murmur"]);
    stdout_of("helm lint charts/murmur", lint);
    install(env);
    // Out of cluster, as the chart's ServiceAccount, with leader election and NetworkPolicies on
    // as the chart runs it: the start-up check passes and the replica leads.
    let as_the_chart_runs = [
        "--leader-election",
        "--lease-namespace",
        NAMESPACE,
        "--network-policies",
    ];
    let mut op = operator(env, "helm-operator.log", &as_the_chart_runs);
    ready(&mut op).await;
    drop(op);

    // Take each verb out of the chart's roles in turn: the operator refuses to start and names
    // the permission.
    for (kind, name) in [
        ("clusterrole", "murmur-operator"),
        ("role", "murmur-operator-leader-election"),
    ] {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if kind == "role" {
            args.extend(["-n", NAMESPACE]);
        }
        let original: Value = serde_json::from_str(&cp.kubectl_ok(&args)).unwrap();
        let rules = original["rules"].as_array().unwrap().clone();
        for (r, rule) in rules.iter().enumerate() {
            let verbs = rule["verbs"].as_array().unwrap();
            for (v, verb) in verbs.iter().enumerate() {
                let verb = verb.as_str().unwrap();
                let mut cut = original.clone();
                if verbs.len() == 1 {
                    // A rule needs a verb: take the whole rule out.
                    cut["rules"].as_array_mut().unwrap().remove(r);
                } else {
                    cut["rules"][r]["verbs"].as_array_mut().unwrap().remove(v);
                }
                replace(env, &cut);
                let resource = rule["resources"][0].as_str().unwrap();
                let op = operator(
                    env,
                    &format!(
                        "helm-without-{kind}-{verb}-{}.log",
                        resource.replace('/', "-")
                    ),
                    &as_the_chart_runs,
                );
                let (code, log) = op.wait(Duration::from_secs(30));
                assert!(
                    code.is_some_and(|c| c != 0),
                    "without {verb} {resource} ({kind}) the operator still started:\n{log}"
                );
                assert!(
                    log.contains("RBAC does not allow")
                        && log.contains(&format!("{verb} {resource}")),
                    "without {verb} {resource} the operator did not name it:\n{log}"
                );
            }
        }
        replace(env, &original);
    }
}

/// `kubectl replace` of a role (its resourceVersion dropped: the latest wins).
fn replace(env: &Env, role: &Value) {
    let mut role = role.clone();
    role["metadata"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k == "name" || k == "namespace" || k == "labels" || k == "annotations");
    let text = serde_json::to_string(&role).unwrap();
    stdout_of(
        "kubectl replace",
        env.cp.kubectl_with(&["replace", "-f", "-"], Some(&text)),
    );
    // RBAC reads roles through an informer: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
}
