//! Offline usage: a dcgm-exporter `/metrics` or Prometheus `/federate` dump (text format or
//! `OpenMetrics`, with or without sample timestamps), reduced to the ledger's usage inputs by the
//! same [`series::reduce`] as every other path.
//!
//! Hostile input: only regular files are read (a FIFO or a link to `/dev/zero` is refused before
//! anything is read), lines are bounded ([`exposition::MAX_LINE_BYTES`]), impossible timestamps
//! are skipped by the parser, and samples stamped beyond the bulk of the dump do not move the
//! report's time ([`plausible_newest`]).

use std::io::{BufReader, Read as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};

use super::exposition;
use super::fields;
use super::prom::{Selector, clusters_of};
use super::scheme::LabelScheme;
use super::scheme::SchemeChoice;
use super::series::{self, Series};
use crate::ledger::usage::{DcgmHealth, Usage, Window};

/// Sample spacing assumed for a device whose samples do not show one (a single snapshot).
pub const DEFAULT_SCRAPE_INTERVAL_SECS: i64 = 30;

/// Default [`DumpSettings::max_bytes`]: 1 GiB (`report --max-dump-size`).
pub const DEFAULT_MAX_DUMP_BYTES: u64 = 1 << 30;

/// Fields the reduction reads (each in every accepted spelling, see [`fields::SPELLINGS`]).
pub const KEEP: [&str; 3] = [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED];

/// How to read a dump.
#[derive(Debug, Clone)]
pub struct DumpSettings {
    /// Observation instant; `None` = the newest sample timestamp in the dump, else the clock.
    pub at: Option<DateTime<Utc>>,
    /// Idle window length.
    pub window: Duration,
    /// Sample spacing assumed for a device whose samples in the window cannot show theirs (see
    /// [`series`]: every other device's is inferred from its own samples); `None` = 30 s.
    pub scrape_interval: Option<Duration>,
    pub scheme: SchemeChoice,
    /// Utilisation (0..1) at or above which a device counts as active.
    pub idle_threshold: f64,
    /// Samples older than this are not a current reading.
    pub max_staleness: Duration,
    /// Largest dump accepted, in bytes. Memory does not grow with the file (it is read line by
    /// line, and only [`KEEP`] series are stored), but reading time does.
    pub max_bytes: u64,
    /// `--prometheus-selector`: only series it matches are read, as a live query would see them.
    pub selector: Option<Selector>,
}

/// The usage read from a dump, and what the caller should tell the user.
#[derive(Debug, Clone)]
pub struct DumpUsage {
    pub usage: Usage,
    /// The instant the usage describes.
    pub at: DateTime<Utc>,
    /// The dump's typical sample spacing (median over its utilisation series), else the
    /// fallback: for messages; each device's coverage uses its own.
    pub scrape_interval: Duration,
    /// The label scheme used to read workload labels.
    pub scheme: LabelScheme,
    /// Non-fatal problems, each naming the file ("dcgm.prom: skipped 3 unparsable lines …").
    pub warnings: Vec<String>,
}

/// Why a dump could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("{path}: cannot read DCGM dump")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file ({kind}): a DCGM dump must be a file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path}: larger than the dump size limit of {limit} bytes (raise it with --max-dump-size)"
    )]
    TooLarge { path: PathBuf, limit: u64 },
    #[error(
        "{path}: no DCGM_FI_* series found (expected a dcgm-exporter /metrics or Prometheus /federate dump)"
    )]
    NoDcgmSeries { path: PathBuf },
    #[error(
        "{path}: DCGM series found, but none of {} under any name gpu-ledger reads ({}): utilisation and framebuffer are needed",
        KEEP.join(", "),
        fields::all_spellings().collect::<Vec<_>>().join(", ")
    )]
    NoUsageFields { path: PathBuf },
    #[error("{path}: no DCGM series match --prometheus-selector {selector}")]
    NoneSelected { path: PathBuf, selector: String },
    #[error("--prometheus-selector {selector}: {reason}")]
    BadSelector { selector: String, reason: String },
    /// The dump holds several clusters' DCGM series (a /federate of a shared store) and no
    /// selector narrows them: joined by pod name, another cluster's GPUs would be this one's.
    #[error(
        "{path}: DCGM series of {} clusters ({}): pass --prometheus-selector with this cluster's, e.g. {}",
        clusters.len(),
        clusters.join(", "),
        clusters.first().map_or("cluster=\"…\"", String::as_str)
    )]
    SeveralClusters {
        path: PathBuf,
        clusters: Vec<String>,
    },
}

