//! Why `capture` failed: apart from `capture.rs` so that `AppError` can wrap it without the two
//! files naming each other.

use std::path::PathBuf;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Utc};

use crate::usage::prom::PromError;

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("capture: listing the cluster")]
    List(#[source] crate::claims::list::ListError),
    #[error("capture: listing the cluster took longer than {0:?}")]
    ListTimeout(StdDuration),
    #[error("capture: DCGM history from prometheus ({from} to {to})")]
    Prometheus {
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        #[source]
        source: PromError,
    },
    #[error("capture: writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
