//! Decoding of Prometheus' query answers' `data`, bounded before anything is copied out of the
//! body (see [`super::bounds`]). Two decoders: [`window_answer`] for every read of the sample
//! window (the refresh, the pre-stop re-check, scheme detection: the envelope
//! ([`super::envelope`]) and `data` in one scan, [`WindowAnswer`], the read labels only, their
//! values borrowed from the body, samples in one buffer, so a series the window already holds
//! costs no allocation), and [`query_data`] for everything else (vector and scalar answers,
//! subqueries, `capture`'s range-vector read: every label kept; the client has read the
//! envelope in a scan of its own). Both refuse the same answers.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;

use super::bounds::{MAX_LABEL_BYTES, MAX_LABELS_PER_SERIES, MAX_SERIES, OVER_BOUND};
use super::envelope::ApiResponse;
use super::error::PromError;
use crate::usage::fields;
use crate::usage::scheme::READ_LABELS;
use crate::usage::series::{Labels, Series};

fn over_bound<E: serde::de::Error>(what: std::fmt::Arguments<'_>) -> E {
    E::custom(format_args!("{OVER_BOUND}: {what}"))
}

/// A label name or value (or a sample value string) of at most [`MAX_LABEL_BYTES`], refused
/// before it is copied out of the body.
struct Bounded(String);

impl<'de> Deserialize<'de> for Bounded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |v| Bounded(v.to_string()))
    }
}

/// A label value that is checked against [`MAX_LABEL_BYTES`] and dropped (no allocation).
struct BoundedIgnored;

impl<'de> Deserialize<'de> for BoundedIgnored {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |_| BoundedIgnored)
    }
}

/// Deserialises a string, refused over [`MAX_LABEL_BYTES`], into `keep(it)`.
fn checked_str<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    keep: fn(&str) -> T,
) -> Result<T, D::Error> {
    struct Visit<T>(fn(&str) -> T);
    impl<T> serde::de::Visitor<'_> for Visit<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            if v.len() > MAX_LABEL_BYTES {
                return Err(over_bound(format_args!(
                    "a string of {} bytes (at most {MAX_LABEL_BYTES})",
                    v.len()
                )));
            }
            Ok((self.0)(v))
        }
    }
    d.deserialize_str(Visit(keep))
}

/// The labels of a series, each name and value bounded, at most [`MAX_LABELS_PER_SERIES`].
fn bounded_labels<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Labels;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a label map")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
            let mut labels = Labels::new();
            let mut seen = 0_usize;
            while let Some(Bounded(name)) = map.next_key()? {
                seen = count_label(seen)?;
                let Bounded(value) = map.next_value()?;
                labels.insert(name, value);
            }
            Ok(labels)
        }
    }
    d.deserialize_map(Visit)
}

/// One more label on a series: refused past [`MAX_LABELS_PER_SERIES`].
fn count_label<E: serde::de::Error>(seen: usize) -> Result<usize, E> {
    if seen >= MAX_LABELS_PER_SERIES {
        return Err(over_bound(format_args!(
            "a series with more than {MAX_LABELS_PER_SERIES} labels"
        )));
    }
    Ok(seen + 1)
}

/// A sample `[time, "value"]`, the value string bounded.
fn bounded_point<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(f64, String), D::Error> {
    let (t, Bounded(v)) = Deserialize::deserialize(d)?;
    Ok((t, v))
}

/// The `result` list of an answer: at most `MAX` elements (series or vector samples), refused
/// at the first one over.
struct SeriesList<T, const MAX: usize = MAX_SERIES>(Vec<T>);

impl<'de, T: Deserialize<'de>, const MAX: usize> Deserialize<'de> for SeriesList<T, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T, const MAX: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const MAX: usize> serde::de::Visitor<'de> for Visit<T, MAX> {
            type Value = SeriesList<T, MAX>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of series")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SeriesList<T, MAX>, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element()? {
                    if out.len() >= MAX {
                        return Err(over_bound(format_args!("more than {MAX} series")));
                    }
                    out.push(x);
                }
                Ok(SeriesList(out))
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// `resultType` of an answer's `data`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ResultType {
    Vector,
    Scalar,
    String,
    Matrix,
}

/// A key of an answer's `data`.
#[derive(Deserialize)]
#[serde(field_identifier)]
enum DataKey {
    #[serde(rename = "resultType")]
    ResultType,
    #[serde(rename = "result")]
    Result,
    #[serde(other)]
    Other,
}

/// Decodes `result` once its `resultType` is known.
trait FromResult<'de>: Sized {
    /// `result` met before `resultType`, held as its raw text until the type is known: owned
    /// for the owned decoders, borrowed from the body for [`WindowAnswer`].
    type Early: Deserialize<'de>;
    fn result<D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error>;
    fn from_early(kind: ResultType, early: Self::Early) -> Result<Self, serde_json::Error>;
}

/// [`FromResult`] as a seed, for `MapAccess::next_value_seed`.
struct ResultSeed<T>(ResultType, std::marker::PhantomData<T>);

impl<'de, T: FromResult<'de>> serde::de::DeserializeSeed<'de> for ResultSeed<T> {
    type Value = T;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::result(self.0, d)
    }
}

/// Decodes the raw text of a `result` met before its `resultType`.
fn result_from_text<'a, T: FromResult<'a>>(
    kind: ResultType,
    text: &'a str,
) -> Result<T, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let out = T::result(kind, &mut de)?;
    de.end()?;
    Ok(out)
}

