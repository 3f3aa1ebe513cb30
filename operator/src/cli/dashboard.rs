//! `murmur dashboard`: the operator's dashboard in the user's browser, as the user.
//!
//! It reads the user's kubeconfig (as kubectl does), listens on loopback, and forwards each
//! browser request to the operator through the API server's service proxy. The API server
//! authenticates the user for that hop (and RBAC must grant `get services/proxy` on the
//! operator's Service: the chart grants it); the operator then authenticates the same user again
//! from the bearer token this command adds ([`FORWARDED_TOKEN_HEADER`]: the API server drops
//! `Authorization` before proxying) and shows only the jobs they may `get`.
//!
//! The local listener is a credential-bearing proxy, so it admits only the browser it opened:
//! the URL it prints carries a random secret, exchanged once for a `SameSite=Strict`, `HttpOnly`
//! cookie; requests without it, or with a `Host` other than the listener's own (DNS
//! rebinding), are refused; only `GET` is forwarded. The threat model is in docs/security.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{self, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use clap::Args;
use kube::config::{AuthInfo, ExecConfig, KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;
use serde::Deserialize;

use super::CliError;
use crate::status::access::FORWARDED_TOKEN_HEADER;

#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// The job to open (default: the first the dashboard lists).
    pub job: Option<String>,
    /// The job's namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The kubeconfig to read (default: $KUBECONFIG's files, else ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Where the operator's Service is (the chart's release namespace).
    #[arg(long, default_value = "murmur-system")]
    pub operator_namespace: String,
    /// The operator's Service.
    #[arg(long, default_value = "murmur-operator")]
    pub service: String,
    /// The name of the Service's port.
    #[arg(long, default_value = "http")]
    pub port_name: String,
    /// Send this file's bearer token instead of the kubeconfig's credentials (for users who
    /// authenticate with a client certificate, which cannot be forwarded).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The local address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub address: SocketAddr,
    /// Print the address without opening a browser.
    #[arg(long)]
    pub no_browser: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("kubeconfig: {0}")]
    Client(#[from] kube::Error),
    #[error(
        "kubeconfig user {user:?} authenticates with a client certificate, which the API server \
         does not forward and cannot be sent on as a bearer token; pass --token-file with a token \
         (an exec plugin's, or `kubectl create token` for a ServiceAccount bound to your role)"
    )]
    ClientCertificate { user: String },
    #[error(
        "kubeconfig user {user:?} has no bearer token, token file or exec plugin (auth-provider \
         entries are not supported: use the provider's exec plugin); or pass --token-file"
    )]
    NoToken { user: String },
    #[error("{0}")]
    Exec(String),
    #[error("--token-file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--address {0}: only a loopback address may serve your credentials")]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Where the user's bearer token comes from, read again when it may have changed.
enum Credentials {
    Token(String),
    /// Re-read each time: projected and rotated token files change under us.
    File(PathBuf),
    /// Run again once the last credential expires (or after a minute when it says nothing).
    Exec {
        config: Box<ExecConfig>,
        cached: parking_lot::Mutex<Option<(String, Instant)>>,
    },
}

impl Credentials {
    fn of(args: &DashboardArgs, user: &str, auth: &AuthInfo) -> Result<Self, DashboardError> {
        if let Some(path) = &args.token_file {
            return Ok(Credentials::File(path.clone()));
        }
        if let Some(token) = &auth.token {
            return Ok(Credentials::Token(token.expose_secret().to_string()));
        }
        if let Some(path) = &auth.token_file {
            return Ok(Credentials::File(path.into()));
        }
        if let Some(config) = &auth.exec {
            return Ok(Credentials::Exec {
                config: Box::new(config.clone()),
                cached: parking_lot::Mutex::new(None),
            });
        }
        if auth.client_certificate.is_some() || auth.client_certificate_data.is_some() {
            return Err(DashboardError::ClientCertificate { user: user.into() });
        }
        Err(DashboardError::NoToken { user: user.into() })
    }

