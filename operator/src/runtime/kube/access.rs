//! Who may read the operator's status API: the cluster says. A bearer token is reviewed with a
//! TokenReview and each read with a SubjectAccessReview, as the kubelet and kube-rbac-proxy
//! do, and both answers are cached with the kubelet's webhook defaults (an identity for 2
//! minutes, an allowed read for 5, a refusal for 30 seconds; a refused token for 10), so a
//! dashboard's steady polling costs the API server nothing. Tokens are kept only as SHA-256
//! hashes, and are used for nothing but their review.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use moka::Expiry;
use moka::future::Cache;
use sha2::{Digest, Sha256};

use crate::status::access::{Access, Action, Caller, ClusterUser, Denied};

/// How long an answer is kept (the kubelet's `--authentication-token-webhook-cache-ttl` and
/// `--authorization-webhook-cache-{authorized,unauthorized}-ttl` defaults).
pub const AUTHENTICATED_TTL: Duration = Duration::from_secs(120);
pub const REFUSED_TOKEN_TTL: Duration = Duration::from_secs(10);
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
pub const DENIED_TTL: Duration = Duration::from_secs(30);

/// At most this many answers of each kind are kept (a bounded memory under token spraying).
const CAPACITY: u64 = 10_000;

type Identity = Result<Arc<ClusterUser>, String>;

struct IdentityTtl;

impl Expiry<[u8; 32], Identity> for IdentityTtl {
    fn expire_after_create(&self, _: &[u8; 32], value: &Identity, _: Instant) -> Option<Duration> {
        Some(match value {
            Ok(_) => AUTHENTICATED_TTL,
            Err(_) => REFUSED_TOKEN_TTL,
        })
    }
}

struct DecisionTtl;

impl Expiry<([u8; 32], Action), bool> for DecisionTtl {
    fn expire_after_create(
        &self,
        _: &([u8; 32], Action),
        allowed: &bool,
        _: Instant,
    ) -> Option<Duration> {
        Some(if *allowed { ALLOWED_TTL } else { DENIED_TTL })
    }
}

/// The cluster's answer to who a token is and what it may read, cached.
pub struct ClusterAccess {
    client: Client,
    /// Accept only tokens issued for one of these audiences (empty: the API server's own).
    audiences: Vec<String>,
    identities: Cache<[u8; 32], Identity>,
    decisions: Cache<([u8; 32], Action), bool>,
}

impl ClusterAccess {
    pub fn new(client: Client, audiences: Vec<String>) -> Self {
        Self {
            client,
            audiences,
            identities: Cache::builder()
                .max_capacity(CAPACITY)
                .expire_after(IdentityTtl)
                .build(),
            decisions: Cache::builder()
                .max_capacity(CAPACITY)
                .expire_after(DecisionTtl)
                .build(),
        }
    }

