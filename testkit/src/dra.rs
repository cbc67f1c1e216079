//! Dynamic Resource Allocation helpers: the DeviceClasses and ResourceSlices NVIDIA's DRA driver
//! for GPUs publishes, and pods that get their GPU through a ResourceClaim.
//!
//! **Stands in for the driver's publishing only.** No DRA driver runs (kwok nodes have no
//! kubelet to prepare devices); the real kube-scheduler allocates claims from these slices and
//! the real resourceclaim controller makes claims from templates. What is published follows the
//! driver's public source and manifests:
//! - DeviceClasses `gpu.nvidia.com` (CEL `device.driver == 'gpu.nvidia.com' &&
//!   device.attributes['gpu.nvidia.com'].type == 'gpu'`, `extendedResourceName: nvidia.com/gpu`
//!   on `resource.k8s.io/v1`) and `mig.nvidia.com` (`… .type == 'mig'`): the chart templates of
//!   NVIDIA/k8s-dra-driver-gpu (`deployments/helm/nvidia-dra-driver-gpu/templates/deviceclass-*.yaml`).
//! - One ResourceSlice per node, driver `gpu.nvidia.com`, pool named after the node
//!   (generation 1, one slice), `nodeName` set, owned by the Node, `generateName`
//!   `<node>-gpu.nvidia.com-` (the slices shown in kubernetes-sigs/dra-driver-nvidia-gpu#719).
//! - Devices named `gpu-<minor>` and `gpu-<parent minor>-mig-<profile without dot>-<GI profile
//!   id>-<placement start>` with the attributes of `cmd/gpu-kubelet-plugin/deviceinfo.go`
//!   (`GpuInfo.Attributes`, `CommonAttributesMig`): `type`, `uuid`, `productName`, `brand`,
//!   `architecture`, `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, and for
//!   MIG `parentUUID`, `profile`; capacity `memory` (bytes) and for MIG `multiprocessors`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

// The driver name lives with the exporter double, which reads the driver's ResourceSlices, so
// that dcgm.rs need not name this file (no two files import each other).
pub use crate::dcgm::DRIVER;
use crate::dcgm::{HIDDEN_ANNOTATION, UTILIZATION_ANNOTATION, device_uuid};
/// DeviceClass of whole GPUs.
pub const GPU_CLASS: &str = "gpu.nvidia.com";
/// DeviceClass of MIG devices.
pub const MIG_CLASS: &str = "mig.nvidia.com";

/// The two DeviceClasses the driver's chart installs.
pub fn nvidia_device_classes() -> Vec<DeviceClass> {
    let class = |name: &str, ty: &str, extended: Option<&str>| -> DeviceClass {
        let mut spec = json!({"selectors": [{"cel": {"expression": format!(
            "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{ty}'"
        )}}]});
        if let Some(e) = extended {
            spec["extendedResourceName"] = json!(e);
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
            .expect("static DeviceClass JSON")
    };
    vec![
        class(GPU_CLASS, "gpu", Some("nvidia.com/gpu")),
        class(MIG_CLASS, "mig", None),
    ]
}

/// Creates [`nvidia_device_classes`] (existing ones are left alone).
pub async fn install_device_classes(admin: &kube::Client) -> Result<()> {
    let api: Api<DeviceClass> = Api::all(admin.clone());
    for c in nvidia_device_classes() {
        match api.create(&PostParams::default(), &c).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("creating DeviceClass"),
        }
    }
    Ok(())
}

/// Stable fake MIG device UUID for the MIG device at `placement` of GPU `parent` on `node`.
pub fn mig_uuid(node: &str, parent: u32, placement: u32) -> String {
    let base = device_uuid(node, parent);
    let tail = base.trim_start_matches("GPU-");
    format!("MIG-{}{placement:02x}", &tail[..tail.len() - 2])
}

