//! A second culling target through the same seam: a test-only kind registered beside the
//! Notebook, showing that the plan routes a pod to the target that owns it, that the stop patch
//! is that target's, and that the actuator re-checks with that target's checks. Nothing outside
//! the double's own code below is edited for it.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::*;
use crate::cull::actuator::tests::{FakeApi, now};
use crate::cull::actuator::{
    Actuator, CullApi, EventSpec, RecheckError, StopResult, stop_patch, verify_fresh,
};
use crate::cull::backoff::Backoff;
use crate::cull::lease::StaticLeadership;
use crate::cull::plan::{Action, CullMode, CullPolicy, Notice, plan_with};
use crate::cull::target::{Identity, RbacRule, TargetRef};
use crate::cull::webhook::{WebhookFormat, payload};
use crate::ledger::claims::{
    STOP_ANNOTATION, STOP_REASON_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION,
};
use crate::ledger::{Attribution, Ledger, OwnedBy};

/// A test double of a future culling target (shaped like a Notebooks 2.0 Workspace): group
/// `example.com`, stopped by `spec.paused: true`, and one check of its own before a write (a
/// workspace whose name starts with `shared-` is never stopped).
///
/// Its owner rule reads the pod's controller (`PodRow::owner`) and the owner object the ledger
/// attached to the row (`Evidence::owner`), whatever its `OwnerKind`: its rows carry a Notebook
/// owner, as only the pod → StatefulSet → Notebook rule fills the slot in this test. A real
/// second kind needs a claim kind of its own (`claims/kinds.rs`) and a ledger rule that attaches
/// its objects under its own `OwnerKind`; this double stands in for both by reusing the
/// Notebook's, which is why it is offered the row before the Notebook.
struct FakeWorkspace;

static WORKSPACE: Identity = Identity {
    kind: "Workspace",
    group: "example.com",
    versions: &["v1alpha1"],
    plural: "workspaces",
    noun: "workspace",
};

static WORKSPACE_RBAC: [RbacRule; 1] = [RbacRule {
    api_group: "example.com",
    resource: "workspaces",
    verbs: &["get", "patch"],
}];

impl Target for FakeWorkspace {
    fn identity(&self) -> &'static Identity {
        &WORKSPACE
    }

    fn owner<'r>(&self, row: &'r PodRow) -> Option<(&'r TargetInfo, bool)> {
        let controller = row.owner.as_ref().filter(|o| o.kind == WORKSPACE.kind)?;
        row.evidence
            .owner
            .as_ref()
            .filter(|o| o.info.name == controller.name)
            .map(|o| (&o.info, o.verified))
    }

    fn stop_fields(&self, _stop_value: &str) -> serde_json::Value {
        json!({"spec": {"paused": true}})
    }

    fn verify_fresh(&self, fresh: &TargetInfo) -> Result<(), String> {
        if fresh.name.starts_with("shared-") {
            return Err("workspace is shared".into());
        }
        Ok(())
    }

    fn discover<'a>(
        &'a self,
        _client: &'a kube::Client,
    ) -> BoxFuture<'a, Result<Option<ApiResource>, kube::Error>> {
        Box::pin(async { Ok(None) })
    }

    /// gpu-ledger's annotations from metadata; stopped when `spec.paused` is true.
    fn project(&self, object: &DynamicObject) -> TargetInfo {
        let mut info = crate::k8s::notebook(&object.metadata);
        info.stopped = (object.data["spec"]["paused"] == json!(true)).then(|| "paused".into());
        info
    }

    fn rbac(&self) -> &'static [RbacRule] {
        &WORKSPACE_RBAC
    }

    fn restart_hint(&self) -> &'static str {
        "Resume it from the workspaces UI"
    }
}

/// The double and the Notebook, the double offered each row first.
static BOTH: &[&dyn Target] = &[&FakeWorkspace, &Notebook];

fn both() -> CullPolicy {
    CullPolicy {
        targets: Targets::new(BOTH),
        ..CullPolicy::default()
    }
}

