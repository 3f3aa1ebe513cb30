//! Before reconciling anything: is the CRD installed, and may this service account do what the
//! operator does? Either answer "no" becomes one clear message rather than a stream of 403s.

use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, CustomResourceExt, Resource};
use murmur_core::api::DecentralizedTrainingJob;

/// Every (verb, API group, resource) the operator uses. The chart's RBAC grants exactly these
/// (a test compares), and the controller tests check every request against them
/// ([`permissions_of`]). Server-side apply needs `create` besides `patch`: an apply that makes
/// a new object is authorised as a create.
pub const PERMISSIONS: &[(&str, &str, &str)] = &[
    ("list", "murmur.dev", "decentralizedtrainingjobs"),
    ("watch", "murmur.dev", "decentralizedtrainingjobs"),
    ("delete", "murmur.dev", "decentralizedtrainingjobs"),
    ("patch", "murmur.dev", "decentralizedtrainingjobs/status"),
    ("list", "", "pods"),
    ("watch", "", "pods"),
    ("create", "", "pods"),
    ("patch", "", "pods"),
    ("delete", "", "pods"),
    ("list", "", "services"),
    ("watch", "", "services"),
    ("create", "", "services"),
    ("patch", "", "services"),
    ("list", "", "configmaps"),
    ("watch", "", "configmaps"),
    ("create", "", "configmaps"),
    ("patch", "", "configmaps"),
    ("list", "", "secrets"),
    ("watch", "", "secrets"),
    ("create", "", "secrets"),
    ("patch", "", "secrets"),
    // The key Secret is immutable: an earlier job's of the same name is deleted, not edited.
    ("delete", "", "secrets"),
    // A PodDisruptionBudget per job: a drain takes at most target − min members at once.
    ("list", "policy", "poddisruptionbudgets"),
    ("watch", "policy", "poddisruptionbudgets"),
    ("create", "policy", "poddisruptionbudgets"),
    ("patch", "policy", "poddisruptionbudgets"),
    ("list", "", "nodes"),
    ("watch", "", "nodes"),
    ("create", "events.k8s.io", "events"),
    // A warning said again within minutes is a series of the first: a patch of it.
    ("patch", "events.k8s.io", "events"),
    // Pods' Warning events: a volume that cannot be mounted is said nowhere else.
    ("list", "", "events"),
    ("watch", "", "events"),
    ("get", "coordination.k8s.io", "leases"),
    ("create", "coordination.k8s.io", "leases"),
    ("update", "coordination.k8s.io", "leases"),
    // Our own CRD only (the chart names it): is it Established yet?
    ("get", CRD_GROUP, "customresourcedefinitions"),
    // Who holds an observer's bearer token, and may they read the job (the status API).
    ("create", "authentication.k8s.io", "tokenreviews"),
    ("create", "authorization.k8s.io", "subjectaccessreviews"),
];

const CRD_GROUP: &str = "apiextensions.k8s.io";

/// The group of the leader-election Lease, which the chart grants in its own namespace only.
const LEASE_GROUP: &str = "coordination.k8s.io";

/// What `--network-policies` adds: a NetworkPolicy per job, applied and watched.
pub const NETWORK_POLICY_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("list", "networking.k8s.io", "networkpolicies"),
    ("watch", "networking.k8s.io", "networkpolicies"),
    ("create", "networking.k8s.io", "networkpolicies"),
    ("patch", "networking.k8s.io", "networkpolicies"),
];

