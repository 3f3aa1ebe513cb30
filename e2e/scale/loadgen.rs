//! The scale harness's trainers (`e2e/scale/run.sh`): for every running member pod of a job, what
//! a trainer does on the control plane and nothing else. It reads the job key from the job's
//! Secret, posts a signed join report once the pod runs, follows the member's topology view on
//! its view stream as a trainer does, and posts a signed status at a trainer's cadence. Pods
//! are kwok's, so no training runs: the operator, the API server and the control endpoint see a
//! real job's traffic. Its figures are rewritten to `--out` as JSON every second.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::runtime::watcher;
use murmur::runtime::kube::resources::{LABEL_ATTEMPT, LABEL_JOB, LABEL_MEMBER, secret_name};
use murmur_core::contract::control::{self, Envelope};
use murmur_core::contract::view_stream;
use murmur_core::contract::{
    JoinReport, MemberView, TopologyDocument, TrainerState, TrainerStatus,
};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

#[derive(Parser)]
struct Args {
    /// The operator's control endpoint, as trainers reach it.
    #[arg(long)]
    control: String,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    job: String,
    /// The job's `replicas.target`: figures say when this many pods exist, run, and have views.
    #[arg(long)]
    members: u64,
    /// Seconds between a member's status posts (a trainer posts one per evaluation).
    #[arg(long, default_value_t = 10.0)]
    status_every: f64,
    /// Where the figures go, rewritten every second.
    #[arg(long)]
    out: PathBuf,
    /// What members follow: their own views, or the whole document (as trainers did before
    /// views; for a before/after comparison with an operator that serves no views).
    #[arg(long, value_enum, default_value = "view")]
    follow: Follow,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Follow {
    View,
    Document,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the members have done so far. Times are Unix milliseconds, 0 until they happen.
#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Figures {
    pods: u64,
    running: u64,
    joined: u64,
    with_view: u64,
    /// When `members` pods first existed at once.
    all_pods_at_ms: u64,
    all_running_at_ms: u64,
    /// When the last member to join first sent its join report. Not when a post was
    /// answered: an answer the load generator timed out on was often taken, and the view
    /// came before the retry's answer.
    last_join_at_ms: u64,
    /// When every member of the first wave held a view.
    all_views_at_ms: u64,
    views_received: u64,
    view_bytes: u64,
    statuses_posted: u64,
    /// Refused or failed posts and polls, by what went wrong.
    errors: BTreeMap<String, u64>,
}

struct Shared {
    args: Args,
    http: reqwest::Client,
    key: Vec<u8>,
    figures: Mutex<Figures>,
}

impl Shared {
    fn error(&self, what: String) {
        *self.figures.lock().errors.entry(what).or_default() += 1;
    }
}

/// One member attempt's signed requests.
struct Member {
    shared: Arc<Shared>,
    id: u32,
    attempt: u32,
    sequence: AtomicU64,
}

impl Member {
    fn signed(
        &self,
        request: reqwest::RequestBuilder,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> reqwest::RequestBuilder {
        let envelope = Envelope {
            attempt: self.attempt,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            time_ms: unix_ms(),
        };
        control::signed_headers(&self.shared.key, method, path, &envelope, body)
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value))
    }

    /// POST `body` to `path`, signed, until it is accepted (posts of one member go one at a time,
    /// as a trainer's do).
    async fn post<T: Serialize>(&self, path: &str, body: &T, what: &str) {
        let bytes = serde_json::to_vec(body).expect("plain structs");
        let mut wait = Duration::from_millis(200);
        loop {
            let url = format!("{}{path}", self.shared.args.control);
            let request = self
                .shared
                .http
                .post(url)
                .header("content-type", "application/json")
                .timeout(Duration::from_secs(10));
            match self
                .signed(request, "POST", path, &bytes)
                .body(bytes.clone())
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => self
                    .shared
                    .error(format!("{what}: HTTP {}", r.status().as_u16())),
                Err(e) => self.shared.error(format!("{what}: {}", kind(&e))),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    /// The member's views on one view stream (as a trainer follows them), each with its bytes,
    /// until the operator ends the stream (`Ok`) or it fails.
    async fn view_stream(
        &self,
        after: u64,
        mut on_view: impl FnMut(MemberView, usize),
    ) -> Result<(), String> {
        let a = &self.shared.args;
        let path = control::view_path(&a.namespace, &a.job, self.id);
        let request = self
            .shared
            .http
            .get(format!("{}{path}?after={after}", a.control))
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, view_stream::PROTOCOL);
        let wait = Duration::from_secs(control::LONG_POLL_HOLD_SECONDS + 15);
        let r = tokio::time::timeout(wait, self.signed(request, "GET", &path, &[]).send())
            .await
            .map_err(|_| "view: timeout".to_string())?
            .map_err(|e| format!("view: {}", kind(&e)))?;
        if r.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(format!("view: HTTP {}", r.status().as_u16()));
        }
        let mut io = r
            .upgrade()
            .await
            .map_err(|e| format!("view: {}", kind(&e)))?;
        let mut frames = view_stream::Frames::default();
        let mut read = vec![0; 16 * 1024];
        loop {
            while let Some(frame) = frames.next_frame().map_err(|_| "view: bad frame")? {
                if let view_stream::Frame::View { signature, body } = frame {
                    let text = self.verified(&path, &body, &signature)?;
                    on_view(
                        MemberView::parse(text).map_err(|e| format!("view: {e}"))?,
                        body.len(),
                    );
                }
            }
            let n = tokio::time::timeout(wait, io.read(&mut read))
                .await
                .map_err(|_| "view: silent stream".to_string())?
                .map_err(|_| "view: stream".to_string())?;
            if n == 0 {
                return Ok(());
            }
            frames.push(&read[..n]);
        }
    }