/// An answer's `data`, decoded by its `resultType` straight into the bounded decoders. Prometheus,
/// Thanos, Mimir and VictoriaMetrics write `resultType` first; a proxy that re-encodes with
/// sorted keys puts `result` first, and serde's derived adjacently tagged enum would then buffer
/// it into a generic tree many times the size of its text before any bound applies. Here it is
/// kept as its raw text instead (one copy, at most the body) and decoded once the type is known.
fn data_in_order<'de, D: serde::Deserializer<'de>, T: FromResult<'de>>(
    d: D,
) -> Result<T, D::Error> {
    struct Visit<T>(std::marker::PhantomData<T>);
    impl<'de, T: FromResult<'de>> serde::de::Visitor<'de> for Visit<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an answer's data: resultType and result")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            use serde::de::Error;
            let mut kind: Option<ResultType> = None;
            let mut out = None;
            let mut early: Option<T::Early> = None;
            while let Some(key) = map.next_key()? {
                match key {
                    DataKey::ResultType if kind.is_none() => kind = Some(map.next_value()?),
                    DataKey::Result if out.is_none() && early.is_none() => match kind {
                        Some(kind) => {
                            out = Some(
                                map.next_value_seed(ResultSeed(kind, std::marker::PhantomData))?,
                            );
                        }
                        None => early = Some(map.next_value()?),
                    },
                    DataKey::ResultType => return Err(A::Error::duplicate_field("resultType")),
                    DataKey::Result => return Err(A::Error::duplicate_field("result")),
                    DataKey::Other => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            if let Some(out) = out {
                return Ok(out);
            }
            let raw = early.ok_or_else(|| A::Error::missing_field("result"))?;
            let kind = kind.ok_or_else(|| A::Error::missing_field("resultType"))?;
            T::from_early(kind, raw).map_err(A::Error::custom)
        }
    }
    d.deserialize_map(Visit(std::marker::PhantomData))
}

/// `data` of a query answer, every label of a series kept. Values are strings (`"0.5"`, `"NaN"`,
/// `"+Inf"`); times float seconds.
#[derive(Debug, Clone)]
pub enum QueryData {
    Vector(Vec<RawVectorSample>),
    Scalar((f64, String)),
    String((f64, String)),
    Matrix(Vec<MatrixRow>),
}

impl<'de> FromResult<'de> for QueryData {
    type Early = Box<serde_json::value::RawValue>;
    fn from_early(kind: ResultType, raw: Self::Early) -> Result<Self, serde_json::Error> {
        result_from_text(kind, raw.get())
    }
    fn result<D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error> {
        let point = |(t, Bounded(v)): (f64, Bounded)| (t, v);
        Ok(match kind {
            ResultType::Vector => Self::Vector(SeriesList::<_>::deserialize(d)?.0),
            ResultType::Scalar => Self::Scalar(point(Deserialize::deserialize(d)?)),
            ResultType::String => Self::String(point(Deserialize::deserialize(d)?)),
            ResultType::Matrix => Self::Matrix(SeriesList::<_>::deserialize(d)?.0),
        })
    }
}

impl<'de> Deserialize<'de> for QueryData {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        data_in_order(d)
    }
}

/// One element of a vector answer.
#[derive(Debug, Clone, Deserialize)]
pub struct RawVectorSample {
    #[serde(default, deserialize_with = "bounded_labels")]
    pub metric: Labels,
    #[serde(deserialize_with = "bounded_point")]
    pub value: (f64, String),
}

/// One series of a matrix answer (a subquery's, or `capture`'s range-vector read): every label,
/// each sample's value parsed as it is read ([`parse_value`]; a bad one fails the answer).
#[derive(Debug, Clone, Deserialize)]
pub struct MatrixRow {
    #[serde(default, deserialize_with = "bounded_labels")]
    metric: Labels,
    values: Vec<(f64, PromValue)>,
}