/// The RBAC permissions one API request needs: (verb, group, resource[/subresource]).
/// Requests outside the resource API (discovery, `/version`) need none.
pub fn permissions_of(
    method: &str,
    path: &str,
    query: &str,
    content_type: &str,
) -> Vec<(String, String, String)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return Vec::new(),
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return Vec::new(),
    };
    let watching = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verbs: &[&str] = match (method, name) {
        ("GET", Some(_)) => &["get"],
        ("GET", None) if watching => &["watch"],
        ("GET", None) => &["list"],
        ("POST", _) => &["create"],
        ("PUT", _) => &["update"],
        // An apply may create the object; a subresource (status) always exists already.
        ("PATCH", _)
            if content_type.starts_with("application/apply-patch") && subresource.is_none() =>
        {
            &["patch", "create"]
        }
        ("PATCH", _) => &["patch"],
        ("DELETE", Some(_)) => &["delete"],
        ("DELETE", None) => &["deletecollection"],
        _ => &[],
    };
    let resource = match subresource {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    verbs
        .iter()
        .map(|verb| (verb.to_string(), group.to_string(), resource.clone()))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "the DecentralizedTrainingJob CRD is not installed: kubectl apply -f crds/decentralizedtrainingjobs.murmur.dev.yaml (or `murmur crd | kubectl apply -f -`)"
    )]
    CrdMissing,
    #[error(
        "RBAC does not allow this service account to: {}; grant them with the operator's ClusterRole",
        .0.join(", ")
    )]
    Forbidden(Vec<String>),
    #[error(
        "the DecentralizedTrainingJob CRD is not Established after {waited:?}: {why} (kubectl describe crd {name})"
    )]
    CrdNotEstablished {
        name: String,
        why: String,
        waited: Duration,
    },
    #[error("cannot reach the Kubernetes API server: {0}")]
    Api(#[source] kube::Error),
}

/// Why a CRD cannot serve our jobs yet, or None when it can: the API server serves a CRD only
/// once it is `Established`, and never while `NamesAccepted` is false (another CRD of the same
/// group claims our plural, kind or short name); it must also serve the version we speak.
pub fn crd_not_ready(crd: &CustomResourceDefinition) -> Option<String> {
    let version = DecentralizedTrainingJob::version(&());
    if !crd
        .spec
        .versions
        .iter()
        .any(|v| v.name == version && v.served)
    {
        return Some(format!("it does not serve version {version}"));
    }
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let established = conditions
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    let unmet: Vec<String> = conditions
        .iter()
        .filter(|c| {
            matches!(c.type_.as_str(), "Established" | "NamesAccepted") && c.status != "True"
        })
        .map(|c| {
            let mut text = format!("{}={}", c.type_, c.status);
            for part in [&c.reason, &c.message].into_iter().flatten() {
                text.push_str(": ");
                text.push_str(part);
            }
            text
        })
        .collect();
    match (established, unmet.is_empty()) {
        (true, true) => None,
        (_, false) => Some(unmet.join("; ")),
        (false, true) => Some("Established is not reported yet".into()),
    }
}

/// Wait (up to `wait`) until our CRD is Established: started right after `kubectl apply` of
/// the CRD, the operator would otherwise meet 404s from a CRD that is installed but not served.
async fn wait_for_crd(client: &Client, wait: Duration) -> Result<(), PreflightError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = DecentralizedTrainingJob::crd_name();
    let started = Instant::now();
    let mut said = None;
    loop {
        let crd = match crds.get_opt(name).await {
            Ok(Some(crd)) => crd,
            Ok(None) => return Err(PreflightError::CrdMissing),
            // Not allowed to read it: the access review below names the missing verb.
            Err(kube::Error::Api(e)) if e.code == 403 => return Ok(()),
            Err(e) => return Err(PreflightError::Api(e)),
        };
        let Some(why) = crd_not_ready(&crd) else {
            return Ok(());
        };
        if started.elapsed() >= wait {
            return Err(PreflightError::CrdNotEstablished {
                name: name.into(),
                why,
                waited: wait,
            });
        }
        if said.as_ref() != Some(&why) {
            tracing::warn!(crd = name, %why, "waiting for the CRD to be Established");
            said = Some(why);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn describe(verb: &str, group: &str, resource: &str) -> String {
    if group.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource}.{group}")
    }
}

