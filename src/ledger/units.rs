//! GPU-unit math: which resource names are GPUs ([`ResourceNames::classify`]), how many
//! compute slices a MIG parent has ([`SliceTable`]), and how one unit of a resource converts to
//! physical GPUs on a node ([`NodeShape`]).

use super::claims::{MIG_STRATEGY_LABEL, NVIDIA_DRA_DRIVER, NodeInfo};

/// How a resource name maps to physical GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuResourceKind {
    /// `nvidia.com/gpu`: a whole GPU, or one time-slice replica on a node with replicas > 1.
    Whole,
    /// `nvidia.com/gpu.shared`: a time-slice replica (device plugin `renameByDefault`).
    Shared,
    /// `nvidia.com/mig-<g>g.<mem>gb`: g slices of a GPU with S compute slices (7, or 4 on the A30).
    Mig { slices: u8 },
    /// A configured extra resource name counted as whole GPUs.
    Extra,
}

/// Compute slices of MIG-capable GPUs whose count is not the usual 7 (A100, H100, H200, B200,
/// GB200: 7). Matched case-insensitively against the node's product label. Source: NVIDIA's MIG
/// user guide, "Supported MIG Profiles" (A30: 4 slices, profiles 1g.6gb, 2g.12gb, 4g.24gb).
pub const DEFAULT_SLICE_TABLE: &[(&str, u8)] = &[("A30", 4)];
/// Compute slices assumed when the product is unknown or not in the table.
pub const DEFAULT_COMPUTE_SLICES: u8 = 7;
/// MIG profiles that exist only on 4-slice parts (the A30), for pods not yet on a node.
const FOUR_SLICE_PROFILES: &[&str] = &["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"];

/// Compute slices per GPU product: the built-in table, then `--mig-compute-slices` overrides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceTable {
    /// `(product substring, slices)`, checked before the built-in table.
    pub overrides: Vec<(String, u8)>,
}

impl SliceTable {
    /// Compute slices of the parent GPU for a node product label (with or without the
    /// `-MIG-<profile>` and `-SHARED` suffixes).
    pub fn slices_of(&self, product: Option<&str>) -> u8 {
        let Some(product) = product else {
            return DEFAULT_COMPUTE_SLICES;
        };
        let base = product
            .split("-MIG-")
            .next()
            .unwrap_or(product)
            .to_ascii_lowercase();
        self.overrides
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .chain(DEFAULT_SLICE_TABLE.iter().copied())
            .find(|(p, _)| base.contains(&p.to_ascii_lowercase()))
            .map_or(DEFAULT_COMPUTE_SLICES, |(_, n)| n.max(1))
    }
}

/// Compute slices of the parent of MIG `profile` when no product names it: 4 for the profiles
/// only 4-slice parts have, else [`DEFAULT_COMPUTE_SLICES`].
pub fn unplaced_parent_slices(profile: &str) -> u8 {
    if FOUR_SLICE_PROFILES.contains(&profile) {
        4
    } else {
        DEFAULT_COMPUTE_SLICES
    }
}

/// The GPU slices `g` of a MIG profile `<g>g.<mem>gb[+me…]`, if it is one (1..=7).
pub fn profile_slices(profile: &str) -> Option<u8> {
    let g = profile
        .split_once('g')
        .and_then(|(g, _)| g.parse::<u8>().ok())?;
    (1..=7).contains(&g).then_some(g)
}

/// How units of GPU resources convert to physical GPUs on one node, or for a pod that is not
/// on a node yet.
#[derive(Debug, Clone, Copy)]
pub struct NodeShape<'a> {
    node: Option<&'a NodeInfo>,
    table: Option<&'a SliceTable>,
    compute_slices: u8,
    /// Under the MIG single strategy: the slices of every advertised `nvidia.com/gpu` unit.
    single_mig_slices: Option<u8>,
    /// `compute_slices` comes from DCGM's `modelName` (no GFD product label on the node).
    dcgm_model: bool,
}

