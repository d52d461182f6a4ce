//! The data keys of sealed payloads and the subject index, in their own
//! table (`HOOKLEDGER_KEYS_TABLE`), which has no point-in-time recovery so
//! that a destroyed key survives in no backup:
//! - `pk = key#<event key>`, `sk = k`: the key (`dk`, 32 bytes), or after an
//!   erasure its tombstone (`erased_at`, `erased_by`, no `dk`);
//! - `pk = subj#<subject>`, `sk = <event key>`: the subject index.
//!
//! Every item expires with its record (`expires_at`, the table's TTL).

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::{Item, get_n, get_s};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ports::{PayloadKeys, PortFuture};
use crate::sealing::{DataKey, KeyState};

const KEY_SK: &str = "k";
const DATA_KEY: &str = "dk";
const ERASED_AT: &str = "erased_at";
const ERASED_BY: &str = "erased_by";

fn key_pk(event: &EventKey) -> String {
    format!("key#{}", event.as_str())
}

fn subject_pk(subject: &str) -> String {
    format!("subj#{subject}")
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// What a key item holds.
pub fn key_state(item: Option<&Item>) -> KeyState {
    let Some(item) = item else { return KeyState::Missing };
    if let Some(at_ms) = get_n(item, ERASED_AT) {
        return KeyState::Erased { at_ms, by: get_s(item, ERASED_BY).unwrap_or_default().to_owned() };
    }
    match item.get(DATA_KEY).and_then(|v| v.as_b().ok()).and_then(|b| DataKey::from_bytes(b.as_ref())) {
        Some(key) => KeyState::Live(key),
        None => KeyState::Missing,
    }
}

/// The key store on DynamoDB.
#[derive(Clone)]
pub struct DynamoKeys {
    client: Client,
    table: String,
}

impl DynamoKeys {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into() }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    fn item(pk: String, sk: &str, expires_at: i64) -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("pk".to_owned(), s(pk)),
            ("sk".to_owned(), s(sk)),
            (super::TTL_ATTRIBUTE.to_owned(), n(expires_at)),
        ])
    }
}

impl PayloadKeys for DynamoKeys {
    fn key_for<'a>(&'a self, event: &'a EventKey, fresh: &'a DataKey, expires_at: i64) -> PortFuture<'a, KeyState> {
        Box::pin(async move {
            let mut item = Self::item(key_pk(event), KEY_SK, expires_at);
            item.insert(DATA_KEY.into(), AttributeValue::B(Blob::new(fresh.bytes().to_vec())));
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(pk)")
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .send()
                .await;
            match put {
                Ok(_) => Ok(KeyState::Live(fresh.clone())),
                Err(e) => {
                    let met = match e.as_service_error() {
                        Some(aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(
                            c,
                        )) => c.item().cloned(),
                        _ => return Err(port_error("dynamodb", &e)),
                    };
                    // The key already there (ours, if our write's answer was lost).
                    match met {
                        Some(item) => Ok(key_state(Some(&item))),
                        None => self.key_of(event).await,
                    }
                }
            }
        })
    }

    fn key_of<'a>(&'a self, event: &'a EventKey) -> PortFuture<'a, KeyState> {
        Box::pin(async move {
            let got = self
                .client
                .get_item()
                .table_name(&self.table)
                .key("pk", s(key_pk(event)))
                .key("sk", s(KEY_SK))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            Ok(key_state(got.item()))
        })
    }

    fn destroy<'a>(&'a self, event: &'a EventKey, by: &'a str, at_ms: i64, expires_at: i64) -> PortFuture<'a, ()> {
        Box::pin(async move {
            let mut item = Self::item(key_pk(event), KEY_SK, expires_at);
            item.insert(ERASED_AT.into(), n(at_ms));
            item.insert(ERASED_BY.into(), s(by));
            // A repeat keeps the first tombstone's time and author.
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression(format!("attribute_not_exists({ERASED_AT})"))
                .send()
                .await;
            match put {
                Ok(_) => Ok(()),
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(_))
                    ) =>
                {
                    Ok(())
                }
                Err(e) => Err(port_error("dynamodb", &e)),
            }
        })
    }

    fn index_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey, expires_at: i64) -> PortFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(Self::item(subject_pk(subject), event.as_str(), expires_at)))
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            Ok(())
        })
    }

    fn subject_events<'a>(&'a self, subject: &'a str) -> PortFuture<'a, Vec<EventKey>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut start = None;
            loop {
                let page = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .key_condition_expression("pk = :pk")
                    .expression_attribute_values(":pk", s(subject_pk(subject)))
                    .consistent_read(true)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| port_error("dynamodb", &e))?;
                out.extend(page.items().iter().filter_map(|i| get_s(i, "sk")).filter_map(EventKey::from_stored));
                start = page.last_evaluated_key().cloned();
                if start.is_none() {
                    return Ok(out);
                }
            }
        })
    }

    fn forget_subject<'a>(&'a self, subject: &'a str, event: &'a EventKey) -> PortFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .delete_item()
                .table_name(&self.table)
                .key("pk", s(subject_pk(subject)))
                .key("sk", s(event.as_str()))
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            Ok(())
        })
    }
}

/// The key table's definition: `pk`/`sk` strings, on demand, its TTL set
/// apart ([`create_keys_table`]).
pub async fn create_keys_table(client: &Client, table: &str) -> Result<(), crate::ledger::PortError> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TimeToLiveSpecification,
    };
    let attr =
        |name: &str| AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build();
    let key = |name: &str, kind| KeySchemaElement::builder().attribute_name(name).key_type(kind).build();
    #[allow(clippy::expect_used)] // Every required field is set above.
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk").expect("complete"))
        .attribute_definitions(attr("sk").expect("complete"))
        .key_schema(key("pk", KeyType::Hash).expect("complete"))
        .key_schema(key("sk", KeyType::Range).expect("complete"))
        .send()
        .await;
    if let Err(e) = created {
        let exists = e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception());
        if !exists {
            return Err(port_error("dynamodb", &e));
        }
    }
    #[allow(clippy::expect_used)]
    let ttl = TimeToLiveSpecification::builder()
        .attribute_name(super::TTL_ATTRIBUTE)
        .enabled(true)
        .build()
        .expect("complete");
    // Already on (a second setup) is no error.
    let _ = client.update_time_to_live().table_name(table).time_to_live_specification(ttl).send().await;
    Ok(())
}
