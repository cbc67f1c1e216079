//! Kueue's objects (`kueue.x-k8s.io/v1beta2`, the storage version Kueue v0.17.0 serves),
//! reduced to what the quota rows read: ResourceFlavors, ClusterQueues, LocalQueues and
//! Workloads.
//!
//! The `claims` sources fill these from live watches and from dump files; values are untrusted
//! (quantities already parsed to whole units, unknown or impossible ones left `None`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

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
