//! The one reduction of raw DCGM samples to per-device usage over a window.
//!
//! Every path feeds it the same thing — series of raw samples with their own timestamps: the
//! live service (samples fetched from Prometheus with `prom::PromClient::window`, decoded by
//! `prom::decode::window` and kept for the window), the offline report (an exposition dump), and the pre-stop re-check.
//! So live and offline conclusions cannot drift apart.
//!
//! Evidence rules: a sample counts only when it is a possible reading (finite, not a DCGM blank
//! sentinel, within the field's range: 0..1 for `GR_ENGINE_ACTIVE`, 0..100 for `GPU_UTIL`, ≥ 0
//! for `FB_USED`); anything else is unknown and gives no coverage. A device's peak is the highest
//! reading on ANY utilisation signal it reports and its coverage the LOWEST over them, so
//! conflicting signals (GPU_UTIL 90 % while GR_ENGINE_ACTIVE reads 0) never make it idle.
//!
//! Coverage and the covered run come from the samples' own timestamps, never from a configured
//! scrape interval (issue 36: 5 s scrapes read at an assumed 30 s made 143 s of samples look
//! like a full 10-minute window). A device's **sample interval** is inferred from its series
//! ([`own_interval_ms`]: the median positive spacing of each series' samples, the smallest over
//! the device's series, which one exporter scrape writes together), read from the samples in the
//! window, so the live source (which holds only those) and a dump agree; only a device whose
//! series all hold fewer than two samples in the window falls back to [`Window::interval`]
//! (`--scrape-interval`). A
//! signal's coverage is the lower of two shares ([`coverage`]): valid samples in the window over
//! the samples that interval expects, and the time those samples vouch for (each reading one
//! interval up to it, the newest also up to one interval after it) over the window. So coverage
//! × window never exceeds the time from one interval before the oldest sample to now, whatever
//! the scrape interval. The covered run tolerates gaps of up to two intervals.
//!
//! Sample times come from input (a dump, a Prometheus answer): every difference of two of them
//! saturates, so a sample at the far end of the i64 range cannot wrap a gap into a small one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use smallvec::SmallVec;

use super::fields;
use super::scheme::LabelScheme;
use crate::ledger::usage::{DeviceKey, DeviceUsage, OwnWindow, Signal, Window, Workload};

/// Label name → value (empty values are dropped at parse time).
pub type Labels = BTreeMap<String, String>;

/// One time series: metric name, labels, samples as (Unix milliseconds, value), sorted by time.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// Shared: the sample window holds one map for the several fields of a device.
    pub labels: Arc<Labels>,
    pub samples: Vec<(i64, f64)>,
}

/// Pod UID label; on `GPU_UTIL`/`FB_USED` next to a pod-less device series it marks per-process values.
pub const POD_UID_LABEL: &str = "pod_uid";
/// Scrape target address, added by Prometheus.
pub const INSTANCE_LABEL: &str = "instance";
/// Values above this are DCGM "blank" sentinels printed by old exporters, not readings.
pub(crate) const SENTINEL_FLOOR: f64 = 9.0e15;
/// Bytes per MiB (DCGM reports framebuffer in MiB).
pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// A reading: finite and not a DCGM blank sentinel.
pub(crate) fn usable(v: f64) -> bool {
    v.is_finite() && v.abs() < SENTINEL_FLOOR
}

/// The highest possible reading of `field`: 1 for `GR_ENGINE_ACTIVE`, 100 for `GPU_UTIL`, none
/// for the others. Looked up once per series, not per sample (the names compare as strings).
fn field_ceiling(field: &str) -> f64 {
    match field {
        fields::GR_ENGINE_ACTIVE => 1.0,
        fields::GPU_UTIL => 100.0,
        _ => f64::INFINITY,
    }
}

/// A possible reading (in the field's own unit) of the field whose ceiling is given
/// ([`field_ceiling`]), or unknown.
fn valid_below(ceiling: f64, v: f64) -> bool {
    usable(v) && v >= 0.0 && v <= ceiling
}

