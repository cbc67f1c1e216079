//! The offline report: load dumps into a [`Ledger`](crate::ledger::Ledger) (`offline`) and render
//! it as an aligned table or as the JSON contract (`table`).

pub mod offline;
pub mod table;

pub use offline::{Offline, OfflineError, OfflineInput, load};
pub use table::{render_json, render_table};
