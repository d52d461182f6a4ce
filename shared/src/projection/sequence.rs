//! Ordered deltas with sequence numbers: apply sequence `n` only right after
//! `n - 1`; repeats are duplicates; a jump is a gap, deferred (bounded by
//! time) until the predecessor arrives.
//!
//! Waking a waiter without a scan: an event that defers on a gap leaves a
//! small pointer item `(stream pk, "wait#<its seq>") → event key`. The
//! processor that commits `seq - 1` reads the pointer for `seq` (one
//! strongly consistent read by key) and makes that event due at once. The
//! waiter writes its pointer, leaves PROCESSING, then checks the stream
//! again, so a commit that lands in between is never missed: either the
//! committer sees the pointer, or the waiter sees the commit.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

use super::{OnConflict, Op, ProjectionContext, ProjectionError, get_n, get_s, key_of, n, s};
use crate::identity::EventKey;
use crate::ledger::error_chain;

/// A place in an ordered stream: the stream's state item and a sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The `pk` of the stream's state item (`sk = "state"`).
    pub stream: String,
    pub seq: i64,
}

/// Sort key of the waiter pointer for `seq` under the stream's `pk`.
pub fn waiter_sk(seq: i64) -> String {
    format!("wait#{seq:020}")
}

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
    let mut op = Op::new(vec![TransactWriteItem::builder().update(update).build()], OnConflict::Replan);
    op.advances = Some(Position { stream: pk.to_owned(), seq });
    op
}

/// Leaves the pointer that lets the commit of `at.seq - 1` wake `key`
/// (idempotent: a repeat writes the same item). Kept until `expires_at`.
/// `due`: the due-index partition and time it is also due at (a record
/// parked at the gap bound: the reconciler looks at its stream).
pub async fn register_waiter(
    cx: &ProjectionContext,
    at: &Position,
    key: &EventKey,
    expires_at: i64,
    due: Option<(String, i64)>,
) -> Result<(), ProjectionError> {
    cx.ddb
        .put_item()
        .table_name(&cx.table)
        .set_item(Some(waiter_item(at, key, expires_at, due)))
        .send()
        .await
        .map_err(|e| ProjectionError::Unavailable(error_chain(&e)))?;
    Ok(())
}

/// When the record of a waiter pointer in the due index parked (the
/// pointer's first look).
pub const PARKED_AT: &str = "parked_at";

/// The waiter pointer item (see [`register_waiter`]).
pub fn waiter_item(
    at: &Position,
    key: &EventKey,
    expires_at: i64,
    due: Option<(String, i64)>,
) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        ("pk".to_owned(), s(&at.stream)),
        ("sk".to_owned(), s(waiter_sk(at.seq))),
        ("event_key".to_owned(), s(key.as_str())),
        ("expires_at".to_owned(), n(expires_at)),
    ]);
    if let Some((partition, due_at)) = due {
        item.insert("due_shard".to_owned(), s(partition));
        item.insert("due_at".to_owned(), n(due_at));
        item.insert(PARKED_AT.to_owned(), n(due_at));
    }
    item
}

/// The sequence number of a waiter pointer's `sk` (`wait#<seq>`).
pub fn waiter_seq(sk: &str) -> Option<i64> {
    sk.strip_prefix("wait#")?.parse().ok()
}

/// The event waiting at `at`, if one left a pointer (strongly consistent).
pub async fn waiter(cx: &ProjectionContext, at: &Position) -> Result<Option<EventKey>, ProjectionError> {
    let out = cx
        .ddb
        .get_item()
        .table_name(&cx.table)
        .key("pk", s(&at.stream))
        .key("sk", s(waiter_sk(at.seq)))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| ProjectionError::Unavailable(error_chain(&e)))?;
    Ok(out.item.as_ref().and_then(|i| get_s(i, "event_key")).and_then(EventKey::from_stored))
}

/// Whether the predecessor of `at` has been applied (the stream reached `at.seq - 1`).
pub async fn predecessor_applied(cx: &ProjectionContext, at: &Position) -> Result<bool, ProjectionError> {
    let last = cx.read_state(&at.stream).await?.and_then(|i| get_n(&i, "last_seq")).unwrap_or(0);
    Ok(last >= at.seq - 1)
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

    #[test]
    fn an_applied_delta_names_the_position_it_advances_to() {
        let op = apply_next("t", "proj#x", 4, "v", 1, HashMap::new());
        assert_eq!(op.advances, Some(Position { stream: "proj#x".into(), seq: 4 }));
        assert!(waiter_sk(5) < waiter_sk(40), "pointers sort by sequence");
    }
}
