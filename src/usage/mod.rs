//! Usage sources: DCGM utilisation from Prometheus (`prom`: client, decode, queries; `live`: the
//! refreshing source, its idle `history` and the history's start-up bootstrap) or an exposition
//! dump (`dump`, offline), reduced by `series` to the ledger's usage inputs
//! ([`crate::ledger::usage`]). `fields` names the DCGM fields read: only the sources read them.

pub mod discover;
pub mod dump;
pub mod exposition;
pub mod fields;
pub mod hami;
pub mod history;
pub mod live;
pub mod prom;
pub mod running;
pub mod scheme;
pub mod series;

pub use scheme::LabelScheme;
