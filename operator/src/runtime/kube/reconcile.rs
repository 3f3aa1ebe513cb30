//! One reconcile of one job: read the caches, [`decide`], assume the plan and hand its writes
//! to the job's writer; and the trainers' posts that ask for one.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::topology::MemberId;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::cached_pod::CachedPod;
use super::context::{Context, JobKey, Live};
use super::decide::{self, Inputs, decide};
use super::error::Error;
use super::labels::LABEL_JOB;
use super::writes::{RETRY_MAX, retry_delays, write_labels};
use super::{observe, resources, writer};
use crate::planner;
use crate::status::Inbound;

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
    let cpu_started = thread_cpu();
    tracing::debug!(parent: &span, "reconciling");
    let result = span.in_scope(|| reconcile_inner(&job, &ctx));
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    let seconds = started.elapsed().as_secs_f64();
    // The work runs on this thread without an await: its thread's CPU time is its own.
    let cpu_seconds = thread_cpu().saturating_sub(cpu_started).as_secs_f64();
    ctx.metrics.reconciled(seconds, cpu_seconds, outcome);
    if result.is_ok() {
        ctx.succeeded(&(resources::namespace(&job), resources::name(&job)));
    }
    tracing::debug!(seconds, cpu_seconds, outcome, "reconciled");
    result
}

/// CPU time this thread has used (zero where the clock cannot be read).
fn thread_cpu() -> std::time::Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(std::time::Duration::from)
        .unwrap_or_default()
}

/// Decide, assume the plan and hand its writes to the job's writer: nothing here waits on the
/// API server.
fn reconcile_inner(
    job: &Arc<DecentralizedTrainingJob>,
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
    // Of the job's name (this job's pods, or an earlier job's).
    let named = |p: &CachedPod| {
        p.metadata.namespace.as_deref() == Some(namespace.as_str())
            && p.labels().get(LABEL_JOB) == Some(&name)
    };
    // The job's pods in the cache, and others of its name.
    let cached_pods = || -> (Vec<Arc<CachedPod>>, Vec<Arc<CachedPod>>) {
        ctx.stores
            .pods
            .state()
            .into_iter()
            .filter(|p| named(p))
            .partition(|p| owned(&p.metadata))
    };
    let live = ctx.live(job, cached_pods)?;
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
    let start_event = |p: &CachedPod| ctx.stores.start_events.get(p);
    let now = (ctx.clock)();
    if !ctx.leadership.may_write() {
        return Err(Error::NotLeading);
    }
    let (relabel, requeue, delete_job) = {
        // One hold of the job's lock from the plan to its hand-over: the writer's answers to
        // earlier creates reach either the memory planned from or the decision handed over.
        let mut l = live.lock();
        // The cache is read under the lock: the watch puts a pod in the cache before it ends
        // its create's expectation (under this lock), so a pod no longer awaited is in what is
        // read here. Read before the lock, a pod the watch showed meanwhile was in neither, and
        // its member was taken for deleted and given a second pod (at 10 000 members, dozens
        // in the create burst).
        let pods = l
            .pods
            .read(ctx.stores.pods.state(), |p| named(p) && owned(&p.metadata));
        let job_pods = observe::JobPodIndex::job_pods(&pods);
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
            let shown: std::collections::HashMap<&str, Option<u32>> = job_pods
                .iter()
                .filter_map(|p| Some((p.pod.metadata.name.as_deref()?, p.clique)))
                .collect();
            let grace = ctx.settings.creation_grace.as_secs_f64();
            l.labels_sent.retain(|pod, (clique, at)| {
                shown.get(pod.as_str()).is_some_and(|have| {
                    have.is_none_or(|have| have != *clique)
                        && planner::seconds_since(*at, now) < grace
                })
            });
        }
        let mut d = decide(&Inputs {
            job,
            problems: problems.as_deref(),
            pods: &job_pods,
            node: &node,
            start_event: &start_event,
            place: &place,
            service: service.as_deref(),
            secret: secret.as_deref(),
            network_policy: network_policy.as_deref(),
            disruption_budget: disruption_budget.as_deref(),
            driver: &l.driver,
            created: &l.created,
            key_hex: &l.key_hex,
            settings: &ctx.settings,
            now,
        });
        for e in &d.plan.events {
            tracing::debug!(
                reason = e.reason.as_str(),
                member = e.member,
                attempt = e.attempt,
                message = %e.message,
                "planned"
            );
        }
        // Expectations the cache has caught up with, or that are stale, are dropped; this
        // decision's creates are awaited until answered.
        let grace = ctx.settings.creation_grace.as_secs_f64();
        l.created
            .retain(|_, t| planner::seconds_since(*t, now) < grace);
        for key in d.create.iter().map(decide::NewPod::attempt) {
            l.created.insert(key, Timestamp::MAX);
        }
        l.driver.assume(&d.plan, now);
        ctx.metrics.observe(&d.plan.view);
        let handed = (std::mem::take(&mut d.relabel), d.requeue, d.delete_job);
        writer::enqueue(
            ctx,
            &live,
            &mut l,
            (namespace.clone(), name.clone()),
            job.clone(),
            d,
        );
        handed
    };
    label(ctx, &live, &namespace, &name, relabel);
    Ok(if delete_job {
        Action::await_change()
    } else {
        Action::requeue(requeue)
    })
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
