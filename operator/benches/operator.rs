//! Control-plane costs of a 1 000-member job (`MURMUR_BENCH_MEMBERS` for another size): one
//! plan, one pure reconcile decision, one reconcile (deciding and handing its writes over), and
//! one reconcile with the writes behind it against a mocked API server (kube-rs `tower-test`).
//! Targets: planning <= 5 ms, one reconcile <= 50 ms of CPU. The mock answers on the same
//! single-threaded runtime, so the wall time here is CPU time (the operator's plus the mock's).
//!
//! `cargo bench -p murmur --bench operator`

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, NodeCondition, NodeStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use murmur::driver::{JobDriver, Memory};
use murmur::member::Exit;
use murmur::planner;
use murmur::runtime::kube::cached_pod::CachedPod;
use murmur::runtime::kube::decide::{Decision, MemoryWrite, memory_write, status_due};
use murmur::runtime::kube::{
    Context, Inputs, OperatorMetrics, Settings, Stores, decide, lease, observe, reconcile,
    resources,
};
use murmur::status::{Hub, Inbound};
use murmur_core::api::{DecentralizedTrainingJob, parse_manifest};
use murmur_core::contract::JoinReport;
use serde_json::{Value, json};

/// The operator binary's allocator (`operator/src/main.rs`): allocation is much of a reconcile.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The job's size: `MURMUR_BENCH_MEMBERS` (1 000 unless set).
static MEMBERS: std::sync::LazyLock<u32> = std::sync::LazyLock::new(|| {
    std::env::var("MURMUR_BENCH_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
});

fn job() -> DecentralizedTrainingJob {
    let (target, min) = (*MEMBERS, *MEMBERS / 2);
    let manifest = format!(
        "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {{name: big, namespace: ml}}
spec:
  replicas: {{min: {min}, target: {target}, max: {target}}}
  topology: {{kind: dCliques, cliqueSize: 10}}
  algorithm: {{kind: cliqueAveraging}}
  training: {{model: mlp, partition: {{kind: classesPerMember, k: 1}}, steps: 1000}}
  scheduling: {{capacity: spot}}
"
    );
    let mut job = parse_manifest(&manifest, "big.yaml").unwrap();
    job.metadata.uid = Some("uid-big".into());
    job.metadata.generation = Some(1);
    job.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    job
}

/// A 1 000-member job in steady state: every pod running, every member joined, the topology
/// built, the ConfigMap and status written.
struct Steady {
    job: Arc<DecentralizedTrainingJob>,
    pods: Vec<Pod>,
    decision: Decision,
    /// The job's state as every member has joined, before the plan that builds the topology.
    unbuilt: planner::JobState,
    /// The ConfigMap holding the steady job's memory.
    config_map: ConfigMap,
    driver: JobDriver,
    first: Decision,
}

fn steady(settings: &Settings) -> Steady {
    let mut job = Arc::new(job());
    let now = Timestamp::now();
    let created = BTreeMap::new();
    let ready = |_: &str| observe::NodeState::Ready;
    let (mut driver, _inbox) = JobDriver::start(
        Arc::new(Hub::default()),
        "ml",
        "big",
        b"00".to_vec(),
        Memory::new(now),
    );
    // The members are created a burst per plan; each burst's pods run on node-1.
    let running = |mut p: Pod| {
        p.metadata.creation_timestamp = Some(Time(now));
        p.spec.as_mut().unwrap().node_name = Some("node-1".into());
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        p
    };
    let mut pods: Vec<Pod> = Vec::new();
    let first = loop {
        let cached = cache_of(&pods);
        let refs: Vec<&CachedPod> = cached.iter().collect();
        let refs = observe::job_pods(&refs);
        let d = decide(&Inputs {
            job: &job,
            problems: None,
            pods: &refs,
            node: &ready,
            start_event: &|_| None,
            place: &|_| (None, None),
            service: None,
            secret: None,
            network_policy: None,
            disruption_budget: None,
            driver: &driver,
            created: &created,
            key_hex: "00",
            settings,
            now,
        });
        driver.commit(&d.plan, now);
        let burst = d.create.len();
        pods.extend(d.create.iter().map(|new| running(new.build(settings))));
        if burst < planner::CREATES_PER_PLAN {
            break d;
        }
    };
    assert_eq!(pods.len(), *MEMBERS as usize);
    for id in 0..*MEMBERS {
        let mut histogram = vec![0u64; 10];
        histogram[(id % 10) as usize] = 50;
        driver.receive(
            Inbound::Join(JoinReport {
                member_id: id,
                label_histogram: histogram,
                proxy_vector: None,
            }),
            now,
        );
    }
    let cached = cache_of(&pods);
    let refs: Vec<&CachedPod> = cached.iter().collect();
    let refs = observe::job_pods(&refs);
    let built = decide(&Inputs {
        job: &job,
        problems: None,
        pods: &refs,
        node: &ready,
        start_event: &|_| None,
        place: &|_| (None, None),
        service: first.service.as_ref(),
        secret: first.secret.as_ref(),
        network_policy: None,
        disruption_budget: first.disruption_budget.as_ref(),
        driver: &driver,
        created: &created,
        key_hex: "00",
        settings,
        now,
    });
    let unbuilt = driver.state().clone();
    driver.commit(&built.plan, now);
    // The cluster carries out the relabelling (clique labels follow the topology): every pod,
    // as after the reconciles that label a burst each.
    let topology = driver.state().topology.clone().unwrap();
    for pod in &mut pods {
        let (member, _) = observe::member_of(pod).unwrap();
        let labels = pod.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(
            "murmur.dev/clique".into(),
            topology.clique_of(member).unwrap().to_string(),
        );
    }
    assert_eq!(
        driver
            .state()
            .topology
            .as_ref()
            .unwrap()
            .graph
            .member_count(),
        *MEMBERS as usize
    );
    Arc::make_mut(&mut job).status = Some(built.plan.view.status.clone());
    let mut config_map =
        resources::config_map(&job, built.plan.memory.data(built.plan.document.as_deref()));
    // As stored: with a resourceVersion, by which the operator knows the memory it holds.
    config_map.metadata.resource_version = Some("1".into());
    let bytes: usize = config_map
        .data
        .iter()
        .flatten()
        .map(|(_, v)| v.len())
        .sum::<usize>()
        + config_map
            .binary_data
            .iter()
            .flatten()
            .map(|(_, v)| v.0.len())
            .sum::<usize>();
    eprintln!(
        "topology ConfigMap of a {}-member job: {bytes} bytes (limit 1 MiB)",
        *MEMBERS
    );
    Steady {
        job,
        pods,
        decision: built,
        unbuilt,
        config_map,
        driver,
        first,
    }
}

fn node() -> Node {
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("node-1".into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An API server that accepts every write.
fn mock(job: Value) -> Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let job = Arc::new(Mutex::new(job));
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let status = request.uri().path().ends_with("/status");
            let delete = request.method() == "DELETE";
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let response = if delete {
                json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}})
            } else if status {
                let mut j = job.lock().clone();
                j["status"] = body["status"].clone();
                j
            } else {
                // What the API server answers a write with: the object as stored.
                let mut body = body;
                if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), json!("2"));
                }
                body
            };
            send.send_response(
                Response::builder()
                    .body(Body::from(serde_json::to_vec(&response).unwrap()))
                    .unwrap(),
            );
        }
    });
    Client::new(service, "default")
}

