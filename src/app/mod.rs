//! The runtime edges, one file per mode: `serve` (sources → ledger hub → sinks, each on its own
//! task; the hub loop in `hub`, the task supervisor in `tasks`), `report` (one ledger from a live
//! cluster or from dump files, `offline`), `capture` (the live inputs written as the files
//! `offline` reads), `showback`. What the modes share has its own file: `error` (`AppError`),
//! `clients` (Kubernetes and Prometheus clients from the flags), `settings` (usage and culling
//! settings from the flags), `run` (a parsed command run to completion on the runtime, so the
//! binary crate compiles no async code). This file only declares and re-exports, so no child
//! names its parent. Everything here is I/O and wiring; decisions live in `ledger` and `cull`.

mod capture;
mod capture_error;
mod clients;
mod error;
mod hub;
pub mod offline;
pub mod page;
mod recheck;
mod report;
mod run;
mod serve;
mod settings;
mod showback;
pub mod tasks;

pub use capture::capture;
pub use error::AppError;
pub use report::report;
pub use run::run;
pub use serve::serve;
pub use showback::{prometheus_history, showback};
