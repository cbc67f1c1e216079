//! Unit tests of the culling plan, one per rule, plus property tests over random ledgers.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;

use super::*;
use crate::cull::notebook::Notebook;
use crate::ledger::claims::{NotebookInfo, OwnerKind};
use crate::ledger::{Ledger, OwnedBy, PodRow, PodState};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0)
        .single()
        .expect("valid time")
}

fn notebook(ns: &str, name: &str) -> NotebookInfo {
    NotebookInfo::new(ns, name).at_version("42")
}

/// A notebook pod that qualifies for a stop at `t0()`: idle for `idle_h` hours, up for 10h.
fn idle_row(ns: &str, name: &str, idle_h: i64) -> PodRow {
    let now = t0();
    let mut row = PodRow::new(ns, format!("{name}-0"))
        .running_on("gpu-1")
        .holding("nvidia.com/gpu", 1)
        .attributed(Attribution::Exclusive)
        .stop_candidate(now, Duration::hours(10), Duration::hours(idle_h))
        .with_uid(format!("pod-{ns}-{name}"))
        .of_notebook(notebook(ns, name));
    // Near idle, not exactly: a few sub-threshold readings, the last 30 s ago.
    row.memory_used_bytes = Some(0.0);
    row.evidence.peak = Some(0.008);
    row.evidence.newest_sample_at = Some(now - Duration::seconds(30));
    row
}

fn ledger(pods: Vec<PodRow>) -> Ledger {
    let mut l = Ledger::empty(t0());
    l.usage_available = true;
    l.pods = pods;
    l
}

fn reason_of(row: &PodRow) -> Option<SkipReason> {
    judge(row, &CullPolicy::default(), t0()).err()
}

fn nb_mut(row: &mut PodRow) -> &mut NotebookInfo {
    &mut row.evidence.owner.as_mut().expect("notebook").info
}

#[test]
fn idle_verified_notebook_is_stopped_with_evidence() {
    let p = plan(
        &ledger(vec![idle_row("team-a", "nb", 3)]),
        &CullPolicy::default(),
        t0(),
    );
    assert_eq!(p.candidates, 1);
    assert!(p.skips.is_empty());
    assert_eq!(p.circuit, None);
    let [action] = p.actions.as_slice() else {
        panic!("one action expected: {p:?}")
    };
    let Action::Stop {
        namespace,
        notebook,
        notebook_uid,
        resource_version,
        pod,
        pod_uid,
        stop_value,
        ..
    } = action;
    assert_eq!(
        (namespace.as_str(), notebook.as_str(), pod.as_str()),
        ("team-a", "nb", "nb-0")
    );
    assert_eq!(
        (
            notebook_uid.as_str(),
            pod_uid.as_str(),
            resource_version.as_str()
        ),
        ("nb-team-a-nb", "pod-team-a-nb", "42")
    );
    assert_eq!(stop_value, "2026-01-31T12:00:00Z");
    assert_eq!(
        action.reason_text(),
        "GPU idle for 3h0m (peak utilisation 0.8% over the window)"
    );
}

#[test]
fn human_duration_formats() {
    assert_eq!(human_duration(3.0 * 3600.0 + 12.0 * 60.0 + 59.0), "3h12m");
    assert_eq!(human_duration(59.0), "0m");
    assert_eq!(human_duration(45.0 * 60.0), "45m");
    assert_eq!(human_duration(-5.0), "0m");
    assert_eq!(human_duration(26.0 * 3600.0), "1d2h0m");
}

#[test]
fn pod_without_notebook_is_skipped() {
    let mut r = idle_row("a", "nb", 3);
    r.evidence.owner = None;
    assert_eq!(reason_of(&r), Some(SkipReason::NotNotebook));
}

#[test]
fn each_target_claims_only_owners_of_its_own_kind() {
    // The Notebook target claims only Notebook owners: the same object under another owner
    // kind is the Workspace target's (every kind has a registered target now), never the
    // Notebook's.
    let mut r = idle_row("a", "nb", 3);
    assert!(Notebook.owner(&r).is_some());
    r.evidence.owner.as_mut().expect("notebook").kind = OwnerKind::Workspace;
    assert!(Notebook.owner(&r).is_none());
    assert!(crate::cull::workspace::Workspace.owner(&r).is_some());
    assert!(crate::cull::raycluster::RayCluster.owner(&r).is_none());
    // The JSON's `notebook_stopped` speaks of Notebooks only.
    r.evidence.owner.as_mut().expect("owner").info.stopped = Some("x".into());
    assert_eq!(
        serde_json::to_value(&r).expect("json")["notebook_stopped"],
        false
    );
}

#[test]
fn unverified_owner_is_skipped() {
    let mut r = idle_row("a", "nb", 3);
    r.evidence.owner.as_mut().expect("notebook").verified = false;
    assert_eq!(reason_of(&r), Some(SkipReason::UnverifiedOwner));
}

#[test]
fn deleting_notebook_is_skipped() {
    let mut r = idle_row("a", "nb", 3);
    nb_mut(&mut r).deleting = true;
    assert_eq!(reason_of(&r), Some(SkipReason::Deleting));
}

#[test]
fn any_stop_value_means_hands_off() {
    for value in [
        "2026-01-01T00:00:00Z",
        "odh-notebook-controller-lock",
        "true",
        "",
    ] {
        let mut r = idle_row("a", "nb", 3);
        nb_mut(&mut r).stopped = Some(value.into());
        assert_eq!(reason_of(&r), Some(SkipReason::AlreadyStopped), "{value}");
    }
}

#[test]
fn opt_out_is_honoured() {
    let mut r = idle_row("a", "nb", 3);
    nb_mut(&mut r).cull_opt_out = true;
    assert_eq!(reason_of(&r), Some(SkipReason::OptedOut));
}