/// A label name, resolved to its static spelling when the window keeps it (no allocation).
struct LabelName(Option<&'static str>);

impl<'de> Deserialize<'de> for LabelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = LabelName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LabelName, E> {
                if v.len() > MAX_LABEL_BYTES {
                    return Err(over_bound(format_args!(
                        "a label name of {} bytes (at most {MAX_LABEL_BYTES})",
                        v.len()
                    )));
                }
                Ok(LabelName(
                    std::iter::once(&NAME_LABEL)
                        .chain(READ_LABELS)
                        .find(|k| **k == v)
                        .copied(),
                ))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A sample value parsed straight from its string ([`parse_value`]); a bad one fails the answer.
#[derive(Debug, Clone, Copy)]
struct PromValue(f64);

impl<'de> Deserialize<'de> for PromValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = PromValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sample value string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PromValue, E> {
                if v.len() > MAX_LABEL_BYTES {
                    return Err(over_bound(format_args!(
                        "a sample value of {} bytes (at most {MAX_LABEL_BYTES})",
                        v.len()
                    )));
                }
                parse_value(v)
                    .map(PromValue)
                    .ok_or_else(|| E::custom(format!("bad sample value {v:?}")))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A label value (or name) of at most [`MAX_LABEL_BYTES`], borrowed from the body when its
/// JSON text has no escape (owned when serde must unescape it), refused before it is copied.
struct BoundedCow<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for BoundedCow<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = BoundedCow<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<BoundedCow<'de>, E> {
                check_label_len(v)?;
                Ok(BoundedCow(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<BoundedCow<'de>, E> {
                check_label_len(v)?;
                Ok(BoundedCow(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// Refuses a label value over [`MAX_LABEL_BYTES`] (measured decoded, as it would be held).
fn check_label_len<E: serde::de::Error>(v: &str) -> Result<(), E> {
    if v.len() > MAX_LABEL_BYTES {
        return Err(over_bound(format_args!(
            "a string of {} bytes (at most {MAX_LABEL_BYTES})",
            v.len()
        )));
    }
    Ok(())
}

/// Kept labels of one series before a spill to the heap: dcgm-exporter's read labels
/// (`UUID`, `Hostname`, `modelName`, `pod`, `namespace`, `container`, on MIG devices
/// `GPU_I_ID` and `GPU_I_PROFILE`) and `instance`, with one to spare (`cluster`).
const INLINE_LABELS: usize = 10;

/// The labels of a series that the window keeps, as decoded from the body: `__name__` and the
/// non-empty [`READ_LABELS`], values borrowed where the JSON text allows, in name order (the
/// order of a [`Labels`] map), for [`WindowAnswer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowLabels<'de> {
    name: Option<Cow<'de, str>>,
    kept: smallvec::SmallVec<[(&'static str, Cow<'de, str>); INLINE_LABELS]>,
}

impl WindowLabels<'_> {
    /// The kept labels (without `__name__`), in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.kept.iter().map(|(k, v)| (*k, v.as_ref()))
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// The kept labels (without `__name__`) as an owned map.
    pub fn to_labels(&self) -> Labels {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl<'de> Deserialize<'de> for WindowLabels<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = WindowLabels<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WindowLabels<'de>, A::Error> {
                let mut labels = WindowLabels::default();
                let mut seen = 0_usize;
                while let Some(LabelName(kept)) = map.next_key()? {
                    seen = count_label(seen)?;
                    match kept {
                        Some(NAME_LABEL) => {
                            let BoundedCow(value) = map.next_value()?;
                            labels.name = Some(value).filter(|v| !v.is_empty());
                        }
                        Some(name) => {
                            let BoundedCow(value) = map.next_value()?;
                            let at = labels.kept.iter().position(|(k, _)| *k >= name);
                            match at {
                                Some(i) if labels.kept[i].0 == name => {
                                    if value.is_empty() {
                                        labels.kept.remove(i);
                                    } else {
                                        labels.kept[i].1 = value;
                                    }
                                }
                                _ if value.is_empty() => {}
                                Some(i) => labels.kept.insert(i, (name, value)),
                                None => labels.kept.push((name, value)),
                            }
                        }
                        None => {
                            map.next_value::<BoundedIgnored>()?;
                        }
                    }
                }
                Ok(labels)
            }
        }
        d.deserialize_map(Visit)
    }
}

/// `data` of a range-vector answer as every window read decodes it (the refresh, the pre-stop
/// re-check, scheme detection): each series keeps only `__name__` and the labels the reduction
/// reads ([`READ_LABELS`]), their values borrowed from the body, and every sample goes into one
/// buffer, so decoding a series allocates nothing unless its labels are escaped or more than
/// [`INLINE_LABELS`]. The bounds and the accepted answers are [`QueryData`]'s: both refuse the
/// same answers. A profile at 4,000 GPUs put a quarter of the service's CPU in building owned
/// label maps for series the window already held (docs/benchmarks.md, "Performance round 3").
#[derive(Debug, Clone)]
pub struct WindowAnswer<'de> {
    /// `None` for an answer that is not a matrix (decoded and bounded, then refused by
    /// [`Self::into_matrix`]).
    matrix: Option<WindowSeries<'de>>,
}

/// The series of a matrix answer ([`WindowAnswer::into_matrix`]).
#[derive(Debug, Clone, Default)]
pub struct WindowSeries<'de> {
    rows: Vec<WindowRow<'de>>,
    /// The samples of every series, row after row: (Unix milliseconds, value).
    samples: Vec<(i64, f64)>,
}

/// One series of a [`WindowSeries`].
#[derive(Debug, Clone)]
struct WindowRow<'de> {
    labels: WindowLabels<'de>,
    samples: Range<usize>,
}

/// One series of a window answer, as read: the metric name, the kept labels and the samples.
#[derive(Debug, Clone, Copy)]
pub struct WindowRowRef<'a, 'de> {
    pub name: &'a str,
    pub labels: &'a WindowLabels<'de>,
    pub samples: &'a [(i64, f64)],
}

impl<'de> WindowAnswer<'de> {
    /// The series of a matrix answer; another answer type, or a series without `__name__`, is
    /// an error (as [`QueryData::into_series`]).
    pub fn into_matrix(self) -> Result<WindowSeries<'de>, PromError> {
        let Some(series) = self.matrix else {
            return Err(PromError::Unexpected(
                "expected a matrix answer to a range-vector selector".into(),
            ));
        };
        if series.rows.iter().any(|r| r.labels.name.is_none()) {
            return Err(PromError::Unexpected(
                "matrix series without __name__".into(),
            ));
        }
        let mut series = series;
        series.rename_to_internal_fields();
        Ok(series)
    }
}

