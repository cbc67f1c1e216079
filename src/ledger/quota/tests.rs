//! Quota rows: ResourceQuota keys, Kueue queues, unquotaed DRA claims (pure; see `ledger::quota`).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};

use super::*;
use crate::ledger::claims::{DeviceClassInfo, DraAllocation, DraRequest, OwnerRef, QuotaInfo};
use crate::ledger::kueue::{
    Admission, ClusterQueueInfo, DeviceClassMapping, FlavorQuota, FlavorUsage, KueueInputs,
    LocalQueueInfo, PodSetAssignment, PodSetInfo, WorkloadOwner, WorkloadRefs,
};
use crate::ledger::model::{PodRow, PodState};

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T12:00:00Z")
        .map(|d| d.with_timezone(&Utc))
        .expect("valid time")
}

/// A pod bound to `n1`, controlled by a Job with uid `job_uid` (empty: no controller).
fn pod_claim(ns: &str, name: &str, job_uid: &str) -> PodClaim {
    PodClaim {
        controller: (!job_uid.is_empty()).then(|| OwnerRef {
            group: "batch".into(),
            kind: "Job".into(),
            name: format!("job-{job_uid}"),
            uid: job_uid.into(),
        }),
        ..PodClaim::new(ns, name)
            .with_uid(format!("uid-{name}"))
            .running_on("n1")
    }
}

/// A running pod row holding `gpus` of `resource`, proven idle or busy (`None`: unknown).
fn row(ns: &str, name: &str, resource: &str, gpus: f64, idle: Option<bool>) -> PodRow {
    PodRow {
        gpus,
        gpus_by_resource: vec![(resource.to_string(), gpus)],
        ..PodRow::new(ns, name).running_on("n1").with_idle(idle)
    }
}

fn quota(ns: &str, name: &str, hard: &[(&str, u64)], used: &[(&str, u64)]) -> QuotaInfo {
    let map = |kv: &[(&str, u64)]| {
        kv.iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect::<BTreeMap<_, _>>()
    };
    let all = map(hard);
    QuotaInfo {
        namespace: ns.into(),
        name: name.into(),
        gpu_hard: all
            .iter()
            .filter(|(k, _)| device_class_of_quota_key(k).is_none())
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        dra_hard: all
            .iter()
            .filter(|(k, _)| device_class_of_quota_key(k).is_some())
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        names_gpu: true,
        used: map(used),
    }
}

fn inputs<'a>(claims: &'a Claims, pods: &'a [PodRow], names: &'a ResourceNames) -> Inputs<'a> {
    Inputs {
        claims,
        pods,
        names,
        usage_available: true,
        now: now(),
    }
}

#[test]
fn device_class_keys_name_their_class() {
    assert_eq!(
        device_class_of_quota_key("gpu.nvidia.com.deviceclass.resource.k8s.io/devices"),
        Some("gpu.nvidia.com")
    );
    assert_eq!(
        device_class_of_quota_key("requests.gpu.nvidia.com.deviceclass.resource.k8s.io/devices"),
        Some("gpu.nvidia.com")
    );
    assert_eq!(
        device_class_of_quota_key(".deviceclass.resource.k8s.io/devices"),
        None
    );
    assert_eq!(device_class_of_quota_key("requests.nvidia.com/gpu"), None);
}

