//! Reduction of raw DCGM samples (offline dumps) to per-device usage over a window.
//!
//! The live path asks Prometheus for the same statistics with PromQL (`prom`); both produce
//! [`DeviceUsage`] with identical meaning, which the tests check against each other.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::LabelScheme;
use crate::ledger::usage::{DeviceKey, DeviceUsage, Signal, Window, Workload, fields};

/// Label name → value (empty values are dropped at parse time).
pub type Labels = BTreeMap<String, String>;

/// One time series: metric name, labels, samples as (Unix milliseconds, value), sorted by time.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: Labels,
    pub samples: Vec<(i64, f64)>,
}

/// MIG GPU instance id label (same spelling in every scheme dcgm-exporter emits).
pub const GPU_INSTANCE_LABEL: &str = "GPU_I_ID";
/// MIG profile label.
pub const GPU_PROFILE_LABEL: &str = "GPU_I_PROFILE";
/// Pod UID label; on `GPU_UTIL`/`FB_USED` next to a pod-less device series it marks per-process values.
pub const POD_UID_LABEL: &str = "pod_uid";
/// Values above this are DCGM "blank" sentinels printed by old exporters, not readings.
pub(crate) const SENTINEL_FLOOR: f64 = 9.0e15;
/// Bytes per MiB (DCGM reports framebuffer in MiB).
pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// A reading: finite and not a DCGM blank sentinel.
pub(crate) fn usable(v: f64) -> bool {
    v.is_finite() && v.abs() < SENTINEL_FLOOR
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

fn key_of(labels: &Labels, scheme: &LabelScheme) -> Option<DeviceKey> {
    let uuid = labels.get(scheme.uuid)?;
    Some(DeviceKey {
        uuid: uuid.clone(),
        gpu_instance: labels.get(GPU_INSTANCE_LABEL).cloned(),
    })
}

#[derive(Default)]
struct DeviceSeries<'a> {
    util: Vec<&'a Series>,
    gpu_util: Vec<&'a Series>,
    fb: Vec<&'a Series>,
}

/// Reduces raw series to one [`DeviceUsage`] per device, as seen at `now`.
pub fn reduce(
    series: &[Series],
    scheme: &LabelScheme,
    window: &Window,
    now: DateTime<Utc>,
) -> Vec<DeviceUsage> {
    let mut by_device: BTreeMap<DeviceKey, DeviceSeries<'_>> = BTreeMap::new();
    for s in series {
        let Some(key) = key_of(&s.labels, scheme) else {
            continue;
        };
        let entry = by_device.entry(key).or_default();
        match s.name.as_str() {
            fields::GR_ENGINE_ACTIVE => entry.util.push(s),
            fields::GPU_UTIL => entry.gpu_util.push(s),
            fields::FB_USED => entry.fb.push(s),
            _ => {}
        }
    }
    let now_ms = now.timestamp_millis();
    let start_ms = now_ms - window.length.num_milliseconds();
    by_device
        .into_iter()
        .map(|(key, dev)| reduce_device(key, &dev, scheme, window, now_ms, start_ms))
        .collect()
}

/// Splits per-process series (pod-labelled with `pod_uid` beside a pod-less device series).
fn split_per_process<'a>(
    list: &[&'a Series],
    scheme: &LabelScheme,
) -> (Vec<&'a Series>, Vec<&'a Series>) {
    let has_device_level = list
        .iter()
        .any(|s| workload_of(&s.labels, scheme).is_none());
    list.iter().partition(|s| {
        !(has_device_level
            && s.labels.contains_key(POD_UID_LABEL)
            && workload_of(&s.labels, scheme).is_some())
    })
}

/// Walks back from the newest sample while gaps stay within two sample intervals.
fn covered_since(merged: &BTreeMap<i64, f64>, window: &Window) -> Option<i64> {
    let max_gap = 2 * window.interval.num_milliseconds();
    let mut times = merged.keys().rev();
    let mut start = *times.next()?;
    for &t in times {
        if start - t > max_gap {
            break;
        }
        start = t;
    }
    Some(start)
}