/// A fresh operator process whose caches hold the steady job.
fn operator(s: &Steady, pods: &[Pod], settings: &Settings) -> Arc<Context> {
    let (pod_store, pod_writer) = reflector::store();
    listed(pod_writer, cache_of(pods));
    let (services, w) = reflector::store();
    listed(w, vec![s.first.service.clone().unwrap()]);
    let (secrets, w) = reflector::store();
    listed(w, vec![s.first.secret.clone().unwrap()]);
    let (config_maps, w) = reflector::store();
    listed(w, vec![s.config_map.clone()]);
    let (nodes, w) = reflector::store();
    listed(w, vec![node()]);
    let (disruption_budgets, w) = reflector::store();
    listed(w, vec![s.first.disruption_budget.clone().unwrap()]);
    let mut hub = Hub::default();
    let metrics = Arc::new(OperatorMetrics::register(&mut hub.metrics.registry));
    let (ctx, _) = Context::new(
        mock(serde_json::to_value(&*s.job).unwrap()),
        Stores {
            pods: pod_store,
            services,
            config_maps,
            secrets,
            nodes,
            network_policies: None,
            disruption_budgets,
            start_events: Default::default(),
            listed: Default::default(),
        },
        Arc::new(hub),
        metrics,
        settings.clone(),
        "bench".into(),
        Arc::new(lease::Leadership::unelected()),
    );
    ctx
}