    fn token(&self) -> Result<String, DashboardError> {
        match self {
            Credentials::Token(token) => Ok(token.clone()),
            Credentials::File(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|source| DashboardError::TokenFile {
                    path: path.clone(),
                    source,
                }),
            Credentials::Exec { config, cached } => {
                let mut cached = cached.lock();
                if let Some((token, until)) = cached.as_ref()
                    && Instant::now() < *until
                {
                    return Ok(token.clone());
                }
                let (token, lifetime) = exec_credential(config)?;
                *cached = Some((token.clone(), Instant::now() + lifetime));
                Ok(token)
            }
        }
    }
}

/// Run a kubeconfig exec plugin (client.authentication.k8s.io ExecCredential): its token, and
/// how long to keep it (until a minute before it expires; a minute when it does not say).
fn exec_credential(config: &ExecConfig) -> Result<(String, Duration), DashboardError> {
    let command = config
        .command
        .as_deref()
        .ok_or_else(|| DashboardError::Exec("kubeconfig exec: no command".into()))?;
    let api_version = config
        .api_version
        .clone()
        .unwrap_or_else(|| "client.authentication.k8s.io/v1".into());
    let mut process = std::process::Command::new(command);
    process.args(config.args.iter().flatten());
    for pair in config.env.iter().flatten() {
        if let (Some(name), Some(value)) = (pair.get("name"), pair.get("value")) {
            process.env(name, value);
        }
    }
    for name in config.drop_env.iter().flatten() {
        process.env_remove(name);
    }
    let info = serde_json::json!({
        "apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": false}
    });
    process.env("KUBERNETES_EXEC_INFO", info.to_string());
    let out = process
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| DashboardError::Exec(format!("kubeconfig exec {command}: {e}")))?;
    if !out.status.success() {
        return Err(DashboardError::Exec(format!(
            "kubeconfig exec {command}: exited with {}",
            out.status
        )));
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        token: Option<String>,
        client_certificate_data: Option<String>,
        expiration_timestamp: Option<k8s_openapi::jiff::Timestamp>,
    }
    #[derive(Deserialize)]
    struct Credential {
        status: Option<Status>,
    }
    let credential: Credential = serde_json::from_slice(&out.stdout).map_err(|e| {
        DashboardError::Exec(format!(
            "kubeconfig exec {command}: not an ExecCredential: {e}"
        ))
    })?;
    let status = credential.status.ok_or_else(|| {
        DashboardError::Exec(format!(
            "kubeconfig exec {command}: the ExecCredential has no status"
        ))
    })?;
    let Some(token) = status.token.filter(|t| !t.is_empty()) else {
        return Err(match status.client_certificate_data {
            Some(_) => DashboardError::Exec(format!(
                "kubeconfig exec {command} returns a client certificate, which cannot be \
                 forwarded as a bearer token; pass --token-file"
            )),
            None => DashboardError::Exec(format!("kubeconfig exec {command}: no token")),
        });
    };
    let lifetime = status
        .expiration_timestamp
        .map(|t| {
            let left = t.duration_since(k8s_openapi::jiff::Timestamp::now());
            Duration::try_from(left)
                .unwrap_or_default()
                .saturating_sub(Duration::from_secs(60))
        })
        .unwrap_or(Duration::from_secs(60));
    Ok((token, lifetime))
}

/// The name of the cookie that admits the browser this command opened.
const COOKIE: &str = "murmur_dashboard";

struct Proxy {
    client: kube::Client,
    credentials: Credentials,
    /// `/api/v1/namespaces/NS/services/http:SVC:PORT/proxy`
    base: String,
    secret: String,
    /// The `Host` values the browser sends for this listener.
    hosts: [String; 2],
}

#[derive(Deserialize)]
struct Login {
    secret: String,
    #[serde(default)]
    job: String,
}

