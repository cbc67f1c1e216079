//! The culling targets gpu-ledger knows, in one list: adding a kind is one line here.

use super::notebook::Notebook;
use super::target::Target;

/// The target culling acts on (actions and notices do not name a kind yet: one kind is culled).
pub static DEFAULT: &dyn Target = &Notebook;

/// Every registered target (their RBAC must be granted by the culling Roles).
pub static TARGETS: &[&dyn Target] = &[&Notebook];

/// The owner object of a ledger pod row among the registered targets, with whether the pod →
/// owner chain was verified.
pub fn owner(row: &crate::ledger::PodRow) -> Option<(&super::target::TargetInfo, bool)> {
    TARGETS.iter().find_map(|t| t.owner(row))
}
