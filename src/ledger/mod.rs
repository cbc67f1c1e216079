//! The ledger: a pure join of claims and usage at one instant — no I/O, no clock.
//!
//! `build(claims, usage, now, policy)` returns pod, node, namespace and unclaimed-busy rows. The
//! live service, the offline report and the tests all call it; culling reads its output. Claims
//! of only some namespaces ([`ClaimsScope::Namespaces`]) prove no device unclaimed and no node's
//! free capacity.

mod attribution;
pub mod capacity;
pub mod claims;
mod dra;
pub mod kueue;
pub mod names;
pub mod quota;
pub mod reclaim;
pub mod units;
pub mod usage;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use claims::{Claims, NodeInfo, NotebookInfo, PodClaim};
use units::{NodeShape, ResourceNames, SliceTable};
use usage::{DeviceKey, Usage};

pub use attribution::Attribution;

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
    fn of(o: &claims::OwnerRef) -> Self {
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
    /// The notebook this pod belongs to, and whether pod → StatefulSet → Notebook (uid) was verified.
    /// In the JSON only as `notebook_stopped`: the notebook carries `kubeflow-resource-stopped`.
    #[serde(rename = "notebook_stopped", serialize_with = "notebook_stopped")]
    pub notebook: Option<(NotebookInfo, bool)>,
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

/// `notebook_stopped` of the JSON: whether the pod's notebook is stopped (false without one).
#[allow(clippy::ref_option)] // serde's serialize_with hands the field by reference
fn notebook_stopped<S: serde::Serializer>(
    notebook: &Option<(NotebookInfo, bool)>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_bool(
        notebook
            .as_ref()
            .is_some_and(|(nb, _)| nb.stopped.is_some()),
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
    pub resources: BTreeMap<String, u64>,
    /// Physical GPU equivalents per resource of `resources` (the metrics' `resource` label).
    #[serde(skip)]
    pub gpus_by_resource: Vec<(String, f64)>,
    pub attribution: Attribution,
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
    pub pending_reason: Option<String>,
    /// `metadata.finalizers` (bounded): they keep a deleted pod's object (and its GPUs, for
    /// the scheduler) until removed, whatever its node does; a force delete does not remove them.
    pub finalizers: Vec<String>,
    /// Whether the pod's node is Ready: `false` also when its Ready condition is `Unknown`
    /// (unreachable); `None` when not bound, the node is not known or reports no Ready condition.
    pub node_ready: Option<bool>,
    #[serde(flatten)]
    pub evidence: Evidence,
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
            resources: BTreeMap::new(),
            gpus_by_resource: Vec::new(),
            attribution: Attribution::None,
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
    /// [`attribution::Locator`]); never a name that is not a node.
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
    /// For each pending GPU pod, where it would fit and what that takes ([`reclaim`]); empty
    /// when the claims show only some namespaces (no node's free capacity is known then).
    pub reclaim: Vec<reclaim::Reclaim>,
    /// Per namespace and GPU resource a ResourceQuota names: hard, used, busy, idle ([`quota`]).
    pub quotas: Vec<quota::QuotaRow>,
    /// Per Kueue ClusterQueue, flavor and GPU resource ([`quota`]); empty without Kueue.
    pub queues: Vec<quota::QueueRow>,
    /// DRA GPU claims that no quota names ([`quota`]).
    pub dra_claims_unquotaed: Vec<quota::UnquotaedClaim>,
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
            let owner = d.node.as_deref().map_or(0, |n| claims::shard_of(n, total));
            owner == shard
        });
    }
}

fn seconds(d: Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// The pod's state, or `None` for a pod that neither holds GPUs nor asks for them: terminal
/// (Succeeded/Failed), or deleted before it was ever bound to a node (it holds nothing on any
/// node, and is no demand: counting it as Terminating credited its GPUs to no node, under the
/// model "unknown").
fn state_of(p: &PodClaim) -> Option<PodState> {
    if p.phase.is_terminal() || (p.deletion.is_some() && p.node.is_none()) {
        return None;
    }
    Some(if p.deletion.is_some() {
        PodState::Terminating
    } else if p.node.is_some() {
        PodState::Running
    } else {
        PodState::Pending
    })
}

/// How each node's GPU resources convert to GPUs: its labels, and where GFD's labels are missing,
/// what DCGM shows of its GPUs.
fn node_shapes<'a>(
    claims: &'a Claims,
    usage: &Usage,
    index: &attribution::DeviceIndex<'_>,
    policy: &'a Policy,
) -> foldhash::HashMap<&'a str, NodeShape<'a>> {
    claims
        .nodes
        .iter()
        .map(|n| {
            let shape = NodeShape::of(n, &policy.slices);
            // Only nodes without GFD's product label look at DCGM's model.
            let shape = if n.product.is_none() {
                shape.with_dcgm_model(index.dcgm_model_on(&n.name, usage))
            } else {
                shape
            };
            // Nor does GFD's strategy label: MIG devices advertised as `nvidia.com/gpu`.
            let shape = shape.with_dcgm_single_mig(index.dcgm_single_mig_slices_on(&n.name, usage));
            (n.name.as_str(), shape)
        })
        .collect()
}

