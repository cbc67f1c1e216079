//! Live usage path against a REAL Prometheus 2.42 (`/usr/bin/prometheus`, `/usr/bin/promtool`):
//! generated DCGM series are backfilled with `promtool tsdb create-blocks-from openmetrics`, then
//! the live usage source (`usage::live`: raw samples by `PromClient::range_series`, kept for the
//! window, reduced by `usage::series::reduce`) and `live::bootstrap` query them over HTTP. The
//! key test (`live_and_offline_agree`) checks that the live path and the offline reduction
//! (`usage::series::reduce` over the parsed `OpenMetrics` text) mean the same thing.
//!
//! Tests never skip: a missing Prometheus fails them with a message naming what to install.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_ledger::ledger::usage::{DeviceKey, DeviceUsage, Signal, Window, Workload};
use gpu_ledger::usage::fields;
use std::sync::Arc;

use gpu_ledger::usage::history::{self, History};
use gpu_ledger::usage::live::{self, LiveSettings, LiveUsage};
use gpu_ledger::usage::prom::{PromClient, PromConfig};
use gpu_ledger::usage::scheme::SchemeChoice;
use gpu_ledger::usage::{LabelScheme, exposition, series};
use gpu_ledger_testkit::Prometheus;

const STEP: i64 = 30;

fn window() -> Window {
    Window {
        length: chrono::Duration::minutes(10),
        interval: chrono::Duration::seconds(STEP),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    }
}

/// Query time: an hour ago, on a 30 s boundary (the newest sample of every test).
fn now_secs() -> i64 {
    let t = Utc::now().timestamp() - 3600;
    t - t.rem_euclid(STEP)
}

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).expect("valid time")
}

/// `OpenMetrics` text built family by family (samples of a family must be contiguous).
#[derive(Default)]
struct Om {
    families: BTreeMap<String, String>,
}

impl Om {
    /// Adds one series; `None` values are missing samples, `f64::NAN` is written as `NaN`.
    fn series(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        samples: impl IntoIterator<Item = (i64, f64)>,
    ) {
        let body = self.families.entry(name.to_string()).or_default();
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect::<Vec<_>>()
            .join(",");
        for (t, v) in samples {
            let v = if v.is_nan() {
                "NaN".to_string()
            } else {
                format!("{v}")
            };
            writeln!(body, "{name}{{{labels}}} {v} {t}").expect("write to string");
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for (name, body) in &self.families {
            writeln!(out, "# TYPE {name} gauge").expect("write");
            out.push_str(body);
        }
        out.push_str("# EOF\n");
        out
    }
}

/// Samples every 30 s over `(now - span, now]`, value from `f(t)`.
fn every(now: i64, span_secs: i64, f: impl Fn(i64) -> f64) -> Vec<(i64, f64)> {
    (0..span_secs / STEP)
        .rev()
        .map(|i| now - i * STEP)
        .map(|t| (t, f(t)))
        .collect()
}

fn dev<'a>(uuid: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut l = vec![
        ("gpu", "0"),
        ("UUID", uuid),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-1"),
    ];
    l.extend_from_slice(extra);
    l
}

async fn start(om: &Om) -> (Prometheus, PromClient) {
    let prom = Prometheus::start_with_backfill(&om.text())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "these tests need a real Prometheus 2.42: install the Debian package `prometheus` \
             (`apt-get install prometheus`, provides /usr/bin/prometheus and /usr/bin/promtool; \
             or set PROMETHEUS_BIN/PROMTOOL_BIN): {e:#}"
            )
        });
    let client = PromClient::new(PromConfig::new(
        prom.url().parse().expect("prometheus url"),
        Duration::from_secs(60),
    ))
    .expect("client");
    (prom, client)
}

fn find<'a>(d: &'a [DeviceUsage], uuid: &str, gi: Option<&str>) -> &'a DeviceUsage {
    d.iter()
        .find(|x| {
            x.key
                == DeviceKey {
                    uuid: uuid.into(),
                    gpu_instance: gi.map(str::to_string),
                }
        })
        .unwrap_or_else(|| panic!("device {uuid}/{gi:?} missing in {d:#?}"))
}

