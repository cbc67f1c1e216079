//! Kubeflow Notebooks 2.0 Workspaces and WorkspaceKinds (`kubeflow.org/v1beta1`): discovery and
//! the projections the claims source (watch) and the culling target (re-read) share.
//!
//! Shapes read from kubeflow/notebooks `workspaces/controller` (the Workspace CRD
//! `config/crd/bases/kubeflow.org_workspaces.yaml` at commit 01ce3ff4, `workspace_types.go`,
//! `workspacekind_types.go`; see tests/fixtures/workspace/README.md): `spec.paused` stops it,
//! `status.activity.lastActivity` is a UNIX time in seconds in the older types and in
//! milliseconds in the newer controller, so the unit is told by magnitude.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiSelector;
use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use serde_json::Value;

use crate::ledger::claims::{
    ActivityRule, LAST_ACTIVITY_ANNOTATION, LabelSelector, OwnerInfo, SelectorOp,
    SelectorRequirement, WorkspaceInfo, WorkspaceKindInfo,
};

/// The API group and version of Workspaces and WorkspaceKinds.
pub const WORKSPACE_GROUP: &str = "kubeflow.org";
pub const WORKSPACE_VERSION: &str = "v1beta1";

/// Above this, `lastActivity` is read as milliseconds: 1e11 s is the year 5138, 1e11 ms is
/// 1973, so no plausible time is ambiguous.
const MILLIS_ABOVE: i64 = 100_000_000_000;

/// The served Workspace resource (`kubeflow.org/v1beta1`); `Ok(None)` when the group serves no
/// Workspace kind (a cluster with the v1 Notebook CRD only).
pub async fn workspace_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let group = kube::discovery::group(client, WORKSPACE_GROUP).await?;
    Ok(group
        .versioned_resources(WORKSPACE_VERSION)
        .into_iter()
        .find(|(r, _)| r.kind == "Workspace")
        .map(|(r, _)| r))
}

/// The WorkspaceKind resource beside a served Workspace resource (same group and version).
pub fn workspace_kind_resource(workspace: &ApiResource) -> ApiResource {
    ApiResource {
        kind: "WorkspaceKind".into(),
        plural: "workspacekinds".into(),
        ..workspace.clone()
    }
}

/// `status.activity.lastActivity` as a time: 0 (or absent, negative, out of range) is unknown,
/// the controller's own default; seconds or milliseconds by magnitude.
pub fn last_activity(value: i64) -> Option<DateTime<Utc>> {
    match value {
        v if v <= 0 => None,
        v if v > MILLIS_ABOVE => DateTime::from_timestamp_millis(v),
        v => DateTime::from_timestamp(v, 0),
    }
}

