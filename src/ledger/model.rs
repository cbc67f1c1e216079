//! The ledger's rows: what `build` returns (pods, nodes, namespaces, unclaimed busy devices,
//! reclaim plans, quota and queue rows) and the policy it is built under. Data only: every file
//! of the ledger reads them from here, and `build` (in `mod.rs`) fills them in.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use super::claims::{OwnerInfo, OwnerKind, OwnerRef, Resources, shard_of};
use super::units::{ResourceNames, SliceTable};
use super::usage::DeviceKey;

/// Knobs that change what the ledger concludes.
#[derive(Debug, Clone)]
pub struct Policy {
    pub names: ResourceNames,
    /// Compute slices per GPU product (MIG profile `<g>g` = g / slices).
    pub slices: SliceTable,
    /// Utilisation (0..1) below which a device counts as idle.
    pub idle_threshold: f64,
    /// Share of the window the samples must prove (at their own interval) to call anything idle.
    pub min_coverage: f64,
    /// Samples older than this are not fresh.
    pub max_staleness: Duration,
    /// A terminating pod is stuck this long past its deletion deadline.
    pub stuck_after: Duration,
    /// Whether the claims show every pod of their nodes.
    pub claims_scope: ClaimsScope,
    /// Namespaces of KAI-Scheduler's reservation pods (`--kai-reservation-namespaces`).
    pub kai_reservation_namespaces: Vec<String>,
}

/// Which pods the claims can show: what the ledger may conclude from a device or a node that no
/// visible claim accounts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimsScope {
    /// Every pod bound to the nodes in the claims (all namespaces; a shard's nodes and their
    /// pods): a busy device no claim owns is unclaimed, a node's free count is known.
    #[default]
    Complete,
    /// Only the pods of some namespaces (`--namespaces`): a pod of another namespace may hold
    /// any device or node capacity, so no device is reported unclaimed busy and node free is
    /// unknown.
    Namespaces,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            names: ResourceNames::default(),
            slices: SliceTable::default(),
            idle_threshold: 0.05,
            min_coverage: 0.9,
            max_staleness: Duration::minutes(2),
            stuck_after: Duration::minutes(5),
            claims_scope: ClaimsScope::Complete,
            kai_reservation_namespaces: super::kai_pod::DEFAULT_RESERVATION_NAMESPACES
                .iter()
                .map(|n| (*n).to_string())
                .collect(),
        }
    }
}

/// Where a GPU pod is in its life, as far as holding a GPU goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    /// Not bound to a node: demand, holds nothing.
    Pending,
    /// Bound, not terminal, not being deleted: holds its GPUs.
    Running,
    /// Deletion requested, not terminal: still holds its GPUs.
    Terminating,
}

impl PodState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Terminating => "terminating",
        }
    }

    /// Whether the pod holds its GPUs on its node (what the scheduler counts).
    pub fn holds(self) -> bool {
        matches!(self, Self::Running | Self::Terminating)
    }
}

/// The controller of a pod, for the owner-info metric and the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

impl Owner {
    pub(super) fn of(o: &OwnerRef) -> Self {
        Owner {
            kind: o.kind.clone(),
            name: o.name.clone(),
        }
    }
}

/// Everything culling needs to judge a pod, kept out of the JSON contract except
/// `idle_bounded_by_history` (flattened into the pod's JSON object).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Evidence {
    #[serde(skip)]
    pub uid: String,
    /// The object this pod belongs to (a Notebook, …), and whether the pod → owner chain was
    /// verified. In the JSON only as `notebook_stopped`: the pod's owner is a Notebook that
    /// carries `kubeflow-resource-stopped`.
    #[serde(rename = "notebook_stopped", serialize_with = "notebook_stopped")]
    pub owner: Option<OwnedBy>,
    #[serde(skip)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub ready_since: Option<DateTime<Utc>>,
    /// Lowest window coverage over the pod's devices.
    #[serde(skip)]
    pub coverage: Option<f64>,
    /// Oldest of the devices' newest samples (all devices are at least this fresh).
    #[serde(skip)]
    pub newest_sample_at: Option<DateTime<Utc>>,
    /// Highest utilisation over the pod's devices in the window.
    #[serde(skip)]
    pub peak: Option<f64>,
    /// Since when the pod's GPUs are proven idle (start, last activity or coverage start).
    #[serde(skip)]
    pub idle_since: Option<DateTime<Utc>>,
    /// Devices found for the pod versus devices its claim implies.
    #[serde(skip)]
    pub devices_found: usize,
    #[serde(skip)]
    pub devices_expected: usize,
    /// Whether the pod's GPUs are time-sliced on its node (a shared resource or replicas > 1).
    #[serde(skip)]
    pub time_sliced: bool,
    /// True when `idle_since` is the start of the sample history available (the idleness may
    /// go back further, unseen), not a last activity or the pod's start: `idle_seconds` is then
    /// a lower bound (the report prints `≥2h0m`).
    pub idle_bounded_by_history: bool,
}

