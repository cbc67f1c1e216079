//! The ledger's claim inputs: small projections of pods, nodes, quotas and Kubeflow Notebooks —
//! who asked for which GPU.
//!
//! The `claims` sources fill them from live watches and from `kubectl get -o json|yaml` dumps, so
//! the ledger never knows where its input came from.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Units per GPU resource name, sorted by name: what a pod claims. A pod names one or two GPU
/// resources, and a one-entry `BTreeMap` allocates a node for eleven (382 bytes per pod, in the
/// claim store and again in the ledger's row; docs/benchmarks.md, round 5).
pub type Resources = litemap::LiteMap<String, u64>;

/// Annotation Kubeflow's controllers read: present (any value) means the notebook is stopped.
pub const STOP_ANNOTATION: &str = "kubeflow-resource-stopped";
/// Our own per-notebook opt-out: `"false"` means never cull.
pub const CULL_OPT_OUT_ANNOTATION: &str = "gpu-ledger.io/cull";
/// A user may postpone a stop until this RFC 3339 time.
pub const SNOOZE_ANNOTATION: &str = "gpu-ledger.io/snooze-until";
/// When gpu-ledger last stopped this notebook (history, never read as "stopped").
pub const STOPPED_AT_ANNOTATION: &str = "gpu-ledger.io/stopped-at";
/// Who stopped it.
pub const STOPPED_BY_ANNOTATION: &str = "gpu-ledger.io/stopped-by";
/// Why it was stopped, with the evidence.
pub const STOP_REASON_ANNOTATION: &str = "gpu-ledger.io/stop-reason";
/// Notice before a stop (`--cull-notice`): when the stop is due (RFC 3339), written by the
/// culling leader when the notebook first qualifies, removed when the notice is cancelled or the
/// stop is made.
pub const STOP_SCHEDULED_AT_ANNOTATION: &str = "gpu-ledger.io/stop-scheduled-at";
/// Why the stop was scheduled, with the evidence (written beside the notice).
pub const STOP_NOTICE_REASON_ANNOTATION: &str = "gpu-ledger.io/stop-notice-reason";
/// Kubeflow's notebook-controller culler: when a kernel of the notebook was last busy (RFC 3339;
/// written only while its culler is on). The activity veto reads it.
pub const LAST_ACTIVITY_ANNOTATION: &str = "notebooks.kubeflow.org/last-activity";
/// Node label set by GPU Feature Discovery for time-sliced GPUs.
pub const REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// Node label with the GPU model (`NVIDIA-H100-80GB-HBM3`; under the MIG single strategy the
/// MIG device, `NVIDIA-H100-80GB-HBM3-MIG-1g.10gb`; time-sliced, with a `-SHARED` suffix).
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Node label with the card memory in MiB (`"24564"`, GFD): KAI's `gpu-memory` share and the
/// MPS memory cap divide by it.
pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// Node label with the MIG strategy of the device plugin (`single`, `mixed`, `none`).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
/// Prefix of the GFD labels kept on [`NodeInfo::gpu_labels`].
pub const GFD_LABEL_PREFIX: &str = "nvidia.com/";

