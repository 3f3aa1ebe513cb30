//! Who may see and do what, on the real cluster, under the operator running in it:
//!
//! - two users (ServiceAccounts `alice` in `team-a`, `bob` in `team-b`), each with the cluster's
//!   `view` role in their namespace only (the chart's job-viewer role aggregates into it), read
//!   the status API through the API server's service proxy: each lists only their own job and
//!   gets 403 on the other's routes; a token the cluster refuses gets 401; `/metrics` needs the
//!   chart's metrics-reader role;
//! - `murmur dashboard` with each user's kubeconfig (a token; an exec plugin) shows each only
//!   their job in headless Chromium, and a client-certificate kubeconfig is refused, saying why;
//! - every trainer request goes through a man in the middle (the operator's `--control-endpoint`
//!   points at it): a captured join and status sent again are refused (409), and a topology it
//!   forges is refused by every trainer; the job trains on and succeeds;
//! - the latency the TokenReview/SubjectAccessReview cache adds, measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use murmur_core::contract::control;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::support::control_plane::{self, ControlPlane};
use crate::support::{binaries, tools};

/// A trainer request the man in the middle saw.
#[derive(Clone, Debug)]
pub struct Captured {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

#[derive(Default)]
struct Middle {
    /// `http://POD_IP:8470`, once the operator runs.
    upstream: Mutex<Option<String>>,
    posts: Mutex<Vec<Captured>>,
    /// Answer topology reads with a newer document signed with another key.
    forge: AtomicBool,
    http: reqwest::Client,
}

/// An HTTP proxy between the trainers and the operator that records their posts and can forge
/// their topology, on this machine at an address pods reach.
pub struct Mitm {
    pub port: u16,
    state: Arc<Middle>,
}

async fn relay(State(m): State<Arc<Middle>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 24)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let Some(upstream) = m.upstream.lock().clone() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(n, _)| *n != "host" && *n != "content-length")
        .filter_map(|(n, v)| Some((n.to_string(), v.to_str().ok()?.to_string())))
        .collect();
    if parts.method == Method::POST {
        m.posts.lock().push(Captured {
            path: path.clone(),
            headers: headers.clone(),
            body: body.clone(),
        });
    }
    let forging = m.forge.load(Ordering::Relaxed) && path.ends_with("/topology");
    // While forging, the current document at once (not a held long-poll), made newer.
    let target = match (forging, parts.uri.path_and_query()) {
        (false, Some(pq)) => format!("{upstream}{pq}"),
        _ => format!("{upstream}{path}"),
    };
    let mut forward = m.http.request(parts.method.clone(), target).body(body);
    for (n, v) in &headers {
        forward = forward.header(n, v);
    }
    let Ok(answer) = forward.send().await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = answer.status();
    let mut out = HeaderMap::new();
    for (n, v) in answer.headers() {
        if n == "content-type" || n == control::SIGNATURE_HEADER {
            out.insert(n.clone(), v.clone());
        }
    }
    let bytes = answer.bytes().await.unwrap_or_default();
    if forging && status == StatusCode::OK {
        let mut doc: Value = serde_json::from_slice(&bytes).unwrap();
        doc["version"] = json!(doc["version"].as_u64().unwrap() + 1000);
        let forged = serde_json::to_vec(&doc).unwrap();
        let signature = control::topology_signature(b"not the job key", &path, &forged);
        out.insert(control::SIGNATURE_HEADER, signature.parse().unwrap());
        return (status, out, forged).into_response();
    }
    (status, out, bytes).into_response()
}

impl Mitm {
    /// Listening on every address, in a thread of its own.
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Middle {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            ..Default::default()
        });
        let app = axum::Router::new()
            .fallback(relay)
            .with_state(state.clone());
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    axum::serve(listener, app).await.unwrap();
                })
        });
        Self { port, state }
    }
}

const TRAINER: &str = "localhost/murmur-trainer:e2e";