fn wl(ns: &str, pod: &str) -> Workload {
    Workload {
        namespace: ns.into(),
        pod: pod.into(),
    }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

fn settings(scheme: SchemeChoice) -> LiveSettings {
    LiveSettings {
        scheme,
        window: window(),
        history_lookback: history::DEFAULT_LOOKBACK,
        min_coverage: 0.9,
    }
}

/// The usage of the window ending at `at`, read fresh (one query), without history.
async fn fetch(client: &PromClient, scheme: SchemeChoice, at: DateTime<Utc>) -> Vec<DeviceUsage> {
    live::fetch_window(client, &settings(scheme), None, at)
        .await
        .expect("fetch")
}

#[tokio::test]
async fn window_coverage_peak_and_last() {
    let now = now_secs();
    let mut om = Om::default();
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-full", &[("pod", "a"), ("namespace", "ns")]),
        every(now, 1200, |t| {
            if t == now - 300 {
                0.9
            } else if t == now {
                0.2
            } else {
                0.01
            }
        }),
    );
    // A five-minute hole: nothing in [now-300, now-30].
    let gapped: Vec<_> = every(now, 1200, |_| 0.01)
        .into_iter()
        .filter(|(t, _)| !(now - 300..=now - 30).contains(t))
        .collect();
    om.series(fields::GR_ENGINE_ACTIVE, &dev("GPU-gap", &[]), gapped);
    om.series(
        fields::FB_USED,
        &dev("GPU-full", &[("pod", "a"), ("namespace", "ns")]),
        every(now, 600, |_| 1000.0),
    );
    let (_prom, client) = start(&om).await;
    let d = fetch(&client, SchemeChoice::Auto, at(now)).await;
    assert_eq!(d.len(), 2);
    let full = find(&d, "GPU-full", None);
    assert!((full.coverage - 1.0).abs() < 1e-9, "{full:?}");
    assert!(close(full.peak, 0.9), "{full:?}");
    assert!(close(full.utilization, 0.2), "{full:?}");
    assert_eq!(full.signal, Some(Signal::GrEngineActive));
    assert_eq!(full.last_sample_at, Some(at(now)));
    assert_eq!(full.last_active_at, Some(at(now)));
    assert_eq!(full.workloads, vec![wl("ns", "a")]);
    assert_eq!(full.hostname.as_deref(), Some("gpu-node-1"));
    assert_eq!(full.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert!(
        close(full.memory_used_bytes, 1000.0 * 1024.0 * 1024.0),
        "{full:?}"
    );
    let gap = find(&d, "GPU-gap", None);
    assert!((gap.coverage - 0.5).abs() <= 0.05, "{gap:?}");
    assert!(close(gap.peak, 0.01), "{gap:?}");
    assert_eq!(gap.last_active_at, None);
}

/// The same devices written with `exported_*` workload labels (scraped without `honor_labels`) and
/// with plain `pod`/`namespace`.
fn scheme_data(now: i64, exported: bool) -> Om {
    let mut om = Om::default();
    for (uuid, pod) in [("GPU-s1", "nb-0"), ("GPU-s2", "train-1")] {
        let labels: Vec<(&str, &str)> = if exported {
            dev(
                uuid,
                &[
                    ("exported_pod", pod),
                    ("exported_namespace", "team"),
                    ("pod", "dcgm-exporter-x1"),
                    ("namespace", "gpu-operator"),
                ],
            )
        } else {
            dev(uuid, &[("pod", pod), ("namespace", "team")])
        };
        om.series(fields::GR_ENGINE_ACTIVE, &labels, every(now, 600, |_| 0.5));
    }
    // An unallocated GPU: in the exported scheme it still carries the exporter's pod/namespace.
    let idle: Vec<(&str, &str)> = if exported {
        dev(
            "GPU-s3",
            &[("pod", "dcgm-exporter-x1"), ("namespace", "gpu-operator")],
        )
    } else {
        dev("GPU-s3", &[])
    };
    om.series(fields::GR_ENGINE_ACTIVE, &idle, every(now, 600, |_| 0.0));
    om
}

#[tokio::test]
async fn both_label_schemes_detected_with_equal_workloads() {
    let now = now_secs();
    let mut got = Vec::new();
    for exported in [true, false] {
        let (_prom, client) = start(&scheme_data(now, exported)).await;
        let scheme = live::detect_scheme(&client, SchemeChoice::Auto, at(now))
            .await
            .expect("detect");
        assert_eq!(scheme.pod, if exported { "exported_pod" } else { "pod" });
        assert_eq!(
            scheme.namespace,
            if exported {
                "exported_namespace"
            } else {
                "namespace"
            }
        );
        let d = fetch(&client, SchemeChoice::Auto, at(now)).await;
        got.push(
            d.iter()
                .map(|x| (x.key.uuid.clone(), x.workloads.clone()))
                .collect::<Vec<_>>(),
        );
        if exported {
            // Overriding to `plain` would attribute every GPU to the exporter pod.
            let d = fetch(&client, SchemeChoice::Plain, at(now)).await;
            assert_eq!(
                find(&d, "GPU-s3", None).workloads,
                vec![wl("gpu-operator", "dcgm-exporter-x1")]
            );
        }
    }
    assert_eq!(got[0], got[1]);
    assert_eq!(
        got[0],
        vec![
            ("GPU-s1".into(), vec![wl("team", "nb-0")]),
            ("GPU-s2".into(), vec![wl("team", "train-1")]),
            ("GPU-s3".into(), vec![])
        ]
    );
}

#[tokio::test]
async fn nan_is_unknown_gpu_util_is_scaled_and_mig_instances_are_separate() {
    let now = now_secs();
    let mut om = Om::default();
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-nan", &[]),
        every(now, 600, |_| f64::NAN),
    );
    // One NaN in the middle: unknown, not zero; the rest still counts.
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-hole", &[]),
        every(now, 600, |t| if t == now - 120 { f64::NAN } else { 0.3 }),
    );
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-old", &[("pod", "p"), ("namespace", "ns")]),
        every(now, 600, |_| 40.0),
    );
    for (gi, profile, pod, v) in [("1", "3g.40gb", "mig-a", 0.8), ("2", "3g.40gb", "", 0.0)] {
        let mut l = dev("GPU-mig", &[("GPU_I_PROFILE", profile), ("GPU_I_ID", gi)]);
        if !pod.is_empty() {
            l.extend([("pod", pod), ("namespace", "ns")]);
        }
        om.series(fields::GR_ENGINE_ACTIVE, &l, every(now, 600, |_| v));
    }
    let (_prom, client) = start(&om).await;
    let d = fetch(&client, SchemeChoice::Auto, at(now)).await;
    let nan = find(&d, "GPU-nan", None);
    assert_eq!(
        (nan.utilization, nan.peak, nan.coverage),
        (None, None, 0.0),
        "{nan:?}"
    );
    let hole = find(&d, "GPU-hole", None);
    assert!(
        close(hole.utilization, 0.3) && close(hole.peak, 0.3),
        "{hole:?}"
    );
    assert!(
        (hole.coverage - 0.95).abs() < 1e-9,
        "a NaN sample is no coverage: {hole:?}"
    );
    let old = find(&d, "GPU-old", None);
    assert_eq!(old.signal, Some(Signal::GpuUtil));
    assert!(
        close(old.utilization, 0.4) && close(old.peak, 0.4),
        "{old:?}"
    );
    let m1 = find(&d, "GPU-mig", Some("1"));
    let m2 = find(&d, "GPU-mig", Some("2"));
    assert!(
        close(m1.utilization, 0.8) && close(m2.utilization, 0.0),
        "{m1:?} {m2:?}"
    );
    assert_eq!(m1.mig_profile.as_deref(), Some("3g.40gb"));
    assert_eq!(m1.workloads, vec![wl("ns", "mig-a")]);
    assert!(m2.workloads.is_empty());
}

#[tokio::test]
async fn per_process_time_slicing_series_are_split() {
    let now = now_secs();
    let mut om = Om::default();
    for (pod, uid, vgpu) in [("a", "u1", "0"), ("b", "u2", "2")] {
        om.series(
            fields::GR_ENGINE_ACTIVE,
            &dev(
                "GPU-ts",
                &[
                    ("pod", pod),
                    ("namespace", "x"),
                    ("pod_uid", uid),
                    ("vgpu", vgpu),
                ],
            ),
            every(now, 600, |_| 0.6),
        );
        let v = if pod == "a" { 58.0 } else { 0.0 };
        om.series(
            fields::GPU_UTIL,
            &dev(
                "GPU-ts",
                &[
                    ("pod", pod),
                    ("namespace", "x"),
                    ("pod_uid", uid),
                    ("vgpu", vgpu),
                ],
            ),
            every(now, 600, move |_| v),
        );
    }
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-ts", &[]),
        every(now, 600, |_| 63.0),
    );
    // GPU_UTIL-only sharing: the device-level series is the signal, not the per-pod ones.
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-ts2", &[]),
        every(now, 600, |_| 20.0),
    );
    om.series(
        fields::GPU_UTIL,
        &dev(
            "GPU-ts2",
            &[("pod", "c"), ("namespace", "x"), ("pod_uid", "u3")],
        ),
        every(now, 600, |_| 90.0),
    );
    let (_prom, client) = start(&om).await;
    let d = fetch(&client, SchemeChoice::Auto, at(now)).await;
    assert_eq!(d.len(), 2, "{d:#?}");
    let ts = find(&d, "GPU-ts", None);
    assert_eq!(ts.signal, Some(Signal::GrEngineActive));
    assert!(close(ts.utilization, 0.6), "{ts:?}");
    assert_eq!(ts.workloads, vec![wl("x", "a"), wl("x", "b")]);
    assert_eq!(ts.per_pod_utilization.len(), 2, "{ts:?}");
    assert!(
        ts.per_pod_utilization[0].0 == wl("x", "a")
            && (ts.per_pod_utilization[0].1 - 0.58).abs() < 1e-9
    );
    assert!(
        ts.per_pod_utilization[1].0 == wl("x", "b") && ts.per_pod_utilization[1].1.abs() < 1e-9
    );
    let ts2 = find(&d, "GPU-ts2", None);
    assert_eq!(ts2.signal, Some(Signal::GpuUtil));
    assert!(
        close(ts2.utilization, 0.2) && close(ts2.peak, 0.2),
        "{ts2:?}"
    );
    assert!(ts2.workloads.is_empty(), "{ts2:?}");
    assert_eq!(ts2.per_pod_utilization, vec![(wl("x", "c"), 0.9)]);
}