/// Everything the ledger needs from the Kubernetes API at one instant.
// One served flag per optional API (Notebooks, DRA, Workspaces, KubeRay): independent facts,
// not a state machine the bools could encode badly.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, Default)]
pub struct Claims {
    /// Shared with the live pod store: a build's copy of the claims clones pointers, not pods.
    pub pods: Vec<Arc<PodClaim>>,
    pub nodes: Vec<NodeInfo>,
    pub quotas: Vec<QuotaInfo>,
    pub notebooks: Vec<NotebookInfo>,
    pub statefulsets: Vec<StatefulSetInfo>,
    /// DaemonSet pods bound to a node (dcgm-exporter runs as one): a device's node is resolved
    /// through the exporter pod that reported it.
    pub daemon_pods: Vec<DaemonPod>,
    /// False when the Notebook CRD is not served (notebook ownership is then off).
    pub notebooks_enabled: bool,
    /// ResourceClaims (`resource.k8s.io/v1`) that name or hold a device of a counted driver, or
    /// are not allocated yet (their device class tells whether they ask for a GPU).
    pub resource_claims: Vec<ResourceClaimInfo>,
    /// Devices of the counted GPU drivers, as their ResourceSlices publish them.
    pub dra_devices: Vec<DraDevice>,
    /// DeviceClasses, reduced to the GPU drivers and device type their selectors name.
    pub device_classes: Vec<DeviceClassInfo>,
    /// False when `resource.k8s.io/v1` is not served (or not readable): DRA accounting is off.
    pub dra_enabled: bool,
    /// Kueue's queues and workloads (`enabled` false when Kueue is not served).
    pub kueue: super::kueue::KueueInputs,
    /// Names of the nodes other shards own (empty unless [`shard`]ed): a device reported on one
    /// is placed there, so this shard neither claims it nor calls it unclaimed busy.
    pub other_shards_nodes: Vec<String>,
    // Workspace layer (issue 40): Kubeflow Notebooks 2.0 Workspaces and their WorkspaceKinds.
    /// Workspaces (`kubeflow.org/v1beta1`), when served.
    pub workspaces: Vec<WorkspaceInfo>,
    /// WorkspaceKinds: their `activityRules` may exempt a Workspace from pausing.
    pub workspace_kinds: Vec<WorkspaceKindInfo>,
    /// Whether the Workspace API is served (without it no pod is a Workspace's).
    pub workspaces_enabled: bool,
    // RayCluster layer (issue 40): KubeRay's clusters as owner objects.
    /// KubeRay RayClusters (`ray.io/v1`), projected as owner objects (`stopped` when
    /// `spec.suspend` is true or the operator is suspending it; `managed_by` a RayJob or
    /// RayService parent).
    pub rayclusters: Vec<OwnerInfo>,
    /// False when the RayCluster CRD is not served (RayCluster ownership is then off).
    pub rayclusters_enabled: bool,
}

/// A pod of a DaemonSet, reduced to where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPod {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// `status.podIP`, to match a scrape target's `instance` address.
    pub ip: Option<String>,
}

/// Lifecycle phase as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Pending") => Self::Pending,
            Some("Running") => Self::Running,
            Some("Succeeded") => Self::Succeeded,
            Some("Failed") => Self::Failed,
            _ => Self::Unknown,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A controller owner reference, reduced to what ownership checks need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerRef {
    /// API group without version ("" for core, "apps", "kubeflow.org").
    pub group: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// The deletion request of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.deletionTimestamp`: the deadline by which the pod should be gone.
    pub deadline: DateTime<Utc>,
    /// `metadata.deletionGracePeriodSeconds` (0 when absent).
    pub grace_seconds: i64,
}

impl Deletion {
    /// When deletion was requested: the deadline minus the grace period. An impossible grace
    /// period (one that would reach before the calendar's start, an API value is untrusted) is
    /// not subtracted: the deadline itself is then the earliest provable request.
    pub fn requested_at(&self) -> DateTime<Utc> {
        chrono::Duration::try_seconds(self.grace_seconds.max(0))
            .and_then(|g| self.deadline.checked_sub_signed(g))
            .unwrap_or(self.deadline)
    }

    /// Whether `now` is past the deadline by more than `slack` (no overflow near the calendar's
    /// end: a deadline that far away is never passed).
    pub fn stuck(&self, now: DateTime<Utc>, slack: chrono::Duration) -> bool {
        self.deadline
            .checked_add_signed(slack)
            .is_some_and(|t| now > t)
    }
}

