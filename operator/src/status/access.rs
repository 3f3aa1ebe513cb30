//! Who may read what through the status router. The router asks an [`Access`] who a request's
//! bearer token belongs to and whether that caller may read a job or `/metrics`; `murmur run`
//! answers "the local user, who may read everything" ([`LocalUser`]), the operator asks the
//! cluster (TokenReview and SubjectAccessReview, `runtime::kube::access`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;

/// Where a caller's bearer token may come besides `Authorization`: the API server's service
/// proxy authenticates the caller itself and drops `Authorization` before forwarding, so
/// `murmur dashboard` sends the token in this header too.
pub const FORWARDED_TOKEN_HEADER: &str = "x-murmur-authorization";

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// `murmur run`'s user on this machine.
    LocalUser,
    /// A cluster identity, as a TokenReview named it.
    User(Arc<ClusterUser>),
}

/// A TokenReview's answer: what a SubjectAccessReview needs to ask about the same user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClusterUser {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: Vec<(String, Vec<String>)>,
    /// The hash of the token it was reviewed from: decisions are cached per token.
    pub token_hash: [u8; 32],
}

/// What a caller wants to read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A job's view, events, series or topology: `get` on that `decentralizedtrainingjobs`.
    GetJob { namespace: String, name: String },
    /// `/metrics`: `get` on the non-resource URL, as kube-rbac-proxy asks.
    GetMetrics,
}

/// Why a caller gets no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// 401: no token, or one the cluster does not accept.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403.
    #[error("{0}")]
    Forbidden(String),
    /// 503: the cluster could not be asked.
    #[error("{0}")]
    Unavailable(String),
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let code = match &self {
            Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Denied::Forbidden(_) => StatusCode::FORBIDDEN,
            Denied::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let body = axum::Json(serde_json::json!({"error": self.to_string()}));
        let mut response = (code, body).into_response();
        if code == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"murmur\""),
            );
        }
        response
    }
}

/// Authentication and authorisation for observers (never for trainers, whose requests are
/// signed with the job key).
pub trait Access: Send + Sync {
    /// Who holds `token` (`None`: the request carried none).
    fn authenticate<'a>(&'a self, token: Option<&'a str>) -> BoxFuture<'a, Result<Caller, Denied>>;

    /// Whether `caller` may do `action`.
    fn allows<'a>(
        &'a self,
        caller: &'a Caller,
        action: &'a Action,
    ) -> BoxFuture<'a, Result<bool, Denied>>;
}

/// `murmur run`: the router listens on loopback for the user who started it, who may read
/// everything without credentials.
pub struct LocalUser;

impl Access for LocalUser {
    fn authenticate<'a>(&'a self, _: Option<&'a str>) -> BoxFuture<'a, Result<Caller, Denied>> {
        Box::pin(async { Ok(Caller::LocalUser) })
    }

    fn allows<'a>(&'a self, _: &'a Caller, _: &'a Action) -> BoxFuture<'a, Result<bool, Denied>> {
        Box::pin(async { Ok(true) })
    }
}

/// The bearer token of a request: `Authorization: Bearer T`, else the forwarded header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    [header::AUTHORIZATION.as_str(), FORWARDED_TOKEN_HEADER]
        .into_iter()
        .filter_map(|name| headers.get(name)?.to_str().ok())
        .find_map(|value| {
            let (scheme, token) = value.split_once(' ')?;
            let token = token.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
        })
}

/// Middleware: authenticate the request and hand its [`Caller`] to the handler (401 otherwise).
pub async fn authenticated(
    State(access): State<Arc<dyn Access>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = access.authenticate(bearer_token(request.headers())).await;
    match caller {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(denied) => denied.into_response(),
    }
}

/// `Ok` when `caller` may do `action`; the 403 names what was refused.
pub async fn authorize(
    access: &dyn Access,
    caller: &Caller,
    action: &Action,
) -> Result<(), Denied> {
    if access.allows(caller, action).await? {
        return Ok(());
    }
    let who = match caller {
        Caller::LocalUser => "the local user".to_string(),
        Caller::User(user) => format!("user {:?}", user.name),
    };
    Err(Denied::Forbidden(match action {
        Action::GetJob { namespace, name } => format!(
            "{who} may not get decentralizedtrainingjobs.murmur.dev {name:?} in namespace {namespace:?}"
        ),
        Action::GetMetrics => format!("{who} may not get the non-resource URL /metrics"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_either_header_and_must_be_bearer() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), None);
        headers.insert(header::AUTHORIZATION, "Basic dXNlcjpwdw==".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
        headers.insert(FORWARDED_TOKEN_HEADER, "Bearer forwarded".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("forwarded"));
        headers.insert(header::AUTHORIZATION, "bearer direct ".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("direct"));
        headers.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer_token(&headers), Some("forwarded"));
    }
}
