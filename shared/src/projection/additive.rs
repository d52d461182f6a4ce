//! Independent additive operations: every distinct operation (by its durable
//! business identity, not the delivery id) is applied exactly once — the
//! ledger entry and the balance change commit in one transaction, and the
//! entry's existence is the condition.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};

use super::{OnConflict, Op, key_of, n};

/// Writes entry `entry_pk` (once) and adds `amount` to `balance_attr` of `balance_pk`.
pub fn apply_once(
    table: &str,
    entry_pk: &str,
    entry_attrs: HashMap<String, AttributeValue>,
    balance_pk: &str,
    balance_attr: &str,
    amount: i64,
) -> Op {
    let mut entry = key_of(entry_pk);
    entry.extend(entry_attrs);
    entry.insert("amount".into(), n(amount));
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(entry))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    let update = Update::builder()
        .table_name(table)
        .set_key(Some(key_of(balance_pk)))
        .update_expression("ADD #b :amt, entries :one")
        .expression_attribute_names("#b", balance_attr)
        .expression_attribute_values(":amt", n(amount))
        .expression_attribute_values(":one", n(1))
        .build()
        .unwrap_or_else(|e| unreachable!("table and key are set: {e}"));
    Op::new(
        vec![TransactWriteItem::builder().put(put).build(), TransactWriteItem::builder().update(update).build()],
        OnConflict::AlreadyApplied,
    )
}