/// A pod that claims at least one GPU resource.
#[derive(Debug, Clone, PartialEq)]
pub struct PodClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`; `None` while unscheduled.
    pub node: Option<String>,
    pub phase: PodPhase,
    pub created_at: Option<DateTime<Utc>>,
    /// `status.startTime`.
    pub started_at: Option<DateTime<Utc>>,
    /// Since when the pod has been Ready (`None` when not Ready).
    pub ready_since: Option<DateTime<Utc>>,
    pub deletion: Option<Deletion>,
    /// Units claimed per GPU resource name (only recognised GPU resources).
    pub resources: Resources,
    /// The controller owner reference, if any.
    pub controller: Option<OwnerRef>,
    /// Message of `PodScheduled=False` (e.g. "0/3 nodes are available: 3 Insufficient nvidia.com/gpu").
    /// Shared with the pod's row in the ledger ([`super::PodRow::pending_reason`]): one copy
    /// per Pending pod, however many builds publish it.
    pub unschedulable_message: Option<Arc<str>>,
    /// Labels, kept only for pods a StatefulSet controls (to check its selector).
    pub labels: BTreeMap<String, String>,
    /// Names of the ResourceClaims (in the pod's namespace) the pod uses: `spec.resourceClaims`
    /// by `resourceClaimName`, claims made from templates through `status.resourceClaimStatuses`,
    /// and the claim the scheduler made for DRA-backed extended resources
    /// (`status.extendedResourceClaimStatus`; those resources are then not in `resources`).
    pub resource_claims: Vec<String>,
    /// Where the scheduler may place the pod (kept only while it is not bound to a node: the
    /// reclaim planner reads it for pending pods).
    pub placement: Placement,
    /// `spec.schedulingGates` by name (bounded, [`bounded_names`]), kept only while the pod is
    /// not bound: a gated pod is not considered by the scheduler until every gate is removed
    /// (Kueue's pod integration gates `kueue.x-k8s.io/admission` until it admits the workload),
    /// so it is no demand a reclaim can serve.
    pub scheduling_gates: Vec<String>,
    /// `metadata.finalizers` (bounded, [`bounded_names`]): a deleted pod's object stays until
    /// they are removed, whatever its node does; a force delete does not remove them.
    pub finalizers: Vec<String>,
    /// What the pod says about the Kueue Workload it runs for (Kueue's workload annotation and
    /// pod-set label, and the owner labels of `kueue::OWNER_LABELS`): the join to a Workload
    /// whose owner is not the pod's controller (JobSet, TrainJob, RayJob).
    pub workload_refs: super::kueue::WorkloadRefs,
    // DRA extended resources (KEP-5004; issue 39 item 4, `ledger/dra.rs` reads them).
    /// `status.extendedResourceClaimStatus`: the claim the scheduler made for the pod's
    /// extended resources that DRA backs, and which resources it maps. `resources` keeps those
    /// names: the ledger counts them through the claim once it is allocated, by request before.
    pub extended_claim: Option<ExtendedResourceClaim>,
    /// Units asked through a DeviceClass's implicit extended resource name
    /// (`deviceclass.resource.kubernetes.io/<class>`, [`IMPLICIT_EXTENDED_PREFIX`]), with the
    /// same container math as `resources`; whether the class is a GPU class is the ledger's call.
    pub class_requests: BTreeMap<String, u64>,
    // KAI-Scheduler fractions (`ledger/kai.rs`).
    /// KAI's GPU-group labels and fraction annotations, when the pod carries any: a fraction user
    /// asks for no `nvidia.com/gpu` and is kept for these alone.
    pub kai: Option<super::kai_pod::KaiPod>,
    /// HAMi vGPU layer: the pod's allocation annotation, read (`ledger::hami`).
    pub hami: super::hami_inputs::HamiPod,
    // Health layer (issue 39, sick cards).
    /// Devices the kubelet reports `Unhealthy` for this pod
    /// (`status.containerStatuses[].allocatedResourcesStatus`, KEP-4680), bounded
    /// ([`MAX_UNHEALTHY_KEPT`]); `Healthy` and `Unknown` entries are not kept (unknown health is
    /// not sickness).
    pub unhealthy_devices: Vec<UnhealthyResource>,
}

/// Most names kept of a list of gates or finalizers (real pods carry one or two).
pub const MAX_NAMES_KEPT: usize = 16;
/// Longest name kept (a qualified name: a 253-byte prefix, `/`, a 63-byte name).
pub const MAX_NAME_BYTES: usize = 317;

/// A list of names from an untrusted object, bounded: at most [`MAX_NAMES_KEPT`], a name longer
/// than [`MAX_NAME_BYTES`] replaced by a placeholder, and names past the bound counted in a last
/// entry (`"… 3 more"`). Non-empty whenever the input is, so "has any" survives the bound.
pub fn bounded_names<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> Vec<String> {
    let total = names.len();
    let mut out: Vec<String> = names
        .take(if total > MAX_NAMES_KEPT {
            MAX_NAMES_KEPT - 1
        } else {
            MAX_NAMES_KEPT
        })
        .map(|n| {
            if n.len() > MAX_NAME_BYTES {
                "(name too long)".to_string()
            } else {
                n.to_string()
            }
        })
        .collect();
    if total > out.len() {
        out.push(format!("… {} more", total - out.len()));
    }
    out
}

/// What the scheduler checks of a pod against a node's labels and taints, beside resources:
/// `spec.nodeSelector`, required node affinity and tolerations.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Placement {
    /// `spec.nodeSelector`, sorted by key (a one-entry `BTreeMap` would take a 500-byte node
    /// per pending pod; docs/benchmarks.md, "RSS per extra Pending GPU pod").
    pub node_selector: Vec<(String, String)>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms` (ORed); `None` when the
    /// pod has no required node affinity.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
    /// The spec held more selector terms, requirements or tolerations than are kept: the pod is
    /// then placed nowhere by the planner rather than by a weaker, cut selector.
    pub too_large: bool,
}