#[tokio::test]
async fn history_bootstrap_finds_activity_hours_ago() {
    let now = now_secs();
    let day = 24 * 3600;
    let mut om = Om::default();
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-h1", &[]),
        every(now, day, |t| if now - t >= 3 * 3600 { 0.7 } else { 0.0 }),
    );
    // GPU_UTIL only, a 20-minute break two hours ago.
    let broken: Vec<_> = every(now, day, |_| 0.0)
        .into_iter()
        .filter(|(t, _)| !(now - 7200 - 1200..now - 7200).contains(t))
        .collect();
    om.series(fields::GPU_UTIL, &dev("GPU-h2", &[]), broken);
    let (_prom, client) = start(&om).await;
    let w = window();
    let mut h = bootstrap_at(&client, now).await;
    let k = |u: &str| DeviceKey {
        uuid: u.into(),
        gpu_instance: None,
    };
    let h1 = *h.get(&k("GPU-h1")).expect("GPU-h1 in history");
    // The start-up query reads buckets: times are placed at the end of the bucket they fall in,
    // never earlier than they happened, at most one bucket later.
    let active = h1.last_active_at.expect("last active");
    assert!(
        within_a_bucket_after(active, now - 3 * 3600),
        "{active} vs {}",
        at(now - 3 * 3600)
    );
    let since = h1.covered_since.expect("covered");
    assert!(within_a_bucket_after(since, now - day), "{since}");
    let h2 = *h.get(&k("GPU-h2")).expect("GPU-h2 in history");
    assert_eq!(h2.last_active_at, None);
    let since2 = h2.covered_since.expect("covered");
    assert!(
        within_a_bucket_after(since2, now - 7200),
        "the run starts after the break: {since2} vs {}",
        at(now - 7200)
    );
    // The first refresh keeps what the bootstrap found.
    let mut d = fetch(&client, SchemeChoice::Auto, at(now)).await;
    h.merge(&mut d, &w, 0.9, at(now));
    let d1 = find(&d, "GPU-h1", None);
    assert_eq!(d1.last_active_at, Some(active));
    assert_eq!(d1.covered_since, Some(since));
}

/// `serve`'s start-up history query starts once the first refresh has answered, narrowed to the
/// same scope: a shard's history holds its own devices only.
#[tokio::test]
async fn the_deferred_bootstrap_reads_the_scoped_devices_only() {
    let now = now_secs();
    let day = 24 * 3600;
    let mut om = Om::default();
    for (uuid, host) in [("GPU-mine", "gpu-node-1"), ("GPU-theirs", "gpu-node-2")] {
        let mut labels = dev(uuid, &[]);
        labels.retain(|(k, _)| *k != "Hostname");
        labels.push(("Hostname", host));
        om.series(fields::GR_ENGINE_ACTIVE, &labels, every(now, day, |_| 0.5));
    }
    let (_prom, client) = start(&om).await;
    let mut source = LiveUsage::new(Some(Arc::new(client)), settings(SchemeChoice::Auto));
    source.set_scope(live::Scope::Named {
        label: "Hostname".into(),
        values: vec!["gpu-node-1".into()],
    });
    let tracker = tokio_util::task::TaskTracker::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    source.start_bootstrap(&tracker, &cancel);
    assert_eq!(source.history().map(History::len), Some(0), "nothing yet");
    let first = source.fetch_at(at(now - 30)).await;
    assert!(first.error.is_none(), "{:?}", first.error);
    // The query was started by that refresh; wait for it, then the next refresh folds it in.
    tracker.close();
    tracker.wait().await;
    source.fetch_at(at(now)).await;
    let h = source.history().expect("a history");
    let k = |u: &str| DeviceKey {
        uuid: u.into(),
        gpu_instance: None,
    };
    // Covered for the day only if the start-up query read it: a refresh reads 10 minutes.
    let mine = h.get(&k("GPU-mine")).expect("the shard's own device");
    let since = mine.covered_since.expect("covered");
    assert!(
        since <= at(now - 12 * 3600),
        "covered since {since}: no bootstrap"
    );
    // Without the scope the start-up query would have brought it in (no refresh reads it).
    assert!(h.get(&k("GPU-theirs")).is_none(), "another shard's device");
}

/// A serving refresh scans activity only since the previous one (its history holds the rest):
/// over a run of refreshes it must end with exactly the last activity a full-window scan finds,
/// including activity between two refreshes that is no longer the newest sample.
#[tokio::test]
async fn incremental_activity_scan_matches_the_full_window() {
    let now = now_secs();
    let mut om = Om::default();
    // Busy at now-300 and in a burst at now-150..now-120; idle otherwise.
    let busy = |t: i64| {
        if t == now - 300 || (now - 150..=now - 120).contains(&t) {
            0.8
        } else {
            0.0
        }
    };
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-inc", &[("pod", "p"), ("namespace", "ns")]),
        every(now, 1800, busy),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-quiet", &[("pod", "q"), ("namespace", "ns")]),
        every(now, 1800, |_| 0.0),
    );
    let (_prom, client) = start(&om).await;
    let full = fetch(&client, SchemeChoice::Auto, at(now)).await;
    let expected = find(&full, "GPU-inc", None).last_active_at;
    assert_eq!(expected, Some(at(now - 120)), "{full:#?}");

    // Refreshes every 45 s (off the 30 s grid), the first one reading the whole window, each
    // later one only the samples since the previous (one query each).
    let client = Arc::new(client);
    let mut source = LiveUsage::new(Some(client.clone()), settings(SchemeChoice::Auto));
    let mut t = now - 400;
    let mut refreshes = 0;
    while t <= now {
        let f = source.fetch_at(at(t)).await;
        assert!(f.error.is_none(), "{:?}", f.error);
        assert_eq!(f.stats.queries, 1, "one query per refresh");
        refreshes += 1;
        t += 45;
    }
    // The loop's last refresh is at or before `now`; one more exactly at `now`.
    let f = source.fetch_at(at(now)).await;
    let d = f.usage.devices;
    assert!(refreshes > 5);
    assert_eq!(find(&d, "GPU-inc", None).last_active_at, expected, "{d:#?}");
    assert_eq!(find(&d, "GPU-quiet", None).last_active_at, None);
    // The incremental window holds exactly what a fresh read of the window holds.
    let fresh = fetch(&client, SchemeChoice::Auto, at(now)).await;
    for uuid in ["GPU-inc", "GPU-quiet"] {
        let (a, b) = (find(&d, uuid, None), find(&fresh, uuid, None));
        assert_eq!(
            (a.coverage, a.peak, a.utilization, &a.workloads),
            (b.coverage, b.peak, b.utilization, &b.workloads),
            "{uuid}"
        );
    }
}

/// Deterministic pseudo-random values in 0..1.
fn noise(seed: u64, t: i64) -> f64 {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005)
        ^ (t as u64).wrapping_mul(1_442_695_040_888_963_407);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x % 1000) as f64 / 1000.0
}

