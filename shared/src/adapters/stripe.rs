//! The Stripe API as a [`SubscriptionSource`] (`GET /v1/subscriptions/{id}`)
//! and as a [`BackfillSource`] (`GET /v1/events`, the events of the last 30
//! days, newest first, each with the same `id` as its webhook).
//! The base URL is configurable so tests and the local stack point it at a
//! fake provider server. The fetched version is the fetch time (ms): Stripe
//! subscriptions carry no revision, and a later read reflects later state.
//! Each answer is read up to a bound ([`MAX_SUBSCRIPTION_BYTES`],
//! [`MAX_EVENT_PAGE_BYTES`], the backfill's body limit for one event), and
//! every request runs within the function's [`Timeouts`].

use crate::adapters::provider_http::{BodyError, read_capped, request_failure};
use crate::adapters::timeouts::Timeouts;
use crate::ports::{BackfillSource, SourceError, SourceEvent, SourcePage, Window};
use crate::projection::fetch::{Fetched, ProviderError, Subscription, SubscriptionFuture, SubscriptionSource};
use crate::secret::Secret;

/// The subscription source configured by `HOOKLEDGER_STRIPE_API_KEY` (a
/// secret reference) and `HOOKLEDGER_STRIPE_API_BASE`, within `timeouts`;
/// `None` when no key is set.
pub async fn source_from_env(
    get: impl Fn(&str) -> Option<String>,
    secrets: &dyn crate::config::SecretResolver,
    timeouts: Timeouts,
) -> Result<Option<std::sync::Arc<dyn crate::projection::fetch::SubscriptionSource>>, crate::config::ConfigError> {
    use crate::config::ConfigError;
    let Some(reference) = get("HOOKLEDGER_STRIPE_API_KEY") else { return Ok(None) };
    let key = secrets
        .resolve(&reference)
        .await
        .map_err(|reason| ConfigError::Invalid { name: "HOOKLEDGER_STRIPE_API_KEY".into(), reason })?;
    let base = get("HOOKLEDGER_STRIPE_API_BASE").unwrap_or_else(|| "https://api.stripe.com".into());
    let api = StripeApi::new_within(base, key, timeouts)
        .map_err(|reason| ConfigError::Invalid { name: "HOOKLEDGER_STRIPE_API_BASE".into(), reason })?;
    Ok(Some(std::sync::Arc::new(api)))
}

/// The largest subscription answer read: 1 MiB (a subscription object is a
/// few KiB); a larger one is refused.
pub const MAX_SUBSCRIPTION_BYTES: usize = 1024 * 1024;

/// The largest page of `GET /v1/events` read: 16 MiB, 100 events of 160 KiB
/// each on average (Stripe's events are a few KiB to a few tens of KiB); a
/// larger page fails the run.
pub const MAX_EVENT_PAGE_BYTES: usize = 16 * 1024 * 1024;

pub struct StripeApi {
    client: reqwest::Client,
    base_url: String,
    api_key: Secret,
    clock: std::sync::Arc<dyn crate::clock::Clock>,
}

impl StripeApi {
    /// The API at `base_url`, within the reconciler's [`Timeouts`].
    pub fn new(base_url: impl Into<String>, api_key: Secret) -> Result<Self, String> {
        Self::new_within(base_url, api_key, Timeouts::RECONCILER)
    }

    /// The API at `base_url`, its requests within `timeouts` (the calling
    /// function's).
    /// The base must be `https://` (plain `http://` only to a loopback host).
    pub fn new_within(base_url: impl Into<String>, api_key: Secret, timeouts: Timeouts) -> Result<Self, String> {
        let base_url = base_url.into();
        crate::adapters::provider_http::check_api_base(&base_url)?;
        let client = timeouts
            .http_client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            clock: std::sync::Arc::new(crate::clock::SystemClock),
        })
    }
}

/// Parses a Stripe subscription object.
pub fn parse_subscription(v: &serde_json::Value) -> Option<Subscription> {
    let seats = v["quantity"].as_i64().or_else(|| v["items"]["data"][0]["quantity"].as_i64()).unwrap_or(0);
    Some(Subscription {
        id: v["id"].as_str()?.to_owned(),
        customer: v["customer"].as_str()?.to_owned(),
        status: v["status"].as_str()?.to_owned(),
        seats,
    })
}

impl StripeApi {
    /// Stamps each fetch with this clock's time (the fetched version).
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }
}

