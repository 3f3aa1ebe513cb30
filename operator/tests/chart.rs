//! charts/murmur rendered by real helm (`helm template`, built from its Go module by
//! e2e/controlplane), and its objects checked: RBAC against the operator's own permission list,
//! the Deployment's security and probes, its arguments against the operator's command line,
//! values overrides, `helm lint`, and the copies of the CRD and install manifest. Without Go the
//! tests say so and pass, unless MURMUR_REQUIRE_CONTROLPLANE is set (CI sets it).

#[path = "../../e2e/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::path::Path;

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use murmur::cli::{Cli, Command};
use murmur::runtime::kube::preflight::{NETWORK_POLICY_PERMISSIONS, PERMISSIONS};
use serde_json::{Value, json};
use support::control_plane::{self, helm, stdout_of};

/// A release as `helm install NAME charts/murmur -n NAMESPACE` makes it.
struct Release {
    name: &'static str,
    namespace: &'static str,
}

const DEFAULT: Release = Release {
    name: "murmur",
    namespace: "murmur-system",
};

/// Whether helm can be had here (built from Go); a skip says why.
fn helm_here() -> bool {
    control_plane::available("the chart tests (helm)")
}

/// `helm template` of the chart with `overrides` as a values file: its objects.
fn render(release: &Release, overrides: &Value) -> Vec<Value> {
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), serde_json::to_string(overrides).unwrap()).unwrap();
    let text = stdout_of(
        "helm template",
        helm(&[
            "template",
            release.name,
            "charts/murmur",
            "--namespace",
            release.namespace,
            "-f",
            values.path().to_str().unwrap(),
        ]),
    );
    documents(&text)
}

/// The objects of a multi-document YAML stream (empty documents dropped).
fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("helm prints YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn objects(overrides: Value) -> Vec<Value> {
    render(&DEFAULT, &overrides)
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind)
}

fn typed<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str) -> T {
    let object = find(objects, kind).unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn args(objects: &[Value]) -> Vec<String> {
    let deployment: Deployment = typed(objects, "Deployment");
    let pod = deployment.spec.template.spec.unwrap();
    pod.containers[0].args.clone().unwrap()
}

/// The Deployment's arguments, parsed by `murmur` itself.
fn operator_args(objects: &[Value]) -> murmur::cli::operator::OperatorArgs {
    let mut argv = vec!["murmur".to_string()];
    argv.extend(args(objects));
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    match cli.command {
        Command::Operator(args) => args,
        other => panic!("not `murmur operator`: {other:?}"),
    }
}

type Permission = (String, String, String);

/// (verb, group, resource) for every rule of the ClusterRole and the Role.
fn granted(objects: &[Value]) -> (BTreeSet<Permission>, BTreeSet<Permission>) {
    let mut cluster = BTreeSet::new();
    let mut namespaced = BTreeSet::new();
    let cluster_role: ClusterRole = typed(objects, "ClusterRole");
    let role: Option<Role> =
        find(objects, "Role").map(|r| serde_json::from_value(r.clone()).unwrap());
    let rules = cluster_role
        .rules
        .into_iter()
        .flatten()
        .map(|r| (true, r))
        .chain(
            role.into_iter()
                .flat_map(|r| r.rules.into_iter().flatten().map(|r| (false, r))),
        );
    for (is_cluster, rule) in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for part in [group, resource, verb] {
                        assert_ne!(part, "*", "no wildcards in RBAC");
                    }
                    let p = (verb.clone(), group.clone(), resource.clone());
                    if is_cluster {
                        cluster.insert(p);
                    } else {
                        namespaced.insert(p);
                    }
                }
            }
        }
    }
    (cluster, namespaced)
}

fn declared(list: &[(&str, &str, &str)]) -> BTreeSet<Permission> {
    list.iter()
        .map(|(v, g, r)| (v.to_string(), g.to_string(), r.to_string()))
        .collect()
}

