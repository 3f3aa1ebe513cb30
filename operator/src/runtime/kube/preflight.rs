//! Before reconciling anything: is the CRD installed, and may this service account do what the
//! operator does? Either answer "no" becomes one clear message rather than a stream of 403s.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
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
    ("list", "", "nodes"),
    ("watch", "", "nodes"),
    ("create", "events.k8s.io", "events"),
    // kube-runtime's event recorder turns a repeat into a series: a patch of the first.
    ("patch", "events.k8s.io", "events"),
    ("get", "coordination.k8s.io", "leases"),
    ("create", "coordination.k8s.io", "leases"),
    ("update", "coordination.k8s.io", "leases"),
];

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
    #[error("cannot reach the Kubernetes API server: {0}")]
    Api(#[source] kube::Error),
}

fn describe(verb: &str, group: &str, resource: &str) -> String {
    if group.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource}.{group}")
    }
}

/// Check that the CRD is served and that RBAC grants every verb the operator uses: cluster-wide,
/// but the leader Lease's verbs in `lease_namespace` only (the chart grants them there, with a
/// Role), and not at all without leader election.
pub async fn check(
    client: &Client,
    network_policies: bool,
    lease_namespace: Option<&str>,
) -> Result<(), PreflightError> {
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
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    namespace,
                    resource: Some(resource_name.into()),
                    subresource,
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