/// An owner object `namespace/name` (uid `<name>-uid`) at resourceVersion 7.
fn object(namespace: &str, name: &str) -> TargetInfo {
    TargetInfo::new(namespace, name)
        .with_uid(format!("{name}-uid"))
        .at_version("7")
}

/// A pod of `object` that qualifies for a stop at `now()`: Running and Ready for 5h, idle for
/// 3h, fully and freshly covered.
fn idle_pod_of(pod: &str, object: TargetInfo) -> PodRow {
    let mut row = PodRow::new(object.namespace.clone(), pod)
        .running_on("gpu-1")
        .holding("nvidia.com/gpu", 1)
        .attributed(Attribution::Exclusive)
        .stop_candidate(now(), Duration::hours(5), Duration::hours(3))
        .with_uid(format!("{pod}-uid"));
    row.evidence.owner = Some(OwnedBy::notebook(object, true));
    row
}

/// A Workspace's pod (controlled by the Workspace) and a Notebook's, both idle.
fn ledger() -> Ledger {
    let mut l = Ledger::empty(now());
    l.usage_available = true;
    l.pods = vec![
        idle_pod_of("ws-0", object("team-w", "ws")).owned_by("Workspace", "ws"),
        idle_pod_of("nb-0", object("team-n", "nb")).owned_by("StatefulSet", "nb"),
    ];
    l
}

fn kinds_of(actions: &[Action]) -> Vec<(&str, &'static str)> {
    actions
        .iter()
        .map(|a| (a.notebook(), a.target().identity().kind))
        .collect()
}

#[test]
fn the_registered_targets_are_distinct_and_the_default_list() {
    let keys: std::collections::BTreeSet<_> = TARGETS.iter().map(|t| t.key()).collect();
    assert_eq!(keys.len(), TARGETS.len(), "a kind registered twice");
    assert_eq!(Targets::default(), Targets::new(TARGETS));
    assert_eq!(CullPolicy::default().targets, Targets::default());
    assert_ne!(Targets::new(BOTH), Targets::default());
}

#[test]
fn the_plan_routes_each_pod_to_the_target_that_owns_it() {
    let l = ledger();
    let p = plan_with(&l, &both(), &Backoff::default(), now());
    assert_eq!(
        kinds_of(&p.actions),
        [("nb", "Notebook"), ("ws", "Workspace")],
        "{p:?}"
    );
    let owner = Targets::new(BOTH).owner(&l.pods[0]).expect("owned");
    assert_eq!(owner.target, &FakeWorkspace as &dyn Target);
    assert_eq!((owner.object.name.as_str(), owner.verified), ("ws", true));

    // With the registered list alone (the Notebook only) both pods go to the Notebook: the
    // double's object sits in the slot the Notebook reads (see FakeWorkspace), so what routes
    // the pod is the list of targets the plan is given.
    let registered = plan_with(&l, &CullPolicy::default(), &Backoff::default(), now());
    assert_eq!(
        kinds_of(&registered.actions),
        [("nb", "Notebook"), ("ws", "Notebook")]
    );

    // A notice goes to the owner's target too, and the webhook names its kind.
    let noticed = CullPolicy {
        notice: Duration::minutes(30),
        ..both()
    };
    let p = plan_with(&l, &noticed, &Backoff::default(), now());
    let ws = p
        .notices
        .iter()
        .find(|n| n.object().1 == "ws")
        .expect("a notice for the workspace");
    assert!(matches!(ws, Notice::Schedule { .. }), "{ws:?}");
    assert_eq!(ws.target(), &FakeWorkspace as &dyn Target);
    let body = payload(ws, WebhookFormat::Alertmanager, now());
    let summary = body["commonAnnotations"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.starts_with("Workspace team-w/ws stops at "),
        "{summary}"
    );
}