impl<'de> WindowSeries<'de> {
    /// Each series: name, kept labels, samples in the answer's order.
    pub fn iter(&self) -> impl Iterator<Item = WindowRowRef<'_, 'de>> {
        self.rows.iter().map(|r| WindowRowRef {
            name: r.labels.name.as_deref().unwrap_or_default(),
            labels: &r.labels,
            samples: self.samples.get(r.samples.clone()).unwrap_or_default(),
        })
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Keeps the samples whose time `keep` accepts (series left empty stay, as in [`Series`]).
    pub fn retain_samples(&mut self, mut keep: impl FnMut(i64) -> bool) {
        let mut kept = 0;
        for row in &mut self.rows {
            let start = kept;
            for i in row.samples.clone() {
                let sample = self.samples[i];
                if keep(sample.0) {
                    self.samples[kept] = sample;
                    kept += 1;
                }
            }
            row.samples = start..kept;
        }
        self.samples.truncate(kept);
    }

    /// Renames each series to its field's internal name and converts its samples to the field's
    /// internal unit ([`fields::convert_samples`]): the window then holds one device's samples
    /// under one name whether its exporter spells the field the legacy way or DCGM 4.7's.
    fn rename_to_internal_fields(&mut self) {
        for row in &mut self.rows {
            let Some(name) = row.labels.name.as_deref() else {
                continue;
            };
            let Some(samples) = self.samples.get_mut(row.samples.clone()) else {
                continue;
            };
            if let Some(field) = fields::convert_samples(name, samples) {
                row.labels.name = Some(Cow::Borrowed(field));
            }
        }
    }

    /// The series as owned [`Series`]: [`QueryData::into_series`] with only the read labels kept
    /// and the fields renamed.
    pub fn into_series(self) -> Vec<Series> {
        self.iter()
            .map(|r| Series {
                name: r.name.to_string(),
                labels: Arc::new(r.labels.to_labels()),
                samples: r.samples.to_vec(),
            })
            .collect()
    }
}

impl<'de> FromResult<'de> for WindowAnswer<'de> {
    type Early = &'de serde_json::value::RawValue;
    fn from_early(kind: ResultType, raw: Self::Early) -> Result<Self, serde_json::Error> {
        result_from_text(kind, raw.get())
    }
    fn result<D: serde::Deserializer<'de>>(kind: ResultType, d: D) -> Result<Self, D::Error> {
        if let ResultType::Matrix = kind {
            return d
                .deserialize_seq(WindowSeriesVisit)
                .map(|s| WindowAnswer { matrix: Some(s) });
        }
        // Decoded (and bounded) as the owned decoder does, to refuse the same answers.
        <QueryData as FromResult<'de>>::result(kind, d)?;
        Ok(WindowAnswer { matrix: None })
    }
}

impl<'de> Deserialize<'de> for WindowAnswer<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        data_in_order(d)
    }
}

/// The `result` list of a matrix answer, at most [`MAX_SERIES`] series (as [`SeriesList`]).
struct WindowSeriesVisit;

impl<'de> serde::de::Visitor<'de> for WindowSeriesVisit {
    type Value = WindowSeries<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of series")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<WindowSeries<'de>, A::Error> {
        let mut out = WindowSeries::default();
        while let Some(row) = seq.next_element_seed(RowSeed(&mut out.samples))? {
            if out.rows.len() >= MAX_SERIES {
                return Err(over_bound(format_args!("more than {MAX_SERIES} series")));
            }
            out.rows.push(row);
        }
        Ok(out)
    }
}

/// A key of a matrix series.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum RowKey {
    Metric,
    Values,
    #[serde(other)]
    Other,
}

/// One matrix series, its samples appended to the answer's buffer. Accepts what the derived
/// decoder of [`MatrixRow`] accepts: a map (`metric` optional, `values` required, other keys
/// ignored, none twice) or a `[metric, values]` list.
struct RowSeed<'a>(&'a mut Vec<(i64, f64)>);

impl<'de> serde::de::DeserializeSeed<'de> for RowSeed<'_> {
    type Value = WindowRow<'de>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<WindowRow<'de>, D::Error> {
        d.deserialize_struct("MatrixRow", &["metric", "values"], self)
    }
}

impl<'de> serde::de::Visitor<'de> for RowSeed<'_> {
    type Value = WindowRow<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct MatrixRow")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<WindowRow<'de>, A::Error> {
        use serde::de::Error;
        let start = self.0.len();
        let mut labels = None;
        let mut values = false;
        while let Some(key) = map.next_key()? {
            match key {
                RowKey::Metric if labels.is_some() => {
                    return Err(A::Error::duplicate_field("metric"));
                }
                RowKey::Metric => labels = Some(map.next_value()?),
                RowKey::Values if values => return Err(A::Error::duplicate_field("values")),
                RowKey::Values => {
                    map.next_value_seed(ValuesSeed(self.0))?;
                    values = true;
                }
                RowKey::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        if !values {
            return Err(A::Error::missing_field("values"));
        }
        Ok(WindowRow {
            labels: labels.unwrap_or_default(),
            samples: start..self.0.len(),
        })
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<WindowRow<'de>, A::Error> {
        use serde::de::Error;
        let start = self.0.len();
        let labels = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &"struct MatrixRow with 2 elements"))?;
        seq.next_element_seed(ValuesSeed(self.0))?
            .ok_or_else(|| A::Error::invalid_length(1, &"struct MatrixRow with 2 elements"))?;
        Ok(WindowRow {
            labels,
            samples: start..self.0.len(),
        })
    }
}

