//! Parser for Prometheus text exposition (dcgm-exporter `/metrics`, Prometheus `/federate`, or
//! OpenMetrics ending in `# EOF`). Only the DCGM fields gpu-ledger reads are kept.
//!
//! Memory is proportional to the series kept, not to the input: [`parse_reader`] reads one line
//! at a time, and a line of any other metric is dropped once its name is read (no label is
//! decoded, nothing is stored). A line longer than [`MAX_LINE_BYTES`] is skipped without being
//! held (read and discarded up to its newline), and what a warning quotes of a bad line is cut to
//! [`EXCERPT_CHARS`] characters.
//!
//! Sample timestamps outside [`MIN_SAMPLE_MS`]..=[`MAX_SAMPLE_MS`] (before 2000, after 9999, or
//! not finite) are impossible for a DCGM reading: such a line is skipped and counted, so no later
//! time arithmetic sees them.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::series::{Labels, Series};

/// Longest line read (bytes, `\n` excluded). dcgm-exporter lines are under 1 KiB; gpu-ledger's
/// own exposition re-parsed with hostile 16 KiB names reaches about 100 KiB. A longer line is
/// skipped without being buffered.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Characters of a bad line (or of its name or labels) quoted in a skip reason.
pub const EXCERPT_CHARS: usize = 80;
/// Earliest sample time accepted: 2000-01-01T00:00:00Z, in Unix milliseconds.
pub const MIN_SAMPLE_MS: i64 = 946_684_800_000;
/// Latest sample time accepted: 9999-12-31T23:59:59.999Z, in Unix milliseconds.
pub const MAX_SAMPLE_MS: i64 = 253_402_300_799_999;

/// True for a sample time (Unix ms) a DCGM reading can carry.
pub fn plausible_sample_ms(t: i64) -> bool {
    (MIN_SAMPLE_MS..=MAX_SAMPLE_MS).contains(&t)
}

/// Result of parsing a dump: the series kept and what had to be skipped.
#[derive(Debug, Default)]
pub struct Parsed {
    pub series: Vec<Series>,
    /// Lines that were neither comments, blank, nor valid samples.
    pub skipped_lines: usize,
    /// The first skipped line (1-based) and why, for the warning.
    pub first_skip: Option<(usize, String)>,
    /// Lines (kept or not) whose metric name starts with `DCGM_FI_`.
    pub dcgm_lines: usize,
    /// Skipped lines whose timestamp no DCGM reading can carry (also in `skipped_lines`).
    pub impossible_timestamps: usize,
    /// Skipped lines longer than [`MAX_LINE_BYTES`] (also in `skipped_lines`).
    pub oversized_lines: usize,
}

/// Parses `text`, keeping samples whose metric name is in `keep`; samples without a timestamp are
/// placed at `default_time`.
pub fn parse(text: &str, keep: &[&str], default_time: DateTime<Utc>) -> Parsed {
    let openmetrics = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| l.trim() == "# EOF");
    let mut parser = Parser::new(keep, default_time, openmetrics);
    for line in text.lines() {
        parser.line(line);
    }
    parser.finish()
}

/// [`parse`] over a reader, one line at a time. `openmetrics` says how to read sample
/// timestamps (seconds, not milliseconds): [`ends_with_eof_marker`] tells it for a file. A line
/// that is not UTF-8 is an [`std::io::ErrorKind::InvalidData`] error naming the line. A line
/// longer than [`MAX_LINE_BYTES`] is skipped: memory stays bounded whatever the input.
pub fn parse_reader<R: BufRead>(
    mut reader: R,
    keep: &[&str],
    default_time: DateTime<Utc>,
    openmetrics: bool,
) -> std::io::Result<Parsed> {
    let mut parser = Parser::new(keep, default_time, openmetrics);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match read_line_bounded(&mut reader, &mut buf, MAX_LINE_BYTES)? {
            LineRead::End => break,
            LineRead::Oversized => {
                parser.oversized();
                continue;
            }
            LineRead::Line => {}
        }
        let line = std::str::from_utf8(&buf).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {}: not UTF-8 ({e})", parser.lines + 1),
            )
        })?;
        // Line ends as `str::lines` strips them: `\n`, or `\r\n`.
        let line = line
            .strip_suffix('\n')
            .map_or(line, |l| l.strip_suffix('\r').unwrap_or(l));
        parser.line(line);
    }
    Ok(parser.finish())
}

