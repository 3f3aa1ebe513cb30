//! The trainer's side of the control endpoint: join report, status and peer events, and the
//! topology: the member's own view from its view stream, or the whole document from long-polls
//! or from a file. Every request is signed with the job key over an [`Envelope`] whose
//! sequence number increases, so a captured post is refused if replayed; posts go one at a time,
//! so they arrive in the order they were numbered. A served topology is followed only if it
//! carries the job key's signature.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use serde::Serialize;
use tokio::sync::watch;

use murmur_core::contract::control::Envelope;
use murmur_core::contract::{DocumentError, MemberView, TopologyDocument, control, view_stream};
use tokio::io::AsyncReadExt;

const FILE_POLL: Duration = Duration::from_millis(500);

/// How long an answer or a view stream's next frame may take: the server holds a long-poll, or
/// sends a stream's next frame, within [`control::LONG_POLL_HOLD_SECONDS`].
const FRAME_WAIT: Duration = Duration::from_secs(control::LONG_POLL_HOLD_SECONDS + 10);

/// How long the control plane may take to answer a view stream's upgrade: it answers at once.
const OPEN_WAIT: Duration = Duration::from_secs(10);

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

    /// Follow this member's view on one view stream ([`view_stream`]), handing each newer one
    /// to `on_view`, until the control plane ends the stream or it fails, or say that no frame
    /// came. A control plane that does not stream answers as a long-poll: that answer's view, if
    /// any, and `Ended`.
    async fn view_stream(
        &self,
        after: u64,
        mut on_view: impl FnMut(MemberView),
    ) -> Result<Streamed, String> {
        let path = control::view_path(&self.namespace, &self.job, self.member);
        let url = format!("{}{path}?after={after}", self.base);
        let request = self
            .http
            .get(&url)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, view_stream::PROTOCOL);
        let request = self.signed(request, "GET", &path, &[]).send();
        // The control plane answers an upgrade at once: one that is held, or whose connection
        // is lost before its first frame, is a stream this path does not carry.
        let opened = tokio::time::timeout(OPEN_WAIT, async {
            let response = request.await.map_err(|e| Opening::Failed(e.to_string()))?;
            match response.status().as_u16() {
                101 => {}
                200 | 204 | 304 => return Err(Opening::Answered(response)),
                code => return Err(Opening::Failed(format!("HTTP {code}"))),
            }
            response
                .upgrade()
                .await
                .map_err(|e| Opening::Failed(e.to_string()))
        })
        .await;
        let mut io = match opened {
            Ok(Ok(io)) => io,
            Err(_) => {
                return Ok(Streamed::NoFrame(format!(
                    "{url}: no answer to the upgrade in {OPEN_WAIT:?}"
                )));
            }
            Ok(Err(Opening::Failed(e))) => return Ok(Streamed::NoFrame(format!("{url}: {e}"))),
            Ok(Err(Opening::Answered(response))) => {
                if let Some(view) = self
                    .answer(&url, &path, response, MemberView::parse)
                    .await?
                {
                    on_view(view);
                }
                return Ok(Streamed::Ended);
            }
        };
        let mut frames = view_stream::Frames::default();
        let mut read = vec![0; 16 * 1024];
        let mut any = false;
        // What went wrong, after a frame (an error: the stream is opened again after a backoff)
        // or before one (the path does not carry streams).
        let failed = |any: bool, why: String| {
            if any {
                Err(format!("{url}: {why}"))
            } else {
                Ok(Streamed::NoFrame(format!("{url}: {why}")))
            }
        };
        loop {
            loop {
                match frames.next_frame() {
                    Ok(None) => break,
                    Ok(Some(frame)) => {
                        any = true;
                        if let view_stream::Frame::View { signature, body } = frame {
                            on_view(self.verified(
                                &url,
                                &path,
                                &body,
                                Some(&signature),
                                MemberView::parse,
                            )?);
                        }
                    }
                    Err(e) => return failed(any, e.to_string()),
                }
            }
            let n = match tokio::time::timeout(FRAME_WAIT, io.read(&mut read)).await {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return failed(any, e.to_string()),
                Err(_) => {
                    return failed(
                        any,
                        format!("the view stream was silent for {FRAME_WAIT:?}"),
                    );
                }
            };
            match n {
                0 if any => return Ok(Streamed::Ended),
                0 => return failed(any, "the view stream closed before its first frame".into()),
                n => frames.push(&read[..n]),
            }
        }
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
        let request = self.http.get(&url).timeout(FRAME_WAIT);
        let response = self
            .signed(request, "GET", path, &[])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        self.answer(&url, path, response, parse).await
    }

    /// A long-poll's answer: the newer value (200), or `None` (204, 304).
    async fn answer<T>(
        &self,
        url: &str,
        path: &str,
        response: reqwest::Response,
        parse: fn(&str) -> Result<T, DocumentError>,
    ) -> Result<Option<T>, String> {
        match response.status().as_u16() {
            204 | 304 => Ok(None),
            200 => {
                let signature = response
                    .headers()
                    .get(control::SIGNATURE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let body = response.bytes().await.map_err(|e| e.to_string())?;
                self.verified(url, path, &body, signature.as_deref(), parse)
                    .map(Some)
            }
            code => Err(format!("{url}: HTTP {code}")),
        }
    }

    /// `body` parsed, if `signature` is the job key's over `path` and it.
    fn verified<T>(
        &self,
        url: &str,
        path: &str,
        body: &[u8],
        signature: Option<&str>,
        parse: fn(&str) -> Result<T, DocumentError>,
    ) -> Result<T, String> {
        if !signature.is_some_and(|sig| control::verify_topology(&self.key, path, body, sig)) {
            return Err(format!(
                "{url}: refused a topology without the job key's signature \
                 (forged, altered, or another job's)"
            ));
        }
        let text = std::str::from_utf8(body).map_err(|e| format!("{url}: {e}"))?;
        parse(text).map_err(|e| format!("{url}: {e}"))
    }
}

