//! gpu-ledger: who holds each GPU in a Kubernetes cluster, is it used, and where did the free
//! cards go.
//!
//! The crate is laid out along the data flow:
//!
//! ```text
//! claims (pods, nodes, quotas, notebooks) ─┐
//!                                          ├─▶ ledger::build (pure) ─▶ export (/metrics, JSON)
//! usage (DCGM via Prometheus or a dump) ───┘                        ├─▶ report (CLI table/JSON)
//!                                                                   └─▶ cull::plan (pure) ─▶ actuator
//! ```

pub mod app;
pub mod claims;
pub mod config;
pub mod cull;
pub mod export;
pub mod ledger;
pub mod report;
pub mod telemetry;
pub mod usage;