/// The workload a series names under `scheme`, if both pod and namespace are set.
pub fn workload_of(labels: &Labels, scheme: &LabelScheme) -> Option<Workload> {
    let pod = labels.get(scheme.pod)?;
    let namespace = labels.get(scheme.namespace)?;
    Some(Workload {
        namespace: namespace.clone(),
        pod: pod.clone(),
    })
}

/// Whether the series names a workload under `scheme` ([`workload_of`] without its copies).
fn names_workload(labels: &Labels, scheme: &LabelScheme) -> bool {
    labels.contains_key(scheme.pod) && labels.contains_key(scheme.namespace)
}

/// The exporter pod named by the scrape's target labels, when the workload labels are elsewhere.
fn exporter_of(labels: &Labels, scheme: &LabelScheme) -> Option<Workload> {
    if !scheme.exporter_labels {
        return None;
    }
    Some(Workload {
        namespace: labels.get("namespace")?.clone(),
        pod: labels.get("pod")?.clone(),
    })
}

fn key_of(labels: &Labels, scheme: &LabelScheme) -> Option<DeviceKey> {
    let uuid = labels.get(scheme.uuid)?;
    Some(DeviceKey {
        uuid: uuid.clone(),
        gpu_instance: labels.get(scheme.gpu_instance).cloned(),
    })
}

/// The series of one device, by field.
#[derive(Default)]
pub(crate) struct DeviceSeries<'a> {
    gr: SmallVec<[&'a Series; 2]>,
    util: SmallVec<[&'a Series; 2]>,
    fb: SmallVec<[&'a Series; 2]>,
}

/// Where one device's series sit in the slice [`group`] was given, by field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPositions {
    gr: SmallVec<[u32; 2]>,
    util: SmallVec<[u32; 2]>,
    fb: SmallVec<[u32; 2]>,
}

impl FieldPositions {
    /// The series at these positions of `series` (the slice they were grouped from).
    pub(crate) fn resolve<'a>(&self, series: &'a [Series]) -> DeviceSeries<'a> {
        let at = |positions: &SmallVec<[u32; 2]>| {
            positions
                .iter()
                .filter_map(|&i| series.get(i as usize))
                .collect()
        };
        DeviceSeries {
            gr: at(&self.gr),
            util: at(&self.util),
            fb: at(&self.fb),
        }
    }
}

/// Groups series by device under `scheme`: per device, sorted by key, the positions of its
/// series by field. Series of other metrics, and series without a device UUID, are left out.
pub fn group(series: &[Series], scheme: &LabelScheme) -> Vec<(DeviceKey, FieldPositions)> {
    let mut by_device: BTreeMap<DeviceKey, FieldPositions> = BTreeMap::new();
    for (i, s) in series.iter().enumerate() {
        let Some(field) = fields::canonical(&s.name) else {
            continue;
        };
        let (Some(key), Ok(i)) = (key_of(&s.labels, scheme), u32::try_from(i)) else {
            continue;
        };
        let entry = by_device.entry(key).or_default();
        match field {
            fields::GR_ENGINE_ACTIVE => entry.gr.push(i),
            fields::GPU_UTIL => entry.util.push(i),
            _ => entry.fb.push(i),
        }
    }
    by_device.into_iter().collect()
}

/// Reduces raw series to one [`DeviceUsage`] per device (sorted by key), as seen at `now`.
/// Series of other metrics, and series without a device UUID, are ignored. The live refresh
/// reduces the same way from groups it keeps between refreshes (`usage::running`).
pub fn reduce(
    series: &[Series],
    scheme: &LabelScheme,
    window: &Window,
    now: DateTime<Utc>,
) -> Vec<DeviceUsage> {
    let now_ms = now.timestamp_millis();
    group(series, scheme)
        .into_iter()
        .map(|(key, positions)| {
            reduce_device(key, &positions.resolve(series), scheme, window, now_ms)
        })
        .collect()
}

/// Renames every series of a dump to its field's internal name and converts its samples to the
/// field's internal unit ([`fields::convert_samples`]; series of other names are left as they
/// are), as the window decoder does for every live read (`prom::decode::window`): the offline
/// report then reads legacy and DCGM 4.7 names alike. `capture` keeps the names it was answered
/// with.
pub fn to_internal_fields(series: &mut [Series]) {
    for s in series {
        if let Some(field) = fields::convert_samples(&s.name, &mut s.samples) {
            field.clone_into(&mut s.name);
        }
    }
}

