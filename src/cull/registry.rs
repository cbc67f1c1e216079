//! The culling targets gpu-ledger knows, in one list: adding a kind is one line here.
//!
//! The plan asks the list which target owns a pod row ([`Targets::owner`]) and writes that
//! target into every action and notice, so the actuator, the backoff and the webhook act on the
//! kind the plan judged; nothing downstream picks a kind on its own.

use std::fmt;

use super::notebook::Notebook;
use super::raycluster::RayCluster;
use super::target::{Target, TargetInfo};
use crate::ledger::PodRow;

/// Every registered target (their RBAC must be granted by the culling Roles).
pub static TARGETS: &[&dyn Target] = &[&Notebook, &RayCluster];

/// The owner object of a pod row: which target claimed it, its projection and whether the pod
/// → owner chain was verified.
#[derive(Debug, Clone, Copy)]
pub struct OwnerObject<'r> {
    pub target: &'static dyn Target,
    pub object: &'r TargetInfo,
    pub verified: bool,
}

/// The targets a plan judges pods against, in the order a row is offered to them: the first
/// whose [`Target::owner`] claims the row owns it. The default is [`TARGETS`].
#[derive(Clone, Copy)]
pub struct Targets(&'static [&'static dyn Target]);

impl Targets {
    pub const fn new(targets: &'static [&'static dyn Target]) -> Self {
        Targets(targets)
    }

    /// The targets, in order.
    pub fn iter(self) -> impl Iterator<Item = &'static dyn Target> {
        self.0.iter().copied()
    }

    /// The owner object of `row` among these targets, with the target that claimed it.
    pub fn owner(self, row: &PodRow) -> Option<OwnerObject<'_>> {
        self.iter().find_map(|target| {
            target.owner(row).map(|(object, verified)| OwnerObject {
                target,
                object,
                verified,
            })
        })
    }
}

impl Default for Targets {
    fn default() -> Self {
        Targets(TARGETS)
    }
}

impl PartialEq for Targets {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl fmt::Debug for Targets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
