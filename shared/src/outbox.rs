//! Effectively-once side effects outside DynamoDB: the transactional outbox.
//!
//! A projection's notification is written as an outbox item in the same
//! transaction as its state change and the completion marker. A dispatcher
//! then claims the item (conditional update), publishes to SNS with a stable
//! idempotency key derived from the event identity (message attribute always;
//! FIFO deduplication id when the topic is FIFO), and marks it sent. A crash
//! between publish and mark leaves the item claimed; once that claim lapses
//! the item is published again — with the same key, so consumers (and FIFO
//! topics) drop the repeat.
//!
//! ```text
//! PENDING(due_at) ──claim(token)──▶ SENDING(token, due_at = lease end) ──mark(token)──▶ SENT
//!    ▲                                │        │
//!    └── publish failed: backoff ◀────┘        └── attempts exhausted ──▶ DEAD (OUTBOX_DEAD# partition)
//!        (due_at = now + delay)     lease lapsed (dispatcher died): claimable again
//! ```
//!
//! Every write carries the dispatcher's token, and a write whose condition
//! fails reads the item it met (`ReturnValuesOnConditionCheckFailure`): when
//! that item carries our own token, the write was ours and committed (the SDK
//! retried it after a lost acknowledgement), and the dispatcher continues as
//! the owner.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure, Select};
use aws_sdk_sns::types::MessageAttributeValue;

use crate::adapters::dynamodb::STATUS_INDEX;
use crate::adapters::dynamodb::outbox::{OUTBOX_SHARD_PREFIX, OUTBOX_SK, attr};
use crate::adapters::port_error;
use crate::backoff::{Backoff, random_jitter};
use crate::ledger::{PortError, error_chain};
use crate::policy::due_shard_named;

pub const IDEMPOTENCY_ATTRIBUTE: &str = "idempotency-key";
/// How long a dispatcher may hold an outbox item between claim and mark.
pub const DISPATCH_LEASE_MS: i64 = 30_000;
/// Status-index partition prefix of outbox items whose attempts are
/// exhausted: `OUTBOX_DEAD#007`. Apart from the ledger's `DEAD#…`, so
/// dead letters, `list --status dead` and replay see only ledger records.
pub const OUTBOX_DEAD_PREFIX: &str = "OUTBOX_DEAD";

/// The status-index partition of dead outbox items in `shard`.
pub fn dead_partition(shard: u32) -> String {
    due_shard_named(OUTBOX_DEAD_PREFIX, shard)
}

/// How a failed publish is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchPolicy {
    /// Delay before the next attempt after attempt `n` failed (the sweeper
    /// then takes the item once it is also past the reconciler's grace).
    pub backoff: Backoff,
    /// Attempts (claims) after which the item goes DEAD instead.
    pub max_attempts: u32,
}

impl Default for DispatchPolicy {
    /// 10 attempts over about 3 hours: 30 s, then 1, 2, 4, 8, 16, 32, 60, 60 min
    /// between them (each jittered down to half), plus the sweeper's grace.
    fn default() -> Self {
        Self { backoff: Backoff { base_ms: 30_000, max_ms: 3_600_000 }, max_attempts: 10 }
    }
}

/// Where a crash is injected in tests ("die between publish and mark").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchFault {
    #[default]
    None,
    AfterPublishBeforeMark,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    Published,
    /// Sent already, claimed by a live dispatcher, not yet due, or dead.
    Skipped,
    /// The publish failed; the item is PENDING again, due after its backoff.
    Retrying {
        attempts: u32,
        error: String,
    },
    /// The publish failed and the attempts are exhausted: the item is DEAD.
    Dead {
        attempts: u32,
        error: String,
    },
}

#[derive(Clone)]
pub struct Dispatcher {
    ddb: aws_sdk_dynamodb::Client,
    sns: aws_sdk_sns::Client,
    table: String,
    policy: DispatchPolicy,
    pub fault: DispatchFault,
}

type Item = HashMap<String, AttributeValue>;

