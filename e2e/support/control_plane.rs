//! A real Kubernetes control plane for a test: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok, built from their Go modules and started by `e2e/controlplane/up.sh`
//! in a state dir of the test's own, stopped by `down.sh` when dropped. Plus what tests do with
//! it: kubectl and helm, a kube client, kwok nodes, the operator as a process.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use super::tools;

/// CI sets it: a machine without Go fails these tests instead of skipping them.
pub const REQUIRE: &str = "MURMUR_REQUIRE_CONTROLPLANE";

pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scripts() -> PathBuf {
    repository().join("e2e/controlplane")
}

/// Where the control plane's binaries are built (kubectl, helm, ...): shared by every test.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("MURMUR_CONTROLPLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| scripts().join(".bin"))
}

/// Whether the tools to build the control plane are here; says why not (and fails under
/// `MURMUR_REQUIRE_CONTROLPLANE`).
pub fn available(test: &str) -> bool {
    tools::available(
        test,
        &[
            ("go", "golang (Go 1.26: https://go.dev/dl)"),
            ("openssl", "openssl"),
            ("curl", "curl"),
        ],
        REQUIRE,
    )
}

/// Whether real nodes can run here (`up.sh --real-nodes`, `nodes.sh`): the control plane's
/// tools, podman and mmdebstrap, and root; says why not (and fails under
/// `MURMUR_REQUIRE_CONTROLPLANE`).
pub fn real_nodes_available(test: &str) -> bool {
    if !available(test)
        || !tools::available(
            test,
            &[
                ("ip", "iproute2"),
                ("podman", "podman"),
                ("mmdebstrap", "mmdebstrap"),
                ("catatonit", "catatonit"),
                ("jq", "jq"),
            ],
            REQUIRE,
        )
    {
        return false;
    }
    let uid = Command::new("id").arg("-u").output().expect("run id -u");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        assert!(
            std::env::var_os(REQUIRE).is_none(),
            "{REQUIRE} is set, but real nodes need root"
        );
        eprintln!("SKIPPED {test}: real nodes need root");
        return false;
    }
    true
}

/// Build the binaries if they are missing (minutes cold, seconds with a warm Go cache); once
/// per test process, whatever the number of test threads asking.
pub fn build() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(build_now);
}

fn build_now() {
    let started = Instant::now();
    let status = Command::new(scripts().join("build.sh"))
        .env("MURMUR_CONTROLPLANE_BIN", bin_dir())
        .status()
        .expect("run e2e/controlplane/build.sh");
    assert!(status.success(), "e2e/controlplane/build.sh failed");
    let took = started.elapsed();
    if took > Duration::from_secs(5) {
        eprintln!("control plane built in {:.0} s", took.as_secs_f64());
    }
}

/// `helm` from the control plane's build (built if missing).
pub fn helm(args: &[&str]) -> Output {
    build();
    Command::new(bin_dir().join("helm"))
        .args(args)
        .current_dir(repository())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("murmur-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("murmur-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("murmur-helm-data"),
        )
        .output()
        .expect("run helm")
}

/// The text of a command that must succeed.
pub fn stdout_of(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub server: String,
    env: Vec<(String, String)>,
}

impl ControlPlane {
    /// Start a control plane in a state dir of its own (`tag` names it). `apiserver_args`:
    /// extra kube-apiserver flags; `controller_manager_args` likewise.
    pub fn up(tag: &str, apiserver_args: &str, controller_manager_args: &str) -> Self {
        Self::start(tag, &[], apiserver_args, controller_manager_args)
    }

    /// A control plane ready for real nodes (`up.sh --real-nodes`: the node network, cluster
    /// DNS); add them with [`ControlPlane::add_node`].
    pub fn up_for_real_nodes(tag: &str) -> Self {
        Self::start(tag, &["--real-nodes"], "", "")
    }