/// One `nodeSelectorTerms` entry: every requirement must hold (an empty term matches no node).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    pub match_expressions: Vec<NodeRequirement>,
    /// Requirements on node fields (only `metadata.name` exists).
    pub match_fields: Vec<NodeRequirement>,
}

/// One node selector requirement.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeRequirement {
    pub key: String,
    pub operator: NodeOp,
    pub values: Vec<String>,
}

/// A node selector operator; anything else never matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeOp {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    Unknown,
}

impl NodeOp {
    pub fn parse(s: &str) -> Self {
        match s {
            "In" => Self::In,
            "NotIn" => Self::NotIn,
            "Exists" => Self::Exists,
            "DoesNotExist" => Self::DoesNotExist,
            "Gt" => Self::Gt,
            "Lt" => Self::Lt,
            _ => Self::Unknown,
        }
    }
}

/// A pod toleration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Toleration {
    /// Empty with `exists` tolerates every key.
    pub key: String,
    /// Operator `Exists` (else `Equal`, the default).
    pub exists: bool,
    pub value: String,
    /// Empty tolerates every effect.
    pub effect: String,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A node's GPU capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    /// Allocatable units per GPU resource name (only recognised GPU resources).
    pub allocatable: BTreeMap<String, u64>,
    /// Time-slicing replica factor from `nvidia.com/gpu.replicas` (1 when absent).
    pub replicas: u32,
    pub product: Option<String>,
    /// GPU Feature Discovery's labels (`nvidia.com/…`): the MIG strategy, counts and per-profile
    /// replicas the GPU math reads.
    pub gpu_labels: BTreeMap<String, String>,
    /// Every label (bounded), for pod node selectors and affinity (the reclaim planner).
    pub labels: BTreeMap<String, String>,
    /// `spec.taints` (bounded).
    pub taints: Vec<Taint>,
    /// Condition `Ready`: `Some(true)` when `True`, `Some(false)` when `False` or `Unknown` (the
    /// node controller sets `Unknown` when the kubelet stops reporting: unreachable), `None`
    /// without the condition.
    pub ready: Option<bool>,
    /// HAMi vGPU layer: the node's register annotation, read (`ledger::hami`).
    pub hami: super::hami_inputs::HamiNode,
}

/// A ResourceQuota that names a GPU resource.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaInfo {
    pub namespace: String,
    pub name: String,
    /// Hard limit per quota key that names a GPU resource (`requests.nvidia.com/gpu`, …), in units.
    pub gpu_hard: BTreeMap<String, u64>,
    /// True when any key names a GPU resource.
    pub names_gpu: bool,
    /// Hard limit per DRA device-class key (`<class>.deviceclass.resource.k8s.io/devices`), in
    /// devices; whether the class is a GPU class is the ledger's call (it knows the classes).
    pub dra_hard: BTreeMap<String, u64>,
    /// The apiserver's `status.used` for the keys of `gpu_hard` and `dra_hard` (a key missing
    /// here is unknown: not written yet, or unreadable).
    pub used: BTreeMap<String, u64>,
}

