//! One reconcile of one job: read the caches, [`decide`], perform the writes; and the
//! trainers' posts that ask for one.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::topology::MemberId;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::context::{Context, JobKey, Live};
use super::decide::{self, Decision, Inputs, decide};
use super::error::{Error, kube_err};
use super::labels::{LABEL_CLIQUE, LABEL_JOB};
use super::writes::{
    RETRY_MAX, apply_object, apply_status, record_event, retry_delays, write_labels, write_pods,
};
use super::{observe, resources};
use crate::planner;
use crate::status::Inbound;

/// Events a reconcile writes at once.
const EVENTS_AT_ONCE: usize = 16;

/// What a job's trainers post goes to its driver; a post that changes the job (a join report,
/// a member's new state) reconciles it now rather than at the next resync.
pub(super) async fn listen(
    ctx: std::sync::Weak<Context>,
    live: std::sync::Weak<Mutex<Live>>,
    key: JobKey,
    mut inbox: mpsc::UnboundedReceiver<Inbound>,
) {
    while let Some(message) = inbox.recv().await {
        let (Some(ctx), Some(live)) = (ctx.upgrade(), live.upgrade()) else {
            return;
        };
        let now = (ctx.clock)();
        if live.lock().driver.receive(message, now) {
            let _ = ctx.trigger.send(ObjectRef::new(&key.1).within(&key.0));
        }
    }
}

/// One reconcile of one job, in a span naming it (logs group by job).
pub async fn reconcile(
    job: Arc<DecentralizedTrainingJob>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = %resources::namespace(&job),
        job = %resources::name(&job)
    );
    if job.metadata.deletion_timestamp.is_none() {
        ctx.stores.ready().await;
        // A reconcile waits `min_reconcile_interval` after it was asked for, then reads the
        // caches: what arrives together (a join wave, a node's pods) is handled together, and a
        // job's reconciles are at least that far apart, since requests meanwhile wait as one
        // (the controller keeps one pending per job). Unlike a debounce, which every new
        // trigger restarted, a stream of triggers never holds it off.
        let delay = ctx.settings.min_reconcile_interval;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    // The work, not the wait before it.
    let started = Instant::now();
    tracing::debug!(parent: &span, "reconciling");
    let result = reconcile_inner(&job, &ctx).instrument(span).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    let seconds = started.elapsed().as_secs_f64();
    ctx.metrics.reconciled(seconds, outcome);
    if result.is_ok() {
        ctx.succeeded(&(resources::namespace(&job), resources::name(&job)));
    }
    tracing::debug!(seconds, outcome, "reconciled");
    result
}