fn text(item: &Item, k: &str) -> String {
    item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

fn number(item: &Item, k: &str) -> i64 {
    item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Error text kept on the item: bounded, never a payload (SNS errors do not echo the message).
fn short(error: &str) -> String {
    error.chars().take(500).collect()
}

impl Dispatcher {
    pub fn new(ddb: aws_sdk_dynamodb::Client, sns: aws_sdk_sns::Client, table: impl Into<String>) -> Self {
        Self { ddb, sns, table: table.into(), policy: DispatchPolicy::default(), fault: DispatchFault::None }
    }

    pub fn with_policy(mut self, policy: DispatchPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn key(pk: &str) -> Item {
        HashMap::from([
            (attr::PK.to_owned(), AttributeValue::S(pk.to_owned())),
            (attr::SK.to_owned(), AttributeValue::S(OUTBOX_SK.to_owned())),
        ])
    }

    /// The item a conditional update met: the one returned with the failure,
    /// or (emulators without `ReturnValuesOnConditionCheckFailure`) a read.
    async fn met(&self, pk: &str, returned: Option<&Item>) -> Result<Item, PortError> {
        if let Some(item) = returned {
            return Ok(item.clone());
        }
        let out = self
            .ddb
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.item.unwrap_or_default())
    }

    /// Runs a conditional update: `Ok(Ok(attributes returned))` when it
    /// applied, `Ok(Err(item met))` when its condition failed.
    async fn conditional(
        &self,
        pk: &str,
        req: aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder,
    ) -> Result<Result<Item, Item>, PortError> {
        match req.return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld).send().await {
            Ok(out) => Ok(Ok(out.attributes.unwrap_or_default())),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(ccf)) => {
                    Ok(Err(self.met(pk, ccf.item()).await?))
                }
                _ => Err(port_error("dynamodb", &e)),
            },
        }
    }

    /// Claims, publishes and marks one outbox item. A failed publish puts the
    /// item back with a backoff (or DEAD when its attempts are exhausted) and
    /// is reported as `Retrying`/`Dead`, not as an error; `Err` means the
    /// ledger itself failed (the item stays as it was, or claimed until its
    /// lease lapses).
    pub async fn dispatch(&self, pk: &str, now_ms: i64) -> Result<Dispatched, PortError> {
        let token = uuid::Uuid::new_v4().to_string();
        let until = now_ms + DISPATCH_LEASE_MS;
        // Timeline guarded: two dispatchers (the processor that wrote the item
        // and a sweeper, or two sweepers) must not both publish; a dispatcher
        // that died after claiming must not block the item forever (its lease
        // lapses, and `due_at` is set to the lapse so the sweeper looks again
        // then); an item backing off is not taken before it is due; and our
        // own SDK retry after a lost acknowledgement meets our token and
        // continues as the owner.
        let claim = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk)))
            .update_expression(
                "SET #s = :sending, dispatch_token = :tok, dispatch_until = :until, due_at = :until \
                 ADD dispatch_attempts :one",
            )
            .condition_expression(
                "(#s = :pending AND (attribute_not_exists(due_at) OR due_at <= :now)) \
                 OR (#s = :sending AND dispatch_until < :now)",
            )
            .expression_attribute_names("#s", attr::STATUS)
            .expression_attribute_values(":sending", AttributeValue::S("SENDING".into()))
            .expression_attribute_values(":pending", AttributeValue::S("PENDING".into()))
            .expression_attribute_values(":tok", AttributeValue::S(token.clone()))
            .expression_attribute_values(":until", AttributeValue::N(until.to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .return_values(ReturnValue::AllNew);
        let item = match self.conditional(pk, claim).await? {
            Ok(item) => item,
            Err(met) if text(&met, attr::DISPATCH_TOKEN) == token && text(&met, attr::STATUS) == "SENDING" => {
                tracing::info!(outbox = %pk, "outbox claim acknowledgement lost; continuing as its owner");
                met
            }
            Err(_) => return Ok(Dispatched::Skipped),
        };
        let attempts = u32::try_from(number(&item, attr::DISPATCH_ATTEMPTS)).unwrap_or(u32::MAX);
        if attempts > self.policy.max_attempts {
            // Dispatchers kept dying before they could record an outcome.
            let error = format!("{} claims without an outcome", attempts - 1);
            return self.failed(pk, &item, &token, attempts, error, now_ms).await;
        }

        let (topic, idem, group, body) = (
            text(&item, attr::TOPIC_ARN),
            text(&item, attr::IDEMPOTENCY_KEY),
            text(&item, attr::GROUP_ID),
            text(&item, attr::BODY),
        );
        let attr = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(&idem)
            .build()
            .map_err(|e| PortError::Unavailable { service: "sns", message: e.to_string() })?;
        let mut publish =
            self.sns.publish().topic_arn(&topic).message(body).message_attributes(IDEMPOTENCY_ATTRIBUTE, attr);
        if topic.ends_with(".fifo") {
            publish = publish
                .message_group_id(if group.is_empty() { "default".to_owned() } else { group })
                .message_deduplication_id(&idem);
        }
        if let Err(e) = publish.send().await {
            let error = error_chain(&e);
            return self.failed(pk, &item, &token, attempts, error, now_ms).await;
        }
        metrics::counter!("outbox_published").increment(1);

        if self.fault == DispatchFault::AfterPublishBeforeMark {
            return Err(PortError::Unavailable {
                service: "injected",
                message: "crash after publish, before mark".into(),
            });
        }
        // Timeline guarded: only the holder of the claim marks it sent. Our own
        // retry after a lost acknowledgement meets SENT with our token: done.
        // A dispatcher whose lease lapsed and was taken over has published
        // anyway; the new owner publishes again with the same key.
        let mark = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk)))
            .update_expression("SET #s = :sent, sent_at = :now REMOVE due_shard, due_at, dispatch_until")
            .condition_expression("#s = :sending AND dispatch_token = :tok")
            .expression_attribute_names("#s", attr::STATUS)
            .expression_attribute_values(":sent", AttributeValue::S("SENT".into()))
            .expression_attribute_values(":sending", AttributeValue::S("SENDING".into()))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
            .expression_attribute_values(":tok", AttributeValue::S(token.clone()));
        match self.conditional(pk, mark).await? {
            Ok(_) => {}
            Err(met) if text(&met, attr::STATUS) == "SENT" && text(&met, attr::DISPATCH_TOKEN) == token => {
                tracing::info!(outbox = %pk, "outbox mark acknowledgement lost; it is marked");
            }
            Err(met) => {
                tracing::warn!(outbox = %pk, status = %text(&met, attr::STATUS),
                    "published after the dispatch lease lapsed; the new owner republishes with the same key");
            }
        }
        Ok(Dispatched::Published)
    }

    /// Records a failed attempt: PENDING again after a backoff, or DEAD when
    /// the attempts are exhausted (out of the due index, into the
    /// `OUTBOX_DEAD#…` status partition).
    async fn failed(
        &self,
        pk: &str,
        item: &Item,
        token: &str,
        attempts: u32,
        error: String,
        now_ms: i64,
    ) -> Result<Dispatched, PortError> {
        let dead = attempts >= self.policy.max_attempts;
        let base = self
            .ddb
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(pk)))
            .condition_expression("#s = :sending AND dispatch_token = :tok")
            .expression_attribute_names("#s", attr::STATUS)
            .expression_attribute_values(":sending", AttributeValue::S("SENDING".into()))
            .expression_attribute_values(":tok", AttributeValue::S(token.to_owned()))
            .expression_attribute_values(":err", AttributeValue::S(short(&error)))
            .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()));
        let req = if dead {
            // The shard of the item's `due_shard` (`out#007` → `OUTBOX_DEAD#007`).
            let shard = text(item, attr::DUE_SHARD).rsplit('#').next().and_then(|s| s.parse().ok()).unwrap_or(0);
            base.update_expression(
                "SET #s = :dead, last_error = :err, last_failed_at = :now, dead_at = :now, st_shard = :st, st_at = :now \
                 REMOVE due_shard, due_at, dispatch_until",
            )
            .expression_attribute_values(":dead", AttributeValue::S("DEAD".into()))
            .expression_attribute_values(":st", AttributeValue::S(dead_partition(shard)))
        } else {
            let delay = self.policy.backoff.delay_ms(attempts, random_jitter());
            base.update_expression(
                "SET #s = :pending, last_error = :err, last_failed_at = :now, due_at = :next REMOVE dispatch_until",
            )
            .expression_attribute_values(":pending", AttributeValue::S("PENDING".into()))
            .expression_attribute_values(":next", AttributeValue::N((now_ms + delay).to_string()))
        };
        // Timeline guarded: only the claim's holder records its failure; our
        // own retry after a lost acknowledgement meets our token with the
        // outcome already written. A lapsed lease taken over by another
        // dispatcher leaves the item to it.
        match self.conditional(pk, req).await? {
            Ok(_) => {}
            Err(met) if text(&met, attr::DISPATCH_TOKEN) == token => {}
            Err(_) => tracing::warn!(outbox = %pk, "dispatch lease lapsed before the failure was recorded"),
        }
        metrics::counter!("outbox_failed").increment(1);
        if dead {
            metrics::counter!("outbox_dead_lettered").increment(1);
            tracing::error!(outbox = %pk, attempts, error = %error, "outbox item is DEAD: attempts exhausted");
            Ok(Dispatched::Dead { attempts, error })
        } else {
            tracing::warn!(outbox = %pk, attempts, error = %error, "outbox publish failed; retrying after a backoff");
            Ok(Dispatched::Retrying { attempts, error })
        }
    }

    /// Publishes outbox items that are still pending (or whose dispatcher
    /// died) from the `due` index shards `out#000..`, oldest first, at most
    /// `limit`. Items younger than `grace_ms` are left to their processor.
    /// One item's failure does not stop the others (it is rescheduled or
    /// logged); returns how many were published.
    pub async fn sweep(&self, shards: u32, now_ms: i64, grace_ms: i64, limit: usize) -> Result<usize, PortError> {
        let mut published = 0;
        for shard in 0..shards {
            for item in self.due(shard, now_ms - grace_ms, limit).await? {
                if published >= limit {
                    return Ok(published);
                }
                let pk = text(&item, attr::PK);
                match self.dispatch(&pk, now_ms).await {
                    Ok(Dispatched::Published) => published += 1,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(outbox = %pk, error = %e, "outbox dispatch failed"),
                }
            }
        }
        Ok(published)
    }

    /// Outbox items in `shard` due at `up_to` or earlier, oldest first.
    pub async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<Item>, PortError> {
        let out = self
            .ddb
            .query()
            .table_name(&self.table)
            .index_name(crate::adapters::dynamodb::DUE_INDEX)
            .key_condition_expression("due_shard = :s AND due_at <= :t")
            .expression_attribute_values(":s", AttributeValue::S(due_shard_named(OUTBOX_SHARD_PREFIX, shard)))
            .expression_attribute_values(":t", AttributeValue::N(up_to.to_string()))
            .limit(limit.clamp(1, 100) as i32)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(out.items.unwrap_or_default())
    }
}

/// Counts dead outbox items (the `OUTBOX_DEAD#…` status partitions).
pub async fn count_dead(ddb: &aws_sdk_dynamodb::Client, table: &str, shards: u32) -> Result<u64, PortError> {
    let mut total = 0;
    for shard in 0..shards {
        let mut start = None;
        loop {
            let page = ddb
                .query()
                .table_name(table)
                .index_name(STATUS_INDEX)
                .key_condition_expression("st_shard = :p")
                .expression_attribute_values(":p", AttributeValue::S(dead_partition(shard)))
                .select(Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| port_error("dynamodb", &e))?;
            total += page.count.max(0) as u64;
            match page.last_evaluated_key {
                Some(k) => start = Some(k),
                None => break,
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_gives_up_after_hours_not_minutes() {
        let p = DispatchPolicy::default();
        let total: i64 = (1..p.max_attempts).map(|a| p.backoff.delay_ms(a, 1.0)).sum();
        assert!((2 * 3_600_000..=4 * 3_600_000).contains(&total), "{total}");
        assert_eq!(dead_partition(7), "OUTBOX_DEAD#007");
    }
}
