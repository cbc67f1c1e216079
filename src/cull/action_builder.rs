//! Builders for [`Action`] and [`Notice`]: a Notebook stop from [`Action::notebook_stop`] plus
//! chained setters, and the notices of the same object from [`Action::notice`] and
//! [`Action::notice_cancelled`], so culling's unit and integration tests name only what their
//! case is about and none spells the target kind (it lives in the library because integration
//! tests need it too).

use chrono::{DateTime, Utc};

use super::notebook::Notebook;
use super::plan::{Action, CancelReason, Notice};
use super::target::{Target, TargetInfo};

impl Action {
    /// A stop of Notebook `namespace/name`: uid `nb-<namespace>-<name>` (as `NotebookInfo::new`
    /// gives), no resourceVersion, for its pod `<name>-0` with uid `pod-uid`, idle 0 s, no peak,
    /// no stop value, for no pending pod.
    pub fn notebook_stop(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        Action::Stop {
            target: &Notebook,
            notebook_uid: format!("nb-{namespace}-{name}"),
            resource_version: String::new(),
            pod: format!("{name}-0"),
            pod_uid: "pod-uid".into(),
            namespace,
            notebook: name,
            idle_seconds: 0.0,
            peak_utilization: None,
            stop_value: String::new(),
            for_pending: None,
        }
    }

    /// The same stop of `object` (namespace, name, uid and resourceVersion) of kind `target`.
    #[must_use]
    pub fn of_object(mut self, of: &'static dyn Target, object: &TargetInfo) -> Self {
        let Action::Stop {
            target,
            namespace,
            notebook,
            notebook_uid,
            resource_version,
            ..
        } = &mut self;
        *target = of;
        namespace.clone_from(&object.namespace);
        notebook.clone_from(&object.name);
        notebook_uid.clone_from(&object.uid);
        resource_version.clone_from(&object.resource_version);
        self
    }

    /// With this object uid.
    #[must_use]
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        let Action::Stop { notebook_uid, .. } = &mut self;
        *notebook_uid = uid.into();
        self
    }

    /// Evaluated at this resourceVersion of the object.
    #[must_use]
    pub fn at_version(mut self, version: impl Into<String>) -> Self {
        let Action::Stop {
            resource_version, ..
        } = &mut self;
        *resource_version = version.into();
        self
    }

    /// For this pod of the object.
    #[must_use]
    pub fn of_pod(mut self, name: impl Into<String>, uid: impl Into<String>) -> Self {
        let Action::Stop { pod, pod_uid, .. } = &mut self;
        *pod = name.into();
        *pod_uid = uid.into();
        self
    }

    /// Idle this long, with this peak utilisation (0..1) over the window.
    #[must_use]
    pub fn idle_for(mut self, seconds: f64, peak: Option<f64>) -> Self {
        let Action::Stop {
            idle_seconds,
            peak_utilization,
            ..
        } = &mut self;
        *idle_seconds = seconds;
        *peak_utilization = peak;
        self
    }

    /// Writing this stop value (UTC `YYYY-MM-DDTHH:MM:SSZ`).
    #[must_use]
    pub fn stopping_at(mut self, value: impl Into<String>) -> Self {
        let Action::Stop { stop_value, .. } = &mut self;
        *stop_value = value.into();
        self
    }

    /// The notice a plan gives before this stop: its object and pod, due at `stop_at`, with the
    /// stop's idle time and peak as evidence.
    pub fn notice(&self, stop_at: DateTime<Utc>) -> Notice {
        let Action::Stop {
            target,
            namespace,
            notebook,
            notebook_uid,
            pod,
            idle_seconds,
            peak_utilization,
            ..
        } = self;
        Notice::Schedule {
            target: *target,
            namespace: namespace.clone(),
            notebook: notebook.clone(),
            notebook_uid: notebook_uid.clone(),
            pod: pod.clone(),
            stop_at,
            idle_seconds: *idle_seconds,
            peak_utilization: *peak_utilization,
        }
    }

    /// The cancel of that notice (due at `stop_at`) for `why`, with no snooze named.
    pub fn notice_cancelled(&self, stop_at: DateTime<Utc>, why: CancelReason) -> Notice {
        let Action::Stop {
            target,
            namespace,
            notebook,
            notebook_uid,
            pod,
            ..
        } = self;
        Notice::Cancel {
            target: *target,
            namespace: namespace.clone(),
            notebook: notebook.clone(),
            notebook_uid: notebook_uid.clone(),
            pod: pod.clone(),
            stop_at,
            why,
            snooze_until: None,
        }
    }
}