/// A mix of everything: full, gapped, sparse, NaN, stale, GPU_UTIL-only, MIG, time-sliced,
/// per-process, and a pod that replaced another inside the window.
#[allow(clippy::too_many_lines)] // one fixture, read top to bottom
fn mixed(now: i64, exported: bool) -> Om {
    let mut om = Om::default();
    let w = |pod: &'static str, ns: &'static str| -> Vec<(&'static str, &'static str)> {
        if exported {
            vec![
                ("exported_pod", pod),
                ("exported_namespace", ns),
                ("pod", "dcgm-exp"),
                ("namespace", "gpu-operator"),
            ]
        } else {
            vec![("pod", pod), ("namespace", ns)]
        }
    };
    let none = || -> Vec<(&'static str, &'static str)> {
        if exported {
            vec![("pod", "dcgm-exp"), ("namespace", "gpu-operator")]
        } else {
            vec![]
        }
    };
    let span = 1800;
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m0", &w("a", "t1")),
        every(now, span, |t| noise(1, t)),
    );
    om.series(
        fields::FB_USED,
        &dev("GPU-m0", &w("a", "t1")),
        every(now, span, |_| 512.0),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m1", &none()),
        every(now, span, |t| noise(2, t) * 0.04)
            .into_iter()
            .filter(|(t, _)| !(now - 400..now - 150).contains(t)),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m2", &w("b", "t2")),
        every(now, span, |t| noise(3, t))
            .into_iter()
            .filter(|(t, _)| (now - t) % 90 == 0),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m3", &none()),
        every(
            now,
            span,
            // NaN every fifth sample, never the newest (then live says unknown, offline looks back).
            |t| {
                if (now - t) % 150 == 60 {
                    f64::NAN
                } else {
                    noise(4, t)
                }
            },
        ),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m4", &w("c", "t1")),
        every(now - 240, span, |t| noise(5, t)),
    );
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-m5", &w("d", "t3")),
        every(now, span, |t| (noise(6, t) * 100.0).round()),
    );
    for (gi, v) in [("1", 0.7), ("5", 0.02)] {
        let mut l = dev("GPU-m6", &[("GPU_I_PROFILE", "1g.10gb"), ("GPU_I_ID", gi)]);
        if gi == "1" {
            l.extend(w("e", "t2"));
        } else {
            l.extend(none());
        }
        om.series(
            fields::GR_ENGINE_ACTIVE,
            &l,
            every(now, span, move |t| v * noise(7, t)),
        );
    }
    for (pod, uid, per) in [("f", "u1", 30.0), ("g", "u2", 10.0)] {
        let mut l = dev("GPU-m7", &w(pod, "t4"));
        l.push(("pod_uid", uid));
        om.series(
            fields::GR_ENGINE_ACTIVE,
            &l,
            every(now, span, |t| noise(8, t)),
        );
        om.series(fields::GPU_UTIL, &l, every(now, span, move |_| per));
    }
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-m7", &none()),
        every(now, span, |_| 40.0),
    );
    // Pod h replaced by pod i five minutes ago.
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m8", &w("h", "t5")),
        every(now - 300, span - 300, |t| noise(9, t)),
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev("GPU-m8", &w("i", "t5")),
        every(now, 300, |t| noise(10, t)),
    );
    om
}

fn assert_agree(offline: &[DeviceUsage], live: &[DeviceUsage], what: &str) {
    let keys = |d: &[DeviceUsage]| d.iter().map(|x| x.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(offline), keys(live), "{what}: same devices");
    for (o, l) in offline.iter().zip(live) {
        let ctx = format!("{what}: {:?}\noffline {o:#?}\nlive {l:#?}", o.key);
        assert_eq!(o.signal, l.signal, "signal {ctx}");
        assert_eq!(o.workloads, l.workloads, "workloads {ctx}");
        let near = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => (a - b).abs() <= 0.05,
            _ => false,
        };
        assert!(near(o.utilization, l.utilization), "utilization {ctx}");
        assert!(near(o.peak, l.peak), "peak {ctx}");
        if o.key.uuid != "GPU-m8" {
            assert!((o.coverage - l.coverage).abs() <= 0.05, "coverage {ctx}");
        }
        assert_eq!(o.hostname, l.hostname, "hostname {ctx}");
        assert_eq!(o.mig_profile, l.mig_profile, "mig profile {ctx}");
        assert!(
            near(
                o.memory_used_bytes.map(|b| b / 1e9),
                l.memory_used_bytes.map(|b| b / 1e9)
            ),
            "memory {ctx}"
        );
        let mut opp = o.per_pod_utilization.clone();
        opp.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(opp.len(), l.per_pod_utilization.len(), "per-pod {ctx}");
        for ((ow, ov), (lw, lv)) in opp.iter().zip(&l.per_pod_utilization) {
            assert!(ow == lw && (ov - lv).abs() <= 0.05, "per-pod {ctx}");
        }
        assert_eq!(o.last_sample_at, l.last_sample_at, "last sample {ctx}");
    }
}

#[tokio::test]
async fn live_and_offline_agree() {
    let now = now_secs();
    for exported in [false, true] {
        let om = mixed(now, exported);
        let text = om.text();
        let (_prom, client) = start(&om).await;
        let live = fetch(&client, SchemeChoice::Auto, at(now)).await;
        let scheme = live::detect_scheme(&client, SchemeChoice::Auto, at(now))
            .await
            .expect("detect");
        assert_eq!(
            scheme,
            LabelScheme::detect(
                if exported {
                    SchemeChoice::Exported
                } else {
                    SchemeChoice::Plain
                },
                ["Hostname", "UUID"]
            )
        );
        let parsed = exposition::parse(
            &text,
            &[fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED],
            at(now),
        );
        assert_eq!(parsed.skipped_lines, 0, "{:?}", parsed.first_skip);
        let offline = series::reduce(&parsed.series, &scheme, &window(), at(now));
        assert_eq!(live.len(), 10, "{live:#?}");
        let what = if exported { "exported" } else { "plain" };
        assert_agree(&offline, &live, &format!("{what} scheme"));
        // Off the 30 s grid: subquery steps no longer fall on `now`.
        let later = at(now + 7);
        let live_later = fetch(&client, SchemeChoice::Auto, later).await;
        let offline_later = series::reduce(&parsed.series, &scheme, &window(), later);
        assert_agree(
            &offline_later,
            &live_later,
            &format!("{what} scheme, off-grid"),
        );
        // Spot checks that the mix exercises what it should.
        let m8 = find(&live, "GPU-m8", None);
        assert_eq!(m8.workloads, vec![wl("t5", "i")], "only the current holder");
        assert!(find(&live, "GPU-m4", None).utilization.is_none(), "stale");
        assert!(find(&live, "GPU-m1", None).coverage < 0.7);
    }
}

async fn query_count_for(devices: usize) -> (u32, u32, usize) {
    let now = now_secs();
    let mut om = Om::default();
    for i in 0..devices {
        let uuid = format!("GPU-{i:04}");
        let pod = format!("p{i}");
        let labels = dev(&uuid, &[("pod", &pod), ("namespace", "ns")]);
        om.series(
            fields::GR_ENGINE_ACTIVE,
            &labels,
            every(now, 600, |t| noise(i as u64, t)),
        );
        om.series(
            fields::GPU_UTIL,
            &labels,
            every(now, 600, |t| noise(i as u64, t) * 100.0),
        );
        om.series(fields::FB_USED, &labels, every(now, 600, |_| 100.0));
    }
    let (_prom, client) = start(&om).await;
    let mut source = LiveUsage::new(Some(Arc::new(client)), settings(SchemeChoice::Auto));
    let first = source.fetch_at(at(now - 30)).await;
    let second = source.fetch_at(at(now)).await;
    let d = second.usage.devices;
    assert!(
        d.iter()
            .all(|x| x.workloads.len() == 1 && (x.coverage - 1.0).abs() < 1e-9)
    );
    (first.stats.queries, second.stats.queries, d.len())
}

