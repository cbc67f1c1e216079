//! Kueue projections from objects shaped like real ones.

use super::*;
use serde_json::json;

fn object(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("a dynamic object")
}

#[test]
fn a_cluster_queue_keeps_flavor_quotas_cohort_and_usage() {
    // Shaped like the ClusterQueue of kubernetes-sigs/kueue#9048 (40 GPUs of one flavor beside
    // cpu, memory and an RDMA device), in v1beta2 (`cohortName`), with a lending limit and a
    // quantity that is no whole count.
    let cq = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "team-a"},
        "spec": {
            "cohortName": "research",
            "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                "flavors": [{"name": "default-flavor", "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": "40", "lendingLimit": "8"},
                    {"name": "cpu", "nominalQuota": "1760"},
                    {"name": "memory", "nominalQuota": "19200Gi", "borrowingLimit": "1.5"}
                ]}]
            }]
        },
        "status": {
            "admittedWorkloads": 3,
            "flavorsUsage": [{"name": "default-flavor", "resources": [
                {"name": "nvidia.com/gpu", "total": "32", "borrowed": "0"},
                {"name": "cpu", "total": "96"}
            ]}],
            "flavorsReservation": [{"name": "default-flavor", "resources": [
                {"name": "nvidia.com/gpu", "total": "32"}
            ]}]
        }
    }));
    let info = cluster_queue(&cq);
    assert_eq!(info.name, "team-a");
    assert_eq!(info.cohort.as_deref(), Some("research"));
    assert_eq!(
        info.quotas[0],
        FlavorQuota {
            flavor: "default-flavor".into(),
            resource: "nvidia.com/gpu".into(),
            nominal: Some(40),
            borrowing_limit: None,
            lending_limit: Some(8),
        }
    );
    assert_eq!(
        info.quotas[2].borrowing_limit, None,
        "1.5 is no whole count"
    );
    assert_eq!(info.usage[0].total, Some(32));
    assert_eq!(info.reservation[0].total, Some(32));
    assert!(info.usage_reported);
    // Before Kueue writes a status nothing is known.
    let bare = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "new"}, "spec": {}
    }));
    let info = cluster_queue(&bare);
    assert!(!info.usage_reported && info.cohort.is_none() && info.quotas.is_empty());
}

#[test]
fn a_workload_keeps_owner_pod_sets_admission_and_conditions() {
    // Shaped like the Workload of kubernetes-sigs/kueue#2391 (a Job's, one GPU per pod), in
    // v1beta2, admitted to a ClusterQueue.
    let wl = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {
            "name": "job-train-4f6f9-9a073", "namespace": "team-a", "uid": "wl-uid",
            "creationTimestamp": "2026-03-01T11:50:00Z",
            "labels": {"kueue.x-k8s.io/job-uid": "job-uid"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                "uid": "job-uid", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "active": true, "queueName": "user-queue",
            "podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": [{
                "name": "trainer", "image": "example",
                "resources": {"limits": {"nvidia.com/gpu": "1"},
                              "requests": {"cpu": "100m", "memory": "100Mi"}}
            }]}}}]
        },
        "status": {
            "admission": {"clusterQueue": "team-a", "podSetAssignments": [{
                "name": "main", "count": 2,
                "flavors": {"nvidia.com/gpu": "default-flavor", "cpu": "default-flavor"},
                "resourceUsage": {"nvidia.com/gpu": "2", "cpu": "200m"}
            }]},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                 "message": "", "lastTransitionTime": "2026-03-01T11:51:00Z"},
                {"type": "Admitted", "status": "True", "reason": "Admitted",
                 "message": "", "lastTransitionTime": "2026-03-01T11:51:01Z"},
                {"type": "Finished", "status": "False", "reason": "", "message": "",
                 "lastTransitionTime": "2026-03-01T11:51:01Z"}
            ]
        }
    }));
    let w = workload(&ResourceNames::default(), &wl);
    assert_eq!(
        (w.namespace.as_str(), w.queue_name.as_deref()),
        ("team-a", Some("user-queue"))
    );
    assert_eq!(
        w.owners,
        vec![WorkloadOwner {
            group: "batch".into(),
            kind: "Job".into(),
            name: "train".into(),
            uid: "job-uid".into(),
        }]
    );
    assert_eq!(w.pod_sets[0].count, 2);
    assert_eq!(
        w.pod_sets[0].gpu_per_pod,
        [("nvidia.com/gpu".to_string(), 1)].into()
    );
    let adm = w.admission.as_ref().expect("admitted");
    assert_eq!(adm.cluster_queue, "team-a");
    assert_eq!(
        adm.assignments[0]
            .flavors
            .get("nvidia.com/gpu")
            .map(String::as_str),
        Some("default-flavor")
    );
    assert!(w.admitted && !w.finished && w.holds_quota() && w.needs_gpus());
    assert_eq!(
        w.admitted_since.map(|t| t.to_rfc3339()),
        Some("2026-03-01T11:51:01+00:00".into())
    );
    assert!(w.quota_reserved_since.is_some() && w.finished_since.is_none());
    assert!(w.created_at.is_some());
    assert!(!w.deactivated, "active: true");
}

