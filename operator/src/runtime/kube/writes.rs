//! The writes a decision makes (pods, applied objects, the job's status), its Kubernetes
//! Events, and the retry policy of a failed reconcile.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::topology::MemberId;
use parking_lot::Mutex;

use super::cached_pod::CachedPod;
use super::context::{Context, Live};
use super::decide::NewPod;
use super::error::{Error, kube_err};
use super::events::{self, NewEvent};
use super::labels::LABEL_CLIQUE;
use super::resources;
use crate::planner;

/// Pods created at once, at most: the batches double from one up to this.
const CREATE_BATCH_MAX: usize = 64;

/// Create members' pods. They go in batches that double from one (as Kubernetes' Job
/// controller starts pods), so a quota or an admission policy that refuses them costs one
/// request, not one per member: after a batch with a refusal the rest are not tried, and count
/// as refused with it. Returns the admitted and the refused (member, attempt[, why]); an error
/// other than a refusal fails the round, whose creates are all tried again (kube's client has
/// already retried 429s and 503s with backoff; a pod that exists is the one its attempt wants).
pub(super) async fn create_pods(
    ctx: &Context,
    namespace: &str,
    live: &Mutex<Live>,
    create: &[NewPod],
    now: Timestamp,
) -> Result<(Vec<(MemberId, u32)>, Vec<(MemberId, u32, String)>), Error> {
    let pods: Api<CachedPod> = Api::namespaced(ctx.client.clone(), namespace);
    let m = &ctx.metrics;
    // Created, never applied: an attempt's pod is immutable, and an apply onto one that exists
    // (a round tried again after a failure) with a spec edited meanwhile is a 422 forever. One
    // that exists already is the one this attempt wants.
    let params = PostParams {
        field_manager: Some(ctx.settings.field_manager.clone()),
        ..Default::default()
    };
    let mut accepted = Vec::new();
    let mut refused: Vec<(MemberId, u32, String)> = Vec::new();
    let mut failed = None;
    let mut queue = create.iter();
    let mut batch = 1;
    while refused.is_empty() && failed.is_none() {
        let chunk: Vec<&NewPod> = queue.by_ref().take(batch).collect();
        if chunk.is_empty() {
            break;
        }
        // Awaited since the reconcile that decided it (`Timestamp::MAX`: the watch may show the
        // pod before the answer comes), and stamped with the answer's time: only a re-list
        // begun after the create was answered can prove the pod gone. Each pod is built only
        // for its request.
        let answers = futures::future::join_all(chunk.iter().map(|new| async {
            let pod = new.build(&ctx.settings);
            (
                new.attempt(),
                new.name(),
                create_pod(ctx, &pods, &params, &pod).await,
            )
        }))
        .await;
        {
            let answered = (ctx.clock)().max(now);
            let mut l = live.lock();
            for new in &chunk {
                if let Some(t) = l.created.get_mut(&new.attempt()) {
                    *t = answered;
                }
            }
        }
        for ((member, attempt), object, answer) in answers {
            match answer {
                Ok(_) => {
                    m.wrote("pod", 1);
                    accepted.push((member, attempt));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => accepted.push((member, attempt)),
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                    live.lock().created.remove(&(member, attempt));
                    refused.push((member, attempt, format!("{object}: {}", e.message)));
                }
                Err(e) => failed = Some(kube_err("create Pod", object)(e)),
            }
        }
        batch = (batch * 2).min(CREATE_BATCH_MAX);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some((_, _, why)) = refused.first().cloned() {
        for new in queue {
            refused.push((
                new.member,
                new.attempt,
                format!("{}: not tried after {why}", new.name()),
            ));
        }
    }
    Ok((accepted, refused))
}

/// Create `pod`, its answer decoded as the pod cache reads pods: the whole pod the API server
/// answers with (containers, volumes, environment) was decoded for nothing, 64 creates at a time.
async fn create_pod(
    ctx: &Context,
    pods: &Api<CachedPod>,
    params: &PostParams,
    pod: &Pod,
) -> Result<CachedPod, kube::Error> {
    let body = serde_json::to_vec(pod).map_err(kube::Error::SerdeError)?;
    let mut request = kube::core::Request::new(pods.resource_url())
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("create");
    ctx.client.request::<CachedPod>(request).await
}

/// Delete pods by name, each at once (grace 0) when asked: its node is gone, and no kubelet
/// will finish a graceful deletion. A pod already gone is fine.
pub(super) async fn delete_pods(
    ctx: &Context,
    namespace: &str,
    delete: &[(String, bool)],
) -> Result<(), Error> {
    // Answered as the pod cache reads pods: the answer's containers, volumes and environment
    // are never decoded.
    let pods: Api<CachedPod> = Api::namespaced(ctx.client.clone(), namespace);
    let deletes = delete.iter().cloned().map(|(object, at_once)| {
        let params = DeleteParams {
            grace_period_seconds: at_once.then_some(0),
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let pods = pods.clone();
        async move {
            match pods.delete(&object, &params).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(kube_err("delete Pod", object)(e)),
            }
        }
    });
    ctx.metrics
        .wrote("pod_delete", at_most_at_once(deletes).await?);
    Ok(())
}

/// The decision's clique labels, written off the reconcile's path once the job's memory is
/// committed: they follow the topology for `kubectl get pods -l`, and nothing waits for them (a
/// new topology of 10 000 members relabelled 9 000 pods in a minute, and its views waited for
/// that).
pub(super) async fn write_labels(
    ctx: &Context,
    namespace: &str,
    relabel: &[(String, u32)],
) -> Result<(), Error> {
    let pods: Api<CachedPod> = Api::namespaced(ctx.client.clone(), namespace);
    // Each patch is made as its request goes: a new topology relabels up to 500 pods a
    // reconcile, and their patches made up front were 0.7 MB of a 1 000-member peak.
    let relabels = relabel.iter().cloned().map(|(object, clique)| {
        let pods = pods.clone();
        async move {
            let patch = serde_json::json!({
                "metadata": {"labels": {LABEL_CLIQUE: clique.to_string()}}
            });
            match pods
                .patch(&object, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(kube_err("label Pod", object)(e)),
            }
        }
    });
    ctx.metrics
        .wrote("pod_label", at_most_at_once(relabels).await?);
    Ok(())
}

/// Pod writes in flight at once when many are due (deletes, relabels).
const WRITES_AT_ONCE: usize = 32;

/// Run `writes`, [`WRITES_AT_ONCE`] at a time: how many wrote something (false: nothing to
/// write, e.g. a 404), or the first error once all are done. Each write's future is made as it
/// starts: a pending API call's future is about a kilobyte, and the relabels' futures made up
/// front were 0.96 MB of a 1 000-member peak (heaptrack, `e2e/scale/run.sh --members 1000`).
async fn at_most_at_once<F>(writes: impl IntoIterator<Item = F>) -> Result<usize, Error>
where
    F: std::future::Future<Output = Result<bool, Error>>,
{
    use futures::StreamExt;
    let results: Vec<Result<bool, Error>> = futures::stream::iter(writes)
        .buffer_unordered(WRITES_AT_ONCE)
        .collect()
        .await;
    let mut wrote = 0;
    for r in results {
        wrote += usize::from(r?);
    }
    Ok(wrote)
}

/// Server-side apply one of a job's objects (by its own name), counted as a write of `kind`.
pub(super) async fn apply_object<K>(
    ctx: &Context,
    namespace: &str,
    object: &K,
    kind: &'static str,
) -> Result<K, Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.meta().name.clone().unwrap_or_default();
    let apply = PatchParams::apply(&ctx.settings.field_manager).force();
    let applied = api
        .patch(&name, &apply, &Patch::Apply(object))
        .await
        .map_err(kube_err("apply", format!("{} {name}", K::kind(&()))))?;
    ctx.metrics.wrote(kind, 1);
    Ok(applied)
}

