//! `spec.trainer.podTemplate` on the real API server and scheduler: the merged pods pass the
//! API server's own validation, land where the template's node selector and toleration allow,
//! and carry the template's labels, annotations, volumes, mounts, variables, init and sidecar
//! containers beside murmur's trainer; a template that takes what murmur owns is refused by
//! the CRD's rules at `kubectl apply`.

use serde_json::json;

use super::super::Env;
use super::super::support::control_plane::NodeShape;
use super::crd::example;
use super::scene::{Scene, node_of};

pub async fn pod_template(env: &Env) {
    let mut s = Scene::new(env, "pod-template", &[]).await;
    let mut fast = NodeShape::on_demand("fast-disk", "zone-a");
    fast.labels.push(("disk".into(), "nvme".into()));
    fast.taints.push(("dedicated".into(), "training".into()));
    s.add_nodes(&[fast, NodeShape::on_demand("plain-disk", "zone-a")])
        .await;
    s.env
        .cp
        .kubectl_ok(&["create", "serviceaccount", "data-reader", "-n", &s.ns]);
    s.env.cp.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: data-settings, namespace: {}}}\ndata: {{SHARD_FORMAT: idx}}\n",
        s.ns
    ));
    let template = json!({
        "metadata": {
            "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "research"},
            "annotations": {"sidecar.istio.io/inject": "false"},
        },
        "spec": {
            "volumes": [
                {"name": "dataset", "hostPath": {"path": "/srv/mnist", "type": "DirectoryOrCreate"}},
                {"name": "cache", "emptyDir": {}},
            ],
            "initContainers": [{
                "name": "unpack", "image": "busybox:1.36",
                "command": ["sh", "-c", "true"],
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            }],
            "containers": [
                {
                    "name": "trainer",
                    "volumeMounts": [
                        {"name": "dataset", "mountPath": "/data", "readOnly": true},
                        {"name": "cache", "mountPath": "/cache"},
                    ],
                    "env": [{"name": "DATA_DIR", "value": "/data"}],
                    "envFrom": [{"configMapRef": {"name": "data-settings"}}],
                },
                {"name": "log-shipper", "image": "busybox:1.36", "command": ["sleep", "infinity"]},
            ],
            "nodeSelector": {"disk": "nvme"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
            "serviceAccountName": "data-reader",
            "imagePullSecrets": [{"name": "registry"}],
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["data.internal"]}],
            "securityContext": {"fsGroup": 2000},
        },
    });
    s.job(
        "ring-cpu.yaml",
        "templated",
        json!({"spec": {
            "replicas": {"min": 1, "target": 2, "max": 2},
            "scheduling": {"capacity": "onDemand"},
            "trainer": {"podTemplate": template},
        }}),
    );
    let pods = s.running("templated", 2).await;
    for pod in pods.values() {
        assert_eq!(
            node_of(pod).as_deref(),
            Some("fast-disk"),
            "the template's node selector and toleration"
        );
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["team"], "vision");
        assert_eq!(labels["kueue.x-k8s.io/queue-name"], "research");
        assert_eq!(labels["murmur.dev/job"], "templated");
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations["sidecar.istio.io/inject"], "false");
        assert!(annotations.contains_key("murmur.dev/capacity"));
        let spec = pod.spec.as_ref().unwrap();
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        for v in ["peer-key", "tmp", "dataset", "cache"] {
            assert!(volumes.contains(&v), "volume {v} missing: {volumes:?}");
        }
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["trainer", "log-shipper"]);
        let init: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(init, ["unpack"]);
        let trainer = &spec.containers[0];
        assert_eq!(trainer.args.as_deref(), Some(&["run".to_string()][..]));
        let mounts: Vec<&str> = trainer
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        for m in ["/var/run/murmur/peer-key", "/tmp", "/data", "/cache"] {
            assert!(mounts.contains(&m), "mount {m} missing: {mounts:?}");
        }
        let env = trainer.env.clone().unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e.name == "DATA_DIR" && e.value.as_deref() == Some("/data"))
        );
        assert!(env.iter().any(|e| e.name == "MURMUR_MEMBER_ID"));
        assert!(trainer.env_from.is_some());
        assert_eq!(spec.service_account_name.as_deref(), Some("data-reader"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(spec.host_aliases.is_some() && spec.image_pull_secrets.is_some());
        let security = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (security.fs_group, security.run_as_non_root),
            (Some(2000), Some(true))
        );
    }
    println!(
        "  podTemplate: 2 members on the node its selector and toleration pick, with its labels, volumes, mounts, env, init and sidecar containers"
    );

    // What murmur owns is refused by the API server, naming the rule.
    for (what, patch) in [
        (
            "the trainer's command",
            json!({"spec": {"containers": [{"name": "trainer", "command": ["sh"]}]}}),
        ),
        (
            "a murmur.dev/ label",
            json!({"metadata": {"labels": {"murmur.dev/member": "0"}}}),
        ),
    ] {
        let mut job = example("ring-cpu.yaml");
        job["metadata"] = json!({"name": "owned", "namespace": s.ns});
        job["spec"]["trainer"] = json!({"podTemplate": patch});
        let out = s.env.cp.kubectl_with(
            &["apply", "-f", "-"],
            Some(&serde_json::to_string(&job).unwrap()),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("murmur's"),
            "{what} was not refused: {stderr}"
        );
    }
    println!("  podTemplate: the trainer's command and a murmur.dev/ label are refused at apply");
    s.finish().await;
}