/// Applies `--prometheus-selector` to the dump's series (as Prometheus applies it to a query),
/// then refuses series of several clusters, as the live source does.
fn narrow_to_one_cluster(
    path: &Path,
    series: &mut Vec<Series>,
    selector: Option<&Selector>,
) -> Result<(), DumpError> {
    if let Some(sel) = selector {
        let matchers = sel.matchers().map_err(|reason| DumpError::BadSelector {
            selector: sel.as_str().to_string(),
            reason,
        })?;
        let any = !series.is_empty();
        series.retain(|s| {
            matchers
                .iter()
                .all(|m| m.matches(s.labels.get(&m.name).map(String::as_str)))
        });
        if any && series.is_empty() {
            return Err(DumpError::NoneSelected {
                path: path.to_path_buf(),
                selector: sel.as_str().to_string(),
            });
        }
    }
    let clusters = clusters_of(series.iter().map(|s| &*s.labels));
    if clusters.len() > 1 {
        return Err(DumpError::SeveralClusters {
            path: path.to_path_buf(),
            clusters,
        });
    }
    Ok(())
}

/// Label names on the DCGM series of a dump, for scheme detection (HAMi's monitor series keep
/// their own label names, `usage::hami`).
fn dcgm_label_names(series: &[Series]) -> impl Iterator<Item = &str> {
    series
        .iter()
        .filter(|s| fields::canonical(&s.name).is_some())
        .flat_map(|s| s.labels.keys().map(String::as_str))
}

// Health layer (issue 39, sick cards).

/// Most watches or XID codes kept per GPU (a real GPU has a dozen watches, a handful of codes).
const MAX_HEALTH_ENTRIES: usize = 64;

/// Takes dcgm-exporter's health series out of `series`: the reduction reads the utilisation
/// fields only, and a dump's interval and coverage are theirs.
fn split_health(series: &mut Vec<Series>) -> Vec<Series> {
    let (health, rest) = std::mem::take(series)
        .into_iter()
        .partition(|s| s.name == fields::GPU_HEALTH_STATUS || s.name == fields::XID_ERRORS_COUNT);
    *series = rest;
    health
}

/// [`narrow_to_one_cluster`], then [`split_health`]: the health series of this cluster.
fn narrow_and_split_health(
    path: &Path,
    series: &mut Vec<Series>,
    selector: Option<&Selector>,
) -> Result<Vec<Series>, DumpError> {
    narrow_to_one_cluster(path, series, selector)?;
    Ok(split_health(series))
}

/// DCGM's health verdicts of a dump in the window ending at `at`, as the live query reads them:
/// per GPU, the highest status per health watch above pass and the XID codes counted above 0
/// (`max_over_time`). Samples without a timestamp (at `sentinel_ms`) are the observation's own.
fn dcgm_health(
    health: &[Series],
    at: DateTime<Utc>,
    window: Duration,
    sentinel_ms: i64,
) -> Vec<DcgmHealth> {
    let (end, start) = (at.timestamp_millis(), (at - window).timestamp_millis());
    let mut out: Vec<DcgmHealth> = Vec::new();
    for s in health {
        let peak = s
            .samples
            .iter()
            .filter(|(t, v)| (*t == sentinel_ms || (*t > start && *t <= end)) && v.is_finite())
            .map(|(_, v)| *v)
            .fold(f64::NAN, f64::max);
        let label = |k: &str| {
            s.labels
                .get(k)
                .map(String::as_str)
                .filter(|v| !v.is_empty())
        };
        let Some(uuid) = label("UUID")
            .or_else(|| label("uuid"))
            .filter(|_| peak > 0.0)
        else {
            continue;
        };
        let i = out.iter().position(|h| h.uuid == uuid).unwrap_or_else(|| {
            out.push(DcgmHealth {
                uuid: uuid.to_string(),
                ..DcgmHealth::default()
            });
            out.len() - 1
        });
        let h = &mut out[i];
        if s.name == fields::GPU_HEALTH_STATUS {
            if let Some(w) = label(fields::HEALTH_WATCH_LABEL)
                && h.watches.len() < MAX_HEALTH_ENTRIES
            {
                match h.watches.iter_mut().find(|(name, _)| name == w) {
                    Some(e) => e.1 = e.1.max(peak),
                    None => h.watches.push((w.to_string(), peak)),
                }
            }
        } else if let Some(code) = label(fields::XID_LABEL).and_then(|x| x.parse::<u32>().ok())
            && h.xids.len() < MAX_HEALTH_ENTRIES
            && !h.xids.contains(&code)
        {
            h.xids.push(code);
        }
    }
    out
}

