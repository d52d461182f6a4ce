//! The intake use case: verify the raw bytes, claim the identity, store the
//! payload, enqueue the key, and answer by retry intent (design §5).
//!
//! A new event costs two sequential round trips: the claim (the record and
//! its payload item in one transaction) and the send (the key with the
//! payload). A duplicate whose payload is durable costs one: the failed
//! claim returns the record, which says so.
//!
//! | situation                                   | answer                 |
//! |---------------------------------------------|------------------------|
//! | not POST                                    | 405                    |
//! | unknown endpoint                            | 404                    |
//! | body over the limit                         | 413                    |
//! | bad/missing signature, stale/future time    | 401 (nothing stored)   |
//! | SNS topic not on the allow-list             | 403 (nothing stored)   |
//! | a handshake the endpoint does not take now  | 403 (nothing stored)   |
//! | signed but malformed                        | 400 (nothing stored)   |
//! | new event, claimed, stored and enqueued     | 202                    |
//! | duplicate (re-enqueued if never sent)       | 200                    |
//! | a notification repeated once its record was leased: its next generation | 202 |
//! | a body recorded under another unsigned id: a replay, not recorded | 200 |
//! | an identity a backfill parked without its payload: released with ours | 202 |
//! | storage, queue or certificate fault         | 503 + Retry-After      |

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Method};

use crate::admission::{Admission, Admitted, Arrival, BATCH_TYPE, KeptEvent, LARGE_BATCH, batch_id, kept};
use crate::clock::Ambient;
use crate::config::{Endpoint, ProviderKind, Settings};
use crate::identity::EventKey;
use crate::ledger::{BodyBinding, Bound, Kept, NewEvent, PortError, Via};
use crate::policy::SEND_LEASE_MS;
use crate::ports::{Ledger, WorkQueue};
use crate::redaction::{PayloadPolicy, Unredactable};
use crate::telemetry::TenantMetrics;
use crate::verify::hashes::delivery_hashes;
use crate::verify::provider::Delivery;
use crate::verify::provider::Replay;
use crate::verify::{Action, BatchEvent, Verified, VerifyError};

/// Seconds a sender is asked to wait after a 503.
pub const RETRY_AFTER_SECS: u32 = 5;

pub struct IntakeRequest<'a> {
    pub endpoint: &'a str,
    pub method: &'a Method,
    /// The raw query string, without `?` (empty when there is none).
    pub query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    pub now: SystemTime,
    pub request_id: &'a str,
}

/// What happened to one delivery; `answer()` turns it into HTTP.
#[derive(Debug, Clone)]
pub enum Outcome {
    Accepted,
    Duplicate {
        resent: bool,
        conflict: bool,
    },
    /// A batch delivery whose every event is recorded: `new` of them now,
    /// the others before (`conflicts` of those with other content).
    Batch {
        new: u32,
        duplicates: u32,
        conflicts: u32,
    },
    SubscriptionConfirmed,
    Unsubscribed,
    /// A provider's handshake, answered with this body (and header); nothing recorded.
    Handshake {
        content_type: &'static str,
        body: String,
        header: Option<(&'static str, String)>,
    },
    /// An authentic body already recorded under another identity (`of`),
    /// sent again under a new one by a provider whose identity is an
    /// unsigned header: a replay, flagged on that record, not recorded.
    Replay {
        of: String,
    },
    /// A message without an identity by design, acknowledged; nothing recorded.
    Acknowledged {
        what: &'static str,
    },
    MethodNotAllowed,
    UnknownEndpoint,
    TooLarge {
        limit: usize,
    },
    Rejected(VerifyError),
    Unavailable {
        stage: &'static str,
    },
    /// The endpoint's payload policy redacts and the payload is not JSON:
    /// refused, never stored whole (the provider's dashboard shows it).
    Unredactable,
    /// The endpoint's secret could not be resolved (see [`waiting`]).
    SecretUnavailable {
        retry_after_secs: u32,
    },
}

/// An HTTP answer: status, a stable `code` and a human `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub code: &'static str,
    pub detail: String,
    pub retry_after: Option<u32>,
    /// A handshake's answer: `(content type, body)` instead of the JSON body.
    pub raw: Option<(&'static str, String)>,
    /// A header the answer carries (Asana's `X-Hook-Secret`, echoed).
    pub header: Option<(&'static str, String)>,
}

impl Answer {
    pub fn body_json(&self) -> String {
        serde_json::json!({ "code": self.code, "detail": self.detail }).to_string()
    }

    /// `(content type, body)` of the HTTP answer.
    pub fn body(&self) -> (&'static str, String) {
        match &self.raw {
            Some((content_type, body)) => (content_type, body.clone()),
            None => ("application/json", self.body_json()),
        }
    }
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Duplicate { .. } => "duplicate",
            Self::Replay { .. } => "replay",
            Self::Batch { new: 0, .. } => "batch_duplicate",
            Self::Batch { .. } => "batch_accepted",
            Self::SubscriptionConfirmed => "subscription_confirmed",
            Self::Unsubscribed => "unsubscribed",
            Self::Handshake { .. } => "handshake",
            Self::Acknowledged { .. } => "acknowledged",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnknownEndpoint => "unknown_endpoint",
            Self::TooLarge { .. } => "payload_too_large",
            Self::Rejected(e) => e.reason(),
            Self::Unavailable { .. } => "unavailable",
            Self::SecretUnavailable { .. } => "secret_unavailable",
            Self::Unredactable => "unredactable",
        }
    }

