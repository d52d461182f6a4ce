//! One admission path: what the intake does with a verified delivery (or
//! with each event of a batch), and what the backfill and the reconciler's
//! drift repair do with an event they recover. Each event is claimed (its
//! record and its payload in one write); "already exists" never means
//! "done": a record met again has its payload made good, a record a
//! backfill parked without its payload is released with this one, and a
//! record never sent whose sender let go of it is handed over under the
//! send lease. The new ones are then sent together, each with its payload.

use std::borrow::Cow;

use crate::identity::{EventKey, payload_hash};
use crate::ledger::{Claim, ExistingRecord, Generation, Kept, NewEvent, PortError, Release, SendLease, Status, Via};
use crate::policy::SEND_LEASE_MS;
use crate::ports::{Ledger, Outgoing, PayloadKeys, WorkQueue};
use crate::redaction::{PayloadPolicy, Unredactable};
use crate::sealing::KeyState;
use crate::verify::registry;

/// An event as any path offers it for admission: who sent it, which
/// bytes are its payload, and what its record keeps.
#[derive(Debug, Clone)]
pub struct Arrival<'a> {
    /// The provider's name, as records store it.
    pub provider: &'a str,
    pub endpoint: &'a str,
    pub tenant: &'a str,
    pub event_id: &'a str,
    pub event_type: Option<&'a str>,
    /// The event's payload: the delivery, or the event's bytes in a batch.
    pub body: &'a [u8],
    /// `(payload hash, content hash)`, when the verifier found them while
    /// reading the identity; else computed here.
    pub hashes: Option<(String, String)>,
    pub via: Via,
    /// The whole delivery's hash, for an event of a batch.
    pub batch_hash: Option<String>,
    pub retention_days: u32,
    pub index_shards: u32,
    /// Whether it is a notification ([`Provider::notification`](crate::verify::provider::Provider::notification)):
    /// its repeats are claimed by generation ([`Admission`]).
    pub notification: bool,
    /// What its endpoint's payload policy kept (`None`: the whole payload;
    /// see [`kept`], which makes it from a policy).
    pub kept: Option<Kept>,
}

/// The one constructor of the record an admission claims: its identity key,
/// hashes, index shard, time to live and send lease.
pub fn new_event(a: Arrival<'_>, now_ms: i64, send_token: String) -> NewEvent {
    let key = EventKey::new(a.provider, a.endpoint, a.event_id);
    let (payload_hash, content_hash) =
        a.hashes.unwrap_or_else(|| (payload_hash(a.body), registry::content_hash(a.provider, a.body)));
    NewEvent {
        shard: key.shard(a.index_shards),
        key,
        provider: a.provider.to_owned(),
        endpoint: a.endpoint.to_owned(),
        tenant: a.tenant.to_owned(),
        event_id: a.event_id.to_owned(),
        event_type: a.event_type.map(str::to_owned),
        payload_hash,
        content_hash,
        received_at_ms: now_ms,
        expires_at: crate::policy::expires_at(now_ms, a.retention_days),
        send: SendLease { token: send_token, until_ms: now_ms + SEND_LEASE_MS },
        via: a.via,
        batch_hash: a.batch_hash,
        kept: a.kept,
        notification: a.notification.then_some(Generation { n: 1, index_shards: a.index_shards }),
    }
}

/// An event and the bytes it stores and queues, as its endpoint's payload
/// policy keeps them ([`kept`]).
pub type KeptEvent<'b> = (NewEvent, Cow<'b, [u8]>);

/// `event` and the bytes to store and queue, as its endpoint's payload
/// policy keeps them ([`crate::redaction`]): under `redact` the redacted
/// bytes, `payload_hash` theirs and the verified body's hash kept beside it
/// (`kept.verified_hash`); under `drop_after` the bytes as they are, the
/// record marked to drop them once done; under `keep` both unchanged.
pub fn kept<'b>(policy: &PayloadPolicy, mut event: NewEvent, body: &'b [u8]) -> Result<KeptEvent<'b>, Unredactable> {
    match policy.apply(body)? {
        None => {
            if policy.drops_after() {
                event.kept = Some(Kept { policy: policy.label(), verified_hash: None });
            }
            Ok((event, Cow::Borrowed(body)))
        }
        Some(stored) => {
            let verified = std::mem::replace(&mut event.payload_hash, payload_hash(&stored));
            event.kept = Some(Kept { policy: policy.label(), verified_hash: Some(verified) });
            Ok((event, Cow::Owned(stored)))
        }
    }
}

