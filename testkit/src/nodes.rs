//! Fake GPU nodes for kwok: a small builder producing `v1.Node` objects with NVIDIA extended
//! resources (whole GPUs, MIG profiles, time-slicing replicas) and GPU Feature Discovery labels.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

/// Builder for a fake GPU node. Capacity = allocatable: cpu 32, memory 256Gi, pods 110,
/// plus the GPU resources configured here.
#[derive(Debug, Clone)]
pub struct GpuNode {
    name: String,
    gpus: u32,
    product: String,
    replicas: Option<u32>,
    mig: Vec<(String, u32)>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    taints: Vec<Taint>,
    extra_resources: BTreeMap<String, String>,
    device_plugin: bool,
}

impl GpuNode {
    /// A node with `gpus` whole GPUs (`nvidia.com/gpu`), product `NVIDIA-A100-SXM4-80GB`.
    pub fn new(name: &str, gpus: u32) -> Self {
        Self {
            name: name.to_string(),
            gpus,
            product: "NVIDIA-A100-SXM4-80GB".to_string(),
            replicas: None,
            mig: Vec::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            taints: Vec::new(),
            extra_resources: BTreeMap::new(),
            device_plugin: true,
        }
    }

    /// No NVIDIA device plugin: the node advertises no `nvidia.com/gpu` at all (not even 0), as
    /// on a node whose GPUs only a DRA driver hands out.
    #[must_use]
    pub fn no_device_plugin(mut self) -> Self {
        self.device_plugin = false;
        self
    }

    /// Sets the `nvidia.com/gpu.product` label.
    #[must_use]
    pub fn product(mut self, product: &str) -> Self {
        self.product = product.to_string();
        self
    }

    /// Time-slicing: label `nvidia.com/gpu.replicas=R` and advertise `gpus * R` as
    /// `nvidia.com/gpu` (what the device plugin does with `renameByDefault: false`).
    #[must_use]
    pub fn time_slicing(mut self, replicas: u32) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// MIG (mixed strategy): advertise `nvidia.com/mig-<profile>: count`, e.g.
    /// `.mig("1g.10gb", 7)`. Whole-GPU capacity stays as given to [`GpuNode::new`] (use 0 for
    /// a fully partitioned node).
    #[must_use]
    pub fn mig(mut self, profile: &str, count: u32) -> Self {
        self.mig.push((profile.to_string(), count));
        self
    }

    /// Adds a label.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds an annotation.
    #[must_use]
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a taint.
    #[must_use]
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: Some(value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        });
        self
    }

    /// Adds any other extended resource to capacity and allocatable.
    #[must_use]
    pub fn resource(mut self, name: &str, quantity: &str) -> Self {
        self.extra_resources
            .insert(name.to_string(), quantity.to_string());
        self
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Advertised `nvidia.com/gpu` (gpus × replicas when time-sliced).
    pub fn advertised_gpus(&self) -> u32 {
        self.gpus * self.replicas.unwrap_or(1)
    }

    /// Builds the `v1.Node` (with status capacity/allocatable set).
    pub fn build(&self) -> Node {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), self.name.clone()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ("type".to_string(), "kwok".to_string()),
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            ("nvidia.com/gpu.product".to_string(), self.product.clone()),
            ("nvidia.com/gpu.count".to_string(), self.gpus.to_string()),
        ]);
        if let Some(r) = self.replicas {
            labels.insert("nvidia.com/gpu.replicas".into(), r.to_string());
            labels.insert(
                "nvidia.com/gpu.sharing-strategy".into(),
                "time-slicing".into(),
            );
        }
        if !self.mig.is_empty() {
            labels.insert("nvidia.com/mig.strategy".into(), "mixed".into());
        }
        labels.extend(self.labels.clone());
        let mut annotations =
            BTreeMap::from([("kwok.x-k8s.io/node".to_string(), "fake".to_string())]);
        annotations.extend(self.annotations.clone());

        let mut res: BTreeMap<String, Quantity> = BTreeMap::from([
            ("cpu".to_string(), Quantity("32".into())),
            ("memory".to_string(), Quantity("256Gi".into())),
            ("pods".to_string(), Quantity("110".into())),
            ("ephemeral-storage".to_string(), Quantity("1Ti".into())),
        ]);
        if self.device_plugin {
            res.insert(
                "nvidia.com/gpu".to_string(),
                Quantity(self.advertised_gpus().to_string()),
            );
        }
        for (profile, count) in &self.mig {
            res.insert(
                format!("nvidia.com/mig-{profile}"),
                Quantity(count.to_string()),
            );
        }
        for (k, v) in &self.extra_resources {
            res.insert(k.clone(), Quantity(v.clone()));
        }
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.taints.is_empty()).then(|| self.taints.clone()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(res.clone()),
                allocatable: Some(res),
                ..NodeStatus::default()
            }),
        }
    }

    /// Creates the node and makes sure its status carries our capacity/allocatable (kwok's
    /// node-initialize stage keeps them).
    pub async fn create(&self, client: &kube::Client) -> Result<Node> {
        let api: Api<Node> = Api::all(client.clone());
        let node = self.build();
        let mut created = api
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {}", self.name))?;
        let has_gpu = created
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .is_some_and(|a| {
                a.contains_key("pods") && (a.contains_key("nvidia.com/gpu") || !self.device_plugin)
            });
        if !has_gpu {
            created.status = node.status;
            created = api
                .replace_status(&self.name, &PostParams::default(), &created)
                .await
                .with_context(|| format!("setting status of node {}", self.name))?;
        }
        Ok(created)
    }
}