    pub fn answer(&self) -> Answer {
        let a =
            |status, code, detail: String| Answer { status, code, detail, retry_after: None, raw: None, header: None };
        match self {
            Self::Accepted => a(202, "accepted", "event recorded and queued".into()),
            Self::Duplicate { conflict: true, .. } => a(
                200,
                "duplicate_conflict",
                "event id already recorded with a different payload; the first is kept".into(),
            ),
            Self::Duplicate { .. } => a(200, "duplicate", "event already recorded".into()),
            Self::Replay { .. } => a(
                200,
                "replay",
                "this body is recorded under another event id; the delivery is kept as evidence, not applied".into(),
            ),
            Self::Batch { new: 0, duplicates, .. } => {
                a(200, "duplicate", format!("all {duplicates} events of the batch already recorded"))
            }
            Self::Batch { new, duplicates, .. } => a(
                202,
                "accepted",
                format!("{new} events of the batch recorded and queued, {duplicates} already recorded"),
            ),
            Self::SubscriptionConfirmed => a(200, "subscription_confirmed", "subscription confirmed".into()),
            Self::Unsubscribed => a(200, "unsubscribed", "unsubscribe confirmation noted".into()),
            Self::Handshake { content_type, body, header } => Answer {
                raw: Some((content_type, body.clone())),
                header: header.clone(),
                ..a(200, "handshake", "handshake answered".into())
            },
            Self::Acknowledged { what } => a(200, "acknowledged", format!("{what}: acknowledged, nothing recorded")),
            Self::MethodNotAllowed => {
                a(405, "method_not_allowed", "this endpoint's provider does not call it with this method".into())
            }
            Self::UnknownEndpoint => a(404, "unknown_endpoint", "no such webhook endpoint".into()),
            Self::TooLarge { limit } => a(413, "payload_too_large", format!("body exceeds {limit} bytes")),
            Self::Unredactable => a(
                422,
                "unredactable",
                "this endpoint redacts payloads and this one is not JSON; nothing was stored".into(),
            ),
            Self::Rejected(e @ VerifyError::TopicNotAllowed) => a(403, e.reason(), e.to_string()),
            Self::Rejected(e @ VerifyError::MalformedPayload(_)) => a(400, e.reason(), e.to_string()),
            Self::Rejected(e @ VerifyError::HandshakeRefused(_)) => a(403, e.reason(), e.to_string()),
            Self::Rejected(VerifyError::CertificateUnavailable | VerifyError::Unavailable(_))
            | Self::Unavailable { .. } => Answer {
                status: 503,
                code: "unavailable",
                detail: "temporarily unable to record the event; retry later".into(),
                retry_after: Some(RETRY_AFTER_SECS),
                raw: None,
                header: None,
            },
            Self::SecretUnavailable { retry_after_secs } => Answer {
                status: 503,
                code: "unavailable",
                detail: "temporarily unable to verify deliveries to this endpoint; retry later".into(),
                retry_after: Some(*retry_after_secs),
                raw: None,
                header: None,
            },
            Self::Rejected(e) => a(401, e.reason(), e.to_string()),
        }
    }
}