/// What [`read_line_bounded`] found.
enum LineRead {
    /// A line (with its `\n`, unless it was the last) is in the buffer.
    Line,
    /// A line longer than the bound was read and discarded; the buffer holds nothing of it.
    Oversized,
    /// End of input.
    End,
}

/// Reads one line into `buf` like `read_until(b'\n')`, but a line of more than `max` bytes
/// (line end excluded) is consumed to its newline without being kept.
fn read_line_bounded<R: BufRead>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    let mut read_any = false;
    let mut oversized = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        read_any = true;
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let used = chunk.len();
        if !oversized {
            // The `\n` does not count against the bound (a `\r` before it does).
            let body = chunk.strip_suffix(b"\n").unwrap_or(chunk);
            if buf.len().saturating_add(body.len()) > max {
                oversized = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if done {
            break;
        }
    }
    Ok(match (read_any, oversized) {
        (false, _) => LineRead::End,
        (true, true) => LineRead::Oversized,
        (true, false) => LineRead::Line,
    })
}

/// At most [`EXCERPT_CHARS`] characters of `s`, escaped (control and non-printing characters
/// spelled out), with `…` when cut: safe and short enough to quote in a warning.
pub fn excerpt(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    for c in chars.by_ref().take(EXCERPT_CHARS) {
        out.extend(c.escape_debug());
    }
    if chars.next().is_some() {
        out.push('…');
    }
    format!("\"{out}\"")
}

/// True when the last non-blank line of `r` is `# EOF` (an OpenMetrics exposition), as [`parse`]
/// decides it, reading only the end of the input (at most [`EOF_SCAN_BYTES`]: a last line or a
/// blank tail longer than that is no `# EOF` marker). Leaves `r` at its start.
pub fn ends_with_eof_marker<R: Read + Seek>(r: &mut R) -> std::io::Result<bool> {
    ends_with_eof_marker_chunked(r, 64 * 1024)
}

/// Most bytes [`ends_with_eof_marker`] reads from the end of the input.
pub const EOF_SCAN_BYTES: u64 = 2 * MAX_LINE_BYTES as u64;

/// [`ends_with_eof_marker`], reading `chunk` bytes first and twice as many each time more is
/// needed, up to [`EOF_SCAN_BYTES`].
fn ends_with_eof_marker_chunked<R: Read + Seek>(r: &mut R, chunk: u64) -> std::io::Result<bool> {
    let len = r.seek(SeekFrom::End(0))?;
    let mut tail = chunk.max(1).min(len);
    let answer = loop {
        let start = len - tail;
        r.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::with_capacity(usize::try_from(tail).unwrap_or(0));
        r.by_ref().take(tail).read_to_end(&mut bytes)?;
        // A character cut at `start` only damages the first line, which is never decided on
        // unless the read began at the start of the input.
        let text = String::from_utf8_lossy(&bytes);
        let mut lines = text.lines().rev().peekable();
        let mut found = None;
        while let Some(l) = lines.next() {
            if !l.trim().is_empty() {
                let first_of_chunk = lines.peek().is_none() && !text.starts_with('\n');
                found = Some((l.trim() == "# EOF", first_of_chunk));
                break;
            }
        }
        match found {
            Some((is_eof, first_of_chunk)) if !first_of_chunk || start == 0 => break is_eof,
            None if start == 0 => break false,
            // A blank tail or a last line this long is no marker (and must not fill memory).
            _ if tail >= EOF_SCAN_BYTES => break false,
            // Blank to the chunk's start, or the line may begin before it: read further back.
            _ => tail = tail.saturating_mul(2).min(len).min(EOF_SCAN_BYTES),
        }
    };
    r.seek(SeekFrom::Start(0))?;
    Ok(answer)
}

/// Line-by-line state of one parse.
struct Parser<'k> {
    keep: &'k [&'k str],
    openmetrics: bool,
    default_ms: i64,
    /// Lines read so far (the 1-based number of the current line while it is parsed).
    lines: usize,
    /// `name{label text` exactly as spelled in the input → series: repeated samples of a series
    /// (federate dumps) are matched without decoding labels again.
    raw: HashMap<Box<str>, usize>,
    /// Scratch buffer for `raw` look-ups.
    raw_key: String,
    /// Hash of the decoded identity (name, labels) → series with that hash: `{a="1"}` and
    /// `{a="1",}` (or other spacing, order, escapes) are one series, as in Prometheus.
    identity: HashMap<u64, Vec<usize>>,
    hasher: foldhash::fast::RandomState,
    out: Parsed,
}

