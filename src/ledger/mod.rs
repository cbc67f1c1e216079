//! The ledger: a pure join of claims and usage at one instant — no I/O, no clock.
//!
//! `build(claims, usage, now, policy)` returns pod, node, namespace and unclaimed-busy rows. The
//! live service, the offline report and the tests all call it; culling reads its output. Claims
//! of only some namespaces ([`ClaimsScope::Namespaces`]) prove no device unclaimed and no node's
//! free capacity.

pub mod accounting;
mod attribution;
pub mod capacity;
mod claim_builder;
pub mod claims;
mod dra;
pub mod hami;
pub mod hami_inputs;
pub mod health;
pub mod kai;
pub mod kai_pod;
pub mod kueue;
pub mod model;
pub mod mps;
pub mod names;
pub mod quota;
pub mod raycluster;
pub mod reclaim;
mod row_builder;
pub mod showback;
pub mod units;
pub mod usage;
pub mod workspace;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use claims::{Claims, NodeInfo, NotebookInfo, PodClaim, Resources};
use model::seconds;
use units::NodeShape;
use usage::Usage;

pub use model::{
    Attribution, ClaimsScope, Evidence, GpuHealth, Ledger, NamespaceRow, NodeRow, OwnedBy, Owner,
    PodRow, PodState, Policy, Sharing, UnclaimedBusy,
};

/// A pod's row before attribution: its claim in GPU equivalents, its life and sharing layer,
/// no usage yet.
fn base_row(
    p: &PodClaim,
    state: PodState,
    shape: &NodeShape<'_>,
    resources: Resources,
    gpus_by_resource: Vec<(String, f64)>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> PodRow {
    let gpus = gpus_by_resource.iter().map(|(_, g)| g).sum();
    let time_sliced = shape.time_sliced(&policy.names, p.resources.keys());
    PodRow {
        namespace: p.namespace.clone(),
        pod: p.name.clone(),
        node: p.node.clone(),
        state,
        gpus,
        resources,
        gpus_by_resource,
        attribution: Attribution::None,
        sharing: mps::sharing_or(shape.node_info(), &p.resources, &policy.names, time_sliced),
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
        gpu_health: None,
        evidence: Evidence {
            uid: p.uid.clone(),
            started_at: p.started_at.or(p.created_at),
            ready_since: p.ready_since,
            time_sliced,
            ..Evidence::default()
        },
    }
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
    // KAI's reservation pods name their card by UUID too.
    let kai_active = kai::active(claims);
    let index = attribution::DeviceIndex::new(usage, &locator, dra_active || kai_active);
    let shapes = node_shapes(claims, usage, &index, policy);
    let dra = dra::DraIndex::new(claims, &policy.names, &policy.slices);
    let hami_nodes = hami::Nodes::new(claims);
    let sick = health::HealthIndex::new(claims, usage);
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
    // The claim of each row, for the rules that read claims across rows (KAI fractions).
    let mut claim_of: Vec<&PodClaim> = Vec::with_capacity(order.len());
    for claim in order {
        let Some(state) = state_of(claim) else {
            continue;
        };
        // Extended resources DRA serves count through their claim, not again by request.
        let own = dra.counted_once(claim);
        let p: &PodClaim = &own;
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
        let pod_dra = if claims.dra_enabled
            && (!p.resource_claims.is_empty() || !p.class_requests.is_empty())
        {
            dra.pod(p, state.holds())
        } else {
            dra::PodDra::default()
        };
        // A pod only in the store for its claims (no GPU resource) is listed when a claim holds
        // or asks for a GPU of a counted driver.
        // A KAI fraction user asks for no GPU resource: its share comes from its reservation pod.
        if p.resources.is_empty() && !pod_dra.gpu && p.kai.is_none() {
            continue;
        }
        let mut resources = p.resources.clone();
        for (r, units, gpus) in pod_dra.by_resource(state.holds()) {
            let e = resources.entry(r.clone()).or_insert(0);
            *e = e.saturating_add(units);
            gpus_by_resource.push((r, gpus));
        }
        // HAMi vGPU layer: a bound sharer holds its shares, not its inflated request.
        let hami = hami_nodes.pod(p, state.holds());
        hami.replace_gpus(&mut gpus_by_resource, &policy.names);
        let mut row = base_row(p, state, &shape, resources, gpus_by_resource, now, policy);
        if let Some(sharing) = hami.sharing() {
            row.sharing = sharing;
        }
        if let Some((nb, verified)) = notebook_of(claims, p) {
            row.notebook = Some(nb.name.clone());
            row.evidence.owner = Some(OwnedBy::notebook(nb.clone(), verified));
        } else if let Some(owner) = raycluster::owner_of(claims, p) {
            row.evidence.owner = Some(owner);
        }
        // Workspace layer: a pod no Notebook owns may be a Workspace's.
        if row.evidence.owner.is_none() {
            row.evidence.owner = workspace::owner_of(claims, p);
        }
        // A bound pod whose claims give it nothing (not reserved for it yet) holds no device.
        if let Some(shares) = hami.shares() {
            hami::attribute(
                &mut row,
                p,
                shares,
                usage,
                now,
                policy,
                &mut claimed_devices,
            );
        } else if state.holds() && (!p.resources.is_empty() || !pod_dra.held.is_empty()) {
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
        mps::withhold_device_verdict(&mut row);
        if let Some(sick) = sick.as_ref().filter(|_| state.holds()) {
            row.gpu_health = sick.of_pod(p, &row.devices);
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
        claim_of.push(claim);
    }
    if kai_active {
        let reads = kai::Reads::new(&index, usage, now, policy);
        kai::distribute(claims, &mut pods, &claim_of, &reads, &mut claimed_devices);
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
        // HAMi vGPU layer: a HAMi node has its register's cards, not cards × split.
        let extended =
            hami::node_gpus(&n.hami).unwrap_or_else(|| policy.names.gpus(&n.allocatable, &shape));
        let (alloc, dra) = devices.allocatable(n, extended);
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
            // The same card, shared or not: GFD's `-SHARED` suffix is no model of its own.
            row.model = n.product.as_deref().map(|p| mps::model_name(p).to_string());
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