/// One MIG device of a slice.
#[derive(Debug, Clone)]
struct MigDevice {
    parent: u32,
    profile: String,
    profile_id: u32,
    placement: u32,
    multiprocessors: u32,
    memory: String,
}

/// The ResourceSlice NVIDIA's driver publishes for one node: whole GPUs (`gpu-<minor>`, UUID
/// [`device_uuid`]`(node, minor)`, the same the fake DCGM exporter uses) and MIG devices.
#[derive(Debug, Clone)]
pub struct NvidiaSlice {
    node: String,
    product: String,
    memory: String,
    gpus: Vec<u32>,
    migs: Vec<MigDevice>,
}

impl NvidiaSlice {
    /// A slice for `node` with no devices; product `NVIDIA A100-SXM4-80GB` (NVML's name).
    pub fn new(node: &str) -> Self {
        Self {
            node: node.to_string(),
            product: "NVIDIA A100-SXM4-80GB".to_string(),
            memory: "80Gi".to_string(),
            gpus: Vec::new(),
            migs: Vec::new(),
        }
    }

    /// NVML product name (`productName`), e.g. `NVIDIA A30`.
    #[must_use]
    pub fn product(mut self, product: &str) -> Self {
        self.product = product.to_string();
        self
    }

    /// Whole GPUs with these minor numbers.
    #[must_use]
    pub fn gpus(mut self, minors: impl IntoIterator<Item = u32>) -> Self {
        self.gpus.extend(minors);
        self
    }

    /// A MIG device of GPU `parent`: `profile` (`3g.40gb`) with its GI profile id and placement
    /// start (A100-80GB: 1g.10gb id 19, 2g.20gb 14, 3g.40gb 9, 4g.40gb 5, 7g.80gb 0).
    #[must_use]
    pub fn mig(mut self, parent: u32, profile: &str, profile_id: u32, placement: u32) -> Self {
        let g: u32 = profile
            .split('g')
            .next()
            .and_then(|g| g.parse().ok())
            .unwrap_or(1);
        let mem = profile
            .split('.')
            .nth(1)
            .and_then(|m| m.trim_end_matches("gb").parse::<u32>().ok())
            .unwrap_or(10);
        self.migs.push(MigDevice {
            parent,
            profile: profile.to_string(),
            profile_id,
            placement,
            // A100: 14 SMs per compute slice (98 on 7g).
            multiprocessors: 14 * g,
            memory: format!("{mem}Gi"),
        });
        self
    }

    /// Node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Device name of the MIG device at `placement` of GPU `parent`, if the slice has it.
    pub fn mig_name(&self, parent: u32, placement: u32) -> Option<String> {
        self.migs
            .iter()
            .find(|m| m.parent == parent && m.placement == placement)
            .map(mig_device_name)
    }

    fn common_attributes(&self) -> Value {
        json!({
            "productName": {"string": self.product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
        })
    }

    /// The `ResourceSlice` object, owned by `node_uid`.
    pub fn build(&self, node_uid: &str) -> ResourceSlice {
        let mut devices = Vec::new();
        for minor in &self.gpus {
            let mut attrs = self.common_attributes();
            attrs["type"] = json!({"string": "gpu"});
            attrs["uuid"] = json!({"string": device_uuid(&self.node, *minor)});
            devices.push(json!({
                "name": format!("gpu-{minor}"),
                "attributes": attrs,
                "capacity": {"memory": {"value": self.memory}},
            }));
        }
        for m in &self.migs {
            let mut attrs = self.common_attributes();
            attrs["type"] = json!({"string": "mig"});
            attrs["uuid"] = json!({"string": mig_uuid(&self.node, m.parent, m.placement)});
            attrs["parentUUID"] = json!({"string": device_uuid(&self.node, m.parent)});
            attrs["profile"] = json!({"string": m.profile});
            devices.push(json!({
                "name": mig_device_name(m),
                "attributes": attrs,
                "capacity": {
                    "multiprocessors": {"value": m.multiprocessors.to_string()},
                    "memory": {"value": m.memory},
                },
            }));
        }
        serde_json::from_value(json!({
            "metadata": {
                "generateName": format!("{}-{DRIVER}-", self.node),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                    "uid": node_uid, "controller": true}],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": self.node,
                "pool": {"name": self.node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            }
        }))
        .expect("ResourceSlice JSON")
    }