/// A cache that has listed `objects` (kept alive: a dropped writer ends the cache).
fn listed<K>(mut writer: Writer<K>, objects: Vec<K>) -> Writer<K>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    writer.apply_watcher_event(&Event::Init);
    for o in objects {
        writer.apply_watcher_event(&Event::InitApply(o));
    }
    writer.apply_watcher_event(&Event::InitDone);
    writer
}

/// The pods as the operator's pod cache holds them.
fn cache_of(pods: &[Pod]) -> Vec<CachedPod> {
    pods.iter().map(CachedPod::of).collect()
}

fn preempt(pods: &[Pod], member: usize) -> Vec<Pod> {
    let mut pods = pods.to_vec();
    pods[member].status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("PreemptionByScheduler".into()),
        ..Default::default()
    }]);
    pods
}

fn benches(c: &mut Criterion) {
    // A reconcile's work, not the wait before it that gathers triggers (the operator's
    // histogram leaves it out too).
    let settings = Settings {
        min_reconcile_interval: Duration::ZERO,
        ..Settings::default()
    };
    let s = steady(&settings);
    let spec = &s.job.spec;
    let now = Timestamp::now();

    let mut group = c.benchmark_group(format!("{} members", *MEMBERS));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("plan, nothing new", |b| {
        b.iter(|| planner::plan(spec, s.driver.state(), &s.decision.plan.observed, now))
    });
    let mut lost = s.decision.plan.observed.clone();
    lost.members.get_mut(&7).unwrap().exit = Some(Exit::Preempted {
        reason: "spot".into(),
    });
    group.bench_function("plan, one preemption", |b| {
        b.iter(|| planner::plan(spec, s.driver.state(), &lost, now))
    });

    // The join wave: the topology built from every member's join report; and built once a
    // tenth fewer had joined (`replicas.min` past the join grace), that tenth joining it in
    // one plan.
    let everyone = &s.decision.plan.observed;
    group.bench_function("plan, the topology built from every join", |b| {
        b.iter(|| planner::plan(spec, &s.unbuilt, everyone, now))
    });
    let mut most = everyone.clone();
    let late = *MEMBERS - *MEMBERS / 10;
    for (_, m) in most.members.range_mut(late..) {
        m.join = None;
    }
    let after_grace = now + Duration::from_secs(planner::JOIN_GRACE_SECONDS as u64 + 1);
    let (built_early, _) = planner::plan(spec, &s.unbuilt, &most, after_grace);
    assert_eq!(
        built_early
            .topology
            .as_ref()
            .map(|t| t.graph.member_count()),
        Some(late as usize),
        "the topology is built from the members joined"
    );
    group.bench_function("plan, the last tenth joins the topology", |b| {
        b.iter(|| planner::plan(spec, &built_early, everyone, after_grace))
    });

    // What a reconcile that changes the job's memory writes into its ConfigMap: the memory
    // as text, gzipped (the deflate backend is chosen by this figure).
    let memory = &s.decision.plan.memory;
    let document = s.decision.plan.document.as_deref();
    group.bench_function("memory packed into its ConfigMap", |b| {
        b.iter(|| resources::config_map(&s.job, memory.data(document)))
    });

    let cached = cache_of(&s.pods);
    let refs: Vec<&CachedPod> = cached.iter().collect();
    let refs = observe::job_pods(&refs);
    let ready = |_: &str| observe::NodeState::Ready;
    let created = BTreeMap::new();
    let steady_inputs = Inputs {
        job: &s.job,
        problems: None,
        pods: &refs,
        node: &ready,
        start_event: &|_| None,
        place: &|_| (None, None),
        service: s.first.service.as_ref(),
        secret: s.first.secret.as_ref(),
        network_policy: None,
        disruption_budget: s.first.disruption_budget.as_ref(),
        driver: &s.driver,
        created: &created,
        key_hex: "00",
        settings: &settings,
        now,
    };
    let unchanged = decide(&steady_inputs);
    assert_eq!(unchanged.writes(), 0, "steady state writes nothing");
    // Nor its memory, which a running operator knows the ConfigMap it wrote holds, nor status.
    assert_eq!(
        memory_write(
            &s.job,
            &unchanged.plan.memory,
            unchanged.plan.document.as_deref(),
            Some(&s.config_map),
            Some(&s.decision.plan.memory),
        ),
        MemoryWrite::Known
    );
    assert!(!status_due(
        s.job.status.as_ref(),
        &unchanged.plan.view.status,
        Some(now),
        now
    ));
    group.bench_function("decide, steady state", |b| {
        b.iter(|| decide(&steady_inputs))
    });
    // The same, one member's pod preempted: what a reconcile decides before it writes.
    let preempted = preempt(&s.pods, 7);
    let preempted_cached = cache_of(&preempted);
    let preempted_refs: Vec<&CachedPod> = preempted_cached.iter().collect();
    let preempted_refs = observe::job_pods(&preempted_refs);
    let preempted_inputs = Inputs {
        pods: &preempted_refs,
        ..steady_inputs
    };
    assert!(
        decide(&preempted_inputs).writes() > 0,
        "a preemption is written"
    );
    group.bench_function("decide, one preemption", |b| {
        b.iter(|| decide(&preempted_inputs))
    });

    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let job = s.job.clone();
    let (namespace, name) = (resources::namespace(&job), resources::name(&job));
    let reconciled = |ctx: &Arc<Context>| {
        let (job, ctx) = (job.clone(), ctx.clone());
        let (namespace, name) = (namespace.clone(), name.clone());
        async move {
            let action = reconcile(job, ctx.clone()).await.unwrap();
            ctx.writes_settled(&namespace, &name).await;
            action
        }
    };
    let steady_runtime = runtime();
    let ctx = steady_runtime.block_on(async { operator(&s, &s.pods, &settings) });
    // The first reconcile of a process loads the job's memory from its ConfigMap.
    steady_runtime.block_on(reconciled(&ctx));
    group.bench_function(
        "reconcile and its writes against the mock, steady state",
        |b| b.iter(|| steady_runtime.block_on(reconciled(&ctx))),
    );
    // A preemption's reconcile: deciding and handing the writes over (what the operator's
    // reconcile histogram measures), then with the writes behind it. Each on a runtime of its
    // own, which criterion drops outside the timing with the context: freeing a 10 000-pod
    // cache is no part of a reconcile, and a writer left running is stopped there.
    let preempted_operator = || {
        let runtime = runtime();
        let ctx = runtime.block_on(async { operator(&s, &s.pods, &settings) });
        runtime.block_on(reconciled(&ctx));
        let (pods, writer): (_, Writer<CachedPod>) = reflector::store();
        let writer = listed(writer, preempted_cached.clone());
        // Same process, newer cache: swap in the preempted pods.
        let stores = Stores {
            pods,
            ..ctx.stores.clone()
        };
        (runtime, ctx.with_stores(stores), writer)
    };
    group.bench_function("reconcile, one preemption", |b| {
        b.iter_batched(
            preempted_operator,
            |(runtime, ctx, writer)| {
                let action = runtime
                    .block_on(reconcile(job.clone(), ctx.clone()))
                    .unwrap();
                (action, ctx, writer, runtime)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function(
        "reconcile and its writes against the mock, one preemption",
        |b| {
            b.iter_batched(
                preempted_operator,
                |(runtime, ctx, writer)| {
                    let action = runtime.block_on(reconciled(&ctx));
                    (action, ctx, writer, runtime)
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
}

criterion_group!(operator_benches, benches);
criterion_main!(operator_benches);