#[tokio::test]
async fn query_count_is_constant_in_device_count() {
    let small = query_count_for(5).await;
    let large = query_count_for(500).await;
    assert_eq!(small, (1, 1, 5));
    assert_eq!(large, (1, 1, 500));
}

/// A shard's refresh asks only for the devices its nodes' names (or its exporter pods' names)
/// carry in `Hostname`: the answer holds no other node's series, so the fleet's Prometheus work
/// does not grow with the number of shards; no names, no query.
#[tokio::test]
async fn a_scoped_refresh_reads_only_the_named_nodes_devices() {
    let now = now_secs();
    let mut om = Om::default();
    // Two real node names (one with dots, as on EKS) and one exporter pod name standing in for
    // a node (dcgm-exporter without NODE_NAME reports its pod's name, dcgm-exporter#188).
    let hosts = [
        "gpu-node-1",
        "ip-10-0-1-2.ec2.internal",
        "nvidia-dcgm-exporter-x7k2p",
        "ip-10-0-1-2xec2xinternal",
    ];
    for (i, host) in hosts.iter().enumerate() {
        let uuid = format!("GPU-{i:04}");
        let mut labels = dev(&uuid, &[]);
        labels.retain(|(k, _)| *k != "Hostname");
        labels.push(("Hostname", host));
        om.series(fields::GR_ENGINE_ACTIVE, &labels, every(now, 600, |_| 0.5));
    }
    let (prom, client) = start(&om).await;
    let another_client = || {
        PromClient::new(PromConfig::new(
            prom.url().parse().expect("prometheus url"),
            Duration::from_secs(60),
        ))
        .expect("client")
    };
    let mut source = LiveUsage::new(Some(Arc::new(client)), settings(SchemeChoice::Auto));
    source.set_scope(live::Scope::Named {
        label: "Hostname".into(),
        values: vec![
            "ip-10-0-1-2.ec2.internal".into(),
            "nvidia-dcgm-exporter-x7k2p".into(),
        ],
    });
    let scoped = source.fetch_at(at(now)).await;
    assert!(scoped.error.is_none(), "{:?}", scoped.error);
    let mut hosts_read: Vec<&str> = scoped
        .usage
        .devices
        .iter()
        .filter_map(|d| d.hostname.as_deref())
        .collect();
    hosts_read.sort_unstable();
    assert_eq!(
        hosts_read,
        ["ip-10-0-1-2.ec2.internal", "nvidia-dcgm-exporter-x7k2p"]
    );

    let mut nothing = LiveUsage::new(
        Some(Arc::new(another_client())),
        settings(SchemeChoice::Auto),
    );
    nothing.set_scope(live::Scope::Named {
        label: "Hostname".into(),
        values: Vec::new(),
    });
    let empty = nothing.fetch_at(at(now)).await;
    assert_eq!(empty.stats.queries, 0);
    assert!(empty.usage.available && empty.usage.devices.is_empty());

    let all = fetch(&another_client(), SchemeChoice::Auto, at(now)).await;
    assert_eq!(all.len(), hosts.len());
}

#[tokio::test]
async fn errors_are_typed() {
    let mut om = Om::default();
    om.series(
        fields::GPU_UTIL,
        &dev("GPU-e", &[]),
        every(now_secs(), 60, |_| 1.0),
    );
    let (_prom, client) = start(&om).await;
    let err = client
        .instant("sum(", at(now_secs()))
        .await
        .expect_err("bad query");
    assert_eq!(err.kind(), "status", "{err}");
    let dead = PromClient::new(PromConfig::new(
        "http://127.0.0.1:9/".parse().expect("url"),
        Duration::from_secs(5),
    ))
    .expect("client");
    let err = dead
        .instant("up", at(now_secs()))
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), "transport", "{err}");
    let _ = History::default();
}

/// The same GPUs twice: under the legacy names all along (one exporter pod), and renamed: GPU-r
/// legacy before `now - 300` and canonical after (a new exporter pod), GPU-n canonical only,
/// GPU-x with DCGM series but none of the fields read.
fn legacy_and_renamed(now: i64) -> (Om, Om) {
    const MIB: f64 = 1024.0 * 1024.0;
    let switch = now - 300;
    let workload = [("exported_namespace", "ml"), ("exported_pod", "nb-0")];
    let old_pod = [
        ("pod", "nvidia-dcgm-exporter-old"),
        ("instance", "10.0.0.1:9400"),
    ];
    let new_pod = [
        ("pod", "nvidia-dcgm-exporter-new"),
        ("instance", "10.0.0.2:9400"),
    ];
    let labels = |uuid: &'static str, pod: &[(&'static str, &'static str)]| {
        let mut l = dev(uuid, &workload);
        l.extend_from_slice(pod);
        l
    };
    let before = |t: &(i64, f64)| t.0 < switch;
    let after = |t: &(i64, f64)| t.0 >= switch;
    let scaled =
        |s: Vec<(i64, f64)>, k: f64| s.into_iter().map(|(t, v)| (t, v * k)).collect::<Vec<_>>();
    let span = 3600;
    let idle = every(now, span, |_| 0.0);
    let busy = every(now, span, |_| 0.42);
    let fb = every(now, span, |_| 2048.0);

    // The same GPUs under the legacy names all along (one exporter pod).
    let mut legacy = Om::default();
    for (uuid, ratio) in [("GPU-r", &idle), ("GPU-n", &busy)] {
        legacy.series(
            fields::GR_ENGINE_ACTIVE,
            &labels(uuid, &old_pod),
            ratio.clone(),
        );
        legacy.series(
            fields::GPU_UTIL,
            &labels(uuid, &old_pod),
            scaled(ratio.clone(), 100.0),
        );
        legacy.series(fields::FB_USED, &labels(uuid, &old_pod), fb.clone());
    }
    // GPU-r: legacy names before the switch, canonical names after; GPU-n: canonical names only;
    // GPU-x: DCGM series, but none of the fields read.
    let mut renamed = Om::default();
    let part = |s: &Vec<(i64, f64)>, keep: &dyn Fn(&(i64, f64)) -> bool| {
        s.iter().copied().filter(|x| keep(x)).collect::<Vec<_>>()
    };
    renamed.series(
        fields::GR_ENGINE_ACTIVE,
        &labels("GPU-r", &old_pod),
        part(&idle, &before),
    );
    renamed.series(
        fields::GPU_UTIL,
        &labels("GPU-r", &old_pod),
        part(&idle, &before),
    );
    renamed.series(
        fields::FB_USED,
        &labels("GPU-r", &old_pod),
        part(&fb, &before),
    );
    let canonical =
        |om: &mut Om, uuid: &'static str, ratio: Vec<(i64, f64)>, fb: Vec<(i64, f64)>| {
            om.series(
                "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
                &labels(uuid, &new_pod),
                ratio.clone(),
            );
            om.series("DCGM_FI_DEV_GPU_UTIL_RATIO", &labels(uuid, &new_pod), ratio);
            om.series(
                "DCGM_FI_DEV_FB_USED_BYTES",
                &labels(uuid, &new_pod),
                scaled(fb, MIB),
            );
        };
    canonical(
        &mut renamed,
        "GPU-r",
        part(&idle, &after),
        part(&fb, &after),
    );
    canonical(&mut renamed, "GPU-n", busy.clone(), fb.clone());
    renamed.series(
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        &labels("GPU-x", &new_pod),
        every(now, span, |_| 40.0),
    );
    renamed.series(
        "DCGM_FI_DEV_SOME_FUTURE_UTIL",
        &labels("GPU-x", &new_pod),
        every(now, span, |_| 0.5),
    );

    (legacy, renamed)
}

