//! Dynamic Resource Allocation sources: ResourceClaims, ResourceSlices and DeviceClasses of
//! `resource.k8s.io/v1`, projected into the ledger's DRA inputs (live watches, one-shot lists
//! and `kubectl get … -o json` dumps share the projections).
//!
//! Only what GPU accounting needs is kept: of slices, the devices of the counted drivers
//! (`--dra-gpu-drivers`) with the attributes NVIDIA's driver publishes; of claims, requests,
//! allocation results of counted drivers, `reservedFor` pod uids and the driver's
//! `status.devices[].data`; of classes, the drivers and device type their CEL selectors compare.
//! When the API group is not served (or not readable) every DRA watch is skipped, with a log
//! line and `gpu_ledger_dra_enabled 0`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, ResourceClaim, ResourceSlice};
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

/// An info line on the first look for the API, debug on the background re-looks (which would
/// otherwise repeat it every few minutes).
macro_rules! not_served {
    ($first_look:expr, $($arg:tt)+) => {
        if $first_look { info!($($arg)+) } else { debug!($($arg)+) }
    };
}

use crate::k8s;
use crate::ledger::claims::{
    DeviceClassInfo, DraAllocation, DraDevice, DraDeviceKind, DraDeviceStatus, DraRequest,
    ResourceClaimInfo,
};
use crate::ledger::units::ResourceNames;

/// The API group and version read.
pub const GROUP: &str = "resource.k8s.io";
pub const VERSION: &str = "v1";
/// Timeout of discovery and of each access probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
/// Most devices kept per slice (the API allows 128 per slice; more is not a real slice).
const MAX_SLICE_DEVICES: usize = 1024;
/// Most requests and results kept per claim (the API allows 32 requests).
const MAX_CLAIM_ENTRIES: usize = 256;
/// Most reservations kept per claim (the API allows 256).
const MAX_RESERVED: usize = 1024;
/// Longest attribute value kept (UUIDs, profiles and product names are far shorter).
const MAX_ATTRIBUTE: usize = 256;

// ---------------------------------------------------------------------------------------------
// Projections (pure).

/// String literals a CEL expression compares `field` with (`<…>.field == 'x'` or `"x"`), e.g.
/// `.driver` in `device.driver == 'gpu.nvidia.com'`, `.type` and `.profile` in
/// `device.attributes['gpu.nvidia.com'].type == 'mig'`. Not a CEL parser: enough to read the
/// selectors NVIDIA's DeviceClasses and the driver's documented claims use.
pub fn cel_equals<'e>(expr: &'e str, field: &str) -> Vec<&'e str> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find(field) {
        let after = &rest[at + field.len()..];
        let before_ok = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c == ']' || c.is_ascii_alphanumeric() || c == '_');
        let after_ok = !after
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        rest = after;
        if !(before_ok && after_ok) {
            continue;
        }
        let Some(value) = after.trim_start().strip_prefix("==") else {
            continue;
        };
        let value = value.trim_start();
        let Some(quote) = value.chars().next().filter(|c| *c == '\'' || *c == '"') else {
            continue;
        };
        let body = &value[1..];
        if let Some(end) = body.find(quote) {
            out.push(&body[..end]);
        }
    }
    out
}

fn expressions(selectors: Option<&Vec<DeviceSelector>>) -> impl Iterator<Item = &str> {
    selectors
        .into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
}

fn bounded(s: &str) -> Option<String> {
    (!s.is_empty() && s.len() <= MAX_ATTRIBUTE).then(|| s.to_string())
}

/// Drivers, MIG type and MIG profile that CEL selectors name.
fn selector_facts<'e>(exprs: impl Iterator<Item = &'e str>) -> (Vec<String>, bool, Option<String>) {
    let mut drivers: Vec<String> = Vec::new();
    let mut mig = false;
    let mut profile = None;
    for e in exprs {
        drivers.extend(cel_equals(e, ".driver").into_iter().filter_map(bounded));
        mig |= cel_equals(e, ".type").contains(&"mig");
        if profile.is_none() {
            profile = cel_equals(e, ".profile").into_iter().find_map(bounded);
        }
    }
    drivers.sort();
    drivers.dedup();
    (drivers, mig, profile)
}

/// A DeviceClass: the drivers and device type its selectors compare, the extended resource it
/// serves (KEP-5004) and when it was made (the newer of two classes naming one resource wins).
pub fn device_class(dc: &DeviceClass) -> DeviceClassInfo {
    let (drivers, mig, _) = selector_facts(expressions(dc.spec.selectors.as_ref()));
    DeviceClassInfo {
        name: dc.name_any(),
        drivers,
        mig,
        extended_resource_name: dc.spec.extended_resource_name.as_deref().and_then(bounded),
        created_at: dc
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| k8s::to_chrono(t.0)),
    }
}

