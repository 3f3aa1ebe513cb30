//! A job's writes, behind its reconciles. A reconcile decides, assumes its plan (the next one
//! starts from it) and hands the decision here; it never waits on the API server, which answers
//! a write in 100-250 ms on a busy control plane and a burst of creates in seconds. One writer
//! task per job writes in rounds, each taking everything decided since the last (folded by
//! [`Decision::then`]: one ConfigMap and one status for them all), in the order that keeps the
//! job's memory true:
//!
//! 1. the objects members need before they start (Service, key Secret, budget, policy);
//! 2. the creates, whose answers (a refusal) are taken into the round's plan, into what is
//!    decided meanwhile and into the job's memory;
//! 3. the deletes;
//! 4. the memory (ConfigMap), only now, so it never names an attempt whose create was not
//!    answered (a restarted operator would count its missing pod as a preemption); then the
//!    topology in it is published, so a trainer never holds a version the job did not persist;
//! 5. the status, when due, and the events;
//! 6. the job itself, once its TTL has passed.
//!
//! A round that fails leaves what it did not write to the next, after a delay that doubles with
//! each failure in a row, as a failed reconcile's retry does.

use std::sync::{Arc, Weak};
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::topology::MemberId;
use parking_lot::Mutex;
use tracing::Instrument;

use super::context::{Context, JobKey, Live};
use super::decide::{self, Decision, MemoryWrite};
use super::error::{Error, kube_err};
use super::resources;
use super::writes::{
    RETRY_MAX, apply_object, apply_status, create_pods, delete_pods, record_event, retry_delays,
};
use crate::driver::Memory;

/// Events a round writes at once.
const EVENTS_AT_ONCE: usize = 16;

/// What a job's writer holds between reconciles.
#[derive(Default)]
pub(super) struct Behind {
    /// What reconciles decided that no round has taken yet, folded into one, with the newest
    /// job object.
    pub(super) pending: Option<(Arc<DecentralizedTrainingJob>, Decision)>,
    /// Whether a writer task runs (it ends once nothing is pending).
    running: bool,
    /// That task, for those who wait until the job's writes are done.
    task: Option<tokio::task::JoinHandle<()>>,
    /// Rounds that failed in a row: the next waits a doubling delay.
    pub(super) failures: u32,
    /// Wakes a writer waiting out that delay: news decided since is tried at once, as news
    /// reconciled a job at once whatever its failed reconciles' delay.
    news: Arc<tokio::sync::Notify>,
}

/// Hand a decision, whose plan the caller has just assumed, to the job's writer (started if
/// none runs). Called under the job's lock, as its plan was made: a round's answers then reach
/// either the decision (taken into the memory it was decided from) or what is pending.
pub(super) fn enqueue(
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    l: &mut Live,
    key: JobKey,
    job: Arc<DecentralizedTrainingJob>,
    d: Decision,
) {
    let b = &mut l.behind;
    b.pending = Some(match b.pending.take() {
        Some((_, older)) => (job, older.then(d)),
        None => (job, d),
    });
    if b.failures > 0 {
        b.news.notify_one();
    }
    if !b.running {
        b.running = true;
        let span = tracing::Span::current();
        b.task = Some(tokio::spawn(
            write_behind(ctx.clone(), Arc::downgrade(live), key).instrument(span),
        ));
    }
}

/// Wait until the job's writer has written everything handed to it (or given up: the job was
/// forgotten).
pub(super) async fn settled(live: &Mutex<Live>) {
    loop {
        let Some(task) = live.lock().behind.task.take() else {
            return;
        };
        let _ = task.await;
    }
}

