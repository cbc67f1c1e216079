//! Test-only fault hooks, honoured by debug builds only (a release build ignores them).
//!
//! The fault tests (`tests/faults_*.rs`) need two faults no real component can be made to show on
//! demand: a task of `serve` that panics, and a replica whose wall clock is skewed (libfaketime is
//! not available). Both are read from the environment once:
//!
//! * `GPU_LEDGER_TEST_PANIC_TASK=<task>` — the task panics at its next [`panic_point`] (for
//!   `refresh`, `hub`, `cull`, `lease` and `watch:<resource>`: after its first unit of work), to
//!   show that a dead task ends the process non-zero instead of leaving a zombie.
//! * `GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET=<seconds>` (signed) — added to the wall clock that the
//!   culling Lease *writes* (`acquireTime`, `renewTime`), to show that a replica with a skewed
//!   clock cannot take a live Lease. The election never reads the wall clock.

use std::sync::OnceLock;

/// Names the task that must panic.
pub const PANIC_TASK_ENV: &str = "GPU_LEDGER_TEST_PANIC_TASK";
/// Seconds added to the wall clock written into the culling Lease.
pub const LEASE_CLOCK_OFFSET_ENV: &str = "GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET";

fn read(name: &str) -> Option<String> {
    if cfg!(debug_assertions) {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    } else {
        None
    }
}

/// Panics when [`PANIC_TASK_ENV`] names `task` (debug builds only). Called from inside the
/// task's own loop, so the panic unwinds exactly as a real bug in that task would.
///
/// # Panics
///
/// That is its purpose, under the test hook only.
pub fn panic_point(task: &str) {
    static TASK: OnceLock<Option<String>> = OnceLock::new();
    let named = TASK.get_or_init(|| read(PANIC_TASK_ENV)).as_deref() == Some(task);
    assert!(
        !named,
        "{PANIC_TASK_ENV}={task}: test-injected panic in task {task}"
    );
}

/// The offset of [`LEASE_CLOCK_OFFSET_ENV`] (zero when unset, unparsable, or in release builds).
pub fn lease_clock_offset() -> chrono::Duration {
    read(LEASE_CLOCK_OFFSET_ENV)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map_or_else(chrono::Duration::zero, chrono::Duration::seconds)
}
