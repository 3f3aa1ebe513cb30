//! The CRD as the API server takes it: every example is accepted, every CEL rule rejects at least
//! one manifest with the field in its message, and `murmur validate` agrees with the API server
//! on each of them; the printer columns show in `kubectl get dtj`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use super::super::Env;
use super::super::support::control_plane::stdout_of;
use super::helm;

/// A manifest that breaks one rule: the rule's message, a JSON merge patch of the base job
/// (`null` removes a field), and the field the API server must name. `update`: a transition rule,
/// broken by editing a job that exists rather than by creating one.
struct Broken {
    message: &'static str,
    patch: Value,
    field: &'static str,
    update: bool,
}

fn broken(message: &'static str, field: &'static str, patch: Value) -> Broken {
    Broken {
        message,
        patch,
        field,
        update: false,
    }
}

fn edited(message: &'static str, field: &'static str, patch: Value) -> Broken {
    Broken {
        update: true,
        ..broken(message, field, patch)
    }
}

/// One manifest per rule of the CRD (a rule without one fails the scenario).
fn cases() -> Vec<Broken> {
    let spec = |v: Value| json!({"spec": v});
    vec![
        broken(
            "trainer.podTemplate.metadata.labels: murmur.dev/ labels are murmur's own",
            "spec.trainer.podTemplate.metadata.labels",
            spec(
                json!({"trainer": {"podTemplate": {"metadata": {"labels": {"murmur.dev/job": "x"}}}}}),
            ),
        ),
        broken(
            "trainer.podTemplate.metadata.annotations: murmur.dev/ annotations are murmur's own",
            "spec.trainer.podTemplate.metadata.annotations",
            spec(
                json!({"trainer": {"podTemplate": {"metadata": {"annotations": {"murmur.dev/capacity": "spot"}}}}}),
            ),
        ),
        broken(
            "trainer.podTemplate.spec.containers[trainer]: command, args, image, ports and terminationMessagePath are murmur's",
            "spec.trainer.podTemplate.spec.containers",
            spec(
                json!({"trainer": {"podTemplate": {"spec": {"containers": [{"name": "trainer", "image": "mine"}]}}}}),
            ),
        ),
        broken(
            "compression.ratio is required for kind topK",
            "spec.algorithm.compression.ratio",
            spec(json!({"algorithm": {"compression": {"kind": "topK"}}})),
        ),
        broken(
            "compression.ratio applies only to kind topK",
            "spec.algorithm.compression.ratio",
            spec(json!({"algorithm": {"compression": {"kind": "int8", "ratio": 0.1}}})),
        ),
        broken(
            "compression.ratio must be in (0, 1]",
            "spec.algorithm.compression.ratio",
            spec(json!({"algorithm": {"compression": {"kind": "topK", "ratio": 1.5}}})),
        ),
        edited(
            "algorithm.kind is immutable",
            "spec.algorithm.kind",
            spec(json!({"algorithm": {"kind": "moshpit"}})),
        ),
        broken(
            "algorithm.outer.localSteps must be from 1 to 100000",
            "spec.algorithm.outer.localSteps",
            spec(json!({"algorithm": {"outer": {"localSteps": 0}}})),
        ),
        broken(
            "algorithm.outer.learningRate must be in (0, 10]",
            "spec.algorithm.outer.learningRate",
            spec(json!({"algorithm": {"outer": {"localSteps": 10, "learningRate": 0}}})),
        ),
        broken(
            "algorithm.outer.momentum must be in [0, 1)",
            "spec.algorithm.outer.momentum",
            spec(json!({"algorithm": {"outer": {"localSteps": 10, "momentum": 1.0}}})),
        ),
        broken(
            "algorithm.outer does not apply to kind asyncGossip (it has no rounds)",
            "spec.algorithm.outer",
            spec(json!({"algorithm": {"kind": "asyncGossip", "outer": {"localSteps": 10}}})),
        ),
        broken(
            "algorithm.averageEvery does not apply with algorithm.outer (outer.localSteps sets the rounds)",
            "spec.algorithm.averageEvery",
            spec(json!({"algorithm": {"averageEvery": 2, "outer": {"localSteps": 10}}})),
        ),
        broken(
            "algorithm.outer.localSteps must not exceed training.steps",
            "spec.algorithm.outer.localSteps",
            spec(json!({"algorithm": {"outer": {"localSteps": 500}}})),
        ),
        broken(
            "algorithm.outer.overlapSteps must be from 1 to localSteps",
            "spec.algorithm.outer.overlapSteps",
            spec(
                json!({"algorithm": {"overlap": true, "outer": {"localSteps": 10, "overlapSteps": 11}}}),
            ),
        ),
        broken(
            "algorithm.overlap does not apply to kind asyncGossip (it never waits for a round)",
            "spec.algorithm.overlap",
            spec(json!({"algorithm": {"kind": "asyncGossip", "overlap": true}})),
        ),
        broken(
            "algorithm.overlap does not apply with averageEvery auto (the cadence scores a round before the next step)",
            "spec.algorithm.overlap",
            spec(json!({"algorithm": {"averageEvery": "auto", "overlap": true}})),
        ),
        edited(
            "algorithm.outer is immutable",
            "spec.algorithm.outer",
            spec(json!({"algorithm": {"outer": {"localSteps": 10}}})),
        ),
        broken(
            "algorithm.averageEvery must be a whole number of steps from 1 to 999999999, or auto",
            "spec.algorithm.averageEvery",
            spec(json!({"algorithm": {"averageEvery": 0}})),
        ),
        broken(
            "algorithm.auto applies only to averageEvery auto",
            "spec.algorithm.auto",
            spec(json!({"algorithm": {"averageEvery": 2, "auto": {"maxEvery": 4}}})),
        ),
        broken(
            "algorithm.auto.maxEvery must be from 1 to 1000",
            "spec.algorithm.auto.maxEvery",
            spec(json!({"algorithm": {"averageEvery": "auto", "auto": {"maxEvery": 0}}})),
        ),
        broken(
            "algorithm.auto.targetSkew must be in (0, 10]",
            "spec.algorithm.auto.targetSkew",
            spec(json!({"algorithm": {"averageEvery": "auto", "auto": {"targetSkew": 20.0}}})),
        ),
        broken(
            "algorithm.averageEvery auto does not apply to topology.kind exponentialOnePeer (one peer a round already)",
            "spec.algorithm.averageEvery",
            spec(
                json!({"topology": {"kind": "exponentialOnePeer", "cliqueSize": null}, "algorithm": {"kind": "dpsgd", "averageEvery": "auto"}}),
            ),
        ),
        broken(
            "algorithm.averageEvery auto needs kind dpsgd or cliqueAveraging",
            "spec.algorithm.averageEvery",
            spec(json!({"algorithm": {"kind": "moshpit", "averageEvery": "auto"}})),
        ),
        broken(
            "algorithm.maxStaleness must be from 1 to 1000",
            "spec.algorithm.maxStaleness",
            spec(json!({"algorithm": {"kind": "asyncGossip", "maxStaleness": 0}})),
        ),
        broken(
            "algorithm.maxStaleness applies only to kind asyncGossip",
            "spec.algorithm.maxStaleness",
            spec(json!({"algorithm": {"kind": "gossip", "maxStaleness": 4}})),
        ),
        broken(
            "algorithm.compression topK does not apply to kind asyncGossip (requests and replies cross on different connections, so per-link estimates cannot stay in step): use int8 or fp16",
            "spec.algorithm.compression.kind",
            spec(
                json!({"algorithm": {"kind": "asyncGossip", "compression": {"kind": "topK", "ratio": 0.01}}}),
            ),
        ),
        broken(
            "algorithm.groupSize must be >= 2",
            "spec.algorithm.groupSize",
            spec(json!({"algorithm": {"kind": "moshpit", "groupSize": 1}})),
        ),
        broken(
            "algorithm.groupSize applies only to kind moshpit",
            "spec.algorithm.groupSize",
            spec(json!({"algorithm": {"groupSize": 4}})),
        ),
        broken(
            "checkpoint.volume.claimName is required for kind persistentVolumeClaim",
            "spec.checkpoint.volume.claimName",
            spec(json!({"checkpoint": {"volume": {"kind": "persistentVolumeClaim"}}})),
        ),
        broken(
            "checkpoint.volume.claimName applies only to kind persistentVolumeClaim",
            "spec.checkpoint.volume.claimName",
            spec(json!({"checkpoint": {"volume": {"kind": "emptyDir", "claimName": "ckpt"}}})),
        ),
        broken(
            "checkpoint.everySteps must be >= 1",
            "spec.checkpoint.everySteps",
            spec(json!({"checkpoint": {"everySteps": 0}})),
        ),
        broken(
            "recovery.maxRestarts must be >= 0",
            "spec.recovery.maxRestarts",
            spec(json!({"recovery": {"maxRestarts": -1}})),
        ),
        broken(
            "recovery.maxRestartsPerMember must be >= 0",
            "spec.recovery.maxRestartsPerMember",
            spec(json!({"recovery": {"maxRestartsPerMember": -1}})),
        ),
        broken(
            "recovery.failurePolicy: a rule names onExitCodes or onPodConditions, one of them",
            "spec.recovery.failurePolicy[0].onExitCodes",
            spec(json!({"recovery": {"failurePolicy": [{"action": "Ignore"}]}})),
        ),
        broken(
            "recovery.failurePolicy.onExitCodes: 0 is success and cannot be matched with In",
            "spec.recovery.failurePolicy[0].onExitCodes.values",
            spec(
                json!({"recovery": {"failurePolicy": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [0, 1]}}]}}),
            ),
        ),
        broken(
            "replicas.min must be >= 1",
            "spec.replicas.min",
            spec(json!({"replicas": {"min": 0}})),
        ),
        broken(
            "replicas must satisfy min <= target <= max",
            "spec.replicas.target",
            spec(json!({"replicas": {"target": 20}})),
        ),
        broken(
            "replicas.max must be <= 10000",
            "spec.replicas.max",
            spec(json!({"replicas": {"max": 20000}})),
        ),
        broken(
            "scheduling.fallbackToOnDemandAfter needs capacity spot or preferSpot",
            "spec.scheduling.fallbackToOnDemandAfter",
            spec(json!({"scheduling": {"capacity": "onDemand"}})),
        ),
        edited(
            "topology.kind is immutable",
            "spec.topology.kind",
            spec(
                json!({"topology": {"kind": "proxyClumps", "cliqueSize": null, "interClique": null}}),
            ),
        ),
        broken(
            "topology.cliqueSize must be >= 2",
            "spec.topology.cliqueSize",
            spec(json!({"topology": {"cliqueSize": 1}})),
        ),
        broken(
            "topology.clumps must be >= 1",
            "spec.topology.clumps",
            spec(
                json!({"topology": {"kind": "proxyClumps", "cliqueSize": null, "interClique": null, "clumps": 0}}),
            ),
        ),
        broken(
            "topology.cliqueSize applies only to kind dCliques",
            "spec.topology.kind",
            spec(
                json!({"topology": {"kind": "ring", "interClique": null}, "algorithm": {"kind": "dpsgd"}}),
            ),
        ),
        broken(
            "topology.interClique applies only to kinds dCliques and proxyClumps",
            "spec.topology.kind",
            spec(
                json!({"topology": {"kind": "exponential", "cliqueSize": null}, "algorithm": {"kind": "dpsgd"}}),
            ),
        ),
        broken(
            "topology.clumps and topology.cliqueMix apply only to kind proxyClumps",
            "spec.topology.kind",
            spec(json!({"topology": {"clumps": 3}})),
        ),
        broken(
            "topology.clumps and topology.cliqueMix apply only to kind proxyClumps",
            "spec.topology.kind",
            spec(json!({"topology": {"cliqueMix": "homogeneous"}})),
        ),
        broken(
            "trainer.resources.gpus must be <= 16",
            "spec.trainer.resources.gpus",
            spec(json!({"trainer": {"resources": {"gpus": 17}}})),
        ),
        broken(
            "training.dataset.path is required unless source is embedded",
            "spec.training.dataset.path",
            spec(json!({"training": {"dataset": {"source": "idx"}}})),
        ),
        broken(
            "training.dataset.path does not apply to the embedded dataset",
            "spec.training.dataset.path",
            spec(json!({"training": {"dataset": {"path": "/data"}}})),
        ),
        broken(
            "training.dataset.shape applies to idx and csv files",
            "spec.training.dataset.shape",
            spec(json!({"training": {"dataset": {"shape": [28, 28]}}})),
        ),
        broken(
            "training.dataset.shape must have 1 to 4 dimensions",
            "spec.training.dataset.shape",
            spec(
                json!({"training": {"dataset": {"source": "csv", "path": "/d", "shape": [3, 0]}}}),
            ),
        ),
        broken(
            "training.model gnLenet reads 28x28 images",
            "spec.training.dataset.shape",
            spec(
                json!({"training": {"model": "gnLenet", "dataset": {"source": "csv", "path": "/d", "shape": [3, 32, 32]}}}),
            ),
        ),
        broken(
            "training.partition: shards, dirichlet and classesPerMember deal examples out by class",
            "spec.training.partition.kind",
            spec(json!({
                "topology": {"kind": "ring", "cliqueSize": null, "interClique": null},
                "algorithm": {"kind": "dpsgd"},
                "training": {"dataset": {"source": "text", "path": "/t"}},
            })),
        ),
        broken(
            "topology.kind dCliques and proxyClumps group members by the classes they hold",
            "spec.topology.kind",
            spec(json!({"training": {
                "dataset": {"source": "text", "path": "/t"},
                "partition": {"kind": "iid", "k": null},
            }})),
        ),
        edited(
            "training.dataset is immutable",
            "spec.training.dataset",
            spec(json!({"training": {"dataset": {"source": "idx", "path": "/data"}}})),
        ),
        edited(
            "training.model is immutable",
            "spec.training.model",
            spec(json!({"training": {"model": "gnLenet"}})),
        ),
        broken(
            "optimizer.momentum must be in [0, 1)",
            "spec.training.optimizer.momentum",
            spec(json!({"training": {"optimizer": {"momentum": 1.0}}})),
        ),
        broken(
            "optimizer.momentum applies only to kind sgd",
            "spec.training.optimizer.momentum",
            spec(json!({"training": {"optimizer": {"kind": "adam"}}})),
        ),
        broken(
            "partition.perMember >= 1 is required for kind shards",
            "spec.training.partition.perMember",
            spec(json!({"training": {"partition": {"kind": "shards", "k": null}}})),
        ),
        broken(
            "partition.alpha > 0 is required for kind dirichlet",
            "spec.training.partition.alpha",
            spec(json!({"training": {"partition": {"kind": "dirichlet", "k": null}}})),
        ),
        broken(
            "partition.k >= 1 is required for kind classesPerMember",
            "spec.training.partition.k",
            spec(json!({"training": {"partition": {"k": 0}}})),
        ),
        broken(
            "partition fields must match partition.kind",
            "spec.training.partition.kind",
            spec(json!({"training": {"partition": {"alpha": 0.5}}})),
        ),
        edited(
            "training.partition is immutable",
            "spec.training.partition",
            spec(json!({"training": {"partition": {"k": 3}}})),
        ),
        edited(
            "training.seed is immutable",
            "spec.training.seed",
            spec(json!({"training": {"seed": 43}})),
        ),
        broken(
            "set exactly one of training.steps or training.epochs",
            "spec.training.steps",
            spec(json!({"training": {"epochs": 2}})),
        ),
        broken(
            "training.steps must be >= 1",
            "spec.training.steps",
            spec(json!({"training": {"steps": 0}})),
        ),
        broken(
            "training.epochs must be >= 1",
            "spec.training.epochs",
            spec(json!({"training": {"steps": null, "epochs": 0}})),
        ),
        broken(
            "training.batchSize must be in [1, 65536]",
            "spec.training.batchSize",
            spec(json!({"training": {"batchSize": 0}})),
        ),
        broken(
            "training.learningRate must be in (0, 10]",
            "spec.training.learningRate",
            spec(json!({"training": {"learningRate": 0}})),
        ),
        broken(
            "ttlSecondsAfterFinished must be >= 0",
            "spec.ttlSecondsAfterFinished",
            spec(json!({"ttlSecondsAfterFinished": -1})),
        ),
        broken(
            "algorithm.kind cliqueAveraging needs topology.kind dCliques or proxyClumps",
            "spec.algorithm.kind",
            spec(json!({"topology": {"kind": "ring", "cliqueSize": null, "interClique": null}})),
        ),
        broken(
            "trainer.backend cuda needs trainer.resources.gpus >= 1",
            "spec.trainer.backend",
            spec(json!({"trainer": {"backend": "cuda"}})),
        ),
        broken(
            "topology.kind fullyConnected takes at most 256 members (replicas.max)",
            "spec.replicas.max",
            spec(json!({
                "replicas": {"min": 6, "target": 10, "max": 257},
                "topology": {"kind": "fullyConnected", "cliqueSize": null, "interClique": null},
                "algorithm": {"kind": "dpsgd"},
            })),
        ),
        broken(
            "topology.cliqueSize must not exceed replicas.max",
            "spec.topology.cliqueSize",
            spec(json!({"topology": {"cliqueSize": 13}})),
        ),
    ]
}

