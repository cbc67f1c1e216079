//! Kueue's objects (`kueue.x-k8s.io/v1beta2`, the storage version Kueue v0.17.0 serves),
//! reduced to what the quota rows read: ResourceFlavors, ClusterQueues, LocalQueues and
//! Workloads.
//!
//! The `claims` sources fill these from live watches and from dump files; values are untrusted
//! (quantities already parsed to whole units, unknown or impossible ones left `None`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::names::is_dns1123_subdomain;

/// Kueue's label on the pods (and Jobs) of a queued workload: the LocalQueue's name.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// Everything read from Kueue at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KueueInputs {
    /// False when `kueue.x-k8s.io/v1beta2` is not served (or not readable): no queue rows.
    pub enabled: bool,
    pub flavors: Vec<ResourceFlavorInfo>,
    pub cluster_queues: Vec<ClusterQueueInfo>,
    pub local_queues: Vec<LocalQueueInfo>,
    pub workloads: Vec<WorkloadInfo>,
    /// Kueue's `resources.deviceClassMappings` (its Configuration): `None` when not read (no
    /// ConfigMap named, or not readable); `Some(empty)` when Kueue has none (the ConfigMap is
    /// absent, or maps nothing).
    pub device_class_mappings: Option<Vec<DeviceClassMapping>>,
}

/// One entry of Kueue's `resources.deviceClassMappings` (`sigs.k8s.io/kueue` v0.17.0
/// `apis/config/v1beta2/configuration_types.go`, `DeviceClassMapping`): the devices a pod's
/// ResourceClaimTemplates request of these DeviceClasses count, in ClusterQueue quotas and
/// Workload usage, as resource `name` (`pkg/dra/claims.go`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceClassMapping {
    /// The resource name ClusterQueues give quota of.
    pub name: String,
    /// `deviceClassNames`.
    pub device_classes: Vec<String>,
}

/// A ResourceFlavor (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceFlavorInfo {
    pub name: String,
    /// `spec.nodeLabels`: the nodes whose capacity the flavor stands for (bounded).
    pub node_labels: BTreeMap<String, String>,
}

/// One flavor's quota for one resource in a ClusterQueue's `spec.resourceGroups`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlavorQuota {
    pub flavor: String,
    pub resource: String,
    /// `nominalQuota` in units; `None` when absent or not a whole, sane quantity.
    pub nominal: Option<u64>,
    /// `borrowingLimit`; `None` when absent (unlimited within the cohort) or unreadable.
    pub borrowing_limit: Option<u64>,
    /// `lendingLimit`; `None` when absent (everything may be lent) or unreadable.
    pub lending_limit: Option<u64>,
}

/// One flavor's usage of one resource in `status.flavorsUsage` / `status.flavorsReservation`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlavorUsage {
    pub flavor: String,
    pub resource: String,
    /// `total` in units; `None` when unreadable.
    pub total: Option<u64>,
    /// `borrowed` in units; `None` when absent or unreadable.
    pub borrowed: Option<u64>,
}

/// A ClusterQueue (cluster-scoped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterQueueInfo {
    pub name: String,
    /// `spec.cohortName` (v1beta2; `spec.cohort` in v1beta1).
    pub cohort: Option<String>,
    pub quotas: Vec<FlavorQuota>,
    /// `status.flavorsUsage`: quota used by admitted workloads.
    pub usage: Vec<FlavorUsage>,
    /// `status.flavorsReservation`: quota reserved (admitted, or waiting for admission checks).
    pub reservation: Vec<FlavorUsage>,
    /// Whether the status carried `flavorsUsage` at all (an empty list is then "nothing
    /// admitted", not "unknown").
    pub usage_reported: bool,
}

/// A LocalQueue: a namespace's name for a ClusterQueue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalQueueInfo {
    pub namespace: String,
    pub name: String,
    /// `spec.clusterQueue`.
    pub cluster_queue: String,
}

/// An owner reference of a Workload (the Job, JobSet, Pod, … it stands for).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadOwner {
    /// API group without version (`batch` for a Job, "" for a Pod).
    pub group: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// One pod set of a Workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSetInfo {
    pub name: String,
    /// `count`: pods in the set.
    pub count: u64,
    /// GPU units one pod of the set asks for, per recognised GPU resource (from the template).
    pub gpu_per_pod: BTreeMap<String, u64>,
}

/// One `status.admission.podSetAssignments[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSetAssignment {
    pub name: String,
    /// Flavor assigned per resource name.
    pub flavors: BTreeMap<String, String>,
    /// `count` (pods admitted), when written.
    pub count: Option<u64>,
}

/// `status.admission`: where the workload's quota was reserved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    pub cluster_queue: String,
    pub assignments: Vec<PodSetAssignment>,
}

