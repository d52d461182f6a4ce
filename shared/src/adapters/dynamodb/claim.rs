//! The intake's writes on the ledger record ([`Ledger`]): the claim, the
//! payload, the send lease, and the duplicate evidence. The expressions are
//! in `conditions`.

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure;

use super::conditions::{self as cond, Update};
use super::schema::{BINDING_SK, binding_pk};
use super::{DynamoLedger, META_SK, Written, attr, existing_from_item, get_s, new_record_item, payload};
use crate::adapters::port_error;
use crate::identity::EventKey;
use crate::ledger::{BodyBinding, Bound, Claim, ExistingRecord, NewEvent, PortError, SendLease};
use crate::ports::Ledger;

/// Where a record's payload is when it is neither in the record nor in a
/// payload item (`s3`).
pub const PAYLOAD_IN: &str = "payload_in";

impl DynamoLedger {
    /// The claim as one conditional put of the record.
    pub(super) async fn put_claim(&self, event: &NewEvent, record: super::Item) -> Result<Claim, PortError> {
        let result = self
            .client()
            .put_item()
            .table_name(self.table())
            .set_item(Some(record))
            .condition_expression(cond::CLAIM)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let met = match result {
            Ok(_) => return Ok(Claim::New),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(e)) => e.item().cloned(),
                _ => return Err(port_error("dynamodb", &err)),
            },
        };
        self.claimed_by(event, met).await
    }

    /// The claim met a record (`met`, or read when the endpoint did not
    /// return it): ours, after a lost acknowledgement, or another delivery's.
    async fn claimed_by(&self, event: &NewEvent, met: Option<super::Item>) -> Result<Claim, PortError> {
        let item = match met {
            Some(item) => item,
            None => self.read_meta(&event.key).await?.ok_or_else(|| PortError::Unavailable {
                service: "dynamodb",
                message: "claim conflicted and no record is there yet".into(),
            })?,
        };
        claim_met(event, &item)
    }

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

/// What a claim that failed its condition met: our own record (its send
/// token is ours: our retried write after a lost acknowledgement) is
/// `Claim::New`; any other is the existing record.
pub(crate) fn claim_met(event: &NewEvent, item: &super::Item) -> Result<Claim, PortError> {
    if get_s(item, attr::SEND_TOKEN) == Some(event.send.token.as_str())
        || crate::planted::is(crate::planted::Bug::RefusedClaimIsOurs)
    {
        return Ok(Claim::New);
    }
    Ok(Claim::Existing(existing_from_item(item)?))
}

/// Who holds a binding a refused write met: ours (our own retried write)
/// or another identity's.
pub(crate) fn bound_to(met: Option<&super::Item>, ours: &EventKey) -> Result<Bound, PortError> {
    let corrupt = || PortError::Unavailable { service: "dynamodb", message: "body binding without its key".into() };
    let item = met.ok_or_else(corrupt)?;
    let key = get_s(item, attr::BOUND_KEY).and_then(EventKey::from_stored).ok_or_else(corrupt)?;
    if &key == ours {
        return Ok(Bound::Ours);
    }
    let at_ms = item.get(attr::BOUND_AT).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Bound::Other { key, at_ms })
}

/// Whether a refused `take_send_lease` met our own lease (our retried
/// update), the key not sent since.
pub(crate) fn send_lease_ours(met: Option<&super::Item>, lease: &SendLease) -> bool {
    met.is_some_and(|old| {
        get_s(old, attr::SEND_TOKEN) == Some(lease.token.as_str()) && !old.contains_key(attr::ENQUEUED_AT)
    })
}

/// Whether a refused `adopt_payload` met its own adoption (our retried update).
pub(crate) fn adopted_already(met: Option<&super::Item>, new_hash: &str) -> bool {
    met.is_some_and(|old| {
        get_s(old, attr::PAYLOAD_HASH) == Some(new_hash)
            && old.get(attr::PAYLOAD_STORED).and_then(|v| v.as_bool().ok()) == Some(&true)
    })
}

