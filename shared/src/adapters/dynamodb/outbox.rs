//! The outbox item on DynamoDB ([`OutboxStore`]): its attribute names, the
//! conditional put that writes it inside a processor's commit transaction,
//! and the dispatcher's transitions (expressions in `conditions`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

use super::conditions::{self as cond, outbox_status};
use super::{Item, Written};
use crate::audit::AuditEntry;
use crate::identity::EventKey;
use crate::ledger::PortError;
use crate::message::{Held, OutboxClaim, OutboxItem, OutboxMessage, OutboxState, idempotency_key};
use crate::ports::{Circuit, CircuitChange, CircuitStore, OutboxPartition, OutboxStore, Rate, RateChange, RateWritten};

pub const OUTBOX_SK: &str = "outbox";
/// The sort key of a destination's circuit item (`dest#<name>`).
pub const CIRCUIT_SK: &str = "circuit";

/// The partition key of `destination`'s circuit item.
pub fn circuit_pk(destination: &str) -> String {
    format!("dest#{destination}")
}

/// The sort key of a destination's rate item (`dest#<name>`, beside its circuit).
pub const RATE_SK: &str = "rate";

/// A rate item as the port reads it.
pub(crate) fn rate_of(item: &Item) -> Rate {
    let num = |k: &str| item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
    Rate {
        next_at: num("next_at"),
        granted_at: num("granted_at"),
        grants: u64::try_from(num("grants").unwrap_or(0)).unwrap_or(0),
        slow_factor: u32::try_from(num("slow_factor").unwrap_or(1)).unwrap_or(1).max(1),
        slow_until: num("slow_until"),
        throttled_at: num("throttled_at"),
        flights: item.get("flights").and_then(|v| v.as_ss().ok()).cloned().unwrap_or_default(),
    }
}

/// A rate change's update.
pub(crate) fn rate_update(change: &RateChange<'_>) -> cond::Update {
    match *change {
        RateChange::GrantNow { step_ms, now_ms } => cond::rate_grant_now(step_ms, now_ms),
        RateChange::GrantNext { step_ms, horizon_ms, now_ms } => cond::rate_grant_next(step_ms, horizon_ms, now_ms),
        RateChange::Slow { resume_ms, factor, until_ms, now_ms } => {
            cond::rate_slow(resume_ms, factor, until_ms, now_ms)
        }
        RateChange::SlowKeep { factor, until_ms, now_ms } => cond::rate_slow_keep(factor, until_ms, now_ms),
        RateChange::TakeFlight { flight, max } => cond::flight_take(flight, max),
        RateChange::Land { flight } => cond::flight_land(flight),
        RateChange::Clean { expired } => cond::flight_clean(expired),
    }
}

/// A circuit item as the port reads it.
pub(crate) fn circuit_of(item: &Item) -> Circuit {
    let opt = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    let num = |k: &str| item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
    Circuit {
        failures: u32::try_from(num("failures").unwrap_or(0).max(0)).unwrap_or(u32::MAX),
        open_until: num("open_until"),
        probe_until: num("probe_until"),
        probe_token: opt("probe_token"),
        failure_token: opt("failure_token"),
        open_token: opt("open_token"),
        close_token: opt("close_token"),
    }
}

/// Which of a circuit's tokens a change writes.
type TokenOf = fn(&Circuit) -> Option<&String>;

/// A circuit change's update, and how its refusal recognises the change's
/// own earlier write (the circuit it met carries the change's token).
pub(crate) fn circuit_update(change: CircuitChange<'_>) -> (cond::Update, impl Fn(&Circuit) -> bool) {
    let (update, token, field): (_, Option<String>, TokenOf) = match change {
        CircuitChange::Failure { token, now_ms } => {
            (cond::circuit_failure(token, now_ms), Some(token.to_owned()), |c| c.failure_token.as_ref())
        }
        CircuitChange::Open { token, until_ms, now_ms } => {
            (cond::circuit_open(token, until_ms, now_ms), Some(token.to_owned()), |c| c.open_token.as_ref())
        }
        CircuitChange::Probe { token, until_ms, now_ms } => {
            (cond::circuit_probe(token, until_ms, now_ms), Some(token.to_owned()), |c| c.probe_token.as_ref())
        }
        CircuitChange::Close { now_ms, probe: Some(token) } => {
            (cond::circuit_close(token, now_ms), Some(token.to_owned()), |c| c.close_token.as_ref())
        }
        CircuitChange::Close { now_ms, probe: None } => (cond::circuit_reset(now_ms), None, |_| None),
    };
    (update, move |met: &Circuit| token.is_some() && field(met) == token.as_ref())
}
/// The due-index partition of an outbox item of `shard`: `out#007` (a
/// release that kept them in `due#007` with the records is upgraded by
/// `hookledger migrate`).
pub fn outbox_partition(shard: u32) -> String {
    super::due_partition(crate::ledger::DuePartition::Outbox, shard)
}

