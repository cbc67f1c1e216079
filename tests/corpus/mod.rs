//! The real-output corpus harness shared by the offline and live corpus tests: loads each case of
//! `tests/fixtures/dcgm-real/`, builds its history, and checks a ledger (as report JSON) against
//! the case's `expected.json`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};
use gpu_ledger::app::offline::{self, OfflineInput};
use serde_json::Value;

/// Samples of the history: the scrape repeated every [`STEP_SECS`] over the window, plus one.
pub const SAMPLES: i64 = 21;
pub const STEP_SECS: i64 = 30;

/// One case of the corpus.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    /// The scrape as the exporter printed it.
    pub scrape: String,
    pub expected: Value,
}

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dcgm-real")
}

/// Every case, in name order.
pub fn cases() -> Vec<Case> {
    let mut out: Vec<Case> = std::fs::read_dir(corpus_dir())
        .expect("tests/fixtures/dcgm-real exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .map(|dir| {
            let read = |f: &str| {
                std::fs::read_to_string(dir.join(f))
                    .unwrap_or_else(|e| panic!("{}/{f}: {e}", dir.display()))
            };
            Case {
                name: dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                scrape: read("dcgm.prom"),
                expected: serde_json::from_str(&read("expected.json"))
                    .unwrap_or_else(|e| panic!("{}/expected.json: {e}", dir.display())),
                dir,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The instant every case is observed at.
pub fn at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// The sample lines of a scrape (comments and blank lines dropped).
pub fn sample_lines(scrape: &str) -> impl Iterator<Item = &str> {
    scrape
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The scrape repeated every 30 s over the window ending at `end`, each line with its timestamp
/// in milliseconds (Prometheus text format).
pub fn history(scrape: &str, end: DateTime<Utc>) -> String {
    let mut out = String::new();
    for k in (0..SAMPLES).rev() {
        let t = (end - Duration::seconds(k * STEP_SECS)).timestamp_millis();
        for line in sample_lines(scrape) {
            out.push_str(line);
            out.push(' ');
            out.push_str(&t.to_string());
            out.push('\n');
        }
    }
    out
}

impl Case {
    /// A directory in the shape `report --from` reads: the case's claims and its history.
    pub fn offline_dir(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["pods.json", "nodes.json"] {
            std::fs::copy(self.dir.join(f), dir.path().join(f))
                .unwrap_or_else(|e| panic!("{}/{f}: {e}", self.dir.display()));
        }
        std::fs::write(dir.path().join("dcgm.prom"), history(&self.scrape, at()))
            .expect("write dcgm.prom");
        dir
    }

    /// The offline ledger of the case at [`at`], as report JSON.
    pub fn offline_ledger(&self) -> Value {
        let dir = self.offline_dir();
        let mut input = OfflineInput::from_dir(dir.path());
        input.at = Some(at());
        let loaded = offline::load(&input, at())
            .unwrap_or_else(|e| panic!("{}: offline load: {e}", self.name));
        serde_json::to_value(&loaded.ledger).expect("ledger serialises")
    }

    /// The expectation for `path`: `expected.json`, with its `scraped` sections replacing the
    /// top-level ones on the live path (a scrape adds the exporter's target labels, which can
    /// resolve more than the raw lines).
    fn expectation(&self, path: &str) -> Value {
        let mut e = self.expected.clone();
        if path == "live"
            && let Some(over) = self.expected.get("scraped").and_then(Value::as_object)
        {
            for (k, v) in over {
                if k != "note" {
                    e[k.as_str()] = v.clone();
                }
            }
        }
        e
    }

    /// Every difference between `ledger` (report JSON) and the case's expectation for `path`
    /// (`offline` or `live`).
    pub fn check(&self, ledger: &Value, path: &str) -> Vec<String> {
        let expected = self.expectation(path);
        let mut out = Vec::new();
        let mut fail = |what: String| out.push(format!("{} ({path}): {what}", self.name));
        let list = |v: &Value, key: &str| v[key].as_array().cloned().unwrap_or_default();
        let find = |rows: &[Value], keys: &[&str], want: &Value| {
            rows.iter()
                .find(|r| keys.iter().all(|k| r[*k] == want[*k]))
                .cloned()
        };
        for (section, keys) in [
            ("pods", &["namespace", "pod"][..]),
            ("nodes", &["node"][..]),
        ] {
            let got = list(ledger, section);
            let want = list(&expected, section);
            for w in &want {
                let Some(g) = find(&got, keys, w) else {
                    fail(format!("{section}: {w} missing; got {got:?}"));
                    continue;
                };
                let Some(fields) = w.as_object() else {
                    continue;
                };
                for (field, expected) in fields {
                    if !same(&g[field], expected) {
                        fail(format!(
                            "{section} {}: {field} = {}, expected {expected}",
                            keys.iter()
                                .map(|k| w[*k].to_string())
                                .collect::<Vec<_>>()
                                .join("/"),
                            g[field]
                        ));
                    }
                }
            }
            // Every GPU pod and GPU node is listed in the expectation.
            for g in &got {
                if find(&want, keys, g).is_none() {
                    fail(format!("{section}: unexpected row {g}"));
                }
            }
        }
        let busy = |v: &Value| {
            let mut rows: Vec<(Value, Value, Value)> = list(v, "unclaimed_busy")
                .iter()
                .map(|r| {
                    (
                        r["node"].clone(),
                        r["uuid"].clone(),
                        r["gpu_instance"].clone(),
                    )
                })
                .collect();
            rows.sort_by_key(|r| format!("{r:?}"));
            rows
        };
        if busy(ledger) != busy(&expected) {
            fail(format!(
                "unclaimed_busy = {:?}, expected {:?}",
                busy(ledger),
                busy(&expected)
            ));
        }
        out
    }
}

/// Equal values; numbers within a relative 1e-6 (GPU fractions such as 1/7).
fn same(got: &Value, want: &Value) -> bool {
    match (got.as_f64(), want.as_f64()) {
        (Some(g), Some(w)) => (g - w).abs() <= 1e-6 * w.abs().max(1.0),
        _ => got == want,
    }
}