#[test]
fn namespace_allow_deny_and_selector_lists() {
    let row = idle_row("a", "nb", 3);
    let now = t0();
    let allow = CullPolicy {
        namespaces: BTreeSet::from(["b".to_string()]),
        ..CullPolicy::default()
    };
    assert_eq!(judge(&row, &allow, now), Err(SkipReason::NamespaceExcluded));
    let allow_a = CullPolicy {
        namespaces: BTreeSet::from(["a".to_string()]),
        ..CullPolicy::default()
    };
    assert_eq!(judge(&row, &allow_a, now), Ok(()));
    let deny = CullPolicy {
        exclude_namespaces: BTreeSet::from(["a".to_string()]),
        ..allow_a.clone()
    };
    assert_eq!(judge(&row, &deny, now), Err(SkipReason::NamespaceExcluded));
    let selector = CullPolicy {
        excluded_namespaces: BTreeSet::from(["a".to_string()]),
        ..CullPolicy::default()
    };
    assert_eq!(
        judge(&row, &selector, now),
        Err(SkipReason::NamespaceExcluded)
    );
}

#[test]
fn snooze_in_future_blocks_and_past_snooze_does_not() {
    let mut r = idle_row("a", "nb", 3);
    nb_mut(&mut r).snooze_until = Some(t0() + Duration::minutes(1));
    assert_eq!(reason_of(&r), Some(SkipReason::Snoozed));
    nb_mut(&mut r).snooze_until = Some(t0());
    assert_eq!(reason_of(&r), None);
}

#[test]
fn a_culling_annotation_that_is_not_understood_holds_back() {
    use crate::ledger::claims::{
        CULL_OPT_OUT_ANNOTATION, SNOOZE_ANNOTATION, STOPPED_AT_ANNOTATION,
    };
    for key in [
        SNOOZE_ANNOTATION,
        STOPPED_AT_ANNOTATION,
        CULL_OPT_OUT_ANNOTATION,
    ] {
        let mut r = idle_row("a", "nb", 3);
        // A malformed snooze reads as no snooze; it must not read as "go ahead".
        nb_mut(&mut r).invalid_annotations = vec![key];
        assert_eq!(reason_of(&r), Some(SkipReason::InvalidAnnotation), "{key}");
        let p = plan(&ledger(vec![r]), &CullPolicy::default(), t0());
        assert!(p.actions.is_empty(), "{key}: {:?}", p.actions);
        assert_eq!(p.candidates, 0);
        assert_eq!(p.skips[0].reason, SkipReason::InvalidAnnotation);
        assert_eq!(p.skips[0].notebook.as_deref(), Some("nb"));
    }
    // A stopped or deleting notebook keeps its more telling reason.
    let mut r = idle_row("a", "nb", 3);
    nb_mut(&mut r).invalid_annotations = vec![SNOOZE_ANNOTATION];
    nb_mut(&mut r).stopped = Some("2026-01-01T00:00:00Z".into());
    assert_eq!(reason_of(&r), Some(SkipReason::AlreadyStopped));
}

#[test]
fn recent_activity_vetoes_the_stop_and_names_time_and_source() {
    use crate::ledger::claims::LAST_ACTIVITY_ANNOTATION;
    // Idle GPU for 3h, idle threshold 2h (the default).
    let with_activity = |ago: Duration| {
        let mut r = idle_row("a", "nb", 3);
        nb_mut(&mut r).last_activity = Some(t0() - ago);
        r
    };
    let just_inside = with_activity(Duration::hours(2) - Duration::seconds(1));
    assert_eq!(reason_of(&just_inside), Some(SkipReason::RecentActivity));
    let p = plan(
        &ledger(vec![just_inside.clone()]),
        &CullPolicy::default(),
        t0(),
    );
    assert!(p.actions.is_empty(), "{p:?}");
    assert_eq!(p.candidates, 0);
    assert_eq!(
        p.skips[0].detail.as_deref(),
        Some(
            "recent activity at 2026-01-31T10:00:01Z \
             (notebooks.kubeflow.org/last-activity)"
        )
    );
    // The boundary: activity exactly idle_after ago no longer vetoes (as idleness of exactly
    // idle_after qualifies); older, or none recorded, neither.
    for ago in [Duration::hours(2), Duration::hours(5)] {
        assert_eq!(reason_of(&with_activity(ago)), None, "{ago}");
    }
    assert_eq!(reason_of(&idle_row("a", "nb", 3)), None);
    // Activity in the future (clock skew) is recent.
    assert_eq!(
        reason_of(&with_activity(-Duration::minutes(1))),
        Some(SkipReason::RecentActivity)
    );
    // The threshold is the policy's.
    let short = CullPolicy {
        idle_after: Duration::minutes(30),
        ..CullPolicy::default()
    };
    assert_eq!(
        judge(&with_activity(Duration::hours(1)), &short, t0()),
        Ok(())
    );
    // Other reasons stay more telling: a busy GPU is not_idle, not recent_activity.
    let mut busy = with_activity(Duration::minutes(1));
    busy.idle = Some(false);
    assert_eq!(reason_of(&busy), Some(SkipReason::NotIdle));
    // With the veto off, GPU idleness alone decides, and a bad value is not read at all.
    let off = CullPolicy {
        respect_activity: false,
        ..CullPolicy::default()
    };
    assert_eq!(judge(&just_inside, &off, t0()), Ok(()));
    let mut unparsable = idle_row("a", "nb", 3);
    nb_mut(&mut unparsable).invalid_annotations = vec![LAST_ACTIVITY_ANNOTATION];
    assert_eq!(judge(&unparsable, &off, t0()), Ok(()));
    // With it on, a value not understood fails closed like our own annotations.
    assert_eq!(reason_of(&unparsable), Some(SkipReason::InvalidAnnotation));
}

#[test]
fn recent_activity_cancels_the_notice() {
    let mut row = with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    nb_mut(&mut row).last_activity = Some(t0() - Duration::minutes(10));
    assert_eq!(
        cancel_of(row, &notice_policy()).0,
        CancelReason::RecentActivity
    );
}

/// A backoff that holds `rows`' notebooks after one failed stop at `t0()`.
fn backoff_for(rows: &[&PodRow]) -> Backoff {
    let mut b = Backoff::default();
    for r in rows {
        let nb = &r.evidence.owner.as_ref().expect("notebook").info;
        b.failed(
            &Notebook,
            &r.namespace,
            &nb.name,
            &nb.uid,
            t0() - Duration::seconds(30),
        );
    }
    b
}

