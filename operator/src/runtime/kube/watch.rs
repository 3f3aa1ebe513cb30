//! The watches that fill the caches and wake reconciles: the controller's streams, jobs
//! decoded one by one (leniently), the owned kinds, and the sweep of deleted jobs.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use murmur_core::api::DecentralizedTrainingJob;
use parking_lot::Mutex;

use super::cached_pod::CachedPod;
use super::context::{Context, Stores};
use super::events::{EventWriter, NewEvent, Reference};
use super::labels::{LABEL_JOB, MANAGED_SELECTOR};
use super::{observe, start_events};
use crate::planner;

/// The watch caches and the writers that fill them.
pub(super) struct Writers {
    pods: reflector::store::Writer<CachedPod>,
    services: reflector::store::Writer<Service>,
    config_maps: reflector::store::Writer<ConfigMap>,
    secrets: reflector::store::Writer<Secret>,
    nodes: reflector::store::Writer<Node>,
    jobs: reflector::store::Writer<DecentralizedTrainingJob>,
    network_policies: Option<reflector::store::Writer<NetworkPolicy>>,
    disruption_budgets: reflector::store::Writer<PodDisruptionBudget>,
}

pub(super) struct AllStores {
    pub(super) stores: Stores,
    pub(super) jobs: Store<DecentralizedTrainingJob>,
}

impl Writers {
    pub(super) fn new(with_policies: bool) -> (AllStores, Self) {
        let (pods, pod_writer) = reflector::store();
        let (services, service_writer) = reflector::store();
        let (config_maps, config_map_writer) = reflector::store();
        let (secrets, secret_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let (jobs, job_writer) = reflector::store();
        let (network_policies, network_policy_writer) = reflector::store();
        let (disruption_budgets, disruption_budget_writer) = reflector::store();
        let stores = AllStores {
            stores: Stores {
                pods,
                services,
                config_maps,
                secrets,
                nodes,
                network_policies: with_policies.then_some(network_policies),
                disruption_budgets,
                start_events: Default::default(),
                listed: Default::default(),
            },
            jobs,
        };
        let writers = Self {
            pods: pod_writer,
            services: service_writer,
            config_maps: config_map_writer,
            secrets: secret_writer,
            nodes: node_writer,
            jobs: job_writer,
            network_policies: with_policies.then_some(network_policy_writer),
            disruption_budgets: disruption_budget_writer,
        };
        (stores, writers)
    }
}

/// The controller over every watch: jobs (only spec changes wake it: its own status writes
/// change no generation), the objects it owns, and nodes (a node that goes away or NotReady
/// re-plans the jobs with members on it).
pub(super) fn controller(
    client: &Client,
    w: Writers,
    jobs: Store<DecentralizedTrainingJob>,
    ctx: &Arc<Context>,
    concurrency: u16,
) -> Controller<DecentralizedTrainingJob> {
    let managed = watcher::Config::default().labels(MANAGED_SELECTOR);
    let job_stream = decoded_jobs(client, &jobs, ctx)
        .reflect(w.jobs)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let mut controller = Controller::for_stream(job_stream, jobs)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .owns_stream({
            let ctx = Arc::downgrade(ctx);
            let mut listing_since = None;
            owned_with(
                client,
                &managed,
                w.pods,
                observe::keep_what_is_read_of_pod,
                move |event| {
                    if let Some(ctx) = ctx.upgrade() {
                        settle_awaited_pods(&ctx, &mut listing_since, event);
                    }
                },
            )
        })
        .owns_stream(owned(client, &managed, w.services))
        .owns_stream(owned(client, &managed, w.config_maps))
        .owns_stream(owned(client, &managed, w.secrets))
        .owns_stream(owned(client, &managed, w.disruption_budgets));
    if let Some(writer) = w.network_policies {
        controller = controller.owns_stream(owned(client, &managed, writer));
    }
    let node_stream = node_news(
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).default_backoff(),
        w.nodes,
    );
    let pods = ctx.stores.pods.clone();
    // A pod's event of interest wakes the pod's job.
    let job_of_event = move |event: k8s_openapi::api::core::v1::Event| {
        let pod = &event.involved_object;
        let namespace = pod.namespace.as_deref()?;
        let pod = pods.get(&ObjectRef::new(pod.name.as_deref()?).within(namespace))?;
        let job = pod.labels().get(LABEL_JOB)?;
        Some(ObjectRef::new(job).within(namespace))
    };
    let index = ctx.stores.start_events.clone();
    let start_event_stream = watcher(
        Api::<k8s_openapi::api::core::v1::Event>::all(client.clone()),
        watcher::Config::default().fields(start_events::FIELD_SELECTOR),
    )
    .default_backoff()
    .filter_map(move |event| {
        futures::future::ready(match event {
            Ok(e) => index.apply(&e),
            Err(e) => Some(Err(e)),
        })
    });
    controller = controller.watches_stream(start_event_stream, job_of_event);
    let pods = ctx.stores.pods.clone();
    let jobs_on_node = move |node: Node| {
        let node = node.name_any();
        let jobs: std::collections::HashSet<ObjectRef<DecentralizedTrainingJob>> = pods
            .state()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node))
            .filter_map(|p| {
                let job = p.labels().get(LABEL_JOB)?;
                Some(ObjectRef::new(job).within(&p.namespace()?))
            })
            .collect();
        jobs
    };
    controller.watches_stream(node_stream, jobs_on_node)
}

