//! The operator process: preflight, the status router, leader election, and the controller
//! until shutdown.

use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use futures::{FutureExt, StreamExt};
use kube::Client;
use kube::api::Api;

use super::context::Context;
use super::reconcile::reconcile;
use super::watch::{Writers, controller, sweep_deleted_jobs};
use super::writes::error_policy;
use super::{OperatorMetrics, Settings, access, lease, preflight};
use crate::status::{Hub, Role};
use murmur_core::api::traffic::Prices;

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    pub settings: Settings,
    /// Where the status router (API, dashboard, control endpoint, metrics) listens.
    pub listen: String,
    /// Observer reads the status router serves per second (0: unpaced).
    pub reads_per_second: u32,
    /// What model traffic costs, by locality.
    pub prices: Prices,
    /// Observers' tokens must be issued for one of these audiences (empty: the API server's).
    pub token_audiences: Vec<String>,
    /// Reconciles of different jobs in flight at once.
    pub concurrency: u16,
    /// Leader election; None runs without (a single replica).
    pub lease: Option<LeaseOptions>,
    pub instance: String,
    /// How long to wait at start-up for the CRD to be Established.
    pub crd_wait: Duration,
    /// The operator's own pod, when it runs in one: labelled while it leads.
    pub pod: Option<PodName>,
}

#[derive(Clone, Debug)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no Kubernetes configuration (in-cluster service account or kubeconfig): {0}")]
    Config(#[source] kube::Error),
    #[error(transparent)]
    Preflight(#[from] preflight::PreflightError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("lost the leader lease {0}; exiting so another replica takes over")]
    LostLease(String),
    #[error("cannot label the operator's pod {pod}: {source}")]
    Label { pod: String, source: kube::Error },
}

/// Run the operator until SIGTERM / Ctrl-C (or until it loses its lease).
pub async fn run(options: OperatorOptions) -> Result<(), OperatorError> {
    // Caught from the first instant. In a container the operator is PID 1, which the kernel
    // spares every signal it has no handler for: a standby told to stop during a rolling update
    // would ignore SIGTERM, take the lease its predecessor released, and lead until the kubelet
    // killed it, leaving the lease held for its whole duration after.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let config = kube::Config::infer()
        .await
        .map_err(|e| OperatorError::Config(kube::Error::InferConfig(e)))?;
    run_with(api_client(config)?, options, shutdown).await
}

/// The operator's client of the API server. A request the server sheds (429: API priority and
/// fairness under load; 503, 504) is tried again, up to 15 times, after a doubling backoff or
/// the server's `Retry-After` (kube's retry layer, kept on here whatever the config says): a
/// burst of pod creates slows down rather than fails.
fn api_client(mut config: kube::Config) -> Result<Client, OperatorError> {
    config.default_retry = true;
    Client::try_from(config).map_err(OperatorError::Config)
}

/// The operator against `client` until `shutdown` completes: at once if it completes before
/// this replica leads.
pub async fn run_with(
    client: Client,
    options: OperatorOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), OperatorError> {
    let shutdown = shutdown.boxed().shared();
    preflight::check(
        &client,
        options.settings.network_policies.is_some(),
        options.lease.as_ref().map(|l| l.namespace.as_str()),
        options.crd_wait,
    )
    .await?;
    let (hub, metrics) = serve_status(&client, &options).await?;
    // A restarted container keeps its pod's labels: it says it leads only once it does again.
    let label = options.pod.as_ref().map(|pod| {
        lease::LeaderLabel::new(Api::namespaced(client.clone(), &pod.namespace), &pod.name)
    });
    if let Some(label) = &label {
        label
            .set(false)
            .await
            .map_err(|source| OperatorError::Label {
                pod: label.pod().to_string(),
                source,
            })?;
    }

    let elector = options.lease.as_ref().map(|l| {
        lease::Elector::new(
            Api::namespaced(client.clone(), &l.namespace),
            &l.name,
            &options.instance,
            l.duration,
        )
    });
    let leadership = match &elector {
        Some(e) => {
            // Ready while waiting: a rolling update of the operator replaces the leader only
            // once its successor is Ready.
            hub.set_role(Role::Standby);
            tokio::select! {
                _ = e.acquire() => {}
                _ = shutdown.clone() => {
                    tracing::info!("shutting down: never led");
                    return Ok(());
                }
            }
            tracing::info!(identity = e.identity(), "leading");
            e.leadership()
        }
        None => Arc::new(lease::Leadership::unelected()),
    };

    let with_policies = options.settings.network_policies.is_some();
    let (stores, writers) = Writers::new(with_policies);
    let jobs = stores.jobs.clone();
    let (ctx, triggered) = Context::new(
        client.clone(),
        stores.stores,
        hub.clone(),
        metrics,
        options.settings.clone(),
        options.instance.clone(),
        leadership,
    );
    // Leading; the Service selects this replica once every cache has listed.
    let caches = ctx.stores.clone();
    let leader_label = label.clone();
    let (role, after_leading) = (hub.clone(), hub.clone());
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        caches.ready().await;
        if let Some(label) = &leader_label {
            let labelled = || label.set(true);
            let _ = labelled
                .retry(backon::ExponentialBuilder::default().without_max_times())
                .notify(|e, _| tracing::warn!(error = %e, "cannot label this pod as the leader"))
                .await;
        }
        // Told to stop meanwhile: it steps down rather than up.
        if stopping.peek().is_none() {
            hub.set_role(Role::Leading);
            tracing::info!("caches synced: leading");
        }
    });
    tokio::spawn(sweep_deleted_jobs(
        Arc::downgrade(&ctx),
        jobs.clone(),
        options.settings.resync,
    ));
    let writing = ctx.clone();
    let controller = controller(&client, writers, jobs, &ctx, options.concurrency)
        .reconcile_on(futures::stream::unfold(triggered, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }))
        .graceful_shutdown_on(shutdown.map(move |()| {
            // No reconcile will read what trainers post from now on: they are refused, and
            // their view streams end, so that they go to the next leader.
            role.set_role(Role::Standby);
            tracing::info!("shutting down: finishing reconciles in flight");
        }))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller");
            }
        });
    let lost = match &elector {
        Some(e) => {
            tokio::select! {
                _ = controller => false,
                _ = e.keep() => true,
            }
        }
        None => {
            controller.await;
            false
        }
    };
    // Stopped or lost the Lease: trainers are refused from here on, to go to the next leader.
    after_leading.set_role(Role::Standby);
    // What the last reconciles decided is written while this replica still leads: its
    // successor would decide it again, but a burst of creates half made would wait for that.
    if !lost {
        writing.all_writes_settled(WRITES_AT_SHUTDOWN).await;
    }
    // Stop being selected by the Service before the next leader can take over.
    if let Some(label) = &label {
        let cleared = tokio::time::timeout(Duration::from_secs(2), label.set(false)).await;
        if !matches!(cleared, Ok(Ok(()))) {
            tracing::warn!("cannot take the leader label off this pod");
        }
    }
    match &elector {
        Some(e) if lost => Err(OperatorError::LostLease(e.identity().to_string())),
        Some(e) => {
            e.release().await;
            Ok(())
        }
        None => Ok(()),
    }
}

