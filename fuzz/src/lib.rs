//! Fuzz target bodies for gpu-ledger's parsers of outside input.
//!
//! Each function takes arbitrary bytes, must never panic, and asserts the parser's invariants.
//! The cargo-fuzz binaries in `fuzz_targets/` call them under libFuzzer; `tests/fuzz_regressions.rs`
//! compiles this same file (`#[path]`) and replays `fuzz/regressions/<target>/*` and
//! `fuzz/seeds/<target>/*` on stable as part of `cargo test`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use gpu_ledger::claims::files::{self, DumpPaths};
use gpu_ledger::claims::kinds;
use gpu_ledger::claims::quantity::parse_units;
use gpu_ledger::ledger::units::ResourceNames;
use gpu_ledger::usage::exposition;
use gpu_ledger::usage::fields;
use gpu_ledger::usage::prom::{self, ApiResponse};
use gpu_ledger::usage::series::{self, Labels, Series};

/// Metric names the exposition target keeps (the DCGM fields plus short names a fuzzer finds).
const KEEP: &[&str] = &[
    fields::GR_ENGINE_ACTIVE,
    fields::GPU_UTIL,
    fields::FB_USED,
    fields::HAMI_UTIL,
    fields::HAMI_LAST_KERNEL,
    "Device_utilization_desc_of_container",
    "a",
    "b",
];

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_000, 0).expect("valid time")
}

/// Text exposition: never panics, and what was parsed renders back to text that re-parses with
/// no skipped line into the same series (names, labels, samples).
pub fn exposition(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let first = exposition::parse(&text, KEEP, t0());
    assert!(first.skipped_lines <= text.lines().count());
    assert_eq!(first.skipped_lines == 0, first.first_skip.is_none());
    let rendered = render_series(&first.series);
    let second = exposition::parse(&rendered, KEEP, t0());
    assert_eq!(
        second.skipped_lines, 0,
        "re-parse skipped {:?} in\n{rendered}",
        second.first_skip
    );
    assert_eq!(
        comparable(&first.series),
        comparable(&second.series),
        "round trip changed the series; rendered:\n{rendered}"
    );
    // HAMi's monitor series reduce without panicking, whatever their labels and values.
    let window = gpu_ledger::ledger::usage::Window {
        length: chrono::Duration::minutes(10),
        interval: chrono::Duration::seconds(30),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    };
    let _ = gpu_ledger::usage::hami::reduce(&first.series, &window, t0());
}

/// Renders series in the text format (millisecond timestamps, escaped label values).
pub fn render_series(series: &[Series]) -> String {
    let mut out = String::new();
    for s in series {
        let mut labels = String::new();
        for (i, (k, v)) in s.labels.iter().enumerate() {
            if i > 0 {
                labels.push(',');
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(labels, "{k}=\"{v}\"");
        }
        for (t, v) in &s.samples {
            let _ = writeln!(out, "{}{{{labels}}} {} {t}", s.name, render_value(*v));
        }
    }
    out
}

fn render_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:e}")
    }
}

/// Series with only the labels the sample window keeps.
fn read_labels_only(mut series: Vec<Series>) -> Vec<Series> {
    for s in &mut series {
        std::sync::Arc::make_mut(&mut s.labels)
            .retain(|k, _| gpu_ledger::usage::scheme::READ_LABELS.contains(&k.as_str()));
    }
    series
}

type Comparable = Vec<(String, Labels, Vec<(i64, u64)>)>;

/// Series with values as bits (every NaN the same), so equality is exact and NaN-safe.
fn comparable(series: &[Series]) -> Comparable {
    series
        .iter()
        .map(|s| {
            let samples = s
                .samples
                .iter()
                .map(|(t, v)| {
                    let bits = if v.is_nan() {
                        f64::NAN.to_bits()
                    } else {
                        v.to_bits()
                    };
                    (*t, bits)
                })
                .collect();
            (s.name.clone(), (*s.labels).clone(), samples)
        })
        .collect()
}

