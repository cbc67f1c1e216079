//! Usage sources: DCGM utilisation from Prometheus (`prom`, live) or an exposition dump (`dump`,
//! offline), reduced to the ledger's usage inputs ([`crate::ledger::usage`]).

pub mod discover;
pub mod dump;
pub mod exposition;
pub mod history;
pub mod live;
pub mod prom;
pub mod scheme;
pub mod series;

pub use scheme::LabelScheme;