#[test]
fn a_backed_off_candidate_takes_no_cap_and_the_next_is_chosen() {
    // The failing notebook is the longest idle: without backoff it takes the only slot.
    let forbidden = idle_row("team-a", "forbidden", 9);
    let allowed = idle_row("team-b", "allowed", 3);
    let policy = CullPolicy {
        max_per_cycle: 1,
        ..CullPolicy::default()
    };
    let l = ledger(vec![forbidden.clone(), allowed.clone()]);
    let p = plan_with(&l, &policy, &Backoff::default(), t0());
    assert_eq!(
        p.actions.iter().map(Action::notebook).collect::<Vec<_>>(),
        ["forbidden"]
    );

    let backoff = backoff_for(&[&forbidden]);
    let p = plan_with(&l, &policy, &backoff, t0());
    assert_eq!(
        p.actions.iter().map(Action::notebook).collect::<Vec<_>>(),
        ["allowed"],
        "{p:?}"
    );
    assert_eq!(
        p.candidates, 2,
        "a backed-off notebook is still a candidate"
    );
    assert_eq!(
        p.skips
            .iter()
            .map(|s| (s.notebook.as_deref(), s.reason))
            .collect::<Vec<_>>(),
        [(Some("forbidden"), SkipReason::Backoff)]
    );

    // Nor does it take its namespace's one stop.
    let sibling = idle_row("team-a", "sibling", 3);
    let l = ledger(vec![forbidden.clone(), sibling]);
    let p = plan_with(&l, &CullPolicy::default(), &backoff, t0());
    assert_eq!(
        p.actions.iter().map(Action::notebook).collect::<Vec<_>>(),
        ["sibling"],
        "{p:?}"
    );

    // The circuit breaker still wins: nothing is stopped, the reason says why.
    let mut down = ledger(vec![forbidden.clone(), allowed]);
    down.usage_available = false;
    let p = plan_with(&down, &policy, &backoff, t0());
    assert!(p.actions.is_empty());
    assert!(
        p.skips.iter().all(|s| s.reason == SkipReason::CircuitOpen),
        "{p:?}"
    );

    // A notebook re-created under the same name (another uid) is not held.
    let mut recreated = forbidden;
    nb_mut(&mut recreated).uid = "nb-new-uid".into();
    let p = plan_with(&ledger(vec![recreated]), &policy, &backoff, t0());
    assert_eq!(p.actions.len(), 1, "{p:?}");
}

#[test]
fn backoff_doubles_per_failure_and_ends_by_cycles_or_after_an_hour() {
    let (ns, name, uid) = ("team-a", "nb", "nb-uid");
    let mut b = Backoff::default();
    let mut now = t0();
    // Failure k sits out 2^(k-1) cycles; the cycle after that retries.
    for expected in [1_u64, 2, 4, 8] {
        assert_eq!(
            b.failed(&Notebook, ns, name, uid, now).cycles_left,
            expected
        );
        for _ in 0..expected {
            now += Duration::seconds(30);
            assert!(b.holds(&Notebook, ns, name, uid, now));
            b.tick();
        }
        now += Duration::seconds(30);
        assert!(
            !b.holds(&Notebook, ns, name, uid, now),
            "retried after {expected} cycles"
        );
    }
    // Never held longer than an hour after the last failure, however many cycles are left.
    for _ in 0..40 {
        b.failed(&Notebook, ns, name, uid, now);
    }
    assert!(b.holds(&Notebook, ns, name, uid, now + Duration::minutes(59)));
    assert!(!b.holds(&Notebook, ns, name, uid, now + Duration::hours(1)));
    assert_eq!(b.held(now), 1);
    // Success clears it; so does the notebook leaving the ledger or changing uid.
    b.succeeded(&Notebook, ns, name);
    assert!(!b.holds(&Notebook, ns, name, uid, now));
    assert_eq!(
        b.failed(&Notebook, ns, name, uid, now).failures,
        1,
        "counting starts afresh"
    );
    let row = idle_row(ns, name, 3);
    let nb_uid = row.evidence.owner.as_ref().expect("nb").info.uid.clone();
    b.failed(&Notebook, ns, name, &nb_uid, now);
    b.retain_present(&ledger(vec![row.clone()]), Targets::default());
    assert!(
        b.holds(&Notebook, ns, name, &nb_uid, now),
        "still in the ledger: kept"
    );
    let mut other = row;
    nb_mut(&mut other).uid = "replaced".into();
    b.retain_present(&ledger(vec![other]), Targets::default());
    assert_eq!(b.get(&Notebook, ns, name), None, "replaced: forgotten");
    b.failed(&Notebook, ns, name, &nb_uid, now);
    b.retain_present(&ledger(Vec::new()), Targets::default());
    assert_eq!(b.get(&Notebook, ns, name), None, "gone: forgotten");
}

#[test]
fn only_running_ready_pods_qualify() {
    let mut terminating = idle_row("a", "nb", 3);
    terminating.state = PodState::Terminating;
    assert_eq!(reason_of(&terminating), Some(SkipReason::NotReady));
    let mut unready = idle_row("a", "nb", 3);
    unready.evidence.ready_since = None;
    assert_eq!(reason_of(&unready), Some(SkipReason::NotReady));
    let mut pending = idle_row("a", "nb", 3);
    pending.state = PodState::Pending;
    let p = plan(&ledger(vec![pending]), &CullPolicy::default(), t0());
    assert!(p.actions.is_empty() && p.skips.is_empty() && p.candidates == 0);
}

#[test]
fn young_pods_are_skipped_from_later_of_start_and_ready() {
    let mut r = idle_row("a", "nb", 3);
    r.evidence.ready_since = Some(t0() - Duration::minutes(59));
    assert_eq!(reason_of(&r), Some(SkipReason::TooYoung));
    r.evidence.ready_since = Some(t0() - Duration::hours(5));
    r.evidence.started_at = Some(t0() - Duration::minutes(30));
    assert_eq!(reason_of(&r), Some(SkipReason::TooYoung));
    r.evidence.started_at = None;
    assert_eq!(reason_of(&r), None);
    r.evidence.ready_since = Some(t0() - Duration::hours(1));
    assert_eq!(reason_of(&r), None, "min_runtime is inclusive");
}

