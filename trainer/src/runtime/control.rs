//! The trainer's side of the control endpoint: join report, status and peer events, and the
//! topology (the member's own view, or the whole document), from the long-poll endpoint or from
//! a file. Every request is signed with the job
//! key over an [`Envelope`] whose sequence number increases, so a captured post is refused if
//! replayed; posts go one at a time, so they arrive in the order they were numbered. A served
//! topology is followed only if it carries the job key's signature.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::{ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::watch;

use murmur_core::contract::control::Envelope;
use murmur_core::contract::{DocumentError, MemberView, TopologyDocument, control};

const FILE_POLL: Duration = Duration::from_millis(500);

/// Retries against the control endpoint: 200 ms, doubling, at most 10 s apart.
fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_factor(2.0)
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[derive(Clone)]
pub struct ControlClient {
    http: reqwest::Client,
    base: String,
    namespace: String,
    job: String,
    member: u32,
    attempt: u32,
    key: Arc<Vec<u8>>,
    /// The last sequence number signed; it starts at the Unix time in microseconds, so a
    /// restarted process of the same attempt counts on from above what it sent before.
    sequence: Arc<AtomicU64>,
    /// Held across each post: one in flight at a time, so they arrive in sequence.
    posting: Arc<tokio::sync::Mutex<()>>,
}

impl ControlClient {
    pub fn new(
        base: &str,
        namespace: &str,
        job: &str,
        (member, attempt): (u32, u32),
        key: Arc<Vec<u8>>,
    ) -> Self {
        Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(3))
                // Before the endpoint closes them.
                .pool_idle_timeout(Duration::from_secs(control::CONNECTION_IDLE_SECONDS - 1))
                .build()
                .expect("a plain HTTP client"),
            base: base.trim_end_matches('/').to_string(),
            namespace: namespace.to_string(),
            job: job.to_string(),
            member,
            attempt,
            key,
            sequence: Arc::new(AtomicU64::new(unix_now().as_micros() as u64)),
            posting: Arc::default(),
        }
    }

    /// The next envelope: a sequence number above every earlier one, and the time now.
    fn envelope(&self) -> Envelope {
        Envelope {
            attempt: self.attempt,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            time_ms: unix_now().as_millis() as u64,
        }
    }

    /// `request` (to `path`, with `body`) signed: the envelope headers and the signature.
    fn signed(
        &self,
        request: reqwest::RequestBuilder,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> reqwest::RequestBuilder {
        control::signed_headers(&self.key, method, path, &self.envelope(), body)
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value))
    }

    /// POST `body` to `path`, signed. Errors are strings for the log: nothing here is fatal.
    async fn post<T: Serialize>(&self, path: &str, body: &T) -> Result<(), String> {
        let bytes = serde_json::to_vec(body).expect("plain structs");
        let _one_at_a_time = self.posting.lock().await;
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(Duration::from_secs(5));
        let response = self
            .signed(request, "POST", path, &bytes)
            .body(bytes)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            let code = response.status();
            let why = response.text().await.unwrap_or_default();
            Err(format!("{path}: HTTP {code} {why}"))
        }
    }

    /// POST until it succeeds or `attempts` run out, backing off between tries.
    pub async fn post_retrying<T: Serialize>(&self, path: &str, body: &T, attempts: u32) -> bool {
        let retries = attempts.max(1) as usize - 1;
        let result = (|| self.post(path, body))
            .retry(backoff().with_max_times(retries))
            .notify(|e, after| {
                tracing::warn!(error = %e, ?after, "control endpoint unreachable; retrying");
            })
            .await;
        if let Err(e) = &result {
            tracing::warn!(error = %e, attempts, "control endpoint unreachable; giving up");
        }
        result.is_ok()
    }

    pub fn join_path(&self) -> String {
        control::join_path(&self.namespace, &self.job, self.member)
    }

    pub fn status_path(&self) -> String {
        control::status_path(&self.namespace, &self.job, self.member)
    }

    pub fn peer_events_path(&self) -> String {
        control::peer_events_path(&self.namespace, &self.job, self.member)
    }

    /// One long-poll of the whole document: one newer than `after`, or `None` when the server
    /// held the request and nothing changed.
    pub async fn document_after(&self, after: u64) -> Result<Option<TopologyDocument>, String> {
        let path = control::topology_path(&self.namespace, &self.job);
        self.signed_get(&path, after, TopologyDocument::parse).await
    }

    /// One long-poll of this member's own view: one newer than `after`, or `None`.
    async fn view_after(&self, after: u64) -> Result<Option<MemberView>, String> {
        let path = control::view_path(&self.namespace, &self.job, self.member);
        self.signed_get(&path, after, MemberView::parse).await
    }

    /// A signed long-poll of `path`. An answer whose signature does not verify under the job
    /// key is refused (an error): whoever answered is not the job's control plane.
    async fn signed_get<T>(
        &self,
        path: &str,
        after: u64,
        parse: fn(&str) -> Result<T, DocumentError>,
    ) -> Result<Option<T>, String> {
        let url = format!("{}{path}?after={after}", self.base);
        let request = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(control::LONG_POLL_HOLD_SECONDS + 10));
        let response = self
            .signed(request, "GET", path, &[])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            204 | 304 => Ok(None),
            200 => {
                let signature = response
                    .headers()
                    .get(control::SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = response.bytes().await.map_err(|e| e.to_string())?;
                if !signature
                    .is_some_and(|sig| control::verify_topology(&self.key, path, &body, &sig))
                {
                    return Err(format!(
                        "{url}: refused a topology without the job key's signature \
                         (forged, altered, or another job's)"
                    ));
                }
                let text = std::str::from_utf8(&body).map_err(|e| format!("{url}: {e}"))?;
                parse(text).map(Some).map_err(|e| format!("{url}: {e}"))
            }
            code => Err(format!("{url}: HTTP {code}")),
        }
    }
}