/// Which kind of object owns a pod row: the kinds culling can stop. The ledger knows them by
/// this name only; `cull` maps each to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    /// Kubeflow Notebook (`kubeflow.org`), through pod → StatefulSet → Notebook.
    Notebook,
    /// KubeRay RayCluster (`ray.io`).
    RayCluster,
    /// Kubeflow Notebooks 2.0 Workspace (`kubeflow.org` v1beta1).
    Workspace,
}

impl OwnerKind {
    /// The API kind, as users and `kubectl` read it.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::Notebook => "Notebook",
            OwnerKind::RayCluster => "RayCluster",
            OwnerKind::Workspace => "Workspace",
        }
    }
}

/// A Kubeflow Notebook's name for an owner object: the first owner kind was the Notebook.
pub type NotebookInfo = OwnerInfo;

/// An owner object (a Kubeflow Notebook, a RayCluster, a Workspace), reduced to what reporting
/// and culling read; which kind it is travels beside it ([`OwnerKind`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OwnerInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// Value of `kubeflow-resource-stopped`, if present (any value means stopped or locked).
    pub stopped: Option<String>,
    pub deleting: bool,
    /// Opted out of culling: `gpu-ledger.io/cull` is set to anything but exactly `"true"`.
    pub cull_opt_out: bool,
    pub snooze_until: Option<DateTime<Utc>>,
    /// Our own history annotation: when we last stopped it (restart grace).
    pub last_stopped_by_us: Option<DateTime<Utc>>,
    /// Culling annotations that are present but not understood, by name (e.g.
    /// [`SNOOZE_ANNOTATION`] that is not RFC 3339 with a zone): culling holds the notebook back
    /// (fail closed) instead of reading them as absent.
    pub invalid_annotations: Vec<&'static str>,
    /// Our notice: when the scheduled stop is due ([`STOP_SCHEDULED_AT_ANNOTATION`]).
    pub stop_scheduled_at: Option<DateTime<Utc>>,
    /// Activity veto: the last user activity the owner's own controller published (a
    /// notebook's [`LAST_ACTIVITY_ANNOTATION`], a Workspace's `status.activity.lastActivity`);
    /// `None` when it publishes none.
    pub last_activity: Option<DateTime<Utc>>,
    /// Another controller manages the object's lifecycle (a RayCluster a RayJob or RayService
    /// made, e.g. `RayJob train-1`): it is stopped through that parent, never directly.
    pub managed_by: Option<String>,
}

/// A StatefulSet's identity and controller, for pod → StatefulSet → Notebook verification.
#[derive(Debug, Clone, PartialEq)]
pub struct StatefulSetInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<OwnerRef>,
    /// `spec.selector`; `None` when absent (no pod is then taken as its own).
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorRequirement {
    pub key: String,
    pub operator: SelectorOp,
    pub values: Vec<String>,
}

/// A `matchExpressions` operator; anything else never matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorOp {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Unknown,
}

impl LabelSelector {
    /// Whether `labels` satisfy every requirement (an empty selector matches everything, as in
    /// Kubernetes; an unknown operator matches nothing).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOp::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOp::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    SelectorOp::Exists => value.is_some(),
                    SelectorOp::DoesNotExist => value.is_none(),
                    SelectorOp::Unknown => false,
                }
            })
    }
}

/// The driver name of NVIDIA's DRA driver for GPUs (`NVIDIA/k8s-dra-driver-gpu`, now
/// `kubernetes-sigs/dra-driver-nvidia-gpu`): the default of `--dra-gpu-drivers`.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";
/// Prefix of the pseudo resource names DRA devices get in a pod's `resources` (and the metrics'
/// `resource` label): `dra:<driver>` for a whole GPU, `dra:<driver>/mig-<profile>` for a MIG
/// device. A colon never occurs in a Kubernetes resource name, so these cannot collide with one.
pub const DRA_RESOURCE_PREFIX: &str = "dra:";

/// What kind of device a DRA device is, from the driver's `type` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraDeviceKind {
    /// A whole physical GPU (`type: gpu`; also `vfio`, a whole GPU passed through to a VM).
    Gpu,
    /// A MIG device (`type: mig`): `profile` slices of its parent GPU.
    Mig,
}

