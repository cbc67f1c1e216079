//! Claims sources: live watches (`watch`), one-shot lists (`list`) and `kubectl get -o json|yaml`
//! dumps (`files`), all projected (`project`) into the ledger's claim inputs
//! ([`crate::ledger::claims`]); `capture` lists the raw objects the dumps hold.

pub mod capture;
pub mod dra;
pub mod files;
pub mod hami;
pub mod health;
pub mod kai;
pub mod kinds;
pub mod kueue;
pub mod list;
pub mod project;
pub mod quantity;
pub mod watch;
