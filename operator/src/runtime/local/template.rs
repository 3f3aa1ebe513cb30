//! What `murmur run` takes of `spec.trainer.podTemplate` on one machine: the trainer
//! container's variables (plain values), and hostPath volumes the trainer mounts at their own
//! path (the process reads that path as the pod would). The rest is a cluster's: it is named in
//! one line, not silently dropped.

use murmur_core::api::PodTemplate;
use murmur_core::contract::env::is_murmurs;

/// The template's variables for the trainer process (those with a plain value; `MURMUR_*`
/// stays murmur's).
pub fn env(template: Option<&PodTemplate>) -> Vec<(String, String)> {
    template
        .and_then(PodTemplate::trainer)
        .into_iter()
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| !is_murmurs(&e.name))
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// One line: what of the template this run honours and what it ignores.
pub fn notice(template: &PodTemplate) -> String {
    let mut honoured = Vec::new();
    let mut ignored = Vec::new();
    let trainer = template.trainer();
    let vars = trainer.into_iter().flat_map(|c| c.env.iter().flatten());
    let (plain, from): (Vec<_>, Vec<_>) = vars
        .filter(|e| !is_murmurs(&e.name))
        .partition(|e| e.value.is_some());
    if !plain.is_empty() {
        honoured.push(format!("{} env", plain.len()));
    }
    if !from.is_empty() {
        ignored.push(format!("{} env from valueFrom", from.len()));
    }
    let spec = template.spec.as_ref();
    let volumes = spec.map(|s| s.volumes.as_slice()).unwrap_or_default();
    let mounts = trainer
        .into_iter()
        .flat_map(|c| c.volume_mounts.iter().flatten());
    let mut mounted = Vec::new();
    for m in mounts {
        let host = volumes
            .iter()
            .find(|v| v.name == m.name)
            .and_then(|v| v.host_path.as_ref());
        match host {
            Some(h) if h.path.trim_end_matches('/') == m.mount_path.trim_end_matches('/') => {
                honoured.push(format!("hostPath {}", h.path));
            }
            _ => ignored.push(format!("volume {} at {}", m.name, m.mount_path)),
        }
        mounted.push(m.name.as_str());
    }
    let unmounted = volumes
        .iter()
        .filter(|v| !mounted.contains(&v.name.as_str()));
    ignored.extend(unmounted.map(|v| format!("volume {}", v.name)));
    if trainer.is_some_and(|c| c.env_from.is_some()) {
        ignored.push("envFrom".into());
    }
    if trainer.is_some_and(|c| c.resources.is_some()) {
        ignored.push("resources".into());
    }
    if template.labels().is_some_and(|l| !l.is_empty())
        || template.annotations().is_some_and(|a| !a.is_empty())
    {
        ignored.push("labels and annotations".into());
    }
    let sidecars = template.sidecars().count();
    if sidecars > 0 {
        ignored.push(format!("{sidecars} sidecar containers"));
    }
    if let Some(s) = spec {
        let placement = [
            ("initContainers", !s.init_containers.is_empty()),
            ("nodeSelector", !s.node_selector.is_empty()),
            ("tolerations", !s.tolerations.is_empty()),
            ("affinity", s.affinity.is_some()),
            ("serviceAccountName", s.service_account_name.is_some()),
            ("imagePullSecrets", !s.image_pull_secrets.is_empty()),
            ("priorityClassName", s.priority_class_name.is_some()),
            ("securityContext", s.security_context.is_some()),
            ("runtimeClassName", s.runtime_class_name.is_some()),
            ("hostAliases", !s.host_aliases.is_empty()),
        ];
        ignored.extend(
            placement
                .into_iter()
                .filter(|(_, set)| *set)
                .map(|(name, _)| name.to_string()),
        );
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "murmur: trainer.podTemplate on this machine: honours {}; ignores {} (a cluster's)",
        list(&honoured),
        list(&ignored)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(json: serde_json::Value) -> PodTemplate {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn env_and_hostpath_at_its_own_path_are_honoured_and_the_rest_named() {
        let t = template(serde_json::json!({
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "volumes": [
                    {"name": "data", "hostPath": {"path": "/srv/data"}},
                    {"name": "moved", "hostPath": {"path": "/srv/other"}},
                    {"name": "claim", "persistentVolumeClaim": {"claimName": "c"}}
                ],
                "containers": [
                    {"name": "trainer",
                     "env": [{"name": "DATA", "value": "/srv/data"},
                             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                             {"name": "MURMUR_MEMBER_ID", "value": "9"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/srv/data/"},
                                      {"name": "moved", "mountPath": "/data"}]},
                    {"name": "logger", "image": "busybox"}
                ],
                "tolerations": [{"operator": "Exists"}]
            }
        }));
        assert_eq!(env(Some(&t)), vec![("DATA".into(), "/srv/data".into())]);
        assert_eq!(
            notice(&t),
            "murmur: trainer.podTemplate on this machine: honours 1 env, hostPath /srv/data; \
             ignores 1 env from valueFrom, volume moved at /data, volume claim, labels and \
             annotations, 1 sidecar containers, tolerations (a cluster's)"
        );
        assert!(env(None).is_empty());
        assert_eq!(
            notice(&PodTemplate::default()),
            "murmur: trainer.podTemplate on this machine: honours nothing; ignores nothing (a cluster's)"
        );
    }
}