/// Server-side apply of the job's status (its own subresource).
pub(super) async fn apply_status(
    ctx: &Context,
    job: &DecentralizedTrainingJob,
    status: &murmur_core::api::DecentralizedTrainingJobStatus,
) -> Result<(), Error> {
    let name = resources::name(job);
    let jobs: Api<DecentralizedTrainingJob> =
        Api::namespaced(ctx.client.clone(), &resources::namespace(job));
    let patch = serde_json::json!({
        "apiVersion": DecentralizedTrainingJob::api_version(&()),
        "kind": DecentralizedTrainingJob::kind(&()),
        "status": status,
    });
    let apply = PatchParams::apply(&ctx.settings.field_manager).force();
    jobs.patch_status(&name, &apply, &Patch::Apply(&patch))
        .await
        .map_err(kube_err("apply status of", name))?;
    ctx.metrics.wrote("status", 1);
    Ok(())
}

/// The `reportingController` of every Event the operator writes.
pub const REPORTING_CONTROLLER: &str = "murmur.dev/operator";

/// A job's event as a Kubernetes Event (events.k8s.io/v1) regarding the job and naming the
/// member's pod (a warning repeated within minutes is a series of the first).
/// An event that cannot be written is logged, never fatal: the status API has it already.
pub(super) async fn record_event(
    ctx: &Context,
    job: &DecentralizedTrainingJob,
    event: &planner::Event,
    pod: Option<String>,
) {
    let namespace = resources::namespace(job);
    let mut note = event.message.clone();
    // The API server refuses notes over 1 kB.
    if note.len() > 1024 {
        let mut cut = 1021;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let reason = event.reason.as_str().to_string();
    let new = NewEvent {
        type_: event.kind,
        action: event.action.clone().unwrap_or_else(|| reason.clone()),
        reason,
        note,
        regarding: events::Reference::job(&job.metadata),
        related: pod.map(|pod| events::Reference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: namespace.clone(),
            name: pod,
            uid: None,
        }),
    };
    match ctx.events.publish(&new, (ctx.clock)()).await {
        Ok(_) => ctx.metrics.wrote("event", 1),
        Err(e) => {
            ctx.metrics.error("event");
            tracing::warn!(reason = event.reason.as_str(), error = %e, "cannot record event");
        }
    }
}

