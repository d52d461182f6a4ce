//! The domain's items and projection writes as DynamoDB's types: the one
//! place a [`crate::item::Value`] becomes an `AttributeValue` and a
//! projection's [`Write`] a transaction item (the memory world reads the
//! same transaction items, so both stores evaluate the same request).

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update};

use crate::item::{Item, Value};
use crate::projection::{Action, Write};

/// A domain value as DynamoDB's.
pub fn to_sdk(v: &Value) -> AttributeValue {
    match v {
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::N(n) => AttributeValue::N(n.clone()),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::B(b) => AttributeValue::B(Blob::new(b.clone())),
        Value::L(l) => AttributeValue::L(l.iter().map(to_sdk).collect()),
        Value::M(m) => AttributeValue::M(m.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()),
        Value::Ss(ss) => AttributeValue::Ss(ss.clone()),
        Value::Null => AttributeValue::Null(true),
    }
}

/// DynamoDB's value as the domain's (kinds the domain does not model, the
/// number and binary sets, are read as lists).
pub fn from_sdk(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => Value::S(s.clone()),
        AttributeValue::N(n) => Value::N(n.clone()),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::B(b) => Value::B(b.as_ref().to_vec()),
        AttributeValue::L(l) => Value::L(l.iter().map(from_sdk).collect()),
        AttributeValue::M(m) => Value::M(m.iter().map(|(k, v)| (k.clone(), from_sdk(v))).collect()),
        AttributeValue::Ss(ss) => Value::Ss(ss.clone()),
        AttributeValue::Ns(ns) => Value::L(ns.iter().map(|n| Value::N(n.clone())).collect()),
        AttributeValue::Bs(bs) => Value::L(bs.iter().map(|b| Value::B(b.as_ref().to_vec())).collect()),
        _ => Value::Null,
    }
}

pub fn item_to_sdk(item: &Item) -> HashMap<String, AttributeValue> {
    item.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()
}

pub fn item_from_sdk(item: &HashMap<String, AttributeValue>) -> Item {
    item.iter().map(|(k, v)| (k.clone(), from_sdk(v))).collect()
}

/// A projection's write as one item of a transaction on `table`.
pub fn transact(table: &str, w: &Write) -> TransactWriteItem {
    let key = HashMap::from([
        ("pk".to_owned(), AttributeValue::S(w.pk.clone())),
        ("sk".to_owned(), AttributeValue::S(w.sk.clone())),
    ]);
    let names = (!w.names.is_empty()).then(|| w.names.clone());
    let values = (!w.values.is_empty()).then(|| item_to_sdk(&w.values));
    let built = match &w.action {
        Action::Put(_) => Put::builder()
            .table_name(table)
            .set_item(w.item().as_ref().map(item_to_sdk))
            .set_condition_expression(w.condition.clone())
            .set_return_values_on_condition_check_failure(
                w.condition.is_some().then_some(aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld),
            )
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map(|p| TransactWriteItem::builder().put(p).build()),
        Action::Update(expression) => Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(expression)
            .set_condition_expression(w.condition.clone())
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map(|u| TransactWriteItem::builder().update(u).build()),
        Action::Check => ConditionCheck::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(w.condition.clone().unwrap_or_default())
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map(|c| TransactWriteItem::builder().condition_check(c).build()),
        Action::Delete => Delete::builder()
            .table_name(table)
            .set_key(Some(key))
            .set_condition_expression(w.condition.clone())
            .set_expression_attribute_names(names)
            .set_expression_attribute_values(values)
            .build()
            .map(|d| TransactWriteItem::builder().delete(d).build()),
    };
    built.unwrap_or_else(|e| unreachable!("table, key and expressions are set: {e}"))
}

/// Applies one projection write on its own, outside a commit (an
/// operator's or a demo's mapping): a put as one `PutItem`, anything else as
/// a transaction of one item. A failed condition is an error.
pub async fn apply(client: &aws_sdk_dynamodb::Client, table: &str, w: &Write) -> Result<(), crate::ledger::PortError> {
    match w.action {
        Action::Put(_) => client
            .put_item()
            .table_name(table)
            .set_item(w.item().as_ref().map(item_to_sdk))
            .set_condition_expression(w.condition.clone())
            .set_expression_attribute_names((!w.names.is_empty()).then(|| w.names.clone()))
            .set_expression_attribute_values((!w.values.is_empty()).then(|| item_to_sdk(&w.values)))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| crate::adapters::port_error("dynamodb", &e)),
        _ => client
            .transact_write_items()
            .transact_items(transact(table, w))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| crate::adapters::port_error("dynamodb", &e)),
    }
}