#[test]
fn restart_grace_after_our_own_stop() {
    let mut r = idle_row("a", "nb", 3);
    nb_mut(&mut r).last_stopped_by_us = Some(t0() - Duration::minutes(10));
    assert_eq!(reason_of(&r), Some(SkipReason::RestartGrace));
    nb_mut(&mut r).last_stopped_by_us = Some(t0() - Duration::hours(2));
    assert_eq!(reason_of(&r), None);
}

#[test]
fn shared_and_unattributed_gpus_are_never_culled() {
    let mut r = idle_row("a", "nb", 3);
    r.attribution = Attribution::Shared;
    assert_eq!(reason_of(&r), Some(SkipReason::SharedGpu));
    r.attribution = Attribution::Unattributed;
    assert_eq!(reason_of(&r), Some(SkipReason::Unattributed));
    r.attribution = Attribution::Mig;
    assert_eq!(reason_of(&r), None);
}

#[test]
fn busy_or_unknown_or_short_idle_is_skipped() {
    let mut busy = idle_row("a", "nb", 3);
    busy.idle = Some(false);
    assert_eq!(reason_of(&busy), Some(SkipReason::NotIdle));
    let mut unknown = idle_row("a", "nb", 3);
    unknown.idle = None;
    assert_eq!(reason_of(&unknown), Some(SkipReason::IdleUnknown));
    let short = idle_row("a", "nb", 1);
    assert_eq!(reason_of(&short), Some(SkipReason::IdleTooShort));
    let mut no_seconds = idle_row("a", "nb", 3);
    no_seconds.idle_seconds = None;
    assert_eq!(reason_of(&no_seconds), Some(SkipReason::IdleTooShort));
}

#[test]
fn partial_coverage_and_missing_devices_are_skipped() {
    let mut low = idle_row("a", "nb", 3);
    low.evidence.coverage = Some(0.89);
    assert_eq!(reason_of(&low), Some(SkipReason::PartialCoverage));
    let mut none = idle_row("a", "nb", 3);
    none.evidence.coverage = None;
    assert_eq!(reason_of(&none), Some(SkipReason::PartialCoverage));
    let mut missing = idle_row("a", "nb", 3);
    missing.evidence.devices_expected = 2;
    assert_eq!(reason_of(&missing), Some(SkipReason::PartialCoverage));
}

#[test]
fn stale_data_is_skipped() {
    let mut r = idle_row("a", "nb", 3);
    r.evidence.newest_sample_at = Some(t0() - Duration::minutes(3));
    assert_eq!(reason_of(&r), Some(SkipReason::StaleData));
    r.evidence.newest_sample_at = None;
    assert_eq!(reason_of(&r), Some(SkipReason::StaleData));
}

#[test]
fn one_stop_per_namespace_longest_idle_first() {
    let l = ledger(vec![
        idle_row("a", "short", 3),
        idle_row("a", "long", 9),
        idle_row("b", "x", 4),
    ]);
    let p = plan(&l, &CullPolicy::default(), t0());
    let stopped: Vec<&str> = p.actions.iter().map(Action::notebook).collect();
    assert_eq!(stopped, ["long", "x"]);
    assert_eq!(p.candidates, 3);
    assert_eq!(p.skips.len(), 1);
    assert_eq!(p.skips[0].reason, SkipReason::PerNamespaceCap);
    assert_eq!(p.skips[0].notebook.as_deref(), Some("short"));
}

#[test]
fn per_cycle_cap_limits_stops() {
    let rows: Vec<PodRow> = (0..5)
        .map(|i| idle_row(&format!("ns{i}"), "nb", 3 + i))
        .collect();
    let policy = CullPolicy {
        max_per_cycle: 2,
        max_idle_share: 1.0,
        ..CullPolicy::default()
    };
    let p = plan(&ledger(rows), &policy, t0());
    let ns: Vec<&str> = p.actions.iter().map(Action::namespace).collect();
    assert_eq!(ns, ["ns4", "ns3"]);
    assert_eq!(
        p.skips
            .iter()
            .filter(|s| s.reason == SkipReason::PerCycleCap)
            .count(),
        3
    );
    let zero = CullPolicy {
        max_per_cycle: 0,
        ..CullPolicy::default()
    };
    assert!(
        plan(&ledger(vec![idle_row("a", "nb", 3)]), &zero, t0())
            .actions
            .is_empty()
    );
}

#[test]
fn circuit_opens_without_usage() {
    let mut l = ledger(vec![idle_row("a", "nb", 3)]);
    l.usage_available = false;
    let p = plan(&l, &CullPolicy::default(), t0());
    assert_eq!(p.circuit, Some(CircuitReason::UsageUnavailable));
    assert!(p.actions.is_empty());
    assert_eq!(p.candidates, 1);
    assert_eq!(p.skips[0].reason, SkipReason::CircuitOpen);
}

#[test]
fn circuit_opens_when_idle_share_jumps() {
    let mut rows: Vec<PodRow> = (0..5)
        .map(|i| idle_row(&format!("ns{i}"), "nb", 3))
        .collect();
    let p = plan(&ledger(rows.clone()), &CullPolicy::default(), t0());
    assert_eq!(p.circuit, Some(CircuitReason::IdleShare));
    assert!(p.actions.is_empty());
    // 4 of 5 idle = 0.8: not above the limit.
    rows[0].idle = Some(false);
    let p = plan(&ledger(rows.clone()), &CullPolicy::default(), t0());
    assert_eq!(p.circuit, None);
    assert_eq!(p.actions.len(), 3);
    // Fewer pods than circuit_min_pods: the share rule does not apply.
    let p = plan(&ledger(rows[1..].to_vec()), &CullPolicy::default(), t0());
    assert_eq!(p.circuit, None);
}

