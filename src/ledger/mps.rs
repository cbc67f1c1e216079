//! NVIDIA MPS through the device plugin: each card split into `replicas` MPS clients.
//!
//! GPU Feature Discovery labels such a node `nvidia.com/gpu.sharing-strategy=mps` with
//! `nvidia.com/gpu.replicas=R`, and the device plugin advertises count × R `nvidia.com/gpu`
//! (the GPU Operator's "GPU sharing with MPS" page). Each client is capped at 1/R of the card's
//! memory and compute. The `-SHARED` suffix of `nvidia.com/gpu.product` is no MPS signal (absent on
//! a real MPS node with the default `renameByDefault=false` reading of some versions): only the
//! strategy label is read, and the suffix is dropped from model names.
//!
//! Rule: a pod holding a replicated resource on an MPS node holds 1/R of a card (as time-slicing,
//! [`super::units::NodeShape::replicas_of`]); it is never proven idle by device readings —
//! "DCGM-Exporter does not support associating metrics to containers when MPS is enabled" (same
//! page) — so it is never culled, and the reclaim planner never offers it.

use super::claims::{GPU_MEMORY_LABEL, NodeInfo, Resources};
use super::model::{PodRow, Sharing};
use super::units::{GpuResourceKind, ResourceNames};

/// GFD's node label naming the device plugin's sharing strategy (`mps`, `time-slicing`, `none`).
pub const SHARING_STRATEGY_LABEL: &str = "nvidia.com/gpu.sharing-strategy";
/// The value of [`SHARING_STRATEGY_LABEL`] on an MPS node.
pub const MPS_STRATEGY: &str = "mps";
/// Suffix GFD adds to the product label of a shared card (time-slicing or MPS).
pub const SHARED_PRODUCT_SUFFIX: &str = "-SHARED";

/// Whether the device plugin shares the cards of `node` through MPS.
pub fn is_mps_node(node: &NodeInfo) -> bool {
    node.gpu_labels
        .get(SHARING_STRATEGY_LABEL)
        .is_some_and(|s| s.trim() == MPS_STRATEGY)
}

/// The GPU model without GFD's `-SHARED` suffix (the card is the same card, shared or not).
pub fn model_name(product: &str) -> &str {
    product
        .strip_suffix(SHARED_PRODUCT_SUFFIX)
        .unwrap_or(product)
}

/// Bytes in a MiB (GFD's `nvidia.com/gpu.memory` is in MiB).
const MIB: u64 = 1024 * 1024;

/// The pod's MPS sharing on `node`, when it holds a whole-GPU resource (`nvidia.com/gpu`, its
/// `.shared` rename, or an extra name) there and the node shares through MPS. MPS does not apply
/// to MIG instances (same page), so a MIG profile is no MPS share.
pub fn sharing(
    node: Option<&NodeInfo>,
    resources: &Resources,
    names: &ResourceNames,
) -> Option<Sharing> {
    let node = node.filter(|n| is_mps_node(n))?;
    let replicated = resources.keys().any(|r| {
        matches!(
            names.classify(r),
            Some(GpuResourceKind::Whole | GpuResourceKind::Shared | GpuResourceKind::Extra)
        )
    });
    if !replicated {
        return None;
    }
    let replicas = node.replicas.max(1);
    let card_mib = node
        .gpu_labels
        .get(GPU_MEMORY_LABEL)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|m| *m > 0);
    Some(Sharing::Mps {
        replicas,
        memory_cap_bytes: card_mib
            .and_then(|m| m.checked_mul(MIB))
            .map(|b| b / u64::from(replicas)),
        compute_cap_percent: 100.0 / f64::from(replicas),
    })
}

/// [`sharing`], else time-sliced or exclusive as the node's replicas say.
pub fn sharing_or(
    node: Option<&NodeInfo>,
    resources: &Resources,
    names: &ResourceNames,
    time_sliced: bool,
) -> Sharing {
    sharing(node, resources, names).unwrap_or(if time_sliced {
        Sharing::TimeSliced
    } else {
        Sharing::Exclusive
    })
}