/// dcgm-exporter's names by meaning, live: a GPU whose exporter is replaced mid-window (legacy
/// names and the old exporter pod before, DCGM 4.7's canonical names, other units and a new pod
/// after) and a GPU under the canonical names only read exactly as the same GPUs under the
/// legacy names all along; the start-up history finds activity under the canonical names (each
/// spelling compared with the threshold in its own unit); and a GPU with DCGM series but none of
/// the fields read is counted (`gpu_ledger_dcgm_devices_fields_missing`). Names and units:
/// `tests/fixtures/dcgm-renamed/README.md`.
#[tokio::test]
async fn dcgm_canonical_names_and_a_rolling_upgrade_read_live() {
    const MIB: f64 = 1024.0 * 1024.0;
    let now = now_secs();
    let (legacy, renamed) = legacy_and_renamed(now);
    let (_legacy_prom, legacy_client) = start(&legacy).await;
    let (_renamed_prom, renamed_client) = start(&renamed).await;
    let want = fetch(&legacy_client, SchemeChoice::Auto, at(now)).await;
    let got = fetch(&renamed_client, SchemeChoice::Auto, at(now)).await;
    assert_agree(&want, &got, "canonical names and a mid-window rename");
    let r = find(&got, "GPU-r", None);
    assert!(
        r.coverage >= 0.99 && close(r.peak, 0.0),
        "the renamed GPU is covered across the switch and idle: {r:#?}"
    );
    assert_eq!(
        r.memory_used_bytes,
        Some(2048.0 * MIB),
        "bytes, not MiB x MiB"
    );
    let n = find(&got, "GPU-n", None);
    assert_eq!(n.signal, Some(Signal::GrEngineActive));
    assert!(close(n.utilization, 0.42) && close(n.peak, 0.42), "{n:#?}");

    // Start-up history: activity under the canonical ratio names is activity (0.42 >= 5 %).
    let h = bootstrap_at(&renamed_client, now).await;
    let key = |u: &str| DeviceKey {
        uuid: u.into(),
        gpu_instance: None,
    };
    let active = h
        .get(&key("GPU-n"))
        .and_then(|e| e.last_active_at)
        .expect("GPU-n active in the history");
    assert!((at(now) - active).num_seconds() <= STEP, "{active}");
    assert_eq!(
        h.get(&key("GPU-r")).and_then(|e| e.last_active_at),
        None,
        "the idle GPU was never active under either name"
    );

    // Field coverage: GPU-x alone has DCGM series but none of the fields read.
    assert_eq!(
        renamed_client
            .devices_fields_missing("", at(now))
            .await
            .expect("count"),
        1
    );
    assert_eq!(
        legacy_client
            .devices_fields_missing("", at(now))
            .await
            .expect("count"),
        0
    );
}

/// The homelab dumps `report --from` reads (`examples/homelab`).
fn homelab_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/homelab")
}

/// The homelab DCGM dump's newest sample (2026-11-28T09:00:00Z): the reports' instant.
fn homelab_at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-28T09:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// A rolling dcgm-exporter upgrade on `lab-1`: the legacy homelab dump's samples before
/// `switch_ms`, the canonical-name dump's (`tests/fixtures/dcgm-renamed/dcgm.prom`) from then
/// on; the other nodes stay legacy.
fn rolling_upgrade(legacy: &str, renamed: &str, switch_ms: i64) -> String {
    let host_and_time = |line: &str| -> Option<(String, i64)> {
        let host = line.split("Hostname=\"").nth(1)?.split('"').next()?;
        let time = line.rsplit(' ').next()?.parse().ok()?;
        Some((host.to_string(), time))
    };
    let mut out: Vec<&str> = legacy
        .lines()
        .filter(|l| host_and_time(l).is_none_or(|(h, t)| h != "lab-1" || t < switch_ms))
        .collect();
    let upgraded: Vec<&str> = renamed
        .lines()
        .filter(|l| host_and_time(l).is_some_and(|(h, t)| h == "lab-1" && t >= switch_ms))
        .collect();
    assert!(
        upgraded
            .iter()
            .any(|l| l.starts_with("DCGM_FI_DEV_FB_USED_BYTES{"))
            && out
                .iter()
                .any(|l| l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains("\"lab-1\"")),
        "lab-1 under both spellings"
    );
    out.extend(upgraded);
    out.join("\n") + "\n"
}

/// Every series of a `/federate` dump (millisecond timestamps) as `OpenMetrics` for promtool.
fn backfill_of(dump: &str, at: DateTime<Utc>) -> Om {
    let mut names: Vec<&str> = dump
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    names.sort_unstable();
    names.dedup();
    let parsed = exposition::parse(dump, &names, at);
    assert_eq!(parsed.skipped_lines, 0, "{:?}", parsed.first_skip);
    let mut om = Om::default();
    for s in &parsed.series {
        let labels: Vec<(&str, &str)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(s.samples.iter().all(|(t, _)| t % 1000 == 0), "{}", s.name);
        om.series(
            &s.name,
            &labels,
            s.samples.iter().map(|(t, v)| (t / 1000, *v)),
        );
    }
    om
}