#[test]
fn idle_share_breaker_ignores_clusters_with_one_or_two_cards() {
    // Six idle notebooks time-sliced or MIG-partitioned onto cards: 6 pods, all idle.
    for (cards, pods) in [(1.0, 6), (2.0, 6), (2.0, 10)] {
        let rows: Vec<PodRow> = (0..pods)
            .map(|i| {
                let mut r = idle_row(&format!("ns{i}"), "nb", 3);
                r.gpus = cards / f64::from(pods);
                r
            })
            .collect();
        let p = plan(&ledger(rows), &CullPolicy::default(), t0());
        assert_eq!(p.circuit, None, "{cards} card(s), {pods} pods");
        assert_eq!(p.actions.len(), 3, "culling goes on, within the caps");
    }
    // Three whole cards, all idle: the breaker applies again.
    let rows: Vec<PodRow> = (0..6)
        .map(|i| {
            let mut r = idle_row(&format!("ns{i}"), "nb", 3);
            r.gpus = 0.5;
            r
        })
        .collect();
    let p = plan(&ledger(rows), &CullPolicy::default(), t0());
    assert_eq!(p.circuit, Some(CircuitReason::IdleShare));
}

#[test]
fn open_circuit_turns_every_action_into_a_skip() {
    let rows = vec![idle_row("a", "nb", 3), idle_row("b", "nb", 4)];
    let mut p = plan(&ledger(rows), &CullPolicy::default(), t0());
    assert_eq!(p.actions.len(), 2);
    open_circuit(&mut p, CircuitReason::ClaimsStale);
    assert!(p.actions.is_empty());
    assert_eq!(p.circuit, Some(CircuitReason::ClaimsStale));
    assert_eq!(p.candidates, 2, "still candidates");
    let held: Vec<_> = p
        .skips
        .iter()
        .filter(|s| s.reason == SkipReason::CircuitOpen)
        .map(|s| (s.namespace.as_str(), s.notebook.as_deref()))
        .collect();
    assert_eq!(held, [("b", Some("nb")), ("a", Some("nb"))]);
    // An open circuit keeps its first reason.
    let mut l = ledger(vec![idle_row("a", "nb", 3)]);
    l.usage_available = false;
    let mut p = plan(&l, &CullPolicy::default(), t0());
    open_circuit(&mut p, CircuitReason::ClaimsStale);
    assert_eq!(p.circuit, Some(CircuitReason::UsageUnavailable));
}

#[test]
fn circuit_opens_when_attribution_is_lost() {
    let mut rows: Vec<PodRow> = (0..6)
        .map(|i| idle_row(&format!("ns{i}"), "nb", 3))
        .collect();
    for r in rows.iter_mut().take(4) {
        r.attribution = Attribution::Unattributed;
        r.idle = None;
    }
    let p = plan(&ledger(rows), &CullPolicy::default(), t0());
    assert_eq!(p.circuit, Some(CircuitReason::UnattributedShare));
    assert!(p.actions.is_empty());
}

#[test]
fn reasons_have_unique_labels() {
    let labels: BTreeSet<&str> = SkipReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), SkipReason::ALL.len());
    let circuit: BTreeSet<&str> = CircuitReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(circuit.len(), CircuitReason::ALL.len());
}

// === property tests ===

fn arb_time_offset() -> impl Strategy<Value = Option<i64>> {
    // Seconds before t0 (negative = in the future), or unknown.
    prop_oneof![1 => Just(None), 6 => (-3_600_i64..20 * 3_600).prop_map(Some)]
}

fn arb_notebook() -> impl Strategy<Value = Option<(NotebookInfo, bool)>> {
    let nb = (
        prop::option::weighted(
            0.15,
            prop_oneof![
                Just("2026-01-01T00:00:00Z".to_string()),
                Just("odh-notebook-controller-lock".to_string())
            ],
        ),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        arb_time_offset(),
        arb_time_offset(),
        prop::bool::weighted(0.85),
        0_u8..4,
        prop::bool::weighted(0.1),
        arb_time_offset(),
    );
    prop::option::weighted(
        0.9,
        nb.prop_map(
            |(stopped, deleting, opt_out, snooze, last_stop, verified, n, invalid, activity)| {
                let mut info = notebook("x", &format!("nb{n}"));
                if invalid {
                    info.invalid_annotations = vec![crate::ledger::claims::SNOOZE_ANNOTATION];
                }
                info.stopped = stopped;
                info.deleting = deleting;
                info.cull_opt_out = opt_out;
                // Snoozes are mostly absent; when present, anywhere around now.
                info.snooze_until = snooze
                    .filter(|s| s % 3 == 0)
                    .map(|s| t0() - Duration::seconds(s));
                info.last_stopped_by_us = last_stop
                    .filter(|s| s % 2 == 0)
                    .map(|s| t0() - Duration::seconds(s));
                // Activity is recorded only where the Kubeflow culler runs: often absent.
                info.last_activity = activity
                    .filter(|s| s % 2 == 1)
                    .map(|s| t0() - Duration::seconds(s));
                (info, verified)
            },
        ),
    )
}

fn arb_row() -> impl Strategy<Value = PodRow> {
    let facts = (
        0_u8..6,
        prop_oneof![
            Just(PodState::Pending),
            Just(PodState::Running),
            Just(PodState::Running),
            Just(PodState::Terminating)
        ],
        prop_oneof![
            4 => Just(Attribution::Exclusive),
            2 => Just(Attribution::Mig),
            1 => Just(Attribution::Shared),
            1 => Just(Attribution::Unattributed),
            1 => Just(Attribution::None)
        ],
        prop::option::weighted(0.9, prop::bool::weighted(0.7)),
        prop::option::weighted(0.9, 0.0_f64..30.0 * 3600.0),
        arb_notebook(),
    );
    let evidence = (
        arb_time_offset(),
        arb_time_offset(),
        prop::option::weighted(0.9, 0.5_f64..=1.0),
        prop::option::weighted(0.9, -60_i64..600),
        0_usize..3,
        0_usize..3,
        0_u32..1000,
    );
    (facts, evidence).prop_map(
        |(
            (ns, state, attribution, idle, idle_s, nb),
            (start, ready, cov, fresh, found, expected, id),
        )| {
            let ns = format!("ns{ns}");
            let mut row = idle_row(&ns, "nb", 3);
            row.pod = format!("pod{id}");
            row.state = state;
            row.attribution = attribution;
            row.idle = idle;
            row.idle_seconds = idle_s;
            row.evidence.uid = format!("uid{id}");
            row.evidence.owner = nb.map(|(mut info, v)| {
                info.namespace.clone_from(&ns);
                info.uid = format!("nb-{ns}-{}", info.name);
                OwnedBy::notebook(info, v)
            });
            row.notebook = row.evidence.owner.as_ref().map(|o| o.info.name.clone());
            row.evidence.started_at = start.map(|s| t0() - Duration::seconds(s));
            row.evidence.ready_since = ready.map(|s| t0() - Duration::seconds(s));
            row.evidence.coverage = cov;
            row.evidence.newest_sample_at = fresh.map(|s| t0() - Duration::seconds(s));
            row.evidence.devices_found = found;
            row.evidence.devices_expected = expected;
            row
        },
    )
}