/// The due-index partition where deliveries to `destination` wait while its
/// circuit is open (`wait#<name>`): out of the sweep's partitions, so a
/// destination down for hours costs the sweep nothing, read page by page
/// when it is back.
pub fn wait_partition(destination: &str) -> String {
    format!("wait#{destination}")
}

/// A refused unwait: the item met is back in its home partition, still to
/// be sent (an earlier unwait whose acknowledgement was lost, or another
/// drain's): hand it over anyway, its claim keeps it single.
pub(crate) fn unwaited(met: Option<&Item>) -> bool {
    met.is_some_and(|m| {
        let st = text(m, attr::STATUS);
        text(m, attr::DUE_SHARD).starts_with("out#") && (st == outbox_status::PENDING || st == outbox_status::SENDING)
    })
}

/// Attribute names of the outbox item.
pub mod attr {
    pub const PK: &str = "pk";
    pub const SK: &str = "sk";
    pub const STATUS: &str = "status";
    pub const IDEMPOTENCY_KEY: &str = "idempotency_key";
    pub const EVENT_KEY: &str = "event_key";
    pub const TOPIC_ARN: &str = "topic_arn";
    pub const ACTION: &str = "action";
    pub const GROUP_ID: &str = "group_id";
    pub const BODY: &str = "body";
    pub const CREATED_AT: &str = "created_at";
    pub const DUE_SHARD: &str = "due_shard";
    pub const DUE_AT: &str = "due_at";
    /// While a delivery waits for its destination: its home partition.
    pub const HOME_DUE: &str = "home_due";
    pub const DISPATCH_TOKEN: &str = "dispatch_token";
    pub const DISPATCH_ATTEMPTS: &str = "dispatch_attempts";
    pub const DISPATCH_UNTIL: &str = "dispatch_until";
    /// A route's delivery: the destination's name, EventBridge's `Source`
    /// and `DetailType`, and the event's payload hash.
    pub const DESTINATION: &str = "destination";
    pub const SOURCE: &str = "source";
    pub const DETAIL_TYPE: &str = "detail_type";
    pub const PAYLOAD_HASH: &str = "payload_hash";
    pub const RECEIVED_AT: &str = "received_at";
}

/// The attention-index partition of dead outbox items in `shard` (with the
/// ledger's DEAD and PARKED records; `sk = outbox` tells them apart, so dead
/// letters, `list --status dead` and replay see only ledger records).
pub fn dead_partition(shard: u32) -> String {
    super::attention_shard(shard)
}

