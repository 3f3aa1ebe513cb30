//! Admission through Kueue. A job labelled with a Kueue queue (`kueue.x-k8s.io/queue-name`, as
//! Kueue asks of every workload) runs its members as one Kueue pod group: Kueue admits the
//! group as a gang of `replicas.target` pods once they all exist, holding each pod back with its
//! scheduling gate until then, and evicts the whole group when a workload of higher priority
//! needs the quota. A replacement pod joins the same group, so a preempted member comes back
//! without a new admission.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use murmur_core::api::DecentralizedTrainingJob;

/// The job label naming its Kueue LocalQueue; copied to every member's pod.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The job label naming a Kueue WorkloadPriorityClass; copied to every member's pod.
pub const PRIORITY_CLASS_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// The pod group, one per job (Kueue names the group's Workload after it).
pub const POD_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// How many pods the gang needs before Kueue admits it.
pub const TOTAL_COUNT_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";
/// The group's one role. Kueue would otherwise hash each pod's spec into a role, and members
/// differ (on-demand fallback, zone affinity), so that a replacement could land in a role the
/// Workload does not have.
pub const ROLE_HASH_ANNOTATION: &str = "kueue.x-k8s.io/role-hash";
const ROLE: &str = "trainer";

/// The job's pod group name: its name and the start of its uid, so that a job deleted and
/// created again under the same name never meets the old group's Workload. A job's name has at
/// most 52 characters, so this makes a label value (at most 63).
pub fn group_name(job: &DecentralizedTrainingJob) -> String {
    let uid: String = job
        .metadata
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    format!("{name}-{uid}")
}

/// Make a member's pod (its metadata) part of the job's pod group, if the job names a queue.
pub fn join_pod_group(job: &DecentralizedTrainingJob, pod: &mut ObjectMeta) {
    let job_labels = job.metadata.labels.as_ref();
    let Some(queue) = job_labels.and_then(|l| l.get(QUEUE_LABEL)) else {
        return;
    };
    let labels = pod.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(QUEUE_LABEL.into(), queue.clone());
    if let Some(priority) = job_labels.and_then(|l| l.get(PRIORITY_CLASS_LABEL)) {
        labels.insert(PRIORITY_CLASS_LABEL.into(), priority.clone());
    }
    labels.insert(POD_GROUP_LABEL.into(), group_name(job));
    let annotations = pod.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        TOTAL_COUNT_ANNOTATION.into(),
        job.spec.replicas.target.to_string(),
    );
    annotations.insert(ROLE_HASH_ANNOTATION.into(), ROLE.into());
}