#[test]
fn a_backoff_of_one_kind_does_not_hold_another_of_the_same_name() {
    let mut backoff = Backoff::default();
    backoff.failed(&FakeWorkspace, "team-w", "ws", "ws-uid", now());
    assert!(backoff.holds(&FakeWorkspace, "team-w", "ws", "ws-uid", now()));
    assert!(!backoff.holds(&Notebook, "team-w", "ws", "nb-ws-uid", now()));
    backoff.failed(&Notebook, "team-w", "ws", "nb-ws-uid", now());
    backoff.succeeded(&Notebook, "team-w", "ws");
    assert!(backoff.holds(&FakeWorkspace, "team-w", "ws", "ws-uid", now()));

    // Only a Notebook named `ws` is left in the ledger: the workspace's entry goes, the
    // Notebook's stays.
    backoff.failed(&Notebook, "team-w", "ws", "nb-ws-uid", now());
    let mut only_notebook = Ledger::empty(now());
    only_notebook.pods = vec![
        idle_pod_of("ws-0", object("team-w", "ws").with_uid("nb-ws-uid"))
            .owned_by("StatefulSet", "ws"),
    ];
    backoff.retain_present(&only_notebook, Targets::new(BOTH));
    assert_eq!(backoff.get(&FakeWorkspace, "team-w", "ws"), None);
    assert!(backoff.get(&Notebook, "team-w", "ws").is_some());
}

#[test]
fn the_stop_patch_is_the_owners_stop_fields_plus_the_audit_annotations() {
    let p = plan_with(&ledger(), &both(), &Backoff::default(), now());
    let ws = p
        .actions
        .iter()
        .find(|a| a.notebook() == "ws")
        .expect("workspace stop");
    assert_eq!(
        stop_patch(ws, "8"),
        json!({
            "metadata": {
                "resourceVersion": "8",
                "annotations": {
                    STOPPED_BY_ANNOTATION: "gpu-ledger",
                    STOPPED_AT_ANNOTATION: "2026-01-31T12:00:00Z",
                    STOP_REASON_ANNOTATION: ws.reason_text(),
                }
            },
            "spec": {"paused": true}
        })
    );
    let nb = p
        .actions
        .iter()
        .find(|a| a.notebook() == "nb")
        .expect("notebook stop");
    let body = stop_patch(nb, "8");
    assert_eq!(
        body["metadata"]["annotations"][STOP_ANNOTATION],
        "2026-01-31T12:00:00Z"
    );
    assert!(body.get("spec").is_none(), "{body}");
}

#[test]
fn verify_uses_the_owners_own_checks() {
    let shared = object("team-w", "shared-ws");
    let as_workspace = Action::notebook_stop("team-w", "shared-ws")
        .of_object(&FakeWorkspace, &shared)
        .idle_for(3.0 * 3600.0, None);
    assert_eq!(
        verify_fresh(&shared, &as_workspace, Duration::hours(1), now()),
        Err("workspace is shared".into())
    );
    let as_notebook = as_workspace.clone().of_object(&Notebook, &shared);
    assert_eq!(
        verify_fresh(&shared, &as_notebook, Duration::hours(1), now()),
        Ok(())
    );
    // The checks every kind gets speak the owner's noun.
    let stopped = TargetInfo {
        stopped: Some("paused".into()),
        ..object("team-w", "ws")
    };
    let ws = as_workspace.of_object(&FakeWorkspace, &stopped);
    assert_eq!(
        verify_fresh(&stopped, &ws, Duration::hours(1), now()),
        Err("workspace is already stopped".into())
    );
}

/// [`FakeApi`], recording the kind each call is about.
#[derive(Default)]
struct KindedApi {
    inner: FakeApi,
    calls: Mutex<Vec<(&'static str, &'static str)>>,
}

impl KindedApi {
    fn saw(&self, call: &'static str, target: &dyn Target) {
        let kind = target.identity().kind;
        self.calls.lock().expect("lock").push((call, kind));
    }
}