/// The outbox item for `msg` produced by the event `key`, committed by the
/// lease `token`: written already claimed by that token (SENDING until
/// [`crate::message::DISPATCH_LEASE_MS`] from now, one attempt), a route's
/// delivery and a projection's notification alike, so the processor that
/// committed it sends and marks it (two requests) without a claim of its
/// own (a claim moves the item's `due` entry: three write units spared);
/// if it dies, the claim lapses and the reconciler's sweep takes the item
/// over. `indexed`: in its shard's outbox partition of the `due` index (due
/// when the claim lapses), as a route's delivery and a notification
/// committed with the completion always are; else out of it (a guarded
/// op's notification, sent before the completion: see docs/architecture.md
/// "The commit"), put there only when it is not sent
/// ([`crate::adapters::dynamodb::conditions::outbox_index`]).
pub fn outbox_put(
    table: &str,
    key: &EventKey,
    msg: &OutboxMessage,
    token: &str,
    now_ms: i64,
    shards: u32,
    indexed: bool,
) -> (String, TransactWriteItem) {
    let idem = idempotency_key(key.as_str(), &msg.action);
    let pk = crate::message::outbox_id(key.as_str(), &msg.action);
    let shard = EventKey::from_stored(key.as_str()).map_or(0, |k| k.shard(shards));
    let until = now_ms + crate::message::DISPATCH_LEASE_MS;
    let mut item = HashMap::from([
        (attr::PK.to_owned(), AttributeValue::S(pk.clone())),
        (attr::SK.to_owned(), AttributeValue::S(OUTBOX_SK.to_owned())),
        (attr::STATUS.to_owned(), AttributeValue::S(outbox_status::SENDING.into())),
        (attr::DISPATCH_TOKEN.to_owned(), AttributeValue::S(token.to_owned())),
        (attr::DISPATCH_UNTIL.to_owned(), AttributeValue::N(until.to_string())),
        (attr::DISPATCH_ATTEMPTS.to_owned(), AttributeValue::N("1".into())),
        (attr::IDEMPOTENCY_KEY.to_owned(), AttributeValue::S(idem)),
        (attr::EVENT_KEY.to_owned(), AttributeValue::S(key.as_str().to_owned())),
        (attr::TOPIC_ARN.to_owned(), AttributeValue::S(msg.topic_arn.clone())),
        (attr::ACTION.to_owned(), AttributeValue::S(msg.action.clone())),
        (attr::GROUP_ID.to_owned(), AttributeValue::S(msg.group.clone())),
        (attr::BODY.to_owned(), AttributeValue::S(msg.body.to_string())),
        (attr::CREATED_AT.to_owned(), AttributeValue::N(now_ms.to_string())),
    ]);
    if indexed || msg.delivery.is_some() {
        item.insert(attr::DUE_SHARD.to_owned(), AttributeValue::S(outbox_partition(shard)));
        item.insert(attr::DUE_AT.to_owned(), AttributeValue::N(until.to_string()));
    }
    if let Some(d) = &msg.delivery {
        for (k, v) in [
            (attr::DESTINATION, d.destination.clone()),
            (attr::SOURCE, d.source.clone()),
            (attr::DETAIL_TYPE, d.detail_type.clone()),
            (attr::PAYLOAD_HASH, d.payload_hash.clone()),
        ] {
            item.insert(k.to_owned(), AttributeValue::S(v));
        }
        item.insert(attr::RECEIVED_AT.to_owned(), AttributeValue::N(d.received_at_ms.to_string()));
    }
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression(cond::OUTBOX_NEW)
        .build()
        .unwrap_or_else(|e| unreachable!("table and item are set: {e}"));
    (pk, TransactWriteItem::builder().put(put).build())
}

/// The outbox items of the ledger table.
#[derive(Clone)]
pub struct DynamoOutbox {
    ledger: super::DynamoLedger,
}

/// A delivery's replay entry as written: the call's token its id.
pub(crate) fn revive_entry(entry: &AuditEntry, id: &str, token: &str) -> AuditEntry {
    AuditEntry { id: token.to_owned(), target: id.to_owned(), ..entry.clone() }
}

/// A refused replay of a delivery: already replayed by this run (a rerun of
/// an interrupted batch; its entry was written then), or not DEAD.
pub(crate) fn revived_by(met: Option<&Item>, run: &str) -> bool {
    met.is_some_and(|m| text(m, "status") == outbox_status::PENDING && text(m, "revive_token") == run)
}