#[test]
fn quota_rows_take_the_tightest_limit_its_used_and_the_evidence() {
    let names = ResourceNames::default();
    let claims = Claims {
        quotas: vec![
            quota(
                "team-a",
                "wide",
                &[("requests.nvidia.com/gpu", 8)],
                &[("requests.nvidia.com/gpu", 3)],
            ),
            quota(
                "team-a",
                "tight",
                &[("requests.nvidia.com/gpu", 4)],
                &[("requests.nvidia.com/gpu", 4)],
            ),
        ],
        ..Claims::default()
    };
    let pods = vec![
        row("team-a", "idle-0", "nvidia.com/gpu", 2.0, Some(true)),
        row("team-a", "busy-0", "nvidia.com/gpu", 1.0, Some(false)),
        row("team-a", "unknown-0", "nvidia.com/gpu", 1.0, None),
        // Another namespace's idle pod is not team-a's.
        row("team-b", "idle-1", "nvidia.com/gpu", 1.0, Some(true)),
        // A pending pod holds nothing.
        row("team-a", "wait-0", "nvidia.com/gpu", 1.0, None).placed(None, PodState::Pending),
    ];
    let rows = quota_rows(&inputs(&claims, &pods, &names));
    assert_eq!(
        rows,
        vec![QuotaRow {
            namespace: "team-a".into(),
            resource: "nvidia.com/gpu".into(),
            hard: 4,
            used: Some(4),
            busy: Some(1.0),
            idle: Some(2.0),
        }]
    );
    // Without a utilisation source nothing is proven: unknown, not zero.
    let blind = Inputs {
        usage_available: false,
        ..inputs(&claims, &pods, &names)
    };
    let rows = quota_rows(&blind);
    assert_eq!((rows[0].busy, rows[0].idle), (None, None));
    // Before the quota controller writes status.used it is unknown.
    let fresh = Claims {
        quotas: vec![quota("team-a", "q", &[("requests.nvidia.com/gpu", 2)], &[])],
        ..Claims::default()
    };
    assert_eq!(quota_rows(&inputs(&fresh, &[], &names))[0].used, None);
}

fn gpu_class(name: &str) -> DeviceClassInfo {
    DeviceClassInfo {
        name: name.into(),
        drivers: vec!["gpu.nvidia.com".into()],
        mig: false,
        ..DeviceClassInfo::default()
    }
}

fn dra_claim(ns: &str, name: &str, class: &str, allocated: bool) -> ResourceClaimInfo {
    ResourceClaimInfo {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("claim-{name}"),
        requests: vec![DraRequest {
            name: "gpu".into(),
            device_class: class.into(),
            count: 1,
            drivers: vec![],
            profile: None,
            mig: false,
        }],
        allocated: allocated.then(|| {
            vec![DraAllocation {
                request: "gpu".into(),
                driver: "gpu.nvidia.com".into(),
                pool: "n1".into(),
                device: "gpu-0".into(),
            }]
        }),
        reserved_for: vec![],
        device_status: vec![],
    }
}

#[test]
fn device_class_quota_rows_count_the_pods_of_that_class() {
    let names = ResourceNames::default();
    let key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices";
    let mut holder = pod_claim("team-d", "dra-0", "");
    holder.resource_claims = vec!["c0".into()];
    let claims = Claims {
        pods: vec![holder.into()],
        quotas: vec![quota(
            "team-d",
            "dra",
            &[
                (key, 2),
                // A class that is no GPU class (another driver): no row.
                ("nic.example.com.deviceclass.resource.k8s.io/devices", 4),
            ],
            &[(key, 1)],
        )],
        resource_claims: vec![dra_claim("team-d", "c0", "gpu.nvidia.com", true)],
        device_classes: vec![
            gpu_class("gpu.nvidia.com"),
            DeviceClassInfo {
                name: "nic.example.com".into(),
                drivers: vec!["nic.example.com".into()],
                mig: false,
                ..DeviceClassInfo::default()
            },
        ],
        dra_enabled: true,
        ..Claims::default()
    };
    let pods = vec![row(
        "team-d",
        "dra-0",
        "dra:gpu.nvidia.com",
        1.0,
        Some(true),
    )];
    let rows = quota_rows(&inputs(&claims, &pods, &names));
    assert_eq!(
        rows,
        vec![QuotaRow {
            namespace: "team-d".into(),
            resource: key.into(),
            hard: 2,
            used: Some(1),
            busy: Some(0.0),
            idle: Some(1.0),
        }]
    );
}