/// Reads `path` and reduces it at `settings.at`, or the newest sample, or `fallback_now`.
pub fn load(
    path: &Path,
    settings: &DumpSettings,
    fallback_now: DateTime<Utc>,
) -> Result<DumpUsage, DumpError> {
    // Samples without a timestamp are parked at a sentinel, then moved to the observation instant.
    let sentinel = DateTime::<Utc>::MIN_UTC;
    let sentinel_ms = sentinel.timestamp_millis();
    let mut parsed = read_bounded(path, settings.max_bytes, sentinel)?;
    // One device under a legacy name in one part of the dump and a DCGM 4.7 name in another (a
    // rolling exporter upgrade) reduces as one.
    series::to_internal_fields(&mut parsed.series);
    let health = narrow_and_split_health(path, &mut parsed.series, settings.selector.as_ref())?;
    let file = display_name(path);
    let mut warnings = Vec::new();
    if parsed.series.is_empty() {
        return Err(if parsed.dcgm_lines > 0 {
            DumpError::NoUsageFields {
                path: path.to_path_buf(),
            }
        } else {
            DumpError::NoDcgmSeries {
                path: path.to_path_buf(),
            }
        });
    }
    if parsed.skipped_lines > 0 {
        let first = parsed
            .first_skip
            .as_ref()
            .map(|(line, why)| format!(" (first: line {line}: {why})"))
            .unwrap_or_default();
        let s = if parsed.skipped_lines == 1 { "" } else { "s" };
        let mut why = Vec::new();
        if parsed.impossible_timestamps > 0 {
            why.push(format!(
                "{} with an impossible timestamp",
                parsed.impossible_timestamps
            ));
        }
        if parsed.oversized_lines > 0 {
            why.push(format!(
                "{} longer than {} bytes",
                parsed.oversized_lines,
                exposition::MAX_LINE_BYTES
            ));
        }
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(", {}", why.join(", "))
        };
        warnings.push(format!(
            "{file}: skipped {} unparsable line{s}{why}{first}",
            parsed.skipped_lines
        ));
    }

    let newest_stamped = if settings.at.is_some() {
        None
    } else {
        plausible_newest(&parsed.series, sentinel_ms, settings.window)
    };
    if let Some(limit) = newest_stamped {
        let mut beyond = 0usize;
        for s in &mut parsed.series {
            let before = s.samples.len();
            s.samples.retain(|(t, _)| *t <= limit);
            beyond += before - s.samples.len();
        }
        parsed.series.retain(|s| !s.samples.is_empty());
        if beyond > 0 {
            let s = if beyond == 1 { "" } else { "s" };
            let at = DateTime::from_timestamp_millis(limit)
                .map_or_else(|| limit.to_string(), |t| t.to_rfc3339());
            warnings.push(format!(
                "{file}: ignored {beyond} sample{s} stamped beyond {at}, the newest time the bulk of the dump reaches (more than the {} window after it; a clock ahead?)",
                humantime::format_duration(settings.window.to_std().unwrap_or_default())
            ));
        }
    }
    let newest_stamped = newest_stamped.or_else(|| {
        // With --at: the newest sample, for the staleness warning below.
        parsed
            .series
            .iter()
            .filter_map(|s| s.samples.last().map(|(t, _)| *t))
            .filter(|t| *t != sentinel_ms)
            .max()
    });
    let at = settings
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
    // Only where a device's own samples in the window cannot show their spacing (the reduction
    // infers it per device, as the live source does): the given interval, else the default.
    let fallback = settings
        .scrape_interval
        .unwrap_or_else(|| Duration::seconds(DEFAULT_SCRAPE_INTERVAL_SECS));
    let interval = inferred.unwrap_or(fallback);
    if settings.scrape_interval.is_none() && inferred.is_none() {
        warnings.push(format!(
            "{file}: one sample per series (no history): idleness cannot be proven over the {} window",
            humantime::format_duration(settings.window.to_std().unwrap_or_default())
        ));
    }
    if let Some(warning) = shorter_than_window(&parsed.series, at_ms, interval, settings.window) {
        warnings.push(format!("{file}: {warning}"));
    }
    if settings.at.is_some()
        && newest_stamped
            .is_some_and(|t| t < at_ms.saturating_sub(settings.max_staleness.num_milliseconds()))
    {
        warnings.push(format!("{file}: newest sample is older than --at minus the staleness limit: utilisation is unknown"));
    }

    let scheme = LabelScheme::detect(settings.scheme, dcgm_label_names(&parsed.series));
    let window = Window {
        length: settings.window,
        interval: fallback,
        idle_threshold: settings.idle_threshold,
        max_staleness: settings.max_staleness,
    };
    Ok(DumpUsage {
        usage: Usage {
            devices: series::reduce(&parsed.series, &scheme, &window, at),
            available: true,
            gpu_health: dcgm_health(&health, at, settings.window, sentinel_ms),
            hami: super::hami::reduce(&parsed.series, &window, at),
            ..Usage::default()
        },
        at,
        scrape_interval: interval,
        scheme,
        warnings,
    })
}