/// RFC 7386 merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// The example every case starts from, as JSON.
pub fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(
        super::super::support::control_plane::repository()
            .join("manifests/examples")
            .join(name),
    )
    .unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Every rule message in the CRD's schema.
fn rule_messages() -> BTreeSet<String> {
    let crd: Value = serde_json::to_value(murmur_core::api::crd()).unwrap();
    let mut out = BTreeSet::new();
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(map) => {
                if let Some(rules) = map
                    .get("x-kubernetes-validations")
                    .and_then(Value::as_array)
                {
                    for r in rules {
                        out.insert(r["message"].as_str().unwrap_or_default().to_string());
                    }
                }
                map.values().for_each(|c| walk(c, out));
            }
            Value::Array(items) => items.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    walk(&crd, &mut out);
    out
}

/// `murmur validate FILE [--previous OLD]`: exit code and what it said.
fn validate(file: &Path, previous: Option<&Path>) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_murmur"));
    command.arg("validate").arg(file);
    if let Some(old) = previous {
        command.arg("--previous").arg(old);
    }
    let out = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn write(dir: &Path, name: &str, manifest: &Value) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(manifest).unwrap()).unwrap();
    path
}

pub async fn crd(env: &Env) {
    let cp = &env.cp;
    let dir = env.dir.path().join("crd");
    std::fs::create_dir_all(&dir).unwrap();
    cp.kubectl_ok(&["apply", "--server-side", "-f", "crds/"]);
    cp.wait_established("decentralizedtrainingjobs.murmur.dev");
    cp.kubectl_ok(&["create", "namespace", "crd"]);

    // Every example is accepted, by the API server and by `murmur validate`.
    let examples: Vec<_> = std::fs::read_dir(control_plane_path("manifests/examples"))
        .unwrap()
        .collect();
    for entry in &examples {
        let path = entry.as_ref().unwrap().path();
        let out = cp.kubectl(&["apply", "-n", "crd", "-f", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(validate(&path, None).0, 0, "{}", path.display());
    }
    // The printer columns.
    let table = cp.kubectl_ok(&["get", "dtj", "-n", "crd"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PHASE",
            "MEMBERS",
            "TOPOLOGY",
            "STEP",
            "PREEMPTIONS",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        table.lines().count(),
        1 + examples.len(),
        "a header and every example:\n{table}"
    );

    // Each rule: a manifest that breaks it is refused by the API server, naming the field, and
    // `murmur validate` refuses it too.
    let base = example("dcliques-spot-cpu.yaml");
    let messages = rule_messages();
    let cases = cases();
    let covered: BTreeSet<String> = cases.iter().map(|c| c.message.to_string()).collect();
    let missing: Vec<&String> = messages
        .iter()
        .filter(|m| !covered.iter().any(|c| m.starts_with(c.as_str())))
        .collect();
    assert!(
        missing.is_empty(),
        "CRD rules without a breaking manifest: {missing:#?}"
    );
    let mut disagreements = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = format!("broken-{i}");
        let mut good = base.clone();
        good["metadata"]["name"] = json!(name);
        let mut bad = good.clone();
        merge(&mut bad, &case.patch);
        let bad_file = write(&dir, &format!("{name}.json"), &bad);
        let good_file = write(&dir, &format!("{name}-before.json"), &good);
        if case.update {
            cp.kubectl_ok(&["apply", "-n", "crd", "-f", good_file.to_str().unwrap()]);
        }
        let server = cp.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            "crd",
            "-f",
            bad_file.to_str().unwrap(),
        ]);
        let said = String::from_utf8_lossy(&server.stderr).to_string();
        assert!(
            !server.status.success(),
            "the API server accepted a manifest breaking {:?}",
            case.message
        );
        assert!(
            said.contains(case.field) && said.contains(case.message),
            "{:?}: the API server's message names neither {} nor the rule: {said}",
            case.message,
            case.field
        );
        let (code, local) = validate(&bad_file, case.update.then_some(good_file.as_path()));
        if code != 2 || !local.contains(case.message) {
            disagreements.push(format!(
                "{}: murmur validate exit {code}: {local}",
                case.message
            ));
        }
        if case.update {
            cp.kubectl_ok(&["delete", "dtj", "-n", "crd", &name, "--wait=false"]);
        }
    }
    assert!(
        disagreements.is_empty(),
        "murmur validate and the API server disagree:\n{}",
        disagreements.join("\n")
    );
    println!(
        "  {} CRD rules, each refused by the API server and by murmur validate",
        cases.len()
    );
    // Gone before the next scenario: every later operator watches all namespaces, and pods of
    // these spot jobs landed on the next scenarios' spot nodes, taking the CPU their own
    // members were sized for ("Insufficient cpu" in `placement`, 3 of 4 pods in
    // `defect-same-name`).
    cp.kubectl_ok(&[
        "delete",
        "dtj",
        "--all",
        "-n",
        "crd",
        "--wait=true",
        "--timeout=120s",
    ]);
    cp.kubectl_ok(&[
        "delete",
        "namespace",
        "crd",
        "--wait=true",
        "--timeout=120s",
    ]);
}

