//! Attribution of DCGM devices to GPU pods, and the idle rules that depend on it.

use chrono::{DateTime, Utc};
// Seeded per process (pod names come from the cluster: no crafted collisions), and several times
// faster than SipHash on short keys; maps here are rebuilt on every ledger build.
use foldhash::HashMap;
use foldhash::fast::RandomState;
use serde::Serialize;

use super::claims::{GpuResourceKind, PodClaim};
use super::usage::{DeviceUsage, Usage, Workload};
use super::{PodRow, Policy, seconds};

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

/// Devices by the workloads they name and by host.
pub(super) struct DeviceIndex<'a> {
    by_workload: HashMap<(&'a str, &'a str), Vec<usize>>,
    by_host: HashMap<&'a str, Vec<usize>>,
}

impl<'a> DeviceIndex<'a> {
    pub(super) fn new(usage: &'a Usage) -> Self {
        let mut by_workload: HashMap<(&str, &str), Vec<usize>> =
            HashMap::with_capacity_and_hasher(usage.devices.len(), RandomState::default());
        let mut by_host: HashMap<&str, Vec<usize>> = HashMap::default();
        for (i, d) in usage.devices.iter().enumerate() {
            let per_pod = d.per_pod_utilization.iter().map(|(w, _)| w);
            let mut seen: Vec<&Workload> = Vec::new();
            for w in d.workloads.iter().chain(per_pod) {
                if !seen.contains(&w) {
                    seen.push(w);
                    by_workload
                        .entry((w.namespace.as_str(), w.pod.as_str()))
                        .or_default()
                        .push(i);
                }
            }
            if let Some(h) = &d.hostname {
                by_host.entry(h.as_str()).or_default().push(i);
            }
        }
        DeviceIndex {
            by_workload,
            by_host,
        }
    }
}

/// The node a device is on: its host label (dcgm-exporter sets it from `NODE_NAME`).
pub(super) fn node_of(d: &DeviceUsage) -> Option<String> {
    d.hostname.clone()
}

/// Devices a pod's claim implies: whole units for whole GPUs, one per MIG unit; 0 when unknown.
fn expected_devices(p: &PodClaim, policy: &Policy) -> usize {
    p.resources
        .iter()
        .filter_map(|(name, units)| match policy.names.classify(name) {
            Some(GpuResourceKind::Whole | GpuResourceKind::Extra | GpuResourceKind::Mig { .. }) => {
                Some(*units as usize)
            }
            Some(GpuResourceKind::Shared) => Some(1),
            None => None,
        })
        .sum()
}

/// Idle verdict over a set of devices: `Some(true)` only with full, fresh coverage below threshold.
fn verdict(devs: &[&DeviceUsage], policy: &Policy, now: DateTime<Utc>) -> Option<bool> {
    if devs.is_empty() {
        return None;
    }
    if devs
        .iter()
        .any(|d| d.peak.is_some_and(|p| p >= policy.idle_threshold))
    {
        return Some(false);
    }
    let proven = devs.iter().all(|d| {
        d.peak.is_some_and(|p| p < policy.idle_threshold)
            && d.coverage >= policy.min_coverage
            && d.last_sample_at
                .is_some_and(|t| now - t <= policy.max_staleness)
    });
    proven.then_some(true)
}