#[test]
fn default_values_render_the_operator_its_rbac_and_its_service() {
    if !helm_here() {
        return;
    }
    let objects = objects(json!({}));
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "NetworkPolicy",
            "ServiceAccount",
            // The operator's, then the users' (job viewer and editor, /metrics reader).
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            // Leader election, then the dashboard's hop through the API server's proxy.
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "Deployment",
        ]
    );
    for object in &objects {
        let meta = &object["metadata"];
        let name = meta["name"].as_str().unwrap();
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("murmur-operator"), "{name}");
        assert_eq!(meta["labels"]["app.kubernetes.io/instance"], "murmur");
        assert_eq!(meta["labels"]["helm.sh/chart"], "murmur-0.1.0");
        let cluster_scoped = object["kind"].as_str().unwrap().starts_with("Cluster");
        assert_eq!(
            meta["namespace"].as_str(),
            (!cluster_scoped).then_some("murmur-system"),
            "{name}"
        );
    }
}

#[test]
fn the_rbac_grants_exactly_the_permissions_the_operator_declares_and_checks_at_startup() {
    if !helm_here() {
        return;
    }
    let (cluster, namespaced) = granted(&objects(json!({"networkPolicy": {"enabled": false}})));
    let mut all = cluster.clone();
    all.extend(namespaced.clone());
    assert_eq!(all, declared(PERMISSIONS));
    // The Lease only in the release namespace; nothing else there.
    assert!(
        namespaced
            .iter()
            .all(|(_, g, r)| (g.as_str(), r.as_str()) == ("coordination.k8s.io", "leases"))
    );
    assert!(cluster.iter().all(|(_, _, r)| r != "leases"));

    // Per-job NetworkPolicies (on by default) add their own verbs, and only then.
    let (cluster, namespaced) = granted(&objects(json!({})));
    let mut all = cluster;
    all.extend(namespaced);
    let mut expected = declared(PERMISSIONS);
    expected.extend(declared(NETWORK_POLICY_PERMISSIONS));
    assert_eq!(all, expected);

    // Without leader election there is no Lease to touch.
    let objects = objects(json!({"leaderElection": {"enabled": false}}));
    let named = |kind: &str| {
        objects.iter().any(|o| {
            o["kind"] == kind
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-leader-election"))
        })
    };
    assert!(!named("Role") && !named("RoleBinding"));
    assert!(!args(&objects).contains(&"--leader-election".to_string()));
}

#[test]
fn the_bindings_name_the_service_account_the_deployment_runs_as() {
    if !helm_here() {
        return;
    }
    for overrides in [
        json!({}),
        json!({"serviceAccount": {"create": false, "name": "platform-sa"}}),
    ] {
        let objects = objects(overrides.clone());
        let deployment: Deployment = typed(&objects, "Deployment");
        let account = deployment
            .spec
            .template
            .spec
            .unwrap()
            .service_account_name
            .unwrap();
        for kind in ["ClusterRoleBinding", "RoleBinding"] {
            let binding = find(&objects, kind).unwrap();
            assert_eq!(
                binding["subjects"][0]["name"],
                account.as_str(),
                "{overrides}"
            );
            assert_eq!(binding["subjects"][0]["namespace"], "murmur-system");
        }
        let made = find(&objects, "ServiceAccount").map(|s| s["metadata"]["name"].clone());
        if overrides["serviceAccount"]["create"] == false {
            assert_eq!(account, "platform-sa");
            assert!(made.is_none());
        } else {
            assert_eq!(made, Some(json!(account)));
        }
    }
    let objects = objects(json!({"rbac": {"create": false}}));
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"].as_str().unwrap().contains("Role"))
    );
}

