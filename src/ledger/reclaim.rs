//! The reclaim planner: for each pending GPU pod, the nodes where it would fit, free already or
//! once stuck Terminating holders are cleared (their finalizers finish, or they are force-deleted where the node is gone) or proven-idle notebooks are stopped.
//!
//! Pure (claims and the ledger's pod rows in, plans out). Fit is what the scheduler checks for
//! GPUs: the same resource name in device units (a whole `nvidia.com/gpu`, a MIG profile, a
//! time-slice), the pod's `nodeSelector` and required node affinity against the node's labels,
//! its tolerations against the node's `NoSchedule`/`NoExecute` taints. An extended resource a
//! node does not advertise is served there by DRA when a DeviceClass names it (KEP-5004,
//! [`ExtendedDevices`]): the node's devices of that class count, free when no claim holds them,
//! reclaimable from the pods holding them. Shared and unattributed GPUs are never reclaimable:
//! their idleness is not provable per pod; nor is a sick card (its holder's `gpu_health`):
//! stopping or force-deleting its holder frees nothing a pod can use. A pod with scheduling
//! gates (`spec.schedulingGates`, e.g. Kueue's `kueue.x-k8s.io/admission`) is not planned: the
//! scheduler does not consider it until the gates are removed. MPS clients and KAI reservation
//! pods are never offered, not even when stuck ([`Sharing::never_offered`]); a pending KAI
//! fraction is not planned (it asks KAI, not the scheduler, for a share of a card).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::claims::{
    Claims, NodeInfo, NodeOp, NodeRequirement, NodeSelectorTerm, OwnerKind, Placement, PodClaim,
    Resources, Taint, Toleration,
};
use super::dra::ExtendedDevices;
use super::model::{Attribution, ClaimsScope, OwnedBy, PodRow, PodState, Sharing};
pub use super::model::{PodRef, Reclaim, ReclaimOption, Stop};

/// Most holders on one node searched exhaustively for a fewest-stops set when the pod asks for
/// several resource names (a greedy pick is exact for one name).
const EXHAUSTIVE_HOLDERS: usize = 12;

/// A holder of GPU units on a node that could make room.
struct Holder<'a> {
    row: &'a PodRow,
    /// Units of each requested resource (index into the request) it holds.
    units: Vec<u128>,
}

impl Holder<'_> {
    fn idle(&self) -> f64 {
        self.row
            .idle_seconds
            .filter(|s| s.is_finite())
            .unwrap_or(0.0)
    }
}

/// An option's cost: (free / stuck only / stops, stops, shortest idle among the stops reversed,
/// stuck holders); lower is cheaper.
type Rank = (u8, usize, Reverse<u64>, usize);

/// What a pending pod's options depend on: its request and its placement.
type MemoKey<'k> = (&'k Resources, Option<&'k Placement>);

/// Why a node does not take a pod, in the scheduler's filter order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Misfit {
    Taint,
    Selector,
    Affinity,
    ResourceName,
    Size,
}