/// Fills attribution, utilisation, memory, idle and evidence of a pod that holds GPUs.
#[allow(clippy::too_many_arguments)]
pub(super) fn attribute(
    row: &mut PodRow,
    p: &PodClaim,
    index: &DeviceIndex<'_>,
    usage: &Usage,
    time_sliced: bool,
    now: DateTime<Utc>,
    policy: &Policy,
    claimed: &mut [bool],
) {
    row.evidence.devices_expected = expected_devices(p, policy);
    if !usage.available {
        row.attribution = Attribution::Unattributed;
        return;
    }
    let ids: &[usize] = index
        .by_workload
        .get(&(p.namespace.as_str(), p.name.as_str()))
        .map_or(&[], Vec::as_slice);
    for &i in ids {
        claimed[i] = true;
    }
    let devs: Vec<&DeviceUsage> = ids.iter().map(|&i| &usage.devices[i]).collect();
    row.devices = devs.iter().map(|d| d.key.clone()).collect();
    row.evidence.devices_found = devs.len();

    if devs.is_empty() {
        // A time-sliced sharer that no series pins: idle only when every GPU on its node is idle.
        let host_devs: Vec<&DeviceUsage> = p
            .node
            .as_deref()
            .and_then(|n| index.by_host.get(n))
            .map(|ids| ids.iter().map(|&i| &usage.devices[i]).collect())
            .unwrap_or_default();
        if time_sliced && !host_devs.is_empty() {
            row.attribution = Attribution::Shared;
            if verdict(&host_devs, policy, now) == Some(true) {
                row.idle = Some(true);
                set_idle_since(row, &host_devs, now);
            }
        } else {
            row.attribution = Attribution::Unattributed;
        }
        return;
    }

    let mig = devs.iter().any(|d| d.key.gpu_instance.is_some());
    let crowded = devs.iter().any(|d| d.workloads.len() > 1);
    row.attribution = if mig {
        Attribution::Mig
    } else if time_sliced || crowded || devs.iter().any(|d| !d.per_pod_utilization.is_empty()) {
        Attribution::Shared
    } else {
        Attribution::Exclusive
    };
    row.evidence.coverage = devs
        .iter()
        .map(|d| d.coverage)
        .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))));
    row.evidence.newest_sample_at = devs.iter().map(|d| d.last_sample_at).min().flatten();
    row.evidence.peak = devs
        .iter()
        .map(|d| d.peak)
        .try_fold(0.0_f64, |m, p| p.map(|p| m.max(p)));

    match row.attribution {
        Attribution::Exclusive | Attribution::Mig => {
            let utils: Option<Vec<f64>> = devs.iter().map(|d| d.utilization).collect();
            row.utilization = utils
                .filter(|u| !u.is_empty())
                .map(|u| u.iter().sum::<f64>() / u.len() as f64);
            let mem: Option<Vec<f64>> = devs.iter().map(|d| d.memory_used_bytes).collect();
            row.memory_used_bytes = mem.map(|m| m.iter().sum());
            let complete = devs.len() >= row.evidence.devices_expected;
            row.idle = if complete {
                verdict(&devs, policy, now)
            } else {
                verdict(&devs, policy, now).filter(|v| !v)
            };
        }
        Attribution::Shared => {
            let me = Workload {
                namespace: p.namespace.clone(),
                pod: p.name.clone(),
            };
            let own: Vec<f64> = devs
                .iter()
                .filter_map(|d| {
                    d.per_pod_utilization
                        .iter()
                        .find(|(w, _)| *w == me)
                        .map(|(_, v)| *v)
                })
                .collect();
            row.utilization = (!own.is_empty() && own.len() == devs.len())
                .then(|| own.iter().sum::<f64>() / own.len() as f64);
            // An idle device proves every sharer idle; a busy one proves nothing about this pod
            // unless its own per-process reading is busy.
            row.idle = match verdict(&devs, policy, now) {
                Some(true) => Some(true),
                _ if row.utilization.is_some_and(|u| u >= policy.idle_threshold) => Some(false),
                _ => None,
            };
        }
        Attribution::Unattributed | Attribution::None => {}
    }
    match row.idle {
        Some(true) => set_idle_since(row, &devs, now),
        Some(false) => row.idle_seconds = Some(0.0),
        None => {}
    }
}

/// Idle since the latest of: pod start, last activity, start of unbroken coverage. When the
/// coverage start wins, the idleness may reach further back than the history shows.
fn set_idle_since(row: &mut PodRow, devs: &[&DeviceUsage], now: DateTime<Utc>) {
    let latest = |a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>| a.max(b);
    let mut known = row.evidence.started_at;
    let mut covered = None;
    for d in devs {
        known = latest(known, d.last_active_at);
        covered = latest(covered, d.covered_since);
    }
    let since = latest(known, covered);
    row.evidence.idle_bounded_by_history = covered.is_some_and(|c| known.is_none_or(|k| c > k));
    row.evidence.idle_since = since;
    row.idle_seconds = since.map(|s| seconds(now - s).max(0.0));
}