pub(crate) fn text(item: &Item, k: &str) -> String {
    item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

fn number(item: &Item, k: &str) -> i64 {
    item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Error text kept on the item: bounded, never a payload (SNS errors do not echo the message).
pub(crate) fn short(error: &str) -> String {
    error.chars().take(500).collect()
}

impl DynamoOutbox {
    /// The outbox items of this ledger's table (its entropy and retention).
    pub fn on(ledger: super::DynamoLedger) -> Self {
        Self { ledger }
    }

    /// The outbox items of a due-index `partition` due at `up_to` or earlier, oldest first.
    async fn outbox_ids(&self, partition: &str, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        let (keys, _) = self.ledger.due_keys(partition, up_to, limit, None).await?;
        Ok(keys
            .iter()
            .filter(|k| text(k, attr::SK) == OUTBOX_SK)
            .map(|k| text(k, attr::PK))
            .filter(|pk| !pk.is_empty())
            .collect())
    }

    async fn fenced_write(&self, id: &str, token: &str, update: cond::Update) -> Result<Held, PortError> {
        match self.ledger.conditional(id, OUTBOX_SK, update, false).await? {
            Written::Applied(_) => Ok(Held::Yes),
            Written::Refused(met) => Ok(held_by(met.as_ref(), token)),
        }
    }
}

/// What a refused outbox claim met: our own claim (our retried update:
/// SENDING with our token), or an item not ours to take now.
pub(crate) fn claim_refused(met: Option<&Item>, token: &str) -> OutboxClaim {
    match met {
        Some(met) if text(met, attr::DISPATCH_TOKEN) == token && text(met, attr::STATUS) == outbox_status::SENDING => {
            OutboxClaim::Claimed(claimed(met))
        }
        _ => OutboxClaim::Skipped,
    }
}

/// What a refused fenced write met: our own earlier write (our token), or
/// a claim that lapsed to another dispatcher.
pub(crate) fn held_by(met: Option<&Item>, token: &str) -> Held {
    if met.is_some_and(|m| text(m, attr::DISPATCH_TOKEN) == token) { Held::Yes } else { Held::Lapsed }
}

/// The item as an operator reads it.
pub(crate) fn state_of(item: &Item) -> OutboxState {
    let opt = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
    let num = |k: &str| item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
    OutboxState {
        id: text(item, attr::PK),
        status: text(item, attr::STATUS),
        destination: opt(attr::DESTINATION),
        event_key: text(item, attr::EVENT_KEY),
        idempotency_key: text(item, attr::IDEMPOTENCY_KEY),
        attempts: u32::try_from(number(item, attr::DISPATCH_ATTEMPTS)).unwrap_or(u32::MAX),
        last_error: opt("last_error"),
        due_at: num(attr::DUE_AT),
        sent_at: num("sent_at"),
        dead_at: num("dead_at"),
        created_at: num(attr::CREATED_AT),
        granted_at: num("granted_at"),
        replay_run: opt("revive_token"),
        waiting: text(item, attr::DUE_SHARD).starts_with("wait#"),
        last_failed_at: num("last_failed_at"),
    }
}

pub(crate) fn claimed(item: &Item) -> OutboxItem {
    let delivery = item.contains_key(attr::DESTINATION).then(|| crate::message::Delivery {
        destination: text(item, attr::DESTINATION),
        source: text(item, attr::SOURCE),
        detail_type: text(item, attr::DETAIL_TYPE),
        payload_hash: text(item, attr::PAYLOAD_HASH),
        received_at_ms: number(item, attr::RECEIVED_AT),
    });
    OutboxItem {
        event_key: text(item, attr::EVENT_KEY),
        created_at_ms: number(item, attr::CREATED_AT),
        delivery,
        id: text(item, attr::PK),
        idempotency_key: text(item, attr::IDEMPOTENCY_KEY),
        topic_arn: text(item, attr::TOPIC_ARN),
        group: text(item, attr::GROUP_ID),
        body: text(item, attr::BODY),
        attempts: u32::try_from(number(item, attr::DISPATCH_ATTEMPTS)).unwrap_or(u32::MAX),
        // The shard of the item's `due_shard` (`out#007` → 7), or of its
        // home partition while it waits for its destination.
        shard: [attr::DUE_SHARD, attr::HOME_DUE]
            .iter()
            .find_map(|a| text(item, a).strip_prefix("out#").and_then(|s| s.parse().ok()))
            .unwrap_or(0),
    }
}

impl crate::ports::Activity for DynamoOutbox {
    async fn note_activity(&self, now_ms: i64) {
        self.ledger.note_activity(now_ms).await
    }
}

impl OutboxStore for DynamoOutbox {
    async fn claim(&self, id: &str, token: &str, now_ms: i64, until_ms: i64) -> Result<OutboxClaim, PortError> {
        match self.ledger.conditional(id, OUTBOX_SK, cond::outbox_claim(token, now_ms, until_ms), true).await? {
            Written::Applied(Some(item)) => Ok(OutboxClaim::Claimed(claimed(&item))),
            Written::Applied(None) => {
                Err(PortError::Unavailable { service: "dynamodb", message: "claimed outbox item not returned".into() })
            }
            Written::Refused(met) => {
                let answer = claim_refused(met.as_ref(), token);
                if matches!(answer, OutboxClaim::Claimed(_)) {
                    tracing::info!(outbox = %id, "outbox claim acknowledgement lost; continuing as its owner");
                }
                Ok(answer)
            }
        }
    }

    async fn mark_sent(&self, id: &str, token: &str, granted_at: Option<i64>, now_ms: i64) -> Result<Held, PortError> {
        let expires_at = crate::policy::expires_at(now_ms, self.ledger.retention_days);
        self.fenced_write(id, token, cond::outbox_sent(token, granted_at, now_ms, expires_at)).await
    }

    async fn hold(&self, id: &str, token: &str, until_ms: i64) -> Result<Held, PortError> {
        self.fenced_write(id, token, cond::outbox_hold(token, until_ms)).await
    }

    async fn back_off(
        &self,
        id: &str,
        token: &str,
        next_at_ms: i64,
        error: &str,
        now_ms: i64,
    ) -> Result<Held, PortError> {
        self.fenced_write(id, token, cond::outbox_back_off(token, next_at_ms, &short(error), now_ms)).await
    }

    async fn defer(
        &self,
        id: &str,
        token: &str,
        destination: &str,
        shard: u32,
        why: &str,
        now_ms: i64,
    ) -> Result<Held, PortError> {
        let update =
            cond::outbox_defer(token, &wait_partition(destination), &outbox_partition(shard), &short(why), now_ms);
        self.fenced_write(id, token, update).await
    }

    async fn waiting(&self, destination: &str, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.outbox_ids(&wait_partition(destination), up_to, limit).await
    }

    async fn unwait(&self, id: &str, destination: &str, now_ms: i64) -> Result<bool, PortError> {
        let wait = wait_partition(destination);
        Ok(match self.ledger.conditional(id, OUTBOX_SK, cond::outbox_unwait(&wait, now_ms), false).await? {
            Written::Applied(_) => true,
            Written::Refused(met) => unwaited(met.as_ref()),
        })
    }

    async fn dead(&self, id: &str, token: &str, shard: u32, error: &str, now_ms: i64) -> Result<Held, PortError> {
        self.fenced_write(id, token, cond::outbox_dead(token, &dead_partition(shard), &short(error), now_ms)).await
    }

    async fn state(&self, id: &str) -> Result<Option<OutboxState>, PortError> {
        Ok(self.ledger.read_item(id, OUTBOX_SK).await?.as_ref().map(state_of))
    }

    /// One eventually consistent `BatchGetItem` per hundred ids.
    async fn states(&self, ids: &[String]) -> Result<Vec<OutboxState>, PortError> {
        let keys = ids.iter().map(|id| super::DynamoLedger::item_key(id, OUTBOX_SK)).collect();
        Ok(self.ledger.batch_read_as(keys, false).await?.iter().map(state_of).collect())
    }

    async fn states_in(
        &self,
        partition: OutboxPartition<'_>,
        max: usize,
    ) -> Result<(Vec<OutboxState>, bool), PortError> {
        let (index, key, name) = match partition {
            OutboxPartition::Home(shard) => (super::DUE_INDEX, attr::DUE_SHARD, outbox_partition(shard)),
            OutboxPartition::Waiting(d) => (super::DUE_INDEX, attr::DUE_SHARD, wait_partition(d)),
            OutboxPartition::Dead(shard) => (super::ATTENTION_INDEX, "attn_shard", dead_partition(shard)),
        };
        let mut keys = Vec::new();
        let mut start = None;
        let more = loop {
            let page = self
                .ledger
                .client()
                .query()
                .table_name(self.ledger.table())
                .index_name(index)
                .key_condition_expression("#p = :p")
                .expression_attribute_names("#p", key)
                .expression_attribute_values(":p", AttributeValue::S(name.clone()))
                // One more than asked: whether more are left is then known.
                .limit(i32::try_from((max + 1 - keys.len()).clamp(1, 1000)).unwrap_or(1000))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| super::super::port_error("dynamodb", &e))?;
            let items = page.items.unwrap_or_default();
            keys.extend(
                items
                    .iter()
                    .filter(|k| text(k, attr::SK) == OUTBOX_SK)
                    .map(|k| super::DynamoLedger::item_key(&text(k, attr::PK), OUTBOX_SK)),
            );
            if keys.len() > max {
                keys.truncate(max);
                break true;
            }
            match page.last_evaluated_key {
                Some(next) => start = Some(next),
                None => break false,
            }
        };
        let states = self.ledger.batch_read(keys).await?.iter().map(state_of).collect();
        Ok((states, more))
    }

    async fn dead_items(&self, shard: u32, limit: usize) -> Result<Vec<String>, PortError> {
        let page = self
            .ledger
            .client()
            .query()
            .table_name(self.ledger.table())
            .index_name(super::ATTENTION_INDEX)
            .key_condition_expression("attn_shard = :p")
            .filter_expression("sk = :outbox")
            .expression_attribute_values(":p", AttributeValue::S(dead_partition(shard)))
            .expression_attribute_values(":outbox", AttributeValue::S(OUTBOX_SK.to_owned()))
            .scan_index_forward(false)
            .limit(i32::try_from(limit.clamp(1, 1000)).unwrap_or(1000))
            .send()
            .await
            .map_err(|e| super::super::port_error("dynamodb", &e))?;
        Ok(page.items.unwrap_or_default().iter().map(|i| text(i, attr::PK)).filter(|pk| !pk.is_empty()).collect())
    }

    async fn revive(&self, id: &str, run: &str, shard: u32, entry: &AuditEntry) -> Result<bool, PortError> {
        let entry = revive_entry(entry, id, &self.ledger.ambient.token());
        let update =
            cond::outbox_revive(run, &outbox_partition(shard), &entry.operator, &short(&entry.reason), entry.at_ms);
        let item = super::audit::update_item(self.ledger.table(), id, OUTBOX_SK, update);
        match self.ledger.audited(vec![item], &entry).await? {
            super::audit::Audited::Done => Ok(true),
            super::audit::Audited::Refused(met) => {
                let met = match met.into_iter().next().flatten() {
                    Some(met) if !met.is_empty() => Some(met),
                    _ => self.ledger.read_item(id, OUTBOX_SK).await?,
                };
                Ok(revived_by(met.as_ref(), run))
            }
        }
    }

    async fn due(&self, shard: u32, up_to: i64, limit: usize) -> Result<Vec<String>, PortError> {
        self.outbox_ids(&outbox_partition(shard), up_to, limit).await
    }
}

impl CircuitStore for DynamoOutbox {
    async fn rate(&self, destination: &str) -> Result<Option<Rate>, PortError> {
        Ok(self.ledger.read_item(&circuit_pk(destination), RATE_SK).await?.as_ref().map(rate_of))
    }

    async fn change_rate(&self, destination: &str, change: RateChange<'_>) -> Result<RateWritten, PortError> {
        Ok(match self.ledger.conditional(&circuit_pk(destination), RATE_SK, rate_update(&change), true).await? {
            Written::Applied(after) => RateWritten::Applied(rate_of(&after.unwrap_or_default())),
            Written::Refused(met) => RateWritten::Refused(met.as_ref().map(rate_of)),
        })
    }

    async fn circuit(&self, destination: &str) -> Result<Option<Circuit>, PortError> {
        Ok(self.ledger.read_item(&circuit_pk(destination), CIRCUIT_SK).await?.as_ref().map(circuit_of))
    }

    /// One consistent `BatchGetItem` per hundred destinations.
    async fn circuits(&self, destinations: &[String]) -> Result<Vec<Option<Circuit>>, PortError> {
        if destinations.is_empty() {
            return Ok(Vec::new());
        }
        let keys = destinations.iter().map(|d| super::DynamoLedger::item_key(&circuit_pk(d), CIRCUIT_SK)).collect();
        let found = self.ledger.batch_read(keys).await?;
        Ok(destinations
            .iter()
            .map(|d| {
                let pk = circuit_pk(d);
                found.iter().find(|i| text(i, attr::PK) == pk).map(circuit_of)
            })
            .collect())
    }

    async fn change_circuit(&self, destination: &str, change: CircuitChange<'_>) -> Result<Option<Circuit>, PortError> {
        let (update, ours) = circuit_update(change);
        Ok(match self.ledger.conditional(&circuit_pk(destination), CIRCUIT_SK, update, true).await? {
            Written::Applied(after) => Some(circuit_of(&after.unwrap_or_default())),
            Written::Refused(met) => met.as_ref().map(circuit_of).filter(|c| ours(c)),
        })
    }
}