    /// One long-poll of the whole document, made into the member's view: the view and the
    /// bytes received, or None (nothing newer).
    async fn document_after(&self, after: u64) -> Result<Option<(MemberView, usize)>, String> {
        let a = &self.shared.args;
        let path = control::topology_path(&a.namespace, &a.job);
        let request = self
            .shared
            .http
            .get(format!("{}{path}?after={after}", a.control))
            .timeout(Duration::from_secs(control::LONG_POLL_HOLD_SECONDS + 15));
        let r = self
            .signed(request, "GET", &path, &[])
            .send()
            .await
            .map_err(|e| format!("view: {}", kind(&e)))?;
        match r.status().as_u16() {
            204 => Ok(None),
            200 => {
                let signature = r
                    .headers()
                    .get(control::SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .unwrap_or_default();
                let body = r.bytes().await.map_err(|e| format!("view: {}", kind(&e)))?;
                let text = self.verified(&path, &body, &signature)?;
                let doc = TopologyDocument::parse(text).map_err(|e| format!("document: {e}"))?;
                Ok(Some((MemberView::of(&doc, self.id), body.len())))
            }
            code => Err(format!("view: HTTP {code}")),
        }
    }

    /// A served topology's text, if the job key signed it.
    fn verified<'a>(&self, path: &str, body: &'a [u8], signature: &str) -> Result<&'a str, String> {
        if !control::verify_topology(&self.shared.key, path, body, signature) {
            return Err("view: bad signature".into());
        }
        std::str::from_utf8(body).map_err(|_| "view: not UTF-8".to_string())
    }

    /// Join, then follow the view for good.
    async fn follow(self: Arc<Self>) {
        let a = &self.shared.args;
        // A shard's histogram: mostly one class, as a non-IID partition gives.
        let histogram: Vec<u64> = (0..10)
            .map(|c| if c == self.id % 10 { 400 } else { 10 })
            .collect();
        let report = JoinReport {
            member_id: self.id,
            label_histogram: histogram,
            proxy_vector: None,
        };
        let join_path = control::join_path(&a.namespace, &a.job, self.id);
        let sent = unix_ms();
        self.post(&join_path, &report, "join").await;
        {
            let mut f = self.shared.figures.lock();
            f.joined += 1;
            f.last_join_at_ms = f.last_join_at_ms.max(sent);
        }
        let mut seen = Seen::default();
        loop {
            let after = seen.after;
            let mut received = |view, bytes| self.received(&mut seen, view, bytes, &report);
            let followed = match a.follow {
                Follow::View => self.view_stream(after, received).await,
                Follow::Document => self
                    .document_after(after)
                    .await
                    .map(|got| got.map_or((), |(view, bytes)| received(view, bytes))),
            };
            if let Err(e) = followed {
                self.shared.error(e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// Count a view the member received; a view that leaves it out sends its join again, as a
    /// trainer does (the operator that took the join may not have kept it for this attempt).
    fn received(
        self: &Arc<Self>,
        seen: &mut Seen,
        view: MemberView,
        bytes: usize,
        report: &JoinReport,
    ) {
        let a = &self.shared.args;
        let mut f = self.shared.figures.lock();
        if !seen.inside && !view.outside {
            seen.inside = true;
            f.with_view += 1;
            if f.with_view == a.members && f.all_views_at_ms == 0 {
                f.all_views_at_ms = unix_ms();
            }
        }
        f.views_received += 1;
        f.view_bytes += bytes as u64;
        seen.after = view.version;
        if view.outside {
            drop(f);
            let member = self.clone();
            let path = control::join_path(&a.namespace, &a.job, self.id);
            let report = report.clone();
            tokio::spawn(async move { member.post(&path, &report, "join").await });
        }
    }

    /// A status every `status_every` seconds, the step and accuracy moving on as training does.
    async fn report(self: Arc<Self>) {
        let a = &self.shared.args;
        let every = Duration::from_secs_f64(a.status_every);
        // Spread the members' posts over the period, as trainers started apart would.
        let offset = every.mul_f64(f64::from(self.id % 1000) / 1000.0);
        tokio::time::sleep(offset).await;
        let mut ticks = tokio::time::interval(every);
        let path = control::status_path(&a.namespace, &a.job, self.id);
        for n in 1u64.. {
            ticks.tick().await;
            let mut status = TrainerStatus::new(self.id, TrainerState::Training);
            status.progress.step = n * 50;
            status.progress.accuracy = Some(1.0 - 0.9 / (n as f64 + 1.0));
            self.post(&path, &status, "status").await;
            self.shared.figures.lock().statuses_posted += 1;
        }
    }
}

/// What a member has seen of its views.
#[derive(Default)]
struct Seen {
    after: u64,
    inside: bool,
}

/// A short name for what went wrong with a request.
fn kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "transport"
    }
}

fn label(pod: &Pod, key: &str) -> Option<u32> {
    pod.metadata.labels.as_ref()?.get(key)?.parse().ok()
}

/// A member attempt's tasks, stopped when its pod goes.
struct Running {
    attempt: u32,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    let name = secret_name(&args.job);
    let key = loop {
        if let Some(s) = secrets.get_opt(&name).await?
            && let Some(key) = s.data.as_ref().and_then(|d| d.get("peer-key"))
        {
            break key.0.clone();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pods: Api<Pod> = Api::namespaced(client, &args.namespace);
    let selector = format!("{LABEL_JOB}={}", args.job);
    let shared = Arc::new(Shared {
        // Idle connections dropped as a trainer's client drops them.
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(
                murmur_core::contract::control::CONNECTION_IDLE_SECONDS - 1,
            ))
            .build()?,
        key,
        figures: Mutex::default(),
        args,
    });
    let writer = {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let json = serde_json::to_vec(&*shared.figures.lock()).expect("figures");
                let out = &shared.args.out;
                let tmp = out.with_extension("tmp");
                if std::fs::write(&tmp, json).is_ok() {
                    let _ = std::fs::rename(&tmp, out);
                }
            }
        })
    };

    let mut members: BTreeMap<u32, Running> = BTreeMap::new();
    let mut existing: BTreeMap<String, bool> = BTreeMap::new();
    let mut events = std::pin::pin!(watcher(pods, watcher::Config::default().labels(&selector)));
    while let Some(event) = events.next().await {
        let (pod, gone) = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
            Ok(watcher::Event::Delete(p)) => (p, true),
            Ok(_) => continue,
            Err(e) => {
                shared.error(format!("watch: {e}"));
                continue;
            }
        };
        let (Some(id), Some(attempt)) = (label(&pod, LABEL_MEMBER), label(&pod, LABEL_ATTEMPT))
        else {
            continue;
        };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let running = !gone
            && pod.metadata.deletion_timestamp.is_none()
            && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if gone {
            existing.remove(&pod_name);
        } else {
            existing.insert(pod_name, running);
        }
        {
            let mut f = shared.figures.lock();
            f.pods = existing.len() as u64;
            f.running = existing.values().filter(|r| **r).count() as u64;
            if f.pods >= shared.args.members && f.all_pods_at_ms == 0 {
                f.all_pods_at_ms = unix_ms();
            }
            if f.running >= shared.args.members && f.all_running_at_ms == 0 {
                f.all_running_at_ms = unix_ms();
            }
        }
        match members.get(&id) {
            Some(r) if r.attempt == attempt && running => {}
            Some(r) if r.attempt > attempt => {}
            _ if running => {
                let member = Arc::new(Member {
                    shared: shared.clone(),
                    id,
                    attempt,
                    sequence: AtomicU64::new(unix_ms() * 1000),
                });
                let tasks = [
                    tokio::spawn(member.clone().follow()),
                    tokio::spawn(member.report()),
                ];
                members.insert(id, Running { attempt, tasks });
            }
            Some(r) if r.attempt == attempt => {
                members.remove(&id);
            }
            _ => {}
        }
    }
    writer.abort();
    Ok(())
}