/// How a view stream ended.
#[derive(Debug, PartialEq)]
enum Streamed {
    /// After its frames, or as a long-poll's answer.
    Ended,
    /// Without a frame, and why: the upgrade was held, refused or lost, or the stream closed or
    /// failed before its first frame (what a proxy that answers for the control plane but does
    /// not carry upgraded connections does), or the control plane could not be reached. The
    /// long-poll that follows says which.
    NoFrame(String),
}

/// What opening a view stream met, short of a stream.
enum Opening {
    /// A long-poll's answer: a control plane that does not stream.
    Answered(reqwest::Response),
    /// No answer, an error, or an upgrade whose connection was lost.
    Failed(String),
}

/// Where the topology comes from.
#[derive(Clone)]
pub enum TopologySource {
    /// A document on disk, re-read when it changes (bare metal, tests).
    File(PathBuf),
    /// The control endpoint: the member's view stream, or long-polls of the whole document.
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
    if let TopologySource::Control(client) = &source
        && !whole
    {
        return follow_view_stream(client, &tx).await;
    }
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
                TopologySource::Control(client) => Ok(client
                    .document_after(after)
                    .await?
                    .map(|doc| Followed::of(doc, me))),
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
        if let Some(followed) = followed {
            publish(&tx, followed);
        }
        if matches!(source, TopologySource::File(_)) {
            tokio::time::sleep(FILE_POLL).await;
        }
    }
}

