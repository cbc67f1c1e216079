//! `PromQL` (pure; the text is unit-tested): validated `--prometheus-selector` matchers (and
//! their evaluation against a dump's labels), the labels naming a series' cluster, the window's
//! range-vector selector and the start-up history (bootstrap) query.

use crate::ledger::usage::Window;
use crate::usage::fields;
use crate::usage::scheme::LabelScheme;

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

/// Label telling the spellings' parts apart while [`per_device`] joins them (gone after its
/// aggregation).
const SPELLING_LABEL: &str = "spelling";

/// One value per device (`by`: UUID and GPU instance) over every accepted spelling of `field`
/// (`DCGM_FI_DEV_GPU_UTIL`, `dcgm_fi_dev_gpu_util`, `dcgm_gpu_utilization`,
/// `DCGM_FI_DEV_GPU_UTIL_RATIO`, …) and every series of each (an old and a new exporter pod):
/// `template` per spelling, aggregated with `agg` (`max`, `min`, `sum`) by device, then across
/// spellings with `agg` again. The template gets the selector and `threshold` (in the field's
/// internal unit) in that spelling's own unit: 5 for the percentage `DCGM_FI_DEV_GPU_UTIL`, 0.05
/// for the ratio `DCGM_FI_DEV_GPU_UTIL_RATIO`. Functions drop the metric name, so two spellings
/// of one device from one exporter can have equal label sets: one selector with a `__name__`
/// regex would fail (Prometheus refuses a vector with two equal label sets), and `a or b` would
/// keep only `a`. So each spelling's part is aggregated by device first, labelled with its
/// spelling, and only then joined with `or` (which keeps a device that only one side has) and
/// aggregated across spellings.
fn per_device(
    agg: &str,
    by: &str,
    field: &str,
    matchers: &str,
    threshold: f64,
    template: impl Fn(&str, f64) -> String,
) -> String {
    let parts: Vec<String> = fields::spellings_of(field)
        .map(|spelling| {
            let own = threshold / spelling.scale;
            let part = if matchers.is_empty() {
                template(spelling.name, own)
            } else {
                template(&format!("{}{{{}}}", spelling.name, &matchers[1..]), own)
            };
            format!(
                "label_replace({agg} by ({by}) ({part}), \"{SPELLING_LABEL}\", \"{}\", \"\", \"\")",
                spelling.name
            )
        })
        .collect();
    format!("{agg} by ({by}) ({})", parts.join(" or "))
}

/// `expr` (one value per device) tagged as statistic `name` of field `field`.
fn stat(name: &str, field: &str, expr: &str) -> String {
    format!(
        "label_replace(label_replace({expr}, \"{STAT_LABEL}\", \"{name}\", \"\", \"\"), \"{FIELD_LABEL}\", \"{field}\", \"\", \"\")"
    )
}

/// Threshold in the field's internal unit (`GPU_UTIL` is a percentage).
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
/// is under- never over-estimated.
///
/// Every statistic is the device's, over all of its series ([`per_device`]): every spelling of
/// the field (each thresholded in its own unit) and every exporter pod that reported it. Devices
/// are keyed by UUID and GPU instance only: the host label may name the exporter pod, and an
/// exporter restart or upgrade continues the device under new series (new `pod` and `instance`
/// labels, new metric names). So `first` is the earliest over the device's series, `active` the
/// latest, and a bucket's sample count is the sum over them: the old series' last bucket and the
/// new one's first add up to a full bucket, and a restart or upgrade is no gap; a bucket in
/// which no series of the device has samples still is. Duplicate scrapes of one device (two jobs
/// scraping one exporter) only raise the counts; that can hide a bucket in which each job
/// missed some scrapes, never invent a bucket's samples out of nothing.
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
        let device = |agg: &str, template: &dyn Fn(&str, f64) -> String| {
            per_device(agg, &by, field, matchers, thr, template)
        };
        let active = device("max", &|f, thr| {
            format!("max_over_time(timestamp(max_over_time({f}[{b}]) >= {thr})[{sub}])")
        });
        parts.push(stat("active", name, &active));
        let active_now = device("max", &|f, thr| format!("timestamp({f}) and {f} >= {thr}"));
        parts.push(stat("active_now", name, &active_now));
        let first = device("min", &|f, _| {
            format!("min_over_time(timestamp({f})[{sub}])")
        });
        parts.push(stat("first", name, &first));
        let count = device("sum", &|f, _| {
            format!("count_over_time({f}[{}])", open_range(lookback))
        });
        parts.push(stat("count", name, &count));
        // The device's samples per bucket (all its series), and the bucket before's: the
        // buckets are judged per device, inside one subquery.
        let in_bucket = device("sum", &|f, _| format!("count_over_time({f}[{b}])"));
        let in_bucket_before = device("sum", &|f, _| {
            format!("count_over_time({f}[{b}] offset {})", duration(bucket))
        });
        let gap_end = format!(
            "max_over_time((timestamp({in_bucket} < {expected}) or timestamp({in_bucket} unless {in_bucket_before}))[{sub}])"
        );
        parts.push(stat("gap_end", name, &gap_end));
    }
    parts.join(" or ")
}

