//! The culling targets gpu-ledger knows, in one list: adding a kind is one line here.
//!
//! The plan asks the list which target owns a pod row ([`Targets::owner`]) and writes that
//! target into every action and notice, so the actuator, the backoff and the webhook act on the
//! kind the plan judged; nothing downstream picks a kind on its own.

use std::fmt;

use super::notebook::Notebook;
use super::raycluster::RayCluster;
use super::target::{Target, TargetInfo};
use super::workspace::Workspace;
use crate::ledger::PodRow;

/// Every registered target (their RBAC must be granted by the culling Roles).
pub static TARGETS: &[&dyn Target] = &[&Notebook, &Workspace, &RayCluster];

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

/// A `--cull-targets` name that is no registered target's noun.
#[derive(Debug, thiserror::Error)]
#[error("unknown culling target {0:?} (known: {known})", known = known_nouns())]
pub struct UnknownTarget(pub String);

fn known_nouns() -> String {
    TARGETS
        .iter()
        .map(|t| t.identity().noun)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Targets {
    /// The registered targets named by `nouns` (`notebook`, `workspace`, …), in registry order;
    /// every target when `nouns` is empty. A name no target has is an error: a typo must not
    /// silently turn a kind's culling off.
    pub fn named(nouns: &[String]) -> Result<Self, UnknownTarget> {
        let wanted: Vec<&str> = nouns
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .collect();
        if let Some(unknown) = wanted
            .iter()
            .find(|n| !TARGETS.iter().any(|t| t.identity().noun == **n))
        {
            return Err(UnknownTarget((*unknown).to_string()));
        }
        if wanted.is_empty() || TARGETS.iter().all(|t| wanted.contains(&t.identity().noun)) {
            return Ok(Targets(TARGETS));
        }
        let chosen: Vec<&'static dyn Target> = TARGETS
            .iter()
            .copied()
            .filter(|t| wanted.contains(&t.identity().noun))
            .collect();
        // Once per process (the flag is read at start-up): the plan keeps `'static` targets.
        Ok(Targets(Box::leak(chosen.into_boxed_slice())))
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