impl SubscriptionSource for StripeApi {
    fn subscription<'a>(&'a self, id: &'a str) -> SubscriptionFuture<'a> {
        Box::pin(async move {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(ProviderError::Rejected("subscription id has unexpected characters".into()));
            }
            let key = String::from_utf8_lossy(self.api_key.expose()).into_owned();
            let mut resp = self
                .client
                .get(format!("{}/v1/subscriptions/{id}", self.base_url))
                .bearer_auth(key)
                .send()
                .await
                .map_err(|e| ProviderError::Unavailable(request_failure(e)))?;
            let version = self.clock.now_ms();
            let status = resp.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(Fetched { object: None, version });
            }
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                return Err(ProviderError::Unavailable(format!("HTTP {status}")));
            }
            if !status.is_success() {
                return Err(ProviderError::Rejected(format!("HTTP {status}")));
            }
            let bytes = read_capped(&mut resp, MAX_SUBSCRIPTION_BYTES).await.map_err(|e| match e {
                BodyError::TooLarge { .. } => ProviderError::Rejected(format!("subscription {id}: {e}")),
                BodyError::Read(_) => ProviderError::Unavailable(e.to_string()),
            })?;
            let body: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|_| ProviderError::Rejected("subscription is not JSON".into()))?;
            let sub = parse_subscription(&body)
                .ok_or_else(|| ProviderError::Rejected("unexpected subscription shape".into()))?;
            Ok(Fetched { object: Some(sub), version })
        })
    }
}

/// Stripe's event list as a backfill source. `account`: the connected
/// account (`Stripe-Account` header) whose events an endpoint receives.
pub struct StripeEvents {
    api: StripeApi,
    account: Option<String>,
    /// The largest event fetched alone (`GET /v1/events/{id}`) that is read.
    max_body_bytes: usize,
}

impl StripeEvents {
    /// The event list at `base_url`, within the reconciler's [`Timeouts`].
    pub fn new(base_url: impl Into<String>, api_key: Secret, account: Option<String>) -> Result<Self, String> {
        Self::new_within(base_url, api_key, account, Timeouts::RECONCILER)
    }

    /// The event list at `base_url`, its requests within `timeouts` (the
    /// calling function's, or the CLI's).
    pub fn new_within(
        base_url: impl Into<String>,
        api_key: Secret,
        account: Option<String>,
        timeouts: Timeouts,
    ) -> Result<Self, String> {
        Ok(Self {
            api: StripeApi::new_within(base_url, api_key, timeouts)?,
            account,
            max_body_bytes: crate::ports::DEFAULT_MAX_BACKFILL_BODY_BYTES,
        })
    }

    /// Stamps each fetch with this clock's time.
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        self.api = self.api.with_clock(clock);
        self
    }

    /// Reads an event fetched alone up to `bytes` (`HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`).
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    fn get(&self, url: url::Url) -> reqwest::RequestBuilder {
        let key = String::from_utf8_lossy(self.api.api_key.expose()).into_owned();
        let mut req = self.api.client.get(url).bearer_auth(key);
        if let Some(account) = &self.account {
            req = req.header("Stripe-Account", account);
        }
        req
    }
}

/// A non-2xx answer to `GET /v1/events/{id}`: a rate limit, a server fault,
/// a refusal of the key (401, 403: the run stops), or that event's (404: it
/// is gone or was never this account's; another 4xx).
fn event_answer(status: u16, headers: &reqwest::header::HeaderMap) -> SourceError {
    match status {
        429 => rate_limited(headers),
        500..=599 | 408 => SourceError::Unavailable(format!("HTTP {status}")),
        401 | 403 => SourceError::Rejected(format!("HTTP {status}")),
        _ => SourceError::Unfetchable {
            cause: crate::ports::Unfetchable::Status(status),
            detail: format!("Stripe answered HTTP {status} for the event"),
        },
    }
}

/// A page that could not be read whole: too large (the run stops, naming
/// the bound), or cut off (try again later).
fn page_error(e: &BodyError) -> SourceError {
    match e {
        BodyError::TooLarge { .. } => SourceError::Rejected(format!("the event page: {e}")),
        BodyError::Read(_) => SourceError::Unavailable(e.to_string()),
    }
}

/// Events per page (Stripe's maximum).
const EVENTS_PER_PAGE: &str = "100";

#[derive(serde::Deserialize)]
struct EventList<'a> {
    #[serde(borrow)]
    data: Vec<&'a serde_json::value::RawValue>,
    has_more: bool,
}

#[derive(serde::Deserialize)]
struct EventHead {
    id: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    created: i64,
}