impl<'k> Parser<'k> {
    fn new(keep: &'k [&'k str], default_time: DateTime<Utc>, openmetrics: bool) -> Self {
        Parser {
            keep,
            openmetrics,
            default_ms: default_time.timestamp_millis(),
            lines: 0,
            raw: HashMap::new(),
            raw_key: String::new(),
            identity: HashMap::new(),
            hasher: foldhash::fast::RandomState::default(),
            out: Parsed::default(),
        }
    }

    /// Counts a line that [`read_line_bounded`] skipped as longer than [`MAX_LINE_BYTES`].
    fn oversized(&mut self) {
        self.lines += 1;
        self.out.oversized_lines += 1;
        self.out.skip(
            self.lines,
            format!("line longer than {MAX_LINE_BYTES} bytes (not read)"),
        );
    }

    fn line(&mut self, raw: &str) {
        if raw.len() > MAX_LINE_BYTES {
            return self.oversized();
        }
        self.lines += 1;
        let n = self.lines;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            return;
        }
        if line.starts_with("DCGM_FI_") {
            self.out.dcgm_lines += 1;
        }
        let (name, label_text, value, ts) = match split_sample(line) {
            Ok(parts) => parts,
            Err(e) => return self.out.skip(n, e),
        };
        if !self.keep.contains(&name) {
            return;
        }
        let t_ms = match ts {
            Some(ts) => match parse_timestamp(ts, self.openmetrics) {
                Timestamp::Ms(t) => t,
                Timestamp::Impossible => {
                    self.out.impossible_timestamps += 1;
                    return self.out.skip(
                        n,
                        format!(
                            "impossible timestamp {} (outside 2000-01-01 to 9999-12-31)",
                            excerpt(ts)
                        ),
                    );
                }
                Timestamp::Bad => {
                    return self.out.skip(n, format!("bad timestamp {}", excerpt(ts)));
                }
            },
            None => self.default_ms,
        };
        let Some(value) = parse_value(value) else {
            return self.out.skip(n, format!("bad value {}", excerpt(value)));
        };
        self.raw_key.clear();
        self.raw_key.push_str(name);
        self.raw_key.push('{');
        self.raw_key.push_str(label_text);
        let slot = if let Some(i) = self.raw.get(self.raw_key.as_str()) {
            *i
        } else {
            match parse_labels(label_text) {
                Ok(labels) => {
                    let slot = self.series_for(name, labels);
                    self.raw.insert(self.raw_key.as_str().into(), slot);
                    slot
                }
                Err(e) => return self.out.skip(n, e),
            }
        };
        self.out.series[slot].samples.push((t_ms, value));
    }

    /// The series of identity (`name`, `labels`), created when new.
    fn series_for(&mut self, name: &str, labels: Labels) -> usize {
        let hash = self.hasher.hash_one((name, &labels));
        let same = self.identity.entry(hash).or_default();
        if let Some(i) = same
            .iter()
            .copied()
            .find(|i| self.out.series[*i].name == name && *self.out.series[*i].labels == labels)
        {
            return i;
        }
        self.out.series.push(Series {
            name: name.to_string(),
            labels: Arc::new(labels),
            samples: Vec::new(),
        });
        let slot = self.out.series.len() - 1;
        same.push(slot);
        slot
    }

    fn finish(mut self) -> Parsed {
        for s in &mut self.out.series {
            s.samples.sort_by_key(|(t, _)| *t);
        }
        self.out
    }
}

impl Parsed {
    fn skip(&mut self, line: usize, why: String) {
        self.skipped_lines += 1;
        if self.first_skip.is_none() {
            self.first_skip = Some((line, why));
        }
    }
}

/// Splits `name{labels} value [ts]` into parts, without decoding labels yet.
fn split_sample(line: &str) -> Result<(&str, &str, &str, Option<&str>), String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("missing value")?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return Err(format!("bad metric name {}", excerpt(name)));
    }
    let rest = &line[name_end..];
    let (labels, rest) = if rest.starts_with('{') {
        let close = find_label_end(rest).ok_or("unterminated label set")?;
        (&rest[1..close], &rest[close + 1..])
    } else {
        ("", rest)
    };
    let mut parts = rest.split_whitespace();
    let value = parts.next().ok_or("missing value")?;
    let ts = parts.next();
    if parts.next().is_some() {
        return Err("trailing data after timestamp".into());
    }
    Ok((name, labels, value, ts))
}

