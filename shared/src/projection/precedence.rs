//! Status with precedence: a monotonic rank that never regresses, unless an
//! explicit transition allows it.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use super::{OnConflict, Op, key_of, n};

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
pub fn advance(table: &str, pk: &str, rank: i64, explicit_from: &[i64], attrs: HashMap<String, AttributeValue>) -> Op {
    let mut item = key_of(pk);
    item.extend(attrs);
    item.insert("rank".into(), n(rank));
    let mut condition = "attribute_not_exists(pk) OR #rank < :rank".to_owned();
    let mut put = Put::builder().table_name(table).expression_attribute_names("#rank", "rank");
    for (i, from) in explicit_from.iter().enumerate() {
        condition.push_str(&format!(" OR #rank = :from{i}"));
        put = put.expression_attribute_values(format!(":from{i}"), n(*from));
    }
    let put = put
        .set_item(Some(item))
        .condition_expression(condition)
        .expression_attribute_values(":rank", n(rank))
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    Op::new(vec![TransactWriteItem::builder().put(put).build()], OnConflict::Stale)
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
