//! Per-notebook backoff after a failed stop, kept by the culler and handed to the pure plan
//! (`plan::plan_with`) as data.
//!
//! Without it a stop that keeps failing (a 403 from RBAC or an admission webhook on some
//! notebooks, a recheck that keeps disagreeing) would be retried first every cycle — it is the
//! longest idle — and use up `--cull-max-per-cycle`, so an allowed idle notebook behind it would
//! never be reached. After a failed stop the notebook sits out the next cycle; every further
//! failure in a row doubles the cycles it sits out (1, 2, 4, …), never longer than
//! [`MAX_BACKOFF`] after its last failure. A held notebook is skipped as `backoff` and takes
//! neither the per-cycle nor the per-namespace cap. The entry is cleared by a successful stop
//! (or dry-run stop), and when the notebook leaves the ledger or comes back with another uid.
//! Entries are per target kind: a Notebook and an object of another kind may share a name.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};

use super::registry::Targets;
use super::target::Target;
use crate::ledger::Ledger;

/// Longest a notebook is held back after its last failed stop.
pub const MAX_BACKOFF: Duration = Duration::hours(1);

/// Failures in a row beyond which the cycles to sit out stop doubling (2^20 cycles is past
/// [`MAX_BACKOFF`] at any refresh interval; the time bound ends the hold first).
const MAX_DOUBLINGS: u32 = 20;

/// One notebook's failed stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The owner object's uid that failed: a notebook re-created under the same name starts afresh.
    pub uid: String,
    /// Failed stops in a row.
    pub failures: u32,
    /// When the last stop failed.
    pub failed_at: DateTime<Utc>,
    /// Cycles still to sit out.
    pub cycles_left: u64,
}

impl Entry {
    /// Whether this entry holds the notebook back at `now`.
    pub fn holds(&self, now: DateTime<Utc>) -> bool {
        self.cycles_left > 0 && now - self.failed_at < MAX_BACKOFF
    }
}

/// Which object an entry is about: the target's `(group, kind)`, namespace and name.
type Key = ((&'static str, &'static str), String, String);

fn key(target: &dyn Target, namespace: &str, name: &str) -> Key {
    (target.key(), namespace.to_string(), name.to_string())
}

/// The notebooks backing off, keyed by target kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Backoff {
    entries: BTreeMap<Key, Entry>,
}

impl Backoff {
    /// Whether owner object `namespace/name` of kind `target` with `uid` sits out the cycle at
    /// `now`.
    pub fn holds(
        &self,
        target: &dyn Target,
        namespace: &str,
        name: &str,
        uid: &str,
        now: DateTime<Utc>,
    ) -> bool {
        self.entries
            .get(&key(target, namespace, name))
            .is_some_and(|e| e.uid == uid && e.holds(now))
    }

    /// A stop of `namespace/name` (`uid`) failed at `now`: it sits out the next 1, 2, 4, …
    /// cycles (doubling with every failure in a row). Returns the entry.
    pub fn failed(
        &mut self,
        target: &dyn Target,
        namespace: &str,
        name: &str,
        uid: &str,
        now: DateTime<Utc>,
    ) -> &Entry {
        let key = key(target, namespace, name);
        let failures = match self.entries.get(&key) {
            Some(e) if e.uid == uid => e.failures.saturating_add(1),
            _ => 1,
        };
        let doublings = failures.saturating_sub(1).min(MAX_DOUBLINGS);
        let entry = Entry {
            uid: uid.to_string(),
            failures,
            failed_at: now,
            cycles_left: 1_u64 << doublings,
        };
        self.entries.insert(key.clone(), entry);
        &self.entries[&key]
    }

    /// A stop of `namespace/name` succeeded: forget its failures.
    pub fn succeeded(&mut self, target: &dyn Target, namespace: &str, name: &str) {
        self.entries.remove(&key(target, namespace, name));
    }

    /// One cycle has been planned: every held notebook has sat out one more.
    pub fn tick(&mut self) {
        for e in self.entries.values_mut() {
            e.cycles_left = e.cycles_left.saturating_sub(1);
        }
    }

    /// Forgets notebooks that are gone from `ledger` (no GPU pod of theirs left among the owner
    /// objects of `targets`) or came back with another uid (deleted and re-created). The failure
    /// count of a notebook that stays is kept past [`MAX_BACKOFF`], so a stop that keeps failing
    /// is retried about once an hour, not once a cycle again.
    pub fn retain_present(&mut self, ledger: &Ledger, targets: Targets) {
        let present: BTreeSet<((&str, &str), &str, &str, &str)> = ledger
            .pods
            .iter()
            .filter_map(|row| {
                let owner = targets.owner(row)?;
                Some((
                    owner.target.key(),
                    row.namespace.as_str(),
                    owner.object.name.as_str(),
                    owner.object.uid.as_str(),
                ))
            })
            .collect();
        self.entries.retain(|(kind, ns, name), e| {
            present.contains(&(*kind, ns.as_str(), name.as_str(), e.uid.as_str()))
        });
    }

    /// Notebooks whose last stop failed (held back now or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Notebooks held back at `now`.
    pub fn held(&self, now: DateTime<Utc>) -> usize {
        self.entries.values().filter(|e| e.holds(now)).count()
    }

    /// The entry of `namespace/name` of kind `target`, if any.
    pub fn get(&self, target: &dyn Target, namespace: &str, name: &str) -> Option<&Entry> {
        self.entries.get(&key(target, namespace, name))
    }
}