/// DCGM metric names: dcgm-exporter's `DCGM_FI_*` (and its `DCGM_EXP_*` families), the lower-case
/// `dcgm_fi_*` of pipelines and the 1.x `dcgm_*` names. Anchored by Prometheus.
const DCGM_NAMES: &str = "DCGM_.+|dcgm_.+";
/// Device identity labels in both spellings (dcgm-exporter's and a lower-casing pipeline's).
const DEVICE_LABELS: &str = "UUID, uuid, GPU_I_ID, gpu_i_id";

/// The number of devices (UUID and GPU instance) with DCGM series but none under a name
/// gpu-ledger reads ([`fields::SPELLINGS`]): an exporter that renamed or dropped the fields
/// (`gpu_ledger_dcgm_devices_fields_missing`). One instant query; 0 when there is none.
/// `matchers` (`,`-prefixed, or empty) narrows every selector (`--prometheus-selector`, a
/// shard's scope).
pub fn fields_missing_query(matchers: &str) -> String {
    let read: Vec<&str> = fields::all_spellings().collect();
    let by = DEVICE_LABELS;
    format!(
        "count(group by ({by}) ({{__name__=~\"{DCGM_NAMES}\",UUID!=\"\"{matchers}}} or {{__name__=~\"{DCGM_NAMES}\",uuid!=\"\"{matchers}}}) unless on ({by}) group by ({by}) ({{__name__=~\"{}\"{matchers}}})) or vector(0)",
        read.join("|")
    )
}

/// Label telling the two parts of [`gpu_health_query`] apart.
pub const HEALTH_PART_LABEL: &str = "health_part";

/// DCGM's verdicts on GPU health over `window` (health layer): per GPU and health watch the
/// highest `DCGM_EXP_GPU_HEALTH_STATUS` above pass (part `watch`), per GPU and XID code the highest
/// `DCGM_EXP_XID_ERRORS_COUNT` above 0 (part `xid`; a windowed gauge, so `max_over_time`). Healthy
/// GPUs are not in the answer. One instant query; `matchers` (`,`-prefixed, or empty) narrows
/// every selector (`--prometheus-selector`, a shard's scope).
pub fn gpu_health_query(window: chrono::Duration, matchers: &str) -> String {
    let w = open_range(window);
    let watch = fields::HEALTH_WATCH_LABEL;
    let xid = fields::XID_LABEL;
    let (health, xids) = (fields::GPU_HEALTH_STATUS, fields::XID_ERRORS_COUNT);
    let m = matchers.strip_prefix(',').unwrap_or(matchers);
    format!(
        "label_replace(max by (UUID, uuid, {watch}) (max_over_time({health}{{{m}}}[{w}])) > 0, \"{HEALTH_PART_LABEL}\", \"watch\", \"\", \"\") or label_replace(max by (UUID, uuid, {xid}) (max_over_time({xids}{{{xid}!=\"\"{matchers}}}[{w}])) > 0, \"{HEALTH_PART_LABEL}\", \"xid\", \"\", \"\")"
    )
}

/// `{__name__=~"A|B",<matchers>}[range]`: the raw samples of `fields` over `range`.
pub(super) fn range_selector(fields: &[&str], matchers: &str, range: chrono::Duration) -> String {
    format!(
        "{{__name__=~\"{}\"{matchers}}}[{}]",
        fields.join("|"),
        duration(range)
    )
}

