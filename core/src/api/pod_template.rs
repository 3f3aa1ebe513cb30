//! `spec.trainer.podTemplate`: what a job adds to its members' pods — labels and annotations,
//! volumes and the trainer container's mounts, environment and resources, placement, identity,
//! security, and its own init and sidecar containers — in the shape of a Kubernetes pod
//! template. murmur builds the pod and merges the template in; the fields murmur owns (the
//! trainer's command, image, ports and termination message, its key and scratch volumes, its
//! `murmur.dev/` labels and `MURMUR_` variables) are refused with the field named, by the CRD's
//! rules where CEL can say it and always by `murmur validate` and the operator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, HostAlias, LocalObjectReference, PodSecurityContext, Toleration, Volume,
};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::manifest::Violation;
use super::spec::DecentralizedTrainingJobSpec;

/// The container of the template that is murmur's trainer; every other container is a sidecar.
pub const TRAINER_CONTAINER: &str = "trainer";
/// Label and annotation prefix murmur keeps for itself.
pub const OWNED_PREFIX: &str = "murmur.dev/";
/// Volumes murmur mounts into the trainer: the peer key, a writable `/tmp`, the checkpoints.
pub const OWNED_VOLUMES: [&str; 3] = ["peer-key", "tmp", "checkpoints"];
/// Where the trainer finds the peer key.
pub const KEY_DIR: &str = "/var/run/murmur/peer-key";
/// Where the trainer keeps its checkpoints.
pub const CHECKPOINT_DIR: &str = "/var/lib/murmur/checkpoints";
/// Paths murmur mounts in the trainer container.
pub const OWNED_MOUNT_PATHS: [&str; 3] = [KEY_DIR, "/tmp", CHECKPOINT_DIR];
/// The trainer container's termination message (its outcome, read back by the operator).
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// A pod template: metadata and a pod spec restricted to what murmur merges.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.metadata) || !has(self.metadata.labels) || self.metadata.labels.all(k, !k.startsWith('murmur.dev/'))").message("trainer.podTemplate.metadata.labels: murmur.dev/ labels are murmur's own").field_path(".metadata.labels"))]
#[x_kube(validation = Rule::new("!has(self.metadata) || !has(self.metadata.annotations) || self.metadata.annotations.all(k, !k.startsWith('murmur.dev/'))").message("trainer.podTemplate.metadata.annotations: murmur.dev/ annotations are murmur's own").field_path(".metadata.annotations"))]
#[x_kube(validation = Rule::new("!has(self.spec) || !has(self.spec.containers) || self.spec.containers.all(c, c.name != 'trainer' || (!has(c.command) && !has(c.args) && !has(c.image) && !has(c.ports) && !has(c.terminationMessagePath)))").message("trainer.podTemplate.spec.containers[trainer]: command, args, image, ports and terminationMessagePath are murmur's (the image is trainer.image)").field_path(".spec.containers"))]
pub struct PodTemplate {
    /// Labels and annotations for every member's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// What the members' pod spec gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<TemplateSpec>,
}

/// Labels and annotations every member's pod carries (a Kueue queue, cost allocation, sidecar
/// injection), besides murmur's own.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// At most 64; `murmur.dev/` keys are murmur's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    /// At most 64; `murmur.dev/` keys are murmur's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
}

/// What a job adds to its members' pod spec. The Kubernetes types inside keep their shape;
/// their field descriptions are left out of the CRD, which `kubectl explain pod.spec` gives.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSpec {
    /// Volumes for the trainer's mounts and the sidecars (a dataset on a PersistentVolumeClaim,
    /// a ConfigMap, a hostPath).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = plain)]
    pub volumes: Vec<Volume>,
    /// Run before the trainer, in order (fetching or unpacking data onto a volume).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), transform = plain)]
    pub init_containers: Vec<Container>,
    /// The container named `trainer` adds its volumeMounts, env, envFrom and resources to
    /// murmur's trainer; any other container runs beside it as a sidecar.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), transform = plain)]
    pub containers: Vec<Container>,
    /// Added to `scheduling.nodeSelector` (a key set in both must agree).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Added to `scheduling.tolerations` and murmur's spot tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = plain)]
    pub tolerations: Vec<Toleration>,
    /// Used as `scheduling.affinity` is (one of the two), with murmur's spot terms added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = plain)]
    pub affinity: Option<Affinity>,
    /// The members' service account (workload identity for a bucket of data). Its token is
    /// not mounted unless a volume of the template projects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets for pulling the trainer and sidecar images from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = plain)]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// As `scheduling.priorityClassName` (one of the two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Its fields replace murmur's defaults (non-root user 65532, RuntimeDefault seccomp), but
    /// `runAsNonRoot` stays true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = plain)]
    pub security_context: Option<PodSecurityContext>,
    /// The RuntimeClass the pods run with (gVisor, Kata, a GPU runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Extra `/etc/hosts` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = plain)]
    pub host_aliases: Vec<HostAlias>,
}

