//! The router over a real socket, as trainers, the dashboard and users reach it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use murmur_core::api::parse_manifest;
use murmur_core::contract::control::Envelope;
use murmur_core::contract::{JoinReport, MemberView, TopologyDocument, control, view_stream};
use murmur_core::topology::MemberProfile;

use super::*;
use crate::member::ObservedMember;
use crate::planner::{self, JobState, Observation};

const KEY: &[u8] = b"the job key";

async fn serve() -> (Arc<Hub>, String) {
    serve_paced(pacer::DEFAULT_READS_PER_SECOND).await
}

async fn serve_paced(reads_per_second: u32) -> (Arc<Hub>, String) {
    let hub = Arc::new(Hub::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(hub.clone(), Arc::new(access::LocalUser), reads_per_second);
    tokio::spawn(super::serve(listener, app));
    (hub, base)
}

#[tokio::test]
async fn a_connection_idle_past_the_timeout_is_closed_and_a_long_poll_is_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = router(Arc::new(Hub::default()), Arc::new(access::LocalUser), 0).route(
        "/slow",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            "late"
        }),
    );
    tokio::spawn(serve_closing_idle(
        listener,
        app,
        Duration::from_millis(200),
    ));
    // Read until `until` is in what came, or the connection closes; the bytes read.
    async fn read(stream: &mut tokio::net::TcpStream, until: &str) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "the server neither sent {until:?} nor closed: {:?}",
                        String::from_utf8_lossy(&got)
                    )
                })
                .unwrap_or(0);
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if n == 0 || text.contains(until) {
                return text;
            }
        }
    }
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: murmur\r\n\r\n")
        .await
        .unwrap();
    // Held three times the timeout, the answer still comes.
    let answer = read(&mut stream, "late").await;
    assert!(answer.ends_with("late"), "{answer}");
    // Then idle: closed.
    assert_eq!(
        read(&mut stream, "never").await,
        "",
        "an idle connection stays open"
    );
    // A connection that never sends a request is closed too.
    let mut silent = tokio::net::TcpStream::connect(address).await.unwrap();
    assert_eq!(read(&mut silent, "never").await, "");
}