/// Splits per-process series (pod-labelled with `pod_uid` beside a pod-less device series) from
/// the device-level ones.
fn split_per_process<'a>(
    list: &[&'a Series],
    scheme: &LabelScheme,
) -> (SmallVec<[&'a Series; 2]>, SmallVec<[&'a Series; 2]>) {
    let has_device_level = list.iter().any(|s| !names_workload(&s.labels, scheme));
    list.iter().copied().partition(|s| {
        !(has_device_level
            && s.labels.contains_key(POD_UID_LABEL)
            && names_workload(&s.labels, scheme))
    })
}

/// A series' own sample spacing in ms: the (lower) median of the positive differences between
/// consecutive sample times in the window `(start_ms, now_ms]` (the samples the live source
/// holds, so a dump reaching further back reads the same). Every sample counts, readable or not (a blank
/// reading still shows a scrape). The median stands a missed scrape (one doubled gap among
/// many), scrape jitter and a stray duplicate; of two middle gaps the smaller is taken, so a
/// short series with one missed scrape is not read as scraped half as often. `None` with fewer
/// than two distinct times.
pub fn own_interval_ms(samples: &[(i64, f64)], start_ms: i64, now_ms: i64) -> Option<i64> {
    let from = samples.partition_point(|(t, _)| *t <= start_ms);
    let upto = samples.partition_point(|(t, _)| *t <= now_ms).max(from);
    // A window's worth of gaps fits on the stack (40 at 15 s over 10 minutes).
    let mut gaps: SmallVec<[i64; 64]> = samples[from..upto]
        .windows(2)
        .filter_map(|w| w[1].0.checked_sub(w[0].0))
        .filter(|gap| *gap > 0)
        .collect();
    if gaps.is_empty() {
        return None;
    }
    let mid = (gaps.len() - 1) / 2;
    Some(*gaps.select_nth_unstable(mid).1)
}

/// The sample interval of a device (ms): the smallest [`own_interval_ms`] over its series (the
/// fields of a device come from one scrape, so a field seen less often has missed samples, not
/// a slower scrape), else `window.interval` when no series shows its spacing.
fn device_interval_ms<'a>(
    series: impl IntoIterator<Item = &'a Series>,
    window: &Window,
    start_ms: i64,
    now_ms: i64,
) -> i64 {
    series
        .into_iter()
        .filter_map(|s| own_interval_ms(&s.samples, start_ms, now_ms))
        .min()
        .unwrap_or_else(|| window.interval.num_milliseconds())
        .max(1)
}

/// The share of the window `(start_ms, now_ms]` that valid sample times `times` (ascending, in
/// the window) prove at spacing `interval_ms`: the lower of the samples counted over those
/// expected (`window ÷ interval`, at least 1) and the time the samples vouch for over the window.
/// A sample at `t` vouches for `(t − interval, t]`, the newest also for up to one interval after
/// it (its successor is not due yet); overlaps count once. Capped at 1.
pub(crate) fn coverage(
    times: impl Iterator<Item = i64>,
    start_ms: i64,
    now_ms: i64,
    interval_ms: i64,
) -> f64 {
    let length_ms = now_ms.saturating_sub(start_ms).max(1);
    let interval_ms = interval_ms.max(1);
    let expected = (length_ms as f64 / interval_ms as f64).floor().max(1.0);
    let mut count = 0_u64;
    let mut vouched_ms = 0_i64;
    let mut previous = start_ms;
    let mut newest = None;
    for t in times {
        count += 1;
        vouched_ms = vouched_ms.saturating_add(t.saturating_sub(previous).clamp(0, interval_ms));
        previous = t;
        newest = Some(t);
    }
    if let Some(n) = newest {
        vouched_ms = vouched_ms.saturating_add(now_ms.saturating_sub(n).clamp(0, interval_ms));
    }
    let by_count = count as f64 / expected;
    let by_time = vouched_ms as f64 / length_ms as f64;
    by_count.min(by_time).min(1.0)
}