/// Joins claims with usage at `now`.
pub fn build(claims: &Claims, usage: &Usage, now: DateTime<Utc>, policy: &Policy) -> Ledger {
    let locator = attribution::Locator::new(claims);
    // DRA devices join DCGM by UUID: index devices by UUID only when some claim can hold one.
    let dra_active = claims.dra_enabled && !claims.resource_claims.is_empty();
    let index = attribution::DeviceIndex::new(usage, &locator, dra_active);
    let shapes = node_shapes(claims, usage, &index, policy);
    let dra = dra::DraIndex::new(claims, &policy.names, &policy.slices);
    let mut claimed_devices: Vec<bool> = vec![false; usage.devices.len()];
    // GPU equivalents each pod holds on devices that are not on its node (network-attached):
    // they count for the pod and its namespace, not for its node.
    let mut off_node: Vec<f64> = Vec::with_capacity(claims.pods.len());
    // Rows come out sorted by (namespace, pod): sort references to the claims (8-byte moves)
    // rather than the finished rows (several hundred bytes each).
    let mut order: Vec<&PodClaim> = claims.pods.iter().map(AsRef::as_ref).collect();
    // (namespace, name) is unique: an unstable sort gives the same order, without a buffer.
    order.sort_unstable_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut pods = Vec::with_capacity(order.len());
    for p in order {
        let Some(state) = state_of(p) else { continue };
        let shape = p
            .node
            .as_deref()
            .and_then(|n| shapes.get(n))
            .copied()
            .unwrap_or_else(NodeShape::unplaced);
        let mut gpus_by_resource: Vec<(String, f64)> = policy
            .names
            .gpus_by_resource(&p.resources, &shape)
            .map(|(r, g)| (r.to_string(), g))
            .collect();
        let pod_dra = if dra_active && !p.resource_claims.is_empty() {
            dra.pod(p, state.holds())
        } else {
            dra::PodDra::default()
        };
        // A pod only in the store for its claims (no GPU resource) is listed when a claim holds
        // or asks for a GPU of a counted driver.
        if p.resources.is_empty() && !pod_dra.gpu {
            continue;
        }
        let mut resources = p.resources.clone();
        for (r, units, gpus) in pod_dra.by_resource(state.holds()) {
            let e = resources.entry(r.clone()).or_insert(0);
            *e = e.saturating_add(units);
            gpus_by_resource.push((r, gpus));
        }
        let gpus = gpus_by_resource.iter().map(|(_, g)| g).sum();
        let mut row = PodRow {
            namespace: p.namespace.clone(),
            pod: p.name.clone(),
            node: p.node.clone(),
            state,
            gpus,
            resources,
            gpus_by_resource,
            attribution: Attribution::None,
            utilization: None,
            memory_used_bytes: None,
            idle: None,
            idle_seconds: None,
            terminating_seconds: p.deletion.map(|d| seconds(now - d.requested_at()).max(0.0)),
            stuck: p.deletion.is_some_and(|d| d.stuck(now, policy.stuck_after)),
            pending_seconds: (state == PodState::Pending)
                .then(|| p.created_at.map(|c| seconds(now - c).max(0.0)))
                .flatten(),
            notebook: None,
            owner: p.controller.as_ref().map(Owner::of),
            devices: Vec::new(),
            pending_reason: (state == PodState::Pending)
                .then(|| p.unschedulable_message.clone())
                .flatten(),
            finalizers: p.finalizers.clone(),
            node_ready: shape.node_ready(),
            evidence: Evidence {
                uid: p.uid.clone(),
                started_at: p.started_at.or(p.created_at),
                ready_since: p.ready_since,
                time_sliced: shape.time_sliced(&policy.names, p.resources.keys()),
                ..Evidence::default()
            },
        };
        if let Some((nb, verified)) = notebook_of(claims, p) {
            row.notebook = Some(nb.name.clone());
            row.evidence.notebook = Some((nb.clone(), verified));
        }
        // A bound pod whose claims give it nothing (not reserved for it yet) holds no device.
        if state.holds() && (!p.resources.is_empty() || !pod_dra.held.is_empty()) {
            attribution::attribute(
                &mut row,
                p,
                &pod_dra.held,
                &index,
                usage,
                now,
                policy,
                &mut claimed_devices,
            );
        }
        off_node.push(
            pod_dra
                .held
                .iter()
                .filter(|h| h.off_node && state.holds())
                .map(|h| h.gpus)
                .sum(),
        );
        pods.push(row);
    }

    let nodes = node_rows(
        claims,
        &shapes,
        &pods,
        &off_node,
        policy,
        &NodeDevices {
            dra: &dra,
            index: &index,
            usage,
        },
    );
    let namespaces = namespace_rows(claims, &pods, policy);
    // A device no visible claim owns may be held by a pod the claims do not show.
    let unclaimed_busy = match policy.claims_scope {
        ClaimsScope::Complete => {
            attribution::unclaimed_busy(usage, &index, &claimed_devices, &pods, policy)
        }
        ClaimsScope::Namespaces => Vec::new(),
    };
    Ledger {
        reclaim: reclaim::plan(claims, &pods, now, policy.claims_scope),
        pods,
        nodes,
        namespaces,
        unclaimed_busy,
        usage_available: usage.available,
        ..Ledger::empty(now)
    }
    .with_quotas(claims, &policy.names)
}