#[tokio::test]
async fn a_trainers_post_is_answered_and_its_connection_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = router(Arc::new(Hub::default()), Arc::new(access::LocalUser), 0);
    // Idle connections would be held a minute: only the answer's close ends this one.
    tokio::spawn(serve_closing_idle(listener, app, Duration::from_secs(60)));
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let body = "{}";
    let request = format!(
        "POST /api/v1/namespaces/ns/jobs/j/members/0/status HTTP/1.1\r\nhost: murmur\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the connection stayed open after the post was answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Attempt 0's `sequence`-th post, signed now.
fn envelope(sequence: u64) -> Envelope {
    Envelope {
        attempt: 0,
        sequence,
        time_ms: now_ms(),
    }
}

/// A ring of `n` members.
fn ring(n: u32) -> murmur_core::topology::Topology {
    let profiles: Vec<MemberProfile> = (0..n).map(MemberProfile::bare).collect();
    murmur_core::topology::build(
        &murmur_core::topology::BuildSpec::new(murmur_core::api::TopologyKind::Ring),
        &profiles,
    )
    .unwrap()
}

/// `t`'s document, member `id` at `127.0.0.1:7000 + id`.
fn document(t: &murmur_core::topology::Topology) -> TopologyDocument {
    t.to_document(|id| Some(format!("127.0.0.1:{}", 7000 + id)))
}

/// Whether `metrics` count the bytes of views served for job `ml/j`.
fn counts_view_bytes(metrics: &str) -> bool {
    metrics.contains(r#"murmur_topology_served_bytes_total{namespace="ml",job="j",form="view"}"#)
}

fn doc(version: u64) -> TopologyDocument {
    let mut t = ring(3);
    t.version = version;
    document(&t)
}

fn view() -> JobView {
    view_of(|_| ObservedMember::default())
}

/// The view of a two-member job whose members are seen as `seen` says.
fn view_of(seen: impl Fn(u32) -> ObservedMember) -> JobView {
    let spec = parse_manifest(
        "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {name: j}\nspec:\n  replicas: {min: 1, target: 2, max: 2}\n  training: {model: mlp, steps: 10}\n",
        "j.yaml",
    )
    .unwrap()
    .spec;
    let now = Timestamp::from_second(100).unwrap();
    let mut observed = Observation::default();
    let (state, _) = planner::plan(&spec, &JobState::new(now), &observed, now);
    for id in 0..2 {
        observed.members.insert(id, seen(id));
    }
    let (state, _) = planner::plan(&spec, &state, &observed, now);
    view::job_view("ml", "j", &spec, &state, &observed, now)
}

/// A task judged by perplexity shows perplexity, by name, wherever accuracy would be shown.
#[test]
fn a_jobs_progress_names_the_metric_its_task_is_judged_by() {
    let v = view_of(|id| {
        let mut status = murmur_core::contract::TrainerStatus::new(
            id,
            murmur_core::contract::TrainerState::Training,
        );
        status.progress.set_quality(murmur_core::api::NamedMetric {
            name: "perplexity".into(),
            value: [3.0, 5.0][id as usize],
            higher_is_better: false,
        });
        ObservedMember {
            status: Some(Arc::new(status)),
            ..ObservedMember::default()
        }
    });
    let progress = v.status.progress.clone().unwrap();
    assert_eq!(progress.accuracy, None);
    let metric = progress.metric.unwrap();
    assert_eq!((metric.name.as_str(), metric.value), ("perplexity", 4.0));
    let summary = v.summary();
    assert_eq!(summary.accuracy, None);
    assert_eq!(summary.metric.map(|m| m.value), Some(4.0));
}

/// A `method` request of `body` to `path`, signed as a trainer signs it, with `key` over
/// `envelope`.
fn signed_request(
    (method, base, path): (&str, &str, &str),
    key: &[u8],
    envelope: Envelope,
    body: &[u8],
) -> reqwest::RequestBuilder {
    let request = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("{base}{path}"))
        .body(body.to_vec());
    control::signed_headers(key, method, path, &envelope, body)
        .into_iter()
        .fold(request, |r, (name, value)| r.header(name, value))
}

/// POST `body` to `path`, signed with `key` over `envelope` when given; the status code.
async fn post(base: &str, path: &str, body: &[u8], signed: Option<(&[u8], Envelope)>) -> u16 {
    let request = match signed {
        Some((key, envelope)) => signed_request(("POST", base, path), key, envelope, body),
        None => reqwest::Client::new()
            .post(format!("{base}{path}"))
            .body(body.to_vec()),
    };
    request.send().await.unwrap().status().as_u16()
}

/// `/metrics` as text.
async fn metrics_text(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn jobs_and_views_are_served_as_json() {
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    let r = reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/j"))
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        503,
        "registered, nothing published yet"
    );
    hub.publish(&job, view());
    let jobs: serde_json::Value = reqwest::get(format!("{base}/api/v1/jobs"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jobs[0]["name"], "j");
    assert_eq!(jobs[0]["phase"], "Pending");
    assert_eq!(jobs[0]["members"], "0/2");
    let r = reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/j"))
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: JobView = r.json().await.unwrap();
    assert_eq!(v, view());
    assert_eq!(v.members.len(), 2);
    // A newer view replaces the served one (its JSON is written once per publish).
    let mut newer = view();
    newer.status.preemptions = 3;
    hub.publish(&job, newer.clone());
    let v: JobView = reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/j"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v, newer);
    let missing = reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/nope"))
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    let text = missing.text().await.unwrap();
    assert!(text.contains("no job ml/nope"), "{text}");
    // Events and samples page with `from`.
    for k in 0..3 {
        job.record(SeriesPoint {
            t: k as f64,
            member: 0,
            attempt: 0,
            progress: murmur_core::api::Progress {
                step: k,
                loss: Some(1.0),
                accuracy: None,
                metric: None,
                consensus_distance: None,
            },
        });
    }
    let later: Vec<SeriesPoint> =
        reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/j/series?from=1"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(
        later.iter().map(|p| p.progress.step).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let page = reqwest::get(format!("{base}/")).await.unwrap();
    assert!(page.text().await.unwrap().contains("<svg id=\"graph\""));
}

#[tokio::test]
async fn the_topology_long_poll_answers_with_a_newer_document_or_no_content() {
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    let url = format!("{base}{}", control::topology_path("ml", "j"));
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status().as_u16(), 204, "no document yet");
    job.set_topology(doc(1));
    let got: TopologyDocument = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(got.version, 1);
    // A held poll is answered when version 2 appears.
    let waiting = tokio::spawn({
        let url = format!("{url}?after=1");
        async move { reqwest::get(&url).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    job.set_topology(doc(2));
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<TopologyDocument>().await.unwrap().version, 2);
    // Versions never go back.
    job.set_topology(doc(1));
    let got: TopologyDocument = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(got.version, 2);
}

/// Each member long-polls its own view: a change that does not touch it does not wake it, and
/// one that does brings only its neighbours, not the graph.
#[tokio::test]
async fn a_members_view_wakes_only_for_changes_that_touch_it() {
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    let mut ring = ring(6);
    let url = |id: u32| format!("{base}{}", control::view_path("ml", "j", id));
    assert_eq!(reqwest::get(url(0)).await.unwrap().status().as_u16(), 204);
    job.set_topology(document(&ring));
    let first: MemberView = reqwest::get(url(0)).await.unwrap().json().await.unwrap();
    let ids: Vec<u32> = first.neighbours.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![1, 5]);
    assert_eq!(
        first.neighbours[0].address.as_deref(),
        Some("127.0.0.1:7001")
    );
    let poll = |id: u32, after: u64| {
        let url = format!("{}?after={after}", url(id));
        tokio::spawn(async move { reqwest::get(&url).await.unwrap() })
    };
    let waiting = poll(0, first.version);
    tokio::time::sleep(Duration::from_millis(200)).await;
    ring.remove_member(3).unwrap();
    job.set_topology(document(&ring));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "member 3 leaving does not touch member 0's view"
    );
    // Member 3 itself hears that it is out.
    let out: MemberView = reqwest::get(url(3)).await.unwrap().json().await.unwrap();
    assert!(out.outside && out.neighbours.is_empty());
    ring.remove_member(1).unwrap();
    job.set_topology(document(&ring));
    let r = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    let next: MemberView = r.json().await.unwrap();
    assert_eq!(next.version, ring.version);
    let ids: Vec<u32> = next.neighbours.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![2, 5]);
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(counts_view_bytes(&metrics), "{metrics}");
}

