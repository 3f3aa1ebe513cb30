//! Trainers against a control endpoint (a stub of the local runtime's): signed join reports,
//! a ring until every report is in, then a data-aware topology applied at a round boundary,
//! statuses and peer events, an endpoint that goes away for a while, and one that serves a
//! topology without the job key's signature.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use murmur_core::api::TopologyKind;
use murmur_core::contract::{
    JoinReport, MemberView, PeerEvent, TopologyDocument, TrainerStatus, control,
};
use murmur_core::topology::{self, BuildSpec, MemberProfile};
use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: loopback}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: dCliques, cliqueSize: 2}
  algorithm: {kind: cliqueAveraging, roundTimeout: 2s}
  training:
    model: mlp
    dataset: {source: embedded}
    partition: {kind: classesPerMember, k: 5}
    seed: 5
    batchSize: 32
    optimizer: {kind: sgd, momentum: 0.9}
    learningRate: 0.05
    steps: 400
";

#[derive(Default)]
struct Stub {
    doc: Mutex<Option<TopologyDocument>>,
    changed: tokio::sync::Notify,
    joins: Mutex<Vec<JoinReport>>,
    statuses: Mutex<Vec<TrainerStatus>>,
    events: Mutex<Vec<PeerEvent>>,
    bad_signatures: Mutex<u32>,
    /// The sequence numbers heard, per member, in arrival order.
    sequences: Mutex<std::collections::BTreeMap<u32, Vec<u64>>>,
    down: AtomicBool,
    /// Serve a newer document signed with another key.
    forged: AtomicBool,
    /// Joins answered 204 and then forgotten, as by a leader that stopped leading before it
    /// kept them.
    lost_joins: AtomicU32,
    /// Every join posted, kept or lost.
    joins_posted: AtomicU32,
    /// The document served once a join is kept.
    on_join: Mutex<Option<TopologyDocument>>,
}

#[derive(serde::Deserialize)]
struct After {
    after: u64,
}

/// `doc`, or `member`'s view of it, as the control plane serves it: JSON signed with `key`.
fn signed_document(
    key: &[u8],
    path: &str,
    doc: &TopologyDocument,
    member: Option<u32>,
) -> Response {
    let body = match member {
        Some(id) => serde_json::to_vec(&MemberView::of(doc, id)).unwrap(),
        None => serde_json::to_vec(doc).unwrap(),
    };
    let signature = control::topology_signature(key, path, &body);
    ([(control::SIGNATURE_HEADER, signature)], body).into_response()
}

async fn document_poll(
    State(stub): State<Arc<Stub>>,
    Query(q): Query<After>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    topology_poll(stub, q, uri, headers, None).await
}

async fn view_poll(
    State(stub): State<Arc<Stub>>,
    Path((_, _, id)): Path<(String, String, u32)>,
    Query(q): Query<After>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    topology_poll(stub, q, uri, headers, Some(id)).await
}

