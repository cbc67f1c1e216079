//! The one way a source or sink that starts long-lived tasks of its own (the claims watches, the
//! culling Lease election) hands them to `serve`'s supervisor (`app::tasks`), without naming `app`.

use futures::future::BoxFuture;

/// Runs a task that must live until shutdown (one that ends early stops the process).
/// Arguments: the task's name (`watch:pods`), its future.
pub type Spawn<'a> = &'a (dyn Fn(String, BoxFuture<'static, ()>) + Sync);