fn arb_ledger() -> impl Strategy<Value = Ledger> {
    (
        prop::collection::vec(arb_row(), 0..24),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(mut pods, usage)| {
            // Pod names and uids are unique in a real ledger.
            for (i, p) in pods.iter_mut().enumerate() {
                p.pod = format!("pod{i}");
                p.evidence.uid = format!("uid{i}");
            }
            pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
            let mut l = ledger(pods);
            l.usage_available = usage;
            l
        })
}

fn arb_policy() -> impl Strategy<Value = CullPolicy> {
    (
        0_usize..5,
        0.6_f64..1.0,
        prop::collection::btree_set(
            prop_oneof![Just("ns1".to_string()), Just("ns2".to_string())],
            0..2,
        ),
        0_i64..4,
        prop::bool::weighted(0.8),
    )
        .prop_map(
            |(cap, idle_share, excluded, idle_h, respect_activity)| CullPolicy {
                max_per_cycle: cap,
                max_idle_share: idle_share,
                exclude_namespaces: excluded,
                idle_after: Duration::hours(idle_h),
                respect_activity,
                ..CullPolicy::default()
            },
        )
}

/// Independent restatement of the candidate rules, for the property tests.
fn safe_to_stop(row: &PodRow, policy: &CullPolicy, now: DateTime<Utc>) -> bool {
    let Some(OwnedBy {
        info: nb,
        verified: true,
        ..
    }) = &row.evidence.owner
    else {
        return false;
    };
    let ev = &row.evidence;
    let idle_after = policy.idle_after.num_seconds() as f64;
    let runtime_ok = match (ev.ready_since, ev.started_at) {
        (Some(r), s) => {
            let since = [Some(r), s, nb.last_stopped_by_us]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(r);
            now - since >= policy.min_runtime
        }
        (None, _) => false,
    };
    row.state == PodState::Running
        && runtime_ok
        && matches!(row.attribution, Attribution::Exclusive | Attribution::Mig)
        && row.idle == Some(true)
        && row.idle_seconds.is_some_and(|s| s >= idle_after)
        && ev.coverage.is_some_and(|c| c >= policy.min_coverage)
        && ev.devices_found >= ev.devices_expected
        && ev.devices_expected > 0
        && ev
            .newest_sample_at
            .is_some_and(|t| now - t <= policy.max_staleness)
        && nb.stopped.is_none()
        && !nb.deleting
        && !nb.cull_opt_out
        && nb.invalid_annotations.is_empty()
        && nb.snooze_until.is_none_or(|s| s <= now)
        && (!policy.respect_activity
            || nb
                .last_activity
                .is_none_or(|a| now - a >= policy.idle_after))
        && !policy.exclude_namespaces.contains(&row.namespace)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn plan_never_stops_what_it_must_not(l in arb_ledger(), policy in arb_policy()) {
        let now = t0();
        let p = plan(&l, &policy, now);
        // Caps.
        prop_assert!(p.actions.len() <= policy.max_per_cycle);
        let mut namespaces = BTreeSet::new();
        for a in &p.actions {
            prop_assert!(namespaces.insert(a.namespace().to_string()), "two stops in {}", a.namespace());
        }
        // Circuit.
        if p.circuit.is_some() || !l.usage_available {
            prop_assert!(p.actions.is_empty());
        }
        if !l.usage_available {
            prop_assert_eq!(p.circuit, Some(CircuitReason::UsageUnavailable));
        }
        // Every action is backed by a row that passes every rule.
        for a in &p.actions {
            let Action::Stop { pod_uid, notebook_uid, .. } = a;
            let row = l.pods.iter().find(|r| &r.evidence.uid == pod_uid);
            prop_assert!(row.is_some());
            let row = row.expect("checked");
            prop_assert!(safe_to_stop(row, &policy, now), "unsafe stop of {:?}", row);
            prop_assert_eq!(&row.evidence.owner.as_ref().expect("notebook").info.uid, notebook_uid);
        }
        // Accounting: every GPU-holding pod is either acted on or skipped, exactly once.
        let holding = l.pods.iter().filter(|r| r.state.holds()).count();
        prop_assert_eq!(p.actions.len() + p.skips.len(), holding);
        prop_assert!(p.candidates >= p.actions.len());
        // Determinism, also under a different input order.
        prop_assert_eq!(&plan(&l, &policy, now), &p);
        let mut reversed = l.clone();
        reversed.pods.reverse();
        prop_assert_eq!(plan(&reversed, &policy, now).actions, p.actions.clone());
    }

    #[test]
    fn held_notebooks_are_never_stopped_and_free_their_slots(
        l in arb_ledger(),
        policy in arb_policy(),
        mask in any::<u32>(),
    ) {
        let now = t0();
        let mut backoff = Backoff::default();
        for (i, row) in l.pods.iter().enumerate() {
            if let Some(OwnedBy { info: nb, .. }) = &row.evidence.owner
                && mask & (1 << (i % 32)) != 0
            {
                backoff.failed(&Notebook, &row.namespace, &nb.name, &nb.uid, now - Duration::seconds(1));
            }
        }
        let held = plan_with(&l, &policy, &backoff, now);
        let free = plan(&l, &policy, now);
        prop_assert!(held.actions.len() <= policy.max_per_cycle);
        prop_assert_eq!(held.candidates, free.candidates);
        prop_assert_eq!(held.circuit, free.circuit);
        for a in &held.actions {
            let Action::Stop { namespace, notebook, notebook_uid, .. } = a;
            prop_assert!(!backoff.holds(&Notebook, namespace, notebook, notebook_uid, now), "held {}", notebook);
        }
        // Held candidates give their slots to the others: one stop per namespace that has an
        // unheld candidate, up to the cap.
        if held.circuit.is_none() {
            let unheld_namespaces: BTreeSet<&str> = held
                .actions
                .iter()
                .map(Action::namespace)
                .chain(held.skips.iter().filter(|s| {
                    matches!(s.reason, SkipReason::PerCycleCap | SkipReason::PerNamespaceCap)
                }).map(|s| s.namespace.as_str()))
                .collect();
            prop_assert_eq!(
                held.actions.len(),
                unheld_namespaces.len().min(policy.max_per_cycle)
            );
        }
        let holding = l.pods.iter().filter(|r| r.state.holds()).count();
        prop_assert_eq!(held.actions.len() + held.skips.len(), holding);
    }

    #[test]
    fn candidates_are_exactly_the_safe_pods(l in arb_ledger(), policy in arb_policy()) {
        let now = t0();
        let p = plan(&l, &policy, now);
        // Notebooks with a GPU-holding pod that is not safe to stop are not idle.
        let busy: BTreeSet<(String, String)> = l
            .pods
            .iter()
            .filter(|r| r.state.holds() && !safe_to_stop(r, &policy, now))
            .filter_map(|r| r.evidence.owner.as_ref().map(|o| (r.namespace.clone(), o.info.uid.clone())))
            .collect();
        let safe = l
            .pods
            .iter()
            .filter(|r| safe_to_stop(r, &policy, now))
            .filter(|r| {
                let nb = &r.evidence.owner.as_ref().expect("safe rows have a notebook").info;
                !busy.contains(&(r.namespace.clone(), nb.uid.clone()))
            })
            .count();
        prop_assert_eq!(p.candidates, safe);
    }
}