/// One device of a counted GPU driver, as a ResourceSlice publishes it.
///
/// Attribute names are those NVIDIA's driver publishes (`cmd/gpu-kubelet-plugin/deviceinfo.go`:
/// `type`, `uuid`, `parentUUID`, `profile`, `productName`, …); the driver publishes no GPU
/// instance id, so a MIG device joins DCGM by its MIG UUID only.
#[derive(Debug, Clone, PartialEq)]
pub struct DraDevice {
    pub driver: String,
    pub pool: String,
    /// `spec.devices[].name`, unique within the pool.
    pub name: String,
    /// `spec.nodeName` of the slice (or of the device, with per-device node selection); `None`
    /// for devices that are not local to one node (network-attached).
    pub node: Option<String>,
    pub kind: DraDeviceKind,
    /// `uuid`: the GPU UUID (`GPU-…`) or the MIG device UUID (`MIG-…`).
    pub uuid: Option<String>,
    /// `parentUUID` of a MIG device.
    pub parent_uuid: Option<String>,
    /// `profile` of a MIG device (`1g.10gb`).
    pub profile: Option<String>,
    /// `productName` (`NVIDIA A100-SXM4-80GB`), for the parent's compute slices.
    pub product: Option<String>,
    /// `spec.pool.generation`: only the highest generation of a pool is current.
    pub pool_generation: i64,
    // Health layer (issue 39, sick cards).
    /// `spec.devices[].taints` (bounded, [`MAX_UNHEALTHY_KEPT`]): NVIDIA's DRA driver taints a
    /// device on a fatal XID, a lost GPU or a device NVML cannot monitor.
    pub taints: Vec<DeviceTaint>,
}

/// Identity of an allocated device that its driver recorded in the claim itself
/// (`status.devices[].data`, KEP-4817; NVIDIA's driver writes `type`, `uuid`, `parentUUID`,
/// `migProfile`, `productName` there after preparing a device). It outlives the slice entry (a
/// torn-down MIG device, a republished pool).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DraDeviceStatus {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub kind: Option<DraDeviceKind>,
    pub uuid: Option<String>,
    pub parent_uuid: Option<String>,
    pub profile: Option<String>,
    pub product: Option<String>,
}

/// One allocation result of a claim (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraAllocation {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// One device request of a claim, reduced to what pending demand needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraRequest {
    pub name: String,
    /// `exactly.deviceClassName` (for `firstAvailable`, the first, preferred, subrequest).
    pub device_class: String,
    /// Devices asked for: `count` (`ExactCount`, default 1); 1 for `All` (at least one).
    pub count: u64,
    /// Drivers the request's own CEL selectors compare `device.driver` with.
    pub drivers: Vec<String>,
    /// The MIG profile the request's CEL selectors pin (`….profile == '1g.10gb'`), if any.
    pub profile: Option<String>,
    /// The request's selectors compare `type` with `'mig'`.
    pub mig: bool,
}

/// A ResourceClaim, reduced to what GPU accounting reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourceClaimInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub requests: Vec<DraRequest>,
    /// Allocated devices of counted drivers (admin-access results left out: they observe a
    /// device someone else holds); `None` while the claim is not allocated.
    pub allocated: Option<Vec<DraAllocation>>,
    /// Uids of the pods in `status.reservedFor`.
    pub reserved_for: Vec<String>,
    pub device_status: Vec<DraDeviceStatus>,
}

/// A DeviceClass, reduced to the drivers and device type its CEL selectors name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceClassInfo {
    pub name: String,
    /// Drivers its selectors compare `device.driver` with.
    pub drivers: Vec<String>,
    /// Its selectors compare `type` with `'mig'` (NVIDIA's `mig.nvidia.com`).
    pub mig: bool,
    /// `spec.extendedResourceName` (KEP-5004): pods asking this extended resource on a node
    /// without a device plugin for it get a device of this class.
    pub extended_resource_name: Option<String>,
    /// `metadata.creationTimestamp`: of two classes naming the same extended resource, the
    /// scheduler takes the newer (the name breaks a tie).
    pub created_at: Option<DateTime<Utc>>,
}