/// Nodes cached as what the operator reads of them, and the nodes whose change of that wakes
/// the jobs on them: readiness, labels, taints, deletion. A kubelet's heartbeat (every node,
/// every few seconds) wakes none.
fn node_news<S>(
    events: S,
    nodes: reflector::store::Writer<Node>,
) -> impl futures::Stream<Item = Result<Node, watcher::Error>> + Send + 'static
where
    S: futures::Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Send + 'static,
{
    events
        .modify(observe::keep_what_is_read_of_node)
        .reflect(nodes)
        .map_ok(|event| observe::mark_deleted_node(event, k8s_openapi::jiff::Timestamp::now()))
        .touched_objects()
        .predicate_filter(observe::node_news, Default::default())
}

/// The jobs as watch events, each decoded on its own: the watch reads them untyped, so one job
/// stored under a looser (older) CRD that the types cannot decode costs only itself — an event
/// and a log name it and its field, and the operator leaves it alone (were it known before, it
/// is dropped as if deleted) — instead of failing the whole list and every job's reconcile.
fn decoded_jobs(
    client: &Client,
    jobs: &Store<DecentralizedTrainingJob>,
    ctx: &Context,
) -> impl futures::Stream<Item = Result<watcher::Event<DecentralizedTrainingJob>, watcher::Error>>
+ Send
+ 'static {
    use kube::core::{ApiResource, DynamicObject};
    let resource = ApiResource::erase::<DecentralizedTrainingJob>(&());
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let known = jobs.clone();
    let writer = ctx.events.clone();
    let clock = ctx.clock.clone();
    let reported = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let decoded = event.map(|event| {
                decode_event(event, &known, &|object, error| {
                    report_undecodable(&writer, clock(), &reported, object, error)
                })
            });
            futures::future::ready(decoded.transpose())
        })
}

/// One watch event of untyped jobs, typed: an object that does not decode is reported and
/// either left out or, when the cache knew it, turned into its deletion.
fn decode_event(
    event: watcher::Event<kube::core::DynamicObject>,
    known: &Store<DecentralizedTrainingJob>,
    report: &dyn Fn(&kube::core::DynamicObject, &murmur_core::api::ManifestError),
) -> Option<watcher::Event<DecentralizedTrainingJob>> {
    use watcher::Event as E;
    // Decoded, or reported and None.
    let decode = |object: &kube::core::DynamicObject| {
        let origin = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        let value = serde_json::to_value(object).unwrap_or_default();
        murmur_core::api::decode_job(value, &origin)
            .map_err(|e| report(object, &e))
            .ok()
    };
    // What the cache knew of it: dropped as if deleted once it cannot be read.
    let previous = |object: &kube::core::DynamicObject| {
        let name = object.metadata.name.as_deref()?;
        let namespace = object.metadata.namespace.as_deref()?;
        known
            .get(&ObjectRef::new(name).within(namespace))
            .map(|k| E::Delete(k.as_ref().clone()))
    };
    match event {
        E::Init => Some(E::Init),
        E::InitDone => Some(E::InitDone),
        E::InitApply(o) => decode(&o).map(E::InitApply),
        E::Apply(o) => decode(&o).map(E::Apply).or_else(|| previous(&o)),
        E::Delete(o) => decode(&o).map(E::Delete).or_else(|| previous(&o)),
    }
}

