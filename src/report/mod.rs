//! Rendering of a [`Ledger`](crate::ledger::Ledger) for people and programs: an aligned table
//! (`table`), the JSON contract, the HTML page of `serve` and `report -o html` (`html`), and what
//! to do about each finding (`advice`). Where the ledger came from is `app`'s business.
//!
//! The cell texts (`gpus`, `percent`, `idle_for`, `note`) shared by the table and the page are in
//! `cells`; this file only declares and re-exports, so no child names its parent.

pub mod advice;
pub mod cells;
pub mod html;
pub mod showback;
pub mod table;

pub use table::{render_json, render_table, render_table_in, render_wide};