/// Prefix of a DeviceClass's implicit extended resource name: a pod asking
/// `deviceclass.resource.kubernetes.io/<class>: N` gets N devices of `<class>` (KEP-5004).
pub const IMPLICIT_EXTENDED_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// `status.extendedResourceClaimStatus` of a pod (KEP-5004), as the scheduler writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtendedResourceClaim {
    /// `resourceClaimName`: the claim in the pod's namespace.
    pub claim: String,
    /// `requestMappings`: which container's extended resource each claim request serves.
    pub mappings: Vec<ExtendedMapping>,
}

/// One `requestMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtendedMapping {
    pub container: String,
    /// The extended resource name the container asked (`nvidia.com/gpu`).
    pub resource: String,
    /// The claim's request serving it.
    pub request: String,
}

// Health layer (issue 39, sick cards): what the API says about a device's health.

/// Most device taints or unhealthy resources kept per device or pod (real ones carry one per
/// key: NVIDIA's driver writes at most three keys).
pub const MAX_UNHEALTHY_KEPT: usize = 16;
/// Longest taint value or kubelet health message kept (the API allows 1024 bytes of message).
pub const MAX_HEALTH_TEXT: usize = 256;

/// The effect of a DRA device taint (`None`, `NoSchedule`, `NoExecute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceTaintEffect {
    /// Informational: the scheduler and the eviction controller ignore it.
    None,
    /// No new allocation of the device.
    NoSchedule,
    /// No new allocation, and pods holding the device are evicted (unless tolerated).
    NoExecute,
    /// An effect this version does not know (never read as unhealthy).
    Unknown,
}

impl DeviceTaintEffect {
    pub fn parse(s: &str) -> Self {
        match s {
            "None" => Self::None,
            "NoSchedule" => Self::NoSchedule,
            "NoExecute" => Self::NoExecute,
            _ => Self::Unknown,
        }
    }
}

/// A taint on one DRA device (`ResourceSlice.spec.devices[].taints[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTaint {
    pub key: String,
    /// Empty when absent (NVIDIA's driver puts the XID code here).
    pub value: String,
    pub effect: DeviceTaintEffect,
    /// `timeAdded`: since when the device is tainted.
    pub time_added: Option<DateTime<Utc>>,
}

/// One resource the kubelet reports `Unhealthy` in a container's `allocatedResourcesStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnhealthyResource {
    /// `name`: the resource (`nvidia.com/gpu` for a device plugin) or `claim:<claim>[/<request>]`
    /// for a DRA claim.
    pub name: String,
    /// `resourceID`: a device plugin's device id (NVIDIA's is the GPU UUID) or, for DRA, the CDI
    /// device id or `<driver>/<pool>/<device>`.
    pub resource_id: String,
    /// `message` (bounded; empty when absent).
    pub message: String,
}

/// Shard owning a node: FNV-1a of its name modulo the shard count (stable across versions and
/// platforms, unlike std's hasher).
pub fn shard_of(node: &str, total: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(total.max(1))) as u32
}

/// Keeps the nodes whose name hashes to `shard` (of `total`), and their pods; pods without a
/// node (pending, or deleted before scheduling) belong to shard 0. Quotas, notebooks and
/// StatefulSets are kept whole (namespace-scoped, needed by every shard).
pub fn shard(mut c: Claims, shard: u32, total: u32) -> Claims {
    if total <= 1 {
        return c;
    }
    let (ours, others): (Vec<NodeInfo>, Vec<NodeInfo>) = std::mem::take(&mut c.nodes)
        .into_iter()
        .partition(|n| node_in_shard(&n.name, shard, total));
    c.nodes = ours;
    c.other_shards_nodes = others.into_iter().map(|n| n.name).collect();
    c.pods.retain(|p| pod_in_shard(p, shard, total));
    c
}

/// Whether `shard` of `total` owns the node.
pub fn node_in_shard(node: &str, shard: u32, total: u32) -> bool {
    total <= 1 || shard_of(node, total) == shard
}