/// Plans every pending GPU pod of `pods` (the ledger's rows, sorted by namespace and pod) at
/// `now` (a snooze still running keeps a notebook out of the reclaimable ones).
pub fn plan(
    claims: &Claims,
    pods: &[PodRow],
    now: DateTime<Utc>,
    scope: ClaimsScope,
) -> Vec<Reclaim> {
    // Claims of some namespaces show no node's free capacity.
    if scope == ClaimsScope::Namespaces {
        return Vec::new();
    }
    let pending: Vec<&PodRow> = pods
        .iter()
        .filter(|p| {
            p.state == PodState::Pending && !matches!(p.sharing, Sharing::KaiFraction { .. })
        })
        .collect();
    if pending.is_empty() {
        return Vec::new();
    }
    let specs: foldhash::HashMap<(&str, &str), &PodClaim> = claims
        .pods
        .iter()
        .filter(|p| p.node.is_none())
        .map(|p| ((p.namespace.as_str(), p.name.as_str()), &**p))
        .collect();
    let reclaimable = reclaimable_pods(pods, now);
    let mut on_node: foldhash::HashMap<&str, Vec<(&PodRow, bool)>> = foldhash::HashMap::default();
    for (p, idle) in pods.iter().zip(&reclaimable) {
        if let (true, Some(node)) = (p.state.holds(), p.node.as_deref()) {
            on_node.entry(node).or_default().push((p, *idle));
        }
    }
    let dra = ExtendedDevices::new(claims);
    let mut nodes: Vec<&NodeInfo> = claims.nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|a, b| a.name == b.name);
    // Pods of one Job, sweep or queue ask alike: plan each (request, placement) once.
    let mut memo: foldhash::HashMap<MemoKey<'_>, (Vec<ReclaimOption>, Option<String>)> =
        foldhash::HashMap::default();
    pending
        .into_iter()
        .map(|p| {
            let spec = specs.get(&(p.namespace.as_str(), p.pod.as_str()));
            let placement = spec.map(|c| &c.placement);
            // The scheduler leaves a gated pod alone until every gate is gone: no node takes it,
            // whatever is freed, so it is no demand a stop or a force delete can serve.
            let (options, fits_nowhere) = match spec.filter(|c| !c.scheduling_gates.is_empty()) {
                Some(c) => (
                    Vec::new(),
                    Some(format!(
                        "scheduling gated: {}",
                        c.scheduling_gates.join(", ")
                    )),
                ),
                None => memo
                    .entry((&p.resources, placement))
                    .or_insert_with(|| plan_pod(p, placement, &nodes, &on_node, &dra))
                    .clone(),
            };
            Reclaim {
                pending: PodRef {
                    namespace: p.namespace.clone(),
                    pod: p.pod.clone(),
                },
                gpus: p.gpus,
                options,
                fits_nowhere,
            }
        })
        .collect()
}

/// Per row: a proven-idle pod of an owner culling could stop (a notebook, a RayCluster; every
/// rule the ledger can see: the owner verified, not stopped, managed by no parent, deleting,
/// opted out, snoozed or carrying an annotation not understood; exclusive or MIG attribution),
/// with every GPU-holding pod of its owner so.
fn reclaimable_pods(pods: &[PodRow], now: DateTime<Utc>) -> Vec<bool> {
    let alone: Vec<bool> = pods
        .iter()
        .map(|p| {
            let Some(OwnedBy {
                info: nb, verified, ..
            }) = &p.evidence.owner
            else {
                return false;
            };
            p.state == PodState::Running
                && *verified
                && p.idle == Some(true)
                && matches!(p.attribution, Attribution::Exclusive | Attribution::Mig)
                && !p.sharing.never_offered()
                && nb.stopped.is_none()
                && nb.managed_by.is_none()
                && !nb.deleting
                && !nb.cull_opt_out
                && nb.invalid_annotations.is_empty()
                && nb.snooze_until.is_none_or(|t| t <= now)
                // A stop would free a sick card: no room for anyone (health layer).
                && p.gpu_health.is_none()
        })
        .collect();
    // A stop takes every pod of the notebook: one busy (or unproven) pod keeps them all.
    let mut busy: foldhash::HashSet<(&str, &str)> = foldhash::HashSet::default();
    for (p, ok) in pods.iter().zip(&alone) {
        if let (false, true, Some(owner)) = (*ok, p.state.holds(), &p.evidence.owner) {
            busy.insert((p.namespace.as_str(), owner.info.uid.as_str()));
        }
    }
    pods.iter()
        .zip(alone)
        .map(|(p, ok)| {
            ok && p
                .evidence
                .owner
                .as_ref()
                .is_some_and(|o| !busy.contains(&(p.namespace.as_str(), o.info.uid.as_str())))
        })
        .collect()
}

