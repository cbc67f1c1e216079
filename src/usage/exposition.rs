//! Parser for Prometheus text exposition (dcgm-exporter `/metrics`, Prometheus `/federate`, or
//! OpenMetrics ending in `# EOF`). Only the DCGM fields gpu-ledger reads are kept.
//!
//! Memory is proportional to the series kept, not to the input: [`parse_reader`] reads one line
//! at a time, and a line of any other metric is dropped once its name is read (no label is
//! decoded, nothing is stored).

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::series::{Labels, Series};

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
/// that is not UTF-8 is an [`std::io::ErrorKind::InvalidData`] error naming the line.
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
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
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

/// True when the last non-blank line of `r` is `# EOF` (an OpenMetrics exposition), as [`parse`]
/// decides it, reading only the end of the input. Leaves `r` at its start.
pub fn ends_with_eof_marker<R: Read + Seek>(r: &mut R) -> std::io::Result<bool> {
    ends_with_eof_marker_chunked(r, 64 * 1024)
}

/// [`ends_with_eof_marker`], reading `chunk` bytes first and twice as many each time more is
/// needed.
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
            // Blank to the chunk's start, or the line may begin before it: read further back.
            _ => tail = (tail * 2).min(len),
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

    fn line(&mut self, raw: &str) {
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
                Some(t) => t,
                None => return self.out.skip(n, format!("bad timestamp {ts:?}")),
            },
            None => self.default_ms,
        };
        let Some(value) = parse_value(value) else {
            return self.out.skip(n, format!("bad value {value:?}"));
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
        return Err(format!("bad metric name {name:?}"));
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
            .ok_or_else(|| format!("label without value in {{{text}}}"))?;
        let name = rest[..eq].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {name:?}"));
        }
        let after = rest[eq + 1..].trim_start();
        let body = after
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name} value is not quoted"))?;
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
        let end = end.ok_or_else(|| format!("label {name} value is not terminated"))?;
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

/// Text format: integer milliseconds; OpenMetrics: (fractional) seconds.
fn parse_timestamp(ts: &str, openmetrics: bool) -> Option<i64> {
    if openmetrics {
        let secs: f64 = ts.parse().ok()?;
        secs.is_finite().then(|| (secs * 1000.0).round() as i64)
    } else {
        ts.parse::<i64>().ok()
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
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).expect("valid")
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
        let text = "a{x=\"1\",y=\"2\"} 1 1000\na{x=\"1\",y=\"2\",} 2 2000\na{ y=\"2\" , x=\"1\"} 3 3000\na{x=\"1\"} 4 4000\n";
        let p = parse(text, &["a"], t0());
        assert_eq!(p.skipped_lines, 0);
        assert_eq!(p.series.len(), 2);
        assert_eq!(
            p.series[0].samples,
            vec![(1000, 1.0), (2000, 2.0), (3000, 3.0)]
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
        let text = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\r\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1 1000\r\nnode_cpu{cpu=\"0\"} 5 1000\nDCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-a\"} 40\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\",} 2 2000\nbroken{\n";
        let keep = ["DCGM_FI_DEV_GPU_UTIL"];
        let a = parse(text, &keep, t0());
        let b = parse_reader(text.as_bytes(), &keep, t0(), false).expect("read");
        assert!(same(&a, &b), "{a:?} vs {b:?}");
        assert_eq!(a.series.len(), 1);
        assert_eq!(a.series[0].samples, vec![(1000, 1.0), (2000, 2.0)]);
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
}