/// `,<label>=~"a|b|…"`: the devices whose `label` names one of `values` (a shard's node names
/// and its exporter pods' names, `docs/install.md` "Sharding"). Each value is matched literally:
/// regex metacharacters are escaped, then the text is escaped for a `PromQL` string. Prometheus
/// turns a plain alternation into a set lookup on its label index, so the cost of the match
/// stays with the shard's own series. Empty `values` give an empty string: the caller asks
/// nothing then (`=~""` would match every series without the label).
pub fn scope_matcher(label: &str, values: &[String]) -> String {
    if values.is_empty() {
        return String::new();
    }
    let alternation: Vec<String> = values.iter().map(|v| quote_meta(v)).collect();
    let promql_string = alternation
        .join("|")
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    format!(",{label}=~\"{promql_string}\"")
}

/// `v` as a regex matching itself, escaped as Go's `regexp.QuoteMeta` does (`-` and `#` stay as
/// they are): Prometheus recognises an alternation of such literals as a set of values.
fn quote_meta(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A validated list of label matchers (`cluster="prod",job=~"dcgm.*"`), safe to splice into a
/// selector: each is `name op "value"` with a Prometheus label name, one of `=`, `!=`, `=~`,
/// `!~`, and a double-quoted value with `\`-escapes only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(String);

impl Selector {
    /// The matchers, comma-separated, as given (whitespace around them trimmed).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Selector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut rest = s.trim();
        let mut out = Vec::new();
        while !rest.is_empty() {
            let name_len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..name_len];
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(format!("{s:?}: expected a label name at {rest:?}"));
            }
            let after = rest[name_len..].trim_start();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| after.starts_with(op))
                .ok_or_else(|| format!("{s:?}: expected =, !=, =~ or !~ after {name}"))?;
            let value = after[op.len()..].trim_start();
            let body = value
                .strip_prefix('"')
                .ok_or_else(|| format!("{s:?}: the value of {name} must be double-quoted"))?;
            let mut end = None;
            let mut escaped = false;
            for (i, c) in body.char_indices() {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, '\n') => break,
                    _ => {}
                }
            }
            let end = end.ok_or_else(|| format!("{s:?}: unterminated value of {name}"))?;
            out.push(format!("{name}{op}\"{}\"", &body[..end]));
            rest = body[end + 1..].trim_start();
            if let Some(r) = rest.strip_prefix(',') {
                rest = r.trim_start();
                if rest.is_empty() {
                    return Err(format!("{s:?}: trailing comma"));
                }
            } else if !rest.is_empty() {
                return Err(format!("{s:?}: expected a comma before {rest:?}"));
            }
        }
        if out.is_empty() {
            return Err("empty selector".into());
        }
        Ok(Selector(out.join(",")))
    }
}

impl Selector {
    /// The matchers, parsed for evaluation against a series' labels: the offline report applies
    /// `--prometheus-selector` to a dump as Prometheus applies it to a query.
    pub fn matchers(&self) -> Result<Vec<Matcher>, String> {
        let mut out = Vec::new();
        let mut rest = self.0.as_str();
        // `as_str` is canonical (`name op "value"`, comma-separated; validated by `from_str`).
        while !rest.is_empty() {
            let op_at = rest
                .find(['=', '!'])
                .ok_or_else(|| format!("{}: no operator", self.0))?;
            let name = &rest[..op_at];
            let (op, len) = if rest[op_at..].starts_with("=~") {
                (MatchOp::Re, 2)
            } else if rest[op_at..].starts_with("!~") {
                (MatchOp::NotRe, 2)
            } else if rest[op_at..].starts_with("!=") {
                (MatchOp::Ne, 2)
            } else {
                (MatchOp::Eq, 1)
            };
            let body = &rest[op_at + len + 1..];
            let mut value = String::new();
            let mut end = None;
            let mut chars = body.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, 't')) => value.push('\t'),
                        Some((_, e)) => value.push(e),
                        None => {}
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let end = end.ok_or_else(|| format!("{}: unterminated value", self.0))?;
            let regex = match op {
                MatchOp::Re | MatchOp::NotRe => Some(
                    // Prometheus anchors label regexes at both ends.
                    regex::Regex::new(&format!("^(?:{value})$"))
                        .map_err(|e| format!("{}: regex of {name}: {e}", self.0))?,
                ),
                MatchOp::Eq | MatchOp::Ne => None,
            };
            out.push(Matcher {
                name: name.to_string(),
                op,
                value,
                regex,
            });
            rest = body[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&body[end + 1..]);
        }
        Ok(out)
    }
}