/// Whether a projection's write can go on its own, as one conditional
/// request (a put, an update or a delete; a bare condition check exists only
/// inside a transaction).
pub fn alone(w: &Write) -> bool {
    !matches!(w.action, Action::Check)
}

/// Sends one transaction item on its own, as the request it stands for (a
/// put, an update, a delete): `Ok(None)` written, `Ok(Some(met))` its
/// condition failed (nothing written) against `met` (a put's refusal
/// returns the item it met; `None`: none, or not returned).
pub async fn write_alone(
    client: &aws_sdk_dynamodb::Client,
    item: &TransactWriteItem,
) -> Result<Option<Option<HashMap<String, AttributeValue>>>, crate::ledger::PortError> {
    use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld;
    if let Some(p) = item.put() {
        let r = client
            .put_item()
            .table_name(p.table_name())
            .set_item(Some(p.item().clone()))
            .set_condition_expression(p.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(p.expression_attribute_names().cloned())
            .set_expression_attribute_values(p.expression_attribute_values().cloned())
            .return_values_on_condition_check_failure(AllOld)
            .send()
            .await;
        return match r {
            Ok(_) => Ok(None),
            Err(e) => match e.as_service_error() {
                Some(aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Some(c.item().cloned()))
                }
                _ => Err(crate::adapters::port_error("dynamodb", &e)),
            },
        };
    }
    if let Some(u) = item.update() {
        let r = client
            .update_item()
            .table_name(u.table_name())
            .set_key(Some(u.key().clone()))
            .update_expression(u.update_expression())
            .set_condition_expression(u.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(u.expression_attribute_names().cloned())
            .set_expression_attribute_values(u.expression_attribute_values().cloned())
            .send()
            .await;
        return match r {
            Ok(_) => Ok(None),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => Ok(Some(None)),
            Err(e) => Err(crate::adapters::port_error("dynamodb", &e)),
        };
    }
    if let Some(d) = item.delete() {
        let r = client
            .delete_item()
            .table_name(d.table_name())
            .set_key(Some(d.key().clone()))
            .set_condition_expression(d.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(d.expression_attribute_names().cloned())
            .set_expression_attribute_values(d.expression_attribute_values().cloned())
            .send()
            .await;
        return match r {
            Ok(_) => Ok(None),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => Ok(Some(None)),
            Err(e) => Err(crate::adapters::port_error("dynamodb", &e)),
        };
    }
    Err(crate::ledger::PortError::Caller {
        service: "dynamodb",
        code: "ValidationError".into(),
        message: "a condition check is written inside a transaction only".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::{n, s};

    #[test]
    fn values_round_trip_and_a_put_carries_its_keys_and_condition() {
        let v = Value::M(HashMap::from([
            ("a".to_owned(), Value::L(vec![n(1), s("x"), Value::Bool(false), Value::Null])),
            ("b".to_owned(), Value::B(vec![1, 2])),
            ("c".to_owned(), Value::Ss(vec!["p".into()])),
        ]));
        assert_eq!(from_sdk(&to_sdk(&v)), v);
        let w = Write::put("proj#x", Item::from([("v".to_owned(), n(3))])).when("attribute_not_exists(pk)");
        let t = transact("t", &w);
        let put = t.put().unwrap();
        assert_eq!(put.table_name(), "t");
        assert_eq!(put.item().get("sk"), Some(&AttributeValue::S("state".into())));
        assert_eq!(put.condition_expression(), Some("attribute_not_exists(pk)"));
        let u = transact("t", &Write::update("proj#x", "ADD v :d").value(":d", n(1)).at("other"));
        assert_eq!(u.update().unwrap().key().get("sk"), Some(&AttributeValue::S("other".into())));
    }
}
