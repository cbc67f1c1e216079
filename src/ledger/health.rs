//! Sick cards: which GPU-holding pods sit on a device that is tainted unhealthy, reported
//! `Unhealthy` by the kubelet, failing a DCGM health watch, or showing a fatal XID in the window.
//!
//! Pure. Sources, strongest first (the first that speaks names the reason):
//! 1. DRA device taints with effect `NoSchedule` or `NoExecute` (NVIDIA's DRA driver: a fatal XID
//!    `gpu.nvidia.com/xid=<code>`, `gpu.nvidia.com/gpu-lost`; `gpu.nvidia.com/unmonitored` only
//!    when someone raised its effect). Effect `None` is informational: the driver uses it for
//!    non-fatal XIDs and for unmonitored devices, so it is not sickness.
//! 2. The kubelet's `allocatedResourcesStatus` `Unhealthy` (KEP-4680); `Unknown` is not sickness.
//! 3. HAMi's own health bit: a card its device plugin registers `healthy=false` on the node
//!    (`hami.io/node-nvidia-register` field 7) names the vGPU pods HAMi allocated on it.
//! 4. DCGM: a health watch at FAIL (20) in the window, or an XID outside the non-fatal set NVIDIA's
//!    DRA driver ignores (13, 31, 43, 45, 68, 109).
//!
//! A device-plugin pod's cards are known by the DCGM devices attributed to it; a DRA pod's by its
//! claims' allocation results (and the UUIDs their slices or the driver's status publish).

use super::claims::{
    Claims, DeviceTaint, DeviceTaintEffect, DraDevice, MAX_HEALTH_TEXT, PodClaim,
    ResourceClaimInfo, UnhealthyResource,
};
use super::model::GpuHealth;
use super::usage::{DcgmHealth, DeviceKey, Usage};

/// NVIDIA's DRA driver's taint key for an XID (value: the decimal code).
pub const XID_TAINT: &str = "gpu.nvidia.com/xid";
/// NVIDIA's DRA driver's taint key for a GPU the driver can no longer reach.
pub const GPU_LOST_TAINT: &str = "gpu.nvidia.com/gpu-lost";
/// NVIDIA's DRA driver's taint key for a device NVML cannot monitor.
pub const UNMONITORED_TAINT: &str = "gpu.nvidia.com/unmonitored";
/// XIDs NVIDIA's DRA driver treats as non-fatal by default (application errors that say nothing
/// about the hardware): never sickness here either.
pub const NON_FATAL_XIDS: &[u32] = &[13, 31, 43, 45, 68, 109];
/// DCGM's health result for a failing watch (`DCGM_HEALTH_RESULT_FAIL`; pass 0, warn 10).
pub const DCGM_HEALTH_FAIL: f64 = 20.0;

/// Whether XID `code` is of the fatal class.
pub fn fatal_xid(code: u32) -> bool {
    !NON_FATAL_XIDS.contains(&code)
}

/// `text` cut to [`MAX_HEALTH_TEXT`] bytes at a character boundary (a metric label value).
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_HEALTH_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Rank of a taint's reason (lower is stronger) and the reason, for an unhealthy taint.
fn taint_reason(t: &DeviceTaint) -> Option<(u8, String)> {
    if !matches!(
        t.effect,
        DeviceTaintEffect::NoSchedule | DeviceTaintEffect::NoExecute
    ) {
        return None;
    }
    Some(match t.key.as_str() {
        GPU_LOST_TAINT => (0, "gpu-lost".to_string()),
        XID_TAINT => (1, bounded(&format!("xid:{}", t.value))),
        UNMONITORED_TAINT => (2, "unmonitored".to_string()),
        key => (3, bounded(&format!("taint:{key}"))),
    })
}

