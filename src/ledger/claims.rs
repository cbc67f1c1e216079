//! The ledger's claim inputs: small projections of pods, nodes, quotas and Kubeflow Notebooks —
//! who asked for which GPU.
//!
//! The `claims` sources fill them from live watches and from `kubectl get -o json|yaml` dumps, so
//! the ledger never knows where its input came from.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

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
/// Node label set by GPU Feature Discovery for time-sliced GPUs.
pub const REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// Node label with the GPU model (`NVIDIA-H100-80GB-HBM3`; under the MIG single strategy the
/// MIG device, `NVIDIA-H100-80GB-HBM3-MIG-1g.10gb`; time-sliced, with a `-SHARED` suffix).
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Node label with the MIG strategy of the device plugin (`single`, `mixed`, `none`).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";
/// Prefix of the GFD labels kept on [`NodeInfo::gpu_labels`].
pub const GFD_LABEL_PREFIX: &str = "nvidia.com/";

/// Everything the ledger needs from the Kubernetes API at one instant.
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
    pub resources: BTreeMap<String, u64>,
    /// The controller owner reference, if any.
    pub controller: Option<OwnerRef>,
    /// Message of `PodScheduled=False` (e.g. "0/3 nodes are available: 3 Insufficient nvidia.com/gpu").
    pub unschedulable_message: Option<String>,
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

/// A Kubeflow Notebook, reduced to what reporting and culling read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NotebookInfo {
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
}

/// How a resource name maps to physical GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuResourceKind {
    /// `nvidia.com/gpu`: a whole GPU, or one time-slice replica on a node with replicas > 1.
    Whole,
    /// `nvidia.com/gpu.shared`: a time-slice replica (device plugin `renameByDefault`).
    Shared,
    /// `nvidia.com/mig-<g>g.<mem>gb`: g slices of a GPU with S compute slices (7, or 4 on the A30).
    Mig { slices: u8 },
    /// A configured extra resource name counted as whole GPUs.
    Extra,
}

/// Compute slices of MIG-capable GPUs whose count is not the usual 7 (A100, H100, H200, B200,
/// GB200: 7). Matched case-insensitively against the node's product label. Source: NVIDIA's MIG
/// user guide, "Supported MIG Profiles" (A30: 4 slices, profiles 1g.6gb, 2g.12gb, 4g.24gb).
pub const DEFAULT_SLICE_TABLE: &[(&str, u8)] = &[("A30", 4)];
/// Compute slices assumed when the product is unknown or not in the table.
pub const DEFAULT_COMPUTE_SLICES: u8 = 7;
/// MIG profiles that exist only on 4-slice parts (the A30), for pods not yet on a node.
const FOUR_SLICE_PROFILES: &[&str] = &["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"];

/// Compute slices per GPU product: the built-in table, then `--mig-compute-slices` overrides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceTable {
    /// `(product substring, slices)`, checked before the built-in table.
    pub overrides: Vec<(String, u8)>,
}

impl SliceTable {
    /// Compute slices of the parent GPU for a node product label (with or without the
    /// `-MIG-<profile>` and `-SHARED` suffixes).
    pub fn slices_of(&self, product: Option<&str>) -> u8 {
        let Some(product) = product else {
            return DEFAULT_COMPUTE_SLICES;
        };
        let base = product
            .split("-MIG-")
            .next()
            .unwrap_or(product)
            .to_ascii_lowercase();
        self.overrides
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .chain(DEFAULT_SLICE_TABLE.iter().copied())
            .find(|(p, _)| base.contains(&p.to_ascii_lowercase()))
            .map_or(DEFAULT_COMPUTE_SLICES, |(_, n)| n.max(1))
    }
}

/// Compute slices of the parent of MIG `profile` when no product names it: 4 for the profiles
/// only 4-slice parts have, else [`DEFAULT_COMPUTE_SLICES`].
pub fn unplaced_parent_slices(profile: &str) -> u8 {
    if FOUR_SLICE_PROFILES.contains(&profile) {
        4
    } else {
        DEFAULT_COMPUTE_SLICES
    }
}