/// Devices of the counted drivers a ResourceSlice publishes; `None` for other drivers.
pub fn slice_devices(names: &ResourceNames, slice: &ResourceSlice) -> Option<Vec<DraDevice>> {
    let spec = &slice.spec;
    if !names.is_gpu_driver(&spec.driver) {
        return None;
    }
    let prefix = format!("{}/", spec.driver);
    let devices = spec
        .devices
        .iter()
        .flatten()
        .take(MAX_SLICE_DEVICES)
        .map(|d| {
            // Attribute names are unqualified (the driver's own domain) or `<driver>/<name>`.
            let attr = |name: &str| {
                let attrs = d.attributes.as_ref()?;
                attrs
                    .get(name)
                    .or_else(|| attrs.get(&format!("{prefix}{name}")))
                    .and_then(|a| a.string.as_deref())
                    .and_then(bounded)
            };
            let kind = match attr("type").as_deref() {
                Some("mig") => DraDeviceKind::Mig,
                _ => DraDeviceKind::Gpu,
            };
            DraDevice {
                driver: spec.driver.clone(),
                pool: spec.pool.name.clone(),
                name: d.name.clone(),
                node: d
                    .node_name
                    .clone()
                    .or_else(|| spec.node_name.clone())
                    .filter(|n| !n.is_empty()),
                kind,
                uuid: attr("uuid"),
                parent_uuid: attr("parentUUID"),
                profile: attr("profile"),
                product: attr("productName"),
                pool_generation: spec.pool.generation,
                taints: super::health::device_taints(d),
            }
        })
        .collect();
    Some(devices)
}

/// The identity a driver recorded for an allocated device (`status.devices[].data`).
fn device_status(
    names: &ResourceNames,
    s: &k8s_openapi::api::resource::v1::AllocatedDeviceStatus,
) -> Option<DraDeviceStatus> {
    if !names.is_gpu_driver(&s.driver) {
        return None;
    }
    let data = s.data.as_ref().map(|d| &d.0);
    let field = |k: &str| {
        data.and_then(|d| d.get(k))
            .and_then(|v| v.as_str())
            .and_then(bounded)
    };
    let kind = match field("type").as_deref() {
        Some("mig") => Some(DraDeviceKind::Mig),
        Some(_) => Some(DraDeviceKind::Gpu),
        None => None,
    };
    Some(DraDeviceStatus {
        driver: s.driver.clone(),
        pool: s.pool.clone(),
        device: s.device.clone(),
        kind,
        uuid: field("uuid"),
        parent_uuid: field("parentUUID"),
        profile: field("migProfile"),
        product: field("productName"),
    })
}

/// A ResourceClaim, or `None` when it is allocated with no device of a counted driver (it can
/// never hold a GPU). An unallocated claim is kept: its device class decides.
pub fn resource_claim(names: &ResourceNames, rc: &ResourceClaim) -> Option<ResourceClaimInfo> {
    let status = rc.status.as_ref();
    let allocated = status.and_then(|s| s.allocation.as_ref()).map(|a| {
        a.devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .filter(|r| names.is_gpu_driver(&r.driver) && r.admin_access != Some(true))
            .take(MAX_CLAIM_ENTRIES)
            .map(|r| DraAllocation {
                request: r.request.clone(),
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            })
            .collect::<Vec<_>>()
    });
    if allocated.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let requests = rc
        .spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
        .take(MAX_CLAIM_ENTRIES)
        .filter_map(|r| {
            let (class, mode, count, selectors) = match (&r.exactly, &r.first_available) {
                (Some(e), _) => (
                    &e.device_class_name,
                    e.allocation_mode.as_deref(),
                    e.count,
                    e.selectors.as_ref(),
                ),
                // firstAvailable: the first subrequest is the preferred one.
                (None, Some(subs)) => {
                    let s = subs.first()?;
                    (
                        &s.device_class_name,
                        s.allocation_mode.as_deref(),
                        s.count,
                        s.selectors.as_ref(),
                    )
                }
                (None, None) => return None,
            };
            // Admin access observes devices others hold: it asks for none.
            if r.exactly.as_ref().and_then(|e| e.admin_access) == Some(true) {
                return None;
            }
            let count = match mode {
                Some("All") => 1,
                _ => count.and_then(|c| u64::try_from(c).ok()).unwrap_or(1),
            };
            let (drivers, mig, profile) = selector_facts(expressions(selectors));
            Some(DraRequest {
                name: r.name.clone(),
                device_class: class.clone(),
                count,
                drivers,
                profile,
                mig,
            })
        })
        .collect();
    let reserved_for = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .take(MAX_RESERVED)
        .map(|r| r.uid.clone())
        .collect();
    let device_status = status
        .and_then(|s| s.devices.as_ref())
        .into_iter()
        .flatten()
        .take(MAX_CLAIM_ENTRIES)
        .filter_map(|s| device_status(names, s))
        .collect();
    Some(ResourceClaimInfo {
        namespace: rc.namespace().unwrap_or_default(),
        name: rc.name_any(),
        uid: rc.uid().unwrap_or_default(),
        requests,
        allocated,
        reserved_for,
        device_status,
    })
}

