//! Replays saved fuzz inputs through the fuzz target bodies on stable, in the normal test suite.
//!
//! `fuzz/src/lib.rs` holds the bodies libFuzzer runs (`cargo fuzz run <target>`); this test compiles
//! the same file and runs every input under `fuzz/regressions/<target>/` (inputs that once crashed
//! or broke an invariant, kept after the fix) and `fuzz/seeds/<target>/` (the starting corpus).
//! Add a crashing input by copying libFuzzer's `crash-*` artifact into `fuzz/regressions/<target>/`.

#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["regressions", "seeds"] {
        let dir = root.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let p = e.expect("directory entry").path();
            if p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no saved inputs for {target} under fuzz/regressions or fuzz/seeds"
    );
    for p in files {
        let data = std::fs::read(&p).expect("read saved input");
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_ok(),
            "{target}: {} fails (replay with `cargo fuzz run {target} {}`)",
            p.display(),
            p.display()
        );
    }
}

#[test]
fn exposition_inputs() {
    replay("exposition", targets::exposition);
}

#[test]
fn prom_response_inputs() {
    replay("prom_response", targets::prom_response);
}

#[test]
fn quantity_inputs() {
    replay("quantity", targets::quantity);
}

#[test]
fn kubectl_list_inputs() {
    replay("kubectl_list", targets::kubectl_list);
    targets::remove_scratch();
}
