//! Live Prometheus: the HTTP client ([`client`]), the bounded decoding of its answers
//! ([`decode`]: one matrix decoder for every range-vector and subquery answer) and the `PromQL`
//! it sends ([`queries`]: selectors, the window's range-vector selector, the start-up history).
//!
//! A refresh asks one question whatever the number of pods or devices: the raw samples of the
//! DCGM fields gpu-ledger reads since the previous refresh ([`PromClient::window_series`], a
//! range-vector selector: Prometheus only reads chunks, it evaluates nothing per step). The
//! samples are reduced by the same [`super::series::reduce`] as an offline dump, so live and
//! offline conclusions cannot differ. The one-off start-up history query
//! ([`queries::bootstrap_query`]) is the only aggregating query.
//!
//! Answers are untrusted: their size is bounded ([`MAX_ANSWER_BYTES`]), and so is what decoding
//! may build from them (label names and values [`MAX_LABEL_BYTES`], labels per series
//! [`MAX_LABELS_PER_SERIES`], series per answer [`MAX_SERIES`]), checked before anything is
//! copied out of the body: an answer over a bound is refused whole ([`PromError::TooLarge`]).
//! Values are parsed strictly, and an unexpected answer type is an error, never an empty result.
//! `warnings` (a partial answer: Thanos or Mimir missed a store) are counted, logged
//! (truncated) and reported ([`Answered`]); a partial answer never proves a device idle.

pub mod bounds;
pub mod client;
pub mod decode;
pub mod envelope;
pub mod error;
pub mod queries;

pub use bounds::{MAX_ANSWER_BYTES, MAX_LABEL_BYTES, MAX_LABELS_PER_SERIES, MAX_SERIES};
pub use client::{Answered, Header, PromClient, PromConfig, QueryStats};
pub use decode::{QueryData, Sample, WindowData, parse_value};
pub use envelope::{ApiResponse, Warnings};
pub use error::PromError;
pub use queries::{
    CLUSTER_LABELS, FIELD_LABEL, MatchOp, Matcher, STAT_LABEL, Selector, clusters_of,
};
