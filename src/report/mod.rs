//! Rendering of a [`Ledger`](crate::ledger::Ledger) for people and programs: an aligned table
//! and the JSON contract (`table`). Where the ledger came from is `app`'s business.

pub mod table;

pub use table::{render_json, render_table};

/// "2d3h", "3h12m", "45m", "30s" — the two most significant units.
pub fn humanise_seconds(secs: i64) -> String {
    let secs = secs.max(0);
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humanises_two_units() {
        assert_eq!(humanise_seconds(0), "0s");
        assert_eq!(humanise_seconds(45 * 60 + 10), "45m");
        assert_eq!(humanise_seconds(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(humanise_seconds(2 * 86_400 + 3 * 3600 + 59), "2d3h");
        assert_eq!(humanise_seconds(-5), "0s");
    }
}
