//! HAMi vGPU: the inputs HAMi writes (node register, pod allocation, per-container monitor
//! readings) and the rule that turns them into GPU shares and idleness.
//!
//! HAMi's device plugin advertises `nvidia.com/gpu` as physical cards × `deviceSplitCount`, so
//! the extended resource overstates both the node (10 GPUs for one card) and every pod (a whole
//! GPU for a quarter). What HAMi really handed out is in annotations (`docs/develop/protocol.md`
//! of Project-HAMi/HAMi): the node's `hami.io/node-nvidia-register` lists its cards, a pod's
//! `hami.io/vgpu-devices-allocated` the card, memory and cores of each container's vGPU.
//!
//! The rule (also in `docs/install.md`, "HAMi vGPU"):
//! - a node with register devices has that many GPUs (its `nvidia.com/gpu` allocatable is
//!   ignored);
//! - a bound pod with an allocation holds, per device, `cores / 100` when cores > 0, else
//!   `memory MiB / the device's memory MiB` (register field 3), else `1 / split`; summed over
//!   its containers and capped at 1 per device; its `gpus` is the sum over devices;
//! - a pod without an allocation (pending, not bound yet) counts by its request, as any pod;
//! - a sharer is proven idle only by its own monitor series (`hami_container_*`): present across
//!   the window for every container HAMi gave a vGPU on each device, utilisation below the idle
//!   threshold and the last kernel at least a window ago. No series is unknown, never idle
//!   (HAMi#1794: the series appear only once the container touches the GPU). DCGM series of the
//!   card join by UUID only (dcgm-exporter loses pod labels on HAMi nodes, HAMi#112): they make
//!   the card claimed, never the sharer idle.

use chrono::{DateTime, Utc};

use super::claims::{Claims, PodClaim};
use super::hami_inputs::{
    HamiAlloc, HamiDevice, HamiNode, HamiPod, HamiShare, REGISTER_ANNOTATION,
};
use super::model::{Attribution, PodRow, Policy, Sharing, seconds};
use super::units::{GpuResourceKind, ResourceNames};
use super::usage::{DeviceKey, HamiContainerUsage, Usage, Workload};

/// GPU equivalents of one vGPU on `device` (the register's entry for its UUID, if found):
/// `cores / 100`, else memory over the card's, else `1 / split`; capped at 1. `Err` names what is
/// missing to tell.
fn share_of(a: &HamiAlloc, device: Option<&HamiDevice>) -> Result<f64, String> {
    let share = if a.cores > 0 {
        f64::from(a.cores) / 100.0
    } else if a.mem_mib > 0 {
        match device.filter(|d| d.mem_mib > 0) {
            Some(d) => a.mem_mib as f64 / d.mem_mib as f64,
            None => {
                return Err(format!(
                    "device {} is not in the node's {REGISTER_ANNOTATION}: its memory is unknown",
                    a.uuid
                ));
            }
        }
    } else {
        match device.filter(|d| d.split > 0) {
            Some(d) => 1.0 / f64::from(d.split),
            None => {
                return Err(format!(
                    "device {} is not in the node's {REGISTER_ANNOTATION}: its split is unknown",
                    a.uuid
                ));
            }
        }
    };
    Ok(share.min(1.0))
}

/// The GPUs a HAMi node has: its register devices; `None` when it is no HAMi node (or its
/// register could not be read).
pub fn node_gpus(node: &HamiNode) -> Option<f64> {
    (!node.devices.is_empty()).then_some(node.devices.len() as f64)
}

/// A pod's HAMi shares per device (sorted by UUID), or why they cannot be told.
pub fn shares(pod: &HamiPod, node: Option<&HamiNode>) -> Result<Vec<HamiShare>, String> {
    if let Some(e) = &pod.error {
        return Err(e.clone());
    }
    if let Some(e) = node.and_then(|n| n.error.as_ref()) {
        return Err(e.clone());
    }
    let devices = node.map_or(&[][..], |n| n.devices.as_slice());
    let mut out: Vec<HamiShare> = Vec::new();
    for a in &pod.allocs {
        let s = share_of(a, devices.iter().find(|d| d.uuid == a.uuid))?;
        match out.iter_mut().find(|o| o.uuid == a.uuid) {
            Some(o) => {
                o.share = (o.share + s).min(1.0);
                o.memory_mib = o.memory_mib.saturating_add(a.mem_mib);
                o.cores = o.cores.saturating_add(a.cores);
            }
            None => out.push(HamiShare {
                uuid: a.uuid.clone(),
                share: s,
                memory_mib: a.mem_mib,
                cores: a.cores,
            }),
        }
    }
    out.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    Ok(out)
}