#[test]
fn dra_claims_outside_every_quota_are_flagged() {
    let names = ResourceNames::default();
    let key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices";
    let mut queued = pod_claim("team-q", "job-0", "job-uid");
    queued.resource_claims = vec!["cq".into()];
    let claims = Claims {
        pods: vec![queued.into()],
        quotas: vec![
            quota("team-a", "dra", &[(key, 2)], &[]),
            // A quota on extended GPUs does not cap DRA GPUs.
            quota("team-b", "gpu", &[("requests.nvidia.com/gpu", 2)], &[]),
        ],
        resource_claims: vec![
            dra_claim("team-a", "covered", "gpu.nvidia.com", true),
            dra_claim("team-b", "open", "gpu.nvidia.com", false),
            dra_claim("team-q", "cq", "gpu.nvidia.com", true),
            // Not a GPU class, not allocated: not a GPU claim.
            dra_claim("team-b", "nic", "nic.example.com", false),
        ],
        device_classes: vec![gpu_class("gpu.nvidia.com")],
        dra_enabled: true,
        kueue: KueueInputs {
            enabled: true,
            workloads: vec![WorkloadInfo {
                namespace: "team-q".into(),
                name: "job-job-0".into(),
                owners: vec![WorkloadOwner {
                    group: "batch".into(),
                    kind: "Job".into(),
                    name: "job-0".into(),
                    uid: "job-uid".into(),
                }],
                ..WorkloadInfo::default()
            }],
            ..KueueInputs::default()
        },
        ..Claims::default()
    };
    let out = unquotaed_claims(&inputs(&claims, &[], &names));
    assert_eq!(
        out,
        vec![UnquotaedClaim {
            namespace: "team-b".into(),
            claim: "open".into(),
            device_classes: vec!["gpu.nvidia.com".into()],
        }]
    );
}

fn gpu_quota(flavor: &str, nominal: u64, lending: Option<u64>) -> FlavorQuota {
    FlavorQuota {
        flavor: flavor.into(),
        resource: "nvidia.com/gpu".into(),
        nominal: Some(nominal),
        borrowing_limit: None,
        lending_limit: lending,
    }
}

fn cq(name: &str, cohort: &str, admitted: Option<u64>) -> ClusterQueueInfo {
    ClusterQueueInfo {
        name: name.into(),
        cohort: Some(cohort.into()),
        quotas: vec![
            gpu_quota("a100", 2, Some(2)),
            // Not a GPU resource: no row.
            FlavorQuota {
                flavor: "a100".into(),
                resource: "cpu".into(),
                nominal: Some(64),
                ..FlavorQuota::default()
            },
        ],
        usage: admitted
            .map(|a| {
                vec![FlavorUsage {
                    flavor: "a100".into(),
                    resource: "nvidia.com/gpu".into(),
                    total: Some(a),
                    borrowed: None,
                }]
            })
            .unwrap_or_default(),
        reservation: vec![],
        usage_reported: admitted.is_some(),
    }
}

/// A workload of a Job (uid `job`) in `ns` through LocalQueue `lq`, asking for one GPU.
fn workload(ns: &str, job: &str, lq: &str) -> WorkloadInfo {
    WorkloadInfo {
        namespace: ns.into(),
        name: format!("job-{job}"),
        uid: format!("wl-{job}"),
        queue_name: Some(lq.into()),
        created_at: Some(now() - Duration::minutes(10)),
        owners: vec![WorkloadOwner {
            group: "batch".into(),
            kind: "Job".into(),
            name: job.into(),
            uid: job.into(),
        }],
        pod_sets: vec![PodSetInfo {
            name: "main".into(),
            count: 1,
            gpu_per_pod: [("nvidia.com/gpu".to_string(), 1)].into(),
        }],
        ..WorkloadInfo::default()
    }
}

fn admitted(mut w: WorkloadInfo, cq: &str) -> WorkloadInfo {
    w.admission = Some(Admission {
        cluster_queue: cq.into(),
        assignments: vec![PodSetAssignment {
            name: "main".into(),
            flavors: [("nvidia.com/gpu".to_string(), "a100".to_string())].into(),
            count: Some(1),
        }],
    });
    w.admitted = true;
    w.admitted_since = Some(now() - Duration::minutes(30));
    w.quota_reserved_since = w.admitted_since;
    w
}

fn lq(ns: &str, name: &str, cq: &str) -> LocalQueueInfo {
    LocalQueueInfo {
        namespace: ns.into(),
        name: name.into(),
        cluster_queue: cq.into(),
    }
}

/// Two ClusterQueues in cohort `pool`: `lender` admitted a notebook-like Job whose pod is idle
/// (`lender_idle`), `starved` has one pending GPU Job (created 10 minutes ago) and one finished.
fn cohort(lender_idle: Option<bool>) -> (Claims, Vec<PodRow>) {
    let mut finished = workload("team-s", "old", "lq-s");
    finished.finished = true;
    let claims = Claims {
        pods: vec![pod_claim("team-l", "nb-job-0", "nb").into()],
        kueue: KueueInputs {
            enabled: true,
            flavors: vec![],
            cluster_queues: vec![
                cq("lender", "pool", Some(1)),
                cq("starved", "pool", Some(0)),
            ],
            local_queues: vec![
                lq("team-l", "lq-l", "lender"),
                lq("team-s", "lq-s", "starved"),
            ],
            workloads: vec![
                admitted(workload("team-l", "nb", "lq-l"), "lender"),
                workload("team-s", "train", "lq-s"),
                finished,
            ],
            device_class_mappings: None,
        },
        ..Claims::default()
    };
    let pods = vec![row(
        "team-l",
        "nb-job-0",
        "nvidia.com/gpu",
        1.0,
        lender_idle,
    )];
    (claims, pods)
}