// ---------------------------------------------------------------------------------------------
// Live sources.

/// Whether `resource.k8s.io/v1` serves `kinds` (the kinds table's DRA kinds: `(kind, plural,
/// namespaced)`; claims, slices and classes) and they are readable by us (probed in `scopes`
/// for the namespaced ones); `false` (with the reason logged, at debug level unless
/// `first_look`) when not: DRA accounting is then off.
pub async fn available(
    client: &Client,
    scopes: &[Option<String>],
    kinds: &[(&'static str, &'static str, bool)],
    first_look: bool,
) -> bool {
    let group = tokio::time::timeout(PROBE_TIMEOUT, kube::discovery::group(client, GROUP)).await;
    let group = match group {
        Ok(Ok(g)) => g,
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
            not_served!(first_look, "{GROUP} not served: DRA accounting is off");
            return false;
        }
        Ok(Err(kube::Error::Discovery(e))) => {
            not_served!(
                first_look,
                error = &e as &dyn std::error::Error,
                "{GROUP} not served: DRA accounting is off"
            );
            return false;
        }
        Ok(Err(e)) => {
            warn!(
                error = &e as &dyn std::error::Error,
                "discovering {GROUP} failed: DRA accounting is off"
            );
            return false;
        }
        Err(_) => {
            warn!("discovering {GROUP} timed out: DRA accounting is off");
            return false;
        }
    };
    let served = group.versioned_resources(VERSION);
    let missing: Vec<&str> = kinds
        .iter()
        .map(|(kind, _, _)| *kind)
        .filter(|k| !served.iter().any(|(ar, _)| ar.kind == *k))
        .collect();
    if !missing.is_empty() {
        not_served!(
            first_look,
            ?missing,
            "{GROUP}/{VERSION} not served (or incomplete): DRA accounting is off"
        );
        return false;
    }
    // A watch we may not list would restart forever and keep the service unready: probe first.
    let lp = ListParams::default().limit(1);
    let mut probes: Vec<(&str, Result<(), kube::Error>)> = Vec::new();
    for &(kind, plural, namespaced) in kinds {
        let ar = ApiResource {
            group: GROUP.into(),
            version: VERSION.into(),
            api_version: format!("{GROUP}/{VERSION}"),
            kind: kind.into(),
            plural: plural.into(),
        };
        if namespaced {
            for ns in scopes {
                let api = k8s::scoped_dynamic(client, ns.as_deref(), &ar);
                probes.push((plural, probe(&api, &lp).await));
            }
        } else {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            probes.push((plural, probe(&api, &lp).await));
        }
    }
    for (resource, result) in probes {
        if let Err(e) = result {
            warn!(
                resource,
                error = &e as &dyn std::error::Error,
                "cannot list {resource}.{GROUP} (RBAC?): DRA accounting is off"
            );
            return false;
        }
    }
    true
}

async fn probe<K>(api: &Api<K>, lp: &ListParams) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(lp)).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(kube::Error::Service(
            format!("listing timed out after {PROBE_TIMEOUT:?}").into(),
        )),
    }
}