impl CullApi for KindedApi {
    fn get<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<TargetInfo>, kube::Error>> {
        self.saw("get", target);
        self.inner.get(target, namespace, name)
    }

    fn patch<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
        dry_run: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.saw("patch", target);
        self.inner.patch(target, namespace, name, body, dry_run)
    }

    fn publish_event<'a>(
        &'a self,
        target: &'a dyn Target,
        object: &'a TargetRef,
        event: &'a EventSpec,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.saw("event", target);
        self.inner.publish_event(target, object, event)
    }

    fn kill_switch<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, kube::Error>> {
        self.inner.kill_switch(namespace, name)
    }

    fn namespaces_matching<'a>(
        &'a self,
        selector: &'a str,
    ) -> BoxFuture<'a, Result<std::collections::BTreeSet<String>, kube::Error>> {
        self.inner.namespaces_matching(selector)
    }
}

async fn execute(api: &Arc<KindedApi>, actions: &[Action], at: DateTime<Utc>) -> Vec<StopResult> {
    let actuator = Actuator::new(api.clone(), false, Duration::hours(1));
    let mut confirm = |_: &Action| async { Ok::<_, RecheckError>(true) };
    actuator
        .execute(
            actions,
            CullMode::On,
            at,
            &mut confirm,
            &StaticLeadership::new(true),
        )
        .await
        .into_iter()
        .map(|o| o.result)
        .collect()
}

#[tokio::test]
async fn the_actuator_reads_checks_and_stops_each_action_as_its_target() {
    let api = Arc::new(KindedApi::default());
    for o in [object("team-w", "ws"), object("team-w", "shared-ws")] {
        api.inner
            .notebooks
            .lock()
            .expect("lock")
            .insert((o.namespace.clone(), o.name.clone()), o);
    }
    let ws = plan_with(&ledger(), &both(), &Backoff::default(), now())
        .actions
        .into_iter()
        .find(|a| a.notebook() == "ws")
        .expect("workspace stop");
    let shared = ws
        .clone()
        .of_object(&FakeWorkspace, &object("team-w", "shared-ws"));

    let results = execute(&api, &[shared, ws], now()).await;
    assert_eq!(results, [StopResult::Changed, StopResult::Stopped]);
    assert_eq!(
        *api.calls.lock().expect("lock"),
        [
            ("get", "Workspace"),
            ("get", "Workspace"),
            ("patch", "Workspace"),
            ("event", "Workspace"),
        ],
        "the shared one is refused by the workspace's own check, before any write"
    );
    let patches = api.inner.patches.lock().expect("lock");
    let [(_, name, body, _)] = patches.as_slice() else {
        panic!("one patch expected: {patches:?}")
    };
    assert_eq!(name, "ws");
    assert_eq!(body["spec"], json!({"paused": true}));
    assert!(
        body["metadata"]["annotations"]
            .get(STOP_ANNOTATION)
            .is_none(),
        "{body}"
    );
    let events = api.inner.events.lock().expect("lock");
    let note = &events.last().expect("the stop's event").1.note;
    assert!(note.contains("Resume it from the workspaces UI"), "{note}");
}

#[test]
fn cull_targets_name_registered_kinds_only() {
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
    // Empty (the default) and every name: all registered targets.
    assert_eq!(Targets::named(&[]).expect("default"), Targets::default());
    let all: Vec<&str> = TARGETS.iter().map(|t| t.identity().noun).collect();
    assert_eq!(
        Targets::named(&names(&all)).expect("all"),
        Targets::default()
    );
    // One: that one alone.
    let only = Targets::named(&names(&["workspace"])).expect("workspace");
    let nouns: Vec<&str> = only.iter().map(|t| t.identity().noun).collect();
    assert_eq!(nouns, vec!["workspace"]);
    // A typo is an error naming it and the known names.
    let err = Targets::named(&names(&["notebok"])).expect_err("typo");
    assert!(
        err.to_string().contains("\"notebok\"") && err.to_string().contains("notebook"),
        "{err}"
    );
}
