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
//! Import rules (checked by `tests/architecture.rs`, no exception; the table is in
//! `docs/architecture.md`): `ledger` names no other module of the crate; sources (`claims`,
//! `usage`) name neither each other nor a sink; sinks (`export`, `report`, `cull`) name no other
//! sink and no source (`app` hands `export` the page's renderer as `app::page::HtmlPage`; shared
//! Kubernetes lookups live in `k8s`); nothing `app` wires names `app` (tasks reach its supervisor
//! through `spawn::Spawn`); no two files name each other: what a parent's children share lives in
//! a named child (`ledger::model`, `app`'s `error.rs`, `report::cells`).

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