impl<'a> NodeShape<'a> {
    /// The shape of `node` (its product, MIG strategy and replica labels).
    pub fn of(node: &'a NodeInfo, slices: &'a SliceTable) -> Self {
        let compute_slices = slices.slices_of(node.product.as_deref());
        let single = node
            .gpu_labels
            .get(MIG_STRATEGY_LABEL)
            .is_some_and(|s| s == "single");
        let single_mig_slices = single
            .then(|| {
                let from_product = node
                    .product
                    .as_deref()
                    .and_then(|p| p.split_once("-MIG-"))
                    .map(|(_, profile)| profile.trim_end_matches("-SHARED"))
                    .and_then(profile_slices);
                from_product.or_else(|| {
                    node.gpu_labels
                        .get("nvidia.com/gpu.slices.gi")
                        .and_then(|v| v.parse::<u8>().ok())
                        .filter(|g| (1..=7).contains(g))
                })
            })
            .flatten();
        NodeShape {
            node: Some(node),
            table: Some(slices),
            compute_slices,
            single_mig_slices,
            dcgm_model: false,
        }
    }

    /// The parent model from DCGM's `modelName` (`NVIDIA A30`) on a node without GFD's product
    /// label (the device plugin's chart does not enable GFD by default). A product label wins.
    #[must_use]
    pub fn with_dcgm_model(mut self, model: Option<&str>) -> Self {
        if let (Some(node), Some(model)) = (self.node, model)
            && node.product.is_none()
        {
            self.compute_slices = self.table_slices(model);
            self.dcgm_model = true;
        }
        self
    }

    /// Under the MIG single strategy on a node without GFD's strategy label, the slices of each
    /// `nvidia.com/gpu` unit as DCGM shows them (every device on the node a MIG instance of one
    /// profile: the attribution's `dcgm_single_mig_slices_on`). A strategy label wins.
    #[must_use]
    pub fn with_dcgm_single_mig(mut self, slices: Option<u8>) -> Self {
        if let (Some(node), Some(g)) = (self.node, slices)
            && !node.gpu_labels.contains_key(MIG_STRATEGY_LABEL)
        {
            self.single_mig_slices = Some(g);
        }
        self
    }

    fn table_slices(&self, product: &str) -> u8 {
        self.table
            .map_or(DEFAULT_COMPUTE_SLICES, |t| t.slices_of(Some(product)))
    }

    /// The node this is the shape of; `None` for an unplaced pod.
    pub fn node_info(&self) -> Option<&'a NodeInfo> {
        self.node
    }

    /// The node's Ready condition ([`NodeInfo::ready`]); `None` for an unplaced pod.
    pub fn node_ready(&self) -> Option<bool> {
        self.node.and_then(|n| n.ready)
    }

    /// A pod with no node (pending): no time-slicing, parent slices from the profile name.
    pub fn unplaced() -> Self {
        NodeShape {
            node: None,
            table: None,
            compute_slices: DEFAULT_COMPUTE_SLICES,
            single_mig_slices: None,
            dcgm_model: false,
        }
    }

    /// The time-slicing replica factor of `resource` on this node: `nvidia.com/gpu.replicas` for
    /// `nvidia.com/gpu` (and its renamed `.shared`), `nvidia.com/mig-<p>.replicas` for a MIG
    /// profile (GFD publishes one per shared resource); 1 when absent or off a node.
    pub fn replicas_of(&self, resource: &str) -> u32 {
        let Some(node) = self.node else { return 1 };
        let base = resource.strip_suffix(".shared").unwrap_or(resource);
        if base == "nvidia.com/gpu" {
            return node.replicas.max(1);
        }
        node.gpu_labels
            .get(&format!("{base}.replicas"))
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|r| *r >= 1)
            .unwrap_or(1)
    }

    /// Physical GPUs of one unit of `resource` (of `kind`).
    pub fn gpus_per_unit(&self, resource: &str, kind: GpuResourceKind) -> f64 {
        let replicas = f64::from(self.replicas_of(resource));
        let slice = |g: u8, parent: u8| f64::from(g) / f64::from(parent.max(1));
        let whole = match kind {
            GpuResourceKind::Whole => self
                .single_mig_slices
                .map_or(1.0, |g| slice(g, self.compute_slices)),
            GpuResourceKind::Extra | GpuResourceKind::Shared => 1.0,
            GpuResourceKind::Mig { slices } => {
                let by_profile = || {
                    unplaced_parent_slices(resource.strip_prefix("nvidia.com/mig-").unwrap_or(""))
                };
                let parent = if let Some(node) = self.node {
                    // On a node with GPUs of several models, the parent of a MIG profile is
                    // named by its own product label (`nvidia.com/mig-1g.6gb.product`, GFD),
                    // while `nvidia.com/gpu.product` names the full GPUs. Without GFD: DCGM's
                    // model, else the profile name (A30-only profiles), before the default.
                    match node.gpu_labels.get(&format!("{resource}.product")) {
                        Some(p) => self.table_slices(p),
                        None if node.product.is_some() || self.dcgm_model => self.compute_slices,
                        None => by_profile(),
                    }
                } else {
                    by_profile()
                };
                slice(slices.min(parent), parent)
            }
        };
        whole / replicas
    }

    /// Whether any of `resources` is time-sliced here (a shared resource, or replicas > 1).
    pub fn time_sliced<'r>(
        &self,
        names: &ResourceNames,
        resources: impl IntoIterator<Item = &'r String>,
    ) -> bool {
        resources.into_iter().any(|r| match names.classify(r) {
            Some(GpuResourceKind::Shared) => true,
            Some(_) => self.replicas_of(r) > 1,
            None => false,
        })
    }
}

