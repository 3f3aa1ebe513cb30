//! What authorisation costs an observer's read once the cluster's answers are cached: one
//! `GET /api/v1/namespaces/ml/jobs/j` through the status router, in process (no sockets, no
//! pacing), served to the local user (`murmur run`) and to a cluster user whose TokenReview and
//! SubjectAccessReview answers are cached (the operator's steady state). A cache miss costs the
//! two reviews' round trips to the API server instead; `e2e/real_nodes` measures that.
//!
//! `cargo bench -p murmur --bench status_access`

use std::sync::Arc;

use axum::body::Body as AxumBody;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use murmur::member::ObservedMember;
use murmur::planner::{self, JobState, Observation};
use murmur::runtime::kube::access::ClusterAccess;
use murmur::status::access::{Access, LocalUser};
use murmur::status::{Hub, router, view};
use murmur_core::api::parse_manifest;
use serde_json::{Value, json};
use tower::ServiceExt;

/// An API server that accepts every token as `viewer` and allows every read.
fn api_server() -> kube::Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let path = request.uri().path().to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let mut review: Value = serde_json::from_slice(&bytes).unwrap();
            review["status"] = if path.ends_with("/tokenreviews") {
                json!({"authenticated": true, "user": {"username": "viewer", "groups": ["team"]}})
            } else {
                json!({"allowed": true})
            };
            send.send_response(
                Response::builder()
                    .body(Body::from(serde_json::to_vec(&review).unwrap()))
                    .unwrap(),
            );
        }
    });
    kube::Client::new(service, "default")
}

/// A hub serving one 8-member job's view.
fn hub() -> Arc<Hub> {
    let spec = parse_manifest(
        "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {name: j}\nspec:\n  replicas: {min: 1, target: 8, max: 8}\n  training: {model: mlp, steps: 10}\n",
        "j.yaml",
    )
    .unwrap()
    .spec;
    let now = Timestamp::from_second(100).unwrap();
    let mut observed = Observation::default();
    let (state, _) = planner::plan(&spec, &JobState::new(now), &observed, now);
    for id in 0..8 {
        observed.members.insert(id, ObservedMember::default());
    }
    let (state, _) = planner::plan(&spec, &state, &observed, now);
    let hub = Arc::new(Hub::default());
    let (job, _inbox) = hub.register("ml", "j", b"key".to_vec());
    hub.publish(
        &job,
        view::job_view("ml", "j", &spec, &state, &observed, now),
    );
    std::mem::forget(_inbox);
    hub
}

fn read(app: &axum::Router, rt: &tokio::runtime::Runtime) -> usize {
    rt.block_on(async {
        let request = axum::http::Request::get("/api/v1/namespaces/ml/jobs/j")
            .header("authorization", "Bearer a-viewers-token")
            .body(AxumBody::empty())
            .unwrap();
        let answer = app.clone().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), 200);
        axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .unwrap()
            .len()
    })
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let hub = hub();
    let local: Arc<dyn Access> = Arc::new(LocalUser);
    let cluster: Arc<dyn Access> =
        rt.block_on(async { Arc::new(ClusterAccess::new(api_server(), Vec::new())) });
    let mut group = c.benchmark_group("observer read");
    for (name, access) in [
        ("local user", local),
        ("cluster user, reviews cached", cluster),
    ] {
        let app = router(hub.clone(), access, 0);
        read(&app, &rt); // the first read fills the caches
        group.bench_function(name, |b| b.iter(|| read(&app, &rt)));
    }
    group.finish();
}

criterion_group!(status_access, benches);
criterion_main!(status_access);
