//! The Workspace ownership rule and the `activityRules` exemption, case by case.

use std::collections::BTreeMap;

use super::*;
use crate::ledger::claims::{LabelSelector, OwnerInfo, OwnerRef, StatefulSetInfo};

fn workspace(kind: &str, pod_config: &str) -> WorkspaceInfo {
    WorkspaceInfo {
        owner: OwnerInfo::new("team-a", "ws").with_uid("ws-uid"),
        kind: kind.into(),
        pod_config: pod_config.into(),
    }
}

fn selector(k: &str, v: &str) -> LabelSelector {
    LabelSelector {
        match_labels: BTreeMap::from([(k.to_string(), v.to_string())]),
        ..LabelSelector::default()
    }
}

fn rule(pod_config: Option<LabelSelector>, pause: Option<bool>) -> ActivityRule {
    ActivityRule {
        pod_config_selector: pod_config,
        pause_workspace: pause,
        ..ActivityRule::default()
    }
}

/// WorkspaceKind `jupyterlab`: option `big_gpu` labelled `gpu=1`, option `cpu` unlabelled.
fn kind(rules: Vec<ActivityRule>) -> WorkspaceKindInfo {
    WorkspaceKindInfo {
        name: "jupyterlab".into(),
        activity_rules: rules,
        pod_config_labels: BTreeMap::from([
            (
                "big_gpu".to_string(),
                BTreeMap::from([("gpu".to_string(), "1".to_string())]),
            ),
            ("cpu".to_string(), BTreeMap::new()),
        ]),
    }
}

#[test]
fn the_first_deciding_rule_that_matches_wins() {
    // The research's example: GPU options exempt, a catch-all pauses the rest.
    let rules = kind(vec![
        rule(Some(selector("gpu", "1")), Some(false)),
        rule(None, Some(true)),
    ]);
    let kinds = [rules];
    assert!(exemption(&workspace("jupyterlab", "big_gpu"), &kinds).is_some());
    assert_eq!(exemption(&workspace("jupyterlab", "cpu"), &kinds), None);
    // A rule without an effect falls through to the next.
    let kinds = [kind(vec![
        rule(None, None),
        rule(Some(selector("gpu", "1")), Some(false)),
    ])];
    assert!(exemption(&workspace("jupyterlab", "big_gpu"), &kinds).is_some());
    // A pausing rule first decides: later exemptions are not reached.
    let kinds = [kind(vec![rule(None, Some(true)), rule(None, Some(false))])];
    assert_eq!(exemption(&workspace("jupyterlab", "big_gpu"), &kinds), None);
    // No rules (or the older `culling` shape, which has none): not exempt.
    assert_eq!(
        exemption(&workspace("jupyterlab", "big_gpu"), &[kind(vec![])]),
        None
    );
}

#[test]
fn what_cannot_be_evaluated_exempts() {
    // Namespace labels are not in the ledger: a namespace rule met first fails closed.
    let ns_rule = ActivityRule {
        namespace_selector: Some(selector("team", "ml")),
        pause_workspace: Some(true),
        ..ActivityRule::default()
    };
    let kinds = [kind(vec![ns_rule.clone(), rule(None, Some(true))])];
    assert!(exemption(&workspace("jupyterlab", "cpu"), &kinds).is_some());
    // ... unless its podConfig part already fails (AND).
    let gpu_and_ns = ActivityRule {
        pod_config_selector: Some(selector("gpu", "1")),
        ..ns_rule
    };
    let kinds = [kind(vec![gpu_and_ns, rule(None, Some(true))])];
    assert_eq!(exemption(&workspace("jupyterlab", "cpu"), &kinds), None);
    // A WorkspaceKind that is not known.
    assert!(exemption(&workspace("other", "cpu"), &kinds).is_some());
}

fn claims_with(labels: &[(&str, &str)], sts_known: bool) -> (Claims, PodClaim) {
    let mut pod = PodClaim::new("team-a", "ws-abcde-0").controlled_by(OwnerRef {
        group: "apps".into(),
        kind: "StatefulSet".into(),
        name: "ws-abcde".into(),
        uid: "sts-uid".into(),
    });
    pod.labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let sts = StatefulSetInfo {
        namespace: "team-a".into(),
        name: "ws-abcde".into(),
        uid: "sts-uid".into(),
        controller: Some(OwnerRef {
            group: "kubeflow.org".into(),
            kind: "Workspace".into(),
            name: "ws".into(),
            uid: "ws-uid".into(),
        }),
        selector: Some(selector(WORKSPACE_NAME_LABEL, "ws")),
    };
    let claims = Claims {
        workspaces_enabled: true,
        workspaces: vec![workspace("jupyterlab", "cpu")],
        workspace_kinds: vec![kind(vec![rule(None, Some(true))])],
        statefulsets: if sts_known { vec![sts] } else { vec![] },
        ..Claims::default()
    };
    (claims, pod)
}

#[test]
fn owner_chain_and_label_must_agree_to_verify() {
    let label = [(WORKSPACE_NAME_LABEL, "ws")];
    let (claims, pod) = claims_with(&label, true);
    let owned = owner_of(&claims, &pod).expect("owned");
    assert_eq!(
        (owned.kind, owned.info.name.as_str(), owned.verified),
        (OwnerKind::Workspace, "ws", true)
    );
    assert!(!owned.info.cull_opt_out);
    // The label names another Workspace: the selector no longer matches either: unverified.
    let (claims, pod) = claims_with(&[(WORKSPACE_NAME_LABEL, "other")], true);
    assert_eq!(owner_of(&claims, &pod).map(|o| o.verified), Some(false));
    // StatefulSet not read yet: the label names it, unverified.
    let (claims, pod) = claims_with(&label, false);
    assert_eq!(owner_of(&claims, &pod).map(|o| o.verified), Some(false));
    // Workspaces not served: nobody's.
    let (mut claims, pod) = claims_with(&label, true);
    claims.workspaces_enabled = false;
    assert_eq!(owner_of(&claims, &pod), None);
    // Exempt by its kind: owned, marked opted out.
    let (mut claims, pod) = claims_with(&label, true);
    claims.workspace_kinds = vec![kind(vec![rule(None, Some(false))])];
    assert!(owner_of(&claims, &pod).expect("owned").info.cull_opt_out);
}
