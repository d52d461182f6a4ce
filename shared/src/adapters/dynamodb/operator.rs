//! The operator's reads and transitions ([`OperatorLedger`]): the `status`
//! index (never a scan), one record with its history, and the audited
//! replay / park / resolve (expressions in `conditions`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::conditions as cond;
use super::{DynamoLedger, Item, META_SK, STATUS_INDEX, Written, attr, get_n, get_s, payload_sk, status_shard};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{OperatorAction, PortError, Row, Status, Transitioned};
use crate::ports::{OperatorLedger, RowFilter, Shown, WorkLedger};

/// A stored item as JSON, for display (`B` values shown as their size).
pub fn item_json(item: &HashMap<String, AttributeValue>) -> Row {
    item.iter().map(|(k, v)| (k.clone(), value_json(v))).collect()
}

fn value_json(v: &AttributeValue) -> serde_json::Value {
    match v {
        AttributeValue::S(s) => serde_json::Value::String(s.clone()),
        AttributeValue::N(n) => {
            n.parse::<i64>().map(serde_json::Value::from).unwrap_or_else(|_| serde_json::Value::String(n.clone()))
        }
        AttributeValue::Bool(b) => serde_json::Value::Bool(*b),
        AttributeValue::B(b) => serde_json::Value::String(format!("<{} bytes>", b.as_ref().len())),
        AttributeValue::Null(_) => serde_json::Value::Null,
        AttributeValue::L(l) => serde_json::Value::Array(l.iter().map(value_json).collect()),
        AttributeValue::M(m) => serde_json::Value::Object(item_json(m)),
        other => serde_json::Value::String(format!("{other:?}")),
    }
}

impl OperatorLedger for DynamoLedger {
    fn shards(&self) -> u32 {
        DynamoLedger::shards(self)
    }

    async fn rows(
        &self,
        status: Status,
        shard: u32,
        filter: &RowFilter<'_>,
        want: usize,
    ) -> Result<Vec<Row>, PortError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut q = self
                .client()
                .query()
                .table_name(self.table())
                .index_name(STATUS_INDEX)
                .key_condition_expression("st_shard = :p AND st_at BETWEEN :lo AND :hi")
                .expression_attribute_values(":p", AttributeValue::S(status_shard(status, shard)))
                .expression_attribute_values(":lo", AttributeValue::N(filter.since_ms.to_string()))
                .expression_attribute_values(":hi", AttributeValue::N(filter.until_ms.to_string()))
                .scan_index_forward(false)
                .set_exclusive_start_key(start.take());
            let mut filters = Vec::new();
            for (name, placeholder, value) in [
                ("endpoint", ":e", filter.endpoint),
                ("event_type", ":t", filter.event_type),
                ("subject", ":s", filter.subject),
            ] {
                if let Some(v) = value {
                    filters.push(format!("{name} = {placeholder}"));
                    q = q.expression_attribute_values(placeholder, AttributeValue::S(v.to_owned()));
                }
            }
            if !filters.is_empty() {
                q = q.filter_expression(filters.join(" AND "));
            }
            if !filter.fields.is_empty() {
                q = q.projection_expression(filter.fields.join(", "));
            }
            let page = q.send().await.map_err(|e| port_error("dynamodb", &e))?;
            out.extend(
                page.items
                    .unwrap_or_default()
                    .iter()
                    .filter(|i| filter.is_after(get_n(i, attr::ST_AT).unwrap_or(0), get_s(i, attr::PK).unwrap_or("")))
                    .map(item_json),
            );
            match page.last_evaluated_key {
                Some(k) if out.len() < want => start = Some(k),
                _ => return Ok(out),
            }
        }
    }

    async fn count(&self, status: Status) -> Result<u64, PortError> {
        crate::ports::DueLedger::count(self, status).await
    }

    async fn show(&self, key: &EventKey, with_payload: bool) -> Result<Option<Shown>, PortError> {
        let all = self
            .client()
            .query()
            .table_name(self.table())
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", AttributeValue::S(key.as_str().to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?
            .items
            .unwrap_or_default();
        let sk = |i: &Item| get_s(i, attr::SK).unwrap_or_default().to_owned();
        let Some(record) = all.iter().find(|i| sk(i) == META_SK) else { return Ok(None) };
        let mut history: Vec<&Item> = all.iter().filter(|i| sk(i).starts_with("hist#")).collect();
        history.sort_by_key(|i| sk(i));
        let payload = if with_payload {
            let hash = get_s(record, attr::PAYLOAD_HASH).unwrap_or_default();
            // In the record itself, or in its own item.
            super::payload::body(record)
                .or_else(|| all.iter().find(|i| sk(i) == payload_sk(hash)).and_then(super::payload::body))
        } else {
            None
        };
        Ok(Some((item_json(record), history.into_iter().map(item_json).collect(), payload)))
    }

    async fn transition(
        &self,
        key: &EventKey,
        action: OperatorAction,
        operator: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Transitioned, PortError> {
        let token = uuid::Uuid::new_v4().to_string();
        let update = cond::operator(action, operator, reason, &token, now_ms, key.shard(self.shards()));
        match self.conditional(key.as_str(), META_SK, update, false).await? {
            Written::Applied(_) => Ok(Transitioned::Done),
            Written::Refused(None) => Ok(Transitioned::Missing),
            // Our own retried update after a lost acknowledgement.
            Written::Refused(Some(met)) if get_s(&met, cond::OPERATOR_TOKEN) == Some(token.as_str()) => {
                Ok(Transitioned::Done)
            }
            Written::Refused(Some(met)) => Ok(match get_s(&met, attr::STATUS).and_then(Status::parse) {
                Some(st) => Transitioned::Refused(st),
                None => Transitioned::Missing,
            }),
        }
    }

    async fn append_history(&self, key: &EventKey, kind: &str, detail: &str, now_ms: i64) -> Result<(), PortError> {
        WorkLedger::append_history(self, key, kind, detail, now_ms).await
    }
}
