//! What most scenarios share: a namespace, kwok nodes, the operator (installed by helm, run as
//! its ServiceAccount), jobs made from the examples, and trainers' join reports posted the way a
//! trainer posts them (signed with the job's key from its Secret) — with kwok nothing runs in a
//! pod, so the test speaks for the trainers.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use murmur_core::contract::{JoinReport, control};
use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::{NodeShape, Operator, eventually};
use super::crd::{example, merge};
use super::helm;

pub const MINUTE: Duration = Duration::from_secs(60);

pub struct Scene<'a> {
    pub env: &'a Env,
    pub ns: String,
    pub client: kube::Client,
    pub operator: Operator,
    nodes: Vec<String>,
}

impl<'a> Scene<'a> {
    /// A namespace `ns`, the operator running (with `flags`) and ready.
    pub async fn new(env: &'a Env, ns: &str, flags: &[&str]) -> Self {
        env.cp.kubectl_ok(&["create", "namespace", ns]);
        let mut operator = helm::operator(env, &format!("{ns}-operator.log"), flags);
        helm::ready(&mut operator).await;
        Self {
            env,
            ns: ns.to_string(),
            client: env.cp.client().await,
            operator,
            nodes: Vec::new(),
        }
    }

    /// The operator's control endpoint (what trainers post to).
    /// A token of a ServiceAccount in the scene's namespace that may get its jobs (the chart's
    /// job-viewer role): what the status API asks of an observer.
    pub fn observer_token(&self) -> String {
        let cp = &self.env.cp;
        let exists = cp
            .kubectl(&["-n", &self.ns, "get", "serviceaccount", "observer"])
            .status
            .success();
        if !exists {
            cp.kubectl_ok(&["-n", &self.ns, "create", "serviceaccount", "observer"]);
            cp.kubectl_ok(&[
                "-n",
                &self.ns,
                "create",
                "rolebinding",
                "observer",
                "--clusterrole=murmur-operator-job-viewer",
                &format!("--serviceaccount={}:observer", self.ns),
            ]);
        }
        cp.kubectl_ok(&["-n", &self.ns, "create", "token", "observer"])
            .trim()
            .to_string()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.operator.port)
    }

    pub async fn add_nodes(&mut self, shapes: &[NodeShape]) {
        let api: Api<Node> = Api::all(self.client.clone());
        for shape in shapes {
            api.create(&PostParams::default(), &shape.node())
                .await
                .unwrap_or_else(|e| panic!("create node {}: {e}", shape.name));
            self.nodes.push(shape.name.clone());
        }
        // kwok marks them Ready.
        for shape in shapes {
            let name = shape.name.clone();
            eventually(&format!("node {name} Ready"), MINUTE, || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let node = api.get(&name).await.ok()?;
                    let ready = node
                        .status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    ready.then_some(())
                }
            })
            .await;
        }
    }

    pub async fn remove_nodes(&mut self) {
        let api: Api<Node> = Api::all(self.client.clone());
        for name in std::mem::take(&mut self.nodes) {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }

    /// Apply the example job `file` named `name`, patched by `patch` (a JSON merge patch).
    pub fn job(&self, file: &str, name: &str, patch: Value) -> Value {
        let mut job = example(file);
        job["metadata"]["name"] = json!(name);
        job["metadata"]["namespace"] = json!(self.ns);
        merge(&mut job, &patch);
        self.env.cp.apply(&serde_json::to_string(&job).unwrap());
        job
    }

    pub async fn job_object(&self, name: &str) -> Value {
        let out = self
            .env
            .cp
            .kubectl_ok(&["get", "dtj", name, "-n", &self.ns, "-o", "json"]);
        serde_json::from_str(&out).unwrap()
    }

    /// The job's `.status`, once it has one.
    pub async fn status(&self, name: &str) -> Value {
        self.job_object(name).await["status"].clone()
    }

    /// Wait until `check` holds of the job's status.
    pub async fn until_status(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let status = self.status(name).await;
            if check(&status) {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out: {what}; status {status:#}\noperator log:\n{}",
                tail(&self.operator.logs())
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The job's pods.
    pub async fn pods(&self, job: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default().labels(&format!("murmur.dev/job={job}")))
            .await
            .unwrap()
            .items
    }

    /// Wait until `n` of the job's pods are Running (kwok fakes it), by member.
    pub async fn running(&self, job: &str, n: usize) -> BTreeMap<u32, Pod> {
        let deadline = std::time::Instant::now() + 2 * MINUTE;
        loop {
            let pods = self.pods(job).await;
            let running: BTreeMap<u32, Pod> = pods
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .filter_map(|p| Some((member_of(p)?, p.clone())))
                .collect();
            if running.len() >= n {
                return running;
            }
            if std::time::Instant::now() >= deadline {
                let seen: Vec<String> = pods
                    .iter()
                    .map(|p| {
                        let status = p.status.clone().unwrap_or_default();
                        format!(
                            "{} on {:?}: {:?} {:?}",
                            p.metadata.name.as_deref().unwrap_or("?"),
                            node_of(p),
                            status.phase,
                            status
                                .conditions
                                .unwrap_or_default()
                                .iter()
                                .map(|c| format!("{}={} {:?}", c.type_, c.status, c.message))
                                .collect::<Vec<_>>()
                        )
                    })
                    .collect();
                panic!(
                    "only {} of {n} pods of {job} running; pods:\n{}\noperator log:\n{}",
                    running.len(),
                    seen.join("\n"),
                    tail(&self.operator.logs())
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The job's key, as its trainers read it from the Secret.
    pub async fn key(&self, job: &str) -> Vec<u8> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        let secret = api.get(&format!("{job}-peer-key")).await.unwrap();
        secret.data.unwrap()["peer-key"].0.clone()
    }

    /// Members `ids` post their join reports (member i holds classes 2i mod 10 and 2i+1 mod 10,
    /// as `classesPerMember: 2` deals them).
    pub async fn join(&self, job: &str, ids: impl IntoIterator<Item = u32>) {
        let key = self.key(job).await;
        let http = reqwest::Client::new();
        for id in ids {
            let mut histogram = vec![0u64; 10];
            histogram[(2 * id as usize) % 10] = 50;
            histogram[(2 * id as usize + 1) % 10] = 50;
            let body = serde_json::to_vec(&JoinReport {
                member_id: id,
                label_histogram: histogram,
                proxy_vector: None,
            })
            .unwrap();
            let path = control::join_path(&self.ns, job, id);
            let url = format!("{}{path}", self.endpoint());
            // As a trainer numbers its posts: from the time in microseconds, so a replacement's
            // join (a later call) is above its predecessor's.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let envelope = control::Envelope {
                attempt: 0,
                sequence: now.as_micros() as u64,
                time_ms: now.as_millis() as u64,
            };
            let mut request = http.post(&url).header("content-type", "application/json");
            for (name, value) in control::signed_headers(&key, "POST", &path, &envelope, &body) {
                request = request.header(name, value);
            }
            let response = request.body(body).send().await.unwrap();
            let status = response.status();
            assert!(
                status.is_success(),
                "join of member {id}: {status} {}",
                response.text().await.unwrap_or_default()
            );
        }
    }

    /// Until the job is `Running` with `n` members: each member's current attempt joins, again
    /// whenever the operator replaced one meanwhile (a zone-aware job moves members whose pod
    /// landed outside their clique's zone once the topology is built).
    pub async fn until_running(&self, job: &str, n: usize) {
        let deadline = std::time::Instant::now() + MINUTE;
        loop {
            let pods = self.running(job, n).await;
            self.join(job, pods.keys().copied()).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let status = self.status(job).await;
            if status["phase"] == "Running" {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out: running; status {status:#}\noperator log:\n{}",
                tail(&self.operator.logs())
            );
        }
    }

    /// The Events regarding the job.
    pub async fn events(&self, job: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(job))
            .collect()
    }

    /// Until one of the job's events satisfies `matches` (events are written after the status
    /// and the pods, so a test that saw those may look before the event is there).
    pub async fn event(&self, job: &str, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
        eventually(what, Duration::from_secs(30), || async {
            self.events(job).await.into_iter().find(|e| matches(e))
        })
        .await
    }

    /// The version of the topology document in the job's ConfigMap.
    pub async fn topology_version(&self, job: &str) -> Option<u64> {
        self.topology(job).await?["version"].as_u64()
    }

    /// The ids of the members in the topology document in the job's ConfigMap.
    pub async fn topology_members(&self, job: &str) -> Option<Vec<u32>> {
        let doc = self.topology(job).await?;
        doc["members"]
            .as_array()?
            .iter()
            .map(|m| m["id"].as_u64().map(|id| id as u32))
            .collect()
    }

    /// The topology document in the job's ConfigMap.
    async fn topology(&self, job: &str) -> Option<Value> {
        let out = self.env.cp.kubectl(&[
            "get",
            "configmap",
            &format!("{job}-topology"),
            "-n",
            &self.ns,
            "-o",
            "jsonpath={.data.topology\\.json}",
        ]);
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Delete the namespace and the nodes (the next scenario starts clean).
    pub async fn finish(mut self) {
        self.env
            .cp
            .kubectl_ok(&["delete", "namespace", &self.ns, "--wait=false"]);
        self.remove_nodes().await;
    }
}

pub fn member_of(pod: &Pod) -> Option<u32> {
    pod.metadata
        .labels
        .as_ref()?
        .get("murmur.dev/member")?
        .parse()
        .ok()
}

pub fn attempt_of(pod: &Pod) -> Option<u32> {
    pod.metadata
        .labels
        .as_ref()?
        .get("murmur.dev/attempt")?
        .parse()
        .ok()
}

pub fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// Whether a status (a job's, a Workload's) has the condition `kind` with `status`.
pub fn has_condition(st: &Value, kind: &str, status: &str) -> bool {
    st["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == status))
}

/// The condition `kind` of a status (a job's, a Workload's).
pub fn condition_of(st: &Value, kind: &str) -> Value {
    st["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} condition: {st:#}"))
}

/// The last lines of a log, for a failure message.
pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