/// The options of pending pod `p` and, when there are none, why.
fn plan_pod(
    p: &PodRow,
    placement: Option<&Placement>,
    nodes: &[&NodeInfo],
    on_node: &foldhash::HashMap<&str, Vec<(&PodRow, bool)>>,
    dra: &ExtendedDevices<'_>,
) -> (Vec<ReclaimOption>, Option<String>) {
    let request: Vec<(&str, u128)> = p
        .resources
        .iter()
        .filter(|(_, u)| **u > 0)
        .map(|(r, u)| (r.as_str(), u128::from(*u)))
        .collect();
    if request.is_empty()
        || request
            .iter()
            .any(|(r, _)| r.starts_with(super::claims::DRA_RESOURCE_PREFIX))
    {
        return (Vec::new(), Some("asks for DRA devices: not planned".into()));
    }
    let default = Placement::default();
    let placement = placement.unwrap_or(&default);
    if placement.too_large {
        return (
            Vec::new(),
            Some("node selector, affinity or tolerations too large to evaluate".into()),
        );
    }
    let mut misfits: BTreeMap<Misfit, usize> = BTreeMap::new();
    let mut ranked: Vec<(Rank, ReclaimOption)> = Vec::new();
    for n in nodes {
        let holders = on_node.get(n.name.as_str()).map_or(&[][..], Vec::as_slice);
        match option_on(n, &request, placement, holders, dra) {
            Ok(o) => {
                let class = if o.is_free() {
                    0
                } else if o.by_stopping.is_empty() {
                    1
                } else {
                    2
                };
                // The shortest idle among the stops, longest first (whole seconds: a total order).
                let least_idle = o
                    .by_stopping
                    .iter()
                    .map(|s| s.idle_seconds.max(0.0) as u64)
                    .min()
                    .unwrap_or(0);
                let key = (
                    class,
                    o.by_stopping.len(),
                    Reverse(least_idle),
                    o.stuck_holders.len(),
                );
                ranked.push((key, o));
            }
            Err(m) => *misfits.entry(m).or_default() += 1,
        }
    }
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.node.cmp(&b.1.node)));
    let options: Vec<ReclaimOption> = ranked.into_iter().map(|(_, o)| o).collect();
    let fits_nowhere = options
        .is_empty()
        .then(|| nowhere(&misfits, nodes.len(), &request));
    (options, fits_nowhere)
}

/// "0/3 nodes would take it even with idle notebooks stopped: 1 untolerated taint, …".
fn nowhere(misfits: &BTreeMap<Misfit, usize>, nodes: usize, request: &[(&str, u128)]) -> String {
    if nodes == 0 {
        return "no node".into();
    }
    let asked: Vec<String> = request.iter().map(|(r, u)| format!("{u} {r}")).collect();
    let asked = asked.join(" + ");
    let parts: Vec<String> = misfits
        .iter()
        .map(|(m, n)| {
            let why = match m {
                Misfit::Taint => "untolerated taint".to_string(),
                Misfit::Selector => "nodeSelector mismatch".to_string(),
                Misfit::Affinity => "required node affinity mismatch".to_string(),
                Misfit::ResourceName => format!("no {}", names(request)),
                Misfit::Size => format!("too small for {asked} even with idle notebooks stopped"),
            };
            format!("{n} {why}")
        })
        .collect();
    format!("0/{nodes} nodes would take it: {}", parts.join(", "))
}

fn names(request: &[(&str, u128)]) -> String {
    let n: Vec<&str> = request.iter().map(|(r, _)| *r).collect();
    n.join(" or ")
}

/// Whether the scheduler would consider `n` for a pod of `placement` at all, resources aside:
/// taints, node selector, required node affinity.
fn placement_fits(placement: &Placement, n: &NodeInfo) -> Result<(), Misfit> {
    if !tolerates(&placement.tolerations, &n.taints) {
        return Err(Misfit::Taint);
    }
    if !placement
        .node_selector
        .iter()
        .all(|(k, v)| n.labels.get(k) == Some(v))
    {
        return Err(Misfit::Selector);
    }
    if let Some(terms) = &placement.required_terms
        && !terms.iter().any(|t| term_matches(t, n))
    {
        return Err(Misfit::Affinity);
    }
    Ok(())
}