/// A failed reconcile is retried after a delay that doubles from [`RETRY_FIRST`] with each
/// failure in a row, up to [`RETRY_MAX`] (with jitter), as controller-runtime's rate limiter
/// does; a reconcile that succeeds starts the job's sequence again. Any change to the job or
/// its objects still reconciles it at once.
pub fn error_policy(
    job: Arc<DecentralizedTrainingJob>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.error(error.kind());
    let delay = ctx.retry_delay((resources::namespace(&job), resources::name(&job)));
    tracing::warn!(namespace = ?job.namespace(), job = %job.name_any(), error = %error, retry_in = ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// The first retry of a failed reconcile.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between retries of a job that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(120);

pub(super) fn retry_delays() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_FIRST)
        .with_max_delay(RETRY_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// A thousand writes: never more than [`WRITES_AT_ONCE`] of their futures exist at once
    /// (made and not yet done), and every write is counted.
    #[tokio::test]
    async fn each_write_is_made_as_it_starts_and_never_more_than_at_once() {
        let (made, done, most) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let writes = (0..1000).map(|k| {
            let alive = made.fetch_add(1, SeqCst) + 1 - done.load(SeqCst);
            most.fetch_max(alive, SeqCst);
            let done = &done;
            async move {
                tokio::task::yield_now().await;
                done.fetch_add(1, SeqCst);
                Ok(k % 4 != 0)
            }
        });
        assert_eq!(at_most_at_once(writes).await.unwrap(), 750);
        assert_eq!(done.load(SeqCst), 1000);
        let most = most.load(SeqCst);
        assert!(
            (2..=WRITES_AT_ONCE).contains(&most),
            "{most} writes alive at once"
        );
    }
}