/// Index of the closing `}` of a label set, honouring quoted values with escapes.
fn find_label_end(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        if in_quotes {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quotes = false;
            }
        } else if c == '"' {
            in_quotes = true;
        } else if c == '}' {
            return Some(i);
        }
    }
    None
}

fn parse_labels(text: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("label without value in {{{}}}", excerpt(text)))?;
        let name = rest[..eq].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {}", excerpt(name)));
        }
        let after = rest[eq + 1..].trim_start();
        let body = after
            .strip_prefix('"')
            .ok_or_else(|| format!("label {} value is not quoted", excerpt(name)))?;
        let mut value = String::new();
        let mut chars = body.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err("dangling escape".into()),
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {} value is not terminated", excerpt(name)))?;
        // Empty values are the same as an absent label (as in Prometheus).
        if !value.is_empty() {
            labels.insert(name.to_string(), value);
        }
        rest = body[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(labels)
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse::<f64>().ok(),
    }
}

/// A sample timestamp as read.
enum Timestamp {
    /// Unix milliseconds within [`MIN_SAMPLE_MS`]..=[`MAX_SAMPLE_MS`].
    Ms(i64),
    /// A number, but no time a DCGM reading can carry (or not finite).
    Impossible,
    /// Not a number.
    Bad,
}

/// Text format: integer milliseconds; OpenMetrics: (fractional) seconds.
fn parse_timestamp(ts: &str, openmetrics: bool) -> Timestamp {
    let ms = if openmetrics {
        let Ok(secs) = ts.parse::<f64>() else {
            return Timestamp::Bad;
        };
        let ms = (secs * 1000.0).round();
        // Compared as floats: the bounds are exact in f64, and NaN fails both comparisons.
        let inside = ms >= MIN_SAMPLE_MS as f64 && ms <= MAX_SAMPLE_MS as f64;
        if !inside {
            return Timestamp::Impossible;
        }
        ms as i64
    } else {
        match ts.parse::<i64>() {
            Ok(ms) => ms,
            // Digits beyond i64 are a number too, just an impossible one.
            Err(e)
                if matches!(
                    e.kind(),
                    std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
                ) =>
            {
                return Timestamp::Impossible;
            }
            Err(_) => return Timestamp::Bad,
        }
    };
    if plausible_sample_ms(ms) {
        Timestamp::Ms(ms)
    } else {
        Timestamp::Impossible
    }
}

/// Writes series in the text exposition format with millisecond sample timestamps
/// (`name{labels} value timestamp_ms`), one `# TYPE … gauge` block per metric name, series
/// sorted by labels and samples by time: a DCGM history that [`parse`] (and so
/// `report --from`) reads back unchanged.
pub fn write_history(series: &[Series], out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut sorted: Vec<&Series> = series.iter().collect();
    sorted.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
    let mut current: Option<&str> = None;
    for s in sorted {
        if current != Some(s.name.as_str()) {
            writeln!(out, "# TYPE {} gauge", s.name)?;
            current = Some(s.name.as_str());
        }
        let mut labels = String::new();
        for (i, (k, v)) in s.labels.iter().enumerate() {
            if i > 0 {
                labels.push(',');
            }
            labels.push_str(k);
            labels.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => labels.push_str("\\\\"),
                    '"' => labels.push_str("\\\""),
                    '\n' => labels.push_str("\\n"),
                    c => labels.push(c),
                }
            }
            labels.push('"');
        }
        for (t, v) in &s.samples {
            writeln!(out, "{}{{{labels}}} {} {t}", s.name, format_value(*v))?;
        }
    }
    Ok(())
}