/// Prometheus HTTP API answer: decoding and sample conversion never panic; a decoded vector keeps
/// one sample per element; sample values as Prometheus prints them round-trip.
pub fn prom_response(data: &[u8]) {
    if let Ok(r) = serde_json::from_slice::<ApiResponse<prom::QueryData>>(data)
        && let Some(d) = r.data
    {
        let expected = match &d {
            prom::QueryData::Vector(v) => Some(v.len()),
            prom::QueryData::Scalar(_) => Some(1),
            _ => None,
        };
        let got = d.into_samples().map(|s| s.len()).ok();
        if got.is_some() {
            assert_eq!(got, expected);
        }
    }
    // The window decoder (one scan of the whole answer, envelope and `data`: labels cut while
    // decoding, values borrowed from the body) agrees with the envelope read alone followed by
    // the full decoder and the cut: an answer whose envelope reads and the full one reads, it
    // reads alike, with the same series; both refuse an answer over a bound alike; an answer
    // whose envelope does not read, it refuses.
    let full = prom::decode::query_data(data).and_then(prom::QueryData::into_series);
    let window = prom::decode::window(data).map(|m| comparable(&m.into_series()));
    let envelope_reads = serde_json::from_slice::<ApiResponse<serde::de::IgnoredAny>>(data).is_ok();
    match &full {
        _ if !envelope_reads => assert!(
            window.is_err(),
            "the window decoder refuses what the envelope refuses"
        ),
        Ok(full) => {
            let mut cut = read_labels_only(full.clone());
            series::to_internal_fields(&mut cut);
            assert_eq!(
                Some(&comparable(&cut)),
                window.as_ref().ok(),
                "window decode differs"
            );
        }
        Err(e) => assert_eq!(
            Some(e.kind()),
            window.as_ref().err().map(prom::PromError::kind),
            "the window decoder refuses what the full one refuses"
        ),
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = prom::parse_value(s);
    }
    if let Some(bytes) = data.get(..8) {
        let v = f64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        let printed = render_value(v);
        let back = prom::parse_value(&printed).expect("printed value parses");
        assert!(
            back.to_bits() == v.to_bits() || (v.is_nan() && back.is_nan()),
            "{v:?} printed {printed} parsed {back:?}"
        );
    }
}

/// Kubernetes quantities: never panics; every `u64` written in decimal (and as milli-units when
/// that fits) parses to itself; a plain decimal integer input parses to its value.
pub fn quantity(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let r = parse_units(&s);
    if let Ok(n) = s.trim().parse::<u64>() {
        assert_eq!(r, Ok(n), "{s:?}");
    }
    if let Some(bytes) = data.get(..8) {
        let n = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        assert_eq!(parse_units(&n.to_string()), Ok(n));
        if let Some(milli) = n.checked_mul(1000) {
            assert_eq!(parse_units(&format!("{milli}m")), Ok(n));
        }
    }
}

const EMPTY_LIST: &str = r#"{"apiVersion":"v1","kind":"List","items":[]}"#;
const ONE_NODE: &str = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},"status":{"allocatable":{"nvidia.com/gpu":"2"}}}]}"#;

/// A scratch directory with the two filler dumps (empty list, one node), made once per process.
fn scratch() -> &'static (PathBuf, (PathBuf, PathBuf)) {
    static DIR: OnceLock<(PathBuf, (PathBuf, PathBuf))> = OnceLock::new();
    DIR.get_or_init(|| {
        // Honours TMPDIR (scripts/fuzz-smoke.sh points it at a directory it removes afterwards).
        // Kept for the life of the process: libFuzzer exits without running destructors.
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-fuzz")
            .tempdir()
            .expect("scratch directory")
            .keep();
        let empty = dir.join("empty.json");
        let nodes = dir.join("nodes.json");
        std::fs::write(&empty, EMPTY_LIST).expect("write filler");
        std::fs::write(&nodes, ONE_NODE).expect("write filler");
        (dir, (empty, nodes))
    })
}

/// Offline kubectl dumps (JSON or YAML): the bytes are each claim kind's dump in turn (every
/// kind of the kinds table, in `load` order: pods, nodes, quotas, notebooks, statefulsets, the
/// DRA resourceclaims, resourceslices, deviceclasses, Kueue's resourceflavors, clusterqueues,
/// localqueues, workloads and its ConfigMap), the others valid lists; `load` never panics.
pub fn kubectl_list(data: &[u8]) {
    let (dir, fillers) = scratch();
    let input = dir.join("input.json");
    std::fs::write(&input, data).expect("write scratch dump");
    for target in kinds::KINDS {
        let mut paths = DumpPaths::default();
        for kind in kinds::KINDS {
            let path = if kind == target {
                input.clone()
            } else if kind == &kinds::NODES {
                fillers.1.clone()
            } else {
                fillers.0.clone()
            };
            paths = paths.with(kind, Some(path));
        }
        let _ = files::load(&paths, &ResourceNames::default());
    }
}

/// Removes the scratch directory of [`kubectl_list`] (for callers that exit normally).
pub fn remove_scratch() {
    let (dir, _) = scratch();
    let _ = std::fs::remove_dir_all(dir);
}