pub struct Intake<L, Q> {
    endpoints: BTreeMap<String, Endpoint>,
    /// Endpoints whose secret could not be resolved at the cold start.
    waiting: Option<waiting::WaitingEndpoints>,
    settings: Settings,
    ledger: L,
    queue: Q,
    ambient: Ambient,
    tenant_metrics: TenantMetrics,
    large_batch_over: usize,
    /// The data keys of erasable endpoints' payloads.
    keys: Option<std::sync::Arc<dyn crate::ports::PayloadKeys>>,
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl<L: Ledger, Q: WorkQueue> Intake<L, Q> {
    pub fn new(endpoints: BTreeMap<String, Endpoint>, settings: Settings, ledger: L, queue: Q) -> Self {
        Self {
            endpoints,
            waiting: None,
            settings,
            ledger,
            queue,
            ambient: Ambient::system(),
            tenant_metrics: TenantMetrics::default(),
            large_batch_over: LARGE_BATCH,
            keys: None,
        }
    }

    /// Seals erasable endpoints' payloads under data keys kept in `keys`.
    pub fn with_keys(mut self, keys: std::sync::Arc<dyn crate::ports::PayloadKeys>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Batches of more than `n` events go the large-batch way (default
    /// [`LARGE_BATCH`]; tests and explorations lower it to exercise that
    /// path with a few events).
    pub fn set_large_batch_over(&mut self, n: usize) {
        self.large_batch_over = n.max(1);
    }

    /// Endpoints built later, once their secret resolves (answered 503 until then).
    pub fn with_waiting(mut self, waiting: waiting::WaitingEndpoints) -> Self {
        self.waiting = Some(waiting);
        self
    }

    /// The endpoints waiting for their secret.
    pub fn waiting_endpoints(&self) -> Vec<String> {
        self.waiting.as_ref().map(waiting::WaitingEndpoints::waiting).unwrap_or_default()
    }

    /// Counts the new events of these tenants in their own metrics.
    pub fn with_tenant_metrics(mut self, tenants: TenantMetrics) -> Self {
        self.tenant_metrics = tenants;
        self
    }

    /// Draws its send-lease tokens from `ambient` and times requests on it
    /// (the request's own `now` is the wall time it is judged at).
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    /// The wall time a request arriving now is judged at.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_millis(self.ambient.now_ms().max(0) as u64)
    }

    pub async fn handle(&self, req: IntakeRequest<'_>) -> Answer {
        self.handle_verified_at(req, None).await
    }

    /// An SNS notification from the subscription's dead-letter queue,
    /// through the intake's path: verified — certificate, signature, topic —
    /// as of the moment SNS sent it (its `Timestamp`), then claimed like any
    /// delivery (a message that did arrive is a duplicate). The freshness
    /// window that guards the public endpoint against replayed captures
    /// cannot apply (dead letters are older than it by nature), so the
    /// `Timestamp` is trusted only within `queue`'s [`ReplayBounds`] at `now`
    /// ([`admissible`]). Subscription and unsubscribe confirmations are
    /// refused: only notifications are replayed.
    pub async fn replay_sns_dead_letter(
        &self,
        endpoint: &str,
        queue: &DeadLetterQueue,
        letter: &DeadLetter<'_>,
        now: SystemTime,
    ) -> Result<Answer, DeadLetterRefusal> {
        if self.endpoints.get(endpoint).map(|e| e.provider) != Some(ProviderKind::SNS) {
            return Err(DeadLetterRefusal::NotAnSnsEndpoint);
        }
        #[derive(serde::Deserialize)]
        struct Envelope {
            #[serde(rename = "Type")]
            kind: String,
            #[serde(rename = "Timestamp")]
            timestamp: String,
        }
        let e: Envelope = serde_json::from_slice(letter.envelope).map_err(|_| DeadLetterRefusal::Malformed)?;
        let timestamp_s = crate::verify::sns::parse_timestamp(&e.timestamp).ok_or(DeadLetterRefusal::Malformed)?;
        if e.kind != "Notification" {
            return Err(DeadLetterRefusal::NotANotification);
        }
        let bounds = ReplayBounds::new(queue, self.settings.retention_days);
        admissible(timestamp_s, letter.sent_s, unix_ms(now).div_euclid(1000), &bounds)?;
        let mut headers = HeaderMap::new();
        headers.insert(crate::verify::sns::MESSAGE_TYPE_HEADER, http::HeaderValue::from_static("Notification"));
        let req = IntakeRequest {
            query: "",
            endpoint,
            method: &Method::POST,
            headers: &headers,
            body: letter.envelope,
            now,
            request_id: "sns-dead-letter",
        };
        Ok(self.handle_verified_at(req, Some(timestamp_s + 1)).await)
    }

    async fn handle_verified_at(&self, req: IntakeRequest<'_>, verify_at_s: Option<i64>) -> Answer {
        let started = self.ambient.instant();
        let mut late = None;
        let mut waits = None;
        let mut endpoint = self.endpoints.get(req.endpoint);
        if endpoint.is_none() {
            if let Some(w) = &self.waiting {
                match w.find(req.endpoint, self.ambient.now_ms()).await {
                    waiting::Found::Ready(e) => late = Some(e),
                    waiting::Found::Waiting { retry_after_secs } => waits = Some(retry_after_secs),
                    waiting::Found::Unknown => {}
                }
            }
            endpoint = late.as_deref();
        }
        let (outcome, verified) = match waits {
            Some(retry_after_secs) => (Outcome::SecretUnavailable { retry_after_secs }, None),
            None => self.run(endpoint, &req, verify_at_s).await,
        };
        let mut answer = outcome.answer();
        // The answer the provider needs for a delivery it will not send again.
        let recorded = matches!(
            outcome,
            Outcome::Accepted
                | Outcome::Duplicate { .. }
                | Outcome::Replay { .. }
                | Outcome::Batch { .. }
                | Outcome::Acknowledged { .. }
        );
        let event_type = verified.as_ref().and_then(|v| v.event_type.as_deref());
        if let (true, Some(success)) = (recorded, endpoint.and_then(|e| e.provider.success(event_type).exactly())) {
            answer.status = success.status;
            if let Some((content_type, body)) = success.body {
                answer.raw = Some((content_type, body.to_owned()));
            }
        }

        let provider = endpoint.map_or("unknown", |e| e.provider.as_str());
        let endpoint_name =
            endpoint.map_or(if waits.is_some() { req.endpoint } else { "unknown" }, |e| e.name.as_str());
        let duration_ms = (self.ambient.instant() - started).as_secs_f64() * 1000.0;
        record_outcome(provider, endpoint_name, &outcome, duration_ms);
        let (event_id, event_type) =
            verified.as_ref().map_or(("", ""), |v| (v.event_id.as_str(), v.event_type.as_deref().unwrap_or("")));
        if answer.status >= 500 {
            tracing::warn!(
                endpoint = endpoint_name,
                provider,
                event_id,
                event_type,
                outcome = outcome.label(),
                status = answer.status,
                duration_ms,
                request_id = req.request_id,
                "intake"
            );
        } else if answer.status >= 400 {
            // A refused request (a bad signature, an unknown endpoint): the
            // ledger has no trace of it, the operator needs this line.
            tracing::info!(
                endpoint = endpoint_name,
                provider,
                event_id,
                event_type,
                outcome = outcome.label(),
                status = answer.status,
                duration_ms,
                request_id = req.request_id,
                "intake"
            );
        } else {
            // Recorded: the ledger is its evidence; a line per event only at DEBUG.
            tracing::debug!(
                endpoint = endpoint_name,
                provider,
                event_id,
                event_type,
                outcome = outcome.label(),
                status = answer.status,
                duration_ms,
                request_id = req.request_id,
                "intake"
            );
        }
        answer
    }

    async fn run(
        &self,
        endpoint: Option<&Endpoint>,
        req: &IntakeRequest<'_>,
        verify_at_s: Option<i64>,
    ) -> (Outcome, Option<Verified>) {
        if req.method != Method::POST && req.method != Method::GET {
            return (Outcome::MethodNotAllowed, None);
        }
        let Some(endpoint) = endpoint else { return (Outcome::UnknownEndpoint, None) };
        if !endpoint.provider.methods().contains(req.method) {
            return (Outcome::MethodNotAllowed, None);
        }
        if req.body.len() > self.settings.max_body_bytes {
            return (Outcome::TooLarge { limit: self.settings.max_body_bytes }, None);
        }
        let now_s = verify_at_s.unwrap_or(unix_ms(req.now) / 1000);
        let delivery = Delivery { body: req.body, headers: req.headers, method: req.method, query: req.query };
        let verified = endpoint.verifier.verify(delivery, now_s).await;
        let verified = match verified {
            Ok(v) => v,
            Err(e) => return (Outcome::Rejected(e), None),
        };
        let outcome = match &verified.action {
            Action::Record => self.record(endpoint, &verified, req).await,
            Action::Batch(events) => self.record_batch(endpoint, events, req).await,
            Action::Unsubscribed => Outcome::Unsubscribed,
            Action::Reply { content_type, body } => {
                Outcome::Handshake { content_type, body: body.clone(), header: None }
            }
            Action::ReplyHeader { name, value } => Outcome::Handshake {
                content_type: "text/plain; charset=utf-8",
                body: String::new(),
                header: Some((name, value.clone())),
            },
            Action::Acknowledge { what } => Outcome::Acknowledged { what },
            Action::ConfirmSubscription { subscribe_url } => match endpoint.verifier.confirm(subscribe_url).await {
                Ok(_) => Outcome::SubscriptionConfirmed,
                Err(e) => {
                    tracing::warn!(error = %e, "SNS subscription confirmation failed");
                    Outcome::Unavailable { stage: "confirm_subscription" }
                }
            },
        };
        (outcome, Some(verified))
    }

    async fn record(&self, endpoint: &Endpoint, verified: &Verified, req: &IntakeRequest<'_>) -> Outcome {
        let event = new_event(endpoint, &self.settings, verified, req.body, req.now, self.ambient.token());
        // What the endpoint keeps, after verification, before anything is stored or queued.
        let Ok((event, stored)) = kept(&endpoint.payload, event, req.body) else { return Outcome::Unredactable };
        if endpoint.provider.identity().replay == Replay::BoundToBody {
            if let Some(refused) = self.bind_body(&event).await {
                return refused;
            }
        }
        // Round trip 1: the record and its payload, in one write; round trip
        // 2: the key, with the payload, on the queue.
        let admitted = self.admission(endpoint).admit(&[(event.clone(), stored.as_ref())]).await;
        let Some(a) = admitted.into_iter().next() else { return Outcome::Unavailable { stage: "claim" } };
        self.outcome(&event, a)
    }

    /// A delivery carrying several events. Round trip 1: every event is
    /// claimed, at most [`crate::admission::CLAIMS_IN_FLIGHT`] at once, each with
    /// its own bytes (its slice of the body) as its payload and the
    /// delivery's hash as `batch_hash`. Round trip 2: the new ones are sent
    /// together (`SendMessageBatch`). An event met again is a duplicate as
    /// for a single delivery (its payload made good, a record never sent
    /// handed over). The answer is 202 if any event is new, 200 if all were
    /// recorded before, and 503 if any could not be recorded (the sender's
    /// retry meets the others as duplicates).
    async fn record_batch(&self, endpoint: &Endpoint, events: &[BatchEvent], req: &IntakeRequest<'_>) -> Outcome {
        let batch_hash = crate::identity::payload_hash(req.body);
        // A redacting endpoint's events are redacted one by one before
        // they are stored: its batches are never claimed whole.
        let redacts = matches!(endpoint.payload, PayloadPolicy::Redact { .. });
        if events.len() > self.large_batch_over && !redacts {
            // Boxed where it is built, so the rare path stays out of every delivery's future.
            let large: std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + '_>> =
                Box::pin(self.record_large_batch(endpoint, events, batch_hash, req));
            return large.await;
        }
        let prepared: Result<Vec<KeptEvent<'_>>, Unredactable> = events
            .iter()
            .map(|e| {
                let bytes = &req.body[e.bytes.clone()];
                // The event's content: its retry counters masked, where its provider has them.
                let verified = Verified {
                    content: e.content.clone(),
                    ..Verified::record(e.event_id.clone(), e.event_type.clone())
                };
                let event = new_event(endpoint, &self.settings, &verified, bytes, req.now, self.ambient.token());
                kept(&endpoint.payload, NewEvent { batch_hash: Some(batch_hash.clone()), ..event }, bytes)
            })
            .collect();
        let Ok(prepared) = prepared else { return Outcome::Unredactable };
        let prepared: Vec<(NewEvent, &[u8])> = prepared.iter().map(|(e, b)| (e.clone(), b.as_ref())).collect();
        let admitted = self.admission(endpoint).admit(&prepared).await;
        let outcomes = prepared.iter().zip(admitted).map(|((event, _), a)| self.outcome(event, a)).collect();
        batch_outcome(outcomes)
    }

    /// More than [`LARGE_BATCH`] events: the delivery is claimed whole, as
    /// one record (its payload the body, its identity the body's hash) and
    /// sent like any event, in two round trips; the processor splits it into
    /// its events through the admission path. 202 when new, 200 when the
    /// same bytes were recorded before.
    async fn record_large_batch(
        &self,
        endpoint: &Endpoint,
        events: &[BatchEvent],
        batch_hash: String,
        req: &IntakeRequest<'_>,
    ) -> Outcome {
        let count = events.len();
        let event_id = batch_id(&batch_hash);
        let arrival = Arrival {
            provider: endpoint.provider.as_str(),
            endpoint: &endpoint.name,
            tenant: &endpoint.tenant,
            event_id: &event_id,
            event_type: Some(BATCH_TYPE),
            body: req.body,
            hashes: Some((batch_hash.clone(), batch_hash.clone())),
            via: Via::Webhook,
            batch_hash: Some(batch_hash),
            retention_days: self.settings.retention_days,
            index_shards: self.settings.index_shards,
            // Its events' repeats are judged when it is split; its own bytes
            // repeat with theirs, so it is claimed by generation too.
            notification: events.iter().any(|e| endpoint.provider.notification(&req.body[e.bytes.clone()])),
            // (Never `redact`: such an endpoint's batches are claimed event by event.)
            kept: endpoint
                .payload
                .drops_after()
                .then(|| Kept { policy: endpoint.payload.label(), verified_hash: None }),
        };
        let event = crate::admission::new_event(arrival, unix_ms(req.now), self.ambient.token());
        let admitted = self.admission(endpoint).admit(&[(event.clone(), req.body)]).await;
        let Some(a) = admitted.into_iter().next() else { return Outcome::Unavailable { stage: "claim" } };
        metrics::counter!("intake_large_batch").increment(1);
        match a {
            Admitted::New | Admitted::Released { .. } => {
                Outcome::Batch { new: count as u32, duplicates: 0, conflicts: 0 }
            }
            Admitted::Duplicate { .. } => Outcome::Batch { new: 0, duplicates: count as u32, conflicts: 0 },
            other => self.outcome(&event, other),
        }
    }

    /// Binds the body to the identity it is about to be recorded under, for
    /// a provider whose identity is an unsigned header and whose identical
    /// bodies are one fact ([`Replay::BoundToBody`]): one conditional write
    /// before the claim. `None`: bound to ours, go on. A body bound to
    /// another identity whose record exists is a replay (flagged on that
    /// record, answered 200, not recorded); one whose holder has no record
    /// died between binding and claiming: its binding is taken over once it
    /// is older than a send lease (until then it may be claiming: 503).
    async fn bind_body(&self, event: &NewEvent) -> Option<Outcome> {
        let binding = BodyBinding {
            provider: &event.provider,
            endpoint: &event.endpoint,
            // The body as verified: two events whose redacted bodies agree are not one body.
            payload_hash: event.kept.as_ref().and_then(|k| k.verified_hash.as_deref()).unwrap_or(&event.payload_hash),
            key: &event.key,
            at_ms: event.received_at_ms,
            expires_at: event.expires_at,
        };
        let (holder, since_ms) = match self.ledger.bind_body(&binding).await {
            Ok(Bound::Ours) => return None,
            Ok(Bound::Other { key, at_ms }) => (key, at_ms),
            Err(e) => return Some(self.unavailable("bind_body", &event.key, e)),
        };
        match self.ledger.existing(&holder).await {
            Ok(Some(_)) => {
                if let Err(e) = self.ledger.flag_replay(&holder, &event.event_id, event.received_at_ms).await {
                    tracing::warn!(error = %e, key = %holder, "could not flag a replay on its record");
                }
                tracing::warn!(
                    key = %holder,
                    replayed_as = %event.event_id,
                    "an authentic body recorded under one event id came again under another: a replay, not applied"
                );
                Some(Outcome::Replay { of: holder.event_id().to_owned() })
            }
            Ok(None) if since_ms + SEND_LEASE_MS > event.received_at_ms => {
                Some(Outcome::Unavailable { stage: "bind_body" })
            }
            Ok(None) => match self.ledger.take_binding(&binding, &holder).await {
                Ok(true) => None,
                Ok(false) => Some(Outcome::Unavailable { stage: "bind_body" }),
                Err(e) => Some(self.unavailable("bind_body", &event.key, e)),
            },
            Err(e) => Some(self.unavailable("bind_body", &event.key, e)),
        }
    }

    /// The admission path for `endpoint`'s events: sealed when it is erasable.
    fn admission(&self, endpoint: &Endpoint) -> Admission<'_, L, Q> {
        let keys = if endpoint.erasable { self.keys.as_deref() } else { None };
        Admission { ledger: &self.ledger, queue: &self.queue, by: "webhook", keys }
    }

    /// The intake's outcome of one admitted event (counted, and logged when it failed).
    fn outcome(&self, event: &NewEvent, admitted: Admitted) -> Outcome {
        match admitted {
            Admitted::New => {
                self.tenant_metrics.received(&event.tenant);
                Outcome::Accepted
            }
            Admitted::Released { tenant } => {
                tracing::info!(key = %event.key, "delivery released a record a backfill parked without its payload");
                self.tenant_metrics.received(&tenant);
                Outcome::Accepted
            }
            Admitted::Duplicate { resent, conflict } => Outcome::Duplicate { resent, conflict },
            Admitted::TooLarge { limit, .. } => Outcome::TooLarge { limit },
            Admitted::Failed { stage, error } => self.unavailable(stage, &event.key, error),
        }
    }

    /// 503: the sender retries. A request the service refused as invalid
    /// would be refused again; it is still a 503 (a 4xx would make the
    /// sender drop a genuine event), counted apart (`intake_caller_error`,
    /// alarmed) because only a change of ours fixes it.
    fn unavailable(&self, stage: &'static str, key: &EventKey, e: PortError) -> Outcome {
        if let PortError::Caller { service, code, .. } = &e {
            metrics::counter!("intake_caller_error").increment(1);
            tracing::error!(stage, service, code, error = %e, key = %key, "intake request refused as invalid");
        } else {
            tracing::warn!(stage, error = %e, key = %key, "intake dependency failed");
        }
        Outcome::Unavailable { stage }
    }
}

/// The record a verified delivery claims: everything the intake computes per
/// request between verification and its first AWS call (identity key,
/// payload and content hashes, index shard, send lease). Public so the
/// verifier benchmark measures exactly this path.
pub fn new_event(
    endpoint: &Endpoint,
    settings: &Settings,
    verified: &Verified,
    body: &[u8],
    now: SystemTime,
    send_token: String,
) -> NewEvent {
    let arrival = Arrival {
        provider: endpoint.provider.as_str(),
        endpoint: &endpoint.name,
        tenant: &endpoint.tenant,
        event_id: &verified.event_id,
        event_type: verified.event_type.as_deref(),
        body,
        hashes: Some(delivery_hashes(body, &verified.content)),
        via: Via::Webhook,
        batch_hash: None,
        retention_days: settings.retention_days,
        index_shards: settings.index_shards,
        notification: endpoint.provider.notification(body),
        kept: None,
    };
    crate::admission::new_event(arrival, unix_ms(now), send_token)
}

/// One answer for a batch's events: the first that could not be recorded
/// (503, or 413), else 202 when any is new, else 200.
fn batch_outcome(outcomes: Vec<Outcome>) -> Outcome {
    if let Some(failed) = outcomes.iter().find(|o| matches!(o, Outcome::Unavailable { .. })) {
        return failed.clone();
    }
    if let Some(large) = outcomes.iter().find(|o| matches!(o, Outcome::TooLarge { .. })) {
        return large.clone();
    }
    let (mut new, mut duplicates, mut conflicts) = (0, 0, 0);
    for o in &outcomes {
        match o {
            Outcome::Accepted => new += 1,
            Outcome::Duplicate { conflict, .. } => {
                duplicates += 1;
                conflicts += u32::from(*conflict);
            }
            _ => {}
        }
    }
    Outcome::Batch { new, duplicates, conflicts }
}

/// Counts one intake outcome and records its duration.
fn record_outcome(provider: &'static str, endpoint: &str, outcome: &Outcome, duration_ms: f64) {
    // A data point on every invocation, so its alarm reads "none" as 0, not as missing.
    metrics::counter!("intake_caller_error").increment(0);
    let provider = provider.to_owned();
    let endpoint = endpoint.to_owned();
    match outcome {
        Outcome::Accepted => {
            metrics::counter!("received", "provider" => provider.clone(), "endpoint" => endpoint.clone()).increment(1)
        }
        Outcome::Batch { new, duplicates, conflicts } => {
            let (p, e) = (provider.clone(), endpoint.clone());
            metrics::counter!("received", "provider" => p.clone(), "endpoint" => e.clone()).increment(u64::from(*new));
            metrics::counter!("duplicate", "provider" => p.clone(), "endpoint" => e.clone())
                .increment(u64::from(*duplicates));
            if *conflicts > 0 {
                metrics::counter!("payload_conflict", "provider" => p, "endpoint" => e)
                    .increment(u64::from(*conflicts));
            }
        }
        Outcome::Duplicate { conflict, .. } => {
            metrics::counter!("duplicate", "provider" => provider.clone(), "endpoint" => endpoint.clone()).increment(1);
            if *conflict {
                metrics::counter!("payload_conflict", "provider" => provider.clone(), "endpoint" => endpoint.clone())
                    .increment(1);
            }
        }
        Outcome::Replay { .. } => {
            metrics::counter!("replay", "provider" => provider.clone(), "endpoint" => endpoint.clone()).increment(1)
        }
        Outcome::Unavailable { stage } => {
            metrics::counter!("failed", "provider" => provider.clone(), "stage" => *stage).increment(1);
        }
        Outcome::SecretUnavailable { .. } => {
            metrics::counter!("failed", "provider" => provider.clone(), "stage" => "secret").increment(1);
        }
        Outcome::SubscriptionConfirmed | Outcome::Unsubscribed => {
            metrics::counter!("subscription", "provider" => provider.clone(), "outcome" => outcome.label())
                .increment(1);
        }
        Outcome::Handshake { .. } | Outcome::Acknowledged { .. } => {
            metrics::counter!("handshake", "provider" => provider.clone(), "outcome" => outcome.label()).increment(1);
        }
        other => {
            metrics::counter!("rejected", "provider" => provider.clone(), "reason" => other.label()).increment(1);
        }
    }
    metrics::histogram!("intake_duration", "provider" => provider).record(duration_ms);
}

// ------------------------------------------------ SNS dead-letter replay

/// Slack on the subscription's total retry time: SNS may move a message to
/// the dead-letter queue up to this much later than the retry time after its
/// `Timestamp` (the last attempt's own time, and the move itself).
pub const DEAD_LETTER_SLACK_SECS: i64 = 300;

/// What a replay knows of the dead-letter queue it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterQueue {
    /// The subscription's total retry time (its delivery policy's): SNS
    /// gives up on a message at most this long after its `Timestamp`.
    pub max_retry_secs: i64,
    /// The queue's `MessageRetentionPeriod`.
    pub retention_secs: i64,
}