/// Registers `gpu_ledger_dra_enabled` (1 when the DRA watches run) on `registry`.
pub fn register_enabled(
    registry: &prometheus::Registry,
    enabled: &AtomicBool,
) -> Result<(), prometheus::Error> {
    let g = prometheus::IntGauge::new(
        "gpu_ledger_dra_enabled",
        "1 when resource.k8s.io/v1 is served and readable and its ResourceClaims, ResourceSlices and DeviceClasses are watched; 0 when DRA accounting is off.",
    )?;
    g.set(i64::from(enabled.load(Ordering::Relaxed)));
    registry.register(Box::new(g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cel_comparisons_of_nvidia_classes_and_claims() {
        // NVIDIA's `gpu.nvidia.com` DeviceClass (chart template deviceclass-gpu.yaml).
        let e = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
        assert_eq!(cel_equals(e, ".driver"), vec!["gpu.nvidia.com"]);
        assert_eq!(cel_equals(e, ".type"), vec!["gpu"]);
        let e = "device.attributes[\"gpu.nvidia.com\"].profile == \"1g.5gb\"";
        assert_eq!(cel_equals(e, ".profile"), vec!["1g.5gb"]);
        // Not a comparison, another attribute, or a longer name: nothing.
        assert!(cel_equals("device.attributes['x'].typeName == 'mig'", ".type").is_empty());
        assert!(cel_equals("device.driver != 'a'", ".driver").is_empty());
        assert!(cel_equals(".driver == 'a'", ".driver").is_empty());
        assert!(cel_equals("device.driver == 'unterminated", ".driver").is_empty());
    }

    #[test]
    fn slices_keep_gpu_devices_with_the_driver_attributes() {
        // Shaped like the slices of kubernetes-sigs/dra-driver-nvidia-gpu#719 (AKS A100 nodes).
        let s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "n1-gpu.nvidia.com-22vnt"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-1", "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": "GPU-13719f71-412c-d11e-b236-a262f530a4fc"},
                        "productName": {"string": "NVIDIA A100 80GB PCIe"}}},
                    {"name": "gpu-0-mig-1g10gb-19-0", "attributes": {
                        "type": {"string": "mig"},
                        "uuid": {"string": "MIG-0d4e1a52-0000-5000-8000-000000000001"},
                        "parentUUID": {"string": "GPU-ddf64803-f421-0e5b-883e-cd752de16db7"},
                        "profile": {"string": "1g.10gb"},
                        "productName": {"string": "NVIDIA A100 80GB PCIe"}}}
                ]}
        }))
        .expect("slice");
        let d = slice_devices(&ResourceNames::default(), &s).expect("gpu driver");
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].kind, DraDeviceKind::Gpu);
        assert_eq!(d[0].node.as_deref(), Some("n1"));
        assert_eq!(d[1].kind, DraDeviceKind::Mig);
        assert_eq!(d[1].profile.as_deref(), Some("1g.10gb"));
        assert_eq!(
            d[1].parent_uuid.as_deref(),
            Some("GPU-ddf64803-f421-0e5b-883e-cd752de16db7")
        );
        let mut other = s.clone();
        other.spec.driver = "dra.net".into();
        assert!(slice_devices(&ResourceNames::default(), &other).is_none());
    }

    #[test]
    fn claims_keep_gpu_results_reservations_and_driver_status() {
        let rc: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2,
                    "selectors": [{"cel": {"expression":
                        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]}}]}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "m0"},
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "m1",
                        "adminAccess": true},
                    {"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth1"}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"},
                    {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g", "uid": "gu"}],
                "devices": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "m0",
                    "data": {"type": "mig", "uuid": "MIG-1", "parentUUID": "GPU-1",
                        "migProfile": "3g.40gb", "productName": "NVIDIA A100-SXM4-80GB"}}]
            }
        }))
        .expect("claim");
        let c = resource_claim(&ResourceNames::default(), &rc).expect("gpu claim");
        let alloc = c.allocated.as_ref().expect("allocated");
        assert_eq!(
            alloc.len(),
            1,
            "admin access and other drivers are left out"
        );
        assert_eq!(c.reserved_for, vec!["pu".to_string()]);
        assert_eq!(c.requests[0].count, 2);
        assert_eq!(c.requests[0].profile.as_deref(), Some("3g.40gb"));
        assert_eq!(c.device_status[0].kind, Some(DraDeviceKind::Mig));
        assert_eq!(c.device_status[0].uuid.as_deref(), Some("MIG-1"));
        // Allocated with nothing of a counted driver: never a GPU claim.
        let mut nic = rc.clone();
        if let Some(s) = nic.status.as_mut()
            && let Some(a) = s.allocation.as_mut()
            && let Some(d) = a.devices.as_mut()
        {
            d.results = Some(vec![
                serde_json::from_value(json!(
                {"request": "nic", "driver": "dra.net", "pool": "n1", "device": "eth1"}))
                .expect("result"),
            ]);
        }
        assert!(resource_claim(&ResourceNames::default(), &nic).is_none());
    }

    #[test]
    fn device_classes_name_their_drivers() {
        let dc: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": "mig.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}
        }))
        .expect("class");
        let c = device_class(&dc);
        assert_eq!(c.drivers, vec!["gpu.nvidia.com".to_string()]);
        assert!(c.mig);
        assert_eq!(c.extended_resource_name, None);
    }

    #[test]
    fn device_classes_keep_their_extended_resource_name_and_age() {
        // As kube-apiserver 1.36.3 returned it in tests/e2e_dra.rs (tests/fixtures/dra).
        let dc: DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": "gpu.nvidia.com", "creationTimestamp": "2026-12-01T10:30:09Z"},
            "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression":
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
        }))
        .expect("class");
        let c = device_class(&dc);
        assert_eq!(c.extended_resource_name.as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(
            c.created_at.map(|t| t.to_rfc3339()).as_deref(),
            Some("2026-12-01T10:30:09+00:00")
        );
    }
}