/// What the live path and the offline path make of the same homelab DCGM samples at the
/// homelab's instant: (live devices, offline devices, live ledger JSON, offline ledger JSON as
/// `report -o json` prints it, live ledger as the same JSON).
async fn live_and_offline(dump: &str) -> (Vec<DeviceUsage>, Vec<DeviceUsage>, String, String) {
    use gpu_ledger::app::offline::{self, OfflineInput};
    use gpu_ledger::claims::files::{self, DumpPaths};
    use gpu_ledger::ledger::usage::Usage;
    use gpu_ledger::ledger::{self, Policy};
    use gpu_ledger::usage::dump::{self, DumpSettings};

    let at = homelab_at();
    let policy = Policy::default();
    let window = Window {
        length: chrono::Duration::minutes(10),
        interval: chrono::Duration::seconds(30),
        idle_threshold: policy.idle_threshold,
        max_staleness: policy.max_staleness,
    };
    let dir = tempfile::tempdir().expect("tmp");
    for f in std::fs::read_dir(homelab_dir()).expect("homelab") {
        let f = f.expect("entry").path();
        if f.extension().is_some_and(|x| x == "json") {
            std::fs::copy(&f, dir.path().join(f.file_name().expect("name"))).expect("copy");
        }
    }
    let dcgm = dir.path().join("dcgm.prom");
    std::fs::write(&dcgm, dump).expect("write dump");

    // Offline: the dump path (`report --from DIR --at T`).
    let offline_devices = dump::load(
        &dcgm,
        &DumpSettings {
            at: Some(at),
            window: window.length,
            scrape_interval: Some(window.interval),
            scheme: SchemeChoice::Auto,
            idle_threshold: window.idle_threshold,
            max_staleness: window.max_staleness,
            max_bytes: dump::DEFAULT_MAX_DUMP_BYTES,
            selector: None,
        },
        at,
    )
    .expect("dump loads")
    .usage
    .devices;
    let mut input = OfflineInput::from_dir(dir.path());
    input.at = Some(at);
    input.scrape_interval = Some(window.interval);
    let offline = offline::load(&input, at).expect("offline report");

    // Live: the same samples backfilled into a real Prometheus, read by the live source.
    let (_prom, client) = start(&backfill_of(dump, at)).await;
    let settings = LiveSettings {
        window,
        ..settings(SchemeChoice::Auto)
    };
    // As `serve` reads: the start-up history over the lookback, then the window merged into it.
    let scheme = live::detect_scheme(&client, SchemeChoice::Auto, at)
        .await
        .expect("detect");
    let mut history = live::bootstrap(
        &client,
        &scheme,
        &window,
        history::DEFAULT_LOOKBACK,
        settings.min_coverage,
        at,
    )
    .await
    .expect("bootstrap");
    let live_devices = live::fetch_window(&client, &settings, Some(&mut history), at)
        .await
        .expect("live fetch");
    let claims = files::load(&DumpPaths::from_dir(dir.path()), &policy.names).expect("claims");
    let live = ledger::build(
        &claims,
        &Usage {
            hami: Vec::new(),
            devices: live_devices.clone(),
            available: true,
            partial: false,
            ..Usage::default()
        },
        at,
        &policy,
    );
    let json = |l: &gpu_ledger::ledger::Ledger| {
        let mut out = Vec::new();
        gpu_ledger::report::render_json(l, &mut out).expect("render json");
        String::from_utf8(out).expect("utf8")
    };
    (
        live_devices,
        offline_devices,
        json(&live),
        json(&offline.ledger),
    )
}

/// The paths (`pods.3.idle`) where `a` and `b` differ, with both values.
fn json_diff(a: &serde_json::Value, b: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                json_diff(l, r, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                json_diff(l, r, &format!("{path}.{i}"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} vs {b}")),
        _ => {}
    }
}

/// Fails listing where two reports differ.
fn assert_same_report(a: &serde_json::Value, b: &serde_json::Value, what: &str) {
    let mut diff = Vec::new();
    json_diff(a, b, "", &mut diff);
    assert!(diff.is_empty(), "{what} differ at:\n{}", diff.join("\n"));
}

fn json_of(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("report JSON")
}

/// Fails naming the first device that differs and the lines of it that differ.
fn assert_same_devices(a: &[DeviceUsage], b: &[DeviceUsage], what: &str) {
    let keys = |d: &[DeviceUsage]| d.iter().map(|x| x.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(a), keys(b), "{what}: same devices");
    for (x, y) in a.iter().zip(b) {
        if x != y {
            let (xs, ys) = (format!("{x:#?}"), format!("{y:#?}"));
            let differ: Vec<String> = xs
                .lines()
                .zip(ys.lines())
                .filter(|(l, r)| l != r)
                .map(|(l, r)| format!("  {}\n  {}", l.trim(), r.trim()))
                .collect();
            panic!("{what}: {:?} differs:\n{}", x.key, differ.join("\n"));
        }
    }
}

/// Issue 37's done-when: offline and live agree on a rolling-upgrade dump (`lab-1`'s exporter
/// switches from the legacy names to DCGM 4.7's canonical names five minutes before the
/// report's instant, inside its 10-minute window) and on the all-new-names homelab dump
/// (`tests/fixtures/dcgm-renamed/dcgm.prom`): per device the same signal, utilisation, peak,
/// coverage, memory bytes, workloads and last sample, live (backfilled into a real Prometheus,
/// read as `serve` reads: `live::bootstrap`, then `live::fetch_window` merged into that history)
/// and offline (`usage::dump::load`, `report --from`), and the same `report -o json`; and both
/// equal the legacy dump's devices and report (the same verdicts), so a spelling lost on either
/// path fails. The legacy dump itself agrees live and offline (the comparison's baseline).
/// Equal includes each device's covered run and last activity and each pod's `idle_seconds`
/// (7,200 s, the dump's two hours): the upgrade inside the start-up history's lookback resets
/// nothing.
#[tokio::test]
async fn live_and_offline_agree_on_renamed_and_rolling_upgrade_dumps() {
    let legacy = std::fs::read_to_string(homelab_dir().join("dcgm.prom")).expect("legacy dump");
    let renamed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/dcgm-renamed/dcgm.prom"),
    )
    .expect("renamed dump");
    let switch_ms = homelab_at().timestamp_millis() - 300_000;
    let rolling = rolling_upgrade(&legacy, &renamed, switch_ms);

    let (legacy_live, legacy_offline, legacy_live_json, legacy_json) =
        live_and_offline(&legacy).await;
    assert_same_devices(
        &legacy_offline,
        &legacy_live,
        "legacy dump: offline and live",
    );
    assert_eq!(
        legacy_json, legacy_live_json,
        "legacy dump: offline and live report"
    );
    assert!(
        legacy_offline.iter().any(|d| d.memory_used_bytes.is_some())
            && legacy_offline.iter().any(|d| d.utilization.is_some()),
        "the homelab has readings to lose: {legacy_offline:#?}"
    );

    for (what, dump) in [("all-new-names", &renamed), ("rolling-upgrade", &rolling)] {
        // Every device's covered run too: the start-up history reads each device across all
        // of its series (both spellings, old and new exporter pod), so `lab-1`'s switch is no
        // gap and live idleness reaches back as far as the offline reduction's (the dump's
        // 30 s samples start and switch on the history query's 5-minute bucket ends, so not
        // even a bucket's rounding separates them).
        let (live, offline, live_json, offline_json) = live_and_offline(dump).await;
        let (live_report, offline_report) = (json_of(&live_json), json_of(&offline_json));
        // The upgraded node's idle notebook, named: idle for the dump's whole two hours.
        let alice = live_report["pods"]
            .as_array()
            .and_then(|pods| pods.iter().find(|p| p["pod"] == "alice-nb-0"))
            .map(|p| p["idle_seconds"].clone());
        assert_eq!(
            alice,
            Some(serde_json::json!(7200.0)),
            "{what}: live idle seconds of lab-1's team-ml/alice-nb-0"
        );
        assert_same_devices(&offline, &live, &format!("{what} dump: offline and live"));
        assert_same_report(
            &offline_report,
            &live_report,
            &format!("{what} dump: offline and live reports"),
        );
        // Both equal the legacy reading of the same GPUs (units converted per series).
        let keys = |d: &[DeviceUsage]| d.iter().map(|x| x.key.clone()).collect::<Vec<_>>();
        assert_eq!(
            keys(&offline),
            keys(&legacy_offline),
            "{what}: same devices"
        );
        for (got, want) in offline.iter().zip(&legacy_offline) {
            let ctx = format!("{what}: {:?}\ngot {got:#?}\nlegacy {want:#?}", got.key);
            let near = |a: Option<f64>, b: Option<f64>, tolerance: f64| match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => (a - b).abs() <= tolerance,
                _ => false,
            };
            assert_eq!(got.signal, want.signal, "signal {ctx}");
            assert!(
                near(got.utilization, want.utilization, 1e-9),
                "utilization {ctx}"
            );
            assert!(near(got.peak, want.peak, 1e-9), "peak {ctx}");
            assert!(
                (got.coverage - want.coverage).abs() <= 1e-9,
                "coverage {ctx}"
            );
            assert!(
                near(got.memory_used_bytes, want.memory_used_bytes, 0.5),
                "memory bytes {ctx}"
            );
            assert_eq!(got.workloads, want.workloads, "workloads {ctx}");
            assert_eq!(got.last_sample_at, want.last_sample_at, "last sample {ctx}");
        }
        assert_eq!(
            offline_json, legacy_json,
            "{what} dump: the legacy dump's report"
        );
    }
}

