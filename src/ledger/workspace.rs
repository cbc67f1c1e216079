//! Workspace layer (issue 40): which Kubeflow Notebooks 2.0 Workspace owns a pod, and whether
//! its WorkspaceKind's `activityRules` exempt it from pausing.
//!
//! The Workspace controller owns a StatefulSet per Workspace (controller ownerReference, label
//! `notebooks.kubeflow.org/workspace-name`), whose pod `<statefulset>-0` carries the same label:
//! the same chain shape as a v1 Notebook, verified the same way, and cross-checked with the
//! label.

use super::claims::{
    ActivityRule, Claims, OwnerKind, PodClaim, WORKSPACE_NAME_LABEL, WorkspaceInfo,
    WorkspaceKindInfo,
};
use super::model::OwnedBy;

/// The Workspace owning pod `p`, with whether pod → StatefulSet → Workspace was verified (uids,
/// the StatefulSet's selector and ordinal name, and the workspace-name label all agree). A pod
/// whose StatefulSet is not known yet, or whose label disagrees with the chain, is the
/// Workspace's unverified (shown, never paused). The owner is exempt (`cull_opt_out`) when its
/// WorkspaceKind's activity rules say so or cannot be evaluated ([`exemption`]).
pub fn owner_of(claims: &Claims, p: &PodClaim) -> Option<OwnedBy> {
    if !claims.workspaces_enabled {
        return None;
    }
    let sts_ref = p
        .controller
        .as_ref()
        .filter(|o| o.kind == "StatefulSet" && o.group == "apps")?;
    let label = p.labels.get(WORKSPACE_NAME_LABEL);
    let sts = claims
        .statefulsets
        .iter()
        .find(|s| s.uid == sts_ref.uid && s.namespace == p.namespace);
    let (ws, verified) = match sts {
        Some(sts) => {
            let ws_ref = sts
                .controller
                .as_ref()
                .filter(|o| o.group == "kubeflow.org" && o.kind == "Workspace")?;
            let chain = sts.name == sts_ref.name
                && is_ordinal_pod(&p.name, &sts.name)
                && sts.selector.as_ref().is_some_and(|s| s.matches(&p.labels));
            let ws = claims.workspaces.iter().find(|w| {
                w.owner.namespace == p.namespace
                    && w.owner.uid == ws_ref.uid
                    && w.owner.name == ws_ref.name
            })?;
            (ws, chain && label == Some(&ws.owner.name))
        }
        // Not read yet: the label alone names it, unverified.
        None => (
            claims
                .workspaces
                .iter()
                .find(|w| w.owner.namespace == p.namespace && Some(&w.owner.name) == label)?,
            false,
        ),
    };
    let mut info = ws.owner.clone();
    if let Some(why) = exemption(ws, &claims.workspace_kinds) {
        tracing::debug!(namespace = %p.namespace, workspace = %ws.owner.name, why, "workspace exempt from pausing");
        info.cull_opt_out = true;
    }
    Some(OwnedBy {
        kind: OwnerKind::Workspace,
        info,
        verified,
    })
}

/// Why `ws` must not be paused by its WorkspaceKind's `activityRules`, if it must not.
///
/// Evaluated as the Workspace controller does (`helper.EvaluateActivityRule`): the rules in
/// order, the first whose `effect.pauseWorkspace` is set and whose `match` matches decides
/// (`matchNamespace` AND `matchPodConfig`; an absent match matches every Workspace); `false`
/// exempts, `true` or no deciding rule does not. Fails closed: the ledger has no namespace
/// labels, so a rule with `matchNamespace` met before the deciding one leaves the answer
/// unknown, which exempts; so does a WorkspaceKind that is named but not read.
pub fn exemption(ws: &WorkspaceInfo, kinds: &[WorkspaceKindInfo]) -> Option<&'static str> {
    let Some(kind) = kinds.iter().find(|k| k.name == ws.kind) else {
        return Some("its WorkspaceKind is not known");
    };
    let empty = std::collections::BTreeMap::new();
    let option_labels = kind.pod_config_labels.get(&ws.pod_config).unwrap_or(&empty);
    for rule in &kind.activity_rules {
        let Some(pause) = rule.pause_workspace else {
            continue;
        };
        match rule_matches(rule, option_labels) {
            Some(true) if pause => return None,
            Some(true) => return Some("a WorkspaceKind activityRule says pauseWorkspace: false"),
            Some(false) => {}
            None => return Some("a WorkspaceKind activityRule matches on namespace labels"),
        }
    }
    None
}

/// Whether `rule` matches: `None` when it depends on namespace labels (unknown here).
fn rule_matches(
    rule: &ActivityRule,
    option_labels: &std::collections::BTreeMap<String, String>,
) -> Option<bool> {
    let pod_config = rule
        .pod_config_selector
        .as_ref()
        .is_none_or(|s| s.matches(option_labels));
    match (&rule.namespace_selector, pod_config) {
        // AND: a podConfig mismatch decides without the namespace.
        (_, false) => Some(false),
        (Some(_), true) => None,
        (None, true) => Some(true),
    }
}

/// `pod` is `<set>-<ordinal>`, the name a StatefulSet gives its pods.
fn is_ordinal_pod(pod: &str, set: &str) -> bool {
    pod.strip_prefix(set)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests;
