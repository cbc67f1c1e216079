//! Why the leader's cycle holds back from acting ([`HoldBack`], the `reason` label of
//! `gpu_ledger_cull_held_back`) and how the kill switch's value is read.

use std::fmt;

/// Why the leader's cycle did not act although it wanted to (the `reason` label of
/// `gpu_ledger_cull_held_back`). A bounded set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HoldBack {
    /// The kill switch says `cull: off`.
    KillSwitch,
    /// The kill switch holds a value other than `off` or `on`: fail closed.
    KillSwitchInvalid,
    /// The kill switch could not be read (API error or timeout).
    KillSwitchUnreadable,
    /// `--cull-namespace-selector` could not be resolved.
    SelectorUnresolved,
    /// No Kubernetes client (offline use).
    NoClient,
}

impl HoldBack {
    pub const ALL: [HoldBack; 5] = [
        Self::KillSwitch,
        Self::KillSwitchInvalid,
        Self::KillSwitchUnreadable,
        Self::SelectorUnresolved,
        Self::NoClient,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::KillSwitch => "kill_switch",
            Self::KillSwitchInvalid => "kill_switch_invalid",
            Self::KillSwitchUnreadable => "kill_switch_unreadable",
            Self::SelectorUnresolved => "namespace_selector_unresolved",
            Self::NoClient => "no_client",
        }
    }
}

impl fmt::Display for HoldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The accepted values of the kill switch's `cull` key.
pub const KILL_SWITCH_VALUES: [&str; 2] = ["off", "on"];

/// Reads the kill switch's `cull` value strictly: exactly `off` stops culling, exactly `on` (or
/// no ConfigMap, or no `cull` key: `None`) lets it act. Surrounding whitespace (a trailing newline
/// from `--from-file`) is ignored; case is not (`Off` is refused). Anything else — `false`, `0`,
/// `disabled`, a typo — is an error, and the caller holds culling back (fail closed).
pub fn kill_switch_engaged(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("on") => Ok(false),
        Some("off") => Ok(true),
        Some(other) => Err(format!(
            "kill switch value {other:?} is neither \"off\" nor \"on\""
        )),
    }
}
