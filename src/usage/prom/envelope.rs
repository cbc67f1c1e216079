//! The envelope of every `/api/v1/query` answer: its `status`, error and `warnings`, each string
//! cut to a bounded length before it is copied (a hostile endpoint's megabyte warning costs
//! [`MAX_MESSAGE_BYTES`]).

use serde::Deserialize;

/// Warnings kept per answer for the log (all are counted), and the bytes kept of each one and
/// of an error message.
const KEPT_WARNINGS: usize = 4;
const MAX_MESSAGE_BYTES: usize = 512;

/// `/api/v1/query` envelope; `data` decodes as `D`.
/// Strings of the envelope (`status`, `errorType`, `error`, each warning) are cut to
/// [`MAX_MESSAGE_BYTES`].
#[derive(Debug, Clone, Deserialize)]
pub struct ApiResponse<D> {
    #[serde(deserialize_with = "truncated")]
    pub status: String,
    #[serde(default = "none")]
    pub data: Option<D>,
    #[serde(default, rename = "errorType", deserialize_with = "truncated_opt")]
    pub error_type: Option<String>,
    #[serde(default, deserialize_with = "truncated_opt")]
    pub error: Option<String>,
    #[serde(default)]
    pub warnings: Warnings,
}

fn none<D>() -> Option<D> {
    None
}

/// The `warnings` of an answer: how many, and the first few, truncated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Warnings {
    pub count: usize,
    /// At most [`KEPT_WARNINGS`], each at most [`MAX_MESSAGE_BYTES`].
    pub kept: Vec<String>,
}

impl Warnings {
    /// The first warning (truncated), or "" when there is none.
    pub fn first(&self) -> &str {
        self.kept.first().map_or("", String::as_str)
    }
}

impl<'de> Deserialize<'de> for Warnings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Warnings;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of warning strings")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Warnings, E> {
                Ok(Warnings::default())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Warnings, A::Error> {
                let mut w = Warnings::default();
                while let Some(Truncated(text)) = seq.next_element()? {
                    w.count = w.count.saturating_add(1);
                    if w.kept.len() < KEPT_WARNINGS {
                        w.kept.push(text);
                    }
                }
                Ok(w)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// A string cut to [`MAX_MESSAGE_BYTES`] (at a character boundary) before it is copied.
struct Truncated(String);

impl<'de> Deserialize<'de> for Truncated {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Truncated;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Truncated, E> {
                Ok(Truncated(truncate(v, MAX_MESSAGE_BYTES).to_string()))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(super) fn truncated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Truncated::deserialize(d).map(|t| t.0)
}

pub(super) fn truncated_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    Option::<Truncated>::deserialize(d).map(|t| t.map(|t| t.0))
}

#[cfg(test)]
mod tests {
    use serde::de::IgnoredAny;

    use super::*;

    #[test]
    fn warnings_are_counted_kept_and_truncated() {
        let long = "w".repeat(10_000);
        let warnings: Vec<String> = (0..10).map(|i| format!("{i}: {long}")).collect();
        let body = format!(
            r#"{{"status":"success","warnings":{},"data":{{"resultType":"vector","result":[]}}}}"#,
            serde_json::to_string(&warnings).expect("json")
        );
        let r: ApiResponse<IgnoredAny> = serde_json::from_str(&body).expect("decodes");
        assert_eq!(r.warnings.count, 10);
        assert_eq!(r.warnings.kept.len(), KEPT_WARNINGS);
        assert!(r.warnings.kept.iter().all(|w| w.len() == MAX_MESSAGE_BYTES));
        assert!(r.warnings.first().starts_with("0: www"));
        // Absent, null or empty: complete.
        for w in ["", r#""warnings":null,"#, r#""warnings":[],"#] {
            let body = format!(
                r#"{{"status":"success",{w}"data":{{"resultType":"vector","result":[]}}}}"#
            );
            let r: ApiResponse<IgnoredAny> = serde_json::from_str(&body).expect("decodes");
            assert_eq!(r.warnings.count, 0, "{body}");
        }
        // A multi-byte character is never cut in half; error texts are cut the same way.
        assert_eq!(truncate("aé", 2), "a");
        let body = format!(
            r#"{{"status":"error","errorType":"bad_data","error":"{}"}}"#,
            "é".repeat(1000)
        );
        let r: ApiResponse<IgnoredAny> = serde_json::from_str(&body).expect("decodes");
        assert_eq!(r.error.expect("error").len(), MAX_MESSAGE_BYTES);
    }
}