/// The HAMi nodes of the claims by name (empty, and free, on clusters without HAMi).
pub(super) struct Nodes<'a> {
    by_name: foldhash::HashMap<&'a str, &'a HamiNode>,
}

/// What the HAMi layer says of one pod row.
pub(super) enum PodHami {
    /// No HAMi allocation, or the pod holds nothing (pending): counted by its request.
    None,
    /// A bound sharer's shares per device.
    Shares(Vec<HamiShare>),
    /// HAMi wrote an allocation that cannot be read: counted by its request, with the reason.
    Unreadable(String),
}

impl<'a> Nodes<'a> {
    pub(super) fn new(claims: &'a Claims) -> Self {
        Nodes {
            by_name: claims
                .nodes
                .iter()
                .filter(|n| !n.hami.devices.is_empty() || n.hami.error.is_some())
                .map(|n| (n.name.as_str(), &n.hami))
                .collect(),
        }
    }

    /// The HAMi layer of pod `p` (`holds`: bound and not terminal).
    pub(super) fn pod(&self, p: &PodClaim, holds: bool) -> PodHami {
        if !holds || !p.hami.present() {
            return PodHami::None;
        }
        let node = p.node.as_deref().and_then(|n| self.by_name.get(n)).copied();
        match shares(&p.hami, node) {
            Ok(s) if s.is_empty() => PodHami::None,
            Ok(s) => PodHami::Shares(s),
            Err(e) => PodHami::Unreadable(e),
        }
    }
}

impl PodHami {
    pub(super) fn shares(&self) -> Option<&[HamiShare]> {
        match self {
            Self::Shares(s) => Some(s),
            _ => None,
        }
    }

    /// The row's sharing layer, when HAMi wrote anything for the pod.
    pub(super) fn sharing(&self) -> Option<Sharing> {
        match self {
            Self::None => None,
            Self::Shares(s) => Some(Sharing::Hami {
                share: s.iter().map(|d| d.share).sum(),
                devices: s.clone(),
                readings_over_100: false,
            }),
            Self::Unreadable(reason) => Some(Sharing::HamiUnreadable {
                reason: reason.clone(),
            }),
        }
    }

    /// A sharer's GPU equivalents: the whole-GPU resources HAMi splits (`nvidia.com/gpu`, or an
    /// extra name such as Volcano's `volcano.sh/vgpu-number`) give way to its shares, under the
    /// first of their names.
    pub(super) fn replace_gpus(&self, by_resource: &mut Vec<(String, f64)>, names: &ResourceNames) {
        let Self::Shares(s) = self else { return };
        let split = |r: &str| {
            matches!(
                names.classify(r),
                Some(GpuResourceKind::Whole | GpuResourceKind::Extra)
            )
        };
        let Some(name) = by_resource
            .iter()
            .find(|(r, _)| split(r))
            .map(|(r, _)| r.clone())
        else {
            return;
        };
        by_resource.retain(|(r, _)| !split(r));
        by_resource.push((name, s.iter().map(|d| d.share).sum()));
    }
}

