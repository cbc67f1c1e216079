//! Builders for `PodClaim` and `NodeInfo`: a pending pod that claims nothing from
//! [`PodClaim::new`], a Ready node with no GPU from [`NodeInfo::new`], plus chained setters, so unit tests, integration tests and benchmarks name only what their case is
//! about (they live in the library because integration tests need them too).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::claims::{NodeInfo, OwnerRef, Placement, PodClaim, PodPhase, Resources};
use super::kueue::WorkloadRefs;

impl PodClaim {
    /// A pending pod with no uid, claim, owner, history or scheduling constraint.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        PodClaim {
            namespace: namespace.into(),
            name: name.into(),
            uid: String::new(),
            node: None,
            phase: PodPhase::Pending,
            created_at: None,
            started_at: None,
            ready_since: None,
            deletion: None,
            resources: Resources::new(),
            controller: None,
            unschedulable_message: None,
            labels: BTreeMap::new(),
            resource_claims: Vec::new(),
            placement: Placement::default(),
            scheduling_gates: Vec::new(),
            finalizers: Vec::new(),
            workload_refs: WorkloadRefs::default(),
            extended_claim: None,
            class_requests: BTreeMap::new(),
            kai: None,
            hami: super::hami_inputs::HamiPod::default(),
            unhealthy_devices: Vec::new(),
        }
    }

    /// With this uid.
    #[must_use]
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    /// Bound to `node` and running.
    #[must_use]
    pub fn running_on(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self.phase = PodPhase::Running;
        self
    }

    /// Claiming `units` of `resource` (beside what it already claims).
    #[must_use]
    pub fn claiming(mut self, resource: &str, units: u64) -> Self {
        self.resources.insert(resource.to_string(), units);
        self
    }

    /// Created at `at`.
    #[must_use]
    pub fn created(mut self, at: DateTime<Utc>) -> Self {
        self.created_at = Some(at);
        self
    }

    /// Controlled by this owner.
    #[must_use]
    pub fn controlled_by(mut self, owner: OwnerRef) -> Self {
        self.controller = Some(owner);
        self
    }

    /// Held back by this scheduling gate (beside any it already has).
    #[must_use]
    pub fn gated_by(mut self, gate: &str) -> Self {
        self.scheduling_gates.push(gate.into());
        self
    }

    /// Placeable only where `placement` allows.
    #[must_use]
    pub fn placed_by(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }
}

impl NodeInfo {
    /// A Ready node with no GPU resource, label, taint or sharing layer, replicas 1.
    pub fn new(name: impl Into<String>) -> Self {
        NodeInfo {
            name: name.into(),
            allocatable: BTreeMap::new(),
            replicas: 1,
            product: None,
            gpu_labels: BTreeMap::new(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: Some(true),
            hami: super::hami_inputs::HamiNode::default(),
        }
    }

    /// `units` of `resource` allocatable.
    #[must_use]
    pub fn allocating(mut self, resource: &str, units: u64) -> Self {
        self.allocatable.insert(resource.to_string(), units);
        self
    }
}
