//! Offline input for `report --from DIR`: `kubectl get … -o json|yaml` dumps plus a dcgm-exporter
//! exposition dump, fed through the same `ledger::build` as the live service.
//!
//! [`load`] is pure apart from reading the files: the caller passes the clock as `fallback_now`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};

use crate::claims::files::{self, DumpPaths, FileError};
use crate::ledger::{self, Ledger, Policy};
use crate::usage::exposition;
use crate::usage::scheme::SchemeChoice;
use crate::usage::series::{self, Series};
use crate::usage::{LabelScheme, Usage, Window, fields};

/// Scrape interval assumed when the dump does not show one (a single snapshot).
pub const DEFAULT_SCRAPE_INTERVAL_SECS: i64 = 30;
/// Default idle window of the offline report.
pub const DEFAULT_WINDOW_MINUTES: i64 = 10;
/// Name of the DCGM dump inside a `--from` directory.
pub const DCGM_FILE: &str = "dcgm.prom";

/// Fields kept while parsing the DCGM dump.
const KEEP: [&str; 3] = [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED];

/// Everything the offline report reads.
#[derive(Debug, Clone)]
pub struct OfflineInput {
    pub paths: DumpPaths,
    /// A dcgm-exporter `/metrics` or Prometheus `/federate` dump (text format or `OpenMetrics`).
    pub dcgm: PathBuf,
    /// Observation instant; `None` = the newest sample timestamp in the DCGM dump, else the clock.
    pub at: Option<DateTime<Utc>>,
    /// Idle window length.
    pub window: Duration,
    /// Expected sample spacing; `None` = inferred from the dump (median spacing), else 30 s.
    pub scrape_interval: Option<Duration>,
    pub scheme: SchemeChoice,
    pub policy: Policy,
}

impl OfflineInput {
    /// Defaults for a dump directory: `DIR/{pods,nodes,…}.{json,yaml}` and `DIR/dcgm.prom`,
    /// a 10-minute window, inferred interval and label scheme, default policy.
    pub fn from_dir(dir: &Path) -> Self {
        OfflineInput {
            paths: DumpPaths::from_dir(dir),
            dcgm: dir.join(DCGM_FILE),
            at: None,
            window: Duration::minutes(DEFAULT_WINDOW_MINUTES),
            scrape_interval: None,
            scheme: SchemeChoice::Auto,
            policy: Policy::default(),
        }
    }
}

/// The ledger built from files, plus what the caller should tell the user.
#[derive(Debug, Clone)]
pub struct Offline {
    pub ledger: Ledger,
    /// Non-fatal problems, each naming the file ("dcgm.prom: skipped 3 unparsable lines …").
    pub warnings: Vec<String>,
    /// The instant the ledger describes.
    pub at: DateTime<Utc>,
    /// The sample spacing used (given or inferred).
    pub scrape_interval: Duration,
    /// The label scheme used to read workload labels.
    pub scheme: LabelScheme,
}

/// Why the offline input could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Claims(#[from] FileError),
    #[error("{path}: cannot read DCGM dump")]
    DcgmRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: no DCGM_FI_* series found (expected a dcgm-exporter /metrics or Prometheus /federate dump)"
    )]
    NoDcgmSeries { path: PathBuf },
    #[error(
        "{path}: DCGM series found, but none of {} (utilisation and framebuffer are needed)",
        KEEP.join(", ")
    )]
    NoUsageFields { path: PathBuf },
}