/// One message of a dead-letter queue.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    /// The SNS envelope SNS could not deliver (the message body).
    pub envelope: &'a [u8],
    /// When it entered the queue (its SQS `SentTimestamp`), Unix seconds.
    pub sent_s: i64,
}

/// The bounds [`admissible`] applies, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayBounds {
    /// How old a message may be (now − `Timestamp`).
    pub max_age_secs: i64,
    /// How long after its `Timestamp` it may have entered the queue.
    pub max_queue_delay_secs: i64,
}

impl ReplayBounds {
    /// `queue`'s bounds under an identity retention of `retention_days`: no
    /// older than that retention (an older identity may have expired, and the
    /// message would be recorded and applied again) nor than the queue's
    /// retention (the queue drops messages at that age, counted from their
    /// queuing); queued no later than the retry time plus
    /// [`DEAD_LETTER_SLACK_SECS`] after its `Timestamp`.
    pub fn new(queue: &DeadLetterQueue, retention_days: u32) -> Self {
        Self {
            max_age_secs: queue.retention_secs.min(i64::from(retention_days) * 86_400),
            max_queue_delay_secs: queue.max_retry_secs.saturating_add(DEAD_LETTER_SLACK_SECS),
        }
    }
}

/// Why a dead-letter replay left a message in the queue without verifying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterRefusal {
    /// The endpoint named is not an SNS endpoint.
    NotAnSnsEndpoint,
    /// Not an SNS envelope with a `Type` and an ISO 8601 UTC `Timestamp`.
    Malformed,
    /// A subscription or unsubscribe confirmation.
    NotANotification,
    /// Older than [`ReplayBounds::max_age_secs`].
    TooOld,
    /// Queued before its `Timestamp`, or later than SNS retries.
    SentOutsideRetryWindow,
}