/// Why idleness cannot be proven over `window` when the whole dump holds less history than
/// that before `at_ms` (one sample interval of slack): the diagnosis is the dump's length, not
/// samples missing or stale. `None` when the dump reaches back far enough (or has one sample).
fn shorter_than_window(
    series: &[Series],
    at_ms: i64,
    interval: Duration,
    window: Duration,
) -> Option<String> {
    let oldest = series
        .iter()
        .flat_map(|s| s.samples.iter().map(|(t, _)| *t))
        .filter(|t| *t <= at_ms)
        .min()?;
    let held = Duration::milliseconds(at_ms.checked_sub(oldest)?);
    if held <= Duration::zero() || held.checked_add(&interval)? >= window {
        return None;
    }
    let human = |d: Duration| humantime::format_duration(d.to_std().unwrap_or_default());
    let from = DateTime::from_timestamp_millis(oldest)
        .map_or_else(|| oldest.to_string(), |t| t.to_rfc3339());
    let to = DateTime::from_timestamp_millis(at_ms)
        .map_or_else(|| at_ms.to_string(), |t| t.to_rfc3339());
    Some(format!(
        "the dump holds {} of samples ({from} to {to}), less than the {} --window: no pod can be \
         proven idle over the window, so idleness shows as unproven; pass --window {} or less",
        human(held),
        human(window),
        human(held),
    ))
}

