//! Demand-driven culling (`--cull-when=demand`): which stop candidates a pending pod waits for,
//! read from the reclaim planner's answer in the ledger. Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::ledger::reclaim::Reclaim;

/// When culling may stop an idle notebook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CullWhen {
    /// Whenever it is idle long enough (the rules of the plan's `judge`).
    #[default]
    Idle,
    /// Only when a pending pod would fit by stopping it.
    Demand,
}

impl CullWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Demand => "demand",
        }
    }
}

/// For each stop candidate (namespace, pod) that some pending pod waits for: that pod, as
/// `namespace/pod`.
///
/// Pending pods are served in the planner's order (namespace, pod). A pod that fits as things
/// are, or once stuck holders are cleared, needs no stop; nor does a pod with scheduling
/// gates (the planner gives it no option). Otherwise it takes its cheapest option that the stops
/// make on their own, every stop a candidate not already taken by an earlier pending pod. An
/// option that also counts on a stuck holder's force delete (never done by gpu-ledger: the pod
/// would stay pending after the stop) or whose stops are not all candidates (say one notebook
/// idle too briefly) cannot be completed by culling and is passed over.
pub fn needed(
    reclaim: &[Reclaim],
    candidates: &BTreeSet<(&str, &str)>,
) -> BTreeMap<(String, String), String> {
    let mut out: BTreeMap<(String, String), String> = BTreeMap::new();
    for r in reclaim {
        let Some(first) = r.options.first() else {
            continue;
        };
        if first.by_stopping.is_empty() {
            continue;
        }
        let usable = r.options.iter().find(|o| {
            o.by_stops_alone()
                && o.by_stopping.iter().all(|s| {
                    candidates.contains(&(s.namespace.as_str(), s.pod.as_str()))
                        && !out.contains_key(&(s.namespace.clone(), s.pod.clone()))
                })
        });
        if let Some(o) = usable {
            let whom = format!("{}/{}", r.pending.namespace, r.pending.pod);
            for s in &o.by_stopping {
                out.insert((s.namespace.clone(), s.pod.clone()), whom.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