/// Notebook of a pod: verified through StatefulSet uid when StatefulSets are known, else by name.
///
/// A pod counts as the StatefulSet's only when it is one of its ordinal pods: named
/// `<statefulset>-<ordinal>` and matching its selector. An ownerReference alone can be written by
/// anyone who can create pods (a `scratch-pod` carrying the StatefulSet's uid must not speak for
/// `alice-nb`).
fn notebook_of<'a>(claims: &'a Claims, p: &PodClaim) -> Option<(&'a NotebookInfo, bool)> {
    if !claims.notebooks_enabled {
        return None;
    }
    let sts_ref = p
        .controller
        .as_ref()
        .filter(|o| o.kind == "StatefulSet" && o.group == "apps")?;
    if !is_ordinal_pod(&p.name, &sts_ref.name) {
        return None;
    }
    let sts = claims
        .statefulsets
        .iter()
        .find(|s| s.uid == sts_ref.uid && s.namespace == p.namespace);
    match sts {
        Some(sts) => {
            if sts.name != sts_ref.name
                || !sts.selector.as_ref().is_some_and(|s| s.matches(&p.labels))
            {
                return None;
            }
            let nb_ref = sts
                .controller
                .as_ref()
                .filter(|o| o.group == "kubeflow.org" && o.kind == "Notebook")?;
            claims
                .notebooks
                .iter()
                .find(|n| {
                    n.namespace == p.namespace
                        && n.uid == nb_ref.uid
                        && n.name == nb_ref.name
                        && sts.name == n.name
                })
                .map(|n| (n, true))
        }
        None => claims
            .notebooks
            .iter()
            .find(|n| n.namespace == p.namespace && n.name == sts_ref.name)
            .map(|n| (n, false)),
    }
}

/// `pod` is `<set>-<ordinal>`, the name a StatefulSet gives its pods.
fn is_ordinal_pod(pod: &str, set: &str) -> bool {
    pod.strip_prefix(set)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What the node rows read about devices: DRA slices and DCGM's devices by node.
struct NodeDevices<'a, 'b> {
    dra: &'b dra::DraIndex<'a>,
    index: &'b attribution::DeviceIndex<'a>,
    usage: &'a Usage,
}

impl NodeDevices<'_, '_> {
    /// GPU equivalents node `n` offers: its extended resources plus the GPUs DRA drivers publish
    /// on it, each device once. When both kinds are there, the sum is capped at the GPUs the
    /// node physically has, as far as that is known: the distinct UUIDs of DCGM and the slices,
    /// or GFD's `nvidia.com/gpu.count` (outside the MIG single strategy, where it counts MIG
    /// devices) — a card advertised by the device plugin and published in a slice counts once.
    fn allocatable(&self, n: &NodeInfo, extended: f64) -> (f64, f64) {
        let (dra_count, dra_uuids) = self.dra.node_gpus(&n.name);
        let dra = dra_count as f64;
        let mut alloc = extended + dra;
        if extended > 0.0 && dra > 0.0 {
            let mut uuids = self.index.uuids_on(&n.name, self.usage);
            uuids.extend(dra_uuids);
            uuids.sort_unstable();
            uuids.dedup();
            let single = n
                .gpu_labels
                .get(claims::MIG_STRATEGY_LABEL)
                .is_some_and(|s| s == "single");
            let gfd = n
                .gpu_labels
                .get(capacity::GPU_COUNT_LABEL)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|_| !single)
                .map_or(0.0, f64::from);
            let physical = (uuids.len() as f64).max(gfd);
            if physical > 0.0 {
                alloc = alloc.min(physical);
            }
        }
        (alloc, dra)
    }
}