/// Walks back from the newest sample while gaps stay within two sample intervals.
fn covered_since(merged: &[(i64, f64)], interval_ms: i64) -> Option<i64> {
    let max_gap = interval_ms.saturating_mul(2);
    let mut times = merged.iter().rev().map(|(t, _)| *t);
    let mut start = times.next()?;
    for t in times {
        if start.saturating_sub(t) > max_gap {
            break;
        }
        start = t;
    }
    Some(start)
}

/// One utilisation signal of a device: its valid samples merged over every series (time-slice
/// copies, label changes) by time, scaled to 0..1.
struct SignalSamples {
    signal: Signal,
    /// Ascending by time, one entry per time (the highest reading of the series at that time).
    merged: Vec<(i64, f64)>,
}

impl SignalSamples {
    fn new(signal: Signal, field: &str, scale: f64, list: &[&Series], now_ms: i64) -> Option<Self> {
        if list.is_empty() {
            return None;
        }
        let ceiling = field_ceiling(field);
        let mut merged: Vec<(i64, f64)> = list
            .iter()
            .flat_map(|s| s.samples.iter())
            .filter(|(t, v)| *t <= now_ms && valid_below(ceiling, *v))
            .map(|&(t, v)| (t, v * scale))
            .collect();
        // One series held by the window (the common case) is already in time order.
        if !merged.is_sorted_by_key(|(t, _)| *t) {
            merged.sort_unstable_by_key(|(t, _)| *t);
        }
        merged.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.max(later.1);
            }
            same
        });
        Some(SignalSamples { signal, merged })
    }

    fn in_window(&self, start_ms: i64, now_ms: i64) -> impl Iterator<Item = f64> + '_ {
        self.window_samples(start_ms, now_ms).map(|(_, v)| v)
    }

    /// The samples in `(start_ms, now_ms]`, oldest first.
    fn window_samples(&self, start_ms: i64, now_ms: i64) -> impl Iterator<Item = (i64, f64)> + '_ {
        let from = self.merged.partition_point(|(t, _)| *t <= start_ms);
        let upto = self.merged.partition_point(|(t, _)| *t <= now_ms).max(from);
        self.merged[from..upto].iter().copied()
    }

    /// The newest sample.
    fn newest(&self) -> Option<(i64, f64)> {
        self.merged.last().copied()
    }

    /// The newest sample at or above `threshold`.
    fn last_at_least(&self, threshold: f64) -> Option<i64> {
        self.merged
            .iter()
            .rev()
            .find(|(_, v)| *v >= threshold)
            .map(|(t, _)| *t)
    }

    /// [`coverage`] of this signal's window at the device's interval.
    fn coverage(&self, start_ms: i64, now_ms: i64, interval_ms: i64) -> f64 {
        coverage(
            self.window_samples(start_ms, now_ms).map(|(t, _)| t),
            start_ms,
            now_ms,
            interval_ms,
        )
    }
}

/// The newest sample at or before `now_ms` of a series that is a possible reading of `field`.
fn newest_valid(s: &Series, field: &str, now_ms: i64) -> Option<(i64, f64)> {
    let ceiling = field_ceiling(field);
    s.samples
        .iter()
        .rev()
        .find(|(t, v)| *t <= now_ms && valid_below(ceiling, *v))
        .copied()
}

/// Each sharer's own per-process `GPU_UTIL` over the window (its series merged by time, as a
/// device's signal is, judged at the device's interval), sorted by workload.
fn own_windows(
    list: &[&Series],
    scheme: &LabelScheme,
    window: &Window,
    interval_ms: i64,
    now_ms: i64,
) -> Vec<OwnWindow> {
    let start_ms = now_ms.saturating_sub(window.length.num_milliseconds());
    let mut by_pod: BTreeMap<Workload, Vec<&Series>> = BTreeMap::new();
    for s in list {
        if let Some(w) = workload_of(&s.labels, scheme) {
            by_pod.entry(w).or_default().push(s);
        }
    }
    let at = |t: Option<i64>| t.and_then(DateTime::from_timestamp_millis);
    by_pod
        .into_iter()
        .filter_map(|(workload, series)| {
            let own = SignalSamples::new(Signal::GpuUtil, fields::GPU_UTIL, 0.01, &series, now_ms)?;
            let peak = own
                .in_window(start_ms, now_ms)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            Some(OwnWindow {
                workload,
                peak,
                coverage: own.coverage(start_ms, now_ms, interval_ms),
                last_sample_at: at(own.newest().map(|(t, _)| t)),
                last_active_at: at(own.last_at_least(window.idle_threshold)),
                covered_since: at(covered_since(&own.merged, interval_ms)),
            })
        })
        .collect()
}