    fn start(
        tag: &str,
        args: &[&str],
        apiserver_args: &str,
        controller_manager_args: &str,
    ) -> Self {
        build();
        let dir = std::env::temp_dir().join(format!("murmur-cp-{tag}-{}", std::process::id()));
        let started = Instant::now();
        let out = Command::new(scripts().join("up.sh"))
            .args(args)
            .env("MURMUR_CONTROLPLANE_DIR", &dir)
            .env("MURMUR_CONTROLPLANE_BIN", bin_dir())
            .env("MURMUR_CONTROLPLANE_APISERVER_ARGS", apiserver_args)
            .env(
                "MURMUR_CONTROLPLANE_CONTROLLER_MANAGER_ARGS",
                controller_manager_args,
            )
            .stderr(Stdio::inherit())
            .output()
            .expect("run e2e/controlplane/up.sh");
        assert!(
            out.status.success(),
            "up.sh failed (logs in {})",
            dir.display()
        );
        eprintln!(
            "control plane up in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        let text = std::fs::read_to_string(dir.join("env")).expect("up.sh wrote its env file");
        let env: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |key: &str| {
            env.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{key} missing from {}/env", dir.display()))
        };
        Self {
            kubeconfig: PathBuf::from(get("KUBECONFIG")),
            server: get("MURMUR_CONTROLPLANE_SERVER"),
            dir,
            env,
        }
    }

    /// The address real nodes and their pods reach this machine at (`up.sh --real-nodes`).
    pub fn host_ip(&self) -> &str {
        self.env
            .iter()
            .find(|(k, _)| k == "MURMUR_CONTROLPLANE_HOST_IP")
            .map(|(_, v)| v.as_str())
            .expect("up.sh --real-nodes names the host's address")
    }

    /// `nodes.sh ARGS...` on this instance, which must succeed: its stdout.
    pub fn nodes(&self, args: &[&str]) -> String {
        let out = Command::new(scripts().join("nodes.sh"))
            .args(args)
            .env("MURMUR_CONTROLPLANE_DIR", &self.dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run e2e/controlplane/nodes.sh");
        stdout_of(&format!("nodes.sh {}", args.join(" ")), out)
    }

    /// A real node (`nodes.sh add`), Ready: the seconds it took.
    pub fn add_node(&self, name: &str, zone: &str, labels: &[&str]) -> f64 {
        let mut args = vec!["add", name, "--zone", zone];
        for l in labels {
            args.extend(["--label", l]);
        }
        let out = self.nodes(&args);
        out.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("nodes.sh add printed {out:?}"))
    }

    /// kubectl as the admin (system:masters).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(args, None)
    }

    /// Wait (at most a minute) until the CRD `name` is Established.
    pub fn wait_established(&self, name: &str) {
        self.wait_crd_condition(name, "Established", "True");
    }