/// Drop the descriptions inside an embedded Kubernetes type, keeping the field's own: the
/// CRD stays small enough for a client-side `kubectl apply`.
fn plain(schema: &mut schemars::Schema) {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("description");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let own = schema.get("description").cloned();
    let mut value = serde_json::Value::from(std::mem::take(schema));
    strip(&mut value);
    if let (Some(own), serde_json::Value::Object(map)) = (own, &mut value) {
        map.insert("description".into(), own);
    }
    *schema = schemars::Schema::try_from(value).expect("a schema stays a schema");
}

impl DecentralizedTrainingJobSpec {
    /// The spec a trainer is given (`MURMUR_JOB_SPEC`): the pod template is the pod's, not the
    /// trainer's, and would only lengthen every member's environment.
    pub fn for_trainer(&self) -> String {
        let mut spec = self.clone();
        spec.trainer.pod_template = None;
        serde_json::to_string(&spec).expect("a spec serializes")
    }
}

impl PodTemplate {
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref().map(|m| &m.labels)
    }

    pub fn annotations(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref().map(|m| &m.annotations)
    }

    /// The template's part of the trainer container, if it has one.
    pub fn trainer(&self) -> Option<&Container> {
        self.spec
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == TRAINER_CONTAINER)
    }

    /// The containers that run beside the trainer.
    pub fn sidecars(&self) -> impl Iterator<Item = &Container> {
        self.spec
            .iter()
            .flat_map(|s| &s.containers)
            .filter(|c| c.name != TRAINER_CONTAINER)
    }

    /// Everything in the template that takes what murmur owns or contradicts the rest of the
    /// job's spec, each naming its field.
    pub fn violations(&self, job: &DecentralizedTrainingJobSpec) -> Vec<Violation> {
        let mut out = Vec::new();
        let mut say = |field: String, message: String| {
            out.push(Violation {
                field: format!("spec.trainer.podTemplate.{field}"),
                message,
            })
        };
        if let Some(m) = &self.metadata {
            for (what, map) in [("labels", &m.labels), ("annotations", &m.annotations)] {
                for key in map.keys().filter(|k| k.starts_with(OWNED_PREFIX)) {
                    say(
                        format!("metadata.{what}[{key}]"),
                        format!("{OWNED_PREFIX} {what} are murmur's own"),
                    );
                }
            }
        }
        let Some(spec) = &self.spec else {
            return out;
        };
        let mut names = std::collections::BTreeSet::new();
        for (k, v) in spec.volumes.iter().enumerate() {
            if OWNED_VOLUMES.contains(&v.name.as_str()) {
                say(
                    format!("spec.volumes[{k}].name"),
                    format!("{:?} is a volume murmur mounts itself", v.name),
                );
            }
            if !names.insert(v.name.as_str()) {
                say(
                    format!("spec.volumes[{k}].name"),
                    format!("{:?} appears twice", v.name),
                );
            }
        }
        let mut containers = std::collections::BTreeSet::new();
        for (list, items) in [
            ("initContainers", &spec.init_containers),
            ("containers", &spec.containers),
        ] {
            for (k, c) in items.iter().enumerate() {
                if !containers.insert(c.name.as_str()) {
                    say(
                        format!("spec.{list}[{k}].name"),
                        format!("{:?} appears twice", c.name),
                    );
                }
                if list == "initContainers" && c.name == TRAINER_CONTAINER {
                    say(
                        format!("spec.{list}[{k}].name"),
                        format!("{TRAINER_CONTAINER:?} is the trainer, not an init container"),
                    );
                }
                for (m, mount) in c.volume_mounts.iter().flatten().enumerate() {
                    if mount.name == OWNED_VOLUMES[0] {
                        say(
                            format!("spec.{list}[{k}].volumeMounts[{m}].name"),
                            "the peer key is the trainer's alone".into(),
                        );
                        continue;
                    }
                    let ours = OWNED_VOLUMES.contains(&mount.name.as_str());
                    let declared = names.contains(mount.name.as_str());
                    if !ours && !declared {
                        say(
                            format!("spec.{list}[{k}].volumeMounts[{m}].name"),
                            format!("no volume {:?} in spec.volumes", mount.name),
                        );
                    }
                }
            }
        }
        if let Some((k, trainer)) = spec
            .containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == TRAINER_CONTAINER)
        {
            let field = |name: &str| format!("spec.containers[{k}].{name}");
            let owned = [
                ("command", trainer.command.is_some()),
                ("args", trainer.args.is_some()),
                ("image", trainer.image.is_some()),
                ("ports", trainer.ports.is_some()),
                (
                    "terminationMessagePath",
                    trainer.termination_message_path.is_some(),
                ),
                (
                    "terminationMessagePolicy",
                    trainer.termination_message_policy.is_some(),
                ),
                ("readinessProbe", trainer.readiness_probe.is_some()),
                ("livenessProbe", trainer.liveness_probe.is_some()),
            ];
            for (name, set) in owned {
                if set {
                    let hint = if name == "image" {
                        "; set trainer.image"
                    } else {
                        ""
                    };
                    say(field(name), format!("is murmur's own{hint}"));
                }
            }
            for (m, mount) in trainer.volume_mounts.iter().flatten().enumerate() {
                if OWNED_VOLUMES.contains(&mount.name.as_str())
                    || OWNED_MOUNT_PATHS
                        .iter()
                        .any(|p| mount.mount_path.trim_end_matches('/') == *p)
                {
                    say(
                        field(&format!("volumeMounts[{m}]")),
                        format!(
                            "{} ({:?}) is where murmur mounts its own",
                            mount.mount_path, mount.name
                        ),
                    );
                }
            }
            for (e, var) in trainer.env.iter().flatten().enumerate() {
                if crate::contract::env::is_murmurs(&var.name) {
                    say(
                        field(&format!("env[{e}].name")),
                        format!("{}: MURMUR_ variables are murmur's own", var.name),
                    );
                }
            }
            if let Some(r) = &job.trainer.resources {
                let template = trainer.resources.as_ref();
                for (name, set) in [("cpu", r.cpu.is_some()), ("memory", r.memory.is_some())] {
                    let both = template.is_some_and(|t| {
                        [&t.limits, &t.requests]
                            .iter()
                            .any(|m| m.as_ref().is_some_and(|m| m.contains_key(name)))
                    });
                    if set && both {
                        say(
                            field("resources"),
                            format!("{name} is also set in trainer.resources: set it in one"),
                        );
                    }
                }
            }
        }
        for (key, value) in &spec.node_selector {
            if job
                .scheduling
                .node_selector
                .get(key)
                .is_some_and(|v| v != value)
            {
                say(
                    format!("spec.nodeSelector[{key}]"),
                    format!("{value:?} contradicts scheduling.nodeSelector"),
                );
            }
        }
        if spec.affinity.is_some() && job.scheduling.affinity.is_some() {
            say(
                "spec.affinity".into(),
                "scheduling.affinity is set too: set one".into(),
            );
        }
        if spec.priority_class_name.is_some() && job.scheduling.priority_class_name.is_some() {
            say(
                "spec.priorityClassName".into(),
                "scheduling.priorityClassName is set too: set one".into(),
            );
        }
        if spec
            .security_context
            .as_ref()
            .is_some_and(|s| s.run_as_non_root == Some(false))
        {
            say(
                "spec.securityContext.runAsNonRoot".into(),
                "the trainer runs as non-root".into(),
            );
        }
        out
    }
}