fn node_rows(
    claims: &Claims,
    shapes: &foldhash::HashMap<&str, NodeShape<'_>>,
    pods: &[PodRow],
    off_node: &[f64],
    policy: &Policy,
    devices: &NodeDevices<'_, '_>,
) -> Vec<NodeRow> {
    let empty = |node: &str| NodeRow {
        node: node.to_string(),
        gpus_allocatable: 0.0,
        gpus_claimed: 0.0,
        gpus_free: None,
        gpus_unschedulable: 0.0,
        model: None,
    };
    // Rows in a Vec found through a hash of the borrowed name, sorted once at the end: a
    // BTreeMap lookup per pod cost a dozen string comparisons (docs/benchmarks.md).
    let mut rows: Vec<NodeRow> = Vec::new();
    let mut row_of: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
    for n in &claims.nodes {
        let shape = shapes
            .get(n.name.as_str())
            .copied()
            .unwrap_or_else(NodeShape::unplaced);
        let (alloc, dra) = devices.allocatable(n, policy.names.gpus(&n.allocatable, &shape));
        let unschedulable = capacity::unschedulable(
            n,
            &shape,
            &policy.names,
            devices.index.physical_gpus_on(&n.name, devices.usage),
            dra,
        );
        if alloc > 0.0 || unschedulable.is_some_and(|u| u > 0.0) {
            let mut row = empty(&n.name);
            row.gpus_allocatable = alloc;
            row.gpus_unschedulable = unschedulable.unwrap_or(0.0);
            row.model.clone_from(&n.product);
            if let Some(&i) = row_of.get(n.name.as_str()) {
                rows[i] = row; // a node listed twice: the later entry wins, as a map insert did
            } else {
                row_of.insert(n.name.as_str(), rows.len());
                rows.push(row);
            }
        }
    }
    for (p, off) in pods.iter().zip(off_node).filter(|(p, _)| p.state.holds()) {
        let Some(node) = &p.node else { continue };
        let i = *row_of.entry(node.as_str()).or_insert_with(|| {
            rows.push(empty(node));
            rows.len() - 1
        });
        rows[i].gpus_claimed += p.gpus - off;
    }
    rows.sort_unstable_by(|a, b| a.node.cmp(&b.node));
    // Pods the claims do not show may hold any of a node's capacity: free is unknown then.
    if policy.claims_scope == ClaimsScope::Complete {
        for r in &mut rows {
            r.gpus_free = Some(r.gpus_allocatable - r.gpus_claimed);
        }
    }
    rows
}

fn namespace_rows(claims: &Claims, pods: &[PodRow], policy: &Policy) -> Vec<NamespaceRow> {
    // Hashed, sorted once at the end (as in `node_rows`).
    let mut rows: foldhash::HashMap<&str, NamespaceRow> = foldhash::HashMap::default();
    for p in pods {
        let r = rows
            .entry(p.namespace.as_str())
            .or_insert_with(|| empty_namespace(&p.namespace));
        if p.state.holds() {
            r.gpus_claimed += p.gpus;
            if p.idle == Some(true) {
                r.gpus_idle += p.gpus;
            }
        } else {
            r.gpus_pending += p.gpus;
        }
    }
    // Only quotas on extended GPU resources make a namespace row (`gpu_quota`); device-class
    // keys have their own rows (`quotas`).
    for q in claims.quotas.iter().filter(|q| !q.gpu_hard.is_empty()) {
        let r = rows
            .entry(q.namespace.as_str())
            .or_insert_with(|| empty_namespace(&q.namespace));
        for (key, hard) in &q.gpu_hard {
            let e = r.gpu_quota_keys.entry(key.clone()).or_insert(*hard);
            *e = (*e).min(*hard);
            if let Some((name, kind)) = policy
                .names
                .quota_key_resource(key)
                .and_then(|name| policy.names.classify(name).map(|k| (name, k)))
            {
                // A quota is not on a node: whole units, MIG profiles by their name.
                let gpus = NodeShape::unplaced().gpus_per_unit(name, kind) * *hard as f64;
                r.gpu_quota = Some(r.gpu_quota.map_or(gpus, |g: f64| g.min(gpus)));
            }
        }
    }
    let mut rows: Vec<NamespaceRow> = rows.into_values().collect();
    rows.sort_unstable_by(|a, b| a.namespace.cmp(&b.namespace));
    rows
}

fn empty_namespace(ns: &str) -> NamespaceRow {
    NamespaceRow {
        namespace: ns.to_string(),
        gpus_claimed: 0.0,
        gpus_idle: 0.0,
        gpus_pending: 0.0,
        gpu_quota: None,
        gpu_quota_keys: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests;