impl DeadLetterRefusal {
    /// The stable name an operator sees in a replay's summary.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAnSnsEndpoint => "not_an_sns_endpoint",
            Self::Malformed => "malformed",
            Self::NotANotification => "not_a_notification",
            Self::TooOld => "too_old",
            Self::SentOutsideRetryWindow => "sent_outside_retry_window",
        }
    }
}

/// Whether a dead letter whose `Timestamp` is `timestamp_s` and which entered
/// the queue at `sent_s` may be replayed at `now_s` (Unix seconds): when
/// `now_s − timestamp_s ≤ max_age_secs` and
/// `timestamp_s ≤ sent_s ≤ timestamp_s + max_queue_delay_secs`.
pub fn admissible(timestamp_s: i64, sent_s: i64, now_s: i64, bounds: &ReplayBounds) -> Result<(), DeadLetterRefusal> {
    if now_s.saturating_sub(timestamp_s) > bounds.max_age_secs {
        return Err(DeadLetterRefusal::TooOld);
    }
    if sent_s < timestamp_s || sent_s.saturating_sub(timestamp_s) > bounds.max_queue_delay_secs {
        return Err(DeadLetterRefusal::SentOutsideRetryWindow);
    }
    Ok(())
}

#[cfg(test)]
mod dead_letter_tests {
    use super::*;

