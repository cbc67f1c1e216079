//! `gpu-ledger capture --out DIR`: the live cluster's GPU claims and its DCGM history, written as
//! exactly the files `report --from DIR` reads (see docs/capture.md).
//!
//! * `<stem>.json` for each claim kind of [`crate::claims::kinds::KINDS`]: `pods.json`,
//!   `nodes.json`, `quotas.json` always, the others when their API is served
//!   ([`crate::claims::capture`]);
//! * `dcgm.prom`: the raw samples of the DCGM fields the ledger reads over `--history-lookback`
//!   ending at `--at`, with their own timestamps, in the text exposition format (millisecond
//!   timestamps), fetched in one-hour range selectors;
//! * `capture.json`: when, from where, and what was written (for the reader of a bug report).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use tracing::info;

use super::capture_error::CaptureError;
use super::clients::{kube_client, prometheus_client};
use super::error::AppError;
use super::offline::DCGM_FILE;
use crate::claims::capture::{RawLists, list_raw};
use crate::claims::kinds;
use crate::config::CaptureArgs;
use crate::ledger::units::ResourceNames;
use crate::usage::dump::KEEP;
use crate::usage::exposition;
use crate::usage::prom::PromClient;
use crate::usage::series::{Labels, Series};

/// Metadata file next to the dumps (not read by `report`).
pub const META_FILE: &str = "capture.json";
/// Span of one range-selector query: bounded answers, whatever the lookback.
const CHUNK: Duration = Duration::hours(1);
/// Bound on listing every resource (several list calls).
const LIST_TIMEOUT: StdDuration = StdDuration::from_secs(120);

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> CaptureError + '_ {
    move |source| CaptureError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// `gpu-ledger capture`.
pub async fn capture(args: CaptureArgs) -> Result<(), AppError> {
    if args.history_lookback <= Duration::zero() {
        return Err(AppError::Config(
            "--history-lookback must be positive".into(),
        ));
    }
    let Some(prom) = prometheus_client(&args.prometheus)? else {
        return Err(AppError::Config(
            "capture needs --prometheus-url (the DCGM history is read from Prometheus)".into(),
        ));
    };
    let at = args.at.unwrap_or_else(Utc::now);
    let names = ResourceNames {
        extra: listed(&args.extra_gpu_resources),
        ..ResourceNames::default()
    };
    let namespaces = listed(&args.namespaces);
    let client = kube_client(&args.kube).await?;
    let lists = tokio::time::timeout(
        LIST_TIMEOUT,
        list_raw(
            &client,
            &names,
            &namespaces,
            args.kueue_config_map.resolve().as_ref(),
        ),
    )
    .await
    .map_err(|_| CaptureError::ListTimeout(LIST_TIMEOUT))?
    .map_err(CaptureError::List)?;
    let series = dcgm_history(&prom, args.history_lookback, at).await?;

    let dir = &args.out;
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    clear_previous(dir)?;
    for (stem, list) in lists.files() {
        let path = dir.join(format!("{stem}.json"));
        let text = serde_json::to_vec_pretty(list).map_err(std::io::Error::other);
        text.and_then(|t| std::fs::write(&path, t))
            .map_err(write_err(&path))?;
    }
    let dcgm = dir.join(DCGM_FILE);
    write_dcgm(&dcgm, &series, &args, at)?;
    let samples: usize = series.iter().map(|s| s.samples.len()).sum();
    let meta = dir.join(META_FILE);
    let text = serde_json::to_vec_pretty(&metadata(&args, &lists, &series, samples, at))
        .map_err(std::io::Error::other);
    text.and_then(|t| std::fs::write(&meta, t))
        .map_err(write_err(&meta))?;
    info!(
        dir = %dir.display(),
        pods = lists.get(&kinds::PODS).map_or(0, RawLists::count),
        nodes = lists.get(&kinds::NODES).map_or(0, RawLists::count),
        dcgm_series = series.len(),
        dcgm_samples = samples,
        at = %at.to_rfc3339(),
        "captured; read it back with: gpu-ledger report --from {}",
        dir.display()
    );
    Ok(())
}