    /// Creates the slice (as admin), owned by its Node.
    pub async fn create(&self, admin: &kube::Client) -> Result<ResourceSlice> {
        let node = Api::<Node>::all(admin.clone())
            .get(&self.node)
            .await
            .with_context(|| format!("getting node {}", self.node))?;
        let uid = node.metadata.uid.unwrap_or_default();
        Api::<ResourceSlice>::all(admin.clone())
            .create(&PostParams::default(), &self.build(&uid))
            .await
            .with_context(|| format!("creating ResourceSlice for {}", self.node))
    }
}

fn mig_device_name(m: &MigDevice) -> String {
    format!(
        "gpu-{}-mig-{}-{}-{}",
        m.parent,
        m.profile.replace('.', ""),
        m.profile_id,
        m.placement
    )
}

/// One device request: `count` devices of `class`, with CEL `selectors`.
pub fn device_claim_spec(class: &str, count: u32, selectors: &[&str]) -> Value {
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if !selectors.is_empty() {
        exactly["selectors"] = selectors
            .iter()
            .map(|e| json!({"cel": {"expression": e}}))
            .collect();
    }
    json!({"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}})
}

/// A `ResourceClaimTemplate` asking for [`device_claim_spec`].
pub fn claim_template(
    name: &str,
    class: &str,
    count: u32,
    selectors: &[&str],
) -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"spec": device_claim_spec(class, count, selectors)}
    }))
    .expect("ResourceClaimTemplate JSON")
}

/// A `ResourceClaim` asking for [`device_claim_spec`] (several pods may name it).
pub fn claim(name: &str, class: &str, count: u32, selectors: &[&str]) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": device_claim_spec(class, count, selectors)
    }))
    .expect("ResourceClaim JSON")
}

/// Where a pod's claim comes from.
#[derive(Debug, Clone, Copy)]
pub enum ClaimSource<'a> {
    /// A claim made for the pod from this `ResourceClaimTemplate`.
    Template(&'a str),
    /// This existing `ResourceClaim` (shared by every pod that names it).
    Claim(&'a str),
}

/// The `spec.resourceClaims` entry and container `resources.claims` of a pod using `source`.
pub fn pod_claim_fields(source: ClaimSource<'_>) -> (Value, Value) {
    let entry = match source {
        ClaimSource::Template(t) => json!({"name": "gpu", "resourceClaimTemplateName": t}),
        ClaimSource::Claim(c) => json!({"name": "gpu", "resourceClaimName": c}),
    };
    (json!([entry]), json!({"claims": [{"name": "gpu"}]}))
}

/// A pod getting its GPU through `source`, with the fake DCGM utilisation annotation, optional
/// node pin, and optionally hidden from the fake exporter.
pub fn dra_pod(
    name: &str,
    source: ClaimSource<'_>,
    utilization_percent: Option<f64>,
    node: Option<&str>,
    hidden: bool,
) -> Pod {
    let mut annotations = BTreeMap::new();
    if let Some(u) = utilization_percent {
        annotations.insert(UTILIZATION_ANNOTATION.to_string(), u.to_string());
    }
    if hidden {
        annotations.insert(HIDDEN_ANNOTATION.to_string(), "true".to_string());
    }
    let (claims, resources) = pod_claim_fields(source);
    let mut spec = json!({
        "resourceClaims": claims,
        "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
            "resources": resources}],
        "terminationGracePeriodSeconds": 1
    });
    if let Some(n) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    serde_json::from_value(
        json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec}),
    )
    .expect("static pod JSON is a valid Pod")
}
