//! The ledger's usage inputs: per-device DCGM utilisation over a window.
//!
//! A device is a physical GPU (`UUID`) or one MIG GPU instance (`UUID` + `GPU_I_ID`). The `usage`
//! sources (Prometheus live, an exposition dump offline) reduce to these rows; missing or NaN
//! readings stay `None` (unknown), never 0.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The utilisation field a device reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Signal {
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, a 0..1 ratio.
    GrEngineActive,
    /// `DCGM_FI_DEV_GPU_UTIL`, 0..100 percent (divided by 100 here).
    GpuUtil,
}

/// The workload labels dcgm-exporter attached to a series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Workload {
    pub namespace: String,
    pub pod: String,
}

/// Identity of a device: GPU UUID plus MIG GPU instance id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DeviceKey {
    pub uuid: String,
    pub gpu_instance: Option<String>,
}

/// What is known about one device over the window ending at the observation time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceUsage {
    pub key: DeviceKey,
    /// `Hostname`/`hostname` label (may name the exporter pod rather than the node).
    pub hostname: Option<String>,
    /// The exporter pod that reported the device: the scrape's target labels `namespace`/`pod`
    /// when the workload labels live elsewhere (`exported_*`, `pod_name`).
    pub exporter: Option<Workload>,
    /// The scrape target address (`instance`, `host:port`).
    pub instance: Option<String>,
    pub model: Option<String>,
    pub mig_profile: Option<String>,
    /// The MIG device UUID (`MIG-…`) of a GPU instance: only dcgm-exporter's
    /// `dra_mig_device_uuid` label (`--kubernetes-enable-dra`) carries it; it joins a MIG device
    /// handed out through DRA with its DCGM series.
    pub mig_uuid: Option<String>,
    /// Pods named by the device's current series (several for time-slicing copies).
    pub workloads: Vec<Workload>,
    /// Per-pod utilisation from per-process series (time-slicing, dcgm-exporter ≥ 4.5.3), 0..1.
    pub per_pod_utilization: Vec<(Workload, f64)>,
    /// Per-pod framebuffer use from per-process series (bytes).
    pub per_pod_memory_bytes: Vec<(Workload, f64)>,
    /// Each sharer's own per-process `GPU_UTIL` over the window (the same series as
    /// `per_pod_utilization`), for proving one sharer idle while its neighbour is busy.
    pub per_pod_windows: Vec<OwnWindow>,
    pub signal: Option<Signal>,
    /// Latest utilisation of the preferred signal, 0..1.
    pub utilization: Option<f64>,
    /// Highest utilisation in the window over every signal the device reports, 0..1: a busy
    /// reading on any signal makes the device busy.
    pub peak: Option<f64>,
    /// Share of the window the samples prove (0..1), the lowest over the signals the device
    /// reports: idleness needs every signal covered. Per signal, the lower of valid samples
    /// over samples expected and the time they vouch for over the window, both at the sample
    /// interval inferred from the device's own series (`usage::series` states the rule).
    pub coverage: f64,
    pub last_sample_at: Option<DateTime<Utc>>,
    pub memory_used_bytes: Option<f64>,
    /// Latest sample at or above the idle threshold on any signal within known history.
    pub last_active_at: Option<DateTime<Utc>>,
    /// Start of the unbroken run of samples that ends at the newest one (bounded by the history
    /// available): idleness can be proven back to here and no further.
    pub covered_since: Option<DateTime<Utc>>,
}

/// One sharer's own readings of a time-sliced device over the window, from dcgm-exporter's
/// per-process `DCGM_FI_DEV_GPU_UTIL` under virtual GPUs (PR #594): the utilisation of that pod's
/// processes only, judged with the same evidence rules as a device's signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnWindow {
    pub workload: Workload,
    /// Highest own reading in the window, 0..1.
    pub peak: Option<f64>,
    /// Share of the window the own samples prove (0..1), by the device's rule.
    pub coverage: f64,
    pub last_sample_at: Option<DateTime<Utc>>,
    /// Latest own reading at or above the idle threshold within known history.
    pub last_active_at: Option<DateTime<Utc>>,
    /// Start of the unbroken run of own samples that ends at the newest one.
    pub covered_since: Option<DateTime<Utc>>,
}

/// All devices seen at one instant, and whether the source answered.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub devices: Vec<DeviceUsage>,
    /// False when the source failed: every utilisation is then unknown.
    pub available: bool,
    /// The source answered partially (Prometheus `warnings`: a Thanos or Mimir store missed):
    /// the devices are true but may lack samples or series, so busy readings count and nothing
    /// is proven idle.
    pub partial: bool,
    /// HAMi vGPU layer: each container's own readings from HAMi's vGPU monitor.
    pub hami: Vec<HamiContainerUsage>,
    // Health layer (issue 39, sick cards).
    /// DCGM's health readings in the window, per GPU (only GPUs with a non-passing watch or an
    /// XID); the ledger decides what is sick.
    pub gpu_health: Vec<DcgmHealth>,
}

/// What DCGM said about one GPU's health in the window (`DCGM_EXP_GPU_HEALTH_STATUS`,
/// `DCGM_EXP_XID_ERRORS_COUNT`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DcgmHealth {
    /// GPU UUID (a MIG instance's health is its parent GPU's).
    pub uuid: String,
    /// Highest status per health watch in the window (`THERMAL`, `POWER`, …): DCGM's health
    /// result, 0 pass, 10 warn, 20 fail; only watches above 0 are kept.
    pub watches: Vec<(String, f64)>,
    /// XID codes seen in the window (any count above 0), fatal or not.
    pub xids: Vec<u32>,
}

/// Window and threshold used to reduce samples.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub length: chrono::Duration,
    /// Sample spacing assumed only where the samples cannot show theirs (`--scrape-interval`):
    /// a device whose series each hold fewer than two samples, a start-up history read before
    /// any sample. Coverage and idle duration otherwise come from the samples' own timestamps.
    pub interval: chrono::Duration,
    /// Utilisation (0..1) at or above which a device counts as active.
    pub idle_threshold: f64,
    /// Samples older than this are stale.
    pub max_staleness: chrono::Duration,
}

/// One container's own readings on one vGPU over the window, from HAMi's vGPU monitor
/// (`hami_container_device_utilization_ratio` and its legacy name, percent 0–100;
/// `hami_container_last_kernel_elapsed_seconds`; `hami_vgpu_memory_used_bytes`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HamiContainerUsage {
    pub workload: Workload,
    pub container: String,
    /// `device_uuid` (a `[…]` suffix stripped).
    pub uuid: String,
    /// Highest utilisation in the window, 0..1 (readings above 100 % clamped to 1).
    pub peak: Option<f64>,
    /// Newest fresh utilisation, 0..1.
    pub utilization: Option<f64>,
    /// A reading above 100 % was seen (HAMi#555): clamped, and shown.
    pub over_100: bool,
    /// Share of the window the utilisation samples prove.
    pub coverage: f64,
    pub last_sample_at: Option<DateTime<Utc>>,
    /// Latest utilisation reading at or above the idle threshold.
    pub last_active_at: Option<DateTime<Utc>>,
    /// Newest last-kernel-elapsed reading: (sample time, seconds since the last kernel).
    pub last_kernel: Option<(DateTime<Utc>, f64)>,
    /// Whether that newest reading, fresh, puts the last kernel inside the window (`false`: at
    /// least a window ago); `None` without a fresh reading (no kernel ever: the series is absent).
    pub kernel_in_window: Option<bool>,
    /// Newest fresh memory used, bytes.
    pub memory_used_bytes: Option<f64>,
}