async fn reconcile_inner(
    job: &DecentralizedTrainingJob,
    ctx: &Arc<Context>,
) -> Result<Action, Error> {
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    if job.metadata.deletion_timestamp.is_some() {
        // Owner references take the pods, Service, Secret and ConfigMap with it.
        ctx.forget(&namespace, &name);
        return Ok(Action::await_change());
    }
    let uid = job.uid().unwrap_or_default();
    let owned = |meta: &ObjectMeta| {
        meta.namespace.as_deref() == Some(namespace.as_str())
            && meta.owner_references.iter().flatten().any(|o| o.uid == uid)
    };
    let (pods, others): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = ctx
        .stores
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && p.labels().get(LABEL_JOB) == Some(&name)
        })
        .partition(|p| owned(&p.metadata));
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let leftovers: Vec<&Pod> = others.iter().map(|p| p.as_ref()).collect();
    let live = ctx.live(job, &pod_refs, &leftovers)?;
    let service = get(
        &ctx.stores.services,
        &namespace,
        resources::service_name(&name),
    );
    let secret = get(
        &ctx.stores.secrets,
        &namespace,
        resources::secret_name(&name),
    );
    let config_map = get(
        &ctx.stores.config_maps,
        &namespace,
        resources::config_map_name(&name),
    );
    let network_policy = ctx
        .stores
        .network_policies
        .as_ref()
        .and_then(|store| get(store, &namespace, resources::network_policy_name(&name)));
    let disruption_budget = get(
        &ctx.stores.disruption_budgets,
        &namespace,
        resources::disruption_budget_name(&name),
    );
    let nodes = ctx.stores.nodes.clone();
    let places = nodes.clone();
    let node = move |n: &str| observe::node_state(nodes.get(&ObjectRef::new(n)).as_deref());
    let place = move |n: &str| observe::place(places.get(&ObjectRef::new(n)).as_deref());
    let start_event = |p: &Pod| ctx.stores.start_events.get(p);
    let now = (ctx.clock)();
    let job_pods = observe::job_pods(&pod_refs);
    let decision = {
        let mut l = live.lock();
        let generation = job.metadata.generation;
        let problems = match &l.validated {
            Some((g, p)) if *g == generation && generation.is_some() => p.clone(),
            _ => {
                let p = decide::problems(job);
                l.validated = Some((generation, p.clone()));
                p
            }
        };
        // A pod the cache has shown is no longer expected: from now on its absence is a
        // deletion.
        let seen: std::collections::BTreeSet<(MemberId, u32)> =
            job_pods.iter().map(|p| (p.member, p.attempt)).collect();
        l.created.retain(|k, _| !seen.contains(k));
        // Likewise a clique label the cache shows, or whose pod is gone.
        if !l.labels_sent.is_empty() {
            let shown: std::collections::HashMap<&str, Option<&String>> = pod_refs
                .iter()
                .filter_map(|p| Some((p.metadata.name.as_deref()?, p.labels().get(LABEL_CLIQUE))))
                .collect();
            let grace = ctx.settings.creation_grace.as_secs_f64();
            l.labels_sent.retain(|pod, (clique, at)| {
                shown.get(pod.as_str()).is_some_and(|have| {
                    have.is_none_or(|have| *have != clique.to_string())
                        && planner::seconds_since(*at, now) < grace
                })
            });
        }
        decide(&Inputs {
            job,
            problems: problems.as_deref(),
            pods: &job_pods,
            node: &node,
            start_event: &start_event,
            place: &place,
            service: service.as_deref(),
            secret: secret.as_deref(),
            config_map: config_map.as_deref(),
            config_map_memory: l
                .config_map_memory
                .as_ref()
                .filter(|(version, _)| {
                    config_map
                        .as_ref()
                        .and_then(|c| c.metadata.resource_version.as_ref())
                        == Some(version)
                })
                .map(|(_, memory)| memory),
            network_policy: network_policy.as_deref(),
            disruption_budget: disruption_budget.as_deref(),
            driver: &l.driver,
            created: &l.created,
            key_hex: &l.key_hex,
            settings: &ctx.settings,
            status_written: l.status_written,
            now,
        })
    };
    execute(job, ctx, &live, decision, now).await
}

/// Write the decision's clique labels off the reconcile's path: nothing waits for them, and a
/// reconcile that labelled 500 pods took seconds, holding the job's next news. One labelling at
/// a time per job: while one runs, this decision's labels are left to a reconcile asked for
/// when it ends, which sees what was written meanwhile; a label sent is not sent again until
/// the cache has shown it. A labelling that fails asks for a reconcile after a delay that
/// doubles with each failure in a row, as a failed reconcile's retry does ([`retry_delays`]).
fn label(
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    namespace: &str,
    name: &str,
    relabel: Vec<(String, u32)>,
) {
    let mut l = live.lock();
    let mut relabel = relabel;
    relabel.retain(|(pod, clique)| l.labels_sent.get(pod).map(|(c, _)| c) != Some(clique));
    if relabel.is_empty() {
        return;
    }
    if l.labelling.as_ref().is_some_and(|t| !t.is_finished()) {
        l.labels_waiting = true;
        return;
    }
    let now = (ctx.clock)();
    for (pod, clique) in &relabel {
        l.labels_sent.insert(pod.clone(), (*clique, now));
    }
    let (ctx, live) = (ctx.clone(), live.clone());
    let job = ObjectRef::new(name).within(namespace);
    let namespace = namespace.to_string();
    let span = tracing::Span::current();
    l.labelling = Some(tokio::spawn(
        async move {
            let written = if ctx.leadership.may_write() {
                write_labels(&ctx, &namespace, &relabel).await
            } else {
                Err(Error::NotLeading)
            };
            match written {
                Ok(()) => {
                    let waiting = {
                        let mut l = live.lock();
                        l.label_failures = 0;
                        std::mem::take(&mut l.labels_waiting)
                    };
                    if waiting {
                        let _ = ctx.trigger.send(job);
                    }
                }
                Err(e) => {
                    ctx.metrics.error(e.kind());
                    let failures = {
                        let mut l = live.lock();
                        for (pod, _) in &relabel {
                            l.labels_sent.remove(pod);
                        }
                        // The retry below asks for a reconcile either way.
                        l.labels_waiting = false;
                        l.label_failures = l.label_failures.saturating_add(1);
                        l.label_failures
                    };
                    // The failed reconcile's policy: the delay after the n-th failure in a row.
                    let delay = retry_delays()
                        .nth(failures as usize - 1)
                        .unwrap_or(RETRY_MAX);
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot write clique labels");
                    tokio::time::sleep(delay).await;
                    let _ = ctx.trigger.send(job);
                }
            }
        }
        .instrument(span),
    ));
}