/// The cheapest way node `n` takes the pod, or why it cannot.
fn option_on(
    n: &NodeInfo,
    request: &[(&str, u128)],
    placement: &Placement,
    holders: &[(&PodRow, bool)],
    dra: &ExtendedDevices<'_>,
) -> Result<ReclaimOption, Misfit> {
    placement_fits(placement, n)?;
    // Per requested name: what the holders hold it as, the node's units, and the units claims
    // hold when DRA serves it (the device plugin's are what the holders hold).
    let supply: Vec<(Cow<'_, str>, u128, Option<u128>)> = request
        .iter()
        .map(
            |(r, _)| match n.allocatable.get(*r).copied().filter(|a| *a > 0) {
                Some(a) => (Cow::Borrowed(*r), u128::from(a), None),
                None => dra
                    .on_node(&n.name, r)
                    .map_or((Cow::Borrowed(*r), 0, None), |s| {
                        (
                            Cow::Owned(s.held_as),
                            u128::from(s.devices),
                            Some(u128::from(s.allocated)),
                        )
                    }),
            },
        )
        .collect();
    if supply.iter().any(|(_, a, _)| *a == 0) {
        return Err(Misfit::ResourceName);
    }
    let alloc: Vec<u128> = supply.iter().map(|(_, a, _)| *a).collect();
    if alloc.iter().zip(request).any(|(a, (_, want))| a < want) {
        return Err(Misfit::Size);
    }
    let units_of = |row: &PodRow| -> Vec<u128> {
        supply
            .iter()
            .map(|(r, _, _)| row.resources.get(r.as_ref()).copied().map_or(0, u128::from))
            .collect()
    };
    let held: Vec<u128> = supply
        .iter()
        .enumerate()
        .map(|(i, (_, _, by_claims))| {
            by_claims.unwrap_or_else(|| {
                holders
                    .iter()
                    .map(|(h, _)| units_of(h)[i])
                    .fold(0u128, u128::saturating_add)
            })
        })
        .collect();
    // What is missing as things are (a node over-committed has nothing free).
    let deficit: Vec<u128> = request
        .iter()
        .zip(alloc.iter().zip(&held))
        .map(|((_, want), (a, h))| want.saturating_sub(a.saturating_sub(*h)))
        .collect();
    let node = n.name.clone();
    if deficit.iter().all(|d| *d == 0) {
        return Ok(ReclaimOption {
            node,
            by_stopping: Vec::new(),
            stuck_holders: Vec::new(),
        });
    }
    let contributing = |keep: &dyn Fn(&PodRow, bool) -> bool| -> Vec<Holder<'_>> {
        holders
            .iter()
            .filter(|(h, ok)| keep(h, *ok))
            .map(|(h, _)| Holder {
                row: h,
                units: units_of(h),
            })
            .filter(|h| h.units.iter().any(|u| *u > 0))
            .collect()
    };
    // A force delete of a sick card's holder frees nothing usable (health layer).
    let stuck = sorted(contributing(&|h, _| {
        h.state == PodState::Terminating
            && h.stuck
            && !h.sharing.never_offered()
            && h.gpu_health.is_none()
    }));
    if let Some(set) = fewest(&stuck, &deficit) {
        return Ok(ReclaimOption {
            node,
            by_stopping: Vec::new(),
            stuck_holders: set.iter().map(|i| pod_ref(stuck[*i].row)).collect(),
        });
    }
    // Every stuck holder counts, then the fewest stops cover the rest; stuck holders the stops
    // make unneeded are dropped again.
    let after_stuck: Vec<u128> = deficit
        .iter()
        .enumerate()
        .map(|(i, d)| {
            d.saturating_sub(
                stuck
                    .iter()
                    .map(|h| h.units[i])
                    .fold(0u128, u128::saturating_add),
            )
        })
        .collect();
    let idle = sorted(contributing(&|h, ok| ok && h.state == PodState::Running));
    let stops = fewest(&idle, &after_stuck).ok_or(Misfit::Size)?;
    let freed: Vec<u128> = (0..request.len())
        .map(|i| {
            stops
                .iter()
                .map(|s| idle[*s].units[i])
                .fold(0u128, u128::saturating_add)
        })
        .collect();
    let rest: Vec<u128> = deficit
        .iter()
        .zip(&freed)
        .map(|(d, f)| d.saturating_sub(*f))
        .collect();
    let stuck_needed = fewest(&stuck, &rest).unwrap_or_default();
    Ok(ReclaimOption {
        node,
        by_stopping: stops
            .iter()
            .map(|i| {
                let h = &idle[*i];
                let owner = h.row.evidence.owner.as_ref();
                Stop {
                    namespace: h.row.namespace.clone(),
                    pod: h.row.pod.clone(),
                    notebook: owner.map(|o| o.info.name.clone()).unwrap_or_default(),
                    owner_kind: owner.map_or(OwnerKind::Notebook.as_str(), |o| o.kind.as_str()),
                    idle_seconds: h.idle(),
                }
            })
            .collect(),
        stuck_holders: stuck_needed
            .iter()
            .map(|i| pod_ref(stuck[*i].row))
            .collect(),
    })
}

fn pod_ref(p: &PodRow) -> PodRef {
    PodRef {
        namespace: p.namespace.clone(),
        pod: p.pod.clone(),
    }
}

