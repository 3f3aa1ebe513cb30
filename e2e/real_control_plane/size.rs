//! How large a job the real API server takes: the job's memory (its ConfigMap, 1 MiB at most)
//! and its status (`status.members`, in the job's own object, under etcd's request limit), as
//! the operator writes them for jobs of 1 000, 3 000 and 10 000 members (the CRD's most), every
//! member joined with a label histogram and placed in a D-Cliques topology. Before: the plain
//! memory was refused past about 1 500 members, and a status listing all 10 000 members by etcd
//! ("request is too large"); now the memory is gzipped past 512 KiB and the status lists at
//! most 1 000 members (the status API lists all).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use murmur::driver::{JobDriver, Memory};
use murmur::member::ObservedMember;
use murmur::runtime::kube::resources;
use murmur::status::{Hub, Inbound};
use murmur_core::api::{DecentralizedTrainingJob, STATUS_MEMBERS_MAX};
use murmur_core::contract::JoinReport;
use murmur_core::topology::MemberId;
use serde_json::json;

use super::super::Env;
use super::crd::example;

const NAMESPACE: &str = "size";
const MANAGER: &str = "murmur-operator";

/// What the operator would write for a job of `n` members, all joined: its ConfigMap's plain
/// data and its status.
fn written(
    job: &DecentralizedTrainingJob,
    n: u32,
) -> (BTreeMap<String, String>, serde_json::Value) {
    let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
    let (mut driver, _inbox) = JobDriver::start(
        Arc::new(Hub::default()),
        NAMESPACE,
        "big",
        b"key".to_vec(),
        Memory::new(at(0)),
    );
    let address = |id: MemberId, attempt: u32| {
        Some(format!(
            "member-{id}-{attempt}.big-peers.{NAMESPACE}.svc.cluster.local:7070"
        ))
    };
    let facts = |d: &JobDriver| -> BTreeMap<MemberId, ObservedMember> {
        d.state()
            .members
            .iter()
            .map(|(&id, r)| {
                let facts = ObservedMember {
                    attempt: r.attempt,
                    address: address(id, r.attempt),
                    node: Some(format!("gke-spot-pool-{:02}-a1b2c3", id % 50)),
                    ..Default::default()
                };
                (id, facts)
            })
            .collect()
    };
    // Created a burst per plan.
    loop {
        let plan = driver.plan(&job.spec, None, facts(&driver), &address, at(1));
        driver.commit(&plan, at(1));
        let creates = plan
            .actions
            .iter()
            .filter(|a| matches!(a, murmur::planner::Action::Create { .. }))
            .count();
        if creates < murmur::planner::CREATES_PER_PLAN {
            break;
        }
    }
    for id in 0..n {
        let mut histogram = vec![0; 10];
        histogram[(id % 10) as usize] = 480;
        histogram[((id + 3) % 10) as usize] = 17;
        let report = JoinReport {
            member_id: id,
            label_histogram: histogram,
            proxy_vector: None,
        };
        driver.receive(Inbound::Join(report), at(2));
    }
    let plan = driver.plan(&job.spec, None, facts(&driver), &address, at(3));
    assert!(plan.document.is_some(), "{n} members joined: a topology");
    driver.commit(&plan, at(3));
    let data = driver.memory().data(plan.document.as_deref());
    let status =
        serde_json::to_value(driver.view(&job.spec, facts(&driver), at(4)).status).unwrap();
    (data, status)
}

fn bytes(cm: &ConfigMap) -> usize {
    let plain: usize = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let packed: usize = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    plain + packed
}

pub async fn size(env: &Env) {
    let cp = &env.cp;
    cp.kubectl_ok(&["create", "namespace", NAMESPACE]);
    let client = cp.client().await;
    let jobs: Api<DecentralizedTrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let apply = PatchParams::apply(MANAGER).force();
    for n in [1_000u32, 3_000, 10_000] {
        let name = format!("big-{n}");
        let mut manifest = example("dcliques-spot-cpu.yaml");
        manifest["metadata"] = json!({"name": name, "namespace": NAMESPACE});
        manifest["spec"]["replicas"] = json!({"min": n, "target": n, "max": n});
        // Nothing runs: only the objects' sizes are on trial.
        manifest["spec"]["suspend"] = json!(true);
        cp.apply(&manifest.to_string());
        let job = jobs.get(&name).await.unwrap();
        let mut running = job.clone();
        running.spec.suspend = false;
        let (data, status) = written(&running, n);

        // The memory as plain JSON, as before: refused past 1 MiB.
        let mut plain = resources::config_map(&job, BTreeMap::new());
        plain.data = Some(data.clone());
        let plain_bytes = bytes(&plain);
        let plain_taken = config_maps
            .patch(
                &resources::config_map_name(&name),
                &apply,
                &Patch::Apply(&plain),
            )
            .await;
        assert_eq!(
            plain_taken.is_ok(),
            plain_bytes <= 1024 * 1024,
            "{n} members, plain {plain_bytes} bytes: {plain_taken:?}"
        );
        // As the operator writes it now: taken at every size the CRD allows.
        let packed = resources::config_map(&job, data.clone());
        let packed_bytes = bytes(&packed);
        let stored = config_maps
            .patch(
                &resources::config_map_name(&name),
                &apply,
                &Patch::Apply(&packed),
            )
            .await
            .unwrap_or_else(|e| panic!("{n} members, {packed_bytes} bytes: {e}"));
        assert_eq!(resources::config_map_data(&stored).unwrap(), data);

        let status_bytes = status.to_string().len();
        let patch = json!({
            "apiVersion": "murmur.dev/v1alpha1",
            "kind": "DecentralizedTrainingJob",
            "status": status,
        });
        jobs.patch_status(&name, &apply, &Patch::Apply(&patch))
            .await
            .unwrap_or_else(|e| panic!("{n} members, status of {status_bytes} bytes: {e}"));
        let read = jobs.get_status(&name).await.unwrap().status.unwrap();
        let listed = (n as usize).min(STATUS_MEMBERS_MAX);
        assert_eq!(read.members.len(), listed);
        assert_eq!(read.members_omitted as usize, n as usize - listed);
        println!(
            "  {n} members: memory {plain_bytes} bytes plain ({}), {packed_bytes} as written ({}); status {status_bytes} bytes ({listed} members listed): stored",
            if plain_taken.is_ok() {
                "taken"
            } else {
                "refused: over 1 MiB"
            },
            if packed.binary_data.is_some() {
                "gzipped"
            } else {
                "plain"
            },
        );
        cp.kubectl_ok(&["delete", "dtj", &name, "-n", NAMESPACE, "--wait=false"]);
    }
    cp.kubectl_ok(&["delete", "namespace", NAMESPACE, "--wait=false"]);
}