    /// Wait (at most a minute) until CRD `name`'s `condition` reads `status`. Polled, because
    /// `kubectl wait` fails at once when it reads a CRD the API server has not given conditions
    /// yet ("<nil> is of the type <nil>"), as it can right after the CRD is created.
    pub fn wait_crd_condition(&self, name: &str, condition: &str, status: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let out = self.kubectl(&[
                "get",
                &format!("crd/{name}"),
                "-o",
                &format!("jsonpath={{.status.conditions[?(@.type==\"{condition}\")].status}}"),
            ]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == status {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "crd/{name} not {condition}={status} within 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// kubectl with `input` on its stdin.
    pub fn kubectl_with(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut child = Command::new(bin_dir().join("kubectl"))
            .args(args)
            .current_dir(repository())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        if let Some(input) = input {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        stdout_of(&format!("kubectl {}", args.join(" ")), self.kubectl(args))
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        stdout_of(
            "kubectl apply -f -",
            self.kubectl_with(&["apply", "-f", "-"], Some(yaml)),
        )
    }

    /// helm against this cluster.
    pub fn helm(&self, args: &[&str]) -> Output {
        let mut all = vec!["--kubeconfig", self.kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        helm(&all)
    }

    /// A client as the admin.
    pub async fn client(&self) -> kube::Client {
        client_of(&self.kubeconfig).await
    }

    /// A client as the admin that takes a 429 as the answer (kube's client retries it).
    pub async fn client_without_retries(&self) -> kube::Client {
        let mut config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&self.kubeconfig).expect("a kubeconfig"),
            &KubeConfigOptions::default(),
        )
        .await
        .expect("a client configuration");
        config.default_retry = false;
        kube::Client::try_from(config).expect("a client")
    }

    /// A kubeconfig that authenticates as a ServiceAccount (a bound token, one hour), written
    /// into the state dir: how an operator runs out of cluster "as its ServiceAccount".
    pub fn service_account_kubeconfig(&self, namespace: &str, account: &str) -> PathBuf {
        let token =
            self.kubectl_ok(&["create", "token", account, "-n", namespace, "--duration=2h"]);
        let admin = std::fs::read_to_string(&self.kubeconfig).unwrap();
        let ca = admin
            .lines()
            .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
            .expect("the admin kubeconfig embeds the CA");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: murmur\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: {account}\n  user:\n    token: {}\ncontexts:\n- name: murmur\n  context: {{cluster: murmur, user: {account}, namespace: {namespace}}}\ncurrent-context: murmur\n",
            self.server,
            token.trim()
        );
        let path = self.dir.join(format!("kubeconfig-{namespace}-{account}"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `restart.sh`: SIGKILL `components` (etcd, kube-apiserver, ...), wait `down_for`, start
    /// them again on the same data; what it printed.
    pub fn restart(&self, components: &[&str], down_for: Duration) -> String {
        let out = Command::new(scripts().join("restart.sh"))
            .args(["--down-for", &down_for.as_secs().to_string()])
            .args(components)
            .env("MURMUR_CONTROLPLANE_DIR", &self.dir)
            .output()
            .expect("run restart.sh");
        assert!(
            out.status.success(),
            "restart.sh {components:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `kueue.sh`: Kueue's controller and webhooks running against this control plane (the
    /// pod integration, for pods labelled with a queue).
    pub fn start_kueue(&self) {
        let started = Instant::now();
        let out = Command::new(scripts().join("kueue.sh"))
            .env("MURMUR_CONTROLPLANE_DIR", &self.dir)
            .env("MURMUR_CONTROLPLANE_BIN", bin_dir())
            .stderr(Stdio::inherit())
            .output()
            .expect("run e2e/controlplane/kueue.sh");
        assert!(
            out.status.success(),
            "kueue.sh failed (its log: {})",
            self.dir.join("logs/kueue.log").display()
        );
        eprintln!("Kueue up in {:.1} s", started.elapsed().as_secs_f64());
    }

    /// A log of the API server's, as up.sh keeps it.
    pub fn log(&self, component: &str) -> String {
        std::fs::read_to_string(self.dir.join("logs").join(format!("{component}.log")))
            .unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let status = Command::new(scripts().join("down.sh"))
            .env("MURMUR_CONTROLPLANE_DIR", &self.dir)
            .stdout(Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("down.sh failed for {}", self.dir.display());
        }
    }
}

pub async fn client_of(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).expect("a kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("a client configuration");
    kube::Client::try_from(config).expect("a client")
}

/// What a kwok node is: its labels, taints, zone and size.
#[derive(Clone, Debug)]
pub struct NodeShape {
    pub name: String,
    pub zone: String,
    pub labels: Vec<(String, String)>,
    pub taints: Vec<(String, String)>,
    pub cpu: String,
    pub memory: String,
}

impl NodeShape {
    pub fn on_demand(name: &str, zone: &str) -> Self {
        Self {
            name: name.into(),
            zone: zone.into(),
            labels: Vec::new(),
            taints: Vec::new(),
            cpu: "2".into(),
            memory: "4Gi".into(),
        }
    }

    /// A spot node as `cloud` labels (and taints) it: gke, eks, karpenter or aks.
    pub fn spot(name: &str, zone: &str, cloud: &str) -> Self {
        type Pairs = &'static [(&'static str, &'static str)];
        let (labels, taints): (Pairs, Pairs) = match cloud {
            "gke" => (
                &[("cloud.google.com/gke-spot", "true")],
                &[("cloud.google.com/gke-spot", "true")],
            ),
            "eks" => (&[("eks.amazonaws.com/capacityType", "SPOT")], &[]),
            "karpenter" => (&[("karpenter.sh/capacity-type", "spot")], &[]),
            "aks" => (
                &[("kubernetes.azure.com/scalesetpriority", "spot")],
                &[("kubernetes.azure.com/scalesetpriority", "spot")],
            ),
            other => panic!("no cloud {other}"),
        };
        let own = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Self {
            labels: own(labels),
            taints: own(taints),
            ..Self::on_demand(name, zone)
        }
    }

    /// The Node object: kwok manages it (the annotation), it reports its size as allocatable.
    pub fn node(&self) -> Node {
        let mut labels = serde_json::Map::new();
        labels.insert("kubernetes.io/hostname".into(), json!(self.name));
        labels.insert("kubernetes.io/os".into(), json!("linux"));
        labels.insert("topology.kubernetes.io/zone".into(), json!(self.zone));
        labels.insert("type".into(), json!("kwok"));
        for (k, v) in &self.labels {
            labels.insert(k.clone(), json!(v));
        }
        let taints: Vec<Value> = self
            .taints
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v, "effect": "NoSchedule"}))
            .collect();
        let size = json!({"cpu": self.cpu, "memory": self.memory, "pods": "20"});
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": taints},
            "status": {"allocatable": size, "capacity": size},
        }))
        .unwrap()
    }
}

/// `murmur operator` as a process, against `kubeconfig`; stopped (TERM) when dropped.
pub struct Operator {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Operator {
    pub fn start(kubeconfig: &Path, log: PathBuf, extra: &[&str]) -> Self {
        let port = free_port();
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_murmur"))
            .arg("operator")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--log-format", "text"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("MURMUR_E2E_OPERATOR_LOG")
                    .unwrap_or_else(|_| "info,murmur=debug,kube=warn".into()),
            )
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start murmur operator");
        Self { child, port, log }
    }

    /// Until it exits (or `within` passes): its exit code and log.
    pub fn wait(mut self, within: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + within;
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        (code, std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the operator");
    }

    /// SIGTERM, then [`Operator::wait`].
    pub fn wait_after_term(self, within: Duration) -> (Option<i32>, String) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait(within)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

/// A free port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Poll `check` until it returns Some, or panic with `what` after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