/// The owner object of a pod row: its kind, its projection and whether the pod → owner chain
/// was verified (an unverified owner is shown, never stopped).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedBy {
    pub kind: OwnerKind,
    pub info: OwnerInfo,
    pub verified: bool,
}

impl OwnedBy {
    /// A Kubeflow Notebook owner.
    pub fn notebook(info: OwnerInfo, verified: bool) -> Self {
        OwnedBy {
            kind: OwnerKind::Notebook,
            info,
            verified,
        }
    }
}

/// `notebook_stopped` of the JSON: whether the pod's owner is a stopped Notebook (false without
/// one).
#[allow(clippy::ref_option)] // serde's serialize_with hands the field by reference
fn notebook_stopped<S: serde::Serializer>(
    owner: &Option<OwnedBy>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_bool(
        owner
            .as_ref()
            .is_some_and(|o| o.kind == OwnerKind::Notebook && o.info.stopped.is_some()),
    )
}

/// One GPU pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodRow {
    pub namespace: String,
    pub pod: String,
    pub node: Option<String>,
    pub state: PodState,
    /// Claim in physical GPU equivalents.
    pub gpus: f64,
    pub resources: Resources,
    /// Physical GPU equivalents per resource of `resources` (the metrics' `resource` label).
    #[serde(skip)]
    pub gpus_by_resource: Vec<(String, f64)>,
    pub attribution: Attribution,
    /// Which sharing layer splits the pod's card, if any (`gpus` is already the pod's share).
    /// In the JSON as `"sharing": {"layer": …}`, left out for a card of its own.
    #[serde(skip_serializing_if = "Sharing::is_exclusive")]
    pub sharing: Sharing,
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub idle: Option<bool>,
    pub idle_seconds: Option<f64>,
    pub terminating_seconds: Option<f64>,
    pub stuck: bool,
    pub pending_seconds: Option<f64>,
    pub notebook: Option<String>,
    pub owner: Option<Owner>,
    /// The devices attributed to the pod.
    pub devices: Vec<DeviceKey>,
    /// Why the scheduler has not placed a pending pod.
    pub pending_reason: Option<Arc<str>>,
    /// `metadata.finalizers` (bounded): they keep a deleted pod's object (and its GPUs, for
    /// the scheduler) until removed, whatever its node does; a force delete does not remove them.
    pub finalizers: Vec<String>,
    /// Whether the pod's node is Ready: `false` also when its Ready condition is `Unknown`
    /// (unreachable); `None` when not bound, the node is not known or reports no Ready condition.
    pub node_ready: Option<bool>,
    /// The pod holds a sick card (health layer, `ledger::health`): in the JSON as
    /// `"gpu_health": {"reason", "device", "since"}`, left out while every card it holds is
    /// healthy or of unknown health.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_health: Option<GpuHealth>,
    #[serde(flatten)]
    pub evidence: Evidence,
}

/// Why a pod's card is sick (health layer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuHealth {
    /// `xid:<code>`, `gpu-lost`, `unmonitored`, `taint:<key>`, `kubelet:<message>` or
    /// `dcgm:<watch>` (bounded: it is the metric's `reason` label).
    pub reason: String,
    /// The sick device: its UUID, or `<driver>/<pool>/<device>` for a DRA device without one,
    /// or the kubelet's resource id; `None` when the source does not say which.
    pub device: Option<String>,
    /// Since when (a taint's `timeAdded`); `None` when the source does not say.
    pub since: Option<DateTime<Utc>>,
}