/// Member `me`'s views from the control endpoint's view stream, forever: a stream that ends is
/// opened again at once, one that fails after a backoff. A stream that brings no frame (its
/// upgrade held, refused or lost, or closed before its first frame) is followed by one
/// long-poll, so a proxy that does not carry upgraded connections slows the views down to
/// long-polls but does not stop them.
async fn follow_view_stream(client: &ControlClient, tx: &watch::Sender<Option<Arc<Followed>>>) {
    let mut last_error = String::new();
    let mut delays = backoff().without_max_times().build();
    let mut warned = false;
    let follow = |view| {
        publish(
            tx,
            Followed {
                view,
                document: None,
            },
        )
    };
    loop {
        let after = tx.borrow().as_ref().map_or(0, |f| f.view.version);
        let streamed = match client.view_stream(after, follow).await {
            Ok(Streamed::NoFrame(why)) => {
                if !warned {
                    tracing::warn!(
                        error = %why,
                        "no frame on the view stream (a proxy that does not carry upgraded \
                         connections?); long-polling between attempts"
                    );
                    warned = true;
                }
                client
                    .view_after(after)
                    .await
                    .map(|view| view.map_or((), follow))
            }
            other => other.map(drop),
        };
        match streamed {
            Ok(()) => {
                last_error.clear();
                delays = backoff().without_max_times().build();
            }
            Err(e) => {
                // Said once per distinct error, not once per retry.
                if e != last_error {
                    tracing::warn!(error = %e, "cannot read the topology; keeping the last one and retrying");
                    last_error = e;
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(10));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Follow `followed` if it is newer than what `tx` holds.
fn publish(tx: &watch::Sender<Option<Arc<Followed>>>, followed: Followed) {
    if tx
        .borrow()
        .as_ref()
        .is_none_or(|f| followed.view.version > f.view.version)
    {
        let view = &followed.view;
        tracing::info!(version = view.version, kind = %view.kind, "new topology");
        let _ = tx.send(Some(Arc::new(followed)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Query;
    use axum::http::{HeaderMap, StatusCode, Uri, header};
    use axum::response::IntoResponse;
    use murmur_core::topology::{self, BuildSpec, MemberProfile};

    const KEY: &[u8] = b"the job key";

    #[derive(serde::Deserialize)]
    struct After {
        after: u64,
    }

    /// A proxy that answers for the control plane but does not carry upgraded connections says
    /// 101 and closes (`hold` false), or holds the upgrade request (`hold` true); it answers
    /// plain long-polls. Where it listens, and the version of the view it serves.
    async fn proxy_without_upgrades(hold: bool) -> (String, u64) {
        let profiles: Vec<MemberProfile> = (0..3).map(MemberProfile::bare).collect();
        let ring = topology::build(
            &BuildSpec::new(murmur_core::api::TopologyKind::Ring),
            &profiles,
        )
        .unwrap();
        let doc = ring.to_document(|id| Some(format!("127.0.0.1:{}", 7000 + id)));
        let version = doc.version;
        let view = move |headers: HeaderMap, uri: Uri, Query(q): Query<After>| {
            let doc = doc.clone();
            async move {
                if headers.contains_key(header::UPGRADE) {
                    if hold {
                        std::future::pending::<()>().await;
                    }
                    let upgrade = [
                        (header::CONNECTION, "upgrade"),
                        (header::UPGRADE, view_stream::PROTOCOL),
                    ];
                    return (StatusCode::SWITCHING_PROTOCOLS, upgrade).into_response();
                }
                if q.after >= doc.version {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return StatusCode::NO_CONTENT.into_response();
                }
                let body = serde_json::to_vec(&MemberView::of(&doc, 0)).unwrap();
                let signature = control::topology_signature(KEY, uri.path(), &body);
                ([(control::SIGNATURE_HEADER, signature)], body).into_response()
            }
        };
        let app = axum::Router::new().route(
            "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/topology",
            axum::routing::get(view),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (base, version)
    }

    /// The trainer follows its view through such a proxy, by long-poll.
    async fn follows_through(hold: bool) {
        let (base, version) = proxy_without_upgrades(hold).await;
        let client = ControlClient::new(&base, "ml", "j", (0, 0), Arc::new(KEY.to_vec()));
        let (tx, mut rx) = watch::channel(None);
        let following = tokio::spawn(follow(TopologySource::Control(client), 0, false, tx));
        let within = OPEN_WAIT + Duration::from_secs(10);
        let followed = tokio::time::timeout(within, rx.wait_for(Option::is_some))
            .await
            .expect("no view through a proxy without upgrades")
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!(followed.view.version, version);
        assert_eq!(followed.view.neighbours.len(), 2);
        following.abort();
    }

    #[tokio::test]
    async fn a_view_stream_closed_before_its_first_frame_is_followed_by_a_long_poll() {
        follows_through(false).await;
    }

    #[tokio::test]
    async fn a_view_stream_whose_upgrade_is_held_is_followed_by_a_long_poll() {
        follows_through(true).await;
    }
}
