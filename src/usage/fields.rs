//! The DCGM fields we read, by meaning: one table maps every accepted metric name to the field it
//! measures and the factor from its unit to the field's internal unit.
//!
//! Only the usage sources read these names; the ledger sees the [`crate::ledger::usage::Signal`]
//! they were reduced to. Every source converts a series to its field's internal name and unit as
//! it reads it ([`to_internal`]: the dump reader, the Prometheus window decoder), so the reduction
//! merges the same device's samples under an old and a new name into one signal: a node whose
//! dcgm-exporter is upgraded mid-window reads as if nothing had changed. The start-up history
//! query takes each spelling's threshold in its own unit ([`Spelling::scale`]).
//!
//! The internal unit of each field is its legacy unit (what the reduction's evidence rules are
//! written for): `GR_ENGINE_ACTIVE` a 0..1 ratio, `GPU_UTIL` a 0..100 percentage, `FB_USED` MiB.
//!
//! Sources of the names (fixtures cite them too, `tests/fixtures/dcgm-renamed/README.md`):
//! NVIDIA's DCGM field identifiers (DCGM 4.7: `DCGM_FI_DEV_GPU_UTIL_RATIO` 1613, a 0–1 double
//! beside the integer percent of 203; `DCGM_FI_DEV_FB_USED_BYTES` 1627, bytes beside the MiB of
//! 252; `DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO` 1001, the field `DCGM_FI_PROF_GR_ENGINE_ACTIVE` names);
//! go-dcgm's `pkg/dcgm/alias_resolution_test.go` (legacy → current pairs, lower-case `dcgm_*`
//! spellings) and `pkg/dcgm/legacy_fields.csv`; dcgm-exporter's `etc/default-counters.csv`,
//! `etc/dcp-metrics-included.csv` and `etc/1.x-compatibility-metrics.csv`.

/// `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (field 1001): a 0..1 ratio. Internal name of the field.
pub const GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
/// `DCGM_FI_DEV_GPU_UTIL` (field 203): a 0..100 percentage. Internal name of the field.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// `DCGM_FI_DEV_FB_USED` (field 252): MiB. Internal name of the field.
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";

// Health layer (issue 39, sick cards): dcgm-exporter's health families (commented out in its
// default counters CSV; `internal/pkg/counters/const.go` names them).
/// `DCGM_EXP_GPU_HEALTH_STATUS`: one series per GPU per health watch (label [`HEALTH_WATCH_LABEL`]),
/// DCGM's health result (0 pass, 10 warn, 20 fail).
pub const GPU_HEALTH_STATUS: &str = "DCGM_EXP_GPU_HEALTH_STATUS";
/// `DCGM_EXP_XID_ERRORS_COUNT`: XIDs per GPU per code (label [`XID_LABEL`]) in the exporter's
/// window, a windowed gauge (read with `max_over_time`, never `increase`).
pub const XID_ERRORS_COUNT: &str = "DCGM_EXP_XID_ERRORS_COUNT";
/// The health watch of a [`GPU_HEALTH_STATUS`] series (`THERMAL`, `POWER`, `ALL`, …).
pub const HEALTH_WATCH_LABEL: &str = "health_watch";
/// The XID code of a [`XID_ERRORS_COUNT`] series.
pub const XID_LABEL: &str = "xid";

/// Bytes per MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// One accepted metric name: the field it measures (an internal name above) and the factor
/// that turns its values into the field's internal unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spelling {
    pub name: &'static str,
    pub field: &'static str,
    /// Internal value = value × scale.
    pub scale: f64,
}

const fn spelling(name: &'static str, field: &'static str, scale: f64) -> Spelling {
    Spelling { name, field, scale }
}

/// Every accepted metric name. Lower-case `dcgm_fi_*` comes from pipelines that lower-case
/// everything (GKE managed DCGM, dcgm-exporter#577) and from `--use-old-namespace`;
/// `dcgm_gpu_utilization` and `dcgm_fb_used` are the 1.x names of dcgm-exporter's
/// `etc/1.x-compatibility-metrics.csv` (go-dcgm's `legacy_fields.csv` maps them to 203 and 252).
/// The DCGM 4.7 canonical names carry their own units: a ratio where the legacy field was a
/// percentage, bytes where it was MiB.
pub const SPELLINGS: &[Spelling] = &[
    // Legacy (dcgm-exporter's default CSVs up to 4.8).
    spelling(GR_ENGINE_ACTIVE, GR_ENGINE_ACTIVE, 1.0),
    spelling(GPU_UTIL, GPU_UTIL, 1.0),
    spelling(FB_USED, FB_USED, 1.0),
    spelling("dcgm_fi_prof_gr_engine_active", GR_ENGINE_ACTIVE, 1.0),
    spelling("dcgm_fi_dev_gpu_util", GPU_UTIL, 1.0),
    spelling("dcgm_fi_dev_fb_used", FB_USED, 1.0),
    // dcgm-exporter 1.x.
    spelling("dcgm_gpu_utilization", GPU_UTIL, 1.0),
    spelling("dcgm_fb_used", FB_USED, 1.0),
    // DCGM 4.7 canonical names (dcgm-exporter 4.9's defaults, or any custom counters CSV).
    spelling("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", GR_ENGINE_ACTIVE, 1.0),
    spelling("DCGM_FI_DEV_GPU_UTIL_RATIO", GPU_UTIL, 100.0),
    spelling("DCGM_FI_DEV_FB_USED_BYTES", FB_USED, 1.0 / MIB),
    spelling("dcgm_fi_prof_gr_engine_util_ratio", GR_ENGINE_ACTIVE, 1.0),
    spelling("dcgm_fi_dev_gpu_util_ratio", GPU_UTIL, 100.0),
    spelling("dcgm_fi_dev_fb_used_bytes", FB_USED, 1.0 / MIB),
];

