//! The ledger's claim inputs: small projections of pods, nodes, quotas and Kubeflow Notebooks —
//! who asked for which GPU.
//!
//! The `claims` sources fill them from live watches and from `kubectl get -o json|yaml` dumps, so
//! the ledger never knows where its input came from.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Annotation Kubeflow's controllers read: present (any value) means the notebook is stopped.
pub const STOP_ANNOTATION: &str = "kubeflow-resource-stopped";
/// Our own per-notebook opt-out: `"false"` means never cull.
pub const CULL_OPT_OUT_ANNOTATION: &str = "gpu-ledger.io/cull";
/// A user may postpone a stop until this RFC 3339 time.
pub const SNOOZE_ANNOTATION: &str = "gpu-ledger.io/snooze-until";
/// When gpu-ledger last stopped this notebook (history, never read as "stopped").
pub const STOPPED_AT_ANNOTATION: &str = "gpu-ledger.io/stopped-at";
/// Who stopped it.
pub const STOPPED_BY_ANNOTATION: &str = "gpu-ledger.io/stopped-by";
/// Why it was stopped, with the evidence.
pub const STOP_REASON_ANNOTATION: &str = "gpu-ledger.io/stop-reason";
/// Node label set by GPU Feature Discovery for time-sliced GPUs.
pub const REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
/// Node label with the GPU model.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

/// Everything the ledger needs from the Kubernetes API at one instant.
#[derive(Debug, Clone, Default)]
pub struct Claims {
    pub pods: Vec<PodClaim>,
    pub nodes: Vec<NodeInfo>,
    pub quotas: Vec<QuotaInfo>,
    pub notebooks: Vec<NotebookInfo>,
    pub statefulsets: Vec<StatefulSetInfo>,
    /// False when the Notebook CRD is not served (notebook ownership is then off).
    pub notebooks_enabled: bool,
}

/// Lifecycle phase as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Pending") => Self::Pending,
            Some("Running") => Self::Running,
            Some("Succeeded") => Self::Succeeded,
            Some("Failed") => Self::Failed,
            _ => Self::Unknown,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A controller owner reference, reduced to what ownership checks need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerRef {
    /// API group without version ("" for core, "apps", "kubeflow.org").
    pub group: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// The deletion request of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.deletionTimestamp`: the deadline by which the pod should be gone.
    pub deadline: DateTime<Utc>,
    /// `metadata.deletionGracePeriodSeconds` (0 when absent).
    pub grace_seconds: i64,
}

impl Deletion {
    /// When deletion was requested: the deadline minus the grace period.
    pub fn requested_at(&self) -> DateTime<Utc> {
        self.deadline - chrono::Duration::seconds(self.grace_seconds)
    }
}