/// The `values` of a matrix series, each `[time, "value"]` parsed as it is read ([`PromValue`])
/// and appended to the answer's buffer in milliseconds.
struct ValuesSeed<'a>(&'a mut Vec<(i64, f64)>);

impl<'de> serde::de::DeserializeSeed<'de> for ValuesSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ValuesSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of samples")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some((t, PromValue(v))) = seq.next_element::<(f64, PromValue)>()? {
            self.0.push((secs_to_ms(t), v));
        }
        Ok(())
    }
}

const NAME_LABEL: &str = "__name__";

/// A decoded instant-query sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    /// Evaluation (or sample) time in Unix seconds.
    pub time: f64,
    pub value: f64,
}

/// Parses a Prometheus sample value string (`"0.5"`, `"NaN"`, `"+Inf"`, `"-Inf"`, `"-0"`).
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

fn bad_value(v: &str) -> PromError {
    PromError::Unexpected(format!("bad sample value {v:?}"))
}

impl MatrixRow {
    /// The series' labels, every one as answered (held once for all its points).
    pub fn labels(&self) -> &Labels {
        &self.metric
    }

    /// The series' points: (Unix seconds, value).
    pub fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.values.iter().map(|(t, v)| (*t, v.0))
    }

    /// Every point as a [`Sample`] (Unix seconds), every label kept as answered: a subquery's
    /// series need no metric name.
    pub fn into_samples(self) -> impl Iterator<Item = Sample> {
        let labels = self.metric;
        self.values.into_iter().map(move |(time, v)| Sample {
            labels: labels.clone(),
            time,
            value: v.0,
        })
    }
}

impl QueryData {
    /// The series of a matrix answer; any other answer type is an error.
    pub fn into_rows(self) -> Result<Vec<MatrixRow>, PromError> {
        let Self::Matrix(rows) = self else {
            return Err(PromError::Unexpected(
                "expected a matrix answer to a range-vector selector".into(),
            ));
        };
        Ok(rows)
    }

    /// A matrix answer as [`Series`]: named by `__name__` (taken out of the labels) as answered,
    /// every label without empty values (Prometheus treats an empty label as absent), times in
    /// milliseconds.
    pub fn into_series(self) -> Result<Vec<Series>, PromError> {
        self.into_rows()?
            .into_iter()
            .map(|row| {
                let mut labels = row.metric;
                labels.retain(|_, v| !v.is_empty());
                let name = labels.remove(NAME_LABEL).ok_or_else(|| {
                    PromError::Unexpected("matrix series without __name__".into())
                })?;
                Ok(Series {
                    name,
                    labels: Arc::new(labels),
                    samples: row
                        .values
                        .into_iter()
                        .map(|(t, v)| (secs_to_ms(t), v.0))
                        .collect(),
                })
            })
            .collect()
    }

    /// Vector and scalar answers as samples (a scalar becomes one label-less sample).
    pub fn into_samples(self) -> Result<Vec<Sample>, PromError> {
        let point = |labels: Labels, (t, v): (f64, String)| {
            let value = parse_value(&v).ok_or_else(|| bad_value(&v))?;
            Ok(Sample {
                labels,
                time: t,
                value,
            })
        };
        match self {
            Self::Vector(v) => v.into_iter().map(|s| point(s.metric, s.value)).collect(),
            Self::Scalar(p) => Ok(vec![point(Labels::new(), p)?]),
            Self::String(_) => Err(PromError::Unexpected(
                "string result where a vector was expected".into(),
            )),
            Self::Matrix(_) => Err(PromError::Unexpected(
                "matrix result where a vector was expected".into(),
            )),
        }
    }
}

/// The `data` of an answer's body decoded as `D` (which may borrow from the body), the rest of
/// the body skipped: the client has read the envelope already (`PromClient`: status, warnings,
/// `data` present), so this is a second scan of the body; refuses an answer over a bound before
/// copying the offending part out of the body.
fn data_of<'de, D: Deserialize<'de>>(body: &'de [u8]) -> Result<D, PromError> {
    #[derive(Deserialize)]
    struct Data<D> {
        data: Option<D>,
    }
    serde_json::from_slice::<Data<D>>(body)
        .map_err(|e| PromError::decoding(&e))?
        .data
        .ok_or_else(|| PromError::Unexpected("success without data".into()))
}

/// An answer's `data`, every label kept: vector and scalar answers, subqueries, `capture`'s
/// range-vector read.
pub fn query_data(body: &[u8]) -> Result<QueryData, PromError> {
    data_of(body)
}

/// A whole answer to the window's range-vector selector in one scan of `body`: the envelope
/// ([`ApiResponse`]: status, error, warnings, each cut to its bound) and `data` decoded by the
/// window decoder ([`WindowAnswer`], borrowing from `body`). The envelope is decoded, not judged:
/// [`super::PromClient::window_series`] does that. Since issue 38 the envelope and `data` were
/// two scans of the body, the second about a tenth of the decode (docs/benchmarks.md). The error
/// is serde's, for the caller to classify ([`PromError::decoding`]) once it knows whether the
/// envelope alone reads.
pub fn window_answer(body: &[u8]) -> Result<ApiResponse<WindowAnswer<'_>>, serde_json::Error> {
    serde_json::from_slice(body)
}