/// The writer: rounds until nothing is pending.
async fn write_behind(ctx: Arc<Context>, live: Weak<Mutex<Live>>, key: JobKey) {
    loop {
        let Some(live) = live.upgrade() else {
            return;
        };
        let current = ctx
            .jobs
            .lock()
            .get(&key)
            .is_some_and(|l| Arc::ptr_eq(l, &live));
        let taken = {
            let mut l = live.lock();
            let taken = if current {
                l.behind.pending.take()
            } else {
                // Forgotten (deleted, or seen anew with another uid): nothing is its to write.
                None
            };
            if taken.is_none() {
                l.behind.pending = None;
                l.behind.running = false;
            }
            taken
        };
        let Some((job, mut d)) = taken else {
            return;
        };
        let started = Instant::now();
        let now = (ctx.clock)();
        let result = round(&ctx, &live, &job, &mut d, now).await;
        let outcome = match &result {
            Ok(()) => "ok",
            Err(e) => e.kind(),
        };
        ctx.metrics
            .wrote_round(started.elapsed().as_secs_f64(), outcome);
        let Err(e) = result else {
            live.lock().behind.failures = 0;
            continue;
        };
        ctx.metrics.error(e.kind());
        let (failures, news) = {
            let mut l = live.lock();
            // What this round did not write goes before anything decided since.
            let b = &mut l.behind;
            b.pending = Some(match b.pending.take() {
                Some((newer_job, newer)) => (newer_job, d.then(newer)),
                None => (job, d),
            });
            b.failures = b.failures.saturating_add(1);
            (b.failures, b.news.clone())
        };
        let delay = retry_delays()
            .nth(failures as usize - 1)
            .unwrap_or(RETRY_MAX);
        tracing::warn!(error = %e, retry_in = ?delay, "cannot write the job's decision; retrying");
        drop(live);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = news.notified() => {}
        }
    }
}

/// One round of writes, in the order the module names. What is written is taken out of `d`,
/// so that a failed round leaves only the rest to the next.
async fn round(
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    job: &DecentralizedTrainingJob,
    d: &mut Decision,
    now: Timestamp,
) -> Result<(), Error> {
    if !ctx.leadership.may_write() {
        return Err(Error::NotLeading);
    }
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    children(ctx, &namespace, &name, d).await?;
    if !d.create.is_empty() {
        let (accepted, refused) = create_pods(ctx, &namespace, live, &d.create, now).await?;
        d.create.clear();
        answered(ctx, live, &namespace, &name, d, &accepted, &refused, now);
    }
    if !d.delete.is_empty() {
        delete_pods(ctx, &namespace, &d.delete).await?;
        d.delete.clear();
    }
    if d.persist {
        persist(ctx, live, job, d).await?;
    }
    live.lock()
        .driver
        .publish_topology(d.plan.document.as_deref(), d.plan.step);
    let due = {
        let l = live.lock();
        let (written, current) = match &l.status_written {
            Some((at, status)) => (Some(*at), Some(status)),
            None => (None, job.status.as_ref()),
        };
        decide::status_due(current, &d.plan.view.status, written, now)
    };
    if due {
        apply_status(ctx, job, &d.plan.view.status).await?;
        live.lock().status_written = Some((now, d.plan.view.status.clone()));
    }
    // Several at once: a join wave's plan names a score of members, and one at a time their
    // round trips were most of a 10 000-member job's writes.
    let events = d.kube_events();
    d.plan.events.clear();
    for batch in events.chunks(EVENTS_AT_ONCE) {
        let writes: Vec<_> = batch
            .iter()
            .map(|event| record_event(ctx, job, event, Decision::pod_of(&name, event)))
            .collect();
        futures::future::join_all(writes).await;
    }
    if d.delete_job {
        let jobs: Api<DecentralizedTrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
        match jobs.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("delete finished job", name)(e)),
        }
        ctx.metrics.wrote("job_delete", 1);
        d.delete_job = false;
    }
    Ok(())
}

/// The objects a member needs before it starts: the headless Service, the key Secret (an
/// earlier job's of the same name deleted first: it is immutable), the PodDisruptionBudget,
/// the NetworkPolicy.
async fn children(
    ctx: &Context,
    namespace: &str,
    name: &str,
    d: &mut Decision,
) -> Result<(), Error> {
    if let Some(service) = &d.service {
        apply_object(ctx, namespace, service, "service").await?;
        d.service = None;
    }
    if let Some(uid) = &d.replace_secret {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
        let name = resources::secret_name(name);
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
        d.replace_secret = None;
    }
    if let Some(secret) = &d.secret {
        apply_object(ctx, namespace, secret, "secret").await?;
        d.secret = None;
    }
    if let Some(policy) = &d.network_policy {
        apply_object(ctx, namespace, policy, "networkpolicy").await?;
        d.network_policy = None;
    }
    if let Some(budget) = &d.disruption_budget {
        apply_object(ctx, namespace, budget, "poddisruptionbudget").await?;
        d.disruption_budget = None;
    }
    Ok(())
}