/// The strongest unhealthy taint of a device, as the pod's health.
fn tainted(taints: &[DeviceTaint], device: &str) -> Option<(u8, GpuHealth)> {
    taints
        .iter()
        .filter_map(|t| taint_reason(t).map(|(rank, reason)| (rank, reason, t.time_added)))
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)))
        .map(|(rank, reason, since)| {
            (
                rank,
                GpuHealth {
                    reason,
                    device: Some(device.to_string()),
                    since,
                },
            )
        })
}

/// The kubelet's verdict.
fn kubelet(r: &UnhealthyResource) -> GpuHealth {
    let message = if r.message.is_empty() {
        "unhealthy"
    } else {
        r.message.as_str()
    };
    GpuHealth {
        reason: bounded(&format!("kubelet:{message}")),
        device: Some(r.resource_id.clone()),
        since: None,
    }
}

/// DCGM's verdict on one GPU: a failing watch (alphabetically first), else the lowest fatal XID.
fn dcgm(h: &DcgmHealth) -> Option<GpuHealth> {
    let watch = h
        .watches
        .iter()
        .filter(|(_, v)| *v >= DCGM_HEALTH_FAIL)
        .map(|(w, _)| w.as_str())
        .min();
    let reason = match watch {
        Some(w) => format!("dcgm:{w}"),
        None => format!(
            "xid:{}",
            h.xids.iter().copied().filter(|x| fatal_xid(*x)).min()?
        ),
    };
    Some(GpuHealth {
        reason: bounded(&reason),
        device: Some(h.uuid.clone()),
        since: None,
    })
}

/// Device (driver, pool, name) of a slice.
type DeviceId<'a> = (&'a str, &'a str, &'a str);

/// What the rule reads, indexed once per build.
pub struct HealthIndex<'a> {
    /// The current generation of each DRA device.
    devices: foldhash::HashMap<DeviceId<'a>, &'a DraDevice>,
    /// Taints by the device's UUID (a card the device plugin hands out, published by DRA too).
    taints_by_uuid: foldhash::HashMap<&'a str, &'a [DeviceTaint]>,
    /// ResourceClaims by (namespace, name).
    resource_claims: foldhash::HashMap<(&'a str, &'a str), &'a ResourceClaimInfo>,
    /// DCGM's health per GPU UUID.
    dcgm: foldhash::HashMap<&'a str, &'a DcgmHealth>,
    /// UUIDs of the cards HAMi's register marks unhealthy.
    hami_unhealthy: foldhash::HashSet<&'a str>,
}

impl<'a> HealthIndex<'a> {
    /// The index, or `None` when no input says anything is sick (most builds: no taint, no
    /// kubelet verdict, no DCGM reading, no HAMi flag), so a healthy cluster's build indexes
    /// nothing.
    pub fn new(claims: &'a Claims, usage: &'a Usage) -> Option<Self> {
        let any_sign = !usage.gpu_health.is_empty()
            || claims.dra_devices.iter().any(|d| !d.taints.is_empty())
            || claims
                .nodes
                .iter()
                .any(|n| n.hami.devices.iter().any(|d| !d.healthy))
            || claims.pods.iter().any(|p| !p.unhealthy_devices.is_empty());
        if !any_sign {
            return None;
        }
        let mut devices: foldhash::HashMap<DeviceId<'a>, &'a DraDevice> =
            foldhash::HashMap::default();
        for d in &claims.dra_devices {
            let key = (d.driver.as_str(), d.pool.as_str(), d.name.as_str());
            if devices
                .get(&key)
                .is_none_or(|held| held.pool_generation < d.pool_generation)
            {
                devices.insert(key, d);
            }
        }
        let taints_by_uuid = devices
            .values()
            .filter(|d| !d.taints.is_empty())
            .filter_map(|d| d.uuid.as_deref().map(|u| (u, d.taints.as_slice())))
            .collect();
        let resource_claims = claims
            .resource_claims
            .iter()
            .map(|rc| ((rc.namespace.as_str(), rc.name.as_str()), rc))
            .collect();
        let dcgm = usage
            .gpu_health
            .iter()
            .map(|h| (h.uuid.as_str(), h))
            .collect();
        let hami_unhealthy = claims
            .nodes
            .iter()
            .flat_map(|n| &n.hami.devices)
            .filter(|d| !d.healthy)
            .map(|d| d.uuid.as_str())
            .collect();
        Some(HealthIndex {
            devices,
            taints_by_uuid,
            resource_claims,
            dcgm,
            hami_unhealthy,
        })
    }