/// Longest idle first, then by name: the order sets are picked in.
fn sorted(mut hs: Vec<Holder<'_>>) -> Vec<Holder<'_>> {
    hs.sort_by(|a, b| {
        b.idle()
            .total_cmp(&a.idle())
            .then_with(|| (&a.row.namespace, &a.row.pod).cmp(&(&b.row.namespace, &b.row.pod)))
    });
    hs
}

/// Indices (ascending) of the fewest holders whose units cover `need`: empty when nothing is
/// needed, `None` when all of them together do not. Among sets of one size, the first in the
/// holders' order (longest idle first).
fn fewest(hs: &[Holder<'_>], need: &[u128]) -> Option<Vec<usize>> {
    let covers = |set: &[usize]| {
        need.iter().enumerate().all(|(i, want)| {
            set.iter()
                .map(|s| hs[*s].units[i])
                .fold(0u128, u128::saturating_add)
                >= *want
        })
    };
    if covers(&[]) {
        return Some(Vec::new());
    }
    let all: Vec<usize> = (0..hs.len()).collect();
    if !covers(&all) {
        return None;
    }
    if need.len() == 1 {
        // One resource: the largest holders first is a fewest set; ties keep the idle order.
        let mut by_size = all;
        by_size.sort_by_key(|i| Reverse(hs[*i].units[0]));
        let mut set = Vec::new();
        let mut got = 0u128;
        for i in by_size {
            if got >= need[0] {
                break;
            }
            got = got.saturating_add(hs[i].units[0]);
            set.push(i);
        }
        set.sort_unstable();
        return Some(set);
    }
    if hs.len() <= EXHAUSTIVE_HOLDERS {
        for k in 1..=hs.len() {
            let mut idx: Vec<usize> = (0..k).collect();
            loop {
                if covers(&idx) {
                    return Some(idx);
                }
                // Next combination in lexicographic order.
                let Some(pos) = (0..k).rev().find(|&j| idx[j] != j + hs.len() - k) else {
                    break;
                };
                idx[pos] += 1;
                for j in pos + 1..k {
                    idx[j] = idx[j - 1] + 1;
                }
            }
        }
    }
    // Too many holders to search: take them in order until covered (may not be fewest).
    let mut set = Vec::new();
    for i in 0..hs.len() {
        if covers(&set) {
            break;
        }
        set.push(i);
    }
    Some(set)
}

/// Whether `tolerations` cover every `NoSchedule` and `NoExecute` taint (the scheduler's
/// TaintToleration filter; `PreferNoSchedule` only scores).
pub fn tolerates(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates_one(tol, t)))
}

fn tolerates_one(tol: &Toleration, t: &Taint) -> bool {
    if !tol.effect.is_empty() && tol.effect != t.effect {
        return false;
    }
    if tol.exists {
        tol.key.is_empty() || tol.key == t.key
    } else {
        tol.key == t.key && tol.value == t.value
    }
}

/// Whether node `n` satisfies one `nodeSelectorTerms` entry (an empty term matches nothing).
pub fn term_matches(t: &NodeSelectorTerm, n: &NodeInfo) -> bool {
    if t.match_expressions.is_empty() && t.match_fields.is_empty() {
        return false;
    }
    t.match_expressions
        .iter()
        .all(|r| requirement_matches(r, n.labels.get(&r.key).map(String::as_str)))
        && t.match_fields.iter().all(|r| {
            // `metadata.name` is the only node field selectors support, with In and NotIn.
            r.key == "metadata.name"
                && matches!(r.operator, NodeOp::In | NodeOp::NotIn)
                && requirement_matches(r, Some(n.name.as_str()))
        })
}

fn requirement_matches(r: &NodeRequirement, value: Option<&str>) -> bool {
    let number = |s: &str| s.trim().parse::<i64>().ok();
    match r.operator {
        NodeOp::In => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
        NodeOp::NotIn => value.is_none_or(|v| !r.values.iter().any(|x| x == v)),
        NodeOp::Exists => value.is_some(),
        NodeOp::DoesNotExist => value.is_none(),
        NodeOp::Gt | NodeOp::Lt => {
            // Exactly one integer value; a label that is not an integer never matches.
            let [bound] = r.values.as_slice() else {
                return false;
            };
            match (value.and_then(number), number(bound)) {
                (Some(v), Some(b)) if r.operator == NodeOp::Gt => v > b,
                (Some(v), Some(b)) => v < b,
                _ => false,
            }
        }
        NodeOp::Unknown => false,
    }
}

#[cfg(test)]
mod tests;