#[test]
fn the_operator_runs_non_root_read_only_without_privileges_and_with_probes() {
    if !helm_here() {
        return;
    }
    let objects = objects(json!({}));
    let deployment: Deployment = typed(&objects, "Deployment");
    let pod = deployment.spec.template.spec.unwrap();
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.run_as_user, Some(65_532));
    assert_eq!(
        pod_security.seccomp_profile.unwrap().type_,
        "RuntimeDefault"
    );
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/murmur-dev/murmur-operator:0.1.0"),
        "the tag defaults to the chart's appVersion"
    );
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.capabilities.unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.clone().unwrap().http_get.unwrap();
        (get.path.unwrap(), get.port)
    };
    let http = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into());
    assert_eq!(
        probe_path(&container.liveness_probe),
        ("/healthz".into(), http.clone())
    );
    assert_eq!(
        probe_path(&container.readiness_probe),
        ("/readyz".into(), http)
    );
    let port = &container.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("http"), 8470)
    );
    let env: Vec<(String, Option<String>)> = container
        .env
        .iter()
        .flatten()
        .map(|e| {
            let field = e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.clone());
            (e.name.clone(), field.or(e.value.clone()))
        })
        .collect();
    assert!(env.contains(&("POD_NAME".into(), Some("metadata.name".into()))));
    assert!(env.contains(&("POD_NAMESPACE".into(), Some("metadata.namespace".into()))));
    assert!(env.contains(&("RUST_LOG".into(), Some("info".into()))));
    assert_eq!(
        container
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["memory"]
            .0,
        "512Mi"
    );
}

#[test]
fn the_arguments_parse_with_the_operators_own_command_line_and_point_trainers_at_the_service() {
    if !helm_here() {
        return;
    }
    let objects = objects(json!({}));
    let parsed = operator_args(&objects);
    let service = find(&objects, "Service").unwrap();
    let name = service["metadata"]["name"].as_str().unwrap();
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["targetPort"], "http");
    assert_eq!(
        parsed.control_endpoint,
        format!("http://{name}.murmur-system.svc:{}", port["port"])
    );
    // The release the README installs needs no flag at all: it is the command line's default.
    let defaults = Cli::try_parse_from(["murmur", "operator"]).unwrap();
    let Command::Operator(defaults) = defaults.command else {
        panic!()
    };
    assert_eq!(parsed.control_endpoint, defaults.control_endpoint);
    assert_eq!(
        parsed.trainer_image,
        murmur_core::api::DEFAULT_TRAINER_IMAGE
    );
    assert!(parsed.trainer_cuda_image.ends_with("-cuda"));
    assert!(parsed.leader_election);
    assert_eq!(parsed.lease_name, "murmur-operator");
    assert!(parsed.network_policies, "on by default");
    assert_eq!(parsed.operator_namespace.as_deref(), Some("murmur-system"));
    assert_eq!(parsed.listen, "0.0.0.0:8470");
    assert_eq!(
        parsed.status_reads_per_second,
        murmur::status::pacer::DEFAULT_READS_PER_SECOND,
        "values.yaml and the binary agree"
    );
    // The Service selects the operator's pods, and of them the one that leads (it labels
    // itself, knowing its name from POD_NAME), so that every replica may be Ready.
    let deployment = find(&objects, "Deployment").unwrap();
    let mut leader = deployment["spec"]["selector"]["matchLabels"].clone();
    leader[murmur::runtime::kube::lease::LEADER_LABEL] = json!("true");
    assert_eq!(service["spec"]["selector"], leader);
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_NAME"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "{env}"
    );
}