impl PodRow {
    /// A pending pod that holds nothing and has no evidence: the base rows are built from
    /// outside `build` (tests, benchmarks), naming only what they set:
    /// `PodRow { gpus: 1.0, ..PodRow::new("team-a", "nb-0") }`.
    pub fn new(namespace: impl Into<String>, pod: impl Into<String>) -> Self {
        PodRow {
            namespace: namespace.into(),
            pod: pod.into(),
            node: None,
            state: PodState::Pending,
            gpus: 0.0,
            resources: Resources::new(),
            gpus_by_resource: Vec::new(),
            attribution: Attribution::None,
            sharing: Sharing::Exclusive,
            utilization: None,
            memory_used_bytes: None,
            idle: None,
            idle_seconds: None,
            terminating_seconds: None,
            stuck: false,
            pending_seconds: None,
            notebook: None,
            owner: None,
            devices: Vec::new(),
            pending_reason: None,
            finalizers: Vec::new(),
            node_ready: None,
            gpu_health: None,
            evidence: Evidence::default(),
        }
    }
}

/// GPU capacity of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub gpus_allocatable: f64,
    pub gpus_claimed: f64,
    /// Allocatable minus claimed; `None` when the claims do not show every pod on the node
    /// ([`ClaimsScope::Namespaces`]).
    pub gpus_free: Option<f64>,
    /// GPUs the node has (GFD labels, or DCGM where the node advertises none) that its
    /// allocatable does not offer: the device plugin is down, a card fell off the bus, ….
    pub gpus_unschedulable: f64,
    /// The node's GPU model (GFD's `nvidia.com/gpu.product`), for the per-model accounting
    /// counter; `None` without the label. Not part of the report JSON.
    #[serde(skip)]
    pub model: Option<String>,
}

/// GPU claims of one namespace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NamespaceRow {
    pub namespace: String,
    /// Held by running and terminating pods.
    pub gpus_claimed: f64,
    /// Held by pods proven idle.
    pub gpus_idle: f64,
    /// Requested by pending pods (demand, not inside `gpus_claimed`).
    pub gpus_pending: f64,
    /// Tightest GPU hard limit in GPU equivalents; `None` when no quota names a GPU resource.
    pub gpu_quota: Option<f64>,
    /// Hard limits per quota key that names a GPU resource.
    pub gpu_quota_keys: BTreeMap<String, u64>,
}

/// A device above the idle threshold that no claim on its node could own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnclaimedBusy {
    /// The node the device is on, when it can be resolved to a real node (see
    /// attribution's `Locator`); never a name that is not a node.
    pub node: Option<String>,
    pub uuid: String,
    pub gpu_instance: Option<String>,
    pub utilization: f64,
}

/// The join at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ledger {
    pub generated_at: DateTime<Utc>,
    pub pods: Vec<PodRow>,
    pub nodes: Vec<NodeRow>,
    pub namespaces: Vec<NamespaceRow>,
    pub unclaimed_busy: Vec<UnclaimedBusy>,
    /// Whether utilisation came from a working source.
    pub usage_available: bool,
    /// For each pending GPU pod, where it would fit and what that takes (`reclaim`); empty
    /// when the claims show only some namespaces (no node's free capacity is known then).
    pub reclaim: Vec<Reclaim>,
    /// Per namespace and GPU resource a ResourceQuota names: hard, used, busy, idle (`quota`).
    pub quotas: Vec<QuotaRow>,
    /// Per Kueue ClusterQueue, flavor and GPU resource (`quota`); empty without Kueue.
    pub queues: Vec<QueueRow>,
    /// DRA GPU claims that no quota names (`quota`).
    pub dra_claims_unquotaed: Vec<UnquotaedClaim>,
    /// Whether Kueue (`kueue.x-k8s.io/v1beta2`) is served and read.
    pub kueue_available: bool,
}

impl Ledger {
    /// An empty ledger (before the first refresh).
    pub fn empty(now: DateTime<Utc>) -> Self {
        Ledger {
            generated_at: now,
            pods: Vec::new(),
            nodes: Vec::new(),
            namespaces: Vec::new(),
            unclaimed_busy: Vec::new(),
            usage_available: false,
            reclaim: Vec::new(),
            quotas: Vec::new(),
            queues: Vec::new(),
            dra_claims_unquotaed: Vec::new(),
            kueue_available: false,
        }
    }
}

