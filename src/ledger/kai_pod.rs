//! What KAI-Scheduler's fraction sharing writes on pods: its label and annotation keys, and a pod's
//! reading of them ([`KaiPod`], filled by the `claims` projection, read by the KAI rule in
//! `kai.rs`). Data only, so the claim inputs, the policy and the rule name it without naming each
//! other.

/// Label KAI's binder puts on a reservation pod and on each single-device user: the GPU group.
pub const GPU_GROUP_LABEL: &str = "runai-gpu-group";
/// Prefix of the per-device group labels of a multi-device fraction (`runai-gpu-group/<g>: <g>`).
pub const MULTI_GPU_GROUP_PREFIX: &str = "runai-gpu-group/";
/// The share of one card a user asks for (`"0.5"`).
pub const FRACTION_ANNOTATION: &str = "gpu-fraction";
/// The card memory a user asks for, in MiB (`"2000"`).
pub const MEMORY_ANNOTATION: &str = "gpu-memory";
/// How many cards a multi-device fraction spans (each with the same share).
pub const NUM_DEVICES_ANNOTATION: &str = "gpu-fraction-num-devices";
/// Which container gets the fraction (KAI's default: the first).
pub const CONTAINER_ANNOTATION: &str = "gpu-fraction-container-name";
/// On a reservation pod: the UUID of the card it reserved (named "index" for historical reasons).
pub const RESERVED_GPU_ANNOTATION: &str = "run.ai/reserve_for_gpu_index";
/// Namespaces of the reservation pods by default: KAI ≥ v0.6.0, then the older Run:ai name.
pub const DEFAULT_RESERVATION_NAMESPACES: [&str; 2] =
    ["kai-resource-reservation", "runai-reservation"];
/// Pseudo resource name of a user's share in the metrics' `resource` label (a colon never occurs
/// in a Kubernetes resource name).
pub const FRACTION_RESOURCE: &str = "kai:gpu-fraction";

/// What a pod says about KAI fractions (labels and annotations, bounded and checked by the
/// `claims` projection). Present only on pods that carry one of them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KaiPod {
    /// GPU groups: `runai-gpu-group` and each `runai-gpu-group/<g>`, sorted, deduplicated.
    pub groups: Vec<String>,
    /// `gpu-fraction`, in (0, 1].
    pub fraction: Option<f64>,
    /// `gpu-memory`, MiB.
    pub memory_mib: Option<u64>,
    /// `gpu-fraction-num-devices` (1 when absent).
    pub num_devices: Option<u32>,
    /// `gpu-fraction-container-name`.
    pub container: Option<String>,
    /// `run.ai/reserve_for_gpu_index` of a reservation pod: the card's UUID.
    pub reserved_uuid: Option<String>,
    /// Annotations present but not understood (a fraction of 2, memory of "lots"): the share is
    /// then unknown, never read as absent.
    pub invalid: Vec<&'static str>,
}
