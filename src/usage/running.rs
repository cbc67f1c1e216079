//! The live refresh's reduction, kept between refreshes: what only changes when a series comes
//! or goes (the label scheme the series show, and which series belong to which device and
//! signal) is worked out once per change of the window's layout, not once per refresh.
//!
//! Each refresh then reduces every device from the series the window holds, by the one device
//! reduction the offline path uses ([`series::reduce_device`]), so the evidence rules cannot
//! differ. Every device is reduced again even when no sample of it arrived: its coverage
//! vouches for up to one interval after the newest sample and its freshness ages, both with
//! `now` (docs/benchmarks.md, round 5, measures what a refresh costs).

use chrono::{DateTime, Utc};

use super::scheme::{LabelScheme, SchemeChoice};
use super::series::{self, FieldPositions, Series};
use crate::ledger::usage::{DeviceKey, DeviceUsage, Window};

/// The grouping of the held series by device, for one layout of one window.
#[derive(Debug)]
struct Grouping {
    layout: (u64, u64),
    choice: SchemeChoice,
    scheme: LabelScheme,
    devices: Vec<(DeviceKey, FieldPositions)>,
}

/// What the running reduction reads of the window of held samples (the live source's).
pub trait HeldSeries {
    /// The window's identity and layout version: while both are unchanged, every held series
    /// keeps its position and its labels.
    fn layout(&self) -> (u64, u64);
    /// The held series.
    fn series(&self) -> &[Series];
    /// Label names on the held DCGM series (for the label scheme).
    fn label_names(&self) -> impl Iterator<Item = &str>;
}

/// The reduction of a window of held samples that keeps its grouping while the window's layout
/// holds.
#[derive(Debug, Default)]
pub struct RunningReduction {
    grouping: Option<Grouping>,
}

impl RunningReduction {
    /// Whether the grouping kept is that of `held` as it is now (nothing to work out again).
    pub fn is_current(&self, held: &impl HeldSeries, choice: SchemeChoice) -> bool {
        self.grouping
            .as_ref()
            .is_some_and(|g| g.layout == held.layout() && g.choice == choice)
    }

    /// The label scheme the held series show (the override when one is configured), as of the
    /// last [`Self::reduce`].
    pub fn scheme(&self) -> Option<&LabelScheme> {
        self.grouping.as_ref().map(|g| &g.scheme)
    }

    /// Every device of `held` reduced at `now` (sorted by key): equal to
    /// [`series::reduce`] over `held`'s series under the scheme they show.
    pub fn reduce(
        &mut self,
        held: &impl HeldSeries,
        choice: SchemeChoice,
        window: &Window,
        now: DateTime<Utc>,
    ) -> Vec<DeviceUsage> {
        if !self.is_current(held, choice) {
            let scheme = LabelScheme::detect(choice, held.label_names());
            self.grouping = Some(Grouping {
                layout: held.layout(),
                choice,
                devices: series::group(held.series(), &scheme),
                scheme,
            });
        }
        let Some(g) = self.grouping.as_ref() else {
            return Vec::new();
        };
        let now_ms = now.timestamp_millis();
        g.devices
            .iter()
            .map(|(key, positions)| {
                series::reduce_device(
                    key.clone(),
                    &positions.resolve(held.series()),
                    &g.scheme,
                    window,
                    now_ms,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