#[tokio::test]
async fn only_signed_posts_for_the_right_member_reach_the_runtime() {
    let (hub, base) = serve().await;
    let (_job, mut inbox) = hub.register("ml", "j", KEY.to_vec());
    let report = JoinReport {
        member_id: 1,
        label_histogram: vec![5; 10],
        proxy_vector: None,
    };
    let body = serde_json::to_vec(&report).unwrap();
    let path = control::join_path("ml", "j", 1);
    assert_eq!(post(&base, &path, &body, None).await, 401);
    let forged: &[u8] = b"another key";
    assert_eq!(
        post(&base, &path, &body, Some((forged, envelope(1)))).await,
        401
    );
    let other = control::join_path("ml", "j", 2);
    assert_eq!(
        post(&base, &other, &body, Some((KEY, envelope(2)))).await,
        400
    );
    let junk = b"{\"memberId\": \"one\"}";
    assert_eq!(
        post(&base, &path, junk, Some((KEY, envelope(3)))).await,
        400
    );
    let unknown = control::join_path("ml", "other", 1);
    assert_eq!(
        post(&base, &unknown, &body, Some((KEY, envelope(4)))).await,
        404
    );
    assert!(inbox.try_recv().is_err(), "nothing got through");
    assert_eq!(
        post(&base, &path, &body, Some((KEY, envelope(5)))).await,
        204
    );
    assert_eq!(inbox.recv().await.unwrap(), Inbound::Join(report));
    let metrics = metrics_text(&base).await;
    assert!(
        metrics.contains(
            "murmur_control_requests_total{endpoint=\"join\",outcome=\"badSignature\"} 2"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("murmur_control_requests_total{endpoint=\"join\",outcome=\"accepted\"} 1")
    );
}

/// A captured post sent again, an older one sent late, one from an attempt already replaced, or
/// one signed too long ago: each is refused with a reason and counted, and only the first copy
/// reaches the runtime.
#[tokio::test]
async fn replayed_reordered_and_stale_posts_are_refused_and_counted() {
    let (hub, base) = serve().await;
    let (_job, mut inbox) = hub.register("ml", "j", KEY.to_vec());
    let status =
        murmur_core::contract::TrainerStatus::new(1, murmur_core::contract::TrainerState::Training);
    let body = serde_json::to_vec(&status).unwrap();
    let path = control::status_path("ml", "j", 1);
    let captured = envelope(10);
    assert_eq!(post(&base, &path, &body, Some((KEY, captured))).await, 204);
    assert_eq!(inbox.recv().await.unwrap(), Inbound::Status(status.clone()));
    let answer = |envelope: Envelope| {
        let request = signed_request(("POST", &base, &path), KEY, envelope, &body);
        async move {
            let r = request.send().await.unwrap();
            let code = r.status().as_u16();
            let why = r
                .json::<serde_json::Value>()
                .await
                .map(|v| v["error"].to_string());
            (code, why.unwrap_or_default())
        }
    };
    let (code, why) = answer(captured).await;
    assert_eq!(code, 409);
    assert!(why.contains("replayed or reordered: sequence 10"), "{why}");
    assert_eq!(answer(envelope(9)).await.0, 409, "reordered");
    assert_eq!(answer(envelope(11)).await.0, 204, "the next one");
    assert_eq!(
        answer(Envelope {
            attempt: 1,
            ..envelope(1)
        })
        .await
        .0,
        204,
        "a newer attempt"
    );
    let (code, why) = answer(envelope(12)).await;
    assert_eq!(code, 409, "attempt 0 was replaced");
    assert!(why.contains("older than attempt 1"), "{why}");
    let stale = Envelope {
        attempt: 1,
        sequence: 2,
        time_ms: now_ms() - control::MAX_CLOCK_SKEW_MS - 60_000,
    };
    let (code, why) = answer(stale).await;
    assert_eq!(code, 400);
    assert!(why.contains("stale"), "{why}");
    for _ in 0..2 {
        assert!(matches!(inbox.recv().await, Some(Inbound::Status(_))));
    }
    assert!(
        inbox.try_recv().is_err(),
        "refused posts never reach the runtime"
    );
    let metrics = metrics_text(&base).await;
    for (outcome, n) in [("accepted", 3), ("replayed", 3), ("stale", 1)] {
        let line = format!(
            "murmur_control_requests_total{{endpoint=\"status\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

/// Trainers read the topology with a signed, fresh request, and the document comes signed with
/// the job key; a request signed with another key, or unsigned from outside, is refused.
#[tokio::test]
async fn the_topology_is_signed_and_served_to_signed_trainers() {
    let (hub, base) = serve_with(Arc::new(Fixed)).await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    job.set_topology(doc(3));
    let path = control::topology_path("ml", "j");
    let read = |key: &'static [u8], envelope: Envelope| {
        let request = signed_request(("GET", &base, &path), key, envelope, &[]);
        async move { request.send().await.unwrap() }
    };
    let r = read(KEY, envelope(1)).await;
    assert_eq!(r.status().as_u16(), 200);
    let signature = r.headers()[control::SIGNATURE_HEADER]
        .to_str()
        .unwrap()
        .to_string();
    let body = r.bytes().await.unwrap();
    assert!(control::verify_topology(KEY, &path, &body, &signature));
    assert_eq!(
        TopologyDocument::parse(std::str::from_utf8(&body).unwrap())
            .unwrap()
            .version,
        3
    );
    // Reads are not sequenced (the long-poll runs beside the posts), only fresh.
    assert_eq!(read(KEY, envelope(1)).await.status().as_u16(), 200);
    assert_eq!(
        read(b"another key", envelope(2)).await.status().as_u16(),
        401
    );
    let stale = Envelope {
        time_ms: 1,
        ..envelope(3)
    };
    assert_eq!(read(KEY, stale).await.status().as_u16(), 400);
    // Without a signature it is an observer's read: a token, and the right to get the job.
    let anonymous = reqwest::get(format!("{base}{path}")).await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
}

/// An [`access::Access`] with fixed answers: token `alice` may get jobs in namespace `a`,
/// `bob` in `b` and `/metrics`; every other token is refused.
struct Fixed;

impl access::Access for Fixed {
    fn authenticate<'a>(
        &'a self,
        token: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<access::Caller, access::Denied>> {
        Box::pin(async move {
            match token {
                Some(name @ ("alice" | "bob")) => {
                    Ok(access::Caller::User(Arc::new(access::ClusterUser {
                        name: name.into(),
                        ..Default::default()
                    })))
                }
                _ => Err(access::Denied::Unauthenticated("who?".into())),
            }
        })
    }

    fn allows<'a>(
        &'a self,
        caller: &'a access::Caller,
        action: &'a access::Action,
    ) -> futures::future::BoxFuture<'a, Result<bool, access::Denied>> {
        Box::pin(async move {
            let access::Caller::User(user) = caller else {
                return Ok(false);
            };
            Ok(match (user.name.as_str(), action) {
                ("alice", access::Action::GetJob { namespace, .. }) => namespace == "a",
                ("bob", access::Action::GetJob { namespace, .. }) => namespace == "b",
                ("bob", access::Action::GetMetrics) => true,
                _ => false,
            })
        })
    }
}

async fn serve_with(access: Arc<dyn access::Access>) -> (Arc<Hub>, String) {
    let hub = Arc::new(Hub::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(hub.clone(), access, pacer::DEFAULT_READS_PER_SECOND);
    tokio::spawn(super::serve(listener, app));
    (hub, base)
}

/// Each caller lists only the jobs they may get, gets 403 on the others' routes (whether or not
/// the job exists), 401 without a token they hold; the probes stay open.
#[tokio::test]
async fn observers_see_only_the_jobs_they_may_get() {
    let (hub, base) = serve_with(Arc::new(Fixed)).await;
    for ns in ["a", "b"] {
        let (job, _inbox) = hub.register(ns, "j", KEY.to_vec());
        let mut v = view();
        v.namespace = ns.into();
        hub.publish(&job, v);
        job.set_topology(doc(1));
    }
    let client = reqwest::Client::new();
    let get = |token: Option<&'static str>, path: String, header: &'static str| {
        let mut request = client.get(format!("{base}{path}"));
        if let Some(token) = token {
            request = request.header(header, format!("Bearer {token}"));
        }
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    for (token, mine, theirs) in [("alice", "a", "b"), ("bob", "b", "a")] {
        for header in ["authorization", access::FORWARDED_TOKEN_HEADER] {
            let (code, list) = get(Some(token), "/api/v1/jobs".into(), header).await;
            assert_eq!(code, 200);
            let list: Vec<serde_json::Value> = serde_json::from_str(&list).unwrap();
            assert_eq!(list.len(), 1, "{token}: {list:?}");
            assert_eq!(list[0]["namespace"], mine);
            for route in ["", "/events", "/series", "/topology"] {
                let own = format!("/api/v1/namespaces/{mine}/jobs/j{route}");
                assert_eq!(
                    get(Some(token), own, header).await.0,
                    200,
                    "{token} {route}"
                );
                let other = format!("/api/v1/namespaces/{theirs}/jobs/j{route}");
                let (code, why) = get(Some(token), other, header).await;
                assert_eq!(code, 403, "{token} {route}");
                assert!(why.contains(&format!("may not get decentralizedtrainingjobs.murmur.dev \\\"j\\\" in namespace \\\"{theirs}\\\"")), "{why}");
            }
            let missing = format!("/api/v1/namespaces/{theirs}/jobs/nope");
            assert_eq!(
                get(Some(token), missing, header).await.0,
                403,
                "existence is not told"
            );
        }
    }
    assert_eq!(
        get(Some("alice"), "/metrics".into(), "authorization")
            .await
            .0,
        403
    );
    assert_eq!(
        get(Some("bob"), "/metrics".into(), "authorization").await.0,
        200
    );
    for path in [
        "/",
        "/api/v1/jobs",
        "/metrics",
        "/api/v1/openapi.json",
        "/api/v1/namespaces/a/jobs/j",
    ] {
        for token in [None, Some("mallory")] {
            assert_eq!(
                get(token, path.into(), "authorization").await.0,
                401,
                "{path} {token:?}"
            );
        }
    }
    let r = client
        .get(format!("{base}/api/v1/jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"murmur\"");
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(get(None, probe.into(), "authorization").await.0, 200);
    }
}

#[tokio::test]
async fn metrics_follow_the_published_view() {
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    hub.publish(&job, view());
    let metrics = metrics_text(&base).await;
    assert!(metrics.contains("murmur_job_target_members{namespace=\"ml\",job=\"j\"} 2"));
    assert!(metrics.contains("murmur_job_preemptions{namespace=\"ml\",job=\"j\"} 0"));
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_with_generated_schemas() {
    let (_hub, base) = serve().await;
    let doc: serde_json::Value = reqwest::get(format!("{base}/api/v1/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/jobs",
        "/api/v1/namespaces/{namespace}/jobs/{name}",
        "/api/v1/namespaces/{namespace}/jobs/{name}/topology",
        "/api/v1/namespaces/{namespace}/jobs/{name}/members/{id}/join",
    ] {
        assert!(paths.contains_key(p), "{p}");
    }
    // Paced reads say they may be refused; the trainers' long-poll is never paced.
    assert!(
        paths["/api/v1/namespaces/{namespace}/jobs/{name}"]["get"]["responses"]["429"].is_object()
    );
    assert!(paths["/metrics"]["get"]["responses"]["429"].is_object());
    assert!(
        paths["/api/v1/namespaces/{namespace}/jobs/{name}/topology"]["get"]["responses"]["429"]
            .is_null()
    );
    // Observer reads say who may make them; trainers' posts say how they are signed.
    let job = &paths["/api/v1/namespaces/{namespace}/jobs/{name}"]["get"];
    assert_eq!(job["security"], serde_json::json!([{"bearer": []}]));
    assert!(job["responses"]["403"].is_object());
    let status = &paths["/api/v1/namespaces/{namespace}/jobs/{name}/members/{id}/status"]["post"];
    let headers: Vec<&str> = status["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        headers,
        [
            control::ATTEMPT_HEADER,
            control::SEQUENCE_HEADER,
            control::TIME_HEADER,
            control::SIGNATURE_HEADER
        ]
    );
    assert!(status["responses"]["409"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for s in [
        "JobView",
        "MemberView",
        "TopologyDocument",
        "JoinReport",
        "TrainerStatus",
    ] {
        assert!(schemas.contains_key(s), "{s} in {:?}", schemas.keys());
    }
    // Every reference resolves.
    let text = doc.to_string();
    for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &r[..r.find('"').unwrap()];
        assert!(schemas.contains_key(name), "dangling $ref {name}");
    }
}

#[test]
fn a_status_is_sampled_only_when_its_step_or_accuracy_changed() {
    let hub = Hub::default();
    let (job, _inbox) = hub.register("ml", "j", b"key".to_vec());
    let status = |step: u64, accuracy: Option<f64>| murmur_core::contract::TrainerStatus {
        progress: murmur_core::api::Progress {
            step,
            accuracy,
            ..Default::default()
        },
        topology_version: 1,
        ..murmur_core::contract::TrainerStatus::new(
            1,
            murmur_core::contract::TrainerState::Training,
        )
    };
    job.sample(1.0, 0, &status(10, None));
    job.sample(1.5, 0, &status(10, None));
    job.sample(2.0, 0, &status(10, Some(0.9)));
    job.sample(2.5, 1, &status(10, Some(0.9)));
    let steps: Vec<(f64, u32, Option<f64>)> = job
        .series(0)
        .0
        .iter()
        .map(|p| (p.t, p.attempt, p.progress.accuracy))
        .collect();
    assert_eq!(
        steps,
        vec![(1.0, 0, None), (2.0, 0, Some(0.9)), (2.5, 1, Some(0.9))]
    );
}

#[tokio::test]
async fn a_standby_is_ready_and_says_it_does_not_lead() {
    let (hub, base) = serve().await;
    let get = |path: &'static str| {
        let base = base.clone();
        async move {
            let r = reqwest::get(format!("{base}{path}")).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(
        get("/readyz").await,
        (200, "leading\n".into()),
        "murmur run leads at once"
    );
    hub.set_role(Role::Starting);
    assert_eq!(get("/readyz").await.0, 503);
    assert_eq!(
        get("/healthz").await.0,
        200,
        "a starting replica is not restarted"
    );
    // Ready, so that a rolling update can go on; the Service selects only the leader.
    hub.set_role(Role::Standby);
    assert_eq!(
        get("/readyz").await,
        (200, "standby: another replica leads\n".into())
    );
    hub.set_role(Role::Leading);
    assert_eq!(get("/readyz").await, (200, "leading\n".into()));
}

#[tokio::test]
async fn the_status_api_is_read_only() {
    let (hub, base) = serve().await;
    let (_handle, mut inbox) = hub.register("ml", "j", KEY.to_vec());
    let client = reqwest::Client::new();
    let job = "/api/v1/namespaces/ml/jobs/j";
    let readable = [
        "/".to_string(),
        "/healthz".into(),
        "/readyz".into(),
        "/metrics".into(),
        "/api/v1/openapi.json".into(),
        "/api/v1/jobs".into(),
        job.into(),
        format!("{job}/topology"),
        format!("{job}/events"),
        format!("{job}/series"),
    ];
    for path in &readable {
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            let answer = client
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), 405, "{method} {path}");
        }
    }
    // The trainers' endpoints take signed POSTs only.
    for kind in ["join", "status", "peer-events"] {
        let path = format!("{job}/members/0/{kind}");
        for method in ["GET", "PUT", "PATCH", "DELETE"] {
            let answer = client
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), 405, "{method} {path}");
        }
        assert_eq!(post(&base, &path, b"{}", None).await, 401, "{path}");
    }
    assert!(inbox.try_recv().is_err(), "nothing reached the runtime");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_reads_are_paced_and_refused_past_the_wait_while_probes_and_trainers_are_not() {
    // 2 reads a second: of a burst of 8, the slots at 0, 0.5 and 1.0 s are within MAX_WAIT.
    let (hub, base) = serve_paced(2).await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    hub.publish(&job, view());
    job.set_topology(doc(1));
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (client, url) = (
                client.clone(),
                format!("{base}/api/v1/namespaces/ml/jobs/j"),
            );
            tokio::spawn(async move { client.get(url).send().await.unwrap() })
        })
        .collect();
    // While the observers queue, the probes and the trainers' topology answer at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probe_started = std::time::Instant::now();
    for path in [
        "/healthz".to_string(),
        "/readyz".to_string(),
        "/api/v1/namespaces/ml/jobs/j/topology".to_string(),
    ] {
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    assert!(
        probe_started.elapsed() < Duration::from_millis(400),
        "unpaced routes waited behind the observers: {:?}",
        probe_started.elapsed()
    );
    let mut served = 0;
    let mut refused = 0;
    for r in burst {
        let r = r.await.unwrap();
        match r.status().as_u16() {
            200 => served += 1,
            429 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let body: serde_json::Value = r.json().await.unwrap();
                assert!(body["error"].as_str().unwrap().contains("paced"), "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((served, refused), (3, 5));
    // The third served read waited for its slot a second after the first.
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn zero_reads_per_second_serves_observers_unpaced() {
    let (hub, base) = serve_paced(0).await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    hub.publish(&job, view());
    let client = reqwest::Client::new();
    // At 2 a second (above) most of these would be refused.
    let burst: Vec<_> = (0..50)
        .map(|_| {
            let (client, url) = (
                client.clone(),
                format!("{base}/api/v1/namespaces/ml/jobs/j"),
            );
            tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
        })
        .collect();
    for r in burst {
        assert_eq!(r.await.unwrap().as_u16(), 200);
    }
}

/// The API server stores whole seconds: a status with fractions would differ from what it read
/// back on every reconcile and be written again (seen against a real API server).
#[test]
fn the_status_carries_whole_seconds_as_the_api_server_stores_them() {
    use crate::planner::{JobState, Observation};
    use k8s_openapi::jiff::Timestamp;
    let spec = murmur_core::api::parse_manifest(
        "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {name: t}\nspec:\n  replicas: {min: 1, target: 1, max: 1}\n  training: {model: mlp, steps: 10}\n",
        "t.yaml",
    )
    .unwrap()
    .spec;
    let t = Timestamp::from_nanosecond(1_800_000_000_123_456_789).unwrap();
    let (state, _) = crate::planner::plan(&spec, &JobState::new(t), &Observation::default(), t);
    let view = crate::status::view::job_view("ns", "t", &spec, &state, &Observation::default(), t);
    let whole = |t: &Timestamp| t.subsec_nanosecond() == 0;
    assert!(
        view.status
            .conditions
            .iter()
            .all(|c| whole(&c.last_transition_time.0))
    );
    assert!(whole(&view.status.start_time.unwrap().0));
    assert!(!state.conditions.is_empty());
}

#[test]
fn a_large_job_lists_the_members_that_need_attention_first_and_counts_the_rest() {
    use murmur_core::api::{MemberPhase, MemberStatus, STATUS_MEMBERS_MAX};
    let member = |id: u32, phase| MemberStatus {
        id,
        phase,
        ..Default::default()
    };
    let few: Vec<MemberStatus> = (0..10)
        .map(|id| member(id, MemberPhase::Training))
        .collect();
    let of = |m: &MemberStatus| (m.id, m.phase);
    assert_eq!(view::listed_members(few.clone(), of), (few, 0));

    // Those needing attention sit past the cap, where id order alone would leave them out.
    let max = STATUS_MEMBERS_MAX as u32;
    let n = max + 500;
    let attention = [max + 100, max + 200, max + 300];
    let many: Vec<MemberStatus> = (0..n)
        .map(|id| match id {
            _ if id == attention[0] => member(id, MemberPhase::Preempted),
            _ if id == attention[1] => member(id, MemberPhase::Pending),
            _ if id == attention[2] => member(id, MemberPhase::Failed),
            _ => member(id, MemberPhase::Training),
        })
        .collect();
    let (listed, omitted) = view::listed_members(many, of);
    assert_eq!(listed.len(), STATUS_MEMBERS_MAX);
    assert_eq!(omitted, 500);
    let ids: Vec<u32> = listed.iter().map(|m| m.id).collect();
    for id in attention {
        assert!(ids.contains(&id), "member {id} needs attention: listed");
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in id order");
    assert_eq!(ids[..3], [0, 1, 2]);
}

#[test]
fn cross_zone_bytes_count_what_a_member_sent_to_peers_in_other_zones() {
    use crate::member::ObservedMember;
    use crate::planner::Observation;
    let member = |zone: Option<&str>, sent_to: &[(u32, u64)]| ObservedMember {
        zone: zone.map(str::to_string),
        status: Some(Arc::new(murmur_core::contract::TrainerStatus {
            topology_version: 1,
            bytes_out: sent_to.iter().map(|(_, b)| b).sum(),
            bytes_sent_to: sent_to.iter().copied().collect(),
            ..murmur_core::contract::TrainerStatus::new(
                0,
                murmur_core::contract::TrainerState::Training,
            )
        })),
        ..Default::default()
    };
    let observed = Observation {
        members: [
            (0, member(Some("a"), &[(1, 100), (2, 30), (3, 7)])),
            (1, member(Some("a"), &[(0, 100)])),
            (2, member(Some("b"), &[(0, 30)])),
            // 3 has no zone (its node has no label): what goes to it is not counted.
            (3, member(None, &[(0, 7)])),
        ]
        .into_iter()
        .collect(),
    };
    let cross = |id| view::cross_zone_bytes(&observed.members[&id], &observed);
    assert_eq!(cross(0), Some(30));
    assert_eq!(cross(1), Some(0));
    assert_eq!(cross(2), Some(30));
    assert_eq!(
        cross(3),
        None,
        "a member without a zone has no cross-zone figure"
    );
}

#[test]
fn a_bounded_log_keeps_its_newest_entries_and_its_indexes() {
    let mut log = super::hub::Bounded::new(3);
    for i in 0..5 {
        log.push(i);
    }
    // 0 and 1 dropped: a reader from 0 gets what is kept, and where to ask next.
    assert_eq!(log.since(0), (vec![2, 3, 4], 5));
    assert_eq!(log.since(3), (vec![3, 4], 5));
    assert_eq!(log.since(5), (vec![], 5));
    log.push(5);
    assert_eq!(log.since(5), (vec![5], 6), "nothing twice, nothing missed");
}

#[test]
fn a_bounded_log_never_holds_room_for_more_than_it_keeps() {
    let mut log = super::hub::Bounded::new(1_000);
    for i in 0..2_500 {
        log.push(i);
        assert!(log.room() <= 1_000, "room for {} after {i}", log.room());
    }
    assert_eq!(log.since(0).0, (1_500..2_500).collect::<Vec<_>>());
}

#[tokio::test]
async fn series_pages_say_where_to_read_next() {
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    for step in 0..3u64 {
        let status = murmur_core::contract::TrainerStatus {
            progress: murmur_core::api::Progress {
                step,
                ..Default::default()
            },
            ..murmur_core::contract::TrainerStatus::new(
                1,
                murmur_core::contract::TrainerState::Training,
            )
        };
        job.sample(step as f64, 0, &status);
    }
    let page = reqwest::get(format!("{base}/api/v1/namespaces/ml/jobs/j/series?from=1"))
        .await
        .unwrap();
    assert_eq!(page.headers()[super::router::NEXT_HEADER], "3");
    let points: Vec<serde_json::Value> = page.json().await.unwrap();
    assert_eq!(points.len(), 2);
}

/// Frames from `trainer` until one whole frame is in, `None` once the stream is closed.
async fn next_frame(
    trainer: &mut (impl tokio::io::AsyncRead + Unpin),
    frames: &mut view_stream::Frames,
) -> Option<view_stream::Frame> {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    loop {
        if let Some(frame) = frames.next_frame().unwrap() {
            return Some(frame);
        }
        let n = tokio::time::timeout(Duration::from_secs(5), trainer.read(&mut buf))
            .await
            .expect("the stream neither sent a frame nor closed")
            .unwrap_or(0);
        if n == 0 {
            return None;
        }
        frames.push(&buf[..n]);
    }
}

/// A view frame's view, its signature checked under the job key over `path`.
fn verified_view(frame: Option<view_stream::Frame>, path: &str) -> MemberView {
    match frame {
        Some(view_stream::Frame::View { signature, body }) => {
            assert!(control::verify_topology(KEY, path, &body, &signature));
            serde_json::from_slice(&body).unwrap()
        }
        other => panic!("expected a view, got {other:?}"),
    }
}

/// A view stream writes each view newer than the one the trainer has, says it is alive when
/// nothing changes, and ends when the member's views end or the trainer says anything.
#[tokio::test]
async fn a_view_stream_sends_each_newer_view_says_it_is_alive_and_ends_with_its_views() {
    use tokio::io::AsyncWriteExt;
    let hub = Arc::new(Hub::default());
    let path = control::view_path("ml", "j", 0);
    let stream = |views| router::ViewStream {
        hub: hub.clone(),
        key: KEY.to_vec(),
        target: ("ml".into(), "j".into()),
        path: path.clone(),
        views,
        quiet: Duration::from_millis(100),
    };
    let (tx, views) = tokio::sync::watch::channel(Some(Arc::new(MemberView::of(&doc(1), 0))));
    let (mut trainer, server) = tokio::io::duplex(64 * 1024);
    let running = tokio::spawn(stream(views).run(server, Some(1)));
    let mut frames = view_stream::Frames::default();
    // The trainer has version 1 already: nothing but the stream being alive.
    assert_eq!(
        next_frame(&mut trainer, &mut frames).await,
        Some(view_stream::Frame::Alive)
    );
    tx.send_replace(Some(Arc::new(MemberView::of(&doc(2), 0))));
    let view = verified_view(next_frame(&mut trainer, &mut frames).await, &path);
    assert_eq!(view.version, 2);
    assert_eq!(view, MemberView::of(&doc(2), 0));
    // An older view is never sent.
    tx.send_replace(Some(Arc::new(MemberView::of(&doc(1), 0))));
    tx.send_replace(Some(Arc::new(MemberView::of(&doc(3), 0))));
    let view = verified_view(next_frame(&mut trainer, &mut frames).await, &path);
    assert_eq!(view.version, 3);
    drop(tx);
    assert_eq!(next_frame(&mut trainer, &mut frames).await, None);
    running.await.unwrap();

    // Without `after`, the current view comes first; a trainer that speaks ends the stream.
    let (_tx, views) = tokio::sync::watch::channel(Some(Arc::new(MemberView::of(&doc(4), 0))));
    let (mut trainer, server) = tokio::io::duplex(64 * 1024);
    let running = tokio::spawn(stream(views).run(server, None));
    let mut frames = view_stream::Frames::default();
    let view = verified_view(next_frame(&mut trainer, &mut frames).await, &path);
    assert_eq!(view.version, 4);
    trainer.write_all(b"hello").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the stream ends when the trainer speaks")
        .unwrap();
    let mut metrics = String::new();
    prometheus_client::encoding::text::encode(&mut metrics, &hub.metrics.registry).unwrap();
    assert!(counts_view_bytes(&metrics), "{metrics}");
}

/// A member's view request with `Upgrade: murmur-view/1` is answered 101 and becomes its view
/// stream, which carries the changes that touch it and closes when the job is gone.
#[tokio::test]
async fn a_view_request_upgraded_to_a_stream_carries_the_members_changes_until_the_job_goes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (hub, base) = serve().await;
    let (job, _inbox) = hub.register("ml", "j", KEY.to_vec());
    let mut ring = ring(6);
    job.set_topology(document(&ring));
    let open = |job: &str| {
        let address = base.trim_start_matches("http://").to_string();
        let path = control::view_path("ml", job, 0);
        async move {
            let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
            let request = format!(
                "GET {path}?after=0 HTTP/1.1\r\nhost: murmur\r\nconnection: upgrade\r\n\
                 upgrade: {}\r\n\r\n",
                view_stream::PROTOCOL
            );
            socket.write_all(request.as_bytes()).await.unwrap();
            // The answer's head, and what came after it.
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let end = loop {
                if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before answering");
                got.extend_from_slice(&buf[..n]);
            };
            let head = String::from_utf8_lossy(&got[..end]).to_string();
            let mut frames = view_stream::Frames::default();
            frames.push(&got[end..]);
            (socket, head, frames)
        }
    };
    let (mut socket, head, mut frames) = open("j").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: murmur-view/1"),
        "{head}"
    );
    let path = control::view_path("ml", "j", 0);
    let first = verified_view(next_frame(&mut socket, &mut frames).await, &path);
    let ids: Vec<u32> = first.neighbours.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![1, 5]);
    // A change that does not touch member 0 sends nothing; one that does sends its view.
    ring.remove_member(3).unwrap();
    job.set_topology(document(&ring));
    ring.remove_member(1).unwrap();
    job.set_topology(document(&ring));
    let next = verified_view(next_frame(&mut socket, &mut frames).await, &path);
    assert_eq!(next.version, ring.version);
    let ids: Vec<u32> = next.neighbours.iter().map(|n| n.id).collect();
    assert_eq!(ids, vec![2, 5]);
    hub.forget("ml", "j");
    drop(job);
    assert_eq!(next_frame(&mut socket, &mut frames).await, None);
    // A job that is not here is answered as any request for it, not upgraded.
    let (_, head, _) = open("other").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

/// A replica that stops leading (told to stop, or its lease lost) ends its view streams and
/// refuses trainers' posts and topology reads with 503: its views no longer change and no
/// reconcile reads its posts, so its trainers must try again and reach the next leader. A join
/// it took with 204 would be lost.
#[tokio::test]
async fn a_replica_that_stops_leading_ends_its_view_streams_and_refuses_trainers() {
    let (hub, base) = serve().await;
    let (job, mut inbox) = hub.register("ml", "j", KEY.to_vec());
    job.set_topology(doc(1));
    let path = control::view_path("ml", "j", 0);
    let (mut trainer, server) = tokio::io::duplex(64 * 1024);
    let running = tokio::spawn(
        router::ViewStream {
            hub: hub.clone(),
            key: KEY.to_vec(),
            target: ("ml".into(), "j".into()),
            path: path.clone(),
            views: job.member_view(0),
            quiet: Duration::from_secs(5),
        }
        .run(server, None),
    );
    let mut frames = view_stream::Frames::default();
    let view = verified_view(next_frame(&mut trainer, &mut frames).await, &path);
    assert_eq!(view.version, 1);

    hub.set_role(Role::Standby);
    assert_eq!(next_frame(&mut trainer, &mut frames).await, None);
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the stream ends when the replica stops leading")
        .unwrap();
    let report = JoinReport {
        member_id: 0,
        label_histogram: vec![5; 10],
        proxy_vector: None,
    };
    let body = serde_json::to_vec(&report).unwrap();
    let join = control::join_path("ml", "j", 0);
    assert_eq!(
        post(&base, &join, &body, Some((KEY, envelope(1)))).await,
        503
    );
    let read = signed_request(("GET", &base, &path), KEY, envelope(2), b"");
    assert_eq!(read.send().await.unwrap().status().as_u16(), 503);
    assert!(inbox.try_recv().is_err(), "nothing reached the runtime");

    // The same join, posted to a replica that leads, is taken.
    hub.set_role(Role::Leading);
    assert_eq!(
        post(&base, &join, &body, Some((KEY, envelope(3)))).await,
        204
    );
    assert_eq!(inbox.recv().await.unwrap(), Inbound::Join(report));
}
