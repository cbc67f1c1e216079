//! A builder for `NotebookInfo`: a running, unannotated Notebook from [`NotebookInfo::new`] plus
//! chained setters, so culling's unit and integration tests name only what their case is about
//! (it lives in the library because integration tests need it too).

use crate::ledger::claims::NotebookInfo;

impl NotebookInfo {
    /// Notebook `namespace/name`, uid `nb-<namespace>-<name>`, no resourceVersion, no annotation.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        NotebookInfo {
            uid: format!("nb-{namespace}-{name}"),
            namespace,
            name,
            ..NotebookInfo::default()
        }
    }

    /// With this uid.
    #[must_use]
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    /// Read at this resourceVersion (the precondition of a write).
    #[must_use]
    pub fn at_version(mut self, resource_version: impl Into<String>) -> Self {
        self.resource_version = resource_version.into();
        self
    }
}