#[test]
fn queue_rows_join_admitted_workloads_to_their_pods_and_count_pending() {
    let names = ResourceNames::default();
    let (claims, pods) = cohort(Some(true));
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let lender = &rows[0];
    assert_eq!(
        lender,
        &QueueRow {
            cluster_queue: "lender".into(),
            cohort: Some("pool".into()),
            flavor: "a100".into(),
            resource: "nvidia.com/gpu".into(),
            nominal: Some(2),
            borrowing_limit: None,
            lending_limit: Some(2),
            admitted: Some(1),
            busy: Some(0.0),
            idle: Some(1.0),
            pending_workloads: 0,
            oldest_pending_seconds: None,
            starved_while_lender_idle: false,
            idle_lenders: vec![],
        }
    );
    let starved = &rows[1];
    assert_eq!(starved.cluster_queue, "starved");
    assert_eq!(starved.admitted, Some(0));
    assert_eq!(
        starved.pending_workloads, 1,
        "the finished workload is not pending"
    );
    assert_eq!(starved.oldest_pending_seconds, Some(600.0));
    assert!(starved.starved_while_lender_idle);
    assert_eq!(starved.idle_lenders, vec!["lender".to_string()]);
}

#[test]
fn a_busy_lender_or_another_cohort_starves_nobody() {
    let names = ResourceNames::default();
    let (claims, pods) = cohort(Some(false));
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[0].busy, Some(1.0));
    assert!(!rows[1].starved_while_lender_idle);
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[1].cohort = Some("elsewhere".into());
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert!(!rows[1].starved_while_lender_idle);
    // Unknown evidence is not idle.
    let (claims, pods) = cohort(None);
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!((rows[0].busy, rows[0].idle), (Some(0.0), Some(0.0)));
    assert!(!rows[1].starved_while_lender_idle);
}

#[test]
fn a_pod_whose_controller_is_no_workload_owner_is_not_the_queues() {
    let names = ResourceNames::default();
    let (mut claims, pods) = cohort(Some(true));
    claims.pods = vec![pod_claim("team-l", "nb-job-0", "someone-else").into()];
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[0].idle, Some(0.0));
    // Same uid in another namespace: not the workload's pod either.
    let (mut claims, pods) = cohort(Some(true));
    claims.pods = vec![pod_claim("team-x", "nb-job-0", "nb").into()];
    let pods: Vec<PodRow> = pods
        .into_iter()
        .map(|p| PodRow {
            namespace: "team-x".into(),
            ..p
        })
        .collect();
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[0].idle, Some(0.0));
}

#[test]
fn without_kueue_there_are_no_queue_rows_and_status_gaps_are_unknown() {
    let names = ResourceNames::default();
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.enabled = false;
    assert!(queue_rows(&inputs(&claims, &pods, &names)).is_empty());
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[0] = cq("lender", "pool", None);
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[0].admitted, None, "no status yet: unknown, not zero");
}

#[test]
fn only_admitted_unfinished_workloads_hold_queue_quota() {
    let names = ResourceNames::default();
    // The lender's workload has reserved quota but waits for its admission checks (not
    // Admitted): its pod's GPU is not the queue's admitted usage, and it is still pending.
    let (mut claims, pods) = cohort(Some(true));
    let w = &mut claims.kueue.workloads[0];
    w.admitted = false;
    w.admitted_since = None;
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[0].idle, Some(0.0), "{rows:#?}");
    assert_eq!(rows[0].pending_workloads, 1);
    assert!(!rows[1].starved_while_lender_idle, "no lender is idle");
    // Finished: its pods hold nothing of the queue's quota, and it is not pending either.
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.workloads[0].finished = true;
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!((rows[0].idle, rows[0].pending_workloads), (Some(0.0), 0));
}