/// Check that the CRD is served (waiting up to `crd_wait` for it to be Established) and that
/// RBAC grants every verb the operator uses: cluster-wide, but the leader Lease's verbs in
/// `lease_namespace` only (the chart grants them there, with a Role), and not at all without
/// leader election.
pub async fn check(
    client: &Client,
    network_policies: bool,
    lease_namespace: Option<&str>,
    crd_wait: Duration,
) -> Result<(), PreflightError> {
    wait_for_crd(client, crd_wait).await?;
    let jobs: Api<DecentralizedTrainingJob> = Api::all(client.clone());
    // Metadata only: a job stored under an older CRD that the types cannot decode must not
    // stop the operator from starting.
    match jobs.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Err(PreflightError::CrdMissing),
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        Err(e) => return Err(PreflightError::Api(e)),
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    let extra = if network_policies {
        NETWORK_POLICY_PERMISSIONS
    } else {
        &[]
    };
    for &(verb, group, resource) in PERMISSIONS.iter().chain(extra) {
        let namespace = match (group, lease_namespace) {
            (LEASE_GROUP, None) => continue,
            (LEASE_GROUP, Some(ns)) => Some(ns.to_string()),
            _ => None,
        };
        let (resource_name, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (resource, None),
        };
        // The chart grants reading our CRD by name only.
        let name = (group == CRD_GROUP).then(|| DecentralizedTrainingJob::crd_name().to_string());
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    namespace,
                    resource: Some(resource_name.into()),
                    subresource,
                    name,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(PreflightError::Api)?;
        if !answer.status.is_some_and(|s| s.allowed) {
            missing.push(describe(verb, group, resource));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::Forbidden(missing))
    }
}

#[cfg(test)]
mod tests {
    use super::permissions_of;

    fn of(method: &str, path: &str, query: &str, content_type: &str) -> Vec<String> {
        permissions_of(method, path, query, content_type)
            .into_iter()
            .map(|(v, g, r)| format!("{v} {g}/{r}"))
            .collect()
    }

    #[test]
    fn requests_map_to_the_verbs_rbac_checks() {
        let apply = "application/apply-patch+yaml";
        let merge = "application/merge-patch+json";
        let cases: &[(&str, &str, &str, &str, &[&str])] = &[
            (
                "GET",
                "/api/v1/pods",
                "labelSelector=x&limit=500",
                "",
                &["list /pods"],
            ),
            (
                "GET",
                "/api/v1/pods",
                "watch=true&resourceVersion=1",
                "",
                &["watch /pods"],
            ),
            ("GET", "/api/v1/nodes", "watch=1", "", &["watch /nodes"]),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/murmur-system/leases/murmur-operator",
                "",
                "",
                &["get coordination.k8s.io/leases"],
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/m/leases/l",
                "",
                "application/json",
                &["update coordination.k8s.io/leases"],
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ml/pods/mnist-0-0",
                "fieldManager=murmur-operator&force=true",
                apply,
                &["patch /pods", "create /pods"],
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ml/pods/mnist-0-0",
                "",
                merge,
                &["patch /pods"],
            ),
            (
                "PATCH",
                "/apis/murmur.dev/v1alpha1/namespaces/ml/decentralizedtrainingjobs/mnist/status",
                "force=true",
                apply,
                &["patch murmur.dev/decentralizedtrainingjobs/status"],
            ),
            (
                "DELETE",
                "/apis/murmur.dev/v1alpha1/namespaces/ml/decentralizedtrainingjobs/mnist",
                "",
                "",
                &["delete murmur.dev/decentralizedtrainingjobs"],
            ),
            (
                "DELETE",
                "/api/v1/namespaces/ml/pods",
                "",
                "",
                &["deletecollection /pods"],
            ),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/ml/events",
                "",
                "application/json",
                &["create events.k8s.io/events"],
            ),
            ("GET", "/version", "", "", &[]),
            ("GET", "/apis", "", "", &[]),
        ];
        for (method, path, query, content_type, want) in cases {
            assert_eq!(
                of(method, path, query, content_type),
                *want,
                "{method} {path}"
            );
        }
    }
}