impl Ledger {
    /// Keeps only the rows a shard owns that the claims filter cannot: Prometheus returns every
    /// node's devices to every shard, so a busy device on another shard's node would look
    /// unclaimed here. Devices without a node go to shard 0.
    pub fn retain_shard(&mut self, shard: u32, total: u32) {
        if total <= 1 {
            return;
        }
        // A shard sees only its own nodes (and shard 0 every pending pod): where a pending pod
        // would fit is not known to any one shard.
        self.reclaim.clear();
        // Quotas and queues are cluster-wide: shard 0 exports their limits and usage, no shard
        // can prove what all their pods do (busy / idle unknown, so no queue is proven starved).
        if shard == 0 {
            for q in &mut self.quotas {
                (q.busy, q.idle) = (None, None);
            }
            for r in &mut self.queues {
                (r.busy, r.idle) = (None, None);
                r.starved_while_lender_idle = false;
                r.idle_lenders.clear();
            }
        } else {
            self.quotas.clear();
            self.queues.clear();
            self.dra_claims_unquotaed.clear();
        }
        self.unclaimed_busy.retain(|d| {
            let owner = d.node.as_deref().map_or(0, |n| shard_of(n, total));
            owner == shard
        });
    }
}

/// A duration in seconds, to the millisecond.
pub(super) fn seconds(d: Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// How confidently a pod's utilisation is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attribution {
    /// Whole GPUs whose series name only this pod.
    Exclusive,
    /// MIG GPU instances whose series name this pod.
    Mig,
    /// A time-sliced or otherwise shared device: device-wide values are not this pod's own.
    Shared,
    /// The pod holds GPUs but no series names it: unknown, never idle.
    Unattributed,
    /// Pending: holds no device yet.
    None,
}

/// How a pod's GPU is split with other pods, and by which layer. Each sharing layer (time
/// slicing, MPS, HAMi vGPU, KAI fractions) is one variant: the layer's ledger rule sets it, and
/// sinks render it (the report's note, the JSON's `sharing` object). The pod's share of the card
/// is its row's `gpus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(tag = "layer", rename_all = "kebab-case")]
pub enum Sharing {
    /// No sharing layer: whole devices, MIG instances or DRA devices of its own.
    #[default]
    Exclusive,
    /// Time-sliced by the device plugin (`nvidia.com/gpu.replicas` > 1, or a `.shared` resource).
    TimeSliced,
    // KAI fractions and MPS (`ledger/kai.rs`, `ledger/mps.rs`).
    /// An MPS client (`nvidia.com/gpu.sharing-strategy=mps`): 1/`replicas` of a card, capped at
    /// that share of its memory (`None`: the node names no card memory) and compute.
    Mps {
        replicas: u32,
        memory_cap_bytes: Option<u64>,
        compute_cap_percent: f64,
    },
    /// A KAI-Scheduler fraction user: `share` of each of its `devices` cards (`None` with the
    /// reason in `unknown`), on the cards of `uuids` (their reservation pods' records).
    KaiFraction {
        share: Option<f64>,
        devices: u32,
        gpu_memory_mib: Option<u64>,
        uuids: Vec<String>,
        unknown: Option<String>,
    },
    /// A KAI-Scheduler reservation pod: holds the card of GPU `group` for its `users`, and of
    /// it only the `unassigned` part no user holds.
    KaiReservation {
        group: String,
        uuid: Option<String>,
        users: usize,
        unassigned: f64,
    },
    /// HAMi vGPU (`ledger::hami`): the pod's share of each card HAMi gave it, with the memory
    /// and cores it was given there; `share` is their sum (the row's `gpus`).
    Hami {
        share: f64,
        devices: Vec<super::hami_inputs::HamiShare>,
        /// HAMi's monitor read above 100 % for the pod (HAMi#555): clamped to a whole card.
        readings_over_100: bool,
    },
    /// HAMi wrote an allocation that cannot be read (or its node's register cannot): the pod is
    /// counted by its request, and this says why.
    HamiUnreadable { reason: String },
}

impl Sharing {
    pub fn is_exclusive(&self) -> bool {
        matches!(self, Self::Exclusive)
    }

    /// The layer's name, as in the JSON's `layer`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::TimeSliced => "time-sliced",
            Self::Mps { .. } => "mps",
            Self::KaiFraction { .. } => "kai-fraction",
            Self::KaiReservation { .. } => "kai-reservation",
            Self::Hami { .. } => "hami",
            Self::HamiUnreadable { .. } => "hami-unreadable",
        }
    }

    /// Whether the pod is never offered to free its card: an MPS client (nothing proves it idle)
    /// or a KAI reservation pod (its card is its users'; KAI deletes and recreates it).
    pub fn never_offered(&self) -> bool {
        matches!(self, Self::Mps { .. } | Self::KaiReservation { .. })
    }
}

impl Attribution {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Mig => "mig",
            Self::Shared => "shared",
            Self::Unattributed => "unattributed",
            Self::None => "none",
        }
    }
}