fn manifest(namespace: &str, name: &str, members: u32, steps: u32) -> String {
    format!(
        "apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  replicas: {{min: 1, target: {members}, max: {members}}}
  topology: {{kind: ring}}
  algorithm: {{kind: dpsgd}}
  training:
    model: logisticRegression
    dataset: {{source: embedded}}
    partition: {{kind: iid}}
    steps: {steps}
  trainer:
    image: {TRAINER}
    resources: {{cpu: 200m, memory: 256Mi}}
  scheduling: {{capacity: onDemand}}
"
    )
}

/// GET `path` of the operator's status API through the API server's service proxy, as the
/// client's user, forwarding `token` for the operator: (status, body, seconds).
async fn via_proxy(client: &kube::Client, token: Option<&str>, path: &str) -> (u16, String, f64) {
    let url =
        format!("/api/v1/namespaces/murmur-system/services/http:murmur-operator:http/proxy{path}");
    let mut request = http::Request::get(url);
    if let Some(token) = token {
        request = request.header("x-murmur-authorization", format!("Bearer {token}"));
    }
    let started = Instant::now();
    let answer = client
        .send(request.body(kube::client::Body::empty()).unwrap())
        .await
        .unwrap();
    let status = answer.status().as_u16();
    let body = answer.into_body().collect_bytes().await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    (status, String::from_utf8_lossy(&body).into_owned(), seconds)
}

