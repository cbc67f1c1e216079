//! GPUs a node has but the scheduler cannot use: what GPU Feature Discovery (or DCGM) reports
//! beyond what the node's allocatable resources account for.
//!
//! The most expensive idle of all: a device plugin that is down, a stuck rollout or a card fallen
//! off the bus leaves cards in the machine that no pod can ask for, and nothing else shows it.

use super::claims::{MIG_STRATEGY_LABEL, NodeInfo};
use super::units::{GpuResourceKind, NodeShape, ResourceNames};

/// GFD's count of GPUs (under the MIG single strategy: of MIG devices) on a node.
pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";

/// Physical GPU equivalents present on `n` that its allocatable does not offer.
///
/// Per resource family GFD counts: `nvidia.com/gpu.count` against allocatable `nvidia.com/gpu`
/// plus its renamed `nvidia.com/gpu.shared` (times the time-slicing replicas; under the single
/// strategy the count is of MIG devices), and each `nvidia.com/mig-<profile>.count` against
/// allocatable `nvidia.com/mig-<profile>`. Under the mixed strategy `nvidia.com/gpu.count` is not
/// compared: it includes the GPUs that are cut into MIG instances. A node that advertises no GPU
/// resource at all while DCGM reports `dcgm_devices` physical GPUs on it counts those instead
/// (GFD may be down too). GPUs a DRA driver publishes on the node (`dra_gpus`, physical GPUs in
/// its ResourceSlices) are schedulable: they are subtracted from what is missing. `None` for a
/// node that shows no GPU hardware.
pub fn unschedulable(
    n: &NodeInfo,
    shape: &NodeShape<'_>,
    names: &ResourceNames,
    dcgm_devices: usize,
    dra_gpus: f64,
) -> Option<f64> {
    let count = |label: &str| -> Option<u64> {
        n.gpu_labels
            .get(label)
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let allocatable = |r: &str| n.allocatable.get(r).copied().unwrap_or(0);
    let mut missing = 0.0;
    let mut has_hardware = false;
    let mixed = n
        .gpu_labels
        .get(MIG_STRATEGY_LABEL)
        .is_some_and(|s| s == "mixed");
    if let Some(c) = count(GPU_COUNT_LABEL).filter(|_| !mixed) {
        has_hardware |= c > 0;
        let resource = "nvidia.com/gpu";
        let offered = allocatable(resource).saturating_add(allocatable("nvidia.com/gpu.shared"));
        let present = c.saturating_mul(u64::from(shape.replicas_of(resource)));
        let units = present.saturating_sub(offered);
        missing += units as f64 * shape.gpus_per_unit(resource, GpuResourceKind::Whole);
    }
    for (label, value) in &n.gpu_labels {
        let Some(resource) = label.strip_suffix(".count") else {
            continue;
        };
        let Some(kind @ GpuResourceKind::Mig { .. }) = names.classify(resource) else {
            continue;
        };
        let Ok(c) = value.trim().parse::<u64>() else {
            continue;
        };
        has_hardware |= c > 0;
        let present = c.saturating_mul(u64::from(shape.replicas_of(resource)));
        let units = present.saturating_sub(allocatable(resource));
        missing += units as f64 * shape.gpus_per_unit(resource, kind);
    }
    let advertises_none = names.gpus(&n.allocatable, shape) == 0.0;
    if advertises_none && dcgm_devices > 0 {
        return Some((missing.max(dcgm_devices as f64) - dra_gpus).max(0.0));
    }
    let present_label = n
        .gpu_labels
        .get("nvidia.com/gpu.present")
        .is_some_and(|v| v == "true");
    (has_hardware || present_label || !n.allocatable.is_empty() || dra_gpus > 0.0)
        .then_some((missing - dra_gpus).max(0.0))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ledger::units::SliceTable;

    fn node(labels: &[(&str, &str)], allocatable: &[(&str, u64)], replicas: u32) -> NodeInfo {
        NodeInfo {
            hami: crate::ledger::hami_inputs::HamiNode::default(),
            name: "n".into(),
            allocatable: allocatable
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            replicas,
            product: labels
                .iter()
                .find(|(k, _)| *k == "nvidia.com/gpu.product")
                .map(|(_, v)| (*v).to_string()),
            gpu_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect::<BTreeMap<_, _>>(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: Some(true),
        }
    }

    fn check(n: &NodeInfo, dcgm: usize) -> Option<f64> {
        check_dra(n, dcgm, 0.0)
    }

    fn check_dra(n: &NodeInfo, dcgm: usize, dra: f64) -> Option<f64> {
        let table = SliceTable::default();
        unschedulable(
            n,
            &NodeShape::of(n, &table),
            &ResourceNames::default(),
            dcgm,
            dra,
        )
    }

    #[test]
    fn three_gpus_zero_schedulable() {
        let n = node(
            &[
                ("nvidia.com/gpu.present", "true"),
                ("nvidia.com/gpu.count", "3"),
            ],
            &[("nvidia.com/gpu", 0)],
            1,
        );
        assert_eq!(check(&n, 0), Some(3.0));
        let healthy = node(
            &[("nvidia.com/gpu.count", "3")],
            &[("nvidia.com/gpu", 3)],
            1,
        );
        assert_eq!(check(&healthy, 3), Some(0.0));
        let one_lost = node(
            &[("nvidia.com/gpu.count", "8")],
            &[("nvidia.com/gpu", 7)],
            1,
        );
        assert_eq!(check(&one_lost, 8), Some(1.0));
    }

    #[test]
    fn healthy_time_sliced_and_mig_nodes_are_not_unschedulable() {
        // Time-slicing: count 2 physical, 4 replicas, 8 units advertised (renamed or not).
        let ts = node(
            &[
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/gpu.replicas", "4"),
            ],
            &[("nvidia.com/gpu", 8)],
            4,
        );
        assert_eq!(check(&ts, 2), Some(0.0));
        let renamed = node(
            &[
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/gpu.replicas", "4"),
            ],
            &[("nvidia.com/gpu.shared", 8)],
            4,
        );
        assert_eq!(check(&renamed, 2), Some(0.0));
        let half = node(
            &[
                ("nvidia.com/gpu.count", "2"),
                ("nvidia.com/gpu.replicas", "4"),
            ],
            &[("nvidia.com/gpu", 4)],
            4,
        );
        assert_eq!(
            check(&half, 2),
            Some(1.0),
            "4 of 8 replicas missing = 1 GPU"
        );
        // MIG single: count is of MIG devices (seven 1g.10gb on one H100).
        let single = node(
            &[
                ("nvidia.com/mig.strategy", "single"),
                (
                    "nvidia.com/gpu.product",
                    "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                ),
                ("nvidia.com/gpu.count", "7"),
            ],
            &[("nvidia.com/gpu", 7)],
            1,
        );
        assert_eq!(check(&single, 1), Some(0.0));
        let single_down = node(
            &[
                ("nvidia.com/mig.strategy", "single"),
                (
                    "nvidia.com/gpu.product",
                    "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                ),
                ("nvidia.com/gpu.count", "7"),
            ],
            &[("nvidia.com/gpu", 0)],
            1,
        );
        assert!((check(&single_down, 0).expect("row") - 1.0).abs() < 1e-9);
        // MIG mixed: per-profile counts; gpu.count (which includes the MIG GPUs) is not compared.
        let mixed = node(
            &[
                ("nvidia.com/mig.strategy", "mixed"),
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                ("nvidia.com/gpu.count", "1"),
                ("nvidia.com/mig-3g.40gb.count", "2"),
            ],
            &[("nvidia.com/mig-3g.40gb", 2), ("nvidia.com/gpu", 0)],
            1,
        );
        assert_eq!(check(&mixed, 1), Some(0.0));
        let mixed_down = node(
            &[
                ("nvidia.com/mig.strategy", "mixed"),
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                ("nvidia.com/mig-3g.40gb.count", "2"),
            ],
            &[("nvidia.com/mig-3g.40gb", 0)],
            1,
        );
        assert!((check(&mixed_down, 0).expect("row") - 6.0 / 7.0).abs() < 1e-9);
        // With DCGM seeing the card, a node offering nothing counts the whole physical GPU.
        assert_eq!(check(&mixed_down, 1), Some(1.0));
    }

    #[test]
    fn dcgm_devices_on_a_node_that_advertises_none() {
        // No GFD labels (GFD down too), no allocatable GPUs, DCGM sees two cards.
        let n = node(&[], &[], 1);
        assert_eq!(check(&n, 2), Some(2.0));
        assert_eq!(check(&n, 0), None, "a node without GPU hardware has no row");
    }

    #[test]
    fn gpus_published_by_a_dra_driver_are_schedulable() {
        // GFD counts 3 GPUs, the device plugin offers none, the DRA driver publishes all 3.
        let n = node(&[("nvidia.com/gpu.count", "3")], &[], 1);
        assert_eq!(check_dra(&n, 3, 3.0), Some(0.0));
        assert_eq!(check_dra(&n, 0, 3.0), Some(0.0));
        // Two of three published: one is missing.
        assert_eq!(check_dra(&n, 3, 2.0), Some(1.0));
        // No GFD labels at all: the slices alone show the node has GPUs.
        let bare = node(&[], &[], 1);
        assert_eq!(check_dra(&bare, 0, 2.0), Some(0.0));
        assert_eq!(check_dra(&bare, 0, 0.0), None);
    }
}