/// How a [`Matcher`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Eq,
    Ne,
    Re,
    NotRe,
}

/// One label matcher of a [`Selector`], evaluated as Prometheus does: an absent label has the
/// empty value.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<regex::Regex>,
}

impl Matcher {
    /// Whether a series with `value` (None: the label is absent) passes.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let v = value.unwrap_or("");
        match (self.op, &self.regex) {
            (MatchOp::Eq, _) => v == self.value,
            (MatchOp::Ne, _) => v != self.value,
            (MatchOp::Re, Some(r)) => r.is_match(v),
            (MatchOp::NotRe, Some(r)) => !r.is_match(v),
            (MatchOp::Re | MatchOp::NotRe, None) => false,
        }
    }
}

/// Labels that name the cluster a series came from in a metrics store shared by several
/// clusters: `cluster` (kubernetes-mixin, kube-prometheus-stack's external labels, Thanos and
/// Mimir docs) and `cluster_id` (OpenCost).
pub const CLUSTER_LABELS: &[&str] = &["cluster", "cluster_id"];

/// The distinct cluster names among `labels` (per [`CLUSTER_LABELS`], `name=value`), sorted;
/// a series without any cluster label counts as `(none)`. More than one entry means the
/// series come from several clusters and must not be joined to this cluster's pods.
pub fn clusters_of<'a>(
    labels: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, String>>,
) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut unlabelled = false;
    for l in labels {
        let mut named = false;
        for name in CLUSTER_LABELS {
            if let Some(v) = l.get(*name) {
                seen.insert(format!("{name}={v:?}"));
                named = true;
            }
        }
        unlabelled |= !named;
    }
    if unlabelled && !seen.is_empty() {
        seen.insert("(none)".to_string());
    }
    seen.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::series::Labels;

    fn window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    #[test]
    fn scope_matchers_match_names_literally_and_nothing_when_empty() {
        assert_eq!(scope_matcher("Hostname", &[]), "");
        let m = scope_matcher(
            "Hostname",
            &["gpu-node-0001".into(), "ip-10-0-1-2.ec2.internal".into()],
        );
        // The dot is a literal dot in the regex, and the backslash survives the PromQL string.
        assert_eq!(
            m,
            r#",Hostname=~"gpu-node-0001|ip-10-0-1-2\\.ec2\\.internal""#
        );
        // What Prometheus sees after unquoting is a regex matching exactly those names.
        let unquoted = m
            .trim_start_matches(",Hostname=~\"")
            .trim_end_matches('"')
            .replace("\\\\", "\\");
        let re = regex::Regex::new(&format!("^(?:{unquoted})$")).expect("a regex");
        assert!(re.is_match("ip-10-0-1-2.ec2.internal"));
        assert!(!re.is_match("ip-10-0-1-2xec2xinternal"));
        assert!(!re.is_match("gpu-node-00010"));
        // A quote in a value cannot end the PromQL string early.
        let odd = scope_matcher("Hostname", &["a\"b".into()]);
        assert_eq!(odd, r#",Hostname=~"a\"b""#);
    }

    #[test]
    fn bootstrap_text() {
        let q = bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(24),
            0.9,
            "",
        );
        // 24 h in 5-minute buckets; 10 scrapes of 30 s per bucket, 9 needed.
        assert!(q.contains("max by (UUID, GPU_I_ID) (max_over_time(timestamp(max_over_time(DCGM_FI_DEV_GPU_UTIL[299999ms]) >= 5)[86400000ms:300000ms]))"), "{q}");
        assert!(q.contains("\"field\", \"gr\""), "{q}");
        // Each spelling's threshold in its own unit: a ratio's 5 % is 0.05.
        assert!(q.contains("max_over_time(timestamp(max_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO[299999ms]) >= 0.05)[86400000ms:300000ms])"), "{q}");
        assert!(q.contains("timestamp(DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO) and DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO >= 0.05"), "{q}");
        assert_eq!(
            bootstrap_bucket(&window(), chrono::Duration::minutes(30)),
            chrono::Duration::seconds(30),
            "never finer than a scrape"
        );
        assert_eq!(
            bootstrap_bucket(&window(), chrono::Duration::days(30)),
            chrono::Duration::minutes(10),
            "never wider than the window"
        );
    }

    /// The per-bucket sample count is the device's: summed over every series of every spelling
    /// (an exporter restart or upgrade continues the device), each spelling's part aggregated by
    /// device and labelled before the `or`, inside the one subquery that judges the buckets.
    #[test]
    fn bootstrap_judges_buckets_per_device_across_spellings_and_series() {
        let q = bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(24),
            0.9,
            "",
        );
        let count_of = |name: &str, offset: &str| {
            format!(
                "label_replace(sum by (UUID, GPU_I_ID) (count_over_time({name}[299999ms]{offset})), \"spelling\", \"{name}\", \"\", \"\")"
            )
        };
        let in_bucket = |offset: &str| {
            let parts: Vec<String> = fields::spellings_of(fields::GR_ENGINE_ACTIVE)
                .map(|s| count_of(s.name, offset))
                .collect();
            format!("sum by (UUID, GPU_I_ID) ({})", parts.join(" or "))
        };
        let (now, before) = (in_bucket(""), in_bucket(" offset 300000ms"));
        let gap_end = format!(
            "max_over_time((timestamp({now} < 9) or timestamp({now} unless {before}))[86400000ms:300000ms])"
        );
        assert!(q.contains(&gap_end), "{gap_end}\nnot in\n{q}");
        // The first sample is the earliest over the device's series, the count their sum.
        assert!(
            q.contains("min by (UUID, GPU_I_ID) (label_replace(min by (UUID, GPU_I_ID) (min_over_time(timestamp(DCGM_FI_PROF_GR_ENGINE_ACTIVE)[86400000ms:300000ms])), \"spelling\", \"DCGM_FI_PROF_GR_ENGINE_ACTIVE\", \"\", \"\") or "),
            "{q}"
        );
        assert!(
            q.contains("sum by (UUID, GPU_I_ID) (label_replace(sum by (UUID, GPU_I_ID) (count_over_time(DCGM_FI_DEV_GPU_UTIL[86399999ms])), \"spelling\", \"DCGM_FI_DEV_GPU_UTIL\", \"\", \"\") or "),
            "{q}"
        );
        // No spelling's raw function result meets another's in an `or`.
        for s in fields::SPELLINGS {
            assert!(
                !q.contains(&format!(
                    "or max_over_time(timestamp(max_over_time({}",
                    s.name
                )),
                "{q}"
            );
            assert!(
                !q.contains(&format!("or count_over_time({}", s.name)),
                "{q}"
            );
        }
    }

    #[test]
    fn gpu_health_asks_both_families_per_gpu_over_the_window() {
        let q = gpu_health_query(chrono::Duration::minutes(10), r#",cluster="prod""#);
        assert_eq!(
            q,
            "label_replace(max by (UUID, uuid, health_watch) (max_over_time(DCGM_EXP_GPU_HEALTH_STATUS{cluster=\"prod\"}[599999ms])) > 0, \"health_part\", \"watch\", \"\", \"\") or label_replace(max by (UUID, uuid, xid) (max_over_time(DCGM_EXP_XID_ERRORS_COUNT{xid!=\"\",cluster=\"prod\"}[599999ms])) > 0, \"health_part\", \"xid\", \"\", \"\")"
        );
        assert!(gpu_health_query(chrono::Duration::minutes(10), "").contains("STATUS{}[599999ms]"));
    }

    #[test]
    fn fields_missing_counts_devices_without_any_read_name() {
        let q = fields_missing_query(r#",cluster="prod""#);
        assert!(
            q.starts_with(r#"count(group by (UUID, uuid, GPU_I_ID, gpu_i_id) ({__name__=~"DCGM_.+|dcgm_.+",UUID!="",cluster="prod"} or {__name__=~"DCGM_.+|dcgm_.+",uuid!="",cluster="prod"}) unless on (UUID, uuid, GPU_I_ID, gpu_i_id)"#),
            "{q}"
        );
        for name in fields::all_spellings() {
            assert!(q.contains(name), "{name}: {q}");
        }
        assert!(q.ends_with(r#",cluster="prod"})) or vector(0)"#), "{q}");
    }

    #[test]
    fn selectors_are_validated_and_spliced_into_every_query() {
        let sel: Selector = r#" cluster="prod" , job=~"dcgm.*",env!="a\"b" "#
            .parse()
            .expect("valid");
        assert_eq!(sel.as_str(), r#"cluster="prod",job=~"dcgm.*",env!="a\"b""#);
        for bad in [
            "",
            "cluster",
            "cluster=prod",
            r#"cluster="prod"}"#,
            r#"cluster="prod""#.trim_end_matches('"'),
            r#"cluster="a",,job="b""#,
            r#"1x="a""#,
            r#"cluster="a" job="b""#,
            r#"cluster="a"} or vector(1) or {x="b""#,
        ] {
            assert!(bad.parse::<Selector>().is_err(), "{bad:?}");
        }
        let q = bootstrap_query(
            &LabelScheme::default(),
            &window(),
            chrono::Duration::hours(1),
            0.9,
            r#",cluster="prod""#,
        );
        assert!(
            q.contains(r#"timestamp(DCGM_FI_DEV_GPU_UTIL{cluster="prod"}) and DCGM_FI_DEV_GPU_UTIL{cluster="prod"} >= 5"#),
            "{q}"
        );
        assert!(
            q.contains(r#"dcgm_gpu_utilization{cluster="prod"}"#),
            "every spelling: {q}"
        );
        // Every selector of every spelling carries the matchers (the offset ones of the
        // per-device bucket counts too): a name is followed by them or closes a label value.
        for s in fields::SPELLINGS {
            for (at, _) in q.match_indices(s.name) {
                let after = &q[at + s.name.len()..];
                assert!(
                    after.starts_with(r#"{cluster="prod"}"#)
                        || after.starts_with('"')
                        || after.starts_with('_'),
                    "{} without the selector at {}",
                    s.name,
                    &q[at..(at + 80).min(q.len())]
                );
            }
        }
    }

    #[test]
    fn selectors_evaluate_like_prometheus_matchers() {
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let passes = |sel: &str, l: &Labels| {
            let s: Selector = sel.parse().expect("selector");
            s.matchers()
                .expect("matchers")
                .iter()
                .all(|m| m.matches(l.get(&m.name).map(String::as_str)))
        };
        let east = labels(&[("cluster", "east"), ("job", "dcgm")]);
        let bare = labels(&[("job", "dcgm")]);
        assert!(passes(r#"cluster="east""#, &east));
        assert!(!passes(r#"cluster="west""#, &east));
        assert!(passes(r#"cluster!="west",job="dcgm""#, &east));
        // Regexes are anchored at both ends, as in PromQL.
        assert!(passes(r#"cluster=~"ea.*""#, &east));
        assert!(!passes(r#"cluster=~"as""#, &east));
        assert!(passes(r#"cluster!~"w.*""#, &east));
        // An absent label is the empty value.
        assert!(passes(r#"cluster="""#, &bare));
        assert!(!passes(r#"cluster=~".+""#, &bare));
        // Escapes inside values.
        let quoted = labels(&[("team", "a\"b")]);
        assert!(passes(r#"team="a\"b""#, &quoted));
    }

    #[test]
    fn clusters_are_named_and_a_missing_label_counts() {
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let (east, west, bare) = (
            l(&[("cluster", "east")]),
            l(&[("cluster", "west")]),
            l(&[("job", "dcgm")]),
        );
        assert!(
            clusters_of([&bare, &bare]).is_empty(),
            "one Prometheus, no label"
        );
        assert_eq!(clusters_of([&east, &east]), ["cluster=\"east\""]);
        assert_eq!(
            clusters_of([&east, &west]),
            ["cluster=\"east\"", "cluster=\"west\""]
        );
        assert_eq!(
            clusters_of([&east, &bare]),
            ["(none)", "cluster=\"east\""],
            "a store mixing labelled and unlabelled series is ambiguous too"
        );
        let opencost = l(&[("cluster_id", "c1")]);
        assert_eq!(clusters_of([&opencost]), ["cluster_id=\"c1\""]);
    }
}