/// Issue 36, item 5: starvation a lender's idle quota cannot relieve is no starvation. A lender
/// with `lendingLimit: 0` lends nothing (the runbook's own fix must clear the alert), a queue
/// with `borrowingLimit: 0` borrows nothing, a lender's idle GPUs of another flavor are not
/// quota the starved queue may use, and a deactivated Workload (`spec.active: false`) is not
/// waiting: Kueue keeps it out of its queue until reactivated.
#[test]
fn a_queue_that_cannot_borrow_the_idle_quota_is_not_starved() {
    let names = ResourceNames::default();
    let starved = |claims: &Claims, pods: &[PodRow]| -> (bool, Vec<String>, u64) {
        let rows = queue_rows(&inputs(claims, pods, &names));
        let r = rows
            .iter()
            .find(|r| r.cluster_queue == "starved")
            .expect("starved row");
        (
            r.starved_while_lender_idle,
            r.idle_lenders.clone(),
            r.pending_workloads,
        )
    };
    let (claims, pods) = cohort(Some(true));
    assert_eq!(
        starved(&claims, &pods),
        (true, vec!["lender".to_string()], 1),
        "the case that stays"
    );
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[0].quotas[0].lending_limit = Some(0);
    assert_eq!(
        starved(&claims, &pods),
        (false, vec![], 1),
        "lendingLimit 0"
    );
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[1].quotas[0].borrowing_limit = Some(0);
    assert_eq!(
        starved(&claims, &pods),
        (false, vec![], 1),
        "borrowingLimit 0"
    );
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.workloads[1].deactivated = true;
    assert_eq!(starved(&claims, &pods), (false, vec![], 0), "deactivated");
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert_eq!(rows[1].oldest_pending_seconds, None);
    // The starved queue offers only another flavor: the lender's a100 quota is not its own.
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[1].quotas[0].flavor = "h100".into();
    assert_eq!(
        starved(&claims, &pods),
        (false, vec![], 1),
        "another flavor"
    );
    // Limits above zero leave room to lend and borrow.
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.cluster_queues[0].quotas[0].lending_limit = Some(1);
    claims.kueue.cluster_queues[1].quotas[0].borrowing_limit = Some(1);
    assert_eq!(
        starved(&claims, &pods),
        (true, vec!["lender".to_string()], 1)
    );
}

// === Issue 37, item 4: deeper owner chains ===

/// The lender's admitted workload, owned by `owner` instead of a Job, and its pod `nb-job-0`
/// controlled by `controller` (the object in between: a Job, a RayCluster) and carrying
/// `refs`. The pod is idle: a joined pod shows as the lender's idle quota.
fn chain(owner: WorkloadOwner, controller: OwnerRef, refs: WorkloadRefs) -> (Claims, Vec<PodRow>) {
    let (mut claims, pods) = cohort(Some(true));
    claims.kueue.workloads[0].owners = vec![owner];
    let mut p = pod_claim("team-l", "nb-job-0", "");
    p.controller = Some(controller);
    p.workload_refs = refs;
    claims.pods = vec![p.into()];
    (claims, pods)
}