#[test]
fn a_notebook_is_stopped_only_when_all_its_pods_are_idle() {
    // Two pods of one notebook (a StatefulSet scaled to 2): one idle, one busy.
    let idle = idle_row("team-ml", "alice-nb", 3);
    let mut busy = idle_row("team-ml", "alice-nb", 3);
    busy.pod = "alice-nb-1".into();
    busy.evidence.uid = "pod-team-ml-alice-nb-1".into();
    busy.idle = Some(false);
    busy.idle_seconds = Some(0.0);
    busy.evidence.peak = Some(0.9);
    let p = plan(
        &ledger(vec![idle.clone(), busy]),
        &CullPolicy::default(),
        t0(),
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        p.skips
            .iter()
            .any(|s| s.pod == "alice-nb-0" && s.reason == SkipReason::NotebookPodBusy),
        "{:?}",
        p.skips
    );
    // Both idle: one stop for the notebook, not two.
    let mut second = idle.clone();
    second.pod = "alice-nb-1".into();
    second.evidence.uid = "pod-team-ml-alice-nb-1".into();
    let p = plan(&ledger(vec![idle, second]), &CullPolicy::default(), t0());
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
}

// === notice before a stop (`--cull-notice`) ===

fn notice_policy() -> CullPolicy {
    CullPolicy {
        notice: Duration::minutes(10),
        ..CullPolicy::default()
    }
}

fn with_notice(mut row: PodRow, at: DateTime<Utc>) -> PodRow {
    nb_mut(&mut row).stop_scheduled_at = Some(at);
    row
}

fn only_notice(p: &Plan) -> &Notice {
    let [n] = p.notices.as_slice() else {
        panic!("one notice expected: {p:?}")
    };
    n
}

#[test]
fn without_notice_the_plan_is_unchanged_even_with_a_notice_annotation() {
    let plain = plan(
        &ledger(vec![idle_row("team-a", "nb", 3)]),
        &CullPolicy::default(),
        t0(),
    );
    assert_eq!(plain.actions.len(), 1);
    assert!(plain.notices.is_empty());
    // A notice left from an earlier configuration neither delays nor cancels anything.
    let annotated = plan(
        &ledger(vec![with_notice(
            idle_row("team-a", "nb", 3),
            t0() + Duration::hours(1),
        )]),
        &CullPolicy::default(),
        t0(),
    );
    assert_eq!(annotated, plain);
}

#[test]
fn a_new_candidate_gets_a_notice_not_a_stop() {
    let p = plan(
        &ledger(vec![idle_row("team-a", "nb", 3)]),
        &notice_policy(),
        t0(),
    );
    assert!(p.actions.is_empty(), "{p:?}");
    assert_eq!(p.candidates, 1);
    let Notice::Schedule {
        namespace,
        notebook,
        notebook_uid,
        pod,
        stop_at,
        ..
    } = only_notice(&p)
    else {
        panic!("a schedule expected: {p:?}")
    };
    assert_eq!(
        (
            namespace.as_str(),
            notebook.as_str(),
            notebook_uid.as_str(),
            pod.as_str()
        ),
        ("team-a", "nb", "nb-team-a-nb", "nb-0")
    );
    assert_eq!(*stop_at, t0() + Duration::minutes(10));
    assert_eq!(reasons(&p), vec![SkipReason::NoticePending]);
}

fn reasons(p: &Plan) -> Vec<SkipReason> {
    p.skips.iter().map(|s| s.reason).collect()
}

#[test]
fn a_notice_that_has_not_run_out_waits_without_a_second_notice() {
    let row = with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    let p = plan(&ledger(vec![row]), &notice_policy(), t0());
    assert!(p.actions.is_empty() && p.notices.is_empty(), "{p:?}");
    assert_eq!(reasons(&p), vec![SkipReason::NoticePending]);
}

#[test]
fn a_notice_that_has_run_out_becomes_the_stop() {
    for due in [t0(), t0() - Duration::seconds(1)] {
        let row = with_notice(idle_row("team-a", "nb", 3), due);
        let p = plan(&ledger(vec![row]), &notice_policy(), t0());
        assert_eq!(p.actions.len(), 1, "due {due}: {p:?}");
        assert!(p.notices.is_empty() && p.skips.is_empty(), "{p:?}");
    }
}

