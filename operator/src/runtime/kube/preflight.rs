//! Before reconciling anything: is the CRD installed, and may this service account do what the
//! operator does? Either answer "no" becomes one clear message rather than a stream of 403s.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use murmur_core::api::DecentralizedTrainingJob;

/// Every (verb, API group, resource) the operator uses.
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
    ("patch", "", "services"),
    ("list", "", "configmaps"),
    ("watch", "", "configmaps"),
    ("patch", "", "configmaps"),
    ("list", "", "secrets"),
    ("watch", "", "secrets"),
    ("patch", "", "secrets"),
    ("list", "", "nodes"),
    ("watch", "", "nodes"),
    ("create", "events.k8s.io", "events"),
    ("get", "coordination.k8s.io", "leases"),
    ("create", "coordination.k8s.io", "leases"),
    ("update", "coordination.k8s.io", "leases"),
];

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

pub async fn check(client: &Client) -> Result<(), PreflightError> {
    let jobs: Api<DecentralizedTrainingJob> = Api::all(client.clone());
    match jobs.list(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Err(PreflightError::CrdMissing),
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        Err(e) => return Err(PreflightError::Api(e)),
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for &(verb, group, resource) in PERMISSIONS {
        let (resource_name, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
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
