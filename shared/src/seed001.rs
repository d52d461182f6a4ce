//! Seed 001's experiment: three policies for admitting a snapshot update,
//! over every arrival order of three revisions and every duplicate insertion.
//!
//! Producer: revision 1 sets seats to 10, revision 2 to 30, revision 3 to 20;
//! the intended final value is 20. The revision guard here is the same rule
//! the `projection::snapshot` building block enforces in DynamoDB.

use std::collections::HashSet;

use crate::projection::snapshot::{Guard, Version};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatEvent {
    pub event_id: &'static str,
    pub revision: i64,
    pub seats: i64,
}

pub const EVENTS: [SeatEvent; 3] = [
    SeatEvent { event_id: "evt_rev1", revision: 1, seats: 10 },
    SeatEvent { event_id: "evt_rev2", revision: 2, seats: 30 },
    SeatEvent { event_id: "evt_rev3", revision: 3, seats: 20 },
];
pub const INTENDED: i64 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    ArrivalOrder,
    DedupeIds,
    RevisionGuard,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::ArrivalOrder, Policy::DedupeIds, Policy::RevisionGuard];

    pub fn name(self) -> &'static str {
        match self {
            Self::ArrivalOrder => "Apply in arrival order",
            Self::DedupeIds => "Deduplicate event IDs",
            Self::RevisionGuard => "Deduplicate and guard revisions",
        }
    }
}

/// Runs one policy over deliveries; returns the state after each delivery and the update count.
pub fn run(policy: Policy, deliveries: &[SeatEvent]) -> (Vec<Option<i64>>, usize) {
    let mut seen = HashSet::new();
    let mut state: Option<(Version, i64)> = None;
    let mut updates = 0;
    let mut trace = Vec::new();
    for e in deliveries {
        let apply = match policy {
            Policy::ArrivalOrder => true,
            Policy::DedupeIds => seen.insert(e.event_id),
            Policy::RevisionGuard => {
                seen.insert(e.event_id)
                    && Guard::admits(state.map(|(v, _)| v), Version { generation: 0, revision: e.revision })
            }
        };
        if apply {
            state = Some((Version { generation: 0, revision: e.revision }, e.seats));
            updates += 1;
        }
        trace.push(state.map(|(_, s)| s));
    }
    (trace, updates)
}

/// All orderings of the three events.
pub fn permutations() -> Vec<Vec<SeatEvent>> {
    let mut out = Vec::new();
    for a in EVENTS {
        for b in EVENTS {
            for c in EVENTS {
                if a != b && b != c && a != c {
                    out.push(vec![a, b, c]);
                }
            }
        }
    }
    out
}

/// Every permutation with one of the three events inserted again at each of
/// the four positions: 6 × 3 × 4 = 72 sequences.
pub fn duplicate_extensions() -> Vec<Vec<SeatEvent>> {
    let mut out = Vec::new();
    for p in permutations() {
        for dup in EVENTS {
            for pos in 0..=p.len() {
                let mut seq = p.clone();
                seq.insert(pos, dup);
                out.push(seq);
            }
        }
    }
    out
}

/// Correct final states per policy over the six arrival orders.
pub fn correct_orders(policy: Policy) -> usize {
    permutations().iter().filter(|p| run(policy, p).0.last().copied().flatten() == Some(INTENDED)).count()
}

/// The five-delivery table of the essay: revisions 3, 1, 2, 2, 1.
pub fn five_deliveries() -> Vec<SeatEvent> {
    [3, 1, 2, 2, 1].iter().map(|r| EVENTS[r - 1]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_order_and_id_dedup_are_right_in_two_of_six_the_guard_in_six() {
        assert_eq!(correct_orders(Policy::ArrivalOrder), 2);
        assert_eq!(correct_orders(Policy::DedupeIds), 2);
        assert_eq!(correct_orders(Policy::RevisionGuard), 6);
    }

    #[test]
    fn all_72_duplicate_insertions_keep_the_guarded_value() {
        let ext = duplicate_extensions();
        assert_eq!(ext.len(), 72);
        for seq in ext {
            assert_eq!(run(Policy::RevisionGuard, &seq).0.last().copied().flatten(), Some(INTENDED), "{seq:?}");
        }
    }

    #[test]
    fn five_delivery_table_matches_the_essay() {
        let d = five_deliveries();
        let (arrival, n1) = run(Policy::ArrivalOrder, &d);
        let (ids, n2) = run(Policy::DedupeIds, &d);
        let (guard, n3) = run(Policy::RevisionGuard, &d);
        assert_eq!(arrival, [Some(20), Some(10), Some(30), Some(30), Some(10)]);
        assert_eq!(ids, [Some(20), Some(10), Some(30), Some(30), Some(30)]);
        assert_eq!(guard, [Some(20); 5]);
        assert_eq!((n1, n2, n3), (5, 3, 1));
    }
}
