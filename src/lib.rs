//! gpu-ledger: who holds each GPU in a Kubernetes cluster, is it used, and where did the free
//! cards go.
//!
//! The crate is laid out along the data flow; the ledger is the hub:
//!
//! ```text
//! claims (watches, lists, dumps) ─┐                            ┌─▶ export (/metrics, JSON API)
//!                                 ├─▶ ledger (input model,     ├─▶ report (table, JSON, HTML)
//! usage (Prometheus, dumps) ──────┘   pure build, accounting)  └─▶ cull (pure plan → actuator)
//! ```
//!
//! The ledger owns its numbers: the rows `build` returns (`ledger::model`), the GPU-second
//! counters of the published snapshot (`ledger::accounting::Snapshot`, which the culler and
//! `/metrics` read) and the showback math (`ledger::showback`); the sinks only render them.
//!
//! Import rules (checked by `tests/architecture.rs`): `ledger` imports no other module of the
//! crate; `export` never imports `cull`; `report` never imports `claims`; `config` never imports
//! `cull`; the sinks (`export`, `report`, `cull`) import no other sink (`app` hands `export` the
//! page's renderer, report's HTML, as `app::page::HtmlPage`), and `cull` no source: shared
//! Kubernetes lookups live in `k8s`. No two files import each other: what a parent's children
//! share lives in a named child (`ledger::model`, `app`'s `error.rs`, `report::cells`). `app`
//! wires the modes together and nothing it wires names it (tasks reach its supervisor through
//! `spawn::Spawn`).

pub mod app;
pub mod claims;
pub mod config;
pub mod cull;
pub mod export;
pub mod k8s;
pub mod ledger;
pub mod report;
pub mod spawn;
pub mod telemetry;
pub mod test_hooks;
pub mod usage;
