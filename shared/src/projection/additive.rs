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

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};

use super::{OnConflict, Op, key_of, n};

/// Writes entry `entry_pk` (once) and adds `amount` to `balance_attr` of
/// `balance_pk`; if the entry exists, the operation was applied before.
pub fn apply_once(
    table: &str,
    entry_pk: &str,
    entry_attrs: HashMap<String, AttributeValue>,
    balance_pk: &str,
    balance_attr: &str,
    amount: i64,
) -> Op {
    let mut op = apply_many(table, vec![(entry_pk.to_owned(), entry_attrs, amount)], balance_pk, balance_attr);
    op.on_conflict = OnConflict::AlreadyApplied;
    op
}

/// Puts every entry in `entries` (each `(pk, attrs, amount)`, none existing
/// when planned) and adds their sum to `balance_pk` — one op, replanned if
/// any entry appeared since the projection read them.
pub fn apply_many(
    table: &str,
    entries: Vec<(String, HashMap<String, AttributeValue>, i64)>,
    balance_pk: &str,
    balance_attr: &str,
) -> Op {
    let total: i64 = entries.iter().map(|e| e.2).sum();
    let count = entries.len() as i64;
    let mut writes = Vec::with_capacity(entries.len() + 1);
    for (pk, attrs, amount) in entries {
        let mut entry = key_of(&pk);
        entry.extend(attrs);
        entry.insert("amount".into(), n(amount));
        let put = Put::builder()
            .table_name(table)
            .set_item(Some(entry))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
        writes.push(TransactWriteItem::builder().put(put).build());
    }
    let update = Update::builder()
        .table_name(table)
        .set_key(Some(key_of(balance_pk)))
        .update_expression("ADD #b :amt, entries :count")
        .expression_attribute_names("#b", balance_attr)
        .expression_attribute_values(":amt", n(total))
        .expression_attribute_values(":count", n(count))
        .build()
        .unwrap_or_else(|e| unreachable!("table and key are set: {e}"));
    writes.push(TransactWriteItem::builder().update(update).build());
    Op::new(writes, OnConflict::Replan)
}
