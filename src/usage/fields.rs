//! DCGM field names we read, and the other spellings exporters and pipelines emit.
//!
//! Only the usage sources read these names; the ledger sees the [`crate::ledger::usage::Signal`]
//! they were reduced to.

pub const GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";

/// Every accepted metric name and the field it is. Lower-case `dcgm_fi_*` comes from
/// pipelines that lower-case everything (GKE managed DCGM, dcgm-exporter#577) and from
/// `--use-old-namespace`; `dcgm_gpu_utilization` and `dcgm_fb_used` are the 1.x names of
/// dcgm-exporter's `etc/1.x-compatibility-metrics.csv`.
pub const SPELLINGS: &[(&str, &str)] = &[
    (GR_ENGINE_ACTIVE, GR_ENGINE_ACTIVE),
    (GPU_UTIL, GPU_UTIL),
    (FB_USED, FB_USED),
    ("dcgm_fi_prof_gr_engine_active", GR_ENGINE_ACTIVE),
    ("dcgm_fi_dev_gpu_util", GPU_UTIL),
    ("dcgm_fi_dev_fb_used", FB_USED),
    ("dcgm_gpu_utilization", GPU_UTIL),
    ("dcgm_fb_used", FB_USED),
];

/// The field a metric name spells, if it is one we read.
pub fn canonical(name: &str) -> Option<&'static str> {
    SPELLINGS
        .iter()
        .find(|(spelling, _)| *spelling == name)
        .map(|(_, field)| *field)
}

/// Every accepted spelling (for selectors and dump filters).
pub fn all_spellings() -> impl Iterator<Item = &'static str> {
    SPELLINGS.iter().map(|(spelling, _)| *spelling)
}