/// The series of an answer to the window's range-vector selector, as every window read decodes
/// it ([`window_answer`], one scan: read labels only, borrowed from `body`; fields renamed to
/// their internal names), its envelope decoded but not judged (status and warnings are the
/// client's: [`super::PromClient::window_series`]); an answer without `data`, of another type,
/// or with a series without `__name__` is an error.
pub fn window(body: &[u8]) -> Result<WindowSeries<'_>, PromError> {
    window_answer(body)
        .map_err(|e| PromError::decoding(&e))?
        .data
        .ok_or_else(|| PromError::Unexpected("success without data".into()))?
        .into_matrix()
}

/// The window's `data` alone, the envelope skipped: the second scan of the read before issue
/// 41, kept as the reference the one-scan read must equal (`client`'s tests).
#[cfg(test)]
pub(super) fn window_data(body: &[u8]) -> Result<WindowSeries<'_>, PromError> {
    data_of::<WindowAnswer<'_>>(body)?.into_matrix()
}

fn secs_to_ms(s: f64) -> i64 {
    (s * 1000.0).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_answers() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"UUID":"GPU-a","stat":"last"},"value":[1700000000.123,"NaN"]},
            {"metric":{},"value":[1700000000,"+Inf"]},
            {"metric":{"a":"b"},"value":[1700000000,"-0"]}]}}"#;
        let r: ApiResponse<QueryData> = serde_json::from_str(body).expect("decodes");
        let s = r.data.expect("data").into_samples().expect("samples");
        assert!(s[0].value.is_nan());
        assert!((s[0].time - 1_700_000_000.123).abs() < 1e-6);
        assert!(s[1].value.is_infinite() && s[1].value > 0.0);
        assert!(s[2].value.abs() < f64::EPSILON);
        let r: ApiResponse<QueryData> = serde_json::from_str(
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#,
        )
        .expect("scalar");
        let v = r.data.expect("data").into_samples().expect("samples")[0].value;
        assert!((v - 2.0).abs() < f64::EPSILON);
        let r: ApiResponse<QueryData> = serde_json::from_str(
            r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        )
        .expect("error");
        assert_eq!(r.error_type.as_deref(), Some("bad_data"));
    }

    /// A dcgm-exporter series as Prometheus answers a range-vector selector (labels as in
    /// dcgm-exporter's README sample, plus the scrape's `instance`/`job`).
    const WINDOW_ANSWER: &str = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0","UUID":"GPU-604ac76c",
          "pci_bus_id":"00000000:00:1E.0","device":"nvidia0","modelName":"Tesla T4",
          "Hostname":"ip-10-0-1-2","DCGM_FI_DRIVER_VERSION":"535.104.05","container":"",
          "instance":"10.0.1.7:9400","job":"dcgm-exporter","pod":"train-0","namespace":"ml"},
         "values":[[1700000000,"42"],[1700000015.5,"NaN"]]}]}}"#;

    #[test]
    fn the_window_decoder_keeps_only_read_labels_and_agrees_with_the_full_one() {
        let window = window(WINDOW_ANSWER.as_bytes())
            .expect("decodes")
            .into_series();
        let r: ApiResponse<QueryData> = serde_json::from_str(WINDOW_ANSWER).expect("decodes");
        let mut full = r.data.expect("data").into_series().expect("series");
        assert!(
            full[0].labels.contains_key("pci_bus_id"),
            "the full decoder keeps all"
        );
        Arc::make_mut(&mut full[0].labels).retain(|k, _| READ_LABELS.contains(&k.as_str()));
        assert_eq!(window[0].name, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(window[0].labels, full[0].labels);
        let kept: Vec<&str> = window[0].labels.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "Hostname",
                "UUID",
                "instance",
                "modelName",
                "namespace",
                "pod"
            ],
            "empty `container` dropped, device/gpu/pci_bus_id/job/driver not held"
        );
        assert_eq!(window[0].samples[0], (1_700_000_000_000, 42.0));
        assert_eq!(window[0].samples[1].0, 1_700_000_015_500);
        assert!(window[0].samples[1].1.is_nan());
    }

    #[test]
    fn the_window_decoder_rejects_what_the_full_one_rejects() {
        let bad_value = WINDOW_ANSWER.replace(r#""42""#, r#""4x2""#);
        let err = window(bad_value.as_bytes()).expect_err("bad value");
        let err = crate::telemetry::error_chain(&err);
        assert!(err.contains(r#"bad sample value "4x2""#), "{err}");
        let nameless = WINDOW_ANSWER.replace(r#""__name__":"DCGM_FI_DEV_GPU_UTIL","#, "");
        let err = window(nameless.as_bytes()).expect_err("no name");
        assert!(err.to_string().contains("without __name__"), "{err}");
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let err = window(vector.as_bytes()).expect_err("not a matrix");
        assert!(err.to_string().contains("expected a matrix"), "{err}");
    }

    /// Decodes `body` with every label kept ([`query_data`], as `capture` reads it) and as every
    /// window read does ([`window`]: read labels only, borrowed from the body).
    fn both(
        body: &str,
    ) -> (
        Result<Vec<Series>, PromError>,
        Result<Vec<Series>, PromError>,
    ) {
        let full = query_data(body.as_bytes()).and_then(QueryData::into_series);
        let window = window(body.as_bytes()).map(WindowSeries::into_series);
        (full, window)
    }

    /// The kept label values of the (first) series of `body`, as the live refresh decodes them,
    /// and whether each is borrowed from the body.
    fn borrowed_values(body: &str) -> Vec<(String, bool)> {
        let m = window(body.as_bytes()).expect("matrix");
        m.rows[0]
            .labels
            .kept
            .iter()
            .map(|(_, v)| (v.to_string(), matches!(v, Cow::Borrowed(_))))
            .collect()
    }

    #[test]
    fn the_live_decoder_borrows_label_values_from_the_body() {
        let values = borrowed_values(WINDOW_ANSWER);
        assert_eq!(values.len(), 6, "{values:?}");
        assert!(values.iter().all(|(_, b)| *b), "none copied: {values:?}");
        // A proxy's sorted keys (`result` held as raw text until its type is known) too.
        let sorted = serde_json::from_str::<serde_json::Value>(WINDOW_ANSWER)
            .expect("json")
            .to_string();
        assert_eq!(borrowed_values(&sorted), values);
        let (full, _) = both(WINDOW_ANSWER);
        let mut full = full.expect("series");
        Arc::make_mut(&mut full[0].labels).retain(|k, _| READ_LABELS.contains(&k.as_str()));
        let m = window(WINDOW_ANSWER.as_bytes()).expect("matrix");
        let row = m.iter().next().expect("one series");
        assert_eq!(row.name, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(row.labels.to_labels(), *full[0].labels);
        assert_eq!(row.samples[0], (1_700_000_000_000, 42.0));
    }

    #[test]
    fn an_escaped_label_value_decodes_as_the_owned_decoders_do() {
        let body = WINDOW_ANSWER
            .replace(r#""train-0""#, r#""caf\u00e9 \"0\"""#)
            .replace(r#""Tesla T4""#, r#""Tesla\u0020T4\\x""#)
            .replace(r#""job":"#, r#""j\u006fb":"#);
        let values = borrowed_values(&body);
        assert!(
            values.contains(&(r#"café "0""#.to_string(), false)),
            "unescaped into an owned value: {values:?}"
        );
        assert!(
            values.contains(&(r"Tesla T4\x".to_string(), false)),
            "{values:?}"
        );
        assert!(
            values.contains(&("ip-10-0-1-2".to_string(), true)),
            "{values:?}"
        );
        let (full, window) = both(&body);
        let (full, window) = (full.expect("full"), window.expect("window"));
        assert_eq!(full[0].labels["pod"], r#"café "0""#);
        assert_eq!(full[0].labels["job"], "dcgm-exporter", "an escaped name");
        assert_eq!(window[0].labels["pod"], r#"café "0""#);
        assert_eq!(window[0].labels["modelName"], r"Tesla T4\x");
    }

    #[test]
    fn repeated_and_empty_labels_decode_as_the_full_decoder_reads_them() {
        // A map insert keeps the last of a repeated name, and an empty value is no label.
        for (extra, pod) in [
            (r#","pod":"train-1""#, Some("train-1")),
            (r#","pod":"""#, None),
            (r#","pod":"","pod":"train-2""#, Some("train-2")),
        ] {
            let body = WINDOW_ANSWER.replace(
                r#""namespace":"ml""#,
                &format!(r#""namespace":"ml"{extra}"#),
            );
            let (full, window) = both(&body);
            let (full, window) = (full.expect("full"), window.expect("window"));
            assert_eq!(
                full[0].labels.get("pod").map(String::as_str),
                pod,
                "{extra}"
            );
            assert_eq!(
                window[0].labels.get("pod").map(String::as_str),
                pod,
                "{extra}"
            );
        }
        let body = WINDOW_ANSWER.replace(r#""gpu":"0","#, r#""__name__":"","#);
        let (full, window) = both(&body);
        assert!(full.is_err() && window.is_err(), "an empty name is no name");
    }

    #[test]
    fn a_series_written_as_a_list_decodes_alike() {
        // serde's derived decoder of MatrixRow takes `[metric, values]` as well.
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            [{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-a"},[[1700000000,"1"]]],
            {"values":[[1700000000,"2"]],"metric":{"__name__":"DCGM_FI_DEV_FB_USED","UUID":"GPU-a"},"x":1}]}}"#;
        let (full, window) = both(body);
        assert_eq!(full.expect("full").len(), 2);
        assert_eq!(window.expect("window").len(), 2);
        for bad in [
            r#"[{"__name__":"DCGM_FI_DEV_GPU_UTIL"}]"#,
            r#"{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL"}}"#,
            r#"{"metric":{},"values":[],"values":[]}"#,
            r#"{"metric":{},"metric":{},"values":[]}"#,
        ] {
            let body = format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{bad}]}}}}"#
            );
            let (full, window) = both(&body);
            assert!(full.is_err() && window.is_err(), "{bad}");
        }
    }

    fn assert_too_large(body: &str, what: &str) {
        let (full, window) = both(body);
        for (decoder, r) in [("full", full), ("window", window)] {
            match r {
                Err(e @ PromError::TooLarge(_)) => {
                    assert_eq!(e.kind(), "too_large");
                    let text = crate::telemetry::error_chain(&e);
                    assert!(text.contains(what), "{decoder}: {text}");
                    assert!(
                        text.len() < 1000,
                        "{decoder}: the error does not echo the input"
                    );
                }
                other => panic!("{decoder}: expected too_large ({what}), got {other:?}"),
            }
        }
    }

    #[test]
    fn label_values_names_and_sample_strings_are_bounded() {
        let at_bound = "v".repeat(MAX_LABEL_BYTES);
        let over = "v".repeat(MAX_LABEL_BYTES + 1);
        // A read label (`pod`), an ignored one (`pci_bus_id`): the bound is on every label.
        for label in ["pod", "pci_bus_id"] {
            let ok = WINDOW_ANSWER.replace(r#""train-0""#, &format!("{at_bound:?}"));
            let ok = ok.replace(r#""00000000:00:1E.0""#, &format!("{at_bound:?}"));
            let (full, window) = both(&ok);
            assert!(
                full.is_ok() && window.is_ok(),
                "{MAX_LABEL_BYTES} bytes pass"
            );
            let bad = if label == "pod" {
                WINDOW_ANSWER.replace(r#""train-0""#, &format!("{over:?}"))
            } else {
                WINDOW_ANSWER.replace(r#""00000000:00:1E.0""#, &format!("{over:?}"))
            };
            assert_too_large(&bad, &format!("a string of {} bytes", MAX_LABEL_BYTES + 1));
        }
        // Escaped text is measured decoded, as held.
        let escaped = WINDOW_ANSWER.replace(
            r#""train-0""#,
            &format!("\"{}\"", "\\u0041".repeat(MAX_LABEL_BYTES + 1)),
        );
        assert_too_large(&escaped, "bytes (at most 4096)");
        let long_name = WINDOW_ANSWER.replace(r#""job":"#, &format!("{over:?}:"));
        assert_too_large(&long_name, "bytes (at most 4096)");
        let long_value = WINDOW_ANSWER.replace(
            r#""42""#,
            &format!("\"{}\"", "4".repeat(MAX_LABEL_BYTES + 1)),
        );
        assert_too_large(&long_value, "bytes (at most 4096)");
    }

    #[test]
    fn labels_per_series_are_bounded() {
        let labels = |n: usize| {
            (0..n)
                .map(|i| format!(r#""l{i}":"x""#))
                .collect::<Vec<_>>()
                .join(",")
        };
        let answer = |n: usize| {
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL",{}}},"values":[[1,"1"]]}}]}}}}"#,
                labels(n)
            )
        };
        let (full, window) = both(&answer(MAX_LABELS_PER_SERIES - 1));
        assert!(
            full.is_ok() && window.is_ok(),
            "__name__ plus 255 labels pass"
        );
        assert_too_large(&answer(MAX_LABELS_PER_SERIES), "more than 256 labels");
    }

    #[test]
    fn series_per_answer_are_bounded() {
        let list = |n: usize| format!("[{}]", vec!["1"; n].join(","));
        let three = serde_json::from_str::<SeriesList<u8, 3>>(&list(3)).expect("3 of 3");
        assert_eq!(three.0.len(), 3);
        let err = serde_json::from_str::<SeriesList<u8, 3>>(&list(4))
            .err()
            .expect("4 of 3 refused");
        assert!(err.to_string().contains("more than 3 series"), "{err}");
        assert!(err.to_string().contains(OVER_BOUND), "{err}");
        assert_eq!(MAX_SERIES, 1_000_000);
    }

    #[test]
    fn result_before_result_type_decodes_alike_and_is_bounded() {
        // serde_json::Value re-encodes with sorted keys: `result` before `resultType`.
        let sorted = serde_json::from_str::<serde_json::Value>(WINDOW_ANSWER)
            .expect("json")
            .to_string();
        assert!(sorted.contains(r#""data":{"result":"#), "{sorted}");
        let (full, window) = both(&sorted);
        let (full_in_order, window_in_order) = both(WINDOW_ANSWER);
        assert_eq!(format!("{full:?}"), format!("{full_in_order:?}"));
        assert_eq!(format!("{window:?}"), format!("{window_in_order:?}"));
        let r: ApiResponse<QueryData> = serde_json::from_str(
            r#"{"status":"success","data":{"result":[1,"2"],"resultType":"scalar"}}"#,
        )
        .expect("scalar");
        assert_eq!(
            r.data.expect("data").into_samples().expect("samples").len(),
            1
        );
        let huge = WINDOW_ANSWER.replace(
            r#""train-0""#,
            &format!("{:?}", "v".repeat(MAX_LABEL_BYTES + 1)),
        );
        let huge = serde_json::from_str::<serde_json::Value>(&huge)
            .expect("json")
            .to_string();
        assert_too_large(&huge, "bytes (at most 4096)");
        let extra =
            r#"{"status":"success","data":{"resultType":"matrix","stats":{"x":[1]},"result":[]}}"#;
        let (full, window) = both(extra);
        assert!(full.expect("unknown keys ignored").is_empty());
        assert!(window.expect("unknown keys ignored").is_empty());
        for bad in [
            r#"{"status":"success","data":{"resultType":"matrix"}}"#,
            r#"{"status":"success","data":{"result":[]}}"#,
            r#"{"status":"success","data":{"resultType":"matrix","result":[],"result":[]}}"#,
        ] {
            let (full, window) = both(bad);
            assert!(full.is_err() && window.is_err(), "{bad}");
        }
    }
}