fn owner(group: &str, kind: &str, name: &str, uid: &str) -> WorkloadOwner {
    WorkloadOwner {
        group: group.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn controller(group: &str, kind: &str, name: &str, uid: &str) -> OwnerRef {
    OwnerRef {
        group: group.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn refs(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> WorkloadRefs {
    let map = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    WorkloadRefs::read(Some(&map(labels)), Some(&map(annotations)))
}

/// The lender's idle GPU equivalents: 1.0 when the pod joined its workload, 0.0 when not.
fn lender_idle(claims: &Claims, pods: &[PodRow]) -> Option<f64> {
    let names = ResourceNames::default();
    queue_rows(&inputs(claims, pods, &names))
        .iter()
        .find(|r| r.cluster_queue == "lender")
        .and_then(|r| r.idle)
}

/// Labels as `sigs.k8s.io/jobset` v0.11.1 `labelAndAnnotateObject` writes them on a child Job's
/// pod template (`jobset_controller.go`), for JobSet `name` with uid `uid`.
fn jobset_pod_labels<'a>(name: &'a str, uid: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("jobset.sigs.k8s.io/jobset-name", name),
        ("jobset.sigs.k8s.io/jobset-uid", uid),
        ("jobset.sigs.k8s.io/replicatedjob-name", "workers"),
        ("jobset.sigs.k8s.io/job-index", "0"),
        ("batch.kubernetes.io/job-name", "train-workers-0"),
    ]
}

#[test]
fn a_jobset_pod_joins_the_workload_of_its_jobset() {
    let js = owner("jobset.x-k8s.io", "JobSet", "train", "js-uid");
    let job = controller("batch", "Job", "train-workers-0", "job-uid");
    let (claims, pods) = chain(
        js.clone(),
        job.clone(),
        refs(&jobset_pod_labels("train", "js-uid"), &[]),
    );
    assert_eq!(lender_idle(&claims, &pods), Some(1.0), "JobSet → Job → Pod");
    // A JobSet of the same name that was replaced (another uid) is not this workload's owner.
    let (claims, pods) = chain(
        js.clone(),
        job.clone(),
        refs(&jobset_pod_labels("train", "old-uid"), &[]),
    );
    assert_eq!(lender_idle(&claims, &pods), Some(0.0), "uid mismatch");
    // Another JobSet's pod.
    let (claims, pods) = chain(js, job, refs(&jobset_pod_labels("eval", "e-uid"), &[]));
    assert_eq!(lender_idle(&claims, &pods), Some(0.0), "another JobSet");
}

#[test]
fn a_trainjob_pod_joins_through_the_jobset_named_after_it() {
    // Kubeflow Trainer v2.2.0 names the JobSet after the TrainJob; the uid label is the
    // JobSet's own, not the TrainJob's.
    let tj = owner("trainer.kubeflow.org", "TrainJob", "llama", "tj-uid");
    let job = controller("batch", "Job", "llama-node-0", "job-uid");
    let mut labels = jobset_pod_labels("llama", "jobset-uid");
    labels.push(("trainer.kubeflow.org/trainjob-ancestor-step", "trainer"));
    let (claims, pods) = chain(tj.clone(), job.clone(), refs(&labels, &[]));
    assert_eq!(
        lender_idle(&claims, &pods),
        Some(1.0),
        "TrainJob → JobSet → Job → Pod"
    );
    let (claims, pods) = chain(tj, job, refs(&jobset_pod_labels("other", "u"), &[]));
    assert_eq!(lender_idle(&claims, &pods), Some(0.0));
}

#[test]
fn a_rayjob_pod_joins_through_the_ray_cluster_generated_for_it() {
    // KubeRay v1.6.0: RayJob `sum` → RayCluster `sum-<rand.String(5)>` → head and worker pods
    // labelled `ray.io/cluster` with the cluster's name (`common/pod.go`, `labelPod`).
    let rj = owner("ray.io", "RayJob", "sum", "rj-uid");
    let cluster = |name: &str| controller("ray.io", "RayCluster", name, "rc-uid");
    let ray_labels = |cluster: &'static str| {
        vec![
            ("ray.io/cluster", cluster),
            ("ray.io/node-type", "worker"),
            ("ray.io/group", "gpu-group"),
            ("ray.io/is-ray-node", "yes"),
        ]
    };
    let (claims, pods) = chain(
        rj.clone(),
        cluster("sum-x7k2p"),
        refs(&ray_labels("sum-x7k2p"), &[]),
    );
    assert_eq!(
        lender_idle(&claims, &pods),
        Some(1.0),
        "RayJob → RayCluster → Pod"
    );
    // A cluster whose name is no generated name for `sum` (`a`, `e` are not in Kubernetes'
    // random alphabet; a suffix of 6): another RayCluster's pods.
    for other in ["sum-abcde", "sum-x7k2pq", "sum", "summer-x7k2p"] {
        let (claims, pods) = chain(rj.clone(), cluster(other), refs(&ray_labels(other), &[]));
        assert_eq!(lender_idle(&claims, &pods), Some(0.0), "{other}");
    }
    // A standalone RayCluster's Workload is owned by the RayCluster, the pods' controller:
    // the controller join, as for a Job.
    let (claims, pods) = chain(
        owner("ray.io", "RayCluster", "dev", "rc-uid"),
        cluster("dev"),
        refs(&ray_labels("dev"), &[]),
    );
    assert_eq!(lender_idle(&claims, &pods), Some(1.0), "RayCluster → Pod");
}

#[test]
fn kueues_workload_annotation_joins_any_chain_in_the_pods_namespace() {
    // Kueue v0.17.0 stamps the admitted Workload's name on the pod templates it starts
    // (`kueue.x-k8s.io/workload`) and the pod set's name (`kueue.x-k8s.io/podset`), whatever
    // the owner: here an owner no table row knows.
    let unknown = owner("example.com", "Pipeline", "p", "p-uid");
    let mid = controller("batch", "Job", "p-step-0", "job-uid");
    let wl = "job-nb"; // the lender's workload name (`workload("team-l", "nb", ..)`)
    let (claims, pods) = chain(
        unknown.clone(),
        mid.clone(),
        refs(
            &[("kueue.x-k8s.io/podset", "main")],
            &[("kueue.x-k8s.io/workload", wl)],
        ),
    );
    assert_eq!(lender_idle(&claims, &pods), Some(1.0), "annotation");
    // The same name in another namespace is another Workload.
    let (mut claims, pods) = chain(unknown, mid, refs(&[], &[("kueue.x-k8s.io/workload", wl)]));
    claims.kueue.workloads[0].namespace = "team-x".into();
    claims.kueue.local_queues[0].namespace = "team-x".into();
    assert_eq!(lender_idle(&claims, &pods), Some(0.0), "another namespace");
}

#[test]
fn a_pod_the_table_matches_to_two_workloads_joins_neither() {
    // A TrainJob and a JobSet of one name each own a workload (a JobSet made outside the
    // TrainJob): the pod's JobSet label names both.
    let (mut claims, pods) = chain(
        owner("trainer.kubeflow.org", "TrainJob", "x", "tj-uid"),
        controller("batch", "Job", "x-node-0", "job-uid"),
        refs(&jobset_pod_labels("x", "js-uid"), &[]),
    );
    let mut twin = claims.kueue.workloads[0].clone();
    twin.name = "jobset-x".into();
    twin.owners = vec![owner("jobset.x-k8s.io", "JobSet", "x", "js-uid")];
    claims.kueue.workloads.push(twin);
    assert_eq!(lender_idle(&claims, &pods), Some(0.0));
}

#[test]
fn the_pod_set_label_picks_the_flavor_kueue_assigned_to_the_pods_set() {
    // A JobSet with a launcher pod set on flavor `a100` and a workers pod set on `h100`: the
    // workers' pod counts under h100, not the first assignment's flavor.
    let (mut claims, pods) = chain(
        owner("jobset.x-k8s.io", "JobSet", "train", "js-uid"),
        controller("batch", "Job", "train-workers-0", "job-uid"),
        refs(
            &[
                ("jobset.sigs.k8s.io/jobset-name", "train"),
                ("jobset.sigs.k8s.io/jobset-uid", "js-uid"),
                ("kueue.x-k8s.io/podset", "workers"),
            ],
            &[],
        ),
    );
    let adm = claims.kueue.workloads[0]
        .admission
        .as_mut()
        .expect("admitted");
    adm.assignments[0].name = "launcher".into();
    adm.assignments.push(PodSetAssignment {
        name: "workers".into(),
        flavors: [("nvidia.com/gpu".to_string(), "h100".to_string())].into(),
        count: Some(1),
    });
    claims.kueue.cluster_queues[0]
        .quotas
        .push(gpu_quota("h100", 4, None));
    let names = ResourceNames::default();
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    let idle = |flavor: &str| {
        rows.iter()
            .find(|r| r.cluster_queue == "lender" && r.flavor == flavor)
            .and_then(|r| r.idle)
    };
    assert_eq!((idle("a100"), idle("h100")), (Some(0.0), Some(1.0)));
}

#[test]
fn workload_refs_keep_only_values_a_controller_could_write() {
    let long = "a".repeat(64);
    let r = refs(
        &[
            ("jobset.sigs.k8s.io/jobset-name", long.as_str()),
            ("jobset.sigs.k8s.io/jobset-uid", "js-uid"),
            ("ray.io/cluster", "-bad"),
            ("kueue.x-k8s.io/podset", "workers"),
            ("unrelated", "kept-nowhere"),
        ],
        &[("kueue.x-k8s.io/workload", "Not_A_Name")],
    );
    assert_eq!(
        r,
        WorkloadRefs {
            workload: None,
            pod_set: Some("workers".into()),
            owner_labels: [(
                "jobset.sigs.k8s.io/jobset-uid".to_string(),
                "js-uid".to_string()
            )]
            .into(),
        }
    );
    let r = refs(&[], &[("kueue.x-k8s.io/workload", &"w".repeat(254))]);
    assert!(r.is_empty(), "a name longer than 253 bytes is no name");
}

// === Issue 37, item 4: Kueue's deviceClassMappings ===

/// The lender's workload holding its GPU through a DRA claim of class `gpu.nvidia.com`, its
/// ClusterQueue giving quota of `example.com/gpu` (a name of Kueue's own choosing, as in
/// Kueue's DRA guide), and `mappings` as read from Kueue's Configuration.
fn dra_queue(mappings: Option<Vec<DeviceClassMapping>>) -> (Claims, Vec<PodRow>) {
    let (mut claims, _) = cohort(Some(true));
    let mapped = "example.com/gpu";
    claims.kueue.cluster_queues[0].quotas[0].resource = mapped.into();
    let adm = claims.kueue.workloads[0]
        .admission
        .as_mut()
        .expect("admitted");
    adm.assignments[0].flavors = [(mapped.to_string(), "a100".to_string())].into();
    claims.kueue.device_class_mappings = mappings;
    claims.pods[0] = {
        let mut p = (*claims.pods[0]).clone();
        p.resource_claims = vec!["nb-gpu".into()];
        p.into()
    };
    claims.resource_claims = vec![dra_claim("team-l", "nb-gpu", "gpu.nvidia.com", true)];
    claims.device_classes = vec![gpu_class("gpu.nvidia.com")];
    claims.dra_enabled = true;
    let pods = vec![row(
        "team-l",
        "nb-job-0",
        "dra:gpu.nvidia.com",
        1.0,
        Some(true),
    )];
    (claims, pods)
}

fn gpu_mapping() -> Vec<DeviceClassMapping> {
    vec![DeviceClassMapping {
        name: "example.com/gpu".into(),
        device_classes: vec!["gpu.nvidia.com".into()],
    }]
}

#[test]
fn quota_of_a_resource_kueue_maps_to_a_gpu_device_class_is_gpu_quota_held_by_dra_pods() {
    let names = ResourceNames::default();
    let (claims, pods) = dra_queue(Some(gpu_mapping()));
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    let lender = rows
        .iter()
        .find(|r| r.cluster_queue == "lender")
        .unwrap_or_else(|| panic!("no lender row: {rows:#?}"));
    assert_eq!(
        (lender.resource.as_str(), lender.flavor.as_str()),
        ("example.com/gpu", "a100")
    );
    assert_eq!((lender.busy, lender.idle), (Some(0.0), Some(1.0)));
    // Without the mapping `example.com/gpu` is no GPU resource: no row.
    let (claims, pods) = dra_queue(Some(vec![]));
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert!(
        rows.iter().all(|r| r.cluster_queue != "lender"),
        "{rows:#?}"
    );
    // A mapping to a class of no counted driver is no GPU quota either.
    let (mut claims, pods) = dra_queue(Some(gpu_mapping()));
    claims.device_classes[0].drivers = vec!["nic.example.com".into()];
    let rows = queue_rows(&inputs(&claims, &pods, &names));
    assert!(
        rows.iter().all(|r| r.cluster_queue != "lender"),
        "{rows:#?}"
    );
}

#[test]
fn a_queued_pods_dra_claim_is_quotaed_only_through_a_mapping_of_its_class() {
    let names = ResourceNames::default();
    let flagged = |mappings| {
        let (claims, pods) = dra_queue(mappings);
        unquotaed_claims(&inputs(&claims, &pods, &names))
            .into_iter()
            .map(|c| c.claim)
            .collect::<Vec<_>>()
    };
    assert_eq!(flagged(Some(gpu_mapping())), Vec::<String>::new(), "mapped");
    // Kueue counts a device only through a mapping of its class: none, and the claim escapes
    // the queue's quota.
    assert_eq!(
        flagged(Some(vec![])),
        vec!["nb-gpu".to_string()],
        "no mapping"
    );
    // Mappings not read (no ConfigMap named, or not readable): the queue is trusted, as before.
    assert_eq!(flagged(None), Vec::<String>::new(), "unknown");
}