/// A pod that claims at least one GPU resource.
#[derive(Debug, Clone, PartialEq)]
pub struct PodClaim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`; `None` while unscheduled.
    pub node: Option<String>,
    pub phase: PodPhase,
    pub created_at: Option<DateTime<Utc>>,
    /// `status.startTime`.
    pub started_at: Option<DateTime<Utc>>,
    /// Since when the pod has been Ready (`None` when not Ready).
    pub ready_since: Option<DateTime<Utc>>,
    pub deletion: Option<Deletion>,
    /// Units claimed per GPU resource name (only recognised GPU resources).
    pub resources: BTreeMap<String, u64>,
    /// The controller owner reference, if any.
    pub controller: Option<OwnerRef>,
    /// Message of `PodScheduled=False` (e.g. "0/3 nodes are available: 3 Insufficient nvidia.com/gpu").
    pub unschedulable_message: Option<String>,
}

/// A node's GPU capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    /// Allocatable units per GPU resource name (only recognised GPU resources).
    pub allocatable: BTreeMap<String, u64>,
    /// Time-slicing replica factor from `nvidia.com/gpu.replicas` (1 when absent).
    pub replicas: u32,
    pub product: Option<String>,
}

/// A ResourceQuota that names a GPU resource.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaInfo {
    pub namespace: String,
    pub name: String,
    /// Hard limit per quota key that names a GPU resource (`requests.nvidia.com/gpu`, …), in units.
    pub gpu_hard: BTreeMap<String, u64>,
    /// True when any key names a GPU resource.
    pub names_gpu: bool,
}

/// A Kubeflow Notebook, reduced to what reporting and culling read.
#[derive(Debug, Clone, PartialEq)]
pub struct NotebookInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// Value of `kubeflow-resource-stopped`, if present (any value means stopped or locked).
    pub stopped: Option<String>,
    pub deleting: bool,
    /// `gpu-ledger.io/cull: "false"`.
    pub cull_opt_out: bool,
    pub snooze_until: Option<DateTime<Utc>>,
    /// Our own history annotation: when we last stopped it (restart grace).
    pub last_stopped_by_us: Option<DateTime<Utc>>,
}

/// A StatefulSet's identity and controller, for pod → StatefulSet → Notebook verification.
#[derive(Debug, Clone, PartialEq)]
pub struct StatefulSetInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<OwnerRef>,
}

/// How a resource name maps to physical GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuResourceKind {
    /// `nvidia.com/gpu`: a whole GPU, or one time-slice replica on a node with replicas > 1.
    Whole,
    /// `nvidia.com/gpu.shared`: a time-slice replica (device plugin `renameByDefault`).
    Shared,
    /// `nvidia.com/mig-<g>g.<mem>gb`: g sevenths of a GPU.
    Mig { slices: u8 },
    /// A configured extra resource name counted as whole GPUs.
    Extra,
}

impl GpuResourceKind {
    /// GPU equivalents of one unit on a node with the given time-slicing replica factor.
    pub fn gpus_per_unit(self, replicas: u32) -> f64 {
        let replicas = f64::from(replicas.max(1));
        match self {
            Self::Whole | Self::Extra | Self::Shared => 1.0 / replicas,
            Self::Mig { slices } => f64::from(slices) / 7.0,
        }
    }
}

/// Recognises GPU resource names; extra names come from `--extra-gpu-resource`.
#[derive(Debug, Clone, Default)]
pub struct ResourceNames {
    pub extra: Vec<String>,
}

impl ResourceNames {
    pub fn classify(&self, name: &str) -> Option<GpuResourceKind> {
        match name {
            "nvidia.com/gpu" => Some(GpuResourceKind::Whole),
            "nvidia.com/gpu.shared" => Some(GpuResourceKind::Shared),
            _ => {
                if let Some(profile) = name.strip_prefix("nvidia.com/mig-") {
                    let slices = profile
                        .split_once('g')
                        .and_then(|(g, _)| g.parse::<u8>().ok())?;
                    return (1..=7)
                        .contains(&slices)
                        .then_some(GpuResourceKind::Mig { slices });
                }
                self.extra
                    .iter()
                    .any(|e| e == name)
                    .then_some(GpuResourceKind::Extra)
            }
        }
    }

    /// The GPU resource a quota key names: `requests.nvidia.com/gpu`, `limits.…` or the bare name.
    pub fn quota_key_resource<'a>(&self, key: &'a str) -> Option<&'a str> {
        let name = key
            .strip_prefix("requests.")
            .or_else(|| key.strip_prefix("limits."))
            .unwrap_or(key);
        self.classify(name).map(|_| name)
    }

    /// GPU equivalents for a map of resource units on a node with `replicas`.
    pub fn gpus(&self, resources: &BTreeMap<String, u64>, replicas: u32) -> f64 {
        resources
            .iter()
            .filter_map(|(name, units)| {
                self.classify(name)
                    .map(|k| k.gpus_per_unit(replicas) * *units as f64)
            })
            .sum()
    }
}

/// Shard owning a node: FNV-1a of its name modulo the shard count (stable across versions and
/// platforms, unlike std's hasher).
pub fn shard_of(node: &str, total: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(total.max(1))) as u32
}

/// Keeps the nodes whose name hashes to `shard` (of `total`), and their pods; pods without a
/// node (pending, or deleted before scheduling) belong to shard 0. Quotas, notebooks and
/// StatefulSets are kept whole (namespace-scoped, needed by every shard).
pub fn shard(mut c: Claims, shard: u32, total: u32) -> Claims {
    if total <= 1 {
        return c;
    }
    c.nodes.retain(|n| node_in_shard(&n.name, shard, total));
    c.pods.retain(|p| pod_in_shard(p, shard, total));
    c
}

/// Whether `shard` of `total` owns the node.
pub fn node_in_shard(node: &str, shard: u32, total: u32) -> bool {
    total <= 1 || shard_of(node, total) == shard
}

/// Whether `shard` of `total` owns the pod: by its node; unbound pods belong to shard 0.
pub fn pod_in_shard(p: &PodClaim, shard: u32, total: u32) -> bool {
    total <= 1
        || p.node
            .as_deref()
            .map_or(shard == 0, |n| shard_of(n, total) == shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("gpu-node-1", 1), 0);
        let counts = (0..1000).fold([0u32; 4], |mut c, i| {
            c[shard_of(&format!("node-{i}"), 4) as usize] += 1;
            c
        });
        assert!(counts.iter().all(|c| *c > 150), "{counts:?}");
        assert_eq!(shard_of("gpu-node-1", 4), shard_of("gpu-node-1", 4));
    }

    #[test]
    fn classifies_gpu_resource_names() {
        let names = ResourceNames {
            extra: vec!["example.com/gpu".into()],
        };
        assert_eq!(
            names.classify("nvidia.com/gpu"),
            Some(GpuResourceKind::Whole)
        );
        assert_eq!(
            names.classify("nvidia.com/gpu.shared"),
            Some(GpuResourceKind::Shared)
        );
        assert_eq!(
            names.classify("nvidia.com/mig-3g.40gb"),
            Some(GpuResourceKind::Mig { slices: 3 })
        );
        assert_eq!(
            names.classify("nvidia.com/mig-1g.10gb"),
            Some(GpuResourceKind::Mig { slices: 1 })
        );
        assert_eq!(names.classify("nvidia.com/mig-9g.10gb"), None);
        assert_eq!(
            names.classify("example.com/gpu"),
            Some(GpuResourceKind::Extra)
        );
        assert_eq!(names.classify("cpu"), None);
        assert_eq!(
            names.quota_key_resource("requests.nvidia.com/gpu"),
            Some("nvidia.com/gpu")
        );
        assert_eq!(names.quota_key_resource("limits.cpu"), None);
    }

    #[test]
    fn gpu_equivalents_follow_design() {
        let names = ResourceNames::default();
        let mut r = BTreeMap::new();
        r.insert("nvidia.com/gpu".to_string(), 2);
        assert!((names.gpus(&r, 1) - 2.0).abs() < 1e-9);
        assert!((names.gpus(&r, 4) - 0.5).abs() < 1e-9);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-3g.40gb".to_string(), 1);
        m.insert("nvidia.com/mig-1g.10gb".to_string(), 2);
        assert!((names.gpus(&m, 1) - 5.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn deletion_requested_at_is_deadline_minus_grace() {
        let deadline =
            DateTime::parse_from_rfc3339("2026-01-01T00:00:30Z").map(|d| d.with_timezone(&Utc));
        let d = Deletion {
            deadline: deadline.expect("valid"),
            grace_seconds: 30,
        };
        assert_eq!(d.requested_at().to_rfc3339(), "2026-01-01T00:00:00+00:00");
    }
}
