//! HAMi's vGPU monitor series → each container's own readings over the window
//! ([`HamiContainerUsage`]), by the evidence rules of `usage::series` (valid samples, coverage
//! at the series' own interval, freshness).
//!
//! Labels, per HAMi version (`cmd/vGPUmonitor/metrics.go`): `namespace, pod, container,
//! device_uuid` on the `hami_*` names; `podnamespace, podname, ctrname, deviceuuid` on the
//! legacy ones; `exported_namespace, exported_pod, exported_container` when Prometheus scraped
//! the monitor without `honor_labels` (then `namespace`/`pod` name the monitor itself). The
//! monitor reports the card's UUID; a `[…]` suffix (HAMi's MIG-mode spelling) is stripped.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::fields;
use super::series::{Series, coverage, own_interval_ms, usable};
use crate::ledger::usage::HamiContainerUsage;
use crate::ledger::usage::{Window, Workload};

/// (workload, container, card UUID) of a HAMi series, if its labels name all three.
fn identity(labels: &super::series::Labels) -> Option<(Workload, String, String)> {
    let get = |names: &[&str]| names.iter().find_map(|n| labels.get(*n));
    let (namespace, pod, container) = if labels.contains_key("exported_pod") {
        (
            labels.get("exported_namespace")?,
            labels.get("exported_pod")?,
            get(&["exported_container", "container"]),
        )
    } else {
        (
            get(&["podnamespace", "namespace"])?,
            get(&["podname", "pod"])?,
            get(&["ctrname", "container"]),
        )
    };
    let raw = get(&["device_uuid", "deviceuuid"])?;
    let uuid = raw.split_once('[').map_or(raw.as_str(), |(u, _)| u);
    if uuid.is_empty() {
        return None;
    }
    Some((
        Workload {
            namespace: namespace.clone(),
            pod: pod.clone(),
        },
        container.cloned().unwrap_or_default(),
        uuid.to_string(),
    ))
}

/// One container's series on one card, by field.
#[derive(Default)]
struct Own<'a> {
    util: Vec<&'a Series>,
    kernel: Vec<&'a Series>,
    memory: Vec<&'a Series>,
}

/// Samples of `list` at or before `now_ms` that are readings (finite, not a sentinel, ≥ 0),
/// merged by time (the highest of equal times: a rolling upgrade's two names).
fn merged(list: &[&Series], now_ms: i64) -> BTreeMap<i64, f64> {
    let mut out: BTreeMap<i64, f64> = BTreeMap::new();
    for s in list {
        for &(t, v) in &s.samples {
            if t <= now_ms && usable(v) && v >= 0.0 {
                out.entry(t).and_modify(|m| *m = m.max(v)).or_insert(v);
            }
        }
    }
    out
}

/// Each container's own readings at `now` over `window`, sorted by (workload, container, UUID).
/// Series of other names, or without a pod, namespace or device UUID, are ignored.
pub fn reduce<'a>(
    series: impl IntoIterator<Item = &'a Series>,
    window: &Window,
    now: DateTime<Utc>,
) -> Vec<HamiContainerUsage> {
    let mut by_own: BTreeMap<(Workload, String, String), Own<'_>> = BTreeMap::new();
    for s in series {
        let Some(field) = fields::hami_field(&s.name) else {
            continue;
        };
        let Some(id) = identity(&s.labels) else {
            continue;
        };
        let e = by_own.entry(id).or_default();
        match field {
            fields::HAMI_UTIL => e.util.push(s),
            fields::HAMI_LAST_KERNEL => e.kernel.push(s),
            _ => e.memory.push(s),
        }
    }
    let now_ms = now.timestamp_millis();
    let start_ms = now_ms.saturating_sub(window.length.num_milliseconds());
    let fresh = |t: i64| now_ms.saturating_sub(t) <= window.max_staleness.num_milliseconds();
    let at = |t: i64| DateTime::from_timestamp_millis(t);
    by_own
        .into_iter()
        .map(|((workload, container, uuid), own)| {
            let util = merged(&own.util, now_ms);
            let over_100 = util.values().any(|v| *v > 100.0);
            // Percent to 0..1; above 100 (HAMi#555) clamped: busy, and flagged.
            let ratio = |v: f64| (v / 100.0).min(1.0);
            let in_window: Vec<(i64, f64)> = util
                .range(start_ms.saturating_add(1)..=now_ms.max(start_ms.saturating_add(1)))
                .map(|(t, v)| (*t, ratio(*v)))
                .collect();
            let interval_ms = own
                .util
                .iter()
                .filter_map(|s| own_interval_ms(&s.samples, start_ms, now_ms))
                .min()
                .unwrap_or_else(|| window.interval.num_milliseconds())
                .max(1);
            let newest = util.iter().next_back().map(|(t, v)| (*t, ratio(*v)));
            let kernel = merged(&own.kernel, now_ms)
                .into_iter()
                .next_back()
                .filter(|(t, _)| at(*t).is_some());
            let memory = merged(&own.memory, now_ms)
                .into_iter()
                .next_back()
                .filter(|(t, _)| fresh(*t));
            HamiContainerUsage {
                workload,
                container,
                uuid,
                peak: in_window.iter().map(|(_, v)| *v).reduce(f64::max),
                utilization: newest.filter(|(t, _)| fresh(*t)).map(|(_, v)| v),
                over_100,
                coverage: coverage(
                    in_window.iter().map(|(t, _)| *t),
                    start_ms,
                    now_ms,
                    interval_ms,
                ),
                last_sample_at: newest.and_then(|(t, _)| at(t)),
                last_active_at: util
                    .iter()
                    .rev()
                    .find(|(_, v)| ratio(**v) >= window.idle_threshold)
                    .and_then(|(t, _)| at(*t)),
                last_kernel: kernel.and_then(|(t, e)| at(t).map(|t| (t, e))),
                kernel_in_window: kernel
                    .filter(|(t, _)| fresh(*t))
                    .map(|(_, e)| e * 1000.0 < window.length.num_milliseconds() as f64),
                memory_used_bytes: memory.map(|(_, b)| b),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