/// Withholds what device readings would say of an MPS client (other rows are left alone): the
/// card's utilisation and memory are every client's at once, and dcgm-exporter cannot name the
/// client under MPS (even a per-process series is not this pod's), so utilisation, memory and
/// idleness stay unknown.
pub(super) fn withhold_device_verdict(row: &mut PodRow) {
    if !matches!(row.sharing, Sharing::Mps { .. }) {
        return;
    }
    row.utilization = None;
    row.memory_used_bytes = None;
    row.idle = None;
    row.idle_seconds = None;
    row.evidence.idle_since = None;
    row.evidence.idle_bounded_by_history = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], replicas: u32) -> NodeInfo {
        NodeInfo {
            replicas,
            gpu_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            ..NodeInfo::new("n1")
        }
    }

    fn gpu(units: u64) -> Resources {
        [("nvidia.com/gpu".to_string(), units)]
            .into_iter()
            .collect()
    }

    #[test]
    fn an_mps_node_is_read_from_the_strategy_label_not_the_product_suffix() {
        // The GPU Operator page's node: `Tesla-T4-SHARED`, replicas 4, strategy mps.
        let t4 = node(
            &[
                (SHARING_STRATEGY_LABEL, "mps"),
                ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
            ],
            4,
        );
        assert!(is_mps_node(&t4));
        // A real RTX 4090 MPS node: no suffix, strategy mps.
        let rtx = node(&[(SHARING_STRATEGY_LABEL, "mps")], 2);
        assert!(is_mps_node(&rtx));
        // Time-slicing uses the same suffix and replicas: not MPS.
        let sliced = node(&[(SHARING_STRATEGY_LABEL, "time-slicing")], 4);
        assert!(!is_mps_node(&sliced));
        assert!(!is_mps_node(&node(&[], 1)));
        assert_eq!(model_name("Tesla-T4-SHARED"), "Tesla-T4");
        assert_eq!(
            model_name("NVIDIA-GeForce-RTX-4090"),
            "NVIDIA-GeForce-RTX-4090"
        );
    }

    #[test]
    fn caps_are_one_replica_of_memory_and_compute() {
        let names = ResourceNames::default();
        let rtx = node(
            &[(SHARING_STRATEGY_LABEL, "mps"), (GPU_MEMORY_LABEL, "24564")],
            2,
        );
        assert_eq!(
            sharing(Some(&rtx), &gpu(1), &names),
            Some(Sharing::Mps {
                replicas: 2,
                memory_cap_bytes: Some(24564 * MIB / 2),
                compute_cap_percent: 50.0,
            })
        );
        // Without the memory label the memory cap is unknown, not guessed.
        let t4 = node(&[(SHARING_STRATEGY_LABEL, "mps")], 4);
        assert_eq!(
            sharing(Some(&t4), &gpu(1), &names),
            Some(Sharing::Mps {
                replicas: 4,
                memory_cap_bytes: None,
                compute_cap_percent: 25.0,
            })
        );
        // A label value past u64 MiB is no cap (checked, no overflow).
        let huge = node(
            &[
                (SHARING_STRATEGY_LABEL, "mps"),
                (GPU_MEMORY_LABEL, &u64::MAX.to_string()),
            ],
            2,
        );
        assert!(matches!(
            sharing(Some(&huge), &gpu(1), &names),
            Some(Sharing::Mps {
                memory_cap_bytes: None,
                ..
            })
        ));
        // Not on an MPS node, not a replicated resource, or no node: no MPS share.
        assert_eq!(sharing(Some(&node(&[], 4)), &gpu(1), &names), None);
        let mig: Resources = [("nvidia.com/mig-1g.10gb".to_string(), 1)]
            .into_iter()
            .collect();
        assert_eq!(sharing(Some(&rtx), &mig, &names), None);
        assert_eq!(sharing(None, &gpu(1), &names), None);
    }
}