/// The most claims of one admission in flight at once.
pub const CLAIMS_IN_FLIGHT: usize = 10;

/// The most events of one delivery that are claimed before its answer. A
/// larger batch is claimed whole, as one record of type [`BATCH_TYPE`]
/// under its body hash ([`batch_id`]), and the processor splits it into its
/// events through this same path.
pub const LARGE_BATCH: usize = 25;

/// The event type of a large batch's own record (never a provider's type).
pub const BATCH_TYPE: &str = "hookledger.batch";

/// The identity of a large batch's record: its body hash (a retry with the
/// same bytes meets it; one with other bytes is another batch record, whose
/// events are met as duplicates when it is split).
pub fn batch_id(batch_hash: &str) -> String {
    format!("batch:{batch_hash}")
}

/// The most generations one delivery of a notification steps through
/// (a lagging note, repeats at the same moment) before it answers 503.
pub const GENERATION_WALK: u32 = 4;

/// The first step of an admission ([`Admission::claim`]).
#[derive(Debug)]
pub enum Step {
    /// Claimed now: to be sent (the event's record, or a notification's
    /// next generation).
    Send(Box<NewEvent>),
    /// Nothing to send: what became of it.
    Done(Admitted),
}

/// What became of one event offered for admission.
#[derive(Debug)]
pub enum Admitted {
    /// Claimed now and sent, with its payload.
    New,
    /// A record a backfill had parked without its payload: released with
    /// this payload and sent (the record's tenant).
    Released { tenant: String },
    /// Recorded before: its payload is durable and it is on the queue or
    /// certain to be re-driven; `resent` when this admission handed it over.
    Duplicate { resent: bool, conflict: bool },
    /// Larger, stored, than the ledger takes (no payload bucket).
    TooLarge { size: usize, limit: usize },
    /// Not recorded, or not sent, at `stage`: the send lease is given back
    /// (the reconciler re-drives a durable record; the sender's retry meets
    /// it as a duplicate).
    Failed { stage: &'static str, error: PortError },
}

impl Admitted {
    /// Whether this admission queued the event (new, released or handed over).
    pub fn sent(&self) -> bool {
        matches!(self, Self::New | Self::Released { .. } | Self::Duplicate { resent: true, .. })
    }
}

fn failed(stage: &'static str, error: PortError) -> Admitted {
    Admitted::Failed { stage, error }
}

/// A send answer missing from the queue (it answers one per message).
fn lost() -> PortError {
    PortError::Unavailable { service: "sqs", message: "no answer for the message".into() }
}

/// The admission path over a ledger and a work queue.
pub struct Admission<'a, L, Q> {
    pub ledger: &'a L,
    pub queue: &'a Q,
    /// Who releases a parked record (`webhook`, `backfill`, ...), for its history.
    pub by: &'a str,
    /// Where the data keys are, when the events' payloads are sealed (an
    /// erasable endpoint's, [`crate::sealing`]); `None`: stored as they are.
    pub keys: Option<&'a dyn PayloadKeys>,
}

/// The key store failed: nothing was stored.
fn key_failed(e: PortError) -> Admitted {
    failed("data_key", e)
}