/// The GPU slices `g` of a MIG profile `<g>g.<mem>gb[+me…]`, if it is one (1..=7).
pub fn profile_slices(profile: &str) -> Option<u8> {
    let g = profile
        .split_once('g')
        .and_then(|(g, _)| g.parse::<u8>().ok())?;
    (1..=7).contains(&g).then_some(g)
}

/// How units of GPU resources convert to physical GPUs on one node, or for a pod that is not
/// on a node yet.
#[derive(Debug, Clone, Copy)]
pub struct NodeShape<'a> {
    node: Option<&'a NodeInfo>,
    table: Option<&'a SliceTable>,
    compute_slices: u8,
    /// Under the MIG single strategy: the slices of every advertised `nvidia.com/gpu` unit.
    single_mig_slices: Option<u8>,
    /// `compute_slices` comes from DCGM's `modelName` (no GFD product label on the node).
    dcgm_model: bool,
}

impl<'a> NodeShape<'a> {
    /// The shape of `node` (its product, MIG strategy and replica labels).
    pub fn of(node: &'a NodeInfo, slices: &'a SliceTable) -> Self {
        let compute_slices = slices.slices_of(node.product.as_deref());
        let single = node
            .gpu_labels
            .get(MIG_STRATEGY_LABEL)
            .is_some_and(|s| s == "single");
        let single_mig_slices = single
            .then(|| {
                let from_product = node
                    .product
                    .as_deref()
                    .and_then(|p| p.split_once("-MIG-"))
                    .map(|(_, profile)| profile.trim_end_matches("-SHARED"))
                    .and_then(profile_slices);
                from_product.or_else(|| {
                    node.gpu_labels
                        .get("nvidia.com/gpu.slices.gi")
                        .and_then(|v| v.parse::<u8>().ok())
                        .filter(|g| (1..=7).contains(g))
                })
            })
            .flatten();
        NodeShape {
            node: Some(node),
            table: Some(slices),
            compute_slices,
            single_mig_slices,
            dcgm_model: false,
        }
    }

    /// The parent model from DCGM's `modelName` (`NVIDIA A30`) on a node without GFD's product
    /// label (the device plugin's chart does not enable GFD by default). A product label wins.
    #[must_use]
    pub fn with_dcgm_model(mut self, model: Option<&str>) -> Self {
        if let (Some(node), Some(model)) = (self.node, model)
            && node.product.is_none()
        {
            self.compute_slices = self.table_slices(model);
            self.dcgm_model = true;
        }
        self
    }

    /// Under the MIG single strategy on a node without GFD's strategy label, the slices of each
    /// `nvidia.com/gpu` unit as DCGM shows them (every device on the node a MIG instance of one
    /// profile: [`super::attribution`]'s `dcgm_single_mig_slices_on`). A strategy label wins.
    #[must_use]
    pub fn with_dcgm_single_mig(mut self, slices: Option<u8>) -> Self {
        if let (Some(node), Some(g)) = (self.node, slices)
            && !node.gpu_labels.contains_key(MIG_STRATEGY_LABEL)
        {
            self.single_mig_slices = Some(g);
        }
        self
    }

    fn table_slices(&self, product: &str) -> u8 {
        self.table
            .map_or(DEFAULT_COMPUTE_SLICES, |t| t.slices_of(Some(product)))
    }

    /// A pod with no node (pending): no time-slicing, parent slices from the profile name.
    /// The node's Ready condition ([`NodeInfo::ready`]); `None` for an unplaced pod.
    pub fn node_ready(&self) -> Option<bool> {
        self.node.and_then(|n| n.ready)
    }

    pub fn unplaced() -> Self {
        NodeShape {
            node: None,
            table: None,
            compute_slices: DEFAULT_COMPUTE_SLICES,
            single_mig_slices: None,
            dcgm_model: false,
        }
    }

