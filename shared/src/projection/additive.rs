//! Independent additive operations: every distinct operation (by its durable
//! business identity, not the delivery id) is applied exactly once — the
//! ledger entry and the balance change commit in one transaction, and the
//! entry's existence is the condition.
//!
//! DynamoDB allows one operation per item in a transaction, so several
//! operations against one balance (two refunds in one event) go through
//! [`apply_many`]: the projection reads which entries exist, and one op puts
//! the missing entries and adds their sum; if another worker adds one of them
//! meanwhile, the op asks to be planned again.

use super::{Item, OnConflict, Op, Write, n};

/// Writes entry `entry_pk` (once) and adds `amount` to `balance_attr` of
/// `balance_pk`; if the entry exists, the operation was applied before.
pub fn apply_once(entry_pk: &str, entry_attrs: Item, balance_pk: &str, balance_attr: &str, amount: i64) -> Op {
    let mut op = apply_many(vec![(entry_pk.to_owned(), entry_attrs, amount)], balance_pk, balance_attr);
    op.on_conflict = OnConflict::AlreadyApplied;
    op
}

/// Puts every entry in `entries` (each `(pk, attrs, amount)`, none existing
/// when planned) and adds their sum to `balance_pk` — one op, replanned if
/// any entry appeared since the projection read them.
pub fn apply_many(entries: Vec<(String, Item, i64)>, balance_pk: &str, balance_attr: &str) -> Op {
    let total: i64 = entries.iter().map(|e| e.2).sum();
    let count = entries.len() as i64;
    let mut writes = Vec::with_capacity(entries.len() + 1);
    for (pk, mut attrs, amount) in entries {
        attrs.insert("amount".into(), n(amount));
        writes.push(Write::put(&pk, attrs).when("attribute_not_exists(pk)"));
    }
    writes.push(
        Write::update(balance_pk, "ADD #b :amt, entries :count")
            .name("#b", balance_attr)
            .value(":amt", n(total))
            .value(":count", n(count)),
    );
    Op::guarded(writes, OnConflict::Replan)
}
