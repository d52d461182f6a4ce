//! Status with precedence: a monotonic rank that never regresses, unless an
//! explicit transition allows it.

use super::{Item, OnConflict, Op, Write, n};

/// Whether moving from `current` to `incoming` is allowed: forward in rank,
/// or one of the `explicit` (from, to) transitions.
pub fn allows(current: Option<i64>, incoming: i64, explicit: &[(i64, i64)]) -> bool {
    match current {
        None => true,
        Some(c) => incoming > c || explicit.contains(&(c, incoming)),
    }
}

/// A conditional put: applied when the stored rank is lower than `rank`, or
/// when the stored rank is one of `explicit_from` (the transitions into
/// `rank` that the domain allows despite precedence).
pub fn advance(pk: &str, rank: i64, explicit_from: &[i64], mut attrs: Item) -> Op {
    attrs.insert("rank".into(), n(rank));
    let mut condition = "attribute_not_exists(pk) OR #rank < :rank".to_owned();
    let mut put = Write::put(pk, attrs).name("#rank", "rank").value(":rank", n(rank));
    for (i, from) in explicit_from.iter().enumerate() {
        condition.push_str(&format!(" OR #rank = :from{i}"));
        put = put.value(format!(":from{i}"), n(*from));
    }
    Op::guarded(vec![put.when(condition)], OnConflict::Stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_regresses_unless_explicitly_allowed() {
        assert!(allows(None, 1, &[]));
        assert!(allows(Some(1), 3, &[]));
        assert!(!allows(Some(3), 1, &[]));
        assert!(!allows(Some(3), 3, &[]));
        assert!(allows(Some(3), 1, &[(3, 1)]));
    }
}