impl Ledger for DynamoLedger {
    async fn claim(&self, event: &NewEvent, body: &[u8]) -> Result<Claim, PortError> {
        // Timeline guarded: two deliveries (or our own SDK retry after a lost
        // response) race to create the record; exactly one write passes
        // `conditions::CLAIM`, the other gets the winner's record back. The
        // payload is durable before the record that refers to it: a small
        // one travels in the record (one put, one write unit); a larger one,
        // which would make every later write of the record pay for it, is
        // written beside it first — its own item, or S3 when too large for an
        // item — and the record after. That path reads the record first
        // (one strongly consistent read): a duplicate is answered from it and
        // writes nothing, instead of paying for its payload again. A put that
        // committed and lost its acknowledgement is retried by the SDK and
        // fails against its own record, whose send token says so: the claim
        // is ours (`Claim::New`), never a duplicate. A payload item or object
        // written by an invocation that died before its record, or that lost
        // the race, is keyed by its own hash and expires with the record's
        // time to live: it is never read.
        let mut record = new_record_item(event);
        let stored = payload::encode(body);
        if payload::inline(payload::item_size(&record), stored.bytes.len()) {
            payload::put(&mut record, stored);
            return self.put_claim(event, record).await;
        }
        let too_large = stored.bytes.len() > payload::ITEM_PAYLOAD_BYTES;
        if too_large && self.payloads.is_none() {
            // Refused (413) before anything is read or written.
            return Err(PortError::TooLarge { size: stored.bytes.len(), limit: payload::ITEM_PAYLOAD_BYTES });
        }
        if let Some(item) = self.read_meta(&event.key).await? {
            return claim_met(event, &item);
        }
        if let Some(s3) = self.payloads.as_ref().filter(|_| too_large) {
            s3.put(&event.key, &event.payload_hash, &stored).await?;
            record.insert(PAYLOAD_IN.into(), aws_sdk_dynamodb::types::AttributeValue::S("s3".into()));
        } else {
            self.put_stored_payload(&event.key, &event.payload_hash, stored, event.expires_at).await?;
        }
        self.put_claim(event, record).await
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
            Written::Refused(met) => Ok(send_lease_ours(met.as_ref(), lease)),
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
            Written::Refused(met) => Ok(adopted_already(met.as_ref(), new_hash)),
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

    async fn existing(&self, key: &EventKey) -> Result<Option<ExistingRecord>, PortError> {
        self.read_meta(key).await?.as_ref().map(existing_from_item).transpose()
    }

    async fn advance_generation(&self, first: &EventKey, n: u32, expires_at: i64) -> Result<(), PortError> {
        // Refused: a later generation is noted already (or our own retried write applied).
        self.conditional_ok(first.as_str(), META_SK, cond::advance_generation(n, expires_at)).await.map(|_| ())
    }

    async fn bind_body(&self, binding: &BodyBinding<'_>) -> Result<Bound, PortError> {
        let pk = binding_pk(binding.provider, binding.endpoint, binding.payload_hash);
        let update = cond::bind_body(binding.key.as_str(), binding.at_ms, binding.expires_at);
        match self.conditional(&pk, BINDING_SK, update, false).await? {
            Written::Applied(_) => Ok(Bound::Ours),
            Written::Refused(met) => bound_to(met.as_ref(), binding.key),
        }
    }

    async fn take_binding(&self, binding: &BodyBinding<'_>, from: &EventKey) -> Result<bool, PortError> {
        let pk = binding_pk(binding.provider, binding.endpoint, binding.payload_hash);
        let update = cond::take_binding(from.as_str(), binding.key.as_str(), binding.at_ms, binding.expires_at);
        match self.conditional(&pk, BINDING_SK, update, false).await? {
            Written::Applied(_) => Ok(true),
            Written::Refused(met) => Ok(matches!(bound_to(met.as_ref(), binding.key)?, Bound::Ours)),
        }
    }

    async fn flag_replay(&self, key: &EventKey, other_id: &str, at_ms: i64) -> Result<(), PortError> {
        self.update_meta(key, cond::flag_replay(other_id, at_ms)).await
    }

    /// In `backfill.rs`, with the park it undoes.
    async fn release_parked(
        &self,
        event: &NewEvent,
        body: &[u8],
        by: &str,
    ) -> Result<crate::ledger::Release, PortError> {
        self.release_parked_record(event, body, by).await
    }
}