impl<L: Ledger, Q: WorkQueue> Admission<'_, L, Q> {
    /// Admits `events` (each with its payload): round trip 1, the claims, at
    /// most [`CLAIMS_IN_FLIGHT`] at once; round trip 2, the new ones sent
    /// together (`SendMessageBatch`; one `SendMessage` for one). One answer
    /// per event, in order.
    pub async fn admit(&self, events: &[(NewEvent, &[u8])]) -> Vec<Admitted> {
        if self.keys.is_none() {
            return self.admit_as_given(events).await;
        }
        // Sealed first, each under its event's key (one write each, at most
        // CLAIMS_IN_FLIGHT at once); an erased event is not claimed again.
        let mut sealed: Vec<Result<Cow<'_, [u8]>, Admitted>> = Vec::with_capacity(events.len());
        for chunk in events.chunks(CLAIMS_IN_FLIGHT) {
            let pending: Vec<_> = chunk.iter().map(|(event, bytes)| self.sealed(event, bytes)).collect();
            sealed.extend(futures::future::join_all(pending).await);
        }
        let ready: Vec<(NewEvent, &[u8])> = events
            .iter()
            .zip(&sealed)
            .filter_map(|((event, _), s)| s.as_ref().ok().map(|bytes| (event.clone(), bytes.as_ref())))
            .collect();
        let mut admitted = self.admit_as_given(&ready).await.into_iter();
        sealed
            .into_iter()
            .map(|s| match s {
                Ok(_) => admitted.next().unwrap_or_else(|| failed("claim", lost())),
                Err(done) => done,
            })
            .collect()
    }

    /// The bytes to store and queue for `event`: sealed under its data key
    /// when this admission seals (the key made now, or the one an earlier
    /// claim of the same event made), else `bytes` as they are. `Err`: what
    /// became of it without a claim: an erased event is a duplicate (its
    /// record keeps its identity), a key store that failed is a failure.
    pub async fn sealed<'b>(&self, event: &NewEvent, bytes: &'b [u8]) -> Result<Cow<'b, [u8]>, Admitted> {
        let Some(keys) = self.keys else { return Ok(Cow::Borrowed(bytes)) };
        let fresh = crate::sealing::DataKey::generate()
            .map_err(|_| key_failed(PortError::Unavailable { service: "kms", message: "no random bytes".into() }))?;
        match keys.key_for(&event.key, &fresh, event.expires_at).await {
            Ok(KeyState::Live(key)) => Ok(Cow::Owned(crate::sealing::seal(&key, &event.key, bytes))),
            Ok(KeyState::Erased { .. }) => {
                tracing::info!(key = %event.key, "delivery of an erased event: a duplicate, nothing stored");
                Err(Admitted::Duplicate { resent: false, conflict: false })
            }
            Ok(KeyState::Missing) => Err(key_failed(PortError::Unavailable {
                service: "dynamodb",
                message: "the data key was neither stored nor found".into(),
            })),
            Err(e) => Err(key_failed(e)),
        }
    }

    /// [`Self::admit`] of bytes already as they are to be stored.
    async fn admit_as_given(&self, events: &[(NewEvent, &[u8])]) -> Vec<Admitted> {
        let mut claims: Vec<Result<Claim, PortError>> = Vec::with_capacity(events.len());
        // A new record is a new due entry.
        if let Some((first, _)) = events.first() {
            self.ledger.note_activity(first.received_at_ms).await;
        }
        for chunk in events.chunks(CLAIMS_IN_FLIGHT) {
            let pending: Vec<_> = chunk.iter().map(|(event, bytes)| self.ledger.claim(event, bytes)).collect();
            claims.extend(futures::future::join_all(pending).await);
        }
        let mut out: Vec<Option<Admitted>> = Vec::with_capacity(events.len());
        let mut new = Vec::new();
        for ((event, bytes), claim) in events.iter().zip(claims) {
            match self.resolve(event, bytes, claim).await {
                Step::Send(claimed) => {
                    new.push((*claimed, *bytes));
                    out.push(None);
                }
                Step::Done(a) => out.push(Some(a)),
            }
        }
        let mut sent = self.send(&new).await.into_iter();
        out.into_iter().map(|a| a.unwrap_or_else(|| sent.next().unwrap_or_else(|| failed("enqueue", lost())))).collect()
    }

    /// The first step alone, for a caller that claims one event at a time
    /// and sends the new ones together later ([`Self::send`]), `bytes` as
    /// they are stored (sealed first by [`Self::sealed`] when it seals):
    /// [`Step::Send`] with the record claimed now (the event's, or a
    /// notification's next generation), else what became of it.
    pub async fn claim(&self, event: &NewEvent, bytes: &[u8]) -> Step {
        self.ledger.note_activity(event.received_at_ms).await;
        let claim = self.ledger.claim(event, bytes).await;
        self.resolve(event, bytes, claim).await
    }

    /// The second step: sends events claimed new, together, each with its
    /// payload in its tenant's group; one answer each, in order. One not
    /// sent has its send lease given back (the reconciler re-drives it).
    pub async fn send(&self, events: &[(NewEvent, &[u8])]) -> Vec<Admitted> {
        if events.is_empty() {
            return Vec::new();
        }
        let messages: Vec<Outgoing<'_>> =
            events.iter().map(|(e, bytes)| Outgoing { key: &e.key, tenant: &e.tenant, payload: Some(bytes) }).collect();
        let results = self.queue.send_all(&messages).await;
        let mut out = Vec::with_capacity(events.len());
        for ((event, _), result) in events.iter().zip(results) {
            out.push(match result {
                Ok(()) => Admitted::New,
                Err(e) => {
                    self.release(&event.key, &event.send).await;
                    failed("enqueue", e)
                }
            });
        }
        out
    }

    /// What a claim's answer means for its event.
    async fn resolve(&self, event: &NewEvent, bytes: &[u8], claim: Result<Claim, PortError>) -> Step {
        Step::Done(match claim {
            Ok(Claim::New) => return Step::Send(Box::new(event.clone())),
            // A backfill parked it because its provider would not serve it:
            // this payload is the one it waits for.
            Ok(Claim::Existing(existing)) if existing.awaits_payload() => {
                self.release_parked(event, bytes, self.by).await
            }
            Ok(Claim::Existing(existing)) if event.notification.is_some() => {
                return self.generation(event, bytes, existing).await;
            }
            Ok(Claim::Existing(existing)) => self.duplicate(event, existing, bytes).await,
            Err(e) => self.claim_failed(event, e).await,
        })
    }

    async fn claim_failed(&self, event: &NewEvent, e: PortError) -> Admitted {
        if let PortError::TooLarge { size, limit } = e {
            return Admitted::TooLarge { size, limit };
        }
        // The claim may have committed with every acknowledgement lost: give
        // back the send lease it may hold, so the sender's retry can send at
        // once instead of meeting a dead holder.
        self.release(&event.key, &event.send).await;
        failed("claim", e)
    }

    /// A notification met its identity's record (`first`): it coalesces
    /// with the latest generation while that one has not started being
    /// processed ([`ExistingRecord::coalesces`]: a duplicate, as for an
    /// event), else it is claimed as the next generation and sent, to be
    /// processed again (one more idempotent fetch of the state it announces).
    ///
    /// The first record notes the latest generation; a later one is read
    /// (one consistent read). The next generation's claim is the same
    /// conditional put as any claim, with this delivery's send token: two
    /// repeats at once create it once (the other coalesces with it), and our
    /// own retried put recognises itself. Then the first record's note moves
    /// forward; if this invocation dies before that, the note lags, and the
    /// next repeat walks forward from it (its claim meets the generation
    /// already there) and moves it. A repeat that arrives while a generation
    /// is processing costs one generation, never more than one per repeat.
    async fn generation(&self, first_event: &NewEvent, bytes: &[u8], first: ExistingRecord) -> Step {
        let noted = first.latest_generation.max(1);
        let mut n = noted;
        let mut current = if n == 1 {
            Some(first)
        } else {
            match self.ledger.existing(&first_event.generation(n).key).await {
                Ok(record) => record,
                Err(e) => return Step::Done(failed("generation", e)),
            }
        };
        for _ in 0..GENERATION_WALK {
            let at = match current {
                Some(record) if record.coalesces() => {
                    self.note_generation(first_event, n, noted).await;
                    let event = first_event.generation(n);
                    return Step::Done(self.duplicate(&event, record, bytes).await);
                }
                // Leased or finished: the next generation.
                Some(_) => n + 1,
                // Noted and gone (its record expired): recorded again.
                None => n,
            };
            let next = first_event.generation(at);
            match self.ledger.claim(&next, bytes).await {
                Ok(Claim::New) => {
                    self.note_generation(first_event, at, noted).await;
                    metrics::counter!("notification_generation", "provider" => next.provider.clone()).increment(1);
                    tracing::info!(key = %next.key, generation = at, "notification repeated after its record was leased: recorded as its next generation");
                    return Step::Send(Box::new(next));
                }
                // A repeat at the same moment claimed it, or the note lagged.
                Ok(Claim::Existing(record)) => {
                    n = at;
                    current = Some(record);
                }
                Err(e) => return Step::Done(self.claim_failed(&next, e).await),
            }
        }
        let message = format!("more than {GENERATION_WALK} generations met in one delivery");
        Step::Done(failed("generation", PortError::Unavailable { service: "ledger", message }))
    }

    /// Moves the first record's note to generation `n` when it says less
    /// (`noted`). A failure is logged: a lagging note costs a later repeat a
    /// step of its walk, nothing else.
    async fn note_generation(&self, first_event: &NewEvent, n: u32, noted: u32) {
        if n <= noted {
            return;
        }
        let expires_at = first_event.expires_at;
        if let Err(e) = self.ledger.advance_generation(&first_event.key, n, expires_at).await {
            tracing::warn!(error = %e, key = %first_event.key, generation = n, "could not note a notification's generation; the next repeat walks to it");
        }
    }

    /// A delivery of an identity a backfill parked without its payload
    /// (PARKED `backfill_unrecoverable:…`): its body becomes the record's
    /// payload and the record is released — RECEIVED, in the reconciler's
    /// index, our send lease — in one conditional write after the payload is
    /// stored (in the record when small), then the key is queued with the
    /// payload: answered as an accepted event. After the failed claim this
    /// costs the release (and a payload item or S3 object when the body does
    /// not fit in the record) and the send. If another delivery or a replay
    /// released it first, or an operator settled it, this is a duplicate.
    async fn release_parked(&self, event: &NewEvent, body: &[u8], by: &str) -> Admitted {
        let key = &event.key;
        let tenant = match self.ledger.release_parked(event, body, by).await {
            Ok(Release::Released { tenant }) => tenant,
            // Its releaser holds the send lease; the reconciler re-drives it if that one dies.
            Ok(Release::NotAwaiting) => return Admitted::Duplicate { resent: false, conflict: false },
            Err(PortError::TooLarge { size, limit }) => return Admitted::TooLarge { size, limit },
            Err(e) => {
                // The release may have committed with its acknowledgement lost.
                self.release(key, &event.send).await;
                return failed("release", e);
            }
        };
        tracing::info!(key = %key, "delivery released a record a backfill parked without its payload");
        match self.queue.send_with_payload(key, &tenant, body).await {
            Ok(()) => Admitted::Released { tenant },
            Err(e) => {
                self.release(key, &event.send).await;
                failed("enqueue", e)
            }
        }
    }

    /// A delivery of an identity that is already claimed (by an earlier or a
    /// concurrent delivery). "Already exists" never means "done": a 2xx is
    /// answered only once the payload is durable and the key is on the queue
    /// or certain to be re-driven (every non-terminal record is in the
    /// reconciler's index), whoever's claim it is.
    ///
    /// The common case, a record whose payload is durable and that is
    /// finished or still held by its sender, costs nothing beyond the failed
    /// claim: no write (duplicates are counted in the `duplicate` metric).
    async fn duplicate(&self, event: &NewEvent, existing: ExistingRecord, body: &[u8]) -> Admitted {
        let key = &event.key;
        let now_ms = event.received_at_ms;
        let same_bytes = existing.payload_hash == event.payload_hash;
        let same_content = same_bytes
            || existing
                .content_hash
                .as_deref()
                .is_some_and(|stored| registry::same_content(stored, &event.content_hash, &event.provider, body));
        // A body fetched by a backfill is rendered anew by the provider's
        // API: its bytes never match the webhook's, and that is no conflict.
        let conflict = !same_content && existing.via.compares_bytes_with(event.via);
        let mut flag = conflict;
        if !existing.payload_stored {
            // A record of the previous release whose first delivery died (or
            // is still working) before its payload was durable: make good the
            // payload with ours.
            let stored = if same_bytes {
                self.ledger.store_payload(key, &event.payload_hash, body, event.expires_at).await.map(|()| true)
            } else {
                self.ledger
                    .adopt_payload(key, &existing.payload_hash, &event.payload_hash, body, event.expires_at, conflict)
                    .await
            };
            match stored {
                // Ours is the record's payload now (the adoption counted a conflict, if any).
                Ok(true) => flag = false,
                // The first payload became durable meanwhile and is kept.
                Ok(false) => {}
                Err(e) => return failed("store_payload", e),
            }
        }
        if flag {
            self.flag_conflict(key, &event.payload_hash, now_ms).await;
        }
        // A record not known to be on the queue whose sender let go of it
        // (its send failed, or it died) is handed over now. A live send lease
        // means another delivery is doing it right now; if it dies, the
        // reconciler re-drives the record, whose payload is durable.
        let lease_free = existing.send_lease_until_ms.is_none_or(|until| until < now_ms);
        if existing.status == Status::Received && existing.enqueued_at_ms.is_none() && lease_free {
            match self.ledger.take_send_lease(key, &event.send, now_ms).await {
                Ok(true) => {}
                Ok(false) => return Admitted::Duplicate { resent: false, conflict },
                Err(e) => return failed("send_lease", e),
            }
            return match self.queue.send(key, &existing.tenant).await {
                Ok(()) => Admitted::Duplicate { resent: true, conflict },
                Err(e) => {
                    self.release(key, &event.send).await;
                    failed("enqueue", e)
                }
            };
        }
        Admitted::Duplicate { resent: false, conflict }
    }

    async fn flag_conflict(&self, key: &EventKey, other_hash: &str, at_ms: i64) {
        if let Err(e) = self.ledger.flag_conflict(key, other_hash, at_ms).await {
            tracing::warn!(error = %e, key = %key, "could not flag payload conflict");
        }
    }

    async fn release(&self, key: &EventKey, lease: &SendLease) {
        if let Err(e) = self.ledger.release_send_lease(key, lease).await {
            tracing::warn!(error = %e, key = %key, "could not release send lease; it lapses by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: &[u8]) -> NewEvent {
        let arrival = Arrival {
            provider: "hmac",
            endpoint: "ep",
            tenant: "t",
            event_id: "e1",
            event_type: None,
            body,
            hashes: None,
            via: Via::Webhook,
            batch_hash: None,
            retention_days: 30,
            index_shards: 4,
            notification: false,
            kept: None,
        };
        new_event(arrival, 1_000, "send".into())
    }

    fn policy(v: serde_json::Value) -> PayloadPolicy {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keep_changes_nothing_and_marks_nothing() {
        let body = br#"{"id":"e1","email":"a@x"}"#;
        let (e, stored) = kept(&PayloadPolicy::Keep, event(body), body).unwrap();
        assert!(matches!(stored, Cow::Borrowed(_)) && *stored == body[..]);
        assert_eq!((e.payload_hash, e.kept), (payload_hash(body), None));
    }

    #[test]
    fn redact_stores_the_redacted_bytes_under_their_hash_and_keeps_the_verified_hash_beside_it() {
        let body = br#"{"id":"e1","email":"a@x"}"#;
        let p = policy(serde_json::json!({"policy": "redact", "remove": ["/email"]}));
        let before = event(body);
        let (e, stored) = kept(&p, before.clone(), body).unwrap();
        assert_eq!(&*stored, br#"{"id":"e1"}"#);
        assert_eq!(e.payload_hash, payload_hash(&stored));
        assert_eq!(e.kept, Some(Kept { policy: "redact", verified_hash: Some(payload_hash(body)) }));
        assert_eq!(
            e.content_hash, before.content_hash,
            "the content hash (duplicates, conflicts) is the verified body's"
        );
        assert_eq!(kept(&p, event(b"x=1"), b"x=1").unwrap_err(), Unredactable);
    }

    #[test]
    fn drop_after_keeps_the_bytes_and_marks_the_record() {
        let body = br#"{"id":"e1"}"#;
        let (e, stored) = kept(&policy(serde_json::json!({"policy": "drop_after"})), event(body), body).unwrap();
        assert_eq!(&*stored, body);
        assert_eq!(e.kept, Some(Kept { policy: "drop_after", verified_hash: None }));
    }
}
