//! The corpus of real dcgm-exporter output (`tests/fixtures/dcgm-real/`, each case citing its
//! source) read by the offline report: every case states the ledger it must produce
//! (`expected.json`), and this test checks each stated field.
//!
//! A case holds ONE scrape as the exporter printed it; the harness repeats it every 30 s for the
//! 10-minute window (values constant) with sample timestamps, as `capture` or a Prometheus
//! `/federate` dump would carry it. The same scrape served by the DCGM test double and scraped by
//! a real Prometheus is checked in `tests/dcgm_corpus_live.rs`.

mod corpus;

use corpus::{Case, cases};

#[test]
fn every_case_yields_its_expected_ledger_offline() {
    let cases = cases();
    assert!(cases.len() >= 20, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let ledger = case.offline_ledger();
        failures.extend(case.check(&ledger, "offline"));
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_harness_notices_a_wrong_expectation() {
    // A checker that cannot fail proves nothing: flip one expected value and it must complain.
    let mut case: Case = cases().into_iter().next().expect("a case");
    let ledger = case.offline_ledger();
    assert!(case.check(&ledger, "offline").is_empty());
    case.expected["pods"][0]["gpus"] = serde_json::json!(42.0);
    assert!(!case.check(&ledger, "offline").is_empty());
}