/// One namespace's quota on one GPU resource, against its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaRow {
    pub namespace: String,
    /// The resource the quota key names: `nvidia.com/gpu`, a MIG or shared name, or
    /// `<class>.deviceclass.resource.k8s.io/devices`.
    pub resource: String,
    /// Tightest hard limit over the quotas naming it, in the resource's units.
    pub hard: u64,
    /// The apiserver's `status.used` for the key of that limit; `None` until the quota
    /// controller has written it (or when unreadable).
    pub used: Option<u64>,
    /// GPU equivalents held on the resource by pods proven busy; `None` without utilisation.
    pub busy: Option<f64>,
    /// GPU equivalents held on the resource by pods proven idle; `None` without utilisation.
    pub idle: Option<f64>,
}

/// One ClusterQueue's quota of one flavor and GPU resource, against its evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueRow {
    pub cluster_queue: String,
    pub cohort: Option<String>,
    pub flavor: String,
    pub resource: String,
    /// `nominalQuota`, units.
    pub nominal: Option<u64>,
    /// `borrowingLimit`; `None` = absent (no limit) or unreadable.
    pub borrowing_limit: Option<u64>,
    /// `lendingLimit`; `None` = absent (no limit) or unreadable.
    pub lending_limit: Option<u64>,
    /// Kueue's `status.flavorsUsage` total for the flavor and resource, units; `None` when the
    /// status says nothing yet.
    pub admitted: Option<u64>,
    /// GPU equivalents held by the admitted workloads' pods proven busy.
    pub busy: Option<f64>,
    /// GPU equivalents held by the admitted workloads' pods proven idle ("idle quota").
    pub idle: Option<f64>,
    /// Workloads of the ClusterQueue (through its LocalQueues) asking for a GPU, neither
    /// admitted nor finished (the same on every row of the queue).
    pub pending_workloads: u64,
    /// Age of the oldest of them, seconds since its creation; `None` without one.
    pub oldest_pending_seconds: Option<f64>,
    /// Pending GPU workloads here while another ClusterQueue of the cohort holds admitted GPUs
    /// of this resource proven idle.
    pub starved_while_lender_idle: bool,
    /// Those ClusterQueues, sorted.
    pub idle_lenders: Vec<String>,
}

/// A DRA claim for a GPU that no quota names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnquotaedClaim {
    pub namespace: String,
    pub claim: String,
    /// The GPU DeviceClasses its requests name (sorted); empty when only its allocation shows
    /// a GPU (a request that names a driver directly).
    pub device_classes: Vec<String>,
}

/// A pod by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
}

/// A proven-idle pod whose owner's stop would free its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stop {
    pub namespace: String,
    pub pod: String,
    /// The owner object's name (a notebook's, a RayCluster's).
    pub notebook: String,
    /// The owner's kind (`Notebook`, `RayCluster`): what is stopped, and how.
    pub owner_kind: &'static str,
    pub idle_seconds: f64,
}

/// One node where the pending pod would fit, and what it takes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimOption {
    pub node: String,
    /// Idle notebooks to stop (fewest that make room; empty when none is needed).
    pub by_stopping: Vec<Stop>,
    /// Stuck Terminating pods whose force delete the option counts on (never done by us).
    pub stuck_holders: Vec<PodRef>,
}

/// The planner's answer for one pending GPU pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reclaim {
    pub pending: PodRef,
    /// The pod's request in GPU equivalents.
    pub gpus: f64,
    /// Cheapest first: free already, then stuck holders only, then the fewest stops, then the
    /// longest idle; ties by node name.
    pub options: Vec<ReclaimOption>,
    /// Why no node would take the pod even with every idle holder stopped; `None` when some would.
    pub fits_nowhere: Option<String>,
}

impl Reclaim {
    /// Whether the pod waits for a GPU that reclaiming would give it: it fits nowhere as things
    /// are, and somewhere once stuck holders go or idle notebooks stop.
    pub fn reclaimable(&self) -> bool {
        self.options.first().is_some_and(|o| !o.is_free())
    }
}

impl ReclaimOption {
    /// Fits as things are.
    pub fn is_free(&self) -> bool {
        self.by_stopping.is_empty() && self.stuck_holders.is_empty()
    }

    /// The stops make room on their own: some are needed and no stuck holder's force delete
    /// (which gpu-ledger never does) is counted on. The only options culling can complete.
    pub fn by_stops_alone(&self) -> bool {
        !self.by_stopping.is_empty() && self.stuck_holders.is_empty()
    }
}