/// The API server's answers to the round's creates, taken into its plan (whose memory is
/// written next, whose events are recorded), into what was decided meanwhile, and into the
/// job's memory, which the next plan starts from; that plan is asked for at once when the
/// answers change anything (a refusal's backoff, its condition).
#[allow(clippy::too_many_arguments)]
fn answered(
    ctx: &Context,
    live: &Mutex<Live>,
    namespace: &str,
    name: &str,
    d: &mut Decision,
    accepted: &[(MemberId, u32)],
    refused: &[(MemberId, u32, String)],
    now: Timestamp,
) {
    if let Some((_, _, why)) = refused.first() {
        tracing::warn!(
            refused = refused.len(),
            admitted = accepted.len(),
            reason = %why,
            "the API server refuses members' pods; the admitted ones run"
        );
    }
    let Some(events) = decide::answer(&mut d.plan, accepted, refused, now) else {
        return;
    };
    d.plan.events.extend(events);
    {
        let mut l = live.lock();
        if let Some((_, pending)) = l.behind.pending.as_mut() {
            decide::answer(&mut pending.plan, accepted, refused, now);
        }
        if let Some((state, events)) =
            decide::answer_state(l.driver.state(), accepted, refused, now)
        {
            l.driver.amend(state, &events, now);
        }
    }
    let _ = ctx.trigger.send(ObjectRef::new(name).within(namespace));
}

/// The memory the job's ConfigMap holds, as this operator wrote or compared it.
pub(super) struct KnownMemory {
    memory: Arc<Memory>,
    /// The ConfigMap's resourceVersion that holds it.
    version: Option<String>,
    /// The resourceVersion the cache showed before the write (None: no ConfigMap): a watch
    /// that has not shown the write yet still shows this one.
    replaced: Option<String>,
}

impl KnownMemory {
    /// The memory, while the cache (at `cached`, its resourceVersion) shows the ConfigMap that
    /// holds it or the one its write replaced; after anyone else's write, nothing is known.
    fn at(&self, cached: Option<&String>) -> Option<Arc<Memory>> {
        (cached == self.version.as_ref() || cached == self.replaced.as_ref())
            .then(|| self.memory.clone())
    }
}

/// Make the job's ConfigMap hold the round's memory, and remember what it holds.
async fn persist(
    ctx: &Context,
    live: &Mutex<Live>,
    job: &DecentralizedTrainingJob,
    d: &Decision,
) -> Result<(), Error> {
    let namespace = resources::namespace(job);
    let cached = ctx.stores.config_maps.get(
        &ObjectRef::new(&resources::config_map_name(&resources::name(job))).within(&namespace),
    );
    let cached_version = cached
        .as_ref()
        .and_then(|c| c.metadata.resource_version.clone());
    // Taken as an Arc: comparing it and serializing the plan's memory (at 10 000 members, tens
    // of milliseconds) happen outside the job's lock, which reconciles and trainers' posts take.
    let known = live
        .lock()
        .config_map_memory
        .as_ref()
        .and_then(|k| k.at(cached_version.as_ref()));
    let version = match decide::memory_write(
        job,
        &d.plan.memory,
        d.plan.document.as_deref(),
        cached.as_deref(),
        known.as_deref(),
    ) {
        MemoryWrite::Known => return Ok(()),
        MemoryWrite::Holds(version) => version,
        MemoryWrite::Write(config_map) => {
            apply_object(ctx, &namespace, config_map.as_ref(), "configmap")
                .await?
                .metadata
                .resource_version
        }
    };
    live.lock().config_map_memory = Some(KnownMemory {
        memory: Arc::new(d.plan.memory.clone()),
        version,
        replaced: cached_version,
    });
    Ok(())
}