#[test]
fn the_notice_never_shortens_idle_after() {
    // Idle for 1h59m of the 2h: no notice yet (the notice starts once it qualifies).
    let mut row = idle_row("team-a", "nb", 2);
    row.idle_seconds = Some(2.0 * 3600.0 - 60.0);
    let p = plan(&ledger(vec![row]), &notice_policy(), t0());
    assert!(p.actions.is_empty() && p.notices.is_empty(), "{p:?}");
    assert_eq!(reasons(&p), vec![SkipReason::IdleTooShort]);
}

fn cancel_of(row: PodRow, policy: &CullPolicy) -> (CancelReason, Option<DateTime<Utc>>) {
    let p = plan(&ledger(vec![row]), policy, t0());
    assert!(p.actions.is_empty(), "{p:?}");
    match only_notice(&p) {
        Notice::Cancel {
            why,
            snooze_until,
            stop_at,
            ..
        } => {
            assert_eq!(*stop_at, t0() + Duration::minutes(5));
            (*why, *snooze_until)
        }
        n @ Notice::Schedule { .. } => panic!("a cancel expected: {n:?}"),
    }
}

#[test]
fn activity_cancels_the_notice() {
    let noticed = || with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    let mut busy = noticed();
    busy.idle = Some(false);
    assert_eq!(cancel_of(busy, &notice_policy()).0, CancelReason::Activity);
    // Used and idle again since: idle for less than idle_after.
    let mut again = noticed();
    again.idle_seconds = Some(600.0);
    assert_eq!(cancel_of(again, &notice_policy()).0, CancelReason::Activity);
}

#[test]
fn a_snooze_cancels_the_notice() {
    let snooze = t0() + Duration::hours(6);
    let mut row = with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    nb_mut(&mut row).snooze_until = Some(snooze);
    assert_eq!(
        cancel_of(row, &notice_policy()),
        (CancelReason::Snoozed, Some(snooze))
    );
}

#[test]
fn an_opt_out_cancels_the_notice() {
    let mut row = with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    nb_mut(&mut row).cull_opt_out = true;
    assert_eq!(cancel_of(row, &notice_policy()).0, CancelReason::OptedOut);
}

#[test]
fn missing_data_keeps_the_notice_without_stopping() {
    let mut row = with_notice(idle_row("team-a", "nb", 3), t0() - Duration::minutes(1));
    row.evidence.coverage = Some(0.5);
    let p = plan(&ledger(vec![row]), &notice_policy(), t0());
    assert!(p.actions.is_empty() && p.notices.is_empty(), "{p:?}");
    assert_eq!(reasons(&p), vec![SkipReason::PartialCoverage]);
}

#[test]
fn a_notice_from_before_the_pod_started_is_stale() {
    // The pod runs since t0-10h; a notice due before that belongs to an earlier pod.
    let row = with_notice(idle_row("team-a", "nb", 3), t0() - Duration::hours(11));
    let p = plan(&ledger(vec![row]), &notice_policy(), t0());
    assert!(p.actions.is_empty(), "{p:?}");
    assert!(matches!(only_notice(&p), Notice::Schedule { .. }), "{p:?}");
}

#[test]
fn no_notice_while_the_circuit_is_open() {
    let mut p = plan(
        &ledger(vec![idle_row("team-a", "nb", 3)]),
        &notice_policy(),
        t0(),
    );
    open_circuit(&mut p, CircuitReason::ClaimsStale);
    assert!(p.notices.is_empty(), "{p:?}");
    let mut down = ledger(vec![idle_row("team-a", "nb", 3)]);
    down.usage_available = false;
    let p = plan(&down, &notice_policy(), t0());
    assert!(p.notices.is_empty() && p.actions.is_empty(), "{p:?}");
}

#[test]
fn one_notice_per_notebook() {
    let mut second = idle_row("team-a", "nb", 3);
    second.pod = "nb-1".into();
    second.evidence.uid = "pod-team-a-nb-1".into();
    let p = plan(
        &ledger(vec![idle_row("team-a", "nb", 3), second]),
        &notice_policy(),
        t0(),
    );
    assert_eq!(p.notices.len(), 1, "{p:?}");
}

#[test]
fn a_snooze_counts_at_most_max_snooze_after_the_notebook_qualified() {
    let policy = CullPolicy {
        max_snooze: Duration::hours(1),
        ..CullPolicy::default()
    };
    let far = t0() + Duration::days(3650);
    // Idle 2h30m: qualified (2h) 30 minutes ago, within the 1h bound: snoozed.
    let mut fresh = idle_row("team-a", "nb", 3);
    fresh.idle_seconds = Some(2.5 * 3600.0);
    nb_mut(&mut fresh).snooze_until = Some(far);
    assert_eq!(judge(&fresh, &policy, t0()), Err(SkipReason::Snoozed));
    // Idle 3h: qualified an hour ago: a snooze ten years out no longer counts.
    let mut old = idle_row("team-a", "nb", 3);
    nb_mut(&mut old).snooze_until = Some(far);
    assert_eq!(judge(&old, &policy, t0()), Ok(()));
    // Without a bound it still counts (today's behaviour).
    assert_eq!(
        judge(&old, &CullPolicy::default(), t0()),
        Err(SkipReason::Snoozed)
    );
    // A snooze that has passed never counts, bound or not.
    nb_mut(&mut old).snooze_until = Some(t0());
    assert_eq!(judge(&old, &CullPolicy::default(), t0()), Ok(()));
}

/// With `--cull-when=demand`, a notice given for a pending pod is taken back once no pending pod
/// waits any more: the notebook must not keep a "stops at T" warning nothing will act on, nor be
/// stopped on that old notice when demand comes back later.
#[test]
fn demand_gone_cancels_the_notice() {
    let row = with_notice(idle_row("team-a", "nb", 3), t0() + Duration::minutes(5));
    let policy = CullPolicy {
        when: CullWhen::Demand,
        ..notice_policy()
    };
    let (why, snooze) = cancel_of(row, &policy);
    assert_eq!(why, CancelReason::NoDemand);
    assert_eq!(snooze, None);
}
