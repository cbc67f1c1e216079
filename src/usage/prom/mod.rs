//! Live Prometheus: the HTTP client ([`client`]: requests, the answer's envelope and its
//! warnings), the bounded decoding of an answer's `data` ([`decode`]: one window decoder for every
//! read of the sample window, one decoder keeping every label for the rest), the `PromQL` it sends
//! ([`queries`]: selectors, the window's range-vector selector, the start-up history), the
//! bounds ([`bounds`]), the envelope ([`envelope`]) and the error ([`error`]). This file only
//! declares and re-exports for callers outside `prom`.
//!
//! A refresh asks one question whatever the number of pods or devices: the raw samples of the
//! DCGM fields gpu-ledger reads since the previous refresh ([`PromClient::window`], a
//! range-vector selector: Prometheus only reads chunks, it evaluates nothing per step). The
//! pre-stop re-check and scheme detection ask the same question and read it the same way
//! ([`PromClient::window_series`]: the envelope and [`decode::window_answer`]'s `data` in one
//! scan of the body). The samples are reduced by the same `usage::series::reduce` as an
//! offline dump, so live and offline conclusions cannot differ. The one-off start-up history query
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
pub use client::{AnswerBody, Answered, Header, PromClient, PromConfig, QueryStats};
pub use decode::{QueryData, Sample, parse_value};
pub use envelope::{ApiResponse, Warnings};
pub use error::PromError;
pub use queries::{
    CLUSTER_LABELS, FIELD_LABEL, MatchOp, Matcher, STAT_LABEL, Selector, clusters_of,
};