/// A sample value as the text format spells it (`NaN`, `+Inf`, `-Inf`, else the shortest
/// decimal that reads back as the same `f64`).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::usage::{Window, Workload};
    use crate::usage::fields;
    use crate::usage::scheme::{LabelScheme, SchemeChoice};
    use crate::usage::series::{MIB, reduce};
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).expect("valid")
    }

    /// The window the reduction tests below read a parsed exposition over.
    fn reduced_window() -> Window {
        Window {
            length: chrono::Duration::minutes(10),
            interval: chrono::Duration::seconds(30),
            idle_threshold: 0.05,
            max_staleness: chrono::Duration::minutes(2),
        }
    }

    #[test]
    fn mig_instances_are_separate_devices() {
        let text = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-m\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\",Hostname=\"h\",pod=\"a\",namespace=\"ns\"} 0.8\n\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-m\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"9\",Hostname=\"h\"} 0\n";
        let p = parse(text, &[fields::GR_ENGINE_ACTIVE], t0());
        let d = reduce(&p.series, &LabelScheme::default(), &reduced_window(), t0());
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].key.gpu_instance.as_deref(), Some("2"));
        assert_eq!(d[0].mig_profile.as_deref(), Some("3g.40gb"));
        assert_eq!(d[1].workloads.len(), 0);
    }

    #[test]
    fn a_pod_named_only_by_framebuffer_series_holds_the_device() {
        // MIG without profiling metrics: no utilisation field, FB_USED names the pod.
        let text = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-m\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"7\",Hostname=\"h\",pod=\"nb-0\",namespace=\"ns\"} 4096\n\
DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-m\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"7\",Hostname=\"h\",pod=\"nb-0\",namespace=\"ns\"} 5632\n";
        let p = parse(text, &[fields::FB_USED], t0());
        let d = reduce(&p.series, &LabelScheme::default(), &reduced_window(), t0());
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].workloads,
            vec![Workload {
                namespace: "ns".into(),
                pod: "nb-0".into()
            }]
        );
        assert_eq!(d[0].signal, None);
        assert_eq!(d[0].utilization, None);
        assert_eq!(d[0].memory_used_bytes, Some(4096.0 * MIB));
    }

    #[test]
    fn legacy_and_lowercase_spellings_reduce_like_the_current_ones() {
        let text = "dcgm_fi_prof_gr_engine_active{gpu=\"0\",uuid=\"GPU-l\",gpu_i_id=\"3\",gpu_i_profile=\"3g.40gb\",modelname=\"NVIDIA A100-SXM4-80GB\",pod_name=\"w-0\",pod_namespace=\"ml\",container_name=\"main\",pod=\"dcgm-exporter-abcde\",namespace=\"gpu-operator\"} 0.5\n";
        let keep: Vec<&str> = fields::all_spellings().collect();
        let p = parse(text, &keep, t0());
        let scheme = LabelScheme::detect(
            SchemeChoice::Auto,
            p.series
                .iter()
                .flat_map(|s| s.labels.keys().map(String::as_str)),
        );
        let d = reduce(&p.series, &scheme, &reduced_window(), t0());
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].key.gpu_instance.as_deref(), Some("3"));
        assert_eq!(d[0].mig_profile.as_deref(), Some("3g.40gb"));
        assert_eq!(d[0].model.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(d[0].utilization, Some(0.5));
        assert_eq!(
            d[0].workloads,
            vec![Workload {
                namespace: "ml".into(),
                pod: "w-0".into()
            }]
        );
        assert_eq!(
            d[0].exporter,
            Some(Workload {
                namespace: "gpu-operator".into(),
                pod: "dcgm-exporter-abcde".into()
            })
        );
    }

    #[test]
    fn parses_dcgm_lines_and_skips_garbage() {
        let text = r#"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA \"H100\"",Hostname="n1",pod="",namespace="ns"} 63
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b"} NaN 1700000001000
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 40
this is not a sample
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c" 5
"#;
        let p = parse(text, &["DCGM_FI_DEV_GPU_UTIL"], t0());
        assert_eq!(p.series.len(), 2);
        assert_eq!(p.skipped_lines, 2);
        assert_eq!(p.first_skip.as_ref().map(|s| s.0), Some(6));
        let a = &p.series[0];
        assert_eq!(
            a.labels.get("modelName").map(String::as_str),
            Some("NVIDIA \"H100\"")
        );
        assert!(!a.labels.contains_key("pod"), "empty label is absent");
        assert_eq!(a.samples, vec![(1_700_000_000_000, 63.0)]);
        assert!(p.series[1].samples[0].1.is_nan());
        assert_eq!(p.series[1].samples[0].0, 1_700_000_001_000);
    }

    #[test]
    fn openmetrics_timestamps_are_seconds() {
        let text = "DCGM_FI_DEV_FB_USED{UUID=\"GPU-a\"} 1 1700000000.5\nDCGM_FI_DEV_FB_USED{UUID=\"GPU-a\"} 2 1700000030\n# EOF\n";
        let p = parse(text, &["DCGM_FI_DEV_FB_USED"], t0());
        assert_eq!(p.series.len(), 1);
        assert_eq!(
            p.series[0].samples,
            vec![(1_700_000_000_500, 1.0), (1_700_000_030_000, 2.0)]
        );
    }

    /// Found by the `exposition` fuzz target: label sets spelled differently were two series.
    #[test]
    fn one_series_per_identity() {
        let text = "a{x=\"1\",y=\"2\"} 1 1700000001000\na{x=\"1\",y=\"2\",} 2 1700000002000\na{ y=\"2\" , x=\"1\"} 3 1700000003000\na{x=\"1\"} 4 1700000004000\n";
        let p = parse(text, &["a"], t0());
        assert_eq!(p.skipped_lines, 0);
        assert_eq!(p.series.len(), 2);
        assert_eq!(
            p.series[0].samples,
            vec![
                (1_700_000_001_000, 1.0),
                (1_700_000_002_000, 2.0),
                (1_700_000_003_000, 3.0)
            ]
        );
    }

    fn same(a: &Parsed, b: &Parsed) -> bool {
        a.series == b.series
            && a.skipped_lines == b.skipped_lines
            && a.first_skip == b.first_skip
            && a.dcgm_lines == b.dcgm_lines
    }

    #[test]
    fn reader_and_text_agree_on_a_federate_dump() {
        let text = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\r\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 1700000001000\r\nnode_cpu{cpu=\"0\"} 5 1000\nDCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-a\"} 40\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\",} 2 1700000002000\nbroken{\n";
        let keep = ["DCGM_FI_DEV_GPU_UTIL"];
        let a = parse(text, &keep, t0());
        let b = parse_reader(text.as_bytes(), &keep, t0(), false).expect("read");
        assert!(same(&a, &b), "{a:?} vs {b:?}");
        assert_eq!(a.series.len(), 1);
        assert_eq!(
            a.series[0].samples,
            vec![(1_700_000_001_000, 1.0), (1_700_000_002_000, 2.0)]
        );
        assert_eq!(a.dcgm_lines, 3);
        assert_eq!(a.skipped_lines, 1);
    }

    #[test]
    fn reader_rejects_non_utf8_naming_the_line() {
        let bytes = b"a 1\nb\xff 2\n";
        let e = parse_reader(&bytes[..], &["a"], t0(), false).expect_err("not UTF-8");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("line 2:"), "{e}");
    }

    #[test]
    fn eof_marker_is_found_from_the_end() {
        for (text, want) in [
            ("a 1\n# EOF\n", true),
            ("a 1\n# EOF", true),
            ("a 1\n  # EOF  \n\n   \n", true),
            ("a 1\n", false),
            ("", false),
            ("x# EOF\n", false),
            ("# EOF\na 1\n", false),
        ] {
            for chunk in [1, 2, 3, 5, 64 * 1024] {
                let mut c = std::io::Cursor::new(text.as_bytes());
                let got = ends_with_eof_marker_chunked(&mut c, chunk).expect("seek");
                assert_eq!(got, want, "{text:?} chunk {chunk}");
                assert_eq!(c.position(), 0, "rewound");
            }
        }
    }

    proptest! {
        /// The streaming reader is the text parser, line for line, for either timestamp unit.
        #[test]
        fn reader_matches_text_parser(text in "(DCGM_FI_DEV_GPU_UTIL|a|b|# EOF|# TYPE a gauge|\\{|\\}|=|\"|,| |\r|\n|[0-9.]|x|é|\\\\)*") {
            let keep = ["DCGM_FI_DEV_GPU_UTIL", "a"];
            let whole = parse(&text, &keep, t0());
            let mut cursor = std::io::Cursor::new(text.as_bytes());
            let om = ends_with_eof_marker_chunked(&mut cursor, 3).expect("seek");
            let om_text = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.trim() == "# EOF");
            prop_assert_eq!(om, om_text);
            let streamed = parse_reader(cursor, &keep, t0(), om).expect("read");
            prop_assert!(same(&whole, &streamed), "{:?} vs {:?}", whole, streamed);
        }

        #[test]
        fn never_panics(text in "\\PC{0,200}") {
            let _ = parse(&text, &["DCGM_FI_DEV_GPU_UTIL", "a"], t0());
        }

        #[test]
        fn label_values_round_trip(v in "[ -~\n]{0,20}") {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let text = format!("a{{UUID=\"{escaped}\"}} 1\n");
            let p = parse(&text, &["a"], t0());
            prop_assert_eq!(p.skipped_lines, 0);
            let got = p.series[0].labels.get("UUID").cloned().unwrap_or_default();
            prop_assert_eq!(got, v);
        }
    }

    #[test]
    fn written_history_reads_back_unchanged() {
        let mut labels = Labels::new();
        labels.insert("UUID".into(), "GPU-a".into());
        labels.insert("modelName".into(), "NVIDIA \"H100\" \\ 80GB\nx".into());
        let series = vec![
            Series {
                name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE".into(),
                labels: Arc::new(labels.clone()),
                samples: vec![
                    (1_700_000_000_000, 0.1),
                    (1_700_000_001_000, 1e-7),
                    (1_700_000_002_000, f64::NAN),
                ],
            },
            Series {
                name: "DCGM_FI_DEV_FB_USED".into(),
                labels: Arc::new(labels),
                samples: vec![(1_700_000_000_000, 2_253_389_824.0)],
            },
        ];
        let mut out = Vec::new();
        write_history(&series, &mut out).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains(" 0.1 1700000000000\n"), "{text}");
        let p = parse(
            &text,
            &["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"],
            t0(),
        );
        assert_eq!(p.skipped_lines, 0, "{text}");
        assert_eq!(p.series.len(), 2);
        let gr = p
            .series
            .iter()
            .find(|s| s.name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            .expect("gr");
        assert_eq!(gr.labels, series[0].labels);
        assert_eq!(gr.samples[..2], series[0].samples[..2]);
        assert!(gr.samples[2].1.is_nan());
        let fb = p
            .series
            .iter()
            .find(|s| s.name == "DCGM_FI_DEV_FB_USED")
            .expect("fb");
        assert_eq!(fb.samples, series[1].samples);
    }

    #[test]
    fn impossible_timestamps_are_skipped_with_their_reason() {
        let text = "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 -9223372036854775808\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 2 -9000000000000000\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 3 0\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 4 9223372036854775807\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 5 1700000000000\n";
        let p = parse(text, &["DCGM_FI_DEV_GPU_UTIL"], t0());
        assert_eq!(p.series[0].samples, vec![(1_700_000_000_000, 5.0)]);
        assert_eq!(p.skipped_lines, 4);
        assert_eq!(p.impossible_timestamps, 4);
        let (line, why) = p.first_skip.expect("first skip");
        assert_eq!(line, 1);
        assert!(why.contains("impossible timestamp"), "{why}");
        // OpenMetrics seconds: the same bounds, and non-finite values.
        let om = "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 -1e300\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 1e300\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 NaN\n\
DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 1700000000.5\n# EOF\n";
        let p = parse(om, &["DCGM_FI_DEV_GPU_UTIL"], t0());
        assert_eq!(p.series[0].samples, vec![(1_700_000_000_500, 1.0)]);
        assert_eq!(p.skipped_lines, 3);
    }

    #[test]
    fn an_oversized_line_is_skipped_unbuffered_and_not_echoed() {
        let mut input = b"DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 5\n".to_vec();
        input.extend(std::iter::repeat_n(0u8, 4 * MAX_LINE_BYTES));
        input.extend(b"\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-b\"} 6\n");
        input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 1));
        let p = parse_reader(&input[..], &["DCGM_FI_DEV_GPU_UTIL"], t0(), false).expect("parse");
        assert_eq!(p.series.len(), 2);
        assert_eq!(p.skipped_lines, 2);
        let (line, why) = p.first_skip.expect("skip");
        assert_eq!(line, 2);
        assert!(why.len() < 200, "{why}");
        // A short bad line is echoed, cut to a bounded excerpt.
        let long_name = format!("{}\0 1\n", "é".repeat(1000));
        let p = parse_reader(long_name.as_bytes(), &["x"], t0(), false).expect("parse");
        let (_, why) = p.first_skip.expect("skip");
        assert!(why.chars().count() < 200, "{why}");
        // `parse` over text in memory applies the same bound.
        let text = format!("{}\n", "y".repeat(MAX_LINE_BYTES + 1));
        let p = parse(&text, &["x"], t0());
        assert_eq!(p.skipped_lines, 1);
        assert!(p.first_skip.expect("skip").1.len() < 200);
    }
}