/// A Workload (namespaced).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.queueName`: a LocalQueue of the workload's namespace.
    pub queue_name: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    /// Owner references (bounded): the objects whose pods run this workload.
    pub owners: Vec<WorkloadOwner>,
    pub pod_sets: Vec<PodSetInfo>,
    pub admission: Option<Admission>,
    /// Since when condition `QuotaReserved` is True (`None` when not True).
    pub quota_reserved_since: Option<DateTime<Utc>>,
    /// Since when condition `Admitted` is True (`None` when not True).
    pub admitted_since: Option<DateTime<Utc>>,
    /// Since when condition `Finished` is True (`None` when not True).
    pub finished_since: Option<DateTime<Utc>>,
    /// Condition `Admitted` is True (its time may be absent).
    pub admitted: bool,
    /// Condition `Finished` is True.
    pub finished: bool,
    /// `spec.active: false`: deactivated (by a user, or by Kueue after too many evictions);
    /// Kueue keeps it out of its queue until it is reactivated, so it waits for nothing.
    pub deactivated: bool,
}

impl WorkloadInfo {
    /// Whether any pod set asks for a GPU resource.
    pub fn needs_gpus(&self) -> bool {
        self.pod_sets
            .iter()
            .any(|s| s.count > 0 && s.gpu_per_pod.values().any(|u| *u > 0))
    }

    /// Admitted and not finished: its pods hold the quota Kueue admitted.
    pub fn holds_quota(&self) -> bool {
        self.admitted && !self.finished && self.admission.is_some()
    }

    /// Waiting in its queue: neither admitted, finished nor deactivated.
    pub fn pending(&self) -> bool {
        !self.admitted && !self.finished && !self.deactivated
    }
}

// === Which Workload a pod runs for ===

/// Kueue's annotation on the pod templates of an admitted job: the name of its Workload (in the
/// pod's namespace). `sigs.k8s.io/kueue` v0.17.0 `apis/kueue/v1beta2/topology_types.go`
/// (`WorkloadAnnotation`), written by `pkg/controller/jobframework/reconciler.go`
/// (`getPodSetsInfoFromStatus`) when it starts a job while the TopologyAwareScheduling feature
/// gate is on (Beta, on by default since v0.14); each integration merges it into the templates
/// its controller makes pods from (JobSet's replicated jobs, a RayJob's head and worker groups,
/// a TrainJob's runtime patch), so it reaches pods however deep the owner chain.
pub const WORKLOAD_ANNOTATION: &str = "kueue.x-k8s.io/workload";
/// Kueue's label on the same templates: the name of the pod set the pod belongs to
/// (`pkg/constants/constants.go` `PodSetLabel`, written unconditionally by the same function).
pub const POD_SET_LABEL: &str = "kueue.x-k8s.io/podset";

/// How a pod label's value names a Workload's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerNameForm {
    /// The owner's name itself.
    Exact,
    /// The owner's name, `-` and 5 characters of Kubernetes' random alphabet
    /// (`k8s.io/apimachinery/pkg/util/rand.String(5)`): the name of an object the owner's
    /// controller generated for it.
    GeneratedSuffix,
}

/// Pod labels through which a Workload owner's controller names the owner on its pods, when
/// the pod's own controller is something in between (a Job, a RayCluster) that gpu-ledger does
/// not watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerLabels {
    /// API group of the Workload's owner (its `ownerReferences[].apiVersion` without version).
    pub group: &'static str,
    pub kind: &'static str,
    /// The label whose value names the owner.
    pub name_label: &'static str,
    pub name_form: OwnerNameForm,
    /// The label whose value is the owner's uid, where the controller writes one.
    pub uid_label: Option<&'static str>,
}

/// Where Kueue's pod annotation is absent (its TopologyAwareScheduling gate off), these labels
/// written by the real controllers lead from a pod to its Workload's owner. A Workload owned
/// by a Job, Pod or RayCluster needs none: the pod's controller (or the pod) is the owner.
pub const OWNER_LABELS: [OwnerLabels; 3] = [
    // JobSet (`jobset.x-k8s.io/v1alpha2`) → Job → Pod. `sigs.k8s.io/jobset` v0.11.1
    // `pkg/controllers/jobset_controller.go` `labelAndAnnotateObject` writes the JobSet's name
    // and uid on every child Job and its pod template (`api/jobset/v1alpha2/jobset_types.go`:
    // `JobSetNameKey`, `JobSetUIDKey`).
    OwnerLabels {
        group: "jobset.x-k8s.io",
        kind: "JobSet",
        name_label: "jobset.sigs.k8s.io/jobset-name",
        name_form: OwnerNameForm::Exact,
        uid_label: Some("jobset.sigs.k8s.io/jobset-uid"),
    },
    // Kubeflow Trainer TrainJob (`trainer.kubeflow.org/v1alpha1`) → JobSet → Job → Pod.
    // `github.com/kubeflow/trainer/v2` v2.2.0 `pkg/runtime/framework/plugins/jobset/jobset.go`
    // (`Build`) names the JobSet after the TrainJob, so its pods carry the TrainJob's name in
    // JobSet's name label; the uid label there is the JobSet's, not the TrainJob's.
    OwnerLabels {
        group: "trainer.kubeflow.org",
        kind: "TrainJob",
        name_label: "jobset.sigs.k8s.io/jobset-name",
        name_form: OwnerNameForm::Exact,
        uid_label: None,
    },
    // KubeRay RayJob (`ray.io/v1`) → RayCluster → Pod. `github.com/ray-project/kuberay/
    // ray-operator` v1.6.0: `controllers/ray/rayjob_controller.go` names the RayCluster
    // `utils.GenerateRayClusterName(rayJob.Name)` = `<rayjob>-<rand.String(5)>`
    // (`controllers/ray/utils/util.go`), and `controllers/ray/common/pod.go` (`labelPod`) puts
    // the cluster's name in `ray.io/cluster` on every head and worker pod; the RayJob's
    // `ray.io/originated-from-*` labels stay on the RayCluster and the submitter Job.
    OwnerLabels {
        group: "ray.io",
        kind: "RayJob",
        name_label: "ray.io/cluster",
        name_form: OwnerNameForm::GeneratedSuffix,
        uid_label: None,
    },
];