    async fn review_token(&self, token: &str, hash: [u8; 32]) -> Result<Identity, Denied> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Denied::Unavailable(format!("cannot review the token (TokenReview): {e}"))
            })?;
        Ok(identity(
            answer.status.unwrap_or_default(),
            &self.audiences,
            hash,
        ))
    }

    async fn review_access(&self, user: &ClusterUser, action: &Action) -> Result<bool, Denied> {
        let (resource_attributes, non_resource_attributes) = match action {
            Action::GetJob { namespace, name } => (
                Some(ResourceAttributes {
                    verb: Some("get".into()),
                    group: Some("murmur.dev".into()),
                    resource: Some("decentralizedtrainingjobs".into()),
                    namespace: Some(namespace.clone()),
                    name: Some(name.clone()),
                    ..Default::default()
                }),
                None,
            ),
            Action::GetMetrics => (
                None,
                Some(NonResourceAttributes {
                    verb: Some("get".into()),
                    path: Some("/metrics".into()),
                }),
            ),
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.iter().cloned().collect()),
                resource_attributes,
                non_resource_attributes,
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Denied::Unavailable(format!("cannot review access (SubjectAccessReview): {e}"))
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// A TokenReview's status as an identity, or why the token is refused.
fn identity(status: TokenReviewStatus, audiences: &[String], token_hash: [u8; 32]) -> Identity {
    let refused = "the cluster does not accept this bearer token (TokenReview)";
    if status.authenticated != Some(true) {
        return Err(refused.into());
    }
    if !audiences.is_empty()
        && !status
            .audiences
            .unwrap_or_default()
            .iter()
            .any(|a| audiences.contains(a))
    {
        return Err(format!(
            "the token is not meant for this service (audiences accepted: {})",
            audiences.join(", ")
        ));
    }
    let user = status.user.unwrap_or_default();
    let Some(name) = user.username.filter(|n| !n.is_empty()) else {
        return Err(refused.into());
    };
    Ok(Arc::new(ClusterUser {
        name,
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default().into_iter().collect(),
        token_hash,
    }))
}

impl Access for ClusterAccess {
    fn authenticate<'a>(&'a self, token: Option<&'a str>) -> BoxFuture<'a, Result<Caller, Denied>> {
        Box::pin(async move {
            let Some(token) = token else {
                return Err(Denied::Unauthenticated(
                    "a bearer token is required (Authorization: Bearer, or `murmur dashboard`)"
                        .into(),
                ));
            };
            let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            let identity = self
                .identities
                .try_get_with(hash, self.review_token(token, hash))
                .await
                .map_err(|e| (*e).clone())?;
            identity.map(Caller::User).map_err(Denied::Unauthenticated)
        })
    }

    fn allows<'a>(
        &'a self,
        caller: &'a Caller,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<bool, Denied>> {
        Box::pin(async move {
            let Caller::User(user) = caller else {
                return Ok(false);
            };
            self.decisions
                .try_get_with(
                    (user.token_hash, action.clone()),
                    self.review_access(user, action),
                )
                .await
                .map_err(|e| (*e).clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn status(authenticated: bool, audiences: &[&str], user: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            user: user.map(|name| UserInfo {
                username: Some(name.into()),
                groups: Some(vec!["team-a".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_review_names_the_user_or_refuses_the_token() {
        let user = identity(status(true, &[], Some("alice")), &[], [1; 32]).unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.as_slice()),
            ("alice", &["team-a".to_string()][..])
        );
        assert_eq!(user.token_hash, [1; 32]);
        assert!(identity(status(false, &[], Some("alice")), &[], [1; 32]).is_err());
        assert!(identity(status(true, &[], None), &[], [1; 32]).is_err());
    }

    /// A mocked API server that answers TokenReviews (token `alice-token` is alice, others
    /// unknown) and SubjectAccessReviews (alice may get jobs in `team-a` only), counting them.
    fn api_server() -> (Client, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let path = request.uri().path().to_string();
                let body: serde_json::Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                log.lock().unwrap().push(body.clone());
                let mut answer = body.clone();
                if path == "/apis/authentication.k8s.io/v1/tokenreviews" {
                    answer["status"] = if body["spec"]["token"] == "alice-token" {
                        serde_json::json!({"authenticated": true, "user": {"username": "alice", "groups": ["team-a"]}})
                    } else {
                        serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
                    };
                } else if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews" {
                    let attributes = &body["spec"]["resourceAttributes"];
                    let allowed =
                        body["spec"]["user"] == "alice" && attributes["namespace"] == "team-a";
                    answer["status"] = serde_json::json!({"allowed": allowed});
                } else {
                    send.send_response(
                        Response::builder().status(500).body(Body::empty()).unwrap(),
                    );
                    continue;
                }
                send.send_response(
                    Response::builder()
                        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), seen)
    }

    fn get_job(namespace: &str) -> Action {
        Action::GetJob {
            namespace: namespace.into(),
            name: "mnist".into(),
        }
    }

    /// The reviews go to the API server as the kubelet's would, and each answer is asked once
    /// while it is cached: a dashboard polling every second costs two reviews, not two a second.
    #[tokio::test]
    async fn tokens_and_reads_are_reviewed_by_the_cluster_once_per_cache_lifetime() {
        let (client, seen) = api_server();
        let access = ClusterAccess::new(client, Vec::new());
        let caller = access.authenticate(Some("alice-token")).await.unwrap();
        let Caller::User(user) = &caller else {
            panic!("{caller:?}")
        };
        assert_eq!(user.name, "alice");
        assert!(access.allows(&caller, &get_job("team-a")).await.unwrap());
        assert!(!access.allows(&caller, &get_job("team-b")).await.unwrap());
        let reviews = seen.lock().unwrap().clone();
        assert_eq!(reviews.len(), 3);
        assert_eq!(reviews[0]["kind"], "TokenReview");
        assert!(reviews[0]["spec"].get("audiences").is_none());
        assert_eq!(reviews[1]["kind"], "SubjectAccessReview");
        assert_eq!(
            reviews[1]["spec"],
            serde_json::json!({"user": "alice", "groups": ["team-a"], "extra": {},
                "resourceAttributes": {"verb": "get", "group": "murmur.dev",
                    "resource": "decentralizedtrainingjobs", "namespace": "team-a", "name": "mnist"}})
        );
        for _ in 0..5 {
            let again = access.authenticate(Some("alice-token")).await.unwrap();
            assert!(access.allows(&again, &get_job("team-a")).await.unwrap());
            assert!(!access.allows(&again, &get_job("team-b")).await.unwrap());
        }
        assert_eq!(seen.lock().unwrap().len(), 3, "answered from the cache");
        // Refused tokens are cached too (briefly), and never reach authorisation.
        for _ in 0..3 {
            let refused = access
                .authenticate(Some("mallory-token"))
                .await
                .unwrap_err();
            assert!(matches!(refused, Denied::Unauthenticated(_)), "{refused:?}");
        }
        assert!(matches!(
            access.authenticate(None).await,
            Err(Denied::Unauthenticated(_))
        ));
        let reviews = seen.lock().unwrap().clone();
        assert_eq!(reviews.len(), 4);
        // Only the token's hash is kept.
        assert!(!format!("{:?}", caller).contains("alice-token"));
        // /metrics is asked about as a non-resource URL.
        assert!(!access.allows(&caller, &Action::GetMetrics).await.unwrap());
        let reviews = seen.lock().unwrap().clone();
        assert_eq!(
            reviews[4]["spec"]["nonResourceAttributes"],
            serde_json::json!({"verb": "get", "path": "/metrics"})
        );
    }

    #[tokio::test]
    async fn a_cluster_that_cannot_answer_is_unavailable_and_not_cached() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let answers = tokio::spawn(async move {
            for _ in 0..2 {
                let (_, send) = handle.next_request().await.unwrap();
                send.send_response(Response::builder().status(500).body(Body::empty()).unwrap());
            }
        });
        let access = ClusterAccess::new(Client::new(service, "default"), vec!["murmur".into()]);
        for _ in 0..2 {
            let e = access.authenticate(Some("t")).await.unwrap_err();
            assert!(
                matches!(&e, Denied::Unavailable(m) if m.contains("TokenReview")),
                "{e:?}"
            );
        }
        answers.await.unwrap();
    }

    #[test]
    fn a_token_for_another_audience_is_refused_when_audiences_are_set() {
        let wanted = vec!["murmur".to_string()];
        assert!(identity(status(true, &["murmur", "x"], Some("a")), &wanted, [0; 32]).is_ok());
        let refused = identity(status(true, &["kubernetes"], Some("a")), &wanted, [0; 32]);
        assert!(refused.unwrap_err().contains("murmur"));
    }
}