/// Recognises GPU resource names; extra names come from `--extra-gpu-resources`, the DRA
/// drivers whose devices count as GPUs from `--dra-gpu-drivers`.
#[derive(Debug, Clone)]
pub struct ResourceNames {
    pub extra: Vec<String>,
    pub dra_drivers: Vec<String>,
}

impl Default for ResourceNames {
    fn default() -> Self {
        ResourceNames {
            extra: Vec::new(),
            dra_drivers: vec![NVIDIA_DRA_DRIVER.to_string()],
        }
    }
}

impl ResourceNames {
    /// Whether devices of DRA driver `driver` count as GPUs.
    pub fn is_gpu_driver(&self, driver: &str) -> bool {
        self.dra_drivers.iter().any(|d| d == driver)
    }

    pub fn classify(&self, name: &str) -> Option<GpuResourceKind> {
        match name {
            "nvidia.com/gpu" => Some(GpuResourceKind::Whole),
            "nvidia.com/gpu.shared" => Some(GpuResourceKind::Shared),
            _ => {
                if let Some(profile) = name.strip_prefix("nvidia.com/mig-") {
                    return profile_slices(profile).map(|slices| GpuResourceKind::Mig { slices });
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

    /// GPU equivalents for a map of resource units on a node of `shape`.
    pub fn gpus<'r>(
        &'r self,
        resources: impl IntoIterator<Item = (&'r String, &'r u64)> + 'r,
        shape: &'r NodeShape<'_>,
    ) -> f64 {
        self.gpus_by_resource(resources, shape)
            .map(|(_, g)| g)
            .sum()
    }

    /// GPU equivalents per recognised resource of `resources`.
    pub fn gpus_by_resource<'r>(
        &'r self,
        resources: impl IntoIterator<Item = (&'r String, &'r u64)> + 'r,
        shape: &'r NodeShape<'_>,
    ) -> impl Iterator<Item = (&'r str, f64)> + 'r {
        resources.into_iter().filter_map(move |(name, units)| {
            self.classify(name)
                .map(|k| (name.as_str(), shape.gpus_per_unit(name, k) * *units as f64))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn classifies_gpu_resource_names() {
        let names = ResourceNames {
            extra: vec!["example.com/gpu".into()],
            ..ResourceNames::default()
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

    fn node_with(labels: &[(&str, &str)], product: Option<&str>, replicas: u32) -> NodeInfo {
        NodeInfo {
            replicas,
            product: product.map(str::to_string),
            gpu_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            ..NodeInfo::new("n")
        }
    }

    #[test]
    fn gpu_equivalents_follow_design() {
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let mut r = BTreeMap::new();
        r.insert("nvidia.com/gpu".to_string(), 2);
        let plain = node_with(&[], Some("NVIDIA-H100-80GB-HBM3"), 1);
        assert!((names.gpus(&r, &NodeShape::of(&plain, &table)) - 2.0).abs() < 1e-9);
        let sliced = node_with(&[], Some("Tesla-T4-SHARED"), 4);
        assert!((names.gpus(&r, &NodeShape::of(&sliced, &table)) - 0.5).abs() < 1e-9);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-3g.40gb".to_string(), 1);
        m.insert("nvidia.com/mig-1g.10gb".to_string(), 2);
        let h100 = node_with(
            &[(MIG_STRATEGY_LABEL, "mixed")],
            Some("NVIDIA-H100-80GB-HBM3"),
            1,
        );
        assert!((names.gpus(&m, &NodeShape::of(&h100, &table)) - 5.0 / 7.0).abs() < 1e-9);
        assert!((names.gpus(&m, &NodeShape::unplaced()) - 5.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn mig_single_strategy_counts_slices_not_gpus() {
        // GFD on an H100 cut into seven 1g.10gb under the single strategy (gpu-operator docs,
        // "MIG Manager" configuration check).
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let n = node_with(
            &[
                (MIG_STRATEGY_LABEL, "single"),
                ("nvidia.com/gpu.count", "7"),
                ("nvidia.com/gpu.slices.gi", "1"),
            ],
            Some("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
            1,
        );
        let mut alloc = BTreeMap::new();
        alloc.insert("nvidia.com/gpu".to_string(), 7);
        let shape = NodeShape::of(&n, &table);
        assert!(
            (names.gpus(&alloc, &shape) - 1.0).abs() < 1e-9,
            "seven slices are one GPU"
        );
        let mut one = BTreeMap::new();
        one.insert("nvidia.com/gpu".to_string(), 1);
        assert!((names.gpus(&one, &shape) - 1.0 / 7.0).abs() < 1e-9);
        // 3g.40gb under single strategy, product label only.
        let n = node_with(
            &[(MIG_STRATEGY_LABEL, "single")],
            Some("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"),
            1,
        );
        assert!((names.gpus(&one, &NodeShape::of(&n, &table)) - 3.0 / 7.0).abs() < 1e-9);
    }

    #[test]
    fn a30_has_four_slices_and_the_table_can_be_overridden() {
        let names = ResourceNames::default();
        let table = SliceTable::default();
        let a30 = node_with(&[(MIG_STRATEGY_LABEL, "mixed")], Some("NVIDIA-A30"), 1);
        let shape = NodeShape::of(&a30, &table);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-1g.6gb".to_string(), 1);
        assert!((names.gpus(&m, &shape) - 0.25).abs() < 1e-9);
        let mut m2 = BTreeMap::new();
        m2.insert("nvidia.com/mig-2g.12gb".to_string(), 1);
        assert!((names.gpus(&m2, &shape) - 0.5).abs() < 1e-9);
        // Not yet on a node: the A30-only profile still converts with 4 slices.
        assert!((names.gpus(&m, &NodeShape::unplaced()) - 0.25).abs() < 1e-9);
        let custom = SliceTable {
            overrides: vec![("H100".into(), 4)],
        };
        let h100 = node_with(&[], Some("NVIDIA-H100-80GB-HBM3"), 1);
        let mut g = BTreeMap::new();
        g.insert("nvidia.com/mig-1g.10gb".to_string(), 1);
        assert!((names.gpus(&g, &NodeShape::of(&h100, &custom)) - 0.25).abs() < 1e-9);
        assert_eq!(table.slices_of(Some("NVIDIA-A30-MIG-1g.6gb-SHARED")), 4);
        // A mixed-model node: the full GPUs' product is another card; the profile's own
        // product label names the A30 (GFD, NVIDIA/dcgm-exporter#736's node).
        let mixed = node_with(
            &[
                (MIG_STRATEGY_LABEL, "mixed"),
                ("nvidia.com/mig-1g.6gb.product", "NVIDIA-A30-MIG-1g.6gb"),
            ],
            Some("NVIDIA-RTX-2000-Ada-Generation"),
            1,
        );
        assert!((names.gpus(&m, &NodeShape::of(&mixed, &table)) - 0.25).abs() < 1e-9);
        assert_eq!(table.slices_of(None), 7);
    }

    #[test]
    fn time_sliced_mig_profiles_use_their_own_replicas() {
        let names = ResourceNames::default();
        let n = node_with(
            &[
                (MIG_STRATEGY_LABEL, "mixed"),
                ("nvidia.com/mig-1g.10gb.replicas", "2"),
            ],
            Some("NVIDIA-H100-80GB-HBM3"),
            1,
        );
        let table = SliceTable::default();
        let shape = NodeShape::of(&n, &table);
        let mut m = BTreeMap::new();
        m.insert("nvidia.com/mig-1g.10gb".to_string(), 1);
        assert!((names.gpus(&m, &shape) - 1.0 / 14.0).abs() < 1e-9);
        assert!(shape.time_sliced(&names, m.keys()));
        let mut g = BTreeMap::new();
        g.insert("nvidia.com/gpu".to_string(), 1);
        assert!(!shape.time_sliced(&names, g.keys()));
    }
}