fn control_plane_path(relative: &str) -> std::path::PathBuf {
    super::super::support::control_plane::repository().join(relative)
}

/// The operator started while its CRD is installed but not yet Established (here held back by
/// another CRD of the group claiming the short name `dtj`) waits and says why, rather than
/// meeting 404s; it gives up after `--crd-wait` naming the condition, and goes on once the CRD
/// is Established. Before, it exited at once: "the CRD is not installed". Runs last: deleting
/// the CRD deletes every job.
pub async fn crd_established(env: &Env) {
    let cp = &env.cp;
    let ours = "crd/decentralizedtrainingjobs.murmur.dev";
    cp.kubectl_ok(&["delete", ours, "--wait=true", "--timeout=120s"]);
    cp.apply(
        "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: rivals.murmur.dev}
spec:
  group: murmur.dev
  scope: Namespaced
  names: {kind: Rival, plural: rivals, singular: rival, shortNames: [dtj]}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
",
    );
    cp.wait_established("rivals.murmur.dev");
    // Created anew, as on a first install: the API server warns about nothing in it (it warned
    // about every format it does not know, such as uint32).
    let created = cp.kubectl(&["apply", "--server-side", "-f", "crds/"]);
    let warnings = String::from_utf8_lossy(&created.stderr).to_string();
    stdout_of("kubectl apply -f crds/", created);
    assert!(
        !warnings.contains("Warning"),
        "installing the CRD printed warnings:\n{warnings}"
    );
    cp.wait_crd_condition(
        "decentralizedtrainingjobs.murmur.dev",
        "NamesAccepted",
        "False",
    );

    // Too short a wait: a named error, not "not installed".
    let impatient = helm::operator(env, "crd-impatient-operator.log", &["--crd-wait", "3s"]);
    let (code, log) = impatient.wait(Duration::from_secs(30));
    assert_ne!(code, Some(0), "{log}");
    assert!(code.is_some(), "still running after 30 s:\n{log}");
    for part in ["not Established after 3s", "NamesAccepted=False", "dtj"] {
        assert!(log.contains(part), "no {part:?} in:\n{log}");
    }

    // Patient: waits, says why, and goes on once the rival is gone.
    let mut patient = helm::operator(env, "crd-patient-operator.log", &["--crd-wait", "5m"]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(patient.running(), "{}", patient.logs());
    assert!(
        patient
            .logs()
            .contains("waiting for the CRD to be Established"),
        "{}",
        patient.logs()
    );
    cp.kubectl_ok(&["delete", "crd/rivals.murmur.dev"]);
    helm::ready(&mut patient).await;
}