    /// The time-slicing replica factor of `resource` on this node: `nvidia.com/gpu.replicas` for
    /// `nvidia.com/gpu` (and its renamed `.shared`), `nvidia.com/mig-<p>.replicas` for a MIG
    /// profile (GFD publishes one per shared resource); 1 when absent or off a node.
    pub fn replicas_of(&self, resource: &str) -> u32 {
        let Some(node) = self.node else { return 1 };
        let base = resource.strip_suffix(".shared").unwrap_or(resource);
        if base == "nvidia.com/gpu" {
            return node.replicas.max(1);
        }
        node.gpu_labels
            .get(&format!("{base}.replicas"))
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|r| *r >= 1)
            .unwrap_or(1)
    }

    /// Physical GPUs of one unit of `resource` (of `kind`).
    pub fn gpus_per_unit(&self, resource: &str, kind: GpuResourceKind) -> f64 {
        let replicas = f64::from(self.replicas_of(resource));
        let slice = |g: u8, parent: u8| f64::from(g) / f64::from(parent.max(1));
        let whole = match kind {
            GpuResourceKind::Whole => self
                .single_mig_slices
                .map_or(1.0, |g| slice(g, self.compute_slices)),
            GpuResourceKind::Extra | GpuResourceKind::Shared => 1.0,
            GpuResourceKind::Mig { slices } => {
                let by_profile = || {
                    unplaced_parent_slices(resource.strip_prefix("nvidia.com/mig-").unwrap_or(""))
                };
                let parent = if let Some(node) = self.node {
                    // On a node with GPUs of several models, the parent of a MIG profile is
                    // named by its own product label (`nvidia.com/mig-1g.6gb.product`, GFD),
                    // while `nvidia.com/gpu.product` names the full GPUs. Without GFD: DCGM's
                    // model, else the profile name (A30-only profiles), before the default.
                    match node.gpu_labels.get(&format!("{resource}.product")) {
                        Some(p) => self.table_slices(p),
                        None if node.product.is_some() || self.dcgm_model => self.compute_slices,
                        None => by_profile(),
                    }
                } else {
                    by_profile()
                };
                slice(slices.min(parent), parent)
            }
        };
        whole / replicas
    }

    /// Whether any of `resources` is time-sliced here (a shared resource, or replicas > 1).
    pub fn time_sliced<'r>(
        &self,
        names: &ResourceNames,
        resources: impl IntoIterator<Item = &'r String>,
    ) -> bool {
        resources.into_iter().any(|r| match names.classify(r) {
            Some(GpuResourceKind::Shared) => true,
            Some(_) => self.replicas_of(r) > 1,
            None => false,
        })
    }
}

/// Recognises GPU resource names; extra names come from `--extra-gpu-resource`, the DRA
/// drivers whose devices count as GPUs from `--dra-gpu-drivers`.
#[derive(Debug, Clone)]
pub struct ResourceNames {
    pub extra: Vec<String>,
    pub dra_drivers: Vec<String>,
}

impl Default for ResourceNames {
    fn default() -> Self {
        ResourceNames {
            extra: Vec::new(),
            dra_drivers: vec![NVIDIA_DRA_DRIVER.to_string()],
        }
    }
}

impl ResourceNames {
    /// Whether devices of DRA driver `driver` count as GPUs.
    pub fn is_gpu_driver(&self, driver: &str) -> bool {
        self.dra_drivers.iter().any(|d| d == driver)
    }

    pub fn classify(&self, name: &str) -> Option<GpuResourceKind> {
        match name {
            "nvidia.com/gpu" => Some(GpuResourceKind::Whole),
            "nvidia.com/gpu.shared" => Some(GpuResourceKind::Shared),
            _ => {
                if let Some(profile) = name.strip_prefix("nvidia.com/mig-") {
                    return profile_slices(profile).map(|slices| GpuResourceKind::Mig { slices });
                }
                self.extra
                    .iter()
                    .any(|e| e == name)
                    .then_some(GpuResourceKind::Extra)
            }
        }
    }