/// GET `url` directly (this machine routes the pods' addresses), with `token`: (status, ms).
async fn direct(http: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, f64) {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let started = Instant::now();
    let status = request.send().await.unwrap().status().as_u16();
    (status, started.elapsed().as_secs_f64() * 1000.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn names(list: &str) -> Vec<String> {
    let jobs: Vec<Value> = serde_json::from_str(list).unwrap_or_else(|e| panic!("{e}: {list}"));
    jobs.iter()
        .map(|j| {
            format!(
                "{}/{}",
                j["namespace"].as_str().unwrap(),
                j["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// A kubeconfig whose user runs an exec plugin that prints `token` (as kubelogin and cloud
/// plugins do).
fn exec_kubeconfig(
    cp: &ControlPlane,
    token_kubeconfig: &std::path::Path,
    token: &str,
) -> std::path::PathBuf {
    let text = std::fs::read_to_string(token_kubeconfig).unwrap();
    let credential = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "status": {"token": token}});
    let plugin = cp.dir.join("exec-plugin.sh");
    std::fs::write(&plugin, format!("#!/bin/sh\necho '{credential}'\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = text
        .lines()
        .position(|l| l.trim_start().starts_with("token:"))
        .unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[user] = format!(
        "    exec: {{apiVersion: client.authentication.k8s.io/v1, command: {}, interactiveMode: Never}}",
        plugin.display()
    );
    let path = cp.dir.join("kubeconfig-exec");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// `murmur dashboard` with `kubeconfig`: its URL (and the process, to stop).
fn dashboard(
    kubeconfig: &std::path::Path,
    namespace: &str,
    job: &str,
) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(binaries().join("murmur"))
        .args([
            "dashboard",
            "--no-browser",
            "-n",
            namespace,
            job,
            "--kubeconfig",
        ])
        .arg(kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    // Read on, so the dashboard never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let url = line
        .strip_prefix("dashboard: ")
        .unwrap_or_else(|| panic!("murmur dashboard said {line:?}"))
        .trim()
        .to_string();
    (child, url)
}

fn pod_logs(cp: &ControlPlane, namespace: &str, pod: &str) -> String {
    String::from_utf8_lossy(&cp.kubectl(&["-n", namespace, "logs", pod]).stdout).into_owned()
}

/// Until `check` answers, polling every half second; panics naming `what` after `within`.
fn until<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = check() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn phase(cp: &ControlPlane, namespace: &str, job: &str) -> Value {
    serde_json::from_str(&cp.kubectl_ok(&["-n", namespace, "get", "dtj", job, "-o", "json"]))
        .unwrap()
}

/// The scenario; its figures as JSON.
pub fn scenario(cp: &ControlPlane, mitm: &Mitm) -> Value {
    let operator_ip = cp.kubectl_ok(&[
        "-n",
        "murmur-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=operator",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    ]);
    let operator = format!("http://{}:8470", operator_ip.trim());
    *mitm.state.upstream.lock() = Some(operator.clone());
    for (namespace, user) in [("team-a", "alice"), ("team-b", "bob")] {
        cp.kubectl_ok(&["create", "namespace", namespace]);
        cp.kubectl_ok(&["-n", namespace, "create", "serviceaccount", user]);
        cp.kubectl_ok(&[
            "-n",
            namespace,
            "create",
            "rolebinding",
            user,
            "--clusterrole=view",
            &format!("--serviceaccount={namespace}:{user}"),
        ]);
    }
    cp.kubectl_ok(&[
        "-n",
        "murmur-system",
        "create",
        "serviceaccount",
        "prometheus",
    ]);
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "prometheus-murmur",
        "--clusterrole=murmur-operator-metrics-reader",
        "--serviceaccount=murmur-system:prometheus",
    ]);
    // Long enough that both trainers still train when the topology is forged below: 20 000
    // steps took 24 s here, and the job was done before the check.
    cp.apply(&manifest("team-a", "a", 2, 60000));
    cp.apply(&manifest("team-b", "b", 1, 200));
    let token = |ns: &str, sa: &str| {
        cp.kubectl_ok(&["-n", ns, "create", "token", sa])
            .trim()
            .to_string()
    };
    let (alice, bob, prometheus) = (
        token("team-a", "alice"),
        token("team-b", "bob"),
        token("murmur-system", "prometheus"),
    );
    let alice_config = cp.service_account_kubeconfig("team-a", "alice");
    let bob_config = cp.service_account_kubeconfig("team-b", "bob");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // A captured join and status, sent again as they were: refused, counted, training goes on.
    until(
        "two statuses of team-a/a captured",
        Duration::from_secs(120),
        || {
            let posts = mitm.state.posts.lock();
            (posts
                .iter()
                .filter(|p| p.path.contains("/jobs/a/members/") && p.path.ends_with("/status"))
                .count()
                >= 2)
                .then_some(())
        },
    );
    let captured: Vec<Captured> = {
        let posts = mitm.state.posts.lock();
        ["/join", "/status"]
            .iter()
            .map(|end| {
                posts
                    .iter()
                    .find(|p| p.path.contains("/jobs/a/members/0") && p.path.ends_with(end))
                    .unwrap_or_else(|| panic!("no {end} of member 0 captured"))
                    .clone()
            })
            .collect()
    };
    let replayed = runtime.block_on(async {
        let http = reqwest::Client::new();
        let mut answers = Vec::new();
        for post in &captured {
            let mut request = http
                .post(format!("{operator}{}", post.path))
                .body(post.body.clone());
            for (n, v) in &post.headers {
                request = request.header(n, v);
            }
            let answer = request.send().await.unwrap();
            let code = answer.status().as_u16();
            answers.push((code, answer.text().await.unwrap()));
        }
        answers
    });
    for ((code, why), post) in replayed.iter().zip(&captured) {
        assert_eq!(*code, 409, "{}: {why}", post.path);
        assert!(why.contains("replayed"), "{why}");
    }

    // From now on the man in the middle forges the topology: every trainer of team-a/a must
    // refuse it and keep its own (checked below, once their held long-polls have come back).
    mitm.state.forge.store(true, Ordering::Relaxed);
    let forged_at = Instant::now();
    let figures = runtime.block_on(async {
        let alice_client = control_plane::client_of(&alice_config).await;
        let bob_client = control_plane::client_of(&bob_config).await;
        let admin = cp.client().await;
        // Both jobs served (and the aggregated view role in place) before anyone looks.
        control_plane::eventually(
            "each user's job served to them",
            Duration::from_secs(120),
            || {
                let (alice_client, alice, bob_client, bob) = (
                    alice_client.clone(),
                    alice.clone(),
                    bob_client.clone(),
                    bob.clone(),
                );
                async move {
                    let a = via_proxy(
                        &alice_client,
                        Some(&alice),
                        "/api/v1/namespaces/team-a/jobs/a",
                    )
                    .await;
                    let b = via_proxy(&bob_client, Some(&bob), "/api/v1/namespaces/team-b/jobs/b")
                        .await;
                    (a.0 == 200 && b.0 == 200).then_some(())
                }
            },
        )
        .await;

        // Each user lists only their own job and is refused the other's routes.
        for (client, token, mine, theirs) in [
            (&alice_client, &alice, "team-a/a", "team-b/b"),
            (&bob_client, &bob, "team-b/b", "team-a/a"),
        ] {
            let (code, list, _) = via_proxy(client, Some(token), "/api/v1/jobs").await;
            assert_eq!(code, 200, "{list}");
            assert_eq!(names(&list), [mine], "{list}");
            let (ns, name) = theirs.split_once('/').unwrap();
            for route in ["", "/events", "/series", "/topology"] {
                let path = format!("/api/v1/namespaces/{ns}/jobs/{name}{route}");
                let (code, why, _) = via_proxy(client, Some(token), &path).await;
                assert_eq!(code, 403, "{path}: {why}");
                let (ns, name) = mine.split_once('/').unwrap();
                let own = format!("/api/v1/namespaces/{ns}/jobs/{name}{route}");
                // 204: no topology yet (the job may be starting).
                let code = via_proxy(client, Some(token), &own).await.0;
                assert!(
                    code == 200 || (code == 204 && route == "/topology"),
                    "{own}: {code}"
                );
            }
        }
        let (code, why, _) = via_proxy(&admin, Some("not-a-token"), "/api/v1/jobs").await;
        assert_eq!(code, 401, "{why}");
        assert_eq!(via_proxy(&admin, None, "/api/v1/jobs").await.0, 401);
        assert_eq!(
            via_proxy(&alice_client, Some(&alice), "/metrics").await.0,
            403
        );
        let (code, metrics, _) = via_proxy(&admin, Some(&prometheus), "/metrics").await;
        assert_eq!(code, 200);
        assert!(metrics.contains("murmur_job_members"), "{metrics}");

        // The latency the reviews add. Cold: a token the operator has not seen (TokenReview and
        // SubjectAccessReview on the way); warm: the same token again (the cache); the probe
        // beside it takes neither. Direct to the pod, and through the API server's proxy.
        let http = reqwest::Client::new();
        let job_url = format!("{operator}/api/v1/namespaces/team-a/jobs/a");
        let mut cold = Vec::new();
        for _ in 0..5 {
            let fresh = token("team-a", "alice");
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (code, ms) = direct(&http, &job_url, Some(&fresh)).await;
            assert_eq!(code, 200);
            cold.push(ms);
        }
        let (mut warm, mut probe, mut warm_proxy, mut probe_proxy) =
            (vec![], vec![], vec![], vec![]);
        for _ in 0..40 {
            // Spaced beyond the observer pacing (200 reads a second): no read waits for a slot.
            tokio::time::sleep(Duration::from_millis(20)).await;
            warm.push(direct(&http, &job_url, Some(&alice)).await.1);
            probe.push(direct(&http, &format!("{operator}/healthz"), None).await.1);
            let path = "/api/v1/namespaces/team-a/jobs/a";
            tokio::time::sleep(Duration::from_millis(20)).await;
            warm_proxy.push(via_proxy(&alice_client, Some(&alice), path).await.2 * 1000.0);
            probe_proxy.push(via_proxy(&alice_client, None, "/healthz").await.2 * 1000.0);
        }
        json!({
            "coldMs": median(cold),
            "warmMs": median(warm),
            "probeMs": median(probe),
            "warmThroughApiServerMs": median(warm_proxy),
            "probeThroughApiServerMs": median(probe_proxy),
        })
    });
    println!("access: review latency {figures}");

    // Every trainer of team-a/a refused the forged topology.
    let trainer_logs = || {
        let pods = cp.kubectl_ok(&["-n", "team-a", "get", "pods", "-o", "name"]);
        pods.lines()
            .map(|pod| format!("{pod}:\n{}", pod_logs(cp, "team-a", pod)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let refusing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        until(
            "both members refusing the forged topology",
            Duration::from_secs(90),
            || {
                let pods = cp.kubectl_ok(&[
                    "-n",
                    "team-a",
                    "get",
                    "pods",
                    "-l",
                    "murmur.dev/job=a",
                    "-o",
                    "name",
                ]);
                let pods: Vec<&str> = pods.lines().collect();
                (pods.len() == 2
                    && pods.iter().all(|pod| {
                        pod_logs(cp, "team-a", pod)
                            .contains("refused a topology without the job key's signature")
                    }))
                .then_some(())
            },
        )
    }));
    if let Err(e) = refusing {
        eprintln!("the trainers' logs:\n{}", trainer_logs());
        std::panic::resume_unwind(e);
    }
    let refused_after = forged_at.elapsed().as_secs_f64();
    mitm.state.forge.store(false, Ordering::Relaxed);

    // The dashboard as each user: a token kubeconfig (alice) and an exec plugin (bob).
    let mut seen = Vec::new();
    if let Some(browser) = tools::chromium() {
        let bob_exec = exec_kubeconfig(cp, &bob_config, &bob);
        for (kubeconfig, namespace, job, other) in [
            (&alice_config, "team-a", "a", "team-b"),
            (&bob_exec, "team-b", "b", "team-a"),
        ] {
            let (mut child, url) = dashboard(kubeconfig, namespace, job);
            let dom = tools::headless(browser, &["--dump-dom"], &url);
            let _ = child.kill();
            assert!(
                dom.contains(&format!("data-key=\"{namespace}/{job}\"")),
                "{namespace}: {dom}"
            );
            assert!(!dom.contains(other), "{namespace} sees {other}: {dom}");
            seen.push(format!("{namespace}/{job}"));
        }
    } else {
        assert!(
            std::env::var_os("MURMUR_REQUIRE_CHROMIUM").is_none(),
            "chromium is not on PATH"
        );
    }
    // The local proxy admits only the browser it opened.
    let (mut child, url) = dashboard(&alice_config, "team-a", "a");
    let base = url.split("/login").next().unwrap().to_string();
    let without = runtime.block_on(async {
        reqwest::get(format!("{base}/api/v1/jobs"))
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    let _ = child.kill();
    assert_eq!(without, 401, "no login cookie");
    // A client certificate cannot be forwarded: said, not served.
    let out = std::process::Command::new(binaries().join("murmur"))
        .args(["dashboard", "--no-browser", "--kubeconfig"])
        .arg(&cp.kubeconfig)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("client certificate") && said.contains("--token-file"),
        "{said}"
    );

    // Training was unaffected: the job succeeds, no restart, its members' later posts accepted.
    let deadline = Instant::now() + Duration::from_secs(600);
    let job = loop {
        let job = phase(cp, "team-a", "a");
        if job["status"]["phase"] == "Succeeded" {
            break job;
        }
        assert!(job["status"]["phase"] != "Failed", "{job:#}");
        assert!(
            Instant::now() < deadline,
            "team-a/a did not finish: {:#}",
            job["status"]
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(job["status"]["restarts"], 0);
    let accuracy = job["status"]["progress"]["accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.8, "{accuracy}");
    let metrics = runtime.block_on(async {
        reqwest::Client::new()
            .get(format!("{operator}/metrics"))
            .bearer_auth(&prometheus)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let count = |endpoint: &str, outcome: &str| {
        let prefix = format!(
            "murmur_control_requests_total{{endpoint=\"{endpoint}\",outcome=\"{outcome}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    assert_eq!(
        count("join", "replayed") + count("status", "replayed"),
        2,
        "{metrics}"
    );
    assert!(count("status", "accepted") > 2, "{metrics}");
    json!({
        "reviewLatency": figures,
        "replayedRefused": replayed.iter().map(|(code, _)| code).collect::<Vec<_>>(),
        "forgedTopologyRefusedWithinSeconds": refused_after,
        "dashboards": seen,
        "jobAccuracy": accuracy,
    })
}
