//! The task supervisor of `serve`: one cancellation tree over every task, the first task that
//! ends before shutdown (or panics) cancels the rest and names itself, each loop's heartbeat for
//! the probes, and the signal handler. [`Spawn`] is how the sources and sinks that start tasks
//! of their own (the claims watches, the culling Lease election) hand them to the supervisor.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, error, info, info_span, warn};

pub use crate::spawn::Spawn;

/// Longest wait for tasks to stop after cancellation.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The tasks of one `serve` process: one cancellation tree, and the first unexpected end.
#[derive(Clone)]
pub(super) struct Tasks {
    pub(super) tracker: TaskTracker,
    pub(super) cancel: CancellationToken,
    pub(super) failed: Arc<Mutex<Option<String>>>,
}

impl Tasks {
    pub(super) fn new() -> Self {
        Tasks {
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            failed: Arc::default(),
        }
    }

    /// Spawns a task that must run until shutdown. If it returns or panics first, everything is
    /// cancelled and [`Tasks::failed`] names it.
    pub(super) fn spawn_critical<F>(&self, name: impl Into<String>, span: Span, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
        let (cancel, failed) = (self.cancel.clone(), self.failed.clone());
        self.tracker.spawn(
            async move {
                let ended = std::panic::AssertUnwindSafe(task).catch_unwind().await;
                if cancel.is_cancelled() {
                    return;
                }
                let how = if ended.is_ok() {
                    "returned"
                } else {
                    "panicked"
                };
                error!(task = %name, how, "task ended before shutdown; stopping the process");
                failed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(name);
                cancel.cancel();
            }
            .instrument(span),
        );
    }

    pub(super) fn failed(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Closes the tracker and waits for every task to stop, at most [`SHUTDOWN_GRACE`].
    pub(super) async fn drain(&self) {
        self.tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                grace_seconds = SHUTDOWN_GRACE.as_secs(),
                "tasks did not stop in time; exiting anyway"
            );
        }
    }
}

/// One loop's heartbeat: when it last made progress, and how long it may go without.
pub(super) struct Beat {
    pub(super) name: &'static str,
    pub(super) bound: Duration,
    last: Mutex<Instant>,
}

impl Beat {
    pub(super) fn new(name: &'static str, bound: Duration) -> Arc<Self> {
        Arc::new(Beat {
            name,
            bound,
            last: Mutex::new(Instant::now()),
        })
    }

    pub(super) fn beat(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    pub(super) fn silent_for(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
    }
}

/// SIGTERM or Ctrl-C cancels everything (an expected end: not a failure).
pub(super) fn spawn_signal_handler(tasks: &Tasks) {
    let (cancel, failed) = (tasks.cancel.clone(), tasks.failed.clone());
    tasks.tracker.spawn(
        async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let mut term = match signal(SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        error!(
                            error = &e as &dyn std::error::Error,
                            "cannot listen for SIGTERM"
                        );
                        // Not an expected end: the process must exit non-zero.
                        failed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert_with(|| "signals".to_string());
                        cancel.cancel();
                        return;
                    }
                };
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => info!("interrupt received"),
                    () = cancel.cancelled() => return,
                }
            }
            #[cfg(not(unix))]
            {
                drop(failed);
                let _ = tokio::signal::ctrl_c().await;
            }
            cancel.cancel();
        }
        .instrument(info_span!("signals")),
    );
}