#[test]
fn values_overrides_reach_the_objects() {
    if !helm_here() {
        return;
    }
    let objects = objects(json!({
        "image": {"repository": "registry.example/murmur-operator", "tag": "dev", "pullPolicy": "Never"},
        "replicaCount": 2,
        "logLevel": "debug,kube=info",
        "logFormat": "text",
        "operator": {"concurrency": 3, "resync": "1m", "nodeLostAfter": "90s", "extraArgs": ["--cluster-domain=corp.local"]},
        "trainer": {"image": "registry.example/trainer:dev", "cudaImage": "registry.example/trainer:dev-cuda"},
        "service": {"port": 9000, "readsPerSecond": 50},
        "networkPolicy": {"enabled": true, "dnsNamespace": "dns"},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "podLabels": {"team": "ml"},
        "fullnameOverride": "dtj",
        "metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "prometheus"}}},
    }));
    let deployment: Deployment = typed(&objects, "Deployment");
    assert_eq!(deployment.metadata.name.as_deref(), Some("dtj-operator"));
    let spec = deployment.spec;
    assert_eq!(spec.replicas, Some(2));
    let template = spec.template;
    assert_eq!(template.metadata.unwrap().labels.unwrap()["team"], "ml");
    let pod = template.spec.unwrap();
    assert_eq!(pod.node_selector.unwrap()["pool"], "system");
    assert_eq!(
        pod.tolerations.unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example/murmur-operator:dev")
    );
    assert_eq!(container.image_pull_policy.as_deref(), Some("Never"));
    let rust_log = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "RUST_LOG")
        .unwrap();
    assert_eq!(rust_log.value.as_deref(), Some("debug,kube=info"));

    let parsed = operator_args(&objects);
    assert_eq!(
        parsed.control_endpoint,
        "http://dtj-operator.murmur-system.svc:9000"
    );
    assert_eq!(parsed.concurrency, 3);
    assert_eq!(parsed.status_reads_per_second, 50);
    assert_eq!(parsed.resync.as_std(), std::time::Duration::from_secs(60));
    assert_eq!(
        parsed.node_lost_after.as_std(),
        std::time::Duration::from_secs(90)
    );
    assert_eq!(
        parsed.cluster_domain, "corp.local",
        "extraArgs come last and win"
    );
    assert_eq!(parsed.trainer_image, "registry.example/trainer:dev");
    assert_eq!(
        parsed.trainer_cuda_image,
        "registry.example/trainer:dev-cuda"
    );
    assert!(parsed.network_policies);
    assert_eq!(parsed.dns_namespace, "dns");
    assert_eq!(parsed.operator_namespace.as_deref(), Some("murmur-system"));
    assert_eq!(parsed.lease_name, "dtj-operator");

    let monitor = find(&objects, "ServiceMonitor").expect("a ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(
        find(&objects, "Service").unwrap()["spec"]["ports"][0]["port"],
        9000
    );
}

/// Who may read what: the job viewer role aggregates into view/edit/admin, /metrics readers are
/// bound as listed, the dashboard's proxy hop reaches only the operator's Service, and the
/// operator's own NetworkPolicy admits the status port only.
#[test]
fn users_roles_reach_only_what_the_status_api_serves() {
    if !helm_here() {
        return;
    }
    let prometheus =
        json!({"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"});
    let objects = objects(json!({"metrics": {"readers": [prometheus]}}));
    let named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let viewer = named("ClusterRole", "murmur-operator-job-viewer");
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            viewer["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")],
            "true"
        );
    }
    assert_eq!(viewer["rules"][0]["verbs"], json!(["get", "list", "watch"]));
    let reader = named("ClusterRoleBinding", "murmur-operator-metrics-reader");
    assert_eq!(reader["subjects"], json!([prometheus]));
    let metrics = named("ClusterRole", "murmur-operator-metrics-reader");
    assert_eq!(
        metrics["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let proxy = named("Role", "murmur-operator-dashboard");
    assert_eq!(
        proxy["rules"],
        json!([{"apiGroups": [""], "resources": ["services/proxy"],
                "resourceNames": ["murmur-operator", "http:murmur-operator:http"], "verbs": ["get"]}])
    );
    let binding = named("RoleBinding", "murmur-operator-dashboard");
    assert_eq!(binding["subjects"][0]["name"], "system:authenticated");
    let policy = named("NetworkPolicy", "murmur-operator");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"ports": [{"port": "http", "protocol": "TCP"}]}])
    );
    // No proxy subjects, no binding; no metrics readers, no binding.
    let objects = self::objects(json!({"dashboard": {"proxySubjects": []}}));
    assert!(
        !objects
            .iter()
            .any(|o| o["metadata"]["name"] == "murmur-operator-dashboard")
    );
    assert!(!objects.iter().any(|o| o["kind"] == "ClusterRoleBinding"
        && o["metadata"]["name"] == "murmur-operator-metrics-reader"));
}