pub(crate) fn reduce_device(
    key: DeviceKey,
    dev: &DeviceSeries<'_>,
    scheme: &LabelScheme,
    window: &Window,
    now_ms: i64,
) -> DeviceUsage {
    let start_ms = now_ms.saturating_sub(window.length.num_milliseconds());
    let fresh = |t: i64| now_ms.saturating_sub(t) <= window.max_staleness.num_milliseconds();
    let interval_ms = device_interval_ms(
        dev.gr.iter().chain(&dev.util).chain(&dev.fb).copied(),
        window,
        start_ms,
        now_ms,
    );
    let (util_device, util_per_pod) = split_per_process(&dev.util, scheme);
    let (fb_device, fb_per_pod) = split_per_process(&dev.fb, scheme);
    // Preferred signal first: GR_ENGINE_ACTIVE where present (it also works per MIG instance).
    let signals: Vec<SignalSamples> = [
        SignalSamples::new(
            Signal::GrEngineActive,
            fields::GR_ENGINE_ACTIVE,
            1.0,
            &dev.gr,
            now_ms,
        ),
        SignalSamples::new(
            Signal::GpuUtil,
            fields::GPU_UTIL,
            0.01,
            &util_device,
            now_ms,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let preferred = signals.first();
    let last = preferred.and_then(SignalSamples::newest);
    let utilization = last.filter(|(t, _)| fresh(*t)).map(|(_, v)| v);
    let peak = signals
        .iter()
        .flat_map(|s| s.in_window(start_ms, now_ms))
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let coverage = signals
        .iter()
        .map(|s| s.coverage(start_ms, now_ms, interval_ms))
        .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))))
        .unwrap_or(0.0);
    let last_active_at = signals
        .iter()
        .filter_map(|s| s.last_at_least(window.idle_threshold))
        .max()
        .and_then(DateTime::from_timestamp_millis);
    // The covered run of the device is where every signal's run overlaps: the latest start.
    let covered_since = signals
        .iter()
        .map(|s| covered_since(&s.merged, interval_ms))
        .try_fold(None, |m: Option<i64>, c| {
            c.map(|c| Some(m.map_or(c, |m| m.max(c))))
        })
        .flatten()
        .and_then(DateTime::from_timestamp_millis);

    // Current holders: workloads on the series whose newest sample is the device's newest sample
    // over every field, so a pod named only by some fields (FB_USED on MIG without profiling
    // metrics) is still the holder.
    let holder_series: SmallVec<[(&Series, &str); 4]> = dev
        .gr
        .iter()
        .map(|s| (*s, fields::GR_ENGINE_ACTIVE))
        .chain(util_device.iter().map(|s| (*s, fields::GPU_UTIL)))
        .chain(fb_device.iter().map(|s| (*s, fields::FB_USED)))
        .collect();
    let newest_of: SmallVec<[Option<i64>; 4]> = holder_series
        .iter()
        .map(|(s, f)| newest_valid(s, f, now_ms).map(|(t, _)| t))
        .collect();
    let newest = newest_of.iter().flatten().max().copied();
    let mut workloads = BTreeSet::new();
    for ((s, _), t) in holder_series.iter().zip(&newest_of) {
        if newest.is_some()
            && *t == newest
            && let Some(w) = workload_of(&s.labels, scheme)
        {
            workloads.insert(w);
        }
    }
    let mut per_pod_utilization: Vec<(Workload, f64)> = util_per_pod
        .iter()
        .filter_map(|s| {
            let (t, v) = newest_valid(s, fields::GPU_UTIL, now_ms)?;
            (fresh(t)).then(|| workload_of(&s.labels, scheme).map(|w| (w, v * 0.01)))?
        })
        .collect();
    per_pod_utilization.sort_by(|a, b| a.0.cmp(&b.0));
    let mut per_pod_memory_bytes: Vec<(Workload, f64)> = fb_per_pod
        .iter()
        .filter_map(|s| {
            let (t, v) = newest_valid(s, fields::FB_USED, now_ms)?;
            (fresh(t)).then(|| workload_of(&s.labels, scheme).map(|w| (w, v * MIB)))?
        })
        .collect();
    per_pod_memory_bytes.sort_by(|a, b| a.0.cmp(&b.0));
    let per_pod_windows = own_windows(&util_per_pod, scheme, window, interval_ms, now_ms);
    let memory_used_bytes = fb_device
        .iter()
        .filter_map(|s| newest_valid(s, fields::FB_USED, now_ms))
        .max_by_key(|(t, _)| *t)
        .filter(|(t, _)| fresh(*t))
        .map(|(_, mib)| mib * MIB);
    // Descriptive labels from the newest series (identity labels can change over the window).
    let describing = holder_series
        .iter()
        .zip(&newest_of)
        .max_by_key(|(_, t)| **t)
        .map(|((s, _), _)| *s)
        .or_else(|| {
            dev.gr
                .first()
                .or(dev.util.first())
                .or(dev.fb.first())
                .copied()
        });
    let label = |name: &str| describing.and_then(|s| s.labels.get(name).cloned());
    DeviceUsage {
        key,
        hostname: label(scheme.hostname),
        exporter: describing.and_then(|s| exporter_of(&s.labels, scheme)),
        instance: label(INSTANCE_LABEL),
        model: label(scheme.model),
        mig_profile: label(scheme.gpu_profile),
        mig_uuid: label(super::scheme::DRA_MIG_UUID_LABEL),
        workloads: workloads.into_iter().collect(),
        per_pod_utilization,
        per_pod_memory_bytes,
        per_pod_windows,
        signal: preferred.map(|s| s.signal),
        utilization,
        peak,
        coverage,
        last_sample_at: newest.and_then(DateTime::from_timestamp_millis),
        memory_used_bytes,
        last_active_at,
        covered_since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000_000;

    fn window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    fn series(name: &str, labels: &[(&str, &str)], samples: &[(i64, f64)]) -> Series {
        Series {
            name: name.into(),
            labels: Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            ),
            samples: samples.to_vec(),
        }
    }

    fn every_30s(minutes: i64, value: f64) -> Vec<(i64, f64)> {
        (0..=minutes * 2)
            .map(|i| (T0 - i * 30_000, value))
            .rev()
            .collect()
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp_millis(T0).expect("valid")
    }

    #[test]
    fn prefers_gr_engine_active_and_scales_gpu_util() {
        let s = vec![
            series(
                fields::GPU_UTIL,
                &[("UUID", "GPU-a"), ("pod", "p"), ("namespace", "ns")],
                &every_30s(10, 40.0),
            ),
            series(
                fields::GR_ENGINE_ACTIVE,
                &[("UUID", "GPU-a"), ("pod", "p"), ("namespace", "ns")],
                &every_30s(10, 0.5),
            ),
            series(fields::GPU_UTIL, &[("UUID", "GPU-b")], &every_30s(10, 40.0)),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].signal, Some(Signal::GrEngineActive));
        assert_eq!(d[0].utilization, Some(0.5));
        assert_eq!(
            d[0].workloads,
            vec![Workload {
                namespace: "ns".into(),
                pod: "p".into()
            }]
        );
        assert_eq!(d[1].signal, Some(Signal::GpuUtil));
        assert_eq!(d[1].utilization, Some(0.4));
        assert!((d[1].coverage - 1.0).abs() < 1e-9);
    }

    #[test]
    fn nan_and_missing_are_unknown_not_zero() {
        let s = vec![series(
            fields::GR_ENGINE_ACTIVE,
            &[("UUID", "GPU-a")],
            &[(T0, f64::NAN)],
        )];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(d[0].utilization, None);
        assert_eq!(d[0].peak, None);
        assert_eq!(d[0].coverage, 0.0);
        // A stale sample is no current reading either.
        let s = vec![series(
            fields::GR_ENGINE_ACTIVE,
            &[("UUID", "GPU-a")],
            &[(T0 - 600_000, 0.0)],
        )];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(d[0].utilization, None);
    }

    #[test]
    fn per_process_series_are_split_from_device_level() {
        let s = vec![
            series(fields::GPU_UTIL, &[("UUID", "GPU-t")], &[(T0, 63.0)]),
            series(
                fields::GPU_UTIL,
                &[
                    ("UUID", "GPU-t"),
                    ("pod", "a"),
                    ("namespace", "x"),
                    ("pod_uid", "u1"),
                    ("vgpu", "0"),
                ],
                &[(T0, 58.0)],
            ),
            series(
                fields::GPU_UTIL,
                &[
                    ("UUID", "GPU-t"),
                    ("pod", "b"),
                    ("namespace", "y"),
                    ("pod_uid", "u2"),
                    ("vgpu", "2"),
                ],
                &[(T0, 0.0)],
            ),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].utilization, Some(0.63));
        assert_eq!(d[0].per_pod_utilization.len(), 2);
        assert!(
            d[0].per_pod_utilization
                .iter()
                .any(|(w, v)| w.pod == "a" && (*v - 0.58).abs() < 1e-9)
        );
    }

    #[test]
    fn history_gives_last_active_and_first_seen() {
        let mut samples = every_30s(60, 0.0);
        let i = samples.len() - 41; // 20 minutes ago
        samples[i].1 = 0.9;
        let s = vec![series(
            fields::GR_ENGINE_ACTIVE,
            &[("UUID", "GPU-a")],
            &samples,
        )];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(
            d[0].last_active_at.map(|t| t.timestamp_millis()),
            Some(T0 - 20 * 60_000)
        );
        assert_eq!(
            d[0].covered_since.map(|t| t.timestamp_millis()),
            Some(T0 - 60 * 60_000)
        );
        assert_eq!(d[0].peak, Some(0.0));
        // A gap of five minutes breaks the covered run.
        let gapped: Vec<(i64, f64)> = samples
            .iter()
            .copied()
            .filter(|(t, _)| !(T0 - 35 * 60_000..T0 - 30 * 60_000).contains(t))
            .collect();
        let s = vec![series(
            fields::GR_ENGINE_ACTIVE,
            &[("UUID", "GPU-a")],
            &gapped,
        )];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(
            d[0].covered_since.map(|t| t.timestamp_millis()),
            Some(T0 - 30 * 60_000)
        );
    }

    #[test]
    fn conflicting_signals_never_make_a_device_idle() {
        // GPU_UTIL says 90 % while GR_ENGINE_ACTIVE reads 0: the device is busy.
        let labels = [("UUID", "GPU-c"), ("pod", "p"), ("namespace", "ns")];
        let s = vec![
            series(fields::GR_ENGINE_ACTIVE, &labels, &every_30s(10, 0.0)),
            series(fields::GPU_UTIL, &labels, &every_30s(10, 90.0)),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(d[0].signal, Some(Signal::GrEngineActive));
        assert_eq!(d[0].utilization, Some(0.0), "shown: the preferred signal");
        assert_eq!(d[0].peak, Some(0.9), "judged: every signal");
        assert_eq!(d[0].last_active_at.map(|t| t.timestamp_millis()), Some(T0));
        // A second signal with thin coverage thins the device's coverage.
        let sparse: Vec<(i64, f64)> = every_30s(10, 0.0).into_iter().step_by(4).collect();
        let s = vec![
            series(fields::GR_ENGINE_ACTIVE, &labels, &every_30s(10, 0.0)),
            series(fields::GPU_UTIL, &labels, &sparse),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert!(d[0].coverage < 0.5, "{}", d[0].coverage);
    }

    #[test]
    fn impossible_values_are_unknown() {
        let labels = [("UUID", "GPU-n")];
        let mut samples = every_30s(10, 0.0);
        for s in samples.iter_mut().skip(1).step_by(2) {
            s.1 = -1.0;
        }
        let s = vec![
            series(fields::GR_ENGINE_ACTIVE, &labels, &samples),
            series(
                fields::GPU_UTIL,
                &[("UUID", "GPU-m")],
                &every_30s(10, 250.0),
            ),
            series(fields::FB_USED, &[("UUID", "GPU-m")], &[(T0, -5.0)]),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        let m = &d[0];
        assert_eq!(m.key.uuid, "GPU-m");
        assert_eq!((m.utilization, m.peak, m.coverage), (None, None, 0.0));
        assert_eq!(m.memory_used_bytes, None);
        let n = &d[1];
        assert!(
            (n.coverage - 0.5).abs() < 0.06,
            "negative readings give no coverage: {}",
            n.coverage
        );
        assert_eq!(n.peak, Some(0.0));
    }

    #[test]
    fn extreme_sample_times_neither_panic_nor_stretch_the_history() {
        // Thirty minutes of idle samples, plus samples at the ends of the i64 range (a hostile
        // dump or answer): the covered run stays thirty minutes, nothing wraps or panics.
        let mut samples = vec![(i64::MIN, 0.0), (i64::MIN + 1, 0.0)];
        samples.extend(every_30s(30, 0.0));
        samples.push((i64::MAX - 1, 0.9));
        samples.push((i64::MAX, 0.9));
        let s = vec![
            series(fields::GR_ENGINE_ACTIVE, &[("UUID", "GPU-x")], &samples),
            series(fields::GPU_UTIL, &[("UUID", "GPU-x")], &samples),
        ];
        let d = reduce(&s, &LabelScheme::default(), &window(), now());
        assert_eq!(
            d[0].covered_since.map(|t| t.timestamp_millis()),
            Some(T0 - 30 * 60_000)
        );
        assert_eq!(d[0].last_active_at, None);
        assert_eq!(d[0].utilization, Some(0.0));
        // Seen from the far ends of time, too.
        for at in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
            let d = reduce(&s, &LabelScheme::default(), &window(), at);
            assert_eq!(d.len(), 1);
        }
    }

    mod merged_signal {
        use proptest::prelude::*;

        use super::*;

        /// The merge as it was written before the refresh's reduction was made allocation-lean:
        /// a `BTreeMap` by time keeping the highest reading. Kept as the reference.
        fn reference(list: &[&Series], field: &str, scale: f64, now_ms: i64) -> Vec<(i64, f64)> {
            let mut merged: BTreeMap<i64, f64> = BTreeMap::new();
            for s in list {
                for &(t, v) in &s.samples {
                    if t > now_ms || !valid_below(field_ceiling(field), v) {
                        continue;
                    }
                    let v = v * scale;
                    merged.entry(t).and_modify(|m| *m = m.max(v)).or_insert(v);
                }
            }
            merged.into_iter().collect()
        }

        fn sample() -> impl Strategy<Value = (i64, f64)> {
            (
                0_i64..40,
                prop_oneof![
                    0.0..=100.0_f64,
                    Just(f64::NAN),
                    Just(-1.0),
                    Just(150.0),
                    Just(9.5e15)
                ],
            )
                .prop_map(|(t, v)| (T0 + t * 5_000, v))
        }

        proptest! {
            /// Time-slice copies and restarted series overlap in time, unsorted dumps and
            /// duplicate times included: the merged signal is the reference's.
            #[test]
            fn equals_the_reference_merge(
                lists in prop::collection::vec(prop::collection::vec(sample(), 0..30), 1..4),
                sorted in any::<bool>(),
                now_step in 0_i64..40,
            ) {
                let series: Vec<Series> = lists
                    .into_iter()
                    .map(|mut samples| {
                        if sorted {
                            samples.sort_by_key(|(t, _)| *t);
                            samples.dedup_by_key(|(t, _)| *t);
                        }
                        Series {
                            name: fields::GPU_UTIL.into(),
                            labels: Arc::default(),
                            samples,
                        }
                    })
                    .collect();
                let list: Vec<&Series> = series.iter().collect();
                let now_ms = T0 + now_step * 5_000;
                let merged =
                    SignalSamples::new(Signal::GpuUtil, fields::GPU_UTIL, 0.01, &list, now_ms)
                        .expect("a signal")
                        .merged;
                prop_assert_eq!(merged, reference(&list, fields::GPU_UTIL, 0.01, now_ms));
            }
        }
    }
}
