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

use super::{Item, OnConflict, Op, ProjectionError, State, StateKey, Write, n, s};
use crate::identity::EventKey;

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

/// The state of an ordered stream: the last sequence number applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stream {
    pub last_seq: Option<i64>,
}

impl State for Stream {
    fn decode(item: &Item) -> Result<Self, ProjectionError> {
        match item.get("last_seq") {
            None => Ok(Self { last_seq: None }),
            Some(v) => v.as_i64().map(|seq| Self { last_seq: Some(seq) }).ok_or_else(|| {
                ProjectionError::Permanent("stored stream state: last_seq is not a whole number".into())
            }),
        }
    }
}

impl Stream {
    /// Whether the stream has reached `at.seq - 1` (the predecessor of `at` is applied).
    pub fn reached_predecessor_of(&self, at: &Position) -> bool {
        self.last_seq.unwrap_or(0) >= at.seq - 1
    }
}

/// The key of a stream's state item.
pub fn stream_key(pk: impl Into<String>) -> StateKey<Stream> {
    StateKey::new(pk)
}

/// Applies delta `seq` to `attr` (ADD), conditioned on the stream still being at `seq - 1`.
pub fn apply_next(pk: &str, seq: i64, attr: &str, delta: i64, extra: Item) -> Op {
    let mut update = Write::update(pk, String::new()).name("#v", attr).value(":seq", n(seq)).value(":d", n(delta));
    update = if seq == 1 {
        update.when("attribute_not_exists(last_seq)")
    } else {
        update.when("last_seq = :prev").value(":prev", n(seq - 1))
    };
    let mut sets = vec!["last_seq = :seq".to_owned()];
    let mut extra: Vec<_> = extra.into_iter().collect();
    extra.sort_by(|a, b| a.0.cmp(&b.0));
    for (i, (k, v)) in extra.into_iter().enumerate() {
        update = update.name(format!("#x{i}"), k).value(format!(":x{i}"), v);
        sets.push(format!("#x{i} = :x{i}"));
    }
    update.action = super::Action::Update(format!("SET {} ADD #v :d", sets.join(", ")));
    let mut op = Op::guarded(vec![update], OnConflict::Replan);
    op.advances = Some(Position { stream: pk.to_owned(), seq });
    op
}

/// When the record of a waiter pointer in the due index parked (the
/// pointer's first look).
pub const PARKED_AT: &str = "parked_at";

/// The waiter pointer item (the work ledger's `register_waiter` writes it).
pub fn waiter_item(at: &Position, key: &EventKey, expires_at: i64, due: Option<(String, i64)>) -> Item {
    let mut item = Item::from([
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
        let op = apply_next("proj#x", 4, "v", 1, Item::new());
        assert_eq!(op.advances, Some(Position { stream: "proj#x".into(), seq: 4 }));
        assert!(waiter_sk(5) < waiter_sk(40), "pointers sort by sequence");
    }
}
