//! `PromQL` builders (pure; their text is unit-tested): the window's range-vector selector and
//! the start-up history (bootstrap) query.

use crate::ledger::usage::{Window, fields};
use crate::usage::LabelScheme;

/// Label added by `label_replace` to tell statistics apart in one answer.
pub const STAT_LABEL: &str = "stat";
/// Label naming the DCGM field in combined answers (bootstrap).
pub const FIELD_LABEL: &str = "field";

/// A `PromQL` duration in milliseconds (at least 1 ms).
pub fn duration(d: chrono::Duration) -> String {
    format!("{}ms", d.num_milliseconds().max(1))
}

/// A range `(now - d, now]`: Prometheus ranges include their start, the offline reduction does not.
fn open_range(d: chrono::Duration) -> String {
    format!("{}ms", (d.num_milliseconds() - 1).max(1))
}

/// `template` applied to every accepted spelling of `field` (`DCGM_FI_DEV_GPU_UTIL`,
/// `dcgm_fi_dev_gpu_util`, `dcgm_gpu_utilization`), joined with `or`. One selector with a
/// `__name__` regex would not do: functions drop the name, and two spellings of one device
/// would then collide as equal label sets.
fn each_spelling(field: &str, matchers: &str, template: impl Fn(&str) -> String) -> String {
    let parts: Vec<String> = fields::SPELLINGS
        .iter()
        .filter(|(_, f)| *f == field)
        .map(|(spelling, _)| {
            if matchers.is_empty() {
                template(spelling)
            } else {
                template(&format!("{spelling}{{{}}}", &matchers[1..]))
            }
        })
        .collect();
    format!("({})", parts.join(" or "))
}

fn stat(name: &str, by: &str, expr: &str) -> String {
    format!("label_replace(max by ({by}) ({expr}), \"{STAT_LABEL}\", \"{name}\", \"\", \"\")")
}

/// Threshold in the field's own unit (`GPU_UTIL` is a percentage).
fn threshold(field: &str, window: &Window) -> f64 {
    if field == fields::GPU_UTIL {
        window.idle_threshold * 100.0
    } else {
        window.idle_threshold
    }
}

/// Width of the start-up query's buckets: about 288 over the lookback (5 min for 24 h), at
/// least one scrape interval, at most the window (the first refresh sees the newest part at
/// full resolution).
pub fn bootstrap_bucket(window: &Window, lookback: chrono::Duration) -> chrono::Duration {
    (lookback / 288).max(window.interval).min(window.length)
}

/// Start-up history over `lookback`, per device and field, in buckets of
/// [`bootstrap_bucket`] width (each sample is read about once per statistic; a subquery at
/// scrape resolution costs lookback ÷ interval evaluations per GPU and timed out at 4,000
/// GPUs): `active` (end of the newest bucket with a sample at or above the threshold),
/// `active_now` (the newest sample, if active), `first` (earliest sample seen by a bucket
/// step), `count`, and `gap_end` (end of the newest bucket below `min_coverage` of its
/// expected samples, or of the first bucket with data after an empty one). Bucket ends err
/// late: activity and gaps are placed up to one bucket later than they happened, so idle time
/// is under- never over-estimated. Devices are keyed by UUID and GPU instance only: the host
/// label may name the exporter pod, which changes when the exporter restarts.
/// `matchers` (`,`-prefixed, or empty) narrows every selector (`--prometheus-selector`).
pub fn bootstrap_query(
    scheme: &LabelScheme,
    window: &Window,
    lookback: chrono::Duration,
    min_coverage: f64,
    matchers: &str,
) -> String {
    let by = format!("{}, {}", scheme.uuid, scheme.gpu_instance);
    let l = duration(lookback);
    let bucket = bootstrap_bucket(window, lookback);
    let b = open_range(bucket);
    let sub = format!("{l}:{}", duration(bucket));
    let expected = bucket.num_milliseconds() as f64
        / window.interval.num_milliseconds().max(1) as f64
        * min_coverage;
    let mut parts = Vec::new();
    for (field, name) in [(fields::GR_ENGINE_ACTIVE, "gr"), (fields::GPU_UTIL, "util")] {
        let thr = threshold(field, window);
        let tag = |stat_name: &str, template: &dyn Fn(&str) -> String| {
            let expr = stat(stat_name, &by, &each_spelling(field, matchers, template));
            format!("label_replace({expr}, \"{FIELD_LABEL}\", \"{name}\", \"\", \"\")")
        };
        parts.push(tag("active", &|f| {
            format!("max_over_time(timestamp(max_over_time({f}[{b}]) >= {thr})[{sub}])")
        }));
        parts.push(tag("active_now", &|f| {
            format!("timestamp({f}) and {f} >= {thr}")
        }));
        parts.push(tag("first", &|f| {
            format!("min_over_time(timestamp({f})[{sub}])")
        }));
        parts.push(tag("count", &|f| {
            format!("count_over_time({f}[{}])", open_range(lookback))
        }));
        parts.push(tag("gap_end", &|f| {
            format!("max_over_time((timestamp(count_over_time({f}[{b}]) < {expected}) or timestamp(count_over_time({f}[{b}]) unless count_over_time({f}[{b}] offset {})))[{sub}])", duration(bucket))
        }));
    }
    parts.join(" or ")
}

/// `{__name__=~"A|B",<matchers>}[range]`: the raw samples of `fields` over `range`.
pub(super) fn range_selector(fields: &[&str], matchers: &str, range: chrono::Duration) -> String {
    format!(
        "{{__name__=~\"{}\"{matchers}}}[{}]",
        fields.join("|"),
        duration(range)
    )
}