/// The file name for warnings (the full path when it has no name).
fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Parses at most `max_bytes` of `path` line by line ([`exposition::parse_reader`]); a longer
/// file is [`DumpError::TooLarge`]. The size is checked before reading (regular files) and while
/// reading (pipes, growing files). Input that cannot seek (a pipe) is read into memory first, to
/// find out whether it is OpenMetrics (which ends in `# EOF`).
fn read_bounded(
    path: &Path,
    max_bytes: u64,
    default_time: DateTime<Utc>,
) -> Result<exposition::Parsed, DumpError> {
    let read_err = |source| DumpError::Read {
        path: path.to_path_buf(),
        source,
    };
    let too_large = || DumpError::TooLarge {
        path: path.to_path_buf(),
        limit: max_bytes,
    };
    let not_regular = |meta: &std::fs::Metadata| DumpError::NotRegular {
        path: path.to_path_buf(),
        kind: kind_of(meta.file_type()),
    };
    let mut keep: Vec<&str> = fields::read_names().collect();
    keep.extend([fields::GPU_HEALTH_STATUS, fields::XID_ERRORS_COUNT]);
    // Checked before opening (following links): opening a FIFO blocks until a writer comes, and
    // a device such as /dev/zero never ends.
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    // And again on what was opened: the path may have been swapped in between.
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    let parsed = if let Ok(openmetrics) = exposition::ends_with_eof_marker(&mut file) {
        let mut limited = BufReader::new(file.take(max_bytes.saturating_add(1)));
        let parsed = exposition::parse_reader(&mut limited, &keep, default_time, openmetrics)
            .map_err(read_err)?;
        if limited.into_inner().limit() == 0 {
            return Err(too_large());
        }
        parsed
    } else {
        let mut text = String::new();
        file.take(max_bytes.saturating_add(1))
            .read_to_string(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > max_bytes {
            return Err(too_large());
        }
        exposition::parse(&text, &keep, default_time)
    };
    Ok(parsed)
}

/// What a path that is not a regular file is, for [`DumpError::NotRegular`].
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// The report time of a dump without `--at`: the newest sample time the bulk of its series
/// reaches. Per series, take its newest timestamped sample; sort those; start at their median
/// and step up to the next one while it is at most one `window` later. A series' newest time
/// beyond the first larger step (one sample a day ahead, from a clock set wrong or a hostile
/// dump) is no evidence of "now": samples after the result are ignored, with a warning.
/// `None` when no sample carries a timestamp (samples at `sentinel_ms` carry none).
fn plausible_newest(series: &[Series], sentinel_ms: i64, window: Duration) -> Option<i64> {
    let mut newest: Vec<i64> = series
        .iter()
        .filter_map(|s| s.samples.last().map(|(t, _)| *t))
        .filter(|t| *t != sentinel_ms)
        .collect();
    newest.sort_unstable();
    let mid = newest.len() / 2;
    let mut limit = *newest.get(mid)?;
    let step = window.num_milliseconds().max(0);
    for &t in &newest[mid + 1..] {
        if t.saturating_sub(limit) > step {
            break;
        }
        limit = t;
    }
    Some(limit)
}

/// The dump's sample interval: the (lower) median over the utilisation series of each one's own
/// spacing ([`series::own_interval_ms`], the rule the reduction applies per device), for the
/// devices whose own samples cannot show theirs; `None` without history.
fn infer_interval(series: &[Series]) -> Option<Duration> {
    let mut per_series: Vec<i64> = series
        .iter()
        .filter(|s| {
            matches!(
                fields::canonical(&s.name),
                Some(fields::GR_ENGINE_ACTIVE | fields::GPU_UTIL)
            )
        })
        .filter_map(|s| series::own_interval_ms(&s.samples, i64::MIN, i64::MAX))
        .collect();
    if per_series.is_empty() {
        return None;
    }
    let mid = (per_series.len() - 1) / 2;
    Some(Duration::milliseconds(
        *per_series.select_nth_unstable(mid).1,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, times: &[i64]) -> Series {
        Series {
            name: name.into(),
            labels: std::sync::Arc::default(),
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
    fn interval_inference_survives_extreme_times() {
        let s = vec![series(
            fields::GPU_UTIL,
            &[i64::MIN, 0, 30_000, 60_000, i64::MAX],
        )];
        assert_eq!(infer_interval(&s), Some(Duration::seconds(30)));
    }

    #[test]
    fn a_dumps_health_families_become_dcgm_health_beside_the_devices() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/health/dcgm-health.prom");
        let now = DateTime::parse_from_rfc3339("2026-07-22T04:00:00Z")
            .expect("valid")
            .with_timezone(&Utc);
        let settings = DumpSettings {
            at: None,
            window: Duration::minutes(10),
            scrape_interval: None,
            scheme: SchemeChoice::Auto,
            idle_threshold: 0.05,
            max_staleness: Duration::minutes(2),
            max_bytes: DEFAULT_MAX_DUMP_BYTES,
            selector: None,
        };
        let loaded = load(&path, &settings, now).expect("dump loads");
        assert_eq!(
            loaded.usage.gpu_health,
            vec![DcgmHealth {
                uuid: "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c".into(),
                watches: vec![("THERMAL".into(), 20.0)],
                xids: vec![43],
            }]
        );
        // The health series are no devices of their own: one GPU, read from its utilisation.
        assert_eq!(loaded.usage.devices.len(), 1);
        assert_eq!(loaded.usage.devices[0].workloads[0].pod, "nb-0");
    }
}