fn get<K>(store: &Store<K>, namespace: &str, name: String) -> Option<Arc<K>>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    store.get(&ObjectRef::new(&name).within(namespace))
}

/// Perform a decision's writes, then commit the driver's plan and record its events.
async fn execute(
    job: &DecentralizedTrainingJob,
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    mut d: Decision,
    now: Timestamp,
) -> Result<Action, Error> {
    if !ctx.leadership.may_write() {
        return Err(Error::NotLeading);
    }
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    if let Some(service) = &d.service {
        apply_object(ctx, &namespace, service, "service").await?;
    }
    if let Some(uid) = &d.replace_secret {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        let name = resources::secret_name(&name);
        let only_that_one = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match secrets.delete(&name, &only_that_one).await {
            Ok(_) => ctx.metrics.wrote("secret", 1),
            // Gone already, or replaced since: nothing of the earlier job's is left to remove.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(kube_err("delete the earlier job's", name)(e)),
        }
    }
    if let Some(secret) = &d.secret {
        apply_object(ctx, &namespace, secret, "secret").await?;
    }
    if let Some(policy) = &d.network_policy {
        apply_object(ctx, &namespace, policy, "networkpolicy").await?;
    }
    if let Some(budget) = &d.disruption_budget {
        apply_object(ctx, &namespace, budget, "poddisruptionbudget").await?;
    }
    let (accepted, refused) = write_pods(ctx, &namespace, live, &d, now).await?;
    if !d.create.is_empty() {
        if !refused.is_empty() {
            tracing::warn!(
                refused = refused.len(),
                admitted = accepted.len(),
                reason = %refused[0].2,
                "the API server refuses members' pods; the admitted ones run"
            );
        }
        d.answered(job, &accepted, &refused, now);
    }
    let mut config_map_holds = d.config_map_holds.clone();
    if let Some(config_map) = &d.config_map {
        let written = apply_object(ctx, &namespace, config_map, "configmap").await?;
        config_map_holds = written.metadata.resource_version;
    }
    if let Some(status) = &d.status {
        apply_status(ctx, job, status).await?;
    }
    // Every write above succeeded: this is now the job's memory.
    {
        let mut l = live.lock();
        // Drop expectations the cache has caught up with, or that are stale.
        let grace = ctx.settings.creation_grace.as_secs_f64();
        l.created
            .retain(|_, t| planner::seconds_since(*t, now) < grace);
        l.driver.commit(&d.plan, now);
        if let Some(version) = config_map_holds {
            l.config_map_memory = Some((version, d.plan.memory.clone()));
        }
        if d.status.is_some() {
            l.status_written = Some(now);
        }
    }
    ctx.metrics.observe(&d.plan.view);
    // Several at once: a join wave's plan names a score of members, and one at a time their
    // round trips were most of a 10 000-member job's reconcile.
    let events = d.kube_events();
    for batch in events.chunks(EVENTS_AT_ONCE) {
        let writes: Vec<_> = batch
            .iter()
            .map(|event| record_event(ctx, job, event, Decision::pod_of(&name, event)))
            .collect();
        futures::future::join_all(writes).await;
    }
    label(ctx, live, &namespace, &name, d.relabel);
    if d.delete_job {
        let jobs: Api<DecentralizedTrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
        match jobs.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("delete finished job", name)(e)),
        }
        ctx.metrics.wrote("job_delete", 1);
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(d.requeue))
}
