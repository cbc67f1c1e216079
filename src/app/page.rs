//! The page `serve` shows at `/`: report's HTML renderer behind export's [`PageRenderer`], so
//! the export sink imports no other sink.

use std::collections::BTreeMap;

use crate::export::server::PageRenderer;
use crate::ledger::Ledger;
use crate::report::html::{self, PageOptions, View};

/// Report's HTML page, served live (it refreshes itself from `/api/v1/ledger`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HtmlPage;

impl PageRenderer for HtmlPage {
    fn page(
        &self,
        ledger: &Ledger,
        query: &BTreeMap<String, String>,
        notes: Vec<String>,
    ) -> String {
        let param = |key: &str| query.get(key).cloned();
        let view = View {
            namespace: param("namespace"),
            node: param("node"),
            sort: param("sort"),
            dir: param("dir"),
        };
        html::render_page(
            ledger,
            &PageOptions {
                live: true,
                view,
                notes,
            },
        )
    }

    fn waiting(&self, state: &str, reason: &str) -> String {
        html::render_waiting_page(state, reason)
    }

    fn content_security_policy(&self) -> String {
        html::content_security_policy(true)
    }
}
