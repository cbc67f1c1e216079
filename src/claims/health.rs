//! Device health as the Kubernetes API reports it, projected for the ledger's sick-card rule:
//! DRA device taints (`ResourceSlice.spec.devices[].taints`, written by NVIDIA's DRA driver on a
//! fatal XID, a lost GPU or a device NVML cannot monitor) and the kubelet's per-container device
//! health (`status.containerStatuses[].allocatedResourcesStatus`, KEP-4680, on by default in
//! Kubernetes 1.36).
//!
//! Both are untrusted API values: counts and text are bounded, unknown effects and health values
//! are kept as unknown (never read as sick).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::api::resource::v1::Device;

use crate::k8s::to_chrono;
use crate::ledger::claims::{
    DeviceTaint, DeviceTaintEffect, MAX_HEALTH_TEXT, MAX_UNHEALTHY_KEPT, UnhealthyResource,
};

/// `text` cut to [`MAX_HEALTH_TEXT`] bytes at a character boundary.
fn bounded_text(text: &str) -> String {
    if text.len() <= MAX_HEALTH_TEXT {
        return text.to_string();
    }
    let mut end = MAX_HEALTH_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The taints of one slice device (bounded).
pub fn device_taints(device: &Device) -> Vec<DeviceTaint> {
    device
        .taints
        .iter()
        .flatten()
        .take(MAX_UNHEALTHY_KEPT)
        .map(|t| DeviceTaint {
            key: bounded_text(&t.key),
            value: t.value.as_deref().map(bounded_text).unwrap_or_default(),
            effect: DeviceTaintEffect::parse(&t.effect),
            time_added: t.time_added.as_ref().map(|t| to_chrono(t.0)),
        })
        .collect()
}

/// The resources the kubelet reports `Unhealthy` in any container of `pod` (init, app and
/// ephemeral), bounded. `Healthy`, `Unknown` and any other value are left out: the kubelet lets
/// health expire to `Unknown` when a driver stops answering, which says nothing about the card.
pub fn unhealthy_resources(pod: &Pod) -> Vec<UnhealthyResource> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let containers: [&[ContainerStatus]; 3] = [
        status
            .init_container_statuses
            .as_deref()
            .unwrap_or_default(),
        status.container_statuses.as_deref().unwrap_or_default(),
        status
            .ephemeral_container_statuses
            .as_deref()
            .unwrap_or_default(),
    ];
    let mut out: Vec<UnhealthyResource> = Vec::new();
    for c in containers.into_iter().flatten() {
        for r in c.allocated_resources_status.iter().flatten() {
            for h in r.resources.iter().flatten() {
                if h.health.as_deref() != Some("Unhealthy") {
                    continue;
                }
                let entry = UnhealthyResource {
                    name: bounded_text(&r.name),
                    resource_id: bounded_text(&h.resource_id),
                    message: h.message.as_deref().map(bounded_text).unwrap_or_default(),
                };
                // Containers sharing one claim repeat its device: report it once.
                if !out.contains(&entry) {
                    if out.len() == MAX_UNHEALTHY_KEPT {
                        return out;
                    }
                    out.push(entry);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::ResourceSlice;

    use super::*;

    fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
        let path = format!(
            "{}/tests/fixtures/health/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn slice_taints_keep_key_value_effect_and_time() {
        let slice: ResourceSlice = fixture("slice-taints.json");
        let devices = slice.spec.devices.expect("devices");
        let xid = device_taints(&devices[0]);
        assert_eq!(xid.len(), 1);
        assert_eq!(xid[0].key, "gpu.nvidia.com/xid");
        assert_eq!(xid[0].value, "79");
        assert_eq!(xid[0].effect, DeviceTaintEffect::NoSchedule);
        assert_eq!(
            xid[0].time_added.map(|t| t.to_rfc3339()).as_deref(),
            Some("2026-07-22T02:24:46+00:00")
        );
        assert_eq!(
            device_taints(&devices[1])[0].effect,
            DeviceTaintEffect::None
        );
        let lost = device_taints(&devices[2]);
        assert_eq!(
            (lost[0].key.as_str(), lost[0].value.as_str()),
            ("gpu.nvidia.com/gpu-lost", "")
        );
        assert!(device_taints(&devices[3]).is_empty());
    }

    #[test]
    fn taints_are_bounded_and_unknown_effects_stay_unknown() {
        let mut slice: ResourceSlice = fixture("slice-taints.json");
        let devices = slice.spec.devices.as_mut().expect("devices");
        let taint = devices[0].taints.as_ref().expect("taints")[0].clone();
        devices[0].taints = Some(
            (0..100)
                .map(|i| {
                    let mut t = taint.clone();
                    t.effect = if i == 0 { "Evict".into() } else { t.effect };
                    t.value = Some("9".repeat(5000));
                    t
                })
                .collect(),
        );
        let kept = device_taints(&devices[0]);
        assert_eq!(kept.len(), MAX_UNHEALTHY_KEPT);
        assert_eq!(kept[0].effect, DeviceTaintEffect::Unknown);
        assert!(kept[1].value.len() <= MAX_HEALTH_TEXT + '…'.len_utf8());
    }

    #[test]
    fn only_unhealthy_resources_are_kept_as_the_kubelet_writes_them() {
        let pod: Pod = fixture("pod-allocated-status.json");
        assert_eq!(
            unhealthy_resources(&pod),
            vec![UnhealthyResource {
                name: "claim:gpu".into(),
                resource_id: "k8s.gpu.nvidia.com/claim=a85e5873-fc49-4554-a151-de159f528a04-gpu-0"
                    .into(),
                message: "critical XID 79 reported by NVML".into(),
            }]
        );
        // `Unknown` (the device plugin's card, or a driver that stopped answering) is not sick.
        let unknown: Pod = fixture("pod-device-plugin-status.json");
        assert!(unhealthy_resources(&unknown).is_empty());
    }

    #[test]
    fn repeated_devices_are_reported_once_and_the_list_is_bounded() {
        let mut pod: Pod = fixture("pod-allocated-status.json");
        let status = pod.status.as_mut().expect("status");
        let c = status.container_statuses.as_mut().expect("containers")[0].clone();
        status.container_statuses = Some(vec![c.clone(), c.clone()]);
        assert_eq!(
            unhealthy_resources(&pod).len(),
            1,
            "one device, two containers"
        );
        let mut many = c;
        let entry = many.allocated_resources_status.as_ref().expect("status")[0].clone();
        let health = entry.resources.as_ref().expect("resources")[0].clone();
        many.allocated_resources_status = Some(vec![k8s_openapi::api::core::v1::ResourceStatus {
            resources: Some(
                (0..1000)
                    .map(|i| {
                        let mut h = health.clone();
                        h.resource_id = format!("gpu-{i}");
                        h
                    })
                    .collect(),
            ),
            ..entry
        }]);
        status_of(&mut pod).container_statuses = Some(vec![many]);
        assert_eq!(unhealthy_resources(&pod).len(), MAX_UNHEALTHY_KEPT);
    }

    fn status_of(pod: &mut Pod) -> &mut k8s_openapi::api::core::v1::PodStatus {
        pod.status.as_mut().expect("status")
    }
}
