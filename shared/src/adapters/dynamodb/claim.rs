//! The intake's writes on the ledger record ([`Ledger`]): the claim, the
//! payload, the send lease, and the duplicate evidence. The expressions are
//! in `conditions`.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};

use super::conditions::{self as cond, Update};
use super::{DynamoLedger, META_SK, Written, attr, existing_from_item, get_s, new_record_item, payload_item};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{Claim, NewEvent, PortError, SendLease};
use crate::ports::Ledger;

impl DynamoLedger {
    /// Creates a record as the previous release's claim did: alone, its
    /// payload item written by a second request (`payload_stored` false
    /// until then). Such records are in flight when a new release starts;
    /// this writes one for the upgrade path's tests.
    pub async fn claim_record_only(&self, event: &NewEvent) -> Result<(), PortError> {
        let mut item = new_record_item(event);
        item.insert(attr::PAYLOAD_STORED.into(), aws_sdk_dynamodb::types::AttributeValue::Bool(false));
        self.client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .condition_expression(cond::CLAIM)
            .send()
            .await
            .map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }

    /// An update of the record that must apply (its condition is only that
    /// the record exists, or it concerns our own lease).
    async fn update_meta(&self, key: &EventKey, update: Update) -> Result<(), PortError> {
        let req = self.client().update_item().table_name(self.table()).set_key(Some(Self::key(key, META_SK)));
        update.apply(req).send().await.map_err(|e| port_error("dynamodb", &e))?;
        Ok(())
    }
}

impl Ledger for DynamoLedger {
    async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
        // Timeline guarded: two deliveries (or our own SDK retry after a lost
        // response) race to create the record; exactly one transaction
        // passes `conditions::CLAIM`, the other gets the winner's record
        // back. The record and its payload item commit together, so a record
        // says its payload is durable. A transaction that committed and lost
        // its acknowledgement is retried by the SDK with the same
        // `ClientRequestToken` (the send token): DynamoDB answers it as a
        // success; an endpoint that ignores the token fails it against its
        // own record, whose send token says so, and the claim is ours
        // (`Claim::New`), never a duplicate.
        let meta = Put::builder()
            .table_name(self.table())
            .set_item(Some(new_record_item(event)))
            .condition_expression(cond::CLAIM)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| PortError::Unavailable { service: "dynamodb", message: e.to_string() })?;
        let payload = Put::builder()
            .table_name(self.table())
            .set_item(Some(payload_item(&event.key, &event.payload_hash, body, event.expires_at)))
            .build()
            .map_err(|e| PortError::Unavailable { service: "dynamodb", message: e.to_string() })?;
        let result = self
            .client()
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(meta).build())
            .transact_items(TransactWriteItem::builder().put(payload).build())
            .client_request_token(&event.send.token)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Claim::New),
            Err(err) => err,
        };
        let met = match err.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(cancel)) => {
                let reason = cancel.cancellation_reasons().first();
                match reason.and_then(|r| r.code()) {
                    Some("ConditionalCheckFailed") => reason.and_then(|r| r.item()).cloned(),
                    // Two claims of one key at once: the other one's record
                    // decides, once it is there.
                    Some("TransactionConflict") => None,
                    _ => return Err(port_error("dynamodb", &err)),
                }
            }
            _ => return Err(port_error("dynamodb", &err)),
        };
        let item = match met {
            Some(item) => item,
            // Endpoints without the item in the cancellation reason, and the
            // conflict: read it.
            None => self.read_meta(&event.key).await?.ok_or_else(|| PortError::Unavailable {
                service: "dynamodb",
                message: "claim conflicted and no record is there yet".into(),
            })?,
        };
        if get_s(&item, attr::SEND_TOKEN) == Some(event.send.token.as_str()) {
            return Ok(Claim::New);
        }
        Ok(Claim::Existing(existing_from_item(&item)?))
    }

    async fn store_payload(
        &self,
        key: &EventKey,
        payload_hash: &str,
        body: &[u8],
        expires_at: i64,
    ) -> Result<(), PortError> {
        self.put_payload(key, payload_hash, body, expires_at).await?;
        self.update_meta(key, cond::payload_stored(payload_hash)).await
    }

    async fn take_send_lease(&self, key: &EventKey, lease: &SendLease, now_ms: i64) -> Result<bool, PortError> {
        match self.conditional(key.as_str(), META_SK, cond::take_send_lease(lease, now_ms), false).await? {
            Written::Applied(_) => Ok(true),
            // Our own retried update after a lost acknowledgement finds the
            // lease it took: still ours (unless the key was sent since).
            Written::Refused(met) => Ok(met.is_some_and(|old| {
                get_s(&old, attr::SEND_TOKEN) == Some(lease.token.as_str()) && !old.contains_key(attr::ENQUEUED_AT)
            })),
        }
    }

    async fn adopt_payload(
        &self,
        key: &EventKey,
        old_hash: &str,
        new_hash: &str,
        body: &[u8],
        expires_at: i64,
        conflict: bool,
    ) -> Result<bool, PortError> {
        self.put_payload(key, new_hash, body, expires_at).await?;
        match self.conditional(key.as_str(), META_SK, cond::adopt_payload(old_hash, new_hash, conflict), false).await? {
            Written::Applied(_) => Ok(true),
            Written::Refused(met) => Ok(met.is_some_and(|old| {
                get_s(&old, attr::PAYLOAD_HASH) == Some(new_hash)
                    && old.get(attr::PAYLOAD_STORED).and_then(|v| v.as_bool().ok()) == Some(&true)
            })),
        }
    }

    async fn release_send_lease(&self, key: &EventKey, lease: &SendLease) -> Result<(), PortError> {
        // Someone else holds it now: nothing to release.
        self.conditional_ok(key.as_str(), META_SK, cond::release_send_lease(lease)).await.map(|_| ())
    }

    async fn mark_enqueued(&self, key: &EventKey, at_ms: i64) -> Result<(), PortError> {
        self.update_meta(key, cond::mark_enqueued(at_ms)).await
    }

    async fn note_duplicate(&self, key: &EventKey) -> Result<(), PortError> {
        self.update_meta(key, cond::note_duplicate()).await
    }

    async fn flag_conflict(&self, key: &EventKey, other_hash: &str, at_ms: i64) -> Result<(), PortError> {
        self.update_meta(key, cond::flag_conflict(other_hash, at_ms)).await
    }
}