/// Fills attribution, utilisation, memory, idleness and devices of a bound HAMi sharer from its
/// own monitor series; the DCGM series of its cards (by UUID only) are marked `claimed`.
pub(super) fn attribute(
    row: &mut PodRow,
    p: &PodClaim,
    shares: &[HamiShare],
    usage: &Usage,
    now: DateTime<Utc>,
    policy: &Policy,
    claimed: &mut [bool],
) {
    row.attribution = Attribution::Shared;
    row.evidence.devices_expected = shares.len();
    if !usage.available {
        row.attribution = Attribution::Unattributed;
        return;
    }
    let mut found: Vec<DeviceKey> = Vec::new();
    for (i, d) in usage.devices.iter().enumerate() {
        if shares.iter().any(|s| s.uuid == d.key.uuid) {
            claimed[i] = true;
            found.push(d.key.clone());
        }
    }
    // Devices whose DCGM series were found count; a card DCGM does not report is still the
    // pod's (named by HAMi), so it is listed too, without a GPU instance.
    for s in shares {
        if !found.iter().any(|k| k.uuid == s.uuid) {
            found.push(DeviceKey {
                uuid: s.uuid.clone(),
                gpu_instance: None,
            });
        }
    }
    row.evidence.devices_found = shares.len();
    row.devices = found;
    let me = |w: &Workload| w.namespace == p.namespace && w.pod == p.name;
    let own: Vec<&HamiContainerUsage> = usage
        .hami
        .iter()
        .filter(|h| me(&h.workload) && shares.iter().any(|s| s.uuid == h.uuid))
        .collect();
    if own.is_empty() {
        row.attribution = Attribution::Unattributed;
        return;
    }
    if let Sharing::Hami {
        readings_over_100, ..
    } = &mut row.sharing
    {
        *readings_over_100 = own.iter().any(|h| h.over_100);
    }
    // Utilisation: per device, the pod's containers' own readings added; the mean over devices.
    let per_device: Option<Vec<f64>> = shares
        .iter()
        .map(|s| {
            let on: Vec<&&HamiContainerUsage> = own.iter().filter(|h| h.uuid == s.uuid).collect();
            let u: Option<Vec<f64>> = on.iter().map(|h| h.utilization).collect();
            u.filter(|u| !u.is_empty())
                .map(|u| u.iter().sum::<f64>().min(1.0))
        })
        .collect();
    row.utilization = per_device.map(|u| u.iter().sum::<f64>() / u.len().max(1) as f64);
    let mem: Option<Vec<f64>> = own.iter().map(|h| h.memory_used_bytes).collect();
    row.memory_used_bytes = mem.map(|m| m.iter().sum());
    super::attribution::set_window_evidence(
        row,
        own.iter().map(|h| (h.coverage, h.last_sample_at, h.peak)),
    );
    let containers_on = |uuid: &str| {
        let mut c: Vec<usize> = p
            .hami
            .allocs
            .iter()
            .filter(|a| a.uuid == uuid)
            .map(|a| a.container)
            .collect();
        c.sort_unstable();
        c.dedup();
        c.len()
    };
    row.idle = verdict(&own, shares, containers_on, policy, now);
    if (p.phase == super::claims::PodPhase::Unknown || usage.partial) && row.idle == Some(true) {
        row.idle = None;
    }
    match row.idle {
        Some(true) => {
            // Idle since the last kernel (the latest over its containers), never before start.
            let last_kernel = own
                .iter()
                .filter_map(|h| h.last_kernel)
                .filter_map(|(t, elapsed)| {
                    chrono::Duration::try_milliseconds((elapsed * 1000.0) as i64)
                        .and_then(|e| t.checked_sub_signed(e))
                })
                .max();
            let since = last_kernel.max(row.evidence.started_at);
            row.evidence.idle_since = since;
            row.idle_seconds = since.map(|s| seconds(now - s).max(0.0));
        }
        Some(false) => row.idle_seconds = Some(0.0),
        None => {}
    }
}

/// `Some(false)` when any own reading is busy (utilisation at or above the threshold, or a
/// kernel within the window); `Some(true)` only when every device has a series for each
/// container HAMi gave a vGPU on it, every series covers the window, is fresh, stays below the
/// threshold and its last kernel is at least a window old; else unknown.
fn verdict(
    own: &[&HamiContainerUsage],
    shares: &[HamiShare],
    containers_on: impl Fn(&str) -> usize,
    policy: &Policy,
    now: DateTime<Utc>,
) -> Option<bool> {
    let fresh = |t: Option<DateTime<Utc>>| t.is_some_and(|t| now - t <= policy.max_staleness);
    if own.iter().any(|h| {
        h.peak.is_some_and(|p| p >= policy.idle_threshold) || h.kernel_in_window == Some(true)
    }) {
        return Some(false);
    }
    let every_container = shares.iter().all(|s| {
        let mut seen: Vec<&str> = own
            .iter()
            .filter(|h| h.uuid == s.uuid)
            .map(|h| h.container.as_str())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len() >= containers_on(&s.uuid).max(1)
    });
    let proven = own.iter().all(|h| {
        h.peak.is_some_and(|p| p < policy.idle_threshold)
            && h.coverage >= policy.min_coverage
            && fresh(h.last_sample_at)
            && h.kernel_in_window == Some(false)
    });
    (every_container && proven).then_some(true)
}

#[cfg(test)]
mod tests;