/// A 429's advice: `Retry-After` (seconds) and `Stripe-Should-Retry`.
fn rate_limited(headers: &reqwest::header::HeaderMap) -> SourceError {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    SourceError::RateLimited {
        retry_after_s: header("retry-after").and_then(|v| v.parse().ok()),
        should_retry: header("stripe-should-retry") != Some("false"),
    }
}

/// One page of `GET /v1/events` as returned: each event's bytes as sent.
pub fn parse_event_page(bytes: &[u8]) -> Result<SourcePage, SourceError> {
    let list: EventList<'_> =
        serde_json::from_slice(bytes).map_err(|_| SourceError::Rejected("event list is not a Stripe list".into()))?;
    let mut events = Vec::with_capacity(list.data.len());
    for raw in list.data {
        let head: EventHead = serde_json::from_str(raw.get())
            .map_err(|_| SourceError::Rejected("an event has no id or created time".into()))?;
        events.push(SourceEvent {
            event_id: head.id,
            event_type: head.kind,
            created_s: head.created,
            body: Some(raw.get().as_bytes().to_vec()),
            handle: None,
        });
    }
    let next = match (list.has_more, events.last()) {
        (false, _) => None,
        (true, Some(last)) => Some(last.event_id.clone()),
        (true, None) => return Err(SourceError::Rejected("has_more on an empty page".into())),
    };
    Ok(SourcePage { events, next })
}

