//! Shared Kubernetes lookups, used by the claims sources and the culling sink alike: namespaced
//! or cluster-wide scoping, Notebook discovery (one API-version order), the StatefulSet that owns
//! a pod, the Notebook projection and time conversions. Only the ledger's types are named here.

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::{Client, Resource};

pub mod raycluster;

use crate::ledger::claims::{
    CULL_OPT_OUT_ANNOTATION, LAST_ACTIVITY_ANNOTATION, LabelSelector, NotebookInfo, OwnerRef,
    PodClaim, SNOOZE_ANNOTATION, STOP_ANNOTATION, STOP_SCHEDULED_AT_ANNOTATION,
    STOPPED_AT_ANNOTATION, SelectorOp, SelectorRequirement,
};

/// The API group of Kubeflow's Notebook.
pub const NOTEBOOK_GROUP: &str = "kubeflow.org";

pub mod workspace;

/// The Notebook versions tried, in order, before the group's preferred one: culling patches and
/// names the Notebook through this version, so every lookup agrees on it.
const NOTEBOOK_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// The namespaces to list or watch in: `None` (cluster-wide) when `namespaces` is empty.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    }
}

/// A typed API in one namespace, or cluster-wide for `None`.
pub fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A dynamic API (a discovered resource) in one namespace, or cluster-wide for `None`.
pub fn scoped_dynamic(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

/// The served Notebook resource: `kubeflow.org` v1, else v1beta1, else the group's preferred
/// version; `Ok(None)` when the group serves no Notebook kind. Discovery errors (a group that
/// is not served answers 404) are the caller's to judge.
pub async fn notebook_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = kube::discovery::group(client, NOTEBOOK_GROUP).await?;
    Ok(NOTEBOOK_VERSIONS
        .iter()
        .find_map(|v| {
            group
                .versioned_resources(v)
                .into_iter()
                .find(|(r, _)| r.kind == "Notebook")
        })
        .or_else(|| group.recommended_kind("Notebook"))
        .map(|(r, _)| r))
}

/// The StatefulSet (`apps`) that controls a pod, if one does: notebook ownership goes through it.
pub fn statefulset_owner(pod: &PodClaim) -> Option<&OwnerRef> {
    pod.controller
        .as_ref()
        .filter(|c| c.kind == "StatefulSet" && c.group == "apps")
}

/// Reads one StatefulSet; `Ok(None)` when it is gone.
pub async fn get_statefulset(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<StatefulSet>, kube::Error> {
    Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

/// k8s-openapi carries `jiff` timestamps; the rest of the crate uses `chrono`.
pub fn to_chrono(t: k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().unsigned_abs())
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// A Notebook from its metadata alone (spec and status are never read).
///
/// Every annotation culling reads fails closed: one that is present but not understood is named
/// in [`NotebookInfo::invalid_annotations`] (culling holds the notebook back), never read as
/// absent — a snooze that is a date alone, a time without a zone or prose is no snooze only to a
/// parser, not to the user who wrote it.
pub fn notebook(meta: &ObjectMeta) -> NotebookInfo {
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k));
    let mut invalid_annotations = Vec::new();
    // RFC 3339 with a zone (surrounding whitespace ignored); anything else is not understood.
    let mut parse_time = |k: &'static str| {
        let parsed = DateTime::parse_from_rfc3339(get(k)?.trim()).ok();
        if parsed.is_none() {
            invalid_annotations.push(k);
        }
        parsed.map(|t| t.with_timezone(&Utc))
    };
    let snooze_until = parse_time(SNOOZE_ANNOTATION);
    let last_stopped_by_us = parse_time(STOPPED_AT_ANNOTATION);
    let stop_scheduled_at = parse_time(STOP_SCHEDULED_AT_ANNOTATION);
    // Kubeflow's culler writes it (RFC 3339); a value not understood fails closed like ours.
    let last_activity = parse_time(LAST_ACTIVITY_ANNOTATION);
    // Strict: absent or exactly "true" allows culling, "false" opts out, anything else is not
    // understood: it fails closed as opted out and is named as invalid (docs/culling.md).
    let opt_out = get(CULL_OPT_OUT_ANNOTATION);
    if opt_out.is_some_and(|v| v != "true" && v != "false") {
        invalid_annotations.push(CULL_OPT_OUT_ANNOTATION);
    }
    NotebookInfo {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        stopped: get(STOP_ANNOTATION).cloned(),
        deleting: meta.deletion_timestamp.is_some(),
        cull_opt_out: opt_out.is_some_and(|v| v != "true"),
        snooze_until,
        last_stopped_by_us,
        invalid_annotations,
        stop_scheduled_at,
        last_activity,
        managed_by: None,
    }
}