/// Exchange the URL's secret for the cookie, then show the dashboard (at the job, if named).
async fn login(State(proxy): State<Arc<Proxy>>, Query(q): Query<Login>) -> Response {
    if !constant_time_eq(q.secret.as_bytes(), proxy.secret.as_bytes()) {
        return (StatusCode::FORBIDDEN, "wrong or missing secret\n").into_response();
    }
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        proxy.secret
    );
    let target = if q.job.is_empty() {
        "/".to_string()
    } else {
        format!("/#{}", q.job)
    };
    let mut response = Redirect::to(&target).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("hex"),
    );
    response
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a browser request is not forwarded, if it is not.
fn refuse(proxy: &Proxy, request: &Request) -> Option<(StatusCode, &'static str)> {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !proxy.hosts.iter().any(|h| h == host) {
        return Some((StatusCode::FORBIDDEN, "unexpected Host header\n"));
    }
    let admitted = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| {
            c.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_string)
        })
        .any(|v| constant_time_eq(v.as_bytes(), proxy.secret.as_bytes()));
    if !admitted {
        return Some((
            StatusCode::UNAUTHORIZED,
            "open the address `murmur dashboard` printed (it carries the login secret)\n",
        ));
    }
    if request.method() != Method::GET {
        return Some((StatusCode::METHOD_NOT_ALLOWED, "the dashboard only reads\n"));
    }
    None
}

/// Forward a browser request to the operator through the API server, as the user.
async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    if let Some((code, why)) = refuse(&proxy, &request) {
        return (code, why).into_response();
    }
    let token = match proxy.credentials.token() {
        Ok(token) => token,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("{e}\n")).into_response(),
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let upstream = http::Request::get(format!("{}{path}", proxy.base))
        .header(FORWARDED_TOKEN_HEADER, format!("Bearer {token}"))
        .header(header::ACCEPT, "*/*")
        .body(kube::client::Body::empty())
        .expect("a valid request");
    match proxy.client.send(upstream).await {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut response = Response::new(Body::new(body));
            *response.status_mut() = parts.status;
            let next = http::HeaderName::from_static(crate::status::router::NEXT_HEADER);
            for name in [header::CONTENT_TYPE, header::WWW_AUTHENTICATE, next] {
                if let Some(value) = parts.headers.get(&name) {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            response
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            format!("cannot reach the operator through the API server: {e}\n"),
        )
            .into_response(),
    }
}

pub fn run(args: DashboardArgs, out: &mut impl std::io::Write) -> Result<(), CliError> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(serve(args, out))
}

async fn serve(args: DashboardArgs, out: &mut impl std::io::Write) -> Result<(), CliError> {
    if !args.address.ip().is_loopback() {
        return Err(DashboardError::NotLoopback(args.address).into());
    }
    let kubeconfig = match &args.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(DashboardError::from)?;
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .map_err(DashboardError::from)?;
    let user = kubeconfig
        .contexts
        .iter()
        .find(|c| {
            Some(&c.name)
                == args
                    .context
                    .as_ref()
                    .or(kubeconfig.current_context.as_ref())
        })
        .and_then(|c| c.context.as_ref())
        .map(|c| c.user.clone().unwrap_or_default())
        .unwrap_or_default();
    let credentials = Credentials::of(&args, &user, &config.auth_info)?;
    // Fail now, not on the first page: a token that cannot be had is said here.
    credentials.token()?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(DashboardError::from)?;
    let listener = tokio::net::TcpListener::bind(args.address)
        .await
        .map_err(|source| DashboardError::Listen {
            address: args.address,
            source,
        })?;
    let address = listener.local_addr()?;
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let proxy = Arc::new(Proxy {
        client,
        credentials,
        base: format!(
            "/api/v1/namespaces/{}/services/http:{}:{}/proxy",
            args.operator_namespace, args.service, args.port_name
        ),
        secret: secret.clone(),
        hosts: [address.to_string(), format!("localhost:{}", address.port())],
    });
    let job = args
        .job
        .as_ref()
        .map(|j| format!("&job={namespace}/{j}"))
        .unwrap_or_default();
    let url = format!("http://{address}/login?secret={secret}{job}");
    writeln!(out, "dashboard: {url}")?;
    out.flush()?;
    // Said on stderr: whoever reads the address from stdout may stop reading after it.
    eprintln!(
        "serving as kubeconfig user {:?} through service {}/{} (Ctrl-C to stop)",
        if user.is_empty() { "-" } else { &user },
        args.operator_namespace,
        args.service
    );
    if !args.no_browser {
        open_browser(&url);
    }
    let app = Router::new()
        .route("/login", get(login))
        .fallback(forward)
        .with_state(proxy);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// Open `url` in the desktop's browser; say so when there is none.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let opened = std::process::Command::new(opener)
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok();
    if !opened {
        eprintln!("no browser opened ({opener} not found): open the address above");
    }
}