/// Kubernetes' random-name alphabet (`k8s.io/apimachinery/pkg/util/rand`, `alphanums`).
const GENERATED_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";
/// Length of the suffix [`OwnerNameForm::GeneratedSuffix`] strips (`-` and 5 characters).
const GENERATED_SUFFIX_CHARS: usize = 5;
/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE_BYTES: usize = 63;

impl OwnerLabels {
    /// The owner name a pod's label value stands for, if it has that form.
    pub fn owner_name<'v>(&self, value: &'v str) -> Option<&'v str> {
        match self.name_form {
            OwnerNameForm::Exact => Some(value),
            OwnerNameForm::GeneratedSuffix => {
                let (name, suffix) = value.rsplit_once('-')?;
                (!name.is_empty()
                    && suffix.len() == GENERATED_SUFFIX_CHARS
                    && suffix.chars().all(|c| GENERATED_ALPHABET.contains(c)))
                .then_some(name)
            }
        }
    }
}

/// What a pod says about the Kueue Workload it runs for (bounded and validated: a pod's labels
/// and annotations are untrusted, and a value no real controller could write is dropped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadRefs {
    /// [`WORKLOAD_ANNOTATION`]: the Workload's name.
    pub workload: Option<String>,
    /// [`POD_SET_LABEL`]: the pod set's name.
    pub pod_set: Option<String>,
    /// Values of the [`OWNER_LABELS`] keys the pod carries (at most one per key).
    pub owner_labels: BTreeMap<String, String>,
}

/// A valid label value (Kubernetes: at most 63 characters, alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric).
fn is_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LABEL_VALUE_BYTES
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

impl WorkloadRefs {
    /// Reads the keys of Kueue and of [`OWNER_LABELS`] from a pod's labels and annotations,
    /// keeping only valid values.
    pub fn read(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> WorkloadRefs {
        let label = |key: &str| {
            labels
                .and_then(|l| l.get(key))
                .filter(|v| is_label_value(v))
                .cloned()
        };
        let owner_labels = OWNER_LABELS
            .iter()
            .flat_map(|o| std::iter::once(o.name_label).chain(o.uid_label))
            .filter_map(|key| label(key).map(|v| (key.to_string(), v)))
            .collect();
        WorkloadRefs {
            workload: annotations
                .and_then(|a| a.get(WORKLOAD_ANNOTATION))
                .filter(|v| is_dns1123_subdomain(v))
                .cloned(),
            pod_set: label(POD_SET_LABEL),
            owner_labels,
        }
    }

    /// Whether the pod says nothing about a Workload.
    pub fn is_empty(&self) -> bool {
        self.workload.is_none() && self.pod_set.is_none() && self.owner_labels.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{WORKLOAD_ANNOTATION, WorkloadRefs};

    /// The workload annotation names an object: only a name the API server accepts is read
    /// (an empty label between dots, or one ending in `-`, is refused like any other).
    #[test]
    fn workload_annotation_must_be_a_valid_object_name() {
        let workload = |value: &str| {
            let annotations =
                BTreeMap::from([(WORKLOAD_ANNOTATION.to_string(), value.to_string())]);
            WorkloadRefs::read(None, Some(&annotations)).workload
        };
        assert_eq!(
            workload("job-train-3f2a1").as_deref(),
            Some("job-train-3f2a1")
        );
        assert_eq!(workload("pod-a.b").as_deref(), Some("pod-a.b"));
        for bad in ["a..b", "a.-b", "a-.b", "", "A", &"a".repeat(254)] {
            assert_eq!(workload(bad), None, "{bad:?}");
        }
    }
}
