//! Ordered deltas with sequence numbers: apply sequence `n` only right after
//! `n - 1`; repeats are duplicates; a jump is a gap, deferred (bounded) until
//! the predecessor arrives, then left for reconciliation.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

use super::{OnConflict, Op, key_of, n};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqDecision {
    Apply,
    Duplicate,
    Gap { expected: i64 },
}

/// Sequences start at 1.
pub fn decide(last_applied: Option<i64>, seq: i64) -> SeqDecision {
    let expected = last_applied.unwrap_or(0) + 1;
    match seq.cmp(&expected) {
        std::cmp::Ordering::Equal => SeqDecision::Apply,
        std::cmp::Ordering::Less => SeqDecision::Duplicate,
        std::cmp::Ordering::Greater => SeqDecision::Gap { expected },
    }
}

/// Applies delta `seq` to `attr` (ADD), conditioned on the stream still being at `seq - 1`.
pub fn apply_next(
    table: &str,
    pk: &str,
    seq: i64,
    attr: &str,
    delta: i64,
    extra: HashMap<String, AttributeValue>,
) -> Op {
    let mut update = Update::builder()
        .table_name(table)
        .set_key(Some(key_of(pk)))
        .expression_attribute_names("#v", attr)
        .expression_attribute_values(":seq", n(seq))
        .expression_attribute_values(":d", n(delta));
    update = if seq == 1 {
        update.condition_expression("attribute_not_exists(last_seq)")
    } else {
        update.condition_expression("last_seq = :prev").expression_attribute_values(":prev", n(seq - 1))
    };
    let mut sets = vec!["last_seq = :seq".to_owned()];
    for (i, (k, v)) in extra.into_iter().enumerate() {
        update =
            update.expression_attribute_names(format!("#x{i}"), k).expression_attribute_values(format!(":x{i}"), v);
        sets.push(format!("#x{i} = :x{i}"));
    }
    let update = update
        .update_expression(format!("SET {} ADD #v :d", sets.join(", ")))
        .build()
        .unwrap_or_else(|e| unreachable!("table and key are set: {e}"));
    Op::new(vec![TransactWriteItem::builder().update(update).build()], OnConflict::Replan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_applies_repeats_are_duplicates_jumps_are_gaps() {
        assert_eq!(decide(None, 1), SeqDecision::Apply);
        assert_eq!(decide(None, 2), SeqDecision::Gap { expected: 1 });
        assert_eq!(decide(Some(4), 5), SeqDecision::Apply);
        assert_eq!(decide(Some(4), 4), SeqDecision::Duplicate);
        assert_eq!(decide(Some(4), 2), SeqDecision::Duplicate);
        assert_eq!(decide(Some(4), 7), SeqDecision::Gap { expected: 5 });
    }
}