/// Loads the dumps and builds the ledger at `input.at`, or the newest DCGM sample, or `fallback_now`.
pub fn load(input: &OfflineInput, fallback_now: DateTime<Utc>) -> Result<Offline, OfflineError> {
    let claims = files::load(&input.paths, &input.policy.names)?;
    let path = &input.dcgm;
    let text = std::fs::read_to_string(path).map_err(|source| OfflineError::DcgmRead {
        path: path.clone(),
        source,
    })?;
    let file = display_name(path);
    let mut warnings = Vec::new();

    // Samples without a timestamp are parked at a sentinel, then moved to the observation instant.
    let sentinel = DateTime::<Utc>::MIN_UTC;
    let sentinel_ms = sentinel.timestamp_millis();
    let mut parsed = exposition::parse(&text, &KEEP, sentinel);
    if parsed.series.is_empty() {
        return Err(if has_dcgm_sample(&text) {
            OfflineError::NoUsageFields { path: path.clone() }
        } else {
            OfflineError::NoDcgmSeries { path: path.clone() }
        });
    }
    if parsed.skipped_lines > 0 {
        let first = parsed
            .first_skip
            .as_ref()
            .map(|(line, why)| format!(" (first: line {line}: {why})"))
            .unwrap_or_default();
        let s = if parsed.skipped_lines == 1 { "" } else { "s" };
        warnings.push(format!(
            "{file}: skipped {} unparsable line{s}{first}",
            parsed.skipped_lines
        ));
    }

    let newest_stamped = parsed
        .series
        .iter()
        .filter_map(|s| {
            s.samples
                .iter()
                .map(|(t, _)| *t)
                .filter(|t| *t != sentinel_ms)
                .max()
        })
        .max();
    let at = input
        .at
        .or_else(|| newest_stamped.and_then(DateTime::from_timestamp_millis))
        .unwrap_or(fallback_now);
    let at_ms = at.timestamp_millis();
    for s in &mut parsed.series {
        if s.samples.iter().any(|(t, _)| *t == sentinel_ms) {
            for sample in &mut s.samples {
                if sample.0 == sentinel_ms {
                    sample.0 = at_ms;
                }
            }
            s.samples.sort_by_key(|(t, _)| *t);
        }
    }

    let inferred = infer_interval(&parsed.series);
    let interval = input
        .scrape_interval
        .or(inferred)
        .unwrap_or_else(|| Duration::seconds(DEFAULT_SCRAPE_INTERVAL_SECS));
    if input.scrape_interval.is_none() && inferred.is_none() {
        warnings.push(format!(
            "{file}: one sample per series (no history): idleness cannot be proven over the {} window",
            humanise_seconds(input.window.num_seconds())
        ));
    }
    if input.at.is_some()
        && newest_stamped.is_some_and(|t| t < at_ms - input.policy.max_staleness.num_milliseconds())
    {
        warnings.push(format!("{file}: newest sample is older than --at minus the staleness limit: utilisation is unknown"));
    }

    let scheme = LabelScheme::detect(
        input.scheme,
        parsed
            .series
            .iter()
            .flat_map(|s| s.labels.keys().map(String::as_str)),
    );
    let window = Window {
        length: input.window,
        interval,
        idle_threshold: input.policy.idle_threshold,
        max_staleness: input.policy.max_staleness,
    };
    let usage = Usage {
        devices: series::reduce(&parsed.series, &scheme, &window, at),
        available: true,
    };
    let ledger = ledger::build(&claims, &usage, at, &input.policy);
    Ok(Offline {
        ledger,
        warnings,
        at,
        scrape_interval: interval,
        scheme,
    })
}

/// The file name for warnings (the full path when it has no name).
fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// True when any sample line names a DCGM field.
fn has_dcgm_sample(text: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .any(|l| l.starts_with("DCGM_FI_"))
}

/// Median spacing between consecutive samples of the utilisation series; `None` without history.
fn infer_interval(series: &[Series]) -> Option<Duration> {
    let mut gaps: Vec<i64> = series
        .iter()
        .filter(|s| s.name == fields::GR_ENGINE_ACTIVE || s.name == fields::GPU_UTIL)
        .flat_map(|s| s.samples.windows(2).map(|w| w[1].0 - w[0].0))
        .filter(|gap| *gap > 0)
        .collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    Some(Duration::milliseconds(gaps[gaps.len() / 2]))
}

/// "2d3h", "3h12m", "45m", "30s" — the two most significant units.
pub fn humanise_seconds(secs: i64) -> String {
    let secs = secs.max(0);
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, times: &[i64]) -> Series {
        Series {
            name: name.into(),
            labels: series::Labels::new(),
            samples: times.iter().map(|t| (*t, 0.0)).collect(),
        }
    }

    #[test]
    fn interval_is_median_spacing_of_utilisation_series() {
        let s = vec![
            series(fields::GPU_UTIL, &[0, 15_000, 30_000, 45_000, 120_000]),
            series(fields::FB_USED, &[0, 1_000, 2_000, 3_000]),
        ];
        assert_eq!(infer_interval(&s), Some(Duration::seconds(15)));
        assert_eq!(infer_interval(&[series(fields::GPU_UTIL, &[5])]), None);
    }

    #[test]
    fn humanises_two_units() {
        assert_eq!(humanise_seconds(0), "0s");
        assert_eq!(humanise_seconds(45 * 60 + 10), "45m");
        assert_eq!(humanise_seconds(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(humanise_seconds(2 * 86_400 + 3 * 3600 + 59), "2d3h");
        assert_eq!(humanise_seconds(-5), "0s");
    }
}