impl BackfillSource for StripeEvents {
    async fn page(&self, window: &Window, cursor: Option<&str>) -> Result<SourcePage, SourceError> {
        let mut query: Vec<(&str, String)> = vec![
            ("limit", EVENTS_PER_PAGE.to_owned()),
            ("created[gte]", window.since_s.to_string()),
            ("created[lt]", window.until_s.to_string()),
        ];
        query.extend(window.types.iter().map(|t| ("types[]", t.clone())));
        if let Some(c) = cursor {
            query.push(("starting_after", c.to_owned()));
        }
        let url = url::Url::parse_with_params(&format!("{}/v1/events", self.api.base_url), &query)
            .map_err(|e| SourceError::Rejected(format!("Stripe API base: {e}")))?;
        let mut resp = self.get(url).send().await.map_err(|e| SourceError::Unavailable(request_failure(e)))?;
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(rate_limited(resp.headers()));
        }
        if status.is_server_error() {
            return Err(SourceError::Unavailable(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(SourceError::Rejected(format!("HTTP {status}")));
        }
        let bytes = read_capped(&mut resp, MAX_EVENT_PAGE_BYTES).await.map_err(|e| page_error(&e))?;
        parse_event_page(&bytes)
    }

    /// One event alone (`GET /v1/events/{id}`): what a replay of an event
    /// parked as unfetchable asks for (the list carries every body).
    async fn body(&self, event: &SourceEvent) -> Result<Vec<u8>, SourceError> {
        if let Some(body) = &event.body {
            return Ok(body.clone());
        }
        let id = &event.event_id;
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(SourceError::Rejected("event id has unexpected characters".into()));
        }
        let url = url::Url::parse(&format!("{}/v1/events/{id}", self.api.base_url))
            .map_err(|e| SourceError::Rejected(format!("Stripe API base: {e}")))?;
        let resp = self.get(url).send().await.map_err(|e| SourceError::Unavailable(request_failure(e)))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(event_answer(status.as_u16(), resp.headers()));
        }
        crate::adapters::tls::read_bounded(resp, self.max_body_bytes).await
    }

    fn origin(&self) -> Option<String> {
        self.account.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::adapters::provider_http::test_servers;

    /// A function's profile, shortened so that the test takes a moment.
    const SHORT: Timeouts = Timeouts {
        connect: Duration::from_millis(200),
        attempt: Duration::from_millis(200),
        operation: Duration::from_millis(500),
    };

    fn key() -> Secret {
        Secret::new("sk_test_fake")
    }

    fn window() -> Window {
        Window { since_s: 0, until_s: 1, types: vec![] }
    }

    /// Issue 21.5: a Stripe API that accepts the connection and never
    /// answers fails the fetch and the page with a timeout.
    #[tokio::test]
    async fn a_stripe_call_that_never_answers_fails_with_a_timeout() {
        let base = test_servers::silent();
        let api = StripeApi::new_within(base.clone(), key(), SHORT).unwrap();
        let fetch = tokio::time::timeout(Duration::from_secs(10), api.subscription("sub_1")).await;
        match fetch.expect("the client's own timeout ends the fetch") {
            Err(ProviderError::Unavailable(m)) => assert!(m.contains("timed out"), "{m}"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a silent server answered"),
        }
        let events = StripeEvents::new_within(base, key(), None, SHORT).unwrap();
        let page = tokio::time::timeout(Duration::from_secs(10), events.page(&window(), None)).await;
        match page.expect("the client's own timeout ends the page") {
            Err(SourceError::Unavailable(m)) => assert!(m.contains("timed out"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// Issue 21.7: a subscription or an event page longer than its bound is
    /// refused as it is read (the answer carries no length), naming the bound.
    #[tokio::test]
    async fn a_stripe_answer_over_its_bound_is_refused() {
        let api = StripeApi::new(test_servers::answering_bytes(MAX_SUBSCRIPTION_BYTES + 1), key()).unwrap();
        match api.subscription("sub_1").await {
            Err(ProviderError::Rejected(m)) => assert!(m.contains("larger than the 1048576-byte bound"), "{m}"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("an oversize answer was taken"),
        }
        let at_bound = StripeApi::new(test_servers::answering_bytes(MAX_SUBSCRIPTION_BYTES), key()).unwrap();
        match at_bound.subscription("sub_1").await {
            Err(ProviderError::Rejected(m)) => assert_eq!(m, "subscription is not JSON", "read whole, then parsed"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("spaces are not a subscription"),
        }
        let events = StripeEvents::new(test_servers::answering_bytes(MAX_EVENT_PAGE_BYTES + 1), key(), None).unwrap();
        match events.page(&window(), None).await {
            Err(SourceError::Rejected(m)) => {
                assert!(m.contains("the event page") && m.contains("larger than the 16777216-byte bound"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plain_http_base_is_refused_unless_on_loopback() {
        assert!(StripeApi::new("http://api.stripe.com", key()).is_err());
        assert!(StripeEvents::new("http://10.1.2.3", key(), None).is_err());
        assert!(StripeApi::new("http://127.0.0.1:5056", key()).is_ok());
    }

    #[test]
    fn parses_the_subscription_fixture() {
        let ev: serde_json::Value = serde_json::from_str(include_str!(
            "../../testdata/providers/stripe/events/customer.subscription.updated.json"
        ))
        .unwrap();
        let sub = parse_subscription(&ev["data"]["object"]).unwrap();
        assert_eq!((sub.id.as_str(), sub.status.as_str(), sub.seats), ("sub_000000000000000000000000", "active", 1));
    }

    #[test]
    fn an_event_page_keeps_each_events_bytes_and_names_the_next_cursor() {
        let page =
            br#"{"object":"list","data":[{"id":"evt_2","type":"invoice.paid","created":20,"data":{"object":{"x":1}}},
            {"id": "evt_1", "created": 10, "type": "charge.refunded"}],"has_more":true,"url":"/v1/events"}"#;
        let p = parse_event_page(page).unwrap();
        assert_eq!(p.next.as_deref(), Some("evt_1"));
        assert_eq!((p.events[0].event_id.as_str(), p.events[0].created_s), ("evt_2", 20));
        assert_eq!(
            p.events[1].body.as_deref(),
            Some(&br#"{"id": "evt_1", "created": 10, "type": "charge.refunded"}"#[..])
        );
        let last = parse_event_page(br#"{"data":[],"has_more":false}"#).unwrap();
        assert_eq!(last, SourcePage::default());
        assert!(parse_event_page(br#"{"data":[],"has_more":true}"#).is_err());
        assert!(parse_event_page(br#"{"data":[{"type":"x"}],"has_more":false}"#).is_err());
        assert!(parse_event_page(b"<html>").is_err());
    }

    /// Issue 18.3: an event Stripe will not serve alone is that event's
    /// failure (parked); the key's refusal and outages stop the run.
    #[test]
    fn an_event_stripe_will_not_serve_is_that_events_failure() {
        let h = reqwest::header::HeaderMap::new();
        assert!(matches!(
            event_answer(404, &h),
            SourceError::Unfetchable { cause: crate::ports::Unfetchable::Status(404), .. }
        ));
        assert!(matches!(event_answer(401, &h), SourceError::Rejected(_)));
        assert!(matches!(event_answer(503, &h), SourceError::Unavailable(_)));
        assert!(matches!(event_answer(429, &h), SourceError::RateLimited { .. }));
    }

    #[test]
    fn a_429_carries_stripes_advice() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(rate_limited(&h), SourceError::RateLimited { retry_after_s: None, should_retry: true });
        h.insert("retry-after", "3".parse().unwrap());
        h.insert("stripe-should-retry", "false".parse().unwrap());
        assert_eq!(rate_limited(&h), SourceError::RateLimited { retry_after_s: Some(3), should_retry: false });
    }
}