/// A Workload deactivated (`spec.active: false`, as `kubectl patch workload … active=false` or
/// Kueue's `waitForPodsReady` requeue limit leaves it, with condition `Evicted` reason
/// `InactiveWorkload`, message "The workload is deactivated", as kubernetes-sigs/kueue's
/// `apis/kueue` constants and integration tests write them) is out of its queue: not pending.
#[test]
fn a_deactivated_workload_is_not_pending() {
    let wl = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"active": false, "queueName": "q", "podSets": [{"name": "main", "count": 1,
            "template": {"spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]},
        "status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "InactiveWorkload",
            "lastTransitionTime": "2026-03-01T11:51:01Z", "message": "The workload is deactivated"}]}
    }));
    let w = workload(&ResourceNames::default(), &wl);
    assert!(w.deactivated && w.needs_gpus() && !w.pending());
}

#[test]
fn pending_and_hostile_workloads_project_without_guessing() {
    let wl = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "-3"}}}]
        }}}]},
        "status": {"conditions": [{"type": "Admitted", "status": "Unknown"}],
                   "admission": {"podSetAssignments": []}}
    }));
    let w = workload(&ResourceNames::default(), &wl);
    assert!(w.pending() && !w.admitted);
    assert!(w.admission.is_none(), "no clusterQueue: no admission");
    assert!(
        !w.needs_gpus(),
        "an impossible quantity asks for nothing known"
    );
}

#[test]
fn local_queues_and_flavors_project() {
    let lq = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": "team-a"},
        "spec": {"clusterQueue": "team-a"}
    }));
    assert_eq!(
        local_queue(&lq),
        LocalQueueInfo {
            namespace: "team-a".into(),
            name: "user-queue".into(),
            cluster_queue: "team-a".into(),
        }
    );
    let rf = object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "a100"},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
    }));
    let f = resource_flavor(&rf);
    assert_eq!(f.name, "a100");
    assert_eq!(f.node_labels.len(), 1);
}

fn config(yaml: &str) -> BTreeMap<String, String> {
    [(CONFIG_KEY.to_string(), yaml.to_string())].into()
}

#[test]
fn device_class_mappings_are_read_from_kueues_configuration() {
    // Kueue v0.17.0's own DRA end-to-end configuration
    // (sigs.k8s.io/kueue@v0.17.0 test/e2e/config/dra/controller_manager_config.yaml).
    let yaml = r#"apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
metrics:
  enableClusterQueueResources: true
leaderElection:
  leaderElect: true
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
  - "batch/job"
  - "pod"
featureGates:
  DynamicResourceAllocation: true
  DRAExtendedResources: true
resources:
  deviceClassMappings:
  - name: gpu
    deviceClassNames:
    - gpu.example.com
"#;
    let m = device_class_mappings("kueue-system/kueue-manager-config", &config(yaml))
        .expect("mappings");
    assert_eq!(
        m,
        vec![DeviceClassMapping {
            name: "gpu".into(),
            device_classes: vec!["gpu.example.com".into()],
        }]
    );
    // Kueue's default manager configuration (config/components/manager) maps nothing.
    let plain = "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n\
        integrations:\n  frameworks:\n  - \"batch/job\"\n";
    assert_eq!(
        device_class_mappings("cm", &config(plain)).expect("none"),
        vec![]
    );
}

#[test]
fn a_configuration_kueue_would_refuse_is_an_error_naming_the_config_map() {
    let err = |yaml: &str| {
        device_class_mappings("kueue-system/kueue-manager-config", &config(yaml))
            .expect_err("invalid")
            .to_string()
    };
    let e = err("resources:\n  deviceClassMappings:\n  - name: gpu\n    deviceClassNames: []\n");
    assert!(e.contains("kueue-system/kueue-manager-config"), "{e}");
    assert!(e.contains("0 DeviceClasses"), "{e}");
    let many = (0..17)
        .map(|i| format!("  - name: r{i}\n    deviceClassNames: [c{i}]\n"))
        .collect::<Vec<_>>()
        .concat();
    let e = err(&format!("resources:\n  deviceClassMappings:\n{many}"));
    assert!(e.contains("17 mappings"), "{e}");
    let e = err(&format!(
        "resources:\n  deviceClassMappings:\n  - name: gpu\n    deviceClassNames: [{}]\n",
        "c".repeat(254)
    ));
    assert!(e.contains("too long"), "{e}");
    assert!(err("resources: [").contains("no Kueue Configuration"));
    let missing = device_class_mappings("ns/cm", &BTreeMap::new()).expect_err("no key");
    assert!(missing.to_string().contains(CONFIG_KEY), "{missing}");
}