/// How long a stopping replica writes what it decided before it lets go of its lease.
const WRITES_AT_SHUTDOWN: Duration = Duration::from_secs(10);

/// The status router (API, dashboard, control endpoint, metrics) on `options.listen`, not
/// Ready until it knows whether it leads. The Service selects the leader's pod by its label
/// ([`lease::LeaderLabel`]), so trainers' posts and users reach the replica that runs the jobs.
/// Observers are whom the cluster says they are, and read what RBAC lets them `get`
/// ([`access`]).
async fn serve_status(
    client: &Client,
    options: &OperatorOptions,
) -> Result<(Arc<Hub>, Arc<OperatorMetrics>), OperatorError> {
    let mut hub = Hub::with_prices(options.prices);
    let metrics = Arc::new(OperatorMetrics::register(&mut hub.metrics.registry));
    let hub = Arc::new(hub);
    hub.set_role(Role::Starting);
    let listener = crate::status::listen(&options.listen)
        .await
        .map_err(|source| OperatorError::Bind {
            address: options.listen.clone(),
            source,
        })?;
    tracing::info!(address = %options.listen, "status API, dashboard and control endpoint listening");
    tokio::spawn(crate::status::serve(
        listener,
        crate::status::router(
            hub.clone(),
            Arc::new(access::ClusterAccess::new(
                client.clone(),
                options.token_audiences.clone(),
            )),
            options.reads_per_second,
        ),
    ));
    Ok((hub, metrics))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::StatusCode;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    use kube::api::PostParams;

    use super::api_client;

    /// An API server that sheds the first `shed` pod creates with 429, as API priority and
    /// fairness does under load, and admits the rest.
    async fn shedding_server(shed: usize) -> (String, Arc<AtomicUsize>) {
        let creates = Arc::new(AtomicUsize::new(0));
        let seen = creates.clone();
        let app = axum::Router::new().route(
            "/api/v1/namespaces/ml/pods",
            axum::routing::post(move |body: String| {
                let seen = seen.clone();
                async move {
                    if seen.fetch_add(1, Ordering::SeqCst) < shed {
                        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,"message":"too many requests"}"#;
                        return (StatusCode::TOO_MANY_REQUESTS, [("Retry-After", "0")], status.to_string());
                    }
                    (StatusCode::CREATED, [("Content-Type", "application/json")], body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, creates)
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "job-0-0", "namespace": "ml"},
            "spec": {"containers": [{"name": "trainer", "image": "murmur-trainer"}]}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_create_the_api_server_sheds_is_tried_again_after_a_backoff() {
        let (url, creates) = shedding_server(3).await;
        let mut config = kube::Config::new(url.parse().unwrap());
        // Whatever a kubeconfig or a test says, the operator's client retries.
        config.default_retry = false;
        let pods: Api<Pod> = Api::namespaced(api_client(config).unwrap(), "ml");
        let created = pods.create(&PostParams::default(), &pod()).await;
        assert_eq!(created.unwrap().metadata.name.as_deref(), Some("job-0-0"));
        assert_eq!(
            creates.load(Ordering::SeqCst),
            4,
            "three shed, the fourth admitted"
        );
    }
}