/// Say once per object version that it cannot be decoded: a log line and a Warning Event
/// regarding it, naming the field.
fn report_undecodable(
    writer: &EventWriter,
    now: Timestamp,
    reported: &Mutex<std::collections::HashSet<String>>,
    object: &kube::core::DynamicObject,
    error: &murmur_core::api::ManifestError,
) {
    let version = format!(
        "{}/{}",
        object.metadata.uid.as_deref().unwrap_or_default(),
        object
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
    );
    if !reported.lock().insert(version) {
        return;
    }
    tracing::warn!(error = %error, "a DecentralizedTrainingJob cannot be decoded; leaving it alone");
    let event = NewEvent {
        type_: planner::EventKind::Warning,
        reason: planner::Reason::Undecodable.as_str().into(),
        action: planner::Reason::Undecodable.as_str().into(),
        note: format!(
            "the operator cannot read this job, so it leaves it alone: {error}; fix the field or recreate the job"
        ),
        regarding: Reference::job(&object.metadata),
        related: None,
    };
    let writer = writer.clone();
    tokio::spawn(async move {
        if let Err(e) = writer.publish(&event, now).await {
            tracing::warn!(error = %e, "cannot record the Undecodable event");
        }
    });
}

/// A kind of object the operator owns and watches.
trait OwnedKind:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> OwnedKind for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The watch of one kind of object the operator owns, filling its cache.
fn owned<K: OwnedKind>(
    client: &Client,
    managed: &watcher::Config,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    owned_with(client, managed, writer, |_| {}, |_| {})
}

/// [`owned`], with each object trimmed to what is read (managed fields are always dropped),
/// and `applied` shown each watch event once the cache has applied it.
fn owned_with<K: OwnedKind>(
    client: &Client,
    managed: &watcher::Config,
    writer: reflector::store::Writer<K>,
    mut trim: impl FnMut(&mut K) + Send + 'static,
    mut applied: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    // Touched, not applied: a deleted (or force-deleted) child wakes its job at once; with
    // applied objects only, it waited for the next resync.
    watcher(Api::<K>::all(client.clone()), managed.clone())
        .default_backoff()
        .modify(move |o| {
            o.meta_mut().managed_fields = None;
            trim(o);
        })
        .reflect(writer)
        .inspect_ok(move |event| applied(event))
        .touched_objects()
}

/// What one pod watch event, once the cache has applied it, settles of the pods the jobs await
/// (created, not yet shown by the cache). A pod the watch shows, or shows deleted, is awaited no
/// longer, even if it is gone before any reconcile saw it (a force deletion right after
/// creation). A re-list, once it is the cache, proves gone what was created before it began and
/// it lacks. The pods a re-list brings are in the cache only when the list is done: until then
/// the cache holds what it held before, so they stay awaited (settled as they arrived, a
/// reconcile mid-list found a new pod neither cached nor awaited, and gave its member a second
/// pod beside it).
pub(super) fn settle_awaited_pods(
    ctx: &Context,
    listing_since: &mut Option<k8s_openapi::jiff::Timestamp>,
    event: &watcher::Event<CachedPod>,
) {
    match event {
        watcher::Event::Init => *listing_since = Some((ctx.clock)()),
        watcher::Event::InitApply(_) => {}
        watcher::Event::InitDone => {
            if let Some(since) = listing_since.take() {
                tracing::info!(%since, "the pod cache is a new list of pods");
                ctx.pods_listed(since);
            }
        }
        watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => ctx.pod_seen(pod),
    }
}

/// Forget jobs deleted behind the operator's back, once per resync.
pub(super) async fn sweep_deleted_jobs(
    ctx: std::sync::Weak<Context>,
    jobs: Store<DecentralizedTrainingJob>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(ctx) = ctx.upgrade() else { return };
        ctx.forget_deleted(|ns, name| jobs.get(&ObjectRef::new(name).within(ns)).is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    /// Node `spot-1`, Ready since 100 s, its heartbeat at `beat`.
    fn ready(beat: i64) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("spot-1".into());
        node.metadata.uid = Some("uid-1".into());
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                last_transition_time: Some(Time(Timestamp::from_second(100).unwrap())),
                last_heartbeat_time: Some(Time(Timestamp::from_second(beat).unwrap())),
                ..Default::default()
            }]),
            ..Default::default()
        });
        node
    }

    #[tokio::test]
    async fn a_node_deleted_while_ready_wakes_its_jobs_and_a_heartbeat_does_not() {
        let (store, writer) = reflector::store();
        let events = futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(ready(200))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(ready(210))),
            // The machine vanished and its Node was deleted: the last state it reported.
            Ok(watcher::Event::Delete(ready(210))),
        ]);
        let woken: Vec<Node> = node_news(events, writer).try_collect().await.unwrap();
        assert_eq!(
            woken.len(),
            2,
            "the node's first state and its deletion: {woken:#?}"
        );
        assert!(woken[1].metadata.deletion_timestamp.is_some());
        assert!(store.state().is_empty(), "the cache no longer has it");
        assert_eq!(
            observe::node_state(store.get(&ObjectRef::new("spot-1")).as_deref()),
            observe::NodeState::Gone
        );
    }
}