/// A Workspace: gpu-ledger's annotations read as on a Notebook (fail closed), stopped when
/// `spec.paused` is true, activity from the status.
pub fn workspace(object: &DynamicObject) -> WorkspaceInfo {
    let mut owner: OwnerInfo = super::notebook(&object.metadata);
    let data = &object.data;
    let paused = data.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
    // Kubeflow's stop annotation means nothing to the Workspace controller: only spec.paused.
    owner.stopped = paused.then(|| "true".to_string());
    // Nor is the v1 culler's annotation read here: the Workspace's own status says it.
    owner
        .invalid_annotations
        .retain(|k| *k != LAST_ACTIVITY_ANNOTATION);
    owner.last_activity = data
        .pointer("/status/activity/lastActivity")
        .and_then(Value::as_i64)
        .and_then(last_activity);
    let text = |path: &str| {
        data.pointer(path)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    WorkspaceInfo {
        owner,
        kind: text("/spec/kind"),
        pod_config: text("/spec/podTemplate/options/podConfig"),
    }
}

/// A WorkspaceKind: its `spec.activityRules` in order and its podConfig options' spawner labels.
pub fn workspace_kind(object: &DynamicObject) -> WorkspaceKindInfo {
    let data = &object.data;
    let activity_rules = data
        .pointer("/spec/activityRules")
        .and_then(Value::as_array)
        .map(|rules| rules.iter().map(activity_rule).collect())
        .unwrap_or_default();
    let pod_config_labels = data
        .pointer("/spec/podTemplate/options/podConfig/values")
        .and_then(Value::as_array)
        .map(|values| values.iter().filter_map(option_labels).collect())
        .unwrap_or_default();
    WorkspaceKindInfo {
        name: object.metadata.name.clone().unwrap_or_default(),
        activity_rules,
        pod_config_labels,
    }
}

/// `(id, spawner.labels as a map)` of one podConfig option.
fn option_labels(option: &Value) -> Option<(String, BTreeMap<String, String>)> {
    let id = option.get("id")?.as_str()?.to_string();
    let labels = option
        .pointer("/spawner/labels")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|kv| {
                    Some((
                        kv.get("key")?.as_str()?.to_string(),
                        kv.get("value")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Some((id, labels))
}

fn activity_rule(rule: &Value) -> ActivityRule {
    let selector = |path: &str| {
        rule.pointer(path).map(|s| {
            serde_json::from_value::<ApiSelector>(s.clone()).map_or_else(
                // A selector that does not parse can prove no match: an unknown operator,
                // which never matches (the exemption then fails closed, see ledger/workspace.rs).
                |_| LabelSelector {
                    match_expressions: vec![SelectorRequirement {
                        key: String::new(),
                        operator: SelectorOp::Unknown,
                        values: Vec::new(),
                    }],
                    ..LabelSelector::default()
                },
                |s| super::label_selector(&s),
            )
        })
    };
    ActivityRule {
        namespace_selector: selector("/match/matchNamespace/selector"),
        pod_config_selector: selector("/match/matchPodConfig/selector"),
        pause_workspace: rule
            .pointer("/effect/pauseWorkspace")
            .and_then(Value::as_bool),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(v: Value) -> DynamicObject {
        serde_json::from_value(v).expect("object")
    }

    #[test]
    fn last_activity_unit_is_told_by_magnitude_and_zero_is_unknown() {
        // The older types' example (seconds) and the newer controller's milliseconds.
        let t = DateTime::from_timestamp(1_704_067_200, 0);
        assert_eq!(last_activity(1_704_067_200), t);
        assert_eq!(last_activity(1_704_067_200_000), t);
        assert_eq!(last_activity(0), None);
        assert_eq!(last_activity(-5), None);
        assert_eq!(last_activity(i64::MAX), None);
    }

    #[test]
    fn workspace_projection_reads_paused_activity_and_options() {
        let ws = workspace(&object(json!({
            "apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
            "metadata": {"name": "ws", "namespace": "team-a", "uid": "u1",
                "resourceVersion": "7",
                "annotations": {LAST_ACTIVITY_ANNOTATION: "garbage"}},
            "spec": {"kind": "jupyterlab", "paused": false,
                "podTemplate": {"options": {"imageConfig": "img", "podConfig": "big_gpu"},
                    "volumes": {"home": "h"}}},
            "status": {"activity": {"lastActivity": 1_704_067_200_000_i64, "lastUpdate": 0}}
        })));
        assert_eq!(ws.owner.stopped, None);
        assert!(ws.owner.invalid_annotations.is_empty(), "{ws:?}");
        assert_eq!(
            ws.owner.last_activity,
            DateTime::from_timestamp(1_704_067_200, 0)
        );
        assert_eq!(
            (ws.kind.as_str(), ws.pod_config.as_str()),
            ("jupyterlab", "big_gpu")
        );
        let paused = workspace(&object(json!({
            "apiVersion": "kubeflow.org/v1beta1", "kind": "Workspace",
            "metadata": {"name": "ws", "namespace": "team-a", "uid": "u1"},
            "spec": {"kind": "jupyterlab", "paused": true},
            "status": {"activity": {"lastActivity": 0, "lastUpdate": 0}}
        })));
        assert_eq!(paused.owner.stopped.as_deref(), Some("true"));
        assert_eq!(paused.owner.last_activity, None);
    }

    #[test]
    fn workspace_kind_projection_reads_rules_in_order_and_option_labels() {
        let kind = workspace_kind(&object(json!({
            "apiVersion": "kubeflow.org/v1beta1", "kind": "WorkspaceKind",
            "metadata": {"name": "jupyterlab"},
            "spec": {
                "activityRules": [
                    {"match": {"matchPodConfig": {"selector": {"matchLabels": {"gpu": "1"}}}},
                     "config": {"secondsSinceActive": 3600},
                     "effect": {"pauseWorkspace": false}},
                    {"config": {"secondsSinceActive": 86400}, "effect": {"pauseWorkspace": true}}
                ],
                "podTemplate": {"options": {"podConfig": {"values": [
                    {"id": "big_gpu", "spawner": {"displayName": "GPU",
                        "labels": [{"key": "gpu", "value": "1"}]}},
                    {"id": "tiny_cpu", "spawner": {"displayName": "CPU"}}
                ]}}}
            }
        })));
        assert_eq!(kind.activity_rules.len(), 2);
        assert_eq!(kind.activity_rules[0].pause_workspace, Some(false));
        assert_eq!(
            kind.activity_rules[0]
                .pod_config_selector
                .as_ref()
                .map(|s| s.match_labels.clone()),
            Some(BTreeMap::from([("gpu".to_string(), "1".to_string())]))
        );
        assert_eq!(kind.activity_rules[1].namespace_selector, None);
        assert_eq!(kind.pod_config_labels["big_gpu"]["gpu"], "1");
        assert!(kind.pod_config_labels["tiny_cpu"].is_empty());
    }
}