/// The accepted spelling `name` is, if it is one we read.
pub fn spelling_of(name: &str) -> Option<&'static Spelling> {
    SPELLINGS.iter().find(|s| s.name == name)
}

/// The field a metric name spells (its internal name), if it is one we read.
pub fn canonical(name: &str) -> Option<&'static str> {
    spelling_of(name).map(|s| s.field)
}

/// The internal name of `name`'s field and the factor to its internal unit, if we read it.
pub fn to_internal(name: &str) -> Option<(&'static str, f64)> {
    spelling_of(name).map(|s| (s.field, s.scale))
}

/// Converts `samples` of a series named `name` to the field's internal unit in place, and returns
/// the field's internal name (`None`, samples untouched: not a field we read). A value that is no
/// reading (NaN, a DCGM blank sentinel) stays what it was, so the reduction still refuses it.
pub fn convert_samples(name: &str, samples: &mut [(i64, f64)]) -> Option<&'static str> {
    let (field, scale) = to_internal(name)?;
    // A scale of 1 (every legacy spelling) leaves every reading as it is.
    for (_, v) in samples.iter_mut() {
        if v.is_finite() && v.abs() < BLANK_FLOOR {
            *v *= scale;
        }
    }
    Some(field)
}

/// Values at or above this are DCGM "blank" sentinels, not readings (as the reduction's
/// `SENTINEL_FLOOR`): scaled, a sentinel in bytes could fall below it and pass as a reading.
const BLANK_FLOOR: f64 = 9.0e15;

/// Every accepted spelling (for selectors and dump filters).
pub fn all_spellings() -> impl Iterator<Item = &'static str> {
    SPELLINGS.iter().map(|s| s.name)
}

/// The accepted spellings of `field` (an internal name).
pub fn spellings_of(field: &str) -> impl Iterator<Item = &'static Spelling> + '_ {
    SPELLINGS.iter().filter(move |s| s.field == field)
}

/// HAMi's vGPU monitor (`cmd/vGPUmonitor/metrics.go` of Project-HAMi/HAMi): one container's
/// SM utilisation on one vGPU, in percent 0–100 despite the name (HAMi's own test stubs
/// `smUtil: 42` and expects 42; HAMi#555 reports values above 100). Internal name of the field.
pub const HAMI_UTIL: &str = "hami_container_device_utilization_ratio";
/// Seconds since the container's last kernel on the vGPU; emitted only once it ran one.
pub const HAMI_LAST_KERNEL: &str = "hami_container_last_kernel_elapsed_seconds";
/// The container's device memory on the vGPU, bytes.
pub const HAMI_MEMORY: &str = "hami_vgpu_memory_used_bytes";

/// Every HAMi monitor name read, with its field: the current `hami_*` names (labels
/// `namespace, pod, container, vdevice_index, device_uuid`) and the legacy ones of
/// `initLegacyDescriptors` (`--legacy-metrics`; labels `podnamespace, podname, ctrname,
/// vdeviceid, deviceuuid`), in the same units. A node mid-upgrade reports both; they merge.
pub const HAMI_SPELLINGS: &[(&str, &str)] = &[
    (HAMI_UTIL, HAMI_UTIL),
    (HAMI_LAST_KERNEL, HAMI_LAST_KERNEL),
    (HAMI_MEMORY, HAMI_MEMORY),
    ("Device_utilization_desc_of_container", HAMI_UTIL),
    ("Device_last_kernel_of_container", HAMI_LAST_KERNEL),
    ("vGPU_device_memory_usage_in_bytes", HAMI_MEMORY),
];

/// The HAMi field a metric name spells, if it is one we read.
pub fn hami_field(name: &str) -> Option<&'static str> {
    HAMI_SPELLINGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

/// Every name the window reads and a dump keeps: the DCGM spellings, then HAMi's.
pub fn read_names() -> impl Iterator<Item = &'static str> {
    all_spellings().chain(HAMI_SPELLINGS.iter().map(|(n, _)| *n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_names_a_field_once_and_scales_to_its_unit() {
        let mut names: Vec<&str> = all_spellings().collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SPELLINGS.len(), "a name is listed twice");
        for s in SPELLINGS {
            assert!(
                [GR_ENGINE_ACTIVE, GPU_UTIL, FB_USED].contains(&s.field),
                "{s:?}"
            );
            assert_eq!(canonical(s.field), Some(s.field), "{s:?}");
        }
        // 42 % as a ratio, 2 GiB in bytes: the legacy units inside.
        let mut util = vec![(1, 0.42)];
        assert_eq!(
            convert_samples("DCGM_FI_DEV_GPU_UTIL_RATIO", &mut util),
            Some(GPU_UTIL)
        );
        assert!((util[0].1 - 42.0).abs() < 1e-9, "{util:?}");
        let mut fb = vec![(1, 2.0 * 1024.0 * MIB), (2, f64::NAN), (3, 9.5e15)];
        assert_eq!(
            convert_samples("dcgm_fi_dev_fb_used_bytes", &mut fb),
            Some(FB_USED)
        );
        assert_eq!(fb[0].1, 2048.0);
        assert!(fb[1].1.is_nan());
        assert_eq!(fb[2].1, 9.5e15, "a blank sentinel stays a sentinel");
        assert_eq!(convert_samples("DCGM_FI_DEV_GPU_TEMP", &mut fb), None);
        assert_eq!(
            canonical("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
            Some(GR_ENGINE_ACTIVE)
        );
    }
}