    const DAY: i64 = 86_400;
    /// A genuine notification's `Timestamp` (2026-03-06T19:55:38Z, in the fixtures).
    const T: i64 = 1_772_826_938;
    const BOUNDS: ReplayBounds = ReplayBounds { max_age_secs: 30 * DAY, max_queue_delay_secs: 3_900 };

    #[test]
    fn bounds_take_the_shorter_retention_and_add_the_slack_to_the_retry_time() {
        let queue = |retention_secs| DeadLetterQueue { max_retry_secs: 3_600, retention_secs };
        assert_eq!(
            ReplayBounds::new(&queue(14 * DAY), 30),
            ReplayBounds { max_age_secs: 14 * DAY, max_queue_delay_secs: 3_900 }
        );
        assert_eq!(ReplayBounds::new(&queue(14 * DAY), 7).max_age_secs, 7 * DAY);
        assert_eq!(ReplayBounds::new(&queue(30 * DAY), 30).max_age_secs, 30 * DAY);
    }

    #[test]
    fn a_message_as_old_as_the_bound_is_admitted_and_one_a_second_older_is_too_old() {
        let sent = T + 60;
        assert_eq!(admissible(T, sent, T + 30 * DAY, &BOUNDS), Ok(()));
        assert_eq!(admissible(T, sent, T + 30 * DAY + 1, &BOUNDS), Err(DeadLetterRefusal::TooOld));
        assert_eq!(admissible(T, sent, T + 60 * DAY, &BOUNDS), Err(DeadLetterRefusal::TooOld));
    }