/// The start-up history of `client`'s devices at `now`, as `serve` builds it (default lookback,
/// the tests' window and 90 % coverage).
async fn bootstrap_at(client: &PromClient, now: i64) -> History {
    let scheme = live::detect_scheme(client, SchemeChoice::Auto, at(now))
        .await
        .expect("detect");
    live::bootstrap(
        client,
        &scheme,
        &window(),
        history::DEFAULT_LOOKBACK,
        0.9,
        at(now),
    )
    .await
    .expect("bootstrap")
}

/// The history's entry of the whole GPU `uuid`.
fn entry_of(h: &History, uuid: &str) -> history::Entry {
    *h.get(&DeviceKey {
        uuid: uuid.into(),
        gpu_instance: None,
    })
    .unwrap_or_else(|| panic!("{uuid} in the history"))
}

/// Whether `t` lies at `truth` or up to one start-up bucket after it (bucket ends err late; a
/// sample's own step earlier, since a covered run starts at a sample).
fn within_a_bucket_after(t: DateTime<Utc>, truth: i64) -> bool {
    (-STEP..=bucket_secs()).contains(&(t - at(truth)).num_seconds())
}

/// The width of the start-up history's buckets, in seconds.
fn bucket_secs() -> i64 {
    gpu_ledger::usage::prom::queries::bootstrap_bucket(&window(), history::DEFAULT_LOOKBACK)
        .num_seconds()
}

/// An exporter pod restart (new `pod` and `instance` labels, the same names, no scrape missed)
/// two hours before start-up continues the device: the start-up history keeps it covered for the
/// whole day, so a GPU idle all day is idle all day, not since the restart. Two restarts: one
/// in the middle of a start-up bucket (both series' buckets there are partly filled) and one on
/// a bucket's end (the new series' first bucket follows one in which it had no sample). A real
/// gap of 20 minutes across a restart still breaks the run.
#[tokio::test]
async fn history_bootstrap_spans_an_exporter_restart_but_not_a_gap() {
    let now = now_secs();
    let day = 24 * 3600;
    let bucket = bucket_secs();
    // Bucket ends are multiples of the bucket width (Prometheus aligns subquery steps so).
    let on_a_bucket_end = now - 2 * 3600 - (now - 2 * 3600).rem_euclid(bucket);
    let exporter = |n: &'static str, ip: &'static str| [("pod", n), ("instance", ip)];
    let restarts = [
        ("GPU-mid", on_a_bucket_end + 150),
        ("GPU-edge", on_a_bucket_end + STEP),
    ];
    let mut om = Om::default();
    for (uuid, restart) in restarts {
        let samples = every(now, day, |_| 0.0);
        let (before, after): (Vec<_>, Vec<_>) =
            samples.into_iter().partition(|(t, _)| *t < restart);
        let old = exporter("nvidia-dcgm-exporter-old", "10.0.0.1:9400");
        let new = exporter("nvidia-dcgm-exporter-new", "10.0.0.2:9400");
        om.series(fields::GR_ENGINE_ACTIVE, &dev(uuid, &old), before);
        om.series(fields::GR_ENGINE_ACTIVE, &dev(uuid, &new), after);
    }
    // Old exporter gone 20 minutes before the new one's first scrape.
    let gap_end = now - 2 * 3600;
    let samples = every(now, day, |_| 0.0);
    let (before, after): (Vec<_>, Vec<_>) = samples.into_iter().partition(|(t, _)| *t < gap_end);
    let before: Vec<_> = before
        .into_iter()
        .filter(|(t, _)| *t < gap_end - 1200)
        .collect();
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev(
            "GPU-gap",
            &exporter("nvidia-dcgm-exporter-old", "10.0.0.1:9400"),
        ),
        before,
    );
    om.series(
        fields::GR_ENGINE_ACTIVE,
        &dev(
            "GPU-gap",
            &exporter("nvidia-dcgm-exporter-new", "10.0.0.2:9400"),
        ),
        after,
    );
    let (_prom, client) = start(&om).await;
    let h = bootstrap_at(&client, now).await;
    let mut broken = Vec::new();
    for (uuid, restart) in restarts {
        let e = entry_of(&h, uuid);
        let since = e.covered_since.expect("covered");
        if !within_a_bucket_after(since, now - day + STEP) {
            broken.push(format!(
                "{uuid}: covered since {since}, not since the day's first sample {} (the \
                 restart was at {})",
                at(now - day + STEP),
                at(restart)
            ));
        }
        assert_eq!(e.last_active_at, None, "{uuid}");
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    let since = entry_of(&h, "GPU-gap").covered_since.expect("covered");
    assert!(
        within_a_bucket_after(since, gap_end),
        "a 20-minute gap breaks the run: covered since {since}, expected from {}",
        at(gap_end)
    );
}

/// An exporter upgrade that renames the field and changes no other label (an exporter on the
/// host network, scraped with `honor_labels`): PromQL functions drop the metric name, so the old
/// and the new name's series of the device look alike. The start-up history reads both: activity
/// under the new name after the switch is the device's last activity, and the switch is no gap.
#[tokio::test]
async fn history_bootstrap_reads_both_names_of_a_device_with_equal_labels() {
    let now = now_secs();
    let day = 24 * 3600;
    let switch = now - 2 * 3600;
    // Busy under the legacy percentage until 3 h ago, then idle; busy under the ratio name for
    // five minutes an hour ago, then idle.
    let legacy: Vec<_> = every(now, day, |t| if t < now - 3 * 3600 { 50.0 } else { 0.0 })
        .into_iter()
        .filter(|(t, _)| *t < switch)
        .collect();
    let burst = now - 3600;
    let renamed: Vec<_> = every(now, day, |t| {
        if (burst - 300..=burst).contains(&t) {
            0.5
        } else {
            0.0
        }
    })
    .into_iter()
    .filter(|(t, _)| *t >= switch)
    .collect();
    let mut om = Om::default();
    om.series(fields::GPU_UTIL, &dev("GPU-ren", &[]), legacy);
    om.series("DCGM_FI_DEV_GPU_UTIL_RATIO", &dev("GPU-ren", &[]), renamed);
    let (_prom, client) = start(&om).await;
    let e = entry_of(&bootstrap_at(&client, now).await, "GPU-ren");
    let active = e.last_active_at.expect("active in the history");
    assert!(
        within_a_bucket_after(active, burst),
        "last active {active}, expected the burst under the new name at {}",
        at(burst)
    );
    let since = e.covered_since.expect("covered");
    assert!(
        within_a_bucket_after(since, now - day + STEP),
        "covered since {since}, not since the day's first sample {} (the switch was at {})",
        at(now - day + STEP),
        at(switch)
    );
}