#[test]
fn a_release_not_named_murmur_gets_prefixed_names_and_its_own_endpoint() {
    if !helm_here() {
        return;
    }
    let release = Release {
        name: "ml",
        namespace: "training",
    };
    let objects = render(&release, &json!({}));
    let parsed = operator_args(&objects);
    assert_eq!(
        parsed.control_endpoint,
        "http://ml-murmur-operator.training.svc:8470"
    );
    assert_eq!(
        find(&objects, "Service").unwrap()["metadata"]["name"],
        "ml-murmur-operator"
    );
}

fn same_files(a: &Path, b: &Path) {
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".yaml"))
            .collect()
    };
    assert_eq!(names(a), names(b), "{} and {}", a.display(), b.display());
    for name in names(a) {
        assert!(
            std::fs::read(a.join(&name)).unwrap() == std::fs::read(b.join(&name)).unwrap(),
            "charts/murmur/crds/{name} differs from crds/{name}: cp crds/*.yaml charts/murmur/crds/"
        );
    }
}

fn repository() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_charts_crds_are_the_repositorys_crds() {
    same_files(
        &repository().join("charts/murmur/crds"),
        &repository().join("crds"),
    );
}

#[test]
fn the_install_manifest_is_the_chart_rendered_with_default_values() {
    if !helm_here() {
        return;
    }
    let out = std::process::Command::new(repository().join("charts/install-manifest.sh"))
        .output()
        .unwrap();
    let expected = stdout_of("charts/install-manifest.sh", out);
    let actual = std::fs::read_to_string(repository().join("manifests/install.yaml")).unwrap();
    assert!(
        actual == expected,
        "manifests/install.yaml is out of date: charts/install-manifest.sh > manifests/install.yaml"
    );
    // Namespace, CRD, then the chart's objects: all of it applies with kubectl alone.
    let objects = documents(&actual);
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(&kinds[..2], ["Namespace", "CustomResourceDefinition"]);
    assert!(kinds.contains(&"Deployment"));
}

#[test]
fn helm_lint_passes_with_defaults_and_with_every_option_on() {
    if !helm_here() {
        return;
    }
    stdout_of("helm lint", helm(&["lint", "charts/murmur", "--strict"]));
    stdout_of(
        "helm lint --set ...",
        helm(&[
            "lint",
            "charts/murmur",
            "--strict",
            "--set",
            "networkPolicy.enabled=true,metrics.serviceMonitor.enabled=true,replicaCount=2",
        ]),
    );
}

#[test]
fn the_dockerfiles_build_the_binaries_the_chart_and_the_operator_run_as_the_same_user() {
    let operator =
        std::fs::read_to_string(repository().join("images/operator.Dockerfile")).unwrap();
    let trainer = std::fs::read_to_string(repository().join("images/trainer.Dockerfile")).unwrap();
    assert!(operator.contains("-p murmur --bin murmur"));
    assert!(operator.contains("ENTRYPOINT [\"/usr/local/bin/murmur\"]"));
    // The operator's pods run `run` in the trainer image as this user (resources.rs).
    let uid = murmur::runtime::kube::resources::TRAINER_UID;
    for (name, text) in [("operator", &operator), ("trainer", &trainer)] {
        let users: Vec<&str> = text.lines().filter(|l| l.starts_with("USER ")).collect();
        assert!(!users.is_empty(), "{name}: no USER");
        for user in users {
            assert_eq!(user, format!("USER {uid}:{uid}"), "{name}");
        }
    }
    assert!(trainer.contains("AS cpu") && trainer.contains("AS cuda"));
    assert!(trainer.contains("--features cuda"));
    assert!(trainer.contains("CMD [\"run\"]"));
}