/// Where the topology comes from.
#[derive(Clone)]
pub enum TopologySource {
    /// A document on disk, re-read when it changes (bare metal, tests).
    File(PathBuf),
    /// The control endpoint's long-polls.
    Control(ControlClient),
}

/// What a trainer follows: its own view, and the whole document where its algorithm's schedule
/// needs it ([`follows_whole_document`](murmur_core::contract::view::follows_whole_document)).
#[derive(Debug)]
pub struct Followed {
    pub view: MemberView,
    pub document: Option<TopologyDocument>,
}

impl Followed {
    /// `me`'s view of `doc`, with the document.
    fn of(doc: TopologyDocument, me: u32) -> Self {
        Self {
            view: MemberView::of(&doc, me),
            document: Some(doc),
        }
    }
}

/// Publish every newer topology into `tx`, forever: member `me`'s view from the control
/// endpoint, or the whole document where `whole` (or where it comes from a file). A source
/// that is unreachable or serves something invalid is retried with backoff; the trainer keeps
/// its last topology.
pub async fn follow(
    source: TopologySource,
    me: u32,
    whole: bool,
    tx: watch::Sender<Option<Arc<Followed>>>,
) {
    loop {
        let after = tx.borrow().as_ref().map_or(0, |f| f.view.version);
        let mut last_error = String::new();
        let fetch = || async {
            match &source {
                TopologySource::File(path) => std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))
                    .and_then(|text| {
                        TopologyDocument::parse(&text)
                            .map_err(|e| format!("{}: {e}", path.display()))
                    })
                    // A file is local: the document is kept whole, for members beyond the view.
                    .map(|doc| (doc.version > after || after == 0).then(|| Followed::of(doc, me))),
                TopologySource::Control(client) if whole => Ok(client
                    .document_after(after)
                    .await?
                    .map(|doc| Followed::of(doc, me))),
                TopologySource::Control(client) => {
                    Ok(client.view_after(after).await?.map(|view| Followed {
                        view,
                        document: None,
                    }))
                }
            }
        };
        // Retried without end: the error arm cannot happen.
        let Ok(followed) = fetch
            .retry(backoff().without_max_times())
            .notify(|e: &String, _| {
                // Said once per distinct error, not once per retry.
                if *e != last_error {
                    tracing::warn!(error = %e, "cannot read the topology; keeping the last one and retrying");
                    last_error = e.clone();
                }
            })
            .await
        else {
            continue;
        };
        if let Some(followed) = followed
            && tx
                .borrow()
                .as_ref()
                .is_none_or(|f| followed.view.version > f.view.version)
        {
            let view = &followed.view;
            tracing::info!(version = view.version, kind = %view.kind, "new topology");
            let _ = tx.send(Some(Arc::new(followed)));
        }
        if matches!(source, TopologySource::File(_)) {
            tokio::time::sleep(FILE_POLL).await;
        }
    }
}