    /// The GPU resource a quota key names: `requests.nvidia.com/gpu`, `limits.…` or the bare name.
    pub fn quota_key_resource<'a>(&self, key: &'a str) -> Option<&'a str> {
        let name = key
            .strip_prefix("requests.")
            .or_else(|| key.strip_prefix("limits."))
            .unwrap_or(key);
        self.classify(name).map(|_| name)
    }

    /// GPU equivalents for a map of resource units on a node of `shape`.
    pub fn gpus(&self, resources: &BTreeMap<String, u64>, shape: &NodeShape<'_>) -> f64 {
        self.gpus_by_resource(resources, shape)
            .map(|(_, g)| g)
            .sum()
    }

    /// GPU equivalents per recognised resource of `resources`.
    pub fn gpus_by_resource<'r>(
        &'r self,
        resources: &'r BTreeMap<String, u64>,
        shape: &'r NodeShape<'_>,
    ) -> impl Iterator<Item = (&'r str, f64)> + 'r {
        resources.iter().filter_map(move |(name, units)| {
            self.classify(name)
                .map(|k| (name.as_str(), shape.gpus_per_unit(name, k) * *units as f64))
        })
    }
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
    fn classifies_gpu_resource_names() {
        let names = ResourceNames {
            extra: vec!["example.com/gpu".into()],
            ..ResourceNames::default()
        };
        assert_eq!(
            names.classify("nvidia.com/gpu"),
            Some(GpuResourceKind::Whole)
        );
        assert_eq!(
            names.classify("nvidia.com/gpu.shared"),
            Some(GpuResourceKind::Shared)
        );
        assert_eq!(
            names.classify("nvidia.com/mig-3g.40gb"),
            Some(GpuResourceKind::Mig { slices: 3 })
        );
        assert_eq!(
            names.classify("nvidia.com/mig-1g.10gb"),
            Some(GpuResourceKind::Mig { slices: 1 })
        );
        assert_eq!(names.classify("nvidia.com/mig-9g.10gb"), None);
        assert_eq!(
            names.classify("example.com/gpu"),
            Some(GpuResourceKind::Extra)
        );
        assert_eq!(names.classify("cpu"), None);
        assert_eq!(
            names.quota_key_resource("requests.nvidia.com/gpu"),
            Some("nvidia.com/gpu")
        );
        assert_eq!(names.quota_key_resource("limits.cpu"), None);
    }

    fn node_with(labels: &[(&str, &str)], product: Option<&str>, replicas: u32) -> NodeInfo {
        NodeInfo {
            name: "n".into(),
            allocatable: BTreeMap::new(),
            replicas,
            product: product.map(str::to_string),
            gpu_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: Some(true),
        }
    }

    #[test]
    fn gpu_equivalents_follow_design() {
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let mut r = BTreeMap::new();
        r.insert("nvidia.com/gpu".to_string(), 2);
        let plain = node_with(&[], Some("NVIDIA-H100-80GB-HBM3"), 1);
        assert!((names.gpus(&r, &NodeShape::of(&plain, &table)) - 2.0).abs() < 1e-9);
        let sliced = node_with(&[], Some("Tesla-T4-SHARED"), 4);
        assert!((names.gpus(&r, &NodeShape::of(&sliced, &table)) - 0.5).abs() < 1e-9);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-3g.40gb".to_string(), 1);
        m.insert("nvidia.com/mig-1g.10gb".to_string(), 2);
        let h100 = node_with(
            &[(MIG_STRATEGY_LABEL, "mixed")],
            Some("NVIDIA-H100-80GB-HBM3"),
            1,
        );
        assert!((names.gpus(&m, &NodeShape::of(&h100, &table)) - 5.0 / 7.0).abs() < 1e-9);
        assert!((names.gpus(&m, &NodeShape::unplaced()) - 5.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn mig_single_strategy_counts_slices_not_gpus() {
        // GFD on an H100 cut into seven 1g.10gb under the single strategy (gpu-operator docs,
        // "MIG Manager" configuration check).
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let n = node_with(
            &[
                (MIG_STRATEGY_LABEL, "single"),
                ("nvidia.com/gpu.count", "7"),
                ("nvidia.com/gpu.slices.gi", "1"),
            ],
            Some("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
            1,
        );
        let mut alloc = BTreeMap::new();
        alloc.insert("nvidia.com/gpu".to_string(), 7);
        let shape = NodeShape::of(&n, &table);
        assert!(
            (names.gpus(&alloc, &shape) - 1.0).abs() < 1e-9,
            "seven slices are one GPU"
        );
        let mut one = BTreeMap::new();
        one.insert("nvidia.com/gpu".to_string(), 1);
        assert!((names.gpus(&one, &shape) - 1.0 / 7.0).abs() < 1e-9);
        // 3g.40gb under single strategy, product label only.
        let n = node_with(
            &[(MIG_STRATEGY_LABEL, "single")],
            Some("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"),
            1,
        );
        assert!((names.gpus(&one, &NodeShape::of(&n, &table)) - 3.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn a30_has_four_slices_and_the_table_can_be_overridden() {
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let a30 = node_with(&[(MIG_STRATEGY_LABEL, "mixed")], Some("NVIDIA-A30"), 1);
        let shape = NodeShape::of(&a30, &table);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-1g.6gb".to_string(), 1);
        assert!((names.gpus(&m, &shape) - 0.25).abs() < 1e-9);
        let mut m2 = BTreeMap::new();
        m2.insert("nvidia.com/mig-2g.12gb".to_string(), 1);
        assert!((names.gpus(&m2, &shape) - 0.5).abs() < 1e-9);
        // Not yet on a node: the A30-only profile still converts with 4 slices.
        assert!((names.gpus(&m, &NodeShape::unplaced()) - 0.25).abs() < 1e-9);
        let custom = SliceTable {
            overrides: vec![("H100".into(), 4)],
        };
        let h100 = node_with(&[], Some("NVIDIA-H100-80GB-HBM3"), 1);
        let mut g = BTreeMap::new();
        g.insert("nvidia.com/mig-1g.10gb".to_string(), 1);
        assert!((names.gpus(&g, &NodeShape::of(&h100, &custom)) - 0.25).abs() < 1e-9);
        assert_eq!(table.slices_of(Some("NVIDIA-A30-MIG-1g.6gb-SHARED")), 4);
        // A mixed-model node: the full GPUs' product is another card; the profile's own
        // product label names the A30 (GFD, NVIDIA/dcgm-exporter#736's node).
        let mixed = node_with(
            &[
                (MIG_STRATEGY_LABEL, "mixed"),
                ("nvidia.com/mig-1g.6gb.product", "NVIDIA-A30-MIG-1g.6gb"),
            ],
            Some("NVIDIA-RTX-2000-Ada-Generation"),
            1,
        );
        assert!((names.gpus(&m, &NodeShape::of(&mixed, &table)) - 0.25).abs() < 1e-9);
        assert_eq!(table.slices_of(None), 7);
    }

    #[test]
    fn time_sliced_mig_profiles_use_their_own_replicas() {
        let names = ResourceNames::default();
        let n = node_with(
            &[
                (MIG_STRATEGY_LABEL, "mixed"),
                ("nvidia.com/mig-1g.10gb.replicas", "2"),
            ],
            Some("NVIDIA-H100-80GB-HBM3"),
            1,
        );
        let table = SliceTable::default();
        let shape = NodeShape::of(&n, &table);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-1g.10gb".to_string(), 1);
        assert!((names.gpus(&m, &shape) - 1.0 / 14.0).abs() < 1e-9);
        assert!(shape.time_sliced(&names, m.keys()));
        let mut g = BTreeMap::new();
        g.insert("nvidia.com/gpu".to_string(), 1);
        assert!(!shape.time_sliced(&names, g.keys()));
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