/// Whether `shard` of `total` owns the pod: by its node; unbound pods belong to shard 0.
pub fn pod_in_shard(p: &PodClaim, shard: u32, total: u32) -> bool {
    total <= 1
        || p.node
            .as_deref()
            .map_or(shard == 0, |n| shard_of(n, total) == shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("gpu-node-1", 1), 0);
        let counts = (0..1000).fold([0u32; 4], |mut c, i| {
            c[shard_of(&format!("node-{i}"), 4) as usize] += 1;
            c
        });
        assert!(counts.iter().all(|c| *c > 150), "{counts:?}");
        assert_eq!(shard_of("gpu-node-1", 4), shard_of("gpu-node-1", 4));
    }

    #[test]
    fn deletion_requested_at_is_deadline_minus_grace() {
        let deadline =
            DateTime::parse_from_rfc3339("2026-01-01T00:00:30Z").map(|d| d.with_timezone(&Utc));
        let d = Deletion {
            deadline: deadline.expect("valid"),
            grace_seconds: 30,
        };
        assert_eq!(d.requested_at().to_rfc3339(), "2026-01-01T00:00:00+00:00");
        // deletionGracePeriodSeconds of 1e13 (a crafted or broken object) must not panic.
        let absurd = Deletion {
            deadline: d.deadline,
            grace_seconds: 10_000_000_000_000,
        };
        assert_eq!(absurd.requested_at(), d.deadline);
        let negative = Deletion {
            deadline: d.deadline,
            grace_seconds: -5,
        };
        assert_eq!(negative.requested_at(), d.deadline);
        let end = Deletion {
            deadline: DateTime::<Utc>::MAX_UTC,
            grace_seconds: 0,
        };
        assert!(!end.stuck(DateTime::<Utc>::MAX_UTC, chrono::Duration::minutes(5)));
        assert!(d.stuck(
            d.deadline + chrono::Duration::minutes(6),
            chrono::Duration::minutes(5)
        ));
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let labels: BTreeMap<String, String> = [("statefulset", "nb"), ("tier", "gpu")]
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let by_label = LabelSelector {
            match_labels: [("statefulset".to_string(), "nb".to_string())].into(),
            match_expressions: vec![],
        };
        assert!(by_label.matches(&labels));
        let other = LabelSelector {
            match_labels: [("statefulset".to_string(), "scratch".to_string())].into(),
            match_expressions: vec![],
        };
        assert!(!other.matches(&labels));
        let req = |op, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![SelectorRequirement {
                key: "tier".into(),
                operator: op,
                values: values.iter().map(|v| (*v).to_string()).collect(),
            }],
        };
        assert!(req(SelectorOp::In, &["gpu", "cpu"]).matches(&labels));
        assert!(!req(SelectorOp::NotIn, &["gpu"]).matches(&labels));
        assert!(req(SelectorOp::Exists, &[]).matches(&labels));
        assert!(!req(SelectorOp::DoesNotExist, &[]).matches(&labels));
        assert!(!req(SelectorOp::Unknown, &[]).matches(&labels));
    }
}

// Workspace layer (issue 40): Kubeflow Notebooks 2.0 (`kubeflow.org/v1beta1`).

/// The label the Workspace controller puts on a Workspace's StatefulSet and pods.
pub const WORKSPACE_NAME_LABEL: &str = "notebooks.kubeflow.org/workspace-name";

/// A Workspace: the owner projection culling reads (`stopped` = `"true"` when `spec.paused`,
/// `last_activity` from `status.activity.lastActivity`), plus what its WorkspaceKind's rules
/// match on.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkspaceInfo {
    pub owner: OwnerInfo,
    /// `spec.kind`: the WorkspaceKind's name.
    pub kind: String,
    /// `spec.podTemplate.options.podConfig`: the id of the podConfig option in use.
    pub pod_config: String,
}

/// A WorkspaceKind, reduced to its activity rules and the labels of its podConfig options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkspaceKindInfo {
    pub name: String,
    /// `spec.activityRules`, in order (first match wins).
    pub activity_rules: Vec<ActivityRule>,
    /// `spec.podTemplate.options.podConfig.values[].spawner.labels`, by option id.
    pub pod_config_labels: BTreeMap<String, BTreeMap<String, String>>,
}

/// One `activityRules` entry: when it matches, and whether it pauses (`None`: falls through).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActivityRule {
    /// `match.matchNamespace.selector` (namespace labels).
    pub namespace_selector: Option<LabelSelector>,
    /// `match.matchPodConfig.selector` (the podConfig option's spawner labels).
    pub pod_config_selector: Option<LabelSelector>,
    /// `effect.pauseWorkspace`.
    pub pause_workspace: Option<bool>,
}