fn reduce_device(
    key: DeviceKey,
    dev: &DeviceSeries<'_>,
    scheme: &LabelScheme,
    window: &Window,
    now_ms: i64,
    start_ms: i64,
) -> DeviceUsage {
    let (gpu_util_device, gpu_util_per_pod) = split_per_process(&dev.gpu_util, scheme);
    let (fb_device, _fb_per_pod) = split_per_process(&dev.fb, scheme);
    let (signal, chosen, scale) = if dev.util.is_empty() {
        (Signal::GpuUtil, gpu_util_device, 0.01)
    } else {
        (Signal::GrEngineActive, dev.util.clone(), 1.0)
    };
    // Merge samples of every series of the device (time-slice copies, label changes) by time.
    let mut merged: BTreeMap<i64, f64> = BTreeMap::new();
    for s in &chosen {
        for &(t, v) in &s.samples {
            if t > now_ms || !usable(v) {
                continue;
            }
            let v = v * scale;
            merged.entry(t).and_modify(|m| *m = m.max(v)).or_insert(v);
        }
    }
    let in_window: Vec<(i64, f64)> = merged
        .range(start_ms + 1..=now_ms)
        .map(|(t, v)| (*t, *v))
        .collect();
    let last = merged.iter().next_back().map(|(t, v)| (*t, *v));
    let fresh = |t: i64| now_ms - t <= window.max_staleness.num_milliseconds();
    let last_sample_at = last.and_then(|(t, _)| DateTime::from_timestamp_millis(t));
    let utilization = last.filter(|(t, _)| fresh(*t)).map(|(_, v)| v);
    let peak = in_window
        .iter()
        .map(|(_, v)| *v)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let coverage = (in_window.len() as f64 / window.expected_samples()).min(1.0);
    let last_active_at = merged
        .iter()
        .rev()
        .find(|(_, v)| **v >= window.idle_threshold)
        .and_then(|(t, _)| DateTime::from_timestamp_millis(*t));
    let covered_since = covered_since(&merged, window).and_then(DateTime::from_timestamp_millis);
    // Current holders: workloads on series whose newest sample is the device's newest sample.
    let newest = last.map(|(t, _)| t);
    let mut workloads = BTreeSet::new();
    for s in chosen.iter().chain(fb_device.iter()) {
        // Each series' newest usable sample at or before `now` (later ones are the future).
        let series_newest = s
            .samples
            .iter()
            .rev()
            .find(|(t, v)| *t <= now_ms && usable(*v))
            .map(|(t, _)| *t);
        if series_newest == newest
            && let Some(w) = workload_of(&s.labels, scheme)
        {
            workloads.insert(w);
        }
    }
    let per_pod_utilization = gpu_util_per_pod
        .iter()
        .filter_map(|s| {
            let (t, v) = *s
                .samples
                .iter()
                .rev()
                .find(|(t, v)| *t <= now_ms && usable(*v))?;
            (fresh(t)).then(|| workload_of(&s.labels, scheme).map(|w| (w, v * 0.01)))?
        })
        .collect();
    let memory_used_bytes = fb_device
        .iter()
        .filter_map(|s| {
            s.samples
                .iter()
                .rev()
                .find(|(t, v)| *t <= now_ms && usable(*v))
                .copied()
        })
        .max_by_key(|(t, _)| *t)
        .filter(|(t, _)| fresh(*t))
        .map(|(_, mib)| mib * MIB);
    let any = chosen.first().or(dev.fb.first()).or(dev.gpu_util.first());
    let label = |name: &str| any.and_then(|s| s.labels.get(name).cloned());
    DeviceUsage {
        key,
        hostname: label(scheme.hostname),
        model: label("modelName"),
        mig_profile: label(GPU_PROFILE_LABEL),
        workloads: workloads.into_iter().collect(),
        per_pod_utilization,
        signal: (!chosen.is_empty()).then_some(signal),
        utilization,
        peak,
        coverage,
        last_sample_at,
        memory_used_bytes,
        last_active_at,
        covered_since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::exposition;

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
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
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
    fn mig_instances_are_separate_devices() {
        let text = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-m\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\",Hostname=\"h\",pod=\"a\",namespace=\"ns\"} 0.8\n\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-m\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"9\",Hostname=\"h\"} 0\n";
        let p = exposition::parse(text, &[fields::GR_ENGINE_ACTIVE], now());
        let d = reduce(&p.series, &LabelScheme::default(), &window(), now());
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].key.gpu_instance.as_deref(), Some("2"));
        assert_eq!(d[0].mig_profile.as_deref(), Some("3g.40gb"));
        assert_eq!(d[1].workloads.len(), 0);
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
}