    /// The health of the cards pod `p` holds (`devices`: the DCGM devices attributed to it), or
    /// `None` when none is known sick.
    pub fn of_pod(&self, p: &PodClaim, devices: &[DeviceKey]) -> Option<GpuHealth> {
        let mut best: Option<(u8, GpuHealth)> = None;
        let mut consider = |rank: u8, h: GpuHealth| {
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                best = Some((rank, h));
            }
        };
        let mut uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
        for held in self.dra_devices_of(p) {
            if let Some(d) = held.device {
                let name = d
                    .uuid
                    .clone()
                    .unwrap_or_else(|| format!("{}/{}/{}", d.driver, d.pool, d.name));
                if let Some((rank, h)) = tainted(&d.taints, &name) {
                    consider(rank, h);
                }
            }
            uuids.extend(held.uuids.into_iter().flatten());
        }
        uuids.sort_unstable();
        uuids.dedup();
        for u in &uuids {
            if let Some((rank, h)) = self.taints_by_uuid.get(u).and_then(|t| tainted(t, u)) {
                consider(rank, h);
            }
        }
        if let Some(r) = p.unhealthy_devices.first() {
            consider(10, kubelet(r));
        }
        if let Some(a) = p
            .hami
            .allocs
            .iter()
            .find(|a| self.hami_unhealthy.contains(a.uuid.as_str()))
        {
            consider(
                15,
                GpuHealth {
                    reason: "hami-unhealthy".into(),
                    device: Some(a.uuid.clone()),
                    since: None,
                },
            );
        }
        if let Some(h) = uuids
            .iter()
            .filter_map(|u| self.dcgm.get(u))
            .filter_map(|h| dcgm(h))
            .min_by(|a, b| a.reason.cmp(&b.reason))
        {
            consider(20, h);
        }
        best.map(|(_, h)| h)
    }

    /// DRA devices pod `p` holds: the allocation results of its claims reserved for it, with
    /// the device's UUID and a MIG device's parent's, where the slice or the driver says.
    fn dra_devices_of(&self, p: &PodClaim) -> Vec<HeldDevice<'a>> {
        let mut out = Vec::new();
        for name in &p.resource_claims {
            let Some(rc) = self
                .resource_claims
                .get(&(p.namespace.as_str(), name.as_str()))
                .filter(|rc| rc.reserved_for.contains(&p.uid))
            else {
                continue;
            };
            for a in rc.allocated.iter().flatten() {
                let device = self
                    .devices
                    .get(&(a.driver.as_str(), a.pool.as_str(), a.device.as_str()))
                    .copied();
                let status = rc
                    .device_status
                    .iter()
                    .find(|s| s.driver == a.driver && s.pool == a.pool && s.device == a.device);
                let uuid = device
                    .and_then(|d| d.uuid.as_deref())
                    .or_else(|| status.and_then(|s| s.uuid.as_deref()));
                let parent = device
                    .and_then(|d| d.parent_uuid.as_deref())
                    .or_else(|| status.and_then(|s| s.parent_uuid.as_deref()));
                out.push(HeldDevice {
                    device,
                    uuids: [uuid, parent],
                });
            }
        }
        out
    }
}

/// One DRA device a pod holds: its slice entry (when published) and its UUID and parent UUID.
struct HeldDevice<'a> {
    device: Option<&'a DraDevice>,
    uuids: [Option<&'a str>; 2],
}

#[cfg(test)]
mod tests;
