//! The scenarios, one module per area, in the order they run.

mod crd;
mod defects;
mod helm;
mod kueue;
mod ownership;
mod placement;
mod pod_template;
mod preemption;
mod restart;
mod scene;
mod size;

use super::Scenario;

pub const ALL: &[(&str, Scenario)] = &[
    ("crd", |env| Box::pin(crd::crd(env))),
    ("helm", |env| Box::pin(helm::helm(env))),
    ("placement", |env| Box::pin(placement::placement(env))),
    ("pod-template", |env| {
        Box::pin(pod_template::pod_template(env))
    }),
    ("preemption", |env| Box::pin(preemption::preemption(env))),
    ("ownership", |env| Box::pin(ownership::ownership(env))),
    ("defect-bounds", |env| {
        Box::pin(defects::bounded_numbers(env))
    }),
    ("defect-pods-rejected", |env| {
        Box::pin(defects::pods_rejected_say_why(env))
    }),
    ("defect-partly-admitted", |env| {
        Box::pin(defects::partly_admitted_jobs_run_with_what_they_got(env))
    }),
    ("defect-deletes", |env| {
        Box::pin(defects::deletes_are_seen(env))
    }),
    ("defect-same-name", |env| {
        Box::pin(defects::same_name_again(env))
    }),
    ("defect-hostnames", |env| {
        Box::pin(defects::attempts_have_their_own_names(env))
    }),
    ("defect-reapply", |env| {
        Box::pin(defects::an_existing_pod_is_never_re_applied(env))
    }),
    ("defect-undecodable", |env| {
        Box::pin(defects::undecodable_costs_only_itself(env))
    }),
    ("defect-size", |env| Box::pin(size::size(env))),
    ("kueue", |env| Box::pin(kueue::kueue(env))),
    ("control-plane-restart", |env| {
        Box::pin(restart::control_plane_restart(env))
    }),
    // Last: it deletes and re-creates the CRD, and with it every job.
    ("defect-crd-established", |env| {
        Box::pin(crd::crd_established(env))
    }),
];

/// kube-apiserver flags for these tests: an audit log of every write (who wrote what), so a
/// scenario can count the operator's requests as the API server saw them.
pub fn apiserver_args() -> String {
    let policy =
        std::env::temp_dir().join(format!("murmur-audit-policy-{}.yaml", std::process::id()));
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: None\n  verbs: [get, list, watch]\n- level: Metadata\n",
    )
    .unwrap();
    format!(
        "--audit-policy-file={} --audit-log-path={} --audit-log-maxsize=500",
        policy.display(),
        audit_log().display()
    )
}

/// Where the API server writes its audit log.
pub fn audit_log() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("murmur-audit-{}.log", std::process::id()))
}