/// A Kubernetes label selector as the ledger reads it (an unknown operator matches nothing).
pub fn label_selector(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> LabelSelector {
    LabelSelector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions: s
            .match_expressions
            .iter()
            .flatten()
            .map(|r| SelectorRequirement {
                key: r.key.clone(),
                operator: match r.operator.as_str() {
                    "In" => SelectorOp::In,
                    "NotIn" => SelectorOp::NotIn,
                    "Exists" => SelectorOp::Exists,
                    "DoesNotExist" => SelectorOp::DoesNotExist,
                    _ => SelectorOp::Unknown,
                },
                values: r.values.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn notebook_with(annotations: &[(&str, &str)]) -> NotebookInfo {
        let meta: ObjectMeta = serde_json::from_value(json!({
            "name": "nb", "namespace": "team-a", "uid": "nb-uid",
            "annotations": annotations.iter().copied().collect::<BTreeMap<_, _>>()
        }))
        .expect("valid metadata");
        notebook(&meta)
    }

    #[test]
    fn malformed_culling_annotations_fail_closed() {
        // Not RFC 3339 with a zone: a date alone, a time without zone, prose, empty, a bad month.
        let malformed = [
            "2026-12-24",
            "2026-12-24T10:00:00",
            "next week",
            "",
            "2026-13-01T00:00:00Z",
            "1735000000",
        ];
        for key in [
            SNOOZE_ANNOTATION,
            STOPPED_AT_ANNOTATION,
            LAST_ACTIVITY_ANNOTATION,
        ] {
            for value in malformed {
                let nb = notebook_with(&[(key, value)]);
                assert_eq!(nb.invalid_annotations, vec![key], "{key}={value:?}");
                assert_eq!((nb.snooze_until, nb.last_stopped_by_us), (None, None));
                assert_eq!(nb.last_activity, None);
            }
        }
        // Both at once: both named.
        let nb = notebook_with(&[
            (SNOOZE_ANNOTATION, "tomorrow"),
            (STOPPED_AT_ANNOTATION, "yesterday"),
        ]);
        assert_eq!(
            nb.invalid_annotations,
            vec![SNOOZE_ANNOTATION, STOPPED_AT_ANNOTATION]
        );
        // The opt-out is still read as opted out, and now also named as not understood.
        for value in ["False", "no", "0", ""] {
            let nb = notebook_with(&[(CULL_OPT_OUT_ANNOTATION, value)]);
            assert!(nb.cull_opt_out, "{value:?}");
            assert_eq!(
                nb.invalid_annotations,
                vec![CULL_OPT_OUT_ANNOTATION],
                "{value:?}"
            );
        }
    }

    #[test]
    fn well_formed_culling_annotations_are_read() {
        let nb = notebook_with(&[]);
        assert!(nb.invalid_annotations.is_empty());
        assert_eq!((nb.snooze_until, nb.last_stopped_by_us), (None, None));
        let nb = notebook_with(&[
            (SNOOZE_ANNOTATION, "2026-12-24T10:00:00+01:00"),
            (STOPPED_AT_ANNOTATION, " 2026-11-28T09:00:00Z\n"),
            (CULL_OPT_OUT_ANNOTATION, "false"),
        ]);
        assert!(nb.invalid_annotations.is_empty(), "{nb:?}");
        assert_eq!(
            nb.snooze_until.map(|t| t.to_rfc3339()),
            Some("2026-12-24T09:00:00+00:00".to_string())
        );
        assert_eq!(
            nb.last_stopped_by_us.map(|t| t.to_rfc3339()),
            Some("2026-11-28T09:00:00+00:00".to_string())
        );
        assert!(nb.cull_opt_out);
        assert!(!notebook_with(&[(CULL_OPT_OUT_ANNOTATION, "true")]).cull_opt_out);
        // Kubeflow's culler writes seconds in UTC (opendatahub docs: '2024-07-30T20:27:25Z').
        let nb = notebook_with(&[(LAST_ACTIVITY_ANNOTATION, "2024-07-30T20:27:25Z")]);
        assert!(nb.invalid_annotations.is_empty(), "{nb:?}");
        assert_eq!(
            nb.last_activity.map(|t| t.to_rfc3339()),
            Some("2024-07-30T20:27:25+00:00".to_string())
        );
        assert_eq!(notebook_with(&[]).last_activity, None);
        // Any value of the stop annotation means stopped: nothing there can be malformed.
        let nb = notebook_with(&[(STOP_ANNOTATION, "odh-notebook-controller-lock")]);
        assert!(nb.invalid_annotations.is_empty() && nb.stopped.is_some());
    }
}