/// The whole document, or one member's view of it (each view changes with every document
/// here: the stub keeps no views).
async fn topology_poll(
    stub: Arc<Stub>,
    q: After,
    uri: Uri,
    headers: HeaderMap,
    member: Option<u32>,
) -> Response {
    if stub.down.load(Ordering::Relaxed) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if !signed(&stub, "GET", &uri, &headers, &[]) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if stub.forged.load(Ordering::Relaxed) {
        let mut doc = stub.doc.lock().unwrap().clone().unwrap();
        doc.version = q.after + 1;
        return signed_document(b"not the job key", uri.path(), &doc, member);
    }
    for _ in 0..2 {
        let notified = stub.changed.notified();
        if let Some(doc) = stub.doc.lock().unwrap().clone()
            && doc.version > q.after
        {
            return signed_document(KEY.as_bytes(), uri.path(), &doc, member);
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// Whether the request is signed with the job key; posts' sequence numbers are recorded.
fn signed(stub: &Stub, method: &str, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name)?.to_str().ok();
    match control::check_request(KEY.as_bytes(), method, uri.path(), header, body) {
        Ok(envelope) => {
            if method == "POST" {
                let member = uri.path().split('/').nth(8).unwrap().parse().unwrap();
                let mut sequences = stub.sequences.lock().unwrap();
                sequences.entry(member).or_default().push(envelope.sequence);
            }
            true
        }
        Err(_) => {
            *stub.bad_signatures.lock().unwrap() += 1;
            false
        }
    }
}

async fn join(
    State(stub): State<Arc<Stub>>,
    Path((_, _, id)): Path<(String, String, u32)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if stub.down.load(Ordering::Relaxed) || !signed(&stub, "POST", &uri, &headers, &body) {
        return StatusCode::FORBIDDEN;
    }
    let report: JoinReport = serde_json::from_slice(&body).unwrap();
    assert_eq!(report.member_id, id);
    stub.joins_posted.fetch_add(1, Ordering::SeqCst);
    let lost = stub
        .lost_joins
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if lost.is_ok() {
        return StatusCode::NO_CONTENT;
    }
    if let Some(next) = stub.on_join.lock().unwrap().take() {
        *stub.doc.lock().unwrap() = Some(next);
        stub.changed.notify_waiters();
    }
    let mut joins = stub.joins.lock().unwrap();
    joins.retain(|j| j.member_id != id);
    joins.push(report);
    // Every report in: build the data-aware topology from the histograms alone.
    if joins.len() == 4 {
        let mut doc = stub.doc.lock().unwrap();
        let ring = doc.clone().unwrap();
        let profiles: Vec<MemberProfile> = joins
            .iter()
            .map(|j| MemberProfile {
                id: j.member_id,
                histogram: Some(j.label_histogram.iter().map(|&c| c as f64).collect()),
                proxy: None,
                zone: None,
            })
            .collect();
        let mut spec = BuildSpec::new(murmur_core::api::TopologyKind::DCliques);
        spec.clique_size = 2;
        let cliques = topology::build(&spec, &profiles).unwrap();
        let mut next = cliques.to_document(|id| {
            ring.members
                .iter()
                .find(|m| m.id == id)
                .and_then(|m| m.address.clone())
        });
        next.version = ring.version + 1;
        *doc = Some(next);
        stub.changed.notify_waiters();
    }
    StatusCode::NO_CONTENT
}

async fn status(
    State(stub): State<Arc<Stub>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if stub.down.load(Ordering::Relaxed) || !signed(&stub, "POST", &uri, &headers, &body) {
        return StatusCode::FORBIDDEN;
    }
    stub.statuses
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap());
    StatusCode::NO_CONTENT
}

async fn peer_event(
    State(stub): State<Arc<Stub>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if stub.down.load(Ordering::Relaxed) || !signed(&stub, "POST", &uri, &headers, &body) {
        return StatusCode::FORBIDDEN;
    }
    stub.events
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap());
    StatusCode::NO_CONTENT
}

fn serve(stub: Arc<Stub>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route(
                    "/api/v1/namespaces/{ns}/jobs/{job}/topology",
                    get(document_poll),
                )
                .route(
                    "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/topology",
                    get(view_poll),
                )
                .route(
                    "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/join",
                    post(join),
                )
                .route(
                    "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/status",
                    post(status),
                )
                .route(
                    "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/peer-events",
                    post(peer_event),
                )
                .with_state(stub);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}

