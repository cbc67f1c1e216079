//! HAMi vGPU inputs: what the claims source reads of HAMi's annotations (the monitor's readings
//! are `usage::HamiContainerUsage`), and the per-card share a pod row shows. The rule that reads
//! them is `ledger::hami`; these types live apart so the claim and row types can name them
//! without naming the rule.

use serde::Serialize;

/// Node annotation HAMi's device plugin writes: the node's cards.
pub const REGISTER_ANNOTATION: &str = "hami.io/node-nvidia-register";
/// Pod annotation HAMi's scheduler writes when it binds the pod: each container's vGPUs.
pub const ALLOCATED_ANNOTATION: &str = "hami.io/vgpu-devices-allocated";
/// The same encoded string, written beside [`ALLOCATED_ANNOTATION`] (`PatchAnnotations` in
/// `pkg/device/nvidia/device.go` writes both); read when the other is missing.
pub const TO_ALLOCATE_ANNOTATION: &str = "hami.io/vgpu-devices-to-allocate";

/// One card of a HAMi node's register annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HamiDevice {
    pub uuid: String,
    /// `deviceSplitCount`: vGPUs the card serves at most.
    pub split: u32,
    /// Device memory MiB HAMi hands out (field 3).
    pub mem_mib: u64,
    /// Core limit (100 = the whole card).
    pub cores: u32,
    /// Device type (`NVIDIA-Tesla V100-PCIE-32GB`).
    pub model: String,
    /// HAMi's own health bit (field 7).
    pub healthy: bool,
}

/// What a node's register annotation says: its cards, or why it could not be read (the node is
/// then read as any node, by its allocatable).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HamiNode {
    pub devices: Vec<HamiDevice>,
    pub error: Option<String>,
}

/// One vGPU of one container, from the pod's allocation annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HamiAlloc {
    /// Position of the container in the annotation (`;`-separated, the pod's container order).
    pub container: usize,
    /// The card's UUID (a MIG-mode `[i-j]` suffix stripped).
    pub uuid: String,
    pub mem_mib: u64,
    pub cores: u32,
}

/// What a pod's allocation annotation says: its vGPUs, or why it could not be read (the pod is
/// then counted by its request, with the reason shown).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HamiPod {
    pub allocs: Vec<HamiAlloc>,
    pub error: Option<String>,
}

impl HamiPod {
    /// Whether HAMi wrote anything for this pod (an allocation or an unreadable one).
    pub fn present(&self) -> bool {
        !self.allocs.is_empty() || self.error.is_some()
    }
}

/// One device of a pod's HAMi share, as the row shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HamiShare {
    pub uuid: String,
    /// GPU equivalents held on this device (0..1).
    pub share: f64,
    /// Memory MiB HAMi gave the pod's containers on it.
    pub memory_mib: u64,
    /// Cores (percent of the card) HAMi gave them; 0 = unset.
    pub cores: u32,
}

/// Most devices one register annotation may list (a node has at most a few dozen cards).
pub const MAX_REGISTER_DEVICES: usize = 64;
/// Most vGPUs one allocation annotation may list.
pub const MAX_ALLOCS: usize = 256;
/// Longest annotation read (HAMi writes some hundred bytes per device).
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
