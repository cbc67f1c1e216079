//! Runs a parsed command to completion on the runtime `main` built. The `block_on` lives here,
//! in the library, so the binary crate polls no future itself: release builds share no generic
//! instantiations between crates, and with the dispatch in `main.rs` the binary re-generated
//! the code of every future the commands await (137 s of a cold 2-core release build, after the
//! library's own 262 s; docs/first-build.md).

use tokio::runtime::Runtime;

use super::capture::capture;
use super::error::AppError;
use super::report::report;
use super::serve::serve;
use super::showback::showback;
use crate::config::Command;

/// Runs `command` on `runtime` until it finishes. `completions` has nothing to run here: `main`
/// prints the script before it starts the runtime.
pub fn run(runtime: &Runtime, command: Command) -> Result<(), AppError> {
    runtime.block_on(async move {
        match command {
            Command::Serve(args) => serve(*args).await,
            Command::Report(args) => report(*args).await,
            Command::Capture(args) => capture(*args).await,
            Command::Completions(_) => Ok(()),
            Command::Showback(args) => showback(*args).await,
        }
    })
}