/// `job`'s topology file, edited by `edit`, served by a fresh stub: the stub, and the
/// environment that points trainers at it rather than at the file.
fn serve_job_topology(
    job: &LocalJob,
    edit: impl FnOnce(&mut TopologyDocument),
) -> (Arc<Stub>, [(&'static str, String); 2]) {
    let mut doc = job.topology();
    edit(&mut doc);
    let stub = Arc::new(Stub::default());
    *stub.doc.lock().unwrap() = Some(doc);
    let port = serve(stub.clone());
    let env = [
        ("MURMUR_TOPOLOGY_FILE", String::new()),
        (
            "MURMUR_CONTROL_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
    ];
    (stub, env)
}

#[test]
fn trainers_follow_the_control_endpoint_from_a_ring_to_data_aware_cliques() {
    let job = LocalJob::new(4, TopologyKind::Ring, MANIFEST);
    let (stub, env) = serve_job_topology(&job, |_| {});
    let mut procs = Reaper::default();
    for id in 0..4 {
        procs.0.push(job.spawn(id, 0, &env));
    }
    wait_for_or_explain(
        Duration::from_secs(60),
        "the switch to cliques",
        || {
            (0..4).all(|id| {
                job.status(id)
                    .is_some_and(|s| s["topologyVersion"] == 2 && s["step"].as_u64() > Some(20))
            })
        },
        // What each member and the endpoint got to, for a switch that never comes.
        || {
            let joined: Vec<u32> = stub
                .joins
                .lock()
                .unwrap()
                .iter()
                .map(|j| j.member_id)
                .collect();
            let mut seen = format!("joins the endpoint took: {joined:?}\n");
            for id in 0..4 {
                let log = job.log_text(id, 0);
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                seen += &format!("member {id}: status {:?}\n", job.status(id));
                for line in tail.into_iter().rev() {
                    seen += &format!("  {line}\n");
                }
            }
            seen
        },
    );
    // An endpoint that serves a newer topology signed with another key: refused, the old one
    // kept.
    stub.forged.store(true, Ordering::Relaxed);
    wait_for(
        Duration::from_secs(30),
        "every member refusing the forgery",
        || {
            (0..4).all(|id| {
                job.log(id, 0).iter().any(|l| {
                    l["fields"]["error"].as_str().is_some_and(|e| {
                        e.contains("refused a topology without the job key's signature")
                    })
                })
            })
        },
    );
    stub.forged.store(false, Ordering::Relaxed);
    // The endpoint goes away for a while: training goes on on the last topology.
    stub.down.store(true, Ordering::Relaxed);
    let before: Vec<u64> = (0..4).map(|id| job.step(id).unwrap()).collect();
    wait_for(
        Duration::from_secs(20),
        "training while the endpoint is down",
        || (0..4).all(|id| job.step(id).is_some_and(|s| s > before[id as usize] + 30)),
    );
    // Long enough for every member's held poll to come back and fail at least once.
    std::thread::sleep(Duration::from_secs(2));
    stub.down.store(false, Ordering::Relaxed);

    procs.all_succeed(Duration::from_secs(120));
    assert_eq!(*stub.bad_signatures.lock().unwrap(), 0);
    // Each member's posts arrived in the order they were numbered, none twice.
    for (member, sequence) in stub.sequences.lock().unwrap().iter() {
        assert!(
            sequence.windows(2).all(|w| w[0] < w[1]),
            "member {member}: {sequence:?}"
        );
    }
    let joins = stub.joins.lock().unwrap();
    assert_eq!(joins.len(), 4);
    for j in joins.iter() {
        assert_eq!(j.label_histogram.len(), 10);
        assert_eq!(
            j.label_histogram.iter().filter(|&&c| c > 0).count(),
            5,
            "member {} should hold five classes: {:?}",
            j.member_id,
            j.label_histogram
        );
        assert!(
            j.proxy_vector.is_none(),
            "only proxy clumps need proxy vectors"
        );
    }
    let statuses = stub.statuses.lock().unwrap();
    for id in 0..4u32 {
        let last = statuses
            .iter()
            .rfind(|s| s.member_id == id)
            .expect("no status");
        assert_eq!(
            serde_json::to_value(last.state).unwrap(),
            "done",
            "member {id}"
        );
        assert_eq!(last.topology_version, 2);
        assert_eq!(last.progress.step, 400);
        let lines = job.log(id, 0);
        assert!(
            lines.iter().any(|l| l["fields"]["message"]
                == "cannot read the topology; keeping the last one and retrying"),
            "member {id} did not notice the endpoint going away"
        );
    }
}

/// A member that joins a job under way says so before it hears from anyone (state "joining",
/// nothing received): a replacement whose neighbours all finish before they answer it is
/// retired by the control plane on that status, instead of waiting out its startup timeout for
/// members that will never answer.
#[test]
fn a_member_joining_a_job_under_way_says_so_before_it_hears_from_anyone() {
    let job = LocalJob::new(2, TopologyKind::Ring, MANIFEST);
    // The job is at step 200; member 1, its only neighbour, is gone.
    let (stub, env) = serve_job_topology(&job, |doc| doc.step = 200);
    let mut procs = Reaper::default();
    procs.0.push(job.spawn(0, 1, &env));
    wait_for(Duration::from_secs(20), "a status saying it joins", || {
        stub.statuses.lock().unwrap().iter().any(|s| {
            s.member_id == 0
                && serde_json::to_value(s.state).unwrap() == "joining"
                && s.bytes_in == 0
        })
    });
}

/// A member that the topology leaves out posts its join again while it waits, until the control
/// plane keeps one. Here the first two are lost (a leader took them and stopped leading before
/// it kept them), and the successor serves the same version: no newer view comes to answer.
#[test]
fn a_member_left_out_posts_its_join_again_until_the_control_plane_keeps_it() {
    let job = LocalJob::new(2, TopologyKind::Ring, MANIFEST);
    let mut both = job.topology();
    let (stub, env) = serve_job_topology(&job, |doc| {
        doc.members.retain(|m| m.id != 1);
        doc.edges.clear();
        doc.members[0].self_weight = 1.0;
    });
    both.version += 1;
    let version = both.version;
    *stub.on_join.lock().unwrap() = Some(both);
    stub.lost_joins.store(2, Ordering::SeqCst);
    let mut procs = Reaper::default();
    procs.0.push(job.spawn(1, 1, &env));
    wait_for_or_explain(
        Duration::from_secs(40),
        "member 1 in the topology that keeping its join brings",
        || {
            job.log(1, 1).iter().any(|l| {
                l["fields"]["message"] == "following topology" && l["fields"]["version"] == version
            })
        },
        || {
            format!(
                "joins posted: {}, lost: {}\n{}",
                stub.joins_posted.load(Ordering::SeqCst),
                2 - stub.lost_joins.load(Ordering::SeqCst),
                job.log_text(1, 1)
            )
        },
    );
    assert!(stub.joins_posted.load(Ordering::SeqCst) >= 3);
}