fn listed(v: &[String]) -> Vec<String> {
    v.iter().filter(|s| !s.is_empty()).cloned().collect()
}

/// Removes capture files of an earlier run, so a list that is absent now (no Notebook CRD) is not
/// read from a stale file.
fn clear_previous(dir: &Path) -> Result<(), CaptureError> {
    for stem in kinds::KINDS.iter().flat_map(|k| k.stems()) {
        for ext in ["json", "yaml", "yml"] {
            let path = dir.join(format!("{stem}.{ext}"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(write_err(&path)(e)),
            }
        }
    }
    Ok(())
}

type SeriesId = (String, Arc<Labels>);

/// Every raw sample of the ledger's DCGM fields in `(at - lookback, at]`, one series per label
/// set, samples sorted and de-duplicated (chunks do not overlap; a series spanning several is
/// joined).
async fn dcgm_history(
    prom: &PromClient,
    lookback: Duration,
    at: DateTime<Utc>,
) -> Result<Vec<Series>, CaptureError> {
    // (name, labels) → samples.
    let mut joined: BTreeMap<SeriesId, Vec<(i64, f64)>> = BTreeMap::new();
    let start = at - lookback;
    let mut end = at;
    // The DCGM fields (every spelling is matched by their internal names' query) and HAMi's
    // vGPU monitor families: the offline report judges HAMi sharers by their own series.
    let names: Vec<&str> = KEEP
        .iter()
        .copied()
        .chain(crate::usage::fields::HAMI_SPELLINGS.iter().map(|(n, _)| *n))
        .collect();
    while end > start {
        let range = CHUNK.min(end - start);
        let chunk = prom
            .range_series(&names, range, end)
            .await
            .map_err(|source| CaptureError::Prometheus {
                from: end - range,
                to: end,
                source,
            })?;
        for s in chunk {
            joined
                .entry((s.name, s.labels))
                .or_default()
                .extend(s.samples);
        }
        end -= range;
    }
    Ok(joined
        .into_iter()
        .map(|((name, labels), mut samples)| {
            samples.sort_by_key(|(t, _)| *t);
            samples.dedup_by_key(|(t, _)| *t);
            Series {
                name,
                labels,
                samples,
            }
        })
        .collect())
}

/// The Prometheus URL without credentials or query (safe to write into a bug report).
fn redacted(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

fn write_dcgm(
    path: &Path,
    series: &[Series],
    args: &CaptureArgs,
    at: DateTime<Utc>,
) -> Result<(), CaptureError> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(write_err(path))?;
    let mut out = std::io::BufWriter::new(file);
    let header = format!(
        "# gpu-ledger capture: {} from {} over {} ending {}\n# Text exposition format, sample timestamps in milliseconds.\n",
        KEEP.join(", "),
        args.prometheus
            .prometheus_url
            .as_ref()
            .map_or_else(|| "-".into(), redacted),
        humantime::format_duration(args.history_lookback.to_std().unwrap_or_default()),
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    out.write_all(header.as_bytes())
        .and_then(|()| exposition::write_history(series, &mut out))
        .and_then(|()| out.flush())
        .map_err(write_err(path))
}

fn metadata(
    args: &CaptureArgs,
    lists: &RawLists,
    series: &[Series],
    samples: usize,
    at: DateTime<Utc>,
) -> serde_json::Value {
    let counts: BTreeMap<&str, usize> = lists
        .files()
        .into_iter()
        .map(|(stem, list)| (stem, RawLists::count(list)))
        .collect();
    serde_json::json!({
        "captured_at": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "history_lookback": humantime::format_duration(args.history_lookback.to_std().unwrap_or_default()).to_string(),
        "prometheus_url": args.prometheus.prometheus_url.as_ref().map(redacted),
        "kube_context": args.kube.context,
        "namespaces": listed(&args.namespaces),
        "gpu_ledger_version": crate::config::VERSION,
        "objects": counts,
        "dcgm_series": series.len(),
        "dcgm_samples": samples,
        "notebooks_served": lists.get(&kinds::NOTEBOOKS).is_some(),
    })
}
