//! `spec.trainer.podTemplate` merged into the pod murmur builds (pure). What murmur sets wins;
//! what it owns and the template tries to take is refused earlier, by validation
//! ([`PodTemplate::violations`]), and skipped here should a template get past it. Everything
//! else of the template is kept: its labels, annotations, volumes, mounts, environment,
//! containers, tolerations and affinity terms.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::core::v1::{PodSecurityContext, ResourceRequirements};
use murmur_core::api::pod_template::{
    OWNED_MOUNT_PATHS, OWNED_PREFIX, OWNED_VOLUMES, PodTemplate, TRAINER_CONTAINER,
};
use murmur_core::api::{DecentralizedTrainingJobSpec, SchedulingSpec};
use murmur_core::contract::env::is_murmurs;

/// The job's placement: `scheduling` with the template's node selector (scheduling's value
/// wins a key both set), tolerations (added), and affinity and priority class (where
/// scheduling sets none). murmur's spot terms are added to this, as to `scheduling` alone.
pub fn scheduling(spec: &DecentralizedTrainingJobSpec) -> SchedulingSpec {
    let mut s = spec.scheduling.clone();
    let Some(t) = spec
        .trainer
        .pod_template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
    else {
        return s;
    };
    for (k, v) in &t.node_selector {
        s.node_selector
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    s.tolerations.extend(t.tolerations.iter().cloned());
    if s.affinity.is_none() {
        s.affinity = t.affinity.clone();
    }
    if s.priority_class_name.is_none() {
        s.priority_class_name = t.priority_class_name.clone();
    }
    s
}

/// Merge `template` into `pod`, the pod murmur built (its placement already from
/// [`scheduling`]).
pub fn merge(pod: &mut Pod, template: &PodTemplate) {
    let meta = &mut pod.metadata;
    for (theirs, ours) in [
        (template.labels(), &mut meta.labels),
        (template.annotations(), &mut meta.annotations),
    ] {
        for (k, v) in theirs.into_iter().flatten() {
            if !k.starts_with(OWNED_PREFIX) {
                let ours = ours.get_or_insert_with(Default::default);
                ours.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    let (Some(t), Some(spec)) = (&template.spec, pod.spec.as_mut()) else {
        return;
    };
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for v in &t.volumes {
        if !volumes.iter().any(|o| o.name == v.name) {
            volumes.push(v.clone());
        }
    }
    if let Some(theirs) = template.trainer() {
        trainer(spec, theirs);
    }
    let taken: Vec<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
    spec.containers.extend(
        template
            .sidecars()
            .filter(|c| !taken.contains(&c.name))
            .cloned(),
    );
    if !t.init_containers.is_empty() {
        spec.init_containers = Some(
            t.init_containers
                .iter()
                .filter(|c| c.name != TRAINER_CONTAINER)
                .cloned()
                .collect(),
        );
    }
    if t.service_account_name.is_some() {
        spec.service_account_name = t.service_account_name.clone();
    }
    if !t.image_pull_secrets.is_empty() {
        spec.image_pull_secrets = Some(t.image_pull_secrets.clone());
    }
    if t.runtime_class_name.is_some() {
        spec.runtime_class_name = t.runtime_class_name.clone();
    }
    if !t.host_aliases.is_empty() {
        spec.host_aliases = Some(t.host_aliases.clone());
    }
    if let Some(theirs) = &t.security_context {
        spec.security_context = Some(security_context(
            spec.security_context.take().unwrap_or_default(),
            theirs,
        ));
    }
}

/// The template's trainer container adds its mounts, variables and resources to murmur's.
fn trainer(spec: &mut PodSpec, theirs: &k8s_openapi::api::core::v1::Container) {
    let Some(ours) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == TRAINER_CONTAINER)
    else {
        return;
    };
    let mounts = ours.volume_mounts.get_or_insert_with(Vec::new);
    for m in theirs.volume_mounts.iter().flatten() {
        let owned = OWNED_VOLUMES.contains(&m.name.as_str())
            || OWNED_MOUNT_PATHS.contains(&m.mount_path.trim_end_matches('/'));
        if !owned && !mounts.iter().any(|o| o.mount_path == m.mount_path) {
            mounts.push(m.clone());
        }
    }
    // After the job's own variables and before murmur's contract (`MURMUR_*`), which the
    // template may not set.
    let env = ours.env.get_or_insert_with(Vec::new);
    let at = env
        .iter()
        .position(|e| is_murmurs(&e.name))
        .unwrap_or(env.len());
    let added: Vec<_> = theirs
        .env
        .iter()
        .flatten()
        .filter(|e| !is_murmurs(&e.name))
        .cloned()
        .collect();
    env.splice(at..at, added);
    if theirs.env_from.is_some() {
        // Variables set by name (murmur's contract among them) win over envFrom's.
        ours.env_from = theirs.env_from.clone();
    }
    if let Some(r) = &theirs.resources {
        ours.resources = Some(resources(ours.resources.take().unwrap_or_default(), r));
    }
}

/// The template's requests and limits, with `trainer.resources`' (murmur's) over them.
fn resources(ours: ResourceRequirements, theirs: &ResourceRequirements) -> ResourceRequirements {
    let over = |base: &Option<std::collections::BTreeMap<_, _>>,
                top: Option<std::collections::BTreeMap<_, _>>| {
        let mut m = base.clone().unwrap_or_default();
        m.extend(top.unwrap_or_default());
        (!m.is_empty()).then_some(m)
    };
    ResourceRequirements {
        limits: over(&theirs.limits, ours.limits),
        requests: over(&theirs.requests, ours.requests),
        claims: theirs.claims.clone().or(ours.claims),
    }
}

/// The template's pod security context over murmur's defaults; the trainer stays non-root.
fn security_context(ours: PodSecurityContext, theirs: &PodSecurityContext) -> PodSecurityContext {
    let mut merged: serde_json::Map<String, serde_json::Value> =
        match serde_json::to_value(&ours).expect("a security context serializes") {
            serde_json::Value::Object(m) => m,
            _ => Default::default(),
        };
    if let serde_json::Value::Object(t) =
        serde_json::to_value(theirs).expect("a security context serializes")
    {
        merged.extend(t);
    }
    let mut out: PodSecurityContext =
        serde_json::from_value(serde_json::Value::Object(merged)).unwrap_or(ours);
    out.run_as_non_root = Some(true);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, EnvVar, NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
        Toleration, Volume, VolumeMount,
    };
    use murmur_core::api::pod_template::{TemplateMetadata, TemplateSpec};
    use proptest::prelude::*;

    use super::super::resources::{self, MemberPod, Settings};
    use super::*;

    const JOB: &str = r#"
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: job, namespace: ml, uid: "0000"}
spec:
  replicas: {min: 2, target: 4, max: 4}
  training: {model: mlp, partition: {kind: iid}, steps: 10}
"#;

    static PARSED: std::sync::LazyLock<murmur_core::api::DecentralizedTrainingJob> =
        std::sync::LazyLock::new(|| murmur_core::api::parse_manifest(JOB, "job.yaml").unwrap());

    fn pod_with(template: Option<PodTemplate>) -> Pod {
        let mut job = PARSED.clone();
        job.spec.trainer.pod_template = template;
        resources::pod(
            &MemberPod {
                job: &job,
                member: 1,
                attempt: 0,
                on_demand: false,
                clique: None,
                zone: None,
            },
            &Settings::default(),
        )
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z]{1,6}".prop_map(String::from),
            Just("murmur.dev/job".to_string()),
            Just("murmur.dev/member".to_string()),
            Just("app.kubernetes.io/managed-by".to_string()),
            Just("peer-key".to_string()),
            Just("tmp".to_string()),
            Just("MURMUR_MEMBER_ID".to_string()),
            Just("trainer".to_string()),
        ]
    }

    fn template() -> impl Strategy<Value = PodTemplate> {
        let map = || proptest::collection::btree_map(name(), "[a-z]{0,4}", 0..4);
        let names = || proptest::collection::vec(name(), 0..4);
        (
            map(),
            map(),
            names(),
            names(),
            names(),
            names(),
            any::<bool>(),
        )
            .prop_map(
                |(labels, annotations, volumes, env, tolerations, sidecars, affinity)| {
                    PodTemplate {
                        metadata: Some(TemplateMetadata {
                            labels,
                            annotations,
                        }),
                        spec: Some(TemplateSpec {
                            volumes: volumes
                                .iter()
                                .map(|v| Volume {
                                    name: v.clone(),
                                    ..Default::default()
                                })
                                .collect(),
                            containers: std::iter::once(Container {
                                name: TRAINER_CONTAINER.into(),
                                command: Some(vec!["sh".into()]),
                                image: Some("theirs".into()),
                                env: Some(
                                    env.iter()
                                        .map(|n| EnvVar {
                                            name: n.clone(),
                                            value: Some("theirs".into()),
                                            value_from: None,
                                        })
                                        .collect(),
                                ),
                                volume_mounts: Some(
                                    volumes
                                        .iter()
                                        .map(|v| VolumeMount {
                                            name: v.clone(),
                                            mount_path: format!("/data/{v}"),
                                            ..Default::default()
                                        })
                                        .collect(),
                                ),
                                ..Default::default()
                            })
                            .chain(sidecars.iter().map(|n| Container {
                                name: n.clone(),
                                ..Default::default()
                            }))
                            .collect(),
                            tolerations: tolerations
                                .iter()
                                .map(|k| Toleration {
                                    key: Some(k.clone()),
                                    operator: Some("Exists".into()),
                                    ..Default::default()
                                })
                                .collect(),
                            affinity: affinity.then(|| k8s_openapi::api::core::v1::Affinity {
                                node_affinity: Some(k8s_openapi::api::core::v1::NodeAffinity {
                                    preferred_during_scheduling_ignored_during_execution: Some(
                                        vec![PreferredSchedulingTerm {
                                            weight: 7,
                                            preference: NodeSelectorTerm {
                                                match_expressions: Some(vec![
                                                    NodeSelectorRequirement {
                                                        key: "disk".into(),
                                                        operator: "In".into(),
                                                        values: Some(vec!["ssd".into()]),
                                                    },
                                                ]),
                                                match_fields: None,
                                            },
                                        }],
                                    ),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                    }
                },
            )
    }

    fn trainer_of(pod: &Pod) -> &Container {
        pod.spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|c| c.name == TRAINER_CONTAINER)
            .unwrap()
    }

    proptest! {
        #[test]
        fn murmurs_fields_win_and_the_users_are_kept(t in template()) {
            let plain = pod_with(None);
            let pod = pod_with(Some(t.clone()));
            let spec = pod.spec.as_ref().unwrap();
            let ts = t.spec.as_ref().unwrap();
            // murmur's labels and annotations keep their values; the user's others arrive.
            for (ours, theirs, merged) in [
                (&plain.metadata.labels, t.labels(), &pod.metadata.labels),
                (&plain.metadata.annotations, t.annotations(), &pod.metadata.annotations),
            ] {
                let merged = merged.clone().unwrap_or_default();
                for (k, v) in ours.iter().flatten() {
                    prop_assert_eq!(merged.get(k), Some(v));
                }
                for (k, v) in theirs.into_iter().flatten() {
                    if !k.starts_with(OWNED_PREFIX) && !ours.iter().flatten().any(|(o, _)| o == k) {
                        prop_assert_eq!(merged.get(k), Some(v));
                    }
                }
            }
            // murmur's volumes are its own; every other volume of the user's is there.
            let volumes: BTreeMap<_, _> =
                spec.volumes.iter().flatten().map(|v| (v.name.clone(), v.clone())).collect();
            for v in plain.spec.as_ref().unwrap().volumes.iter().flatten() {
                prop_assert_eq!(volumes.get(&v.name), Some(v));
            }
            for v in &ts.volumes {
                prop_assert!(volumes.contains_key(&v.name));
            }
            // The trainer runs murmur's image, command, ports, termination message and
            // contract; the user's mounts and variables are added.
            let (ours, merged) = (trainer_of(&plain), trainer_of(&pod));
            prop_assert_eq!(&merged.image, &ours.image);
            prop_assert_eq!(&merged.command, &ours.command);
            prop_assert_eq!(&merged.args, &ours.args);
            prop_assert_eq!(&merged.ports, &ours.ports);
            prop_assert_eq!(&merged.termination_message_path, &ours.termination_message_path);
            let env = merged.env.clone().unwrap_or_default();
            for e in ours.env.iter().flatten() {
                let last = env.iter().rev().find(|m| m.name == e.name);
                prop_assert_eq!(last, Some(e));
            }
            for e in env.iter().filter(|e| is_murmurs(&e.name)) {
                prop_assert!(e.value.as_deref() != Some("theirs"), "{:?}", e);
            }
            for m in ours.volume_mounts.iter().flatten() {
                prop_assert!(merged.volume_mounts.iter().flatten().any(|x| x == m));
            }
            for v in ts.volumes.iter().filter(|v| !OWNED_VOLUMES.contains(&v.name.as_str())) {
                prop_assert!(
                    merged.volume_mounts.iter().flatten().any(|m| m.name == v.name),
                    "no mount of {}", v.name
                );
            }
            // The user's tolerations and affinity terms are kept beside murmur's spot terms.
            let tolerations = spec.tolerations.clone().unwrap_or_default();
            for x in plain.spec.as_ref().unwrap().tolerations.iter().flatten() {
                prop_assert!(tolerations.contains(x));
            }
            for x in &ts.tolerations {
                prop_assert!(tolerations.contains(x));
            }
            let node = |p: &Pod| p.spec.as_ref().unwrap().affinity.clone()
                .and_then(|a| a.node_affinity).unwrap_or_default();
            if let Some(a) = &ts.affinity {
                let wanted = a.node_affinity.clone().unwrap_or_default()
                    .preferred_during_scheduling_ignored_during_execution.unwrap_or_default();
                let got = node(&pod).preferred_during_scheduling_ignored_during_execution
                    .unwrap_or_default();
                for term in wanted {
                    prop_assert!(got.contains(&term));
                }
            }
            prop_assert_eq!(
                node(&pod).required_during_scheduling_ignored_during_execution,
                node(&plain).required_during_scheduling_ignored_during_execution
            );
            // Sidecars run beside the trainer; the trainer stays one container.
            prop_assert_eq!(
                spec.containers.iter().filter(|c| c.name == TRAINER_CONTAINER).count(),
                1
            );
            for c in t.sidecars() {
                prop_assert!(spec.containers.iter().any(|x| x.name == c.name));
            }
            prop_assert_eq!(spec.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
        }
    }

    #[test]
    fn the_templates_resources_are_kept_under_trainer_resources() {
        let q = |v: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into());
        let ours = ResourceRequirements {
            limits: Some(BTreeMap::from([("cpu".into(), q("2"))])),
            requests: Some(BTreeMap::from([("cpu".into(), q("2"))])),
            ..Default::default()
        };
        let theirs = ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".into(), q("8")),
                ("ephemeral-storage".into(), q("10Gi")),
            ])),
            ..Default::default()
        };
        let merged = resources(ours, &theirs);
        let limits = merged.limits.unwrap();
        assert_eq!(limits["cpu"], q("2"));
        assert_eq!(limits["ephemeral-storage"], q("10Gi"));
        assert_eq!(merged.requests.unwrap()["cpu"], q("2"));
    }

    #[test]
    fn validation_names_every_field_murmur_owns() {
        let job = PARSED.clone();
        let t: PodTemplate = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"murmur.dev/job": "x", "team": "a"}},
            "spec": {
                "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
                "containers": [
                    {"name": "trainer", "image": "mine", "command": ["sh"],
                     "env": [{"name": "MURMUR_MEMBER_ID", "value": "3"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/var/run/murmur/peer-key"},
                                      {"name": "nope", "mountPath": "/x"}]},
                    {"name": "sidecar", "image": "s", "volumeMounts": [{"name": "peer-key", "mountPath": "/k"}]}
                ],
                "securityContext": {"runAsNonRoot": false}
            }
        }))
        .unwrap();
        let fields: Vec<String> = t
            .violations(&job.spec)
            .into_iter()
            .map(|v| v.field)
            .collect();
        let p = "spec.trainer.podTemplate.";
        for expected in [
            "metadata.labels[murmur.dev/job]",
            "spec.volumes[0].name",
            "spec.containers[0].image",
            "spec.containers[0].command",
            "spec.containers[0].env[0].name",
            "spec.containers[0].volumeMounts[0]",
            "spec.containers[0].volumeMounts[1].name",
            "spec.containers[1].volumeMounts[0].name",
            "spec.securityContext.runAsNonRoot",
        ] {
            assert!(
                fields.contains(&format!("{p}{expected}")),
                "{expected} not in {fields:?}"
            );
        }
        assert_eq!(fields.len(), 9, "{fields:?}");
        let fine: PodTemplate = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "mnist"}}],
                "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                "env": [{"name": "DATA", "value": "/data"}]}]
            }
        }))
        .unwrap();
        assert!(fine.violations(&job.spec).is_empty());
    }
}