    #[test]
    fn a_message_queued_at_its_timestamp_is_admitted_and_one_queued_a_second_before_is_not() {
        let now = T + DAY;
        assert_eq!(admissible(T, T, now, &BOUNDS), Ok(()));
        assert_eq!(admissible(T, T - 1, now, &BOUNDS), Err(DeadLetterRefusal::SentOutsideRetryWindow));
    }

    #[test]
    fn a_message_queued_at_the_end_of_the_retries_is_admitted_and_one_queued_a_second_later_is_not() {
        let now = T + DAY;
        assert_eq!(admissible(T, T + 3_900, now, &BOUNDS), Ok(()));
        assert_eq!(admissible(T, T + 3_901, now, &BOUNDS), Err(DeadLetterRefusal::SentOutsideRetryWindow));
    }

    #[test]
    fn a_message_too_old_is_refused_as_too_old_whenever_it_was_queued() {
        assert_eq!(admissible(T, T + 10 * DAY, T + 60 * DAY, &BOUNDS), Err(DeadLetterRefusal::TooOld));
    }

    #[test]
    fn each_refusal_has_its_own_stable_reason() {
        let all = [
            DeadLetterRefusal::NotAnSnsEndpoint,
            DeadLetterRefusal::Malformed,
            DeadLetterRefusal::NotANotification,
            DeadLetterRefusal::TooOld,
            DeadLetterRefusal::SentOutsideRetryWindow,
        ];
        let reasons: std::collections::BTreeSet<&str> = all.iter().map(DeadLetterRefusal::reason).collect();
        assert_eq!(reasons.len(), all.len());
        assert!(reasons.contains("too_old") && reasons.contains("not_a_notification"));
    }
}

pub mod waiting;

#[cfg(test)]
mod handshake_tests;
#[cfg(test)]
mod identity_tests;
#[cfg(test)]
mod preset_tests;
#[cfg(test)]
mod tests;
