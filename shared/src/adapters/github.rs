//! GitHub's webhook deliveries as a [`BackfillSource`]: a hook's recent
//! deliveries (`GET /{hook}/deliveries`, newest first, cursor pagination in
//! the `Link` header; GitHub keeps them 3 days), each delivery's payload
//! (`GET /{hook}/deliveries/{id}`, as parsed JSON) and a redelivery
//! (`POST /{hook}/deliveries/{id}/attempts`). `{hook}` is a repository hook
//! (`repos/{owner}/{repo}/hooks/{id}`), an organisation hook
//! (`orgs/{org}/hooks/{id}`) or a GitHub App's hook (`app/hook`). The
//! identity is the delivery's `guid`, the `X-GitHub-Delivery` header of its
//! webhook. Rate limits: `Retry-After` (secondary limits), else
//! `X-RateLimit-Remaining: 0` until `X-RateLimit-Reset`. Each answer is
//! read up to a bound ([`MAX_DELIVERY_PAGE_BYTES`], the backfill's body
//! limit for a delivery), and every request runs within the function's
//! [`Timeouts`].

use crate::adapters::provider_http::{BodyError, read_capped, request_failure};
use crate::adapters::timeouts::Timeouts;
use crate::ports::{BackfillSource, SourceError, SourceEvent, SourcePage, Window};
use crate::secret::Secret;

pub struct GithubDeliveries {
    client: reqwest::Client,
    api_base: String,
    hook: String,
    token: Secret,
    /// The largest payload taken (a larger delivery is `Unfetchable::TooLarge`).
    max_body_bytes: usize,
    /// Reads `Retry-After`-like reset times against this clock.
    clock: std::sync::Arc<dyn crate::clock::Clock>,
}

/// Room a delivery's answer takes around its payload (its request and
/// response headers, the response body GitHub kept).
const DELIVERY_OVERHEAD_BYTES: usize = 1024 * 1024;

/// The largest page of deliveries read: 1 MiB (a page lists 100 deliveries
/// without their payloads, some 30 KiB); a larger page fails the run.
pub const MAX_DELIVERY_PAGE_BYTES: usize = 1024 * 1024;

pub use crate::ports::valid_github_hook as valid_hook;

impl GithubDeliveries {
    /// The deliveries of `hook` at `api_base`, within the reconciler's [`Timeouts`].
    pub fn new(api_base: impl Into<String>, hook: &str, token: Secret) -> Result<Self, String> {
        Self::new_within(api_base, hook, token, Timeouts::RECONCILER)
    }

    /// The deliveries of `hook` at `api_base`, its requests within
    /// `timeouts` (the calling function's, or the CLI's). The base must be
    /// `https://` (plain `http://` only to a loopback host).
    pub fn new_within(
        api_base: impl Into<String>,
        hook: &str,
        token: Secret,
        timeouts: Timeouts,
    ) -> Result<Self, String> {
        if !valid_hook(hook) {
            return Err(format!(
                "{hook:?} is not a hook path (repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook)"
            ));
        }
        let api_base = api_base.into();
        crate::adapters::provider_http::check_api_base(&api_base)?;
        let client = timeouts
            .http_client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent("hookledger-backfill")
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            api_base: api_base.trim_end_matches('/').to_owned(),
            hook: hook.to_owned(),
            token,
            max_body_bytes: crate::ports::DEFAULT_MAX_BACKFILL_BODY_BYTES,
            clock: std::sync::Arc::new(crate::clock::SystemClock),
        })
    }

    /// Reads rate-limit reset times against this clock.
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Takes payloads up to `bytes` (`HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`);
    /// a delivery's answer is read no further than that and its overhead.
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, url)
            .bearer_auth(String::from_utf8_lossy(self.token.expose()))
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, SourceError> {
        self.send_as(req, false).await
    }

    /// A request about one delivery: a refusal other than the key's or the
    /// rate's is that delivery's, not the run's ([`event_refusal`]).
    async fn send_for_event(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, SourceError> {
        self.send_as(req, true).await
    }

    async fn send_as(&self, req: reqwest::RequestBuilder, one_event: bool) -> Result<reqwest::Response, SourceError> {
        let resp = req.send().await.map_err(|e| SourceError::Unavailable(request_failure(e)))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let now_s = self.clock.now_ms().max(0) as u64 / 1000;
        Err(match classify(status.as_u16(), resp.headers(), now_s) {
            SourceError::Rejected(_) if one_event => event_refusal(status.as_u16()),
            other => other,
        })
    }

    fn delivery_url(&self, event: &SourceEvent) -> Result<String, SourceError> {
        let id = event.handle.as_deref().filter(|h| h.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty());
        let id = id.ok_or_else(|| SourceError::Rejected("a delivery without a numeric id".into()))?;
        Ok(format!("{}/{}/deliveries/{id}", self.api_base, self.hook))
    }
}

/// A refusal (4xx, not a rate limit) of a request about one delivery: the
/// key's or the proxy's (401, 403, 407) stops the run, a timeout (408) is
/// tried again later, any other (404 gone, 410, 422) is that delivery's.
pub fn event_refusal(status: u16) -> SourceError {
    match status {
        401 | 403 | 407 => SourceError::Rejected(format!("HTTP {status}")),
        408 => SourceError::Unavailable(format!("HTTP {status}")),
        400..=499 => SourceError::Unfetchable {
            cause: crate::ports::Unfetchable::Status(status),
            detail: format!("GitHub answered HTTP {status} for the delivery"),
        },
        _ => SourceError::Rejected(format!("HTTP {status}")),
    }
}

/// The payload of a delivery's answer, re-serialised: `NotJson` when the
/// answer is not JSON, `NoPayload` when GitHub kept none.
pub fn delivery_payload(bytes: &[u8], guid: &str) -> Result<Vec<u8>, SourceError> {
    use crate::ports::Unfetchable;
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| SourceError::Unfetchable {
        cause: Unfetchable::NotJson,
        detail: format!("GitHub's answer for delivery {guid} is not JSON"),
    })?;
    match v.pointer("/request/payload") {
        Some(p) if !p.is_null() => serde_json::to_vec(p).map_err(|_| SourceError::Unfetchable {
            cause: Unfetchable::NotJson,
            detail: format!("the payload of delivery {guid} cannot be serialised"),
        }),
        _ => Err(SourceError::Unfetchable {
            cause: Unfetchable::NoPayload,
            detail: format!("GitHub kept no payload for delivery {guid}"),
        }),
    }
}

/// A non-2xx answer: a rate limit (with the wait GitHub asks for), a
/// server fault, or a refusal.
pub fn classify(status: u16, headers: &reqwest::header::HeaderMap, now_s: u64) -> SourceError {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let retry_after = header("retry-after").and_then(|v| v.parse::<u64>().ok());
    let exhausted = header("x-ratelimit-remaining") == Some("0");
    let reset_in =
        header("x-ratelimit-reset").and_then(|v| v.parse::<u64>().ok()).map(|reset| reset.saturating_sub(now_s));
    match status {
        403 | 429 if retry_after.is_some() => {
            SourceError::RateLimited { retry_after_s: retry_after, should_retry: true }
        }
        403 | 429 if exhausted => SourceError::RateLimited { retry_after_s: reset_in, should_retry: true },
        429 => SourceError::RateLimited { retry_after_s: None, should_retry: true },
        500..=599 => SourceError::Unavailable(format!("HTTP {status}")),
        _ => SourceError::Rejected(format!("HTTP {status}")),
    }
}

#[derive(serde::Deserialize)]
struct Delivery {
    id: u64,
    guid: String,
    delivered_at: String,
    event: Option<String>,
}

/// The `cursor` of the `rel="next"` link, if any.
pub fn next_cursor(link: Option<&str>) -> Option<String> {
    link?.split(',').find(|part| part.contains("rel=\"next\"")).and_then(|part| {
        let url = part.trim().trim_start_matches('<').split('>').next()?;
        url::Url::parse(url).ok()?.query_pairs().find(|(k, _)| k == "cursor").map(|(_, v)| v.into_owned())
    })
}

/// One page of deliveries; the list ends at the first delivery older than
/// the window (the list is newest first).
pub fn parse_deliveries(bytes: &[u8], link: Option<&str>, window: &Window) -> Result<SourcePage, SourceError> {
    let list: Vec<Delivery> =
        serde_json::from_slice(bytes).map_err(|_| SourceError::Rejected("not a list of deliveries".into()))?;
    let mut events = Vec::with_capacity(list.len());
    let mut older = false;
    for d in list {
        let created_s = crate::verify::sns::parse_timestamp(&d.delivered_at)
            .ok_or_else(|| SourceError::Rejected(format!("delivery {} has no valid delivered_at", d.id)))?;
        older |= created_s < window.since_s;
        events.push(SourceEvent {
            event_id: d.guid,
            event_type: d.event,
            created_s,
            body: None,
            handle: Some(d.id.to_string()),
        });
    }
    let next = if older { None } else { next_cursor(link) };
    Ok(SourcePage { events, next })
}

impl BackfillSource for GithubDeliveries {
    async fn page(&self, window: &Window, cursor: Option<&str>) -> Result<SourcePage, SourceError> {
        let mut query = vec![("per_page", "100".to_owned())];
        if let Some(c) = cursor {
            query.push(("cursor", c.to_owned()));
        }
        let url = url::Url::parse_with_params(&format!("{}/{}/deliveries", self.api_base, self.hook), &query)
            .map_err(|e| SourceError::Rejected(format!("GitHub API base: {e}")))?;
        let mut resp = self.send(self.request(reqwest::Method::GET, url.as_str())).await?;
        let link = resp.headers().get("link").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = read_capped(&mut resp, MAX_DELIVERY_PAGE_BYTES).await.map_err(|e| match e {
            BodyError::TooLarge { .. } => SourceError::Rejected(format!("the page of deliveries: {e}")),
            BodyError::Read(_) => SourceError::Unavailable(e.to_string()),
        })?;
        parse_deliveries(&bytes, link.as_deref(), window)
    }

    /// The payload GitHub kept, as parsed JSON re-serialised (not the
    /// original bytes: a redelivery gives those).
    /// A delivery GitHub answers for with a 4xx, without a payload, with an
    /// answer that is not JSON, or too large, is `Unfetchable`.
    async fn body(&self, event: &SourceEvent) -> Result<Vec<u8>, SourceError> {
        let url = self.delivery_url(event)?;
        let resp = self.send_for_event(self.request(reqwest::Method::GET, &url)).await?;
        let bytes = super::tls::read_bounded(resp, self.max_body_bytes.saturating_add(DELIVERY_OVERHEAD_BYTES)).await?;
        delivery_payload(&bytes, &event.event_id)
    }

    async fn redeliver(&self, event: &SourceEvent) -> Result<(), SourceError> {
        let url = format!("{}/attempts", self.delivery_url(event)?);
        self.send_for_event(self.request(reqwest::Method::POST, &url)).await.map(|_| ())
    }

    fn origin(&self) -> Option<String> {
        Some(self.hook.clone())
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

    fn window() -> Window {
        Window { since_s: 0, until_s: i64::MAX, types: vec![] }
    }

    /// Issue 21.5: a GitHub API that accepts the connection and never
    /// answers fails the page with a timeout.
    #[tokio::test]
    async fn a_github_call_that_never_answers_fails_with_a_timeout() {
        let api = GithubDeliveries::new_within(test_servers::silent(), "app/hook", Secret::new("t"), SHORT).unwrap();
        let page = tokio::time::timeout(Duration::from_secs(10), api.page(&window(), None)).await;
        match page.expect("the client's own timeout ends the page") {
            Err(SourceError::Unavailable(m)) => assert!(m.contains("timed out"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// Issue 21.7: a page of deliveries longer than its bound is refused as
    /// it is read (the answer carries no length), naming the bound.
    #[tokio::test]
    async fn a_github_page_over_its_bound_is_refused() {
        let base = test_servers::answering_bytes(MAX_DELIVERY_PAGE_BYTES + 1);
        let api = GithubDeliveries::new(base, "app/hook", Secret::new("t")).unwrap();
        match api.page(&window(), None).await {
            Err(SourceError::Rejected(m)) => {
                assert!(m.contains("deliveries") && m.contains("larger than the 1048576-byte bound"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hook_paths_are_checked() {
        for ok in ["repos/octo/hello-world/hooks/12", "orgs/octo/hooks/9", "app/hook"] {
            assert!(valid_hook(ok), "{ok}");
        }
        for bad in
            ["repos/octo/hooks/1", "repos/a/b/hooks/x", "repos/../b/hooks/1", "app/hook/x", "", "orgs/a b/hooks/1"]
        {
            assert!(!valid_hook(bad), "{bad}");
        }
        assert!(GithubDeliveries::new("https://api.github.com", "repos/x", Secret::new("t")).is_err());
        assert!(GithubDeliveries::new("http://api.github.com", "app/hook", Secret::new("t")).is_err(), "plain http");
        assert!(GithubDeliveries::new("http://localhost:5056", "app/hook", Secret::new("t")).is_ok());
    }

    #[test]
    fn the_next_cursor_comes_from_the_link_header() {
        let link = r#"<https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=2&cursor=v1_123>; rel="next", <https://api.github.com/repos/o/r/hooks/1/deliveries?per_page=2>; rel="first""#;
        assert_eq!(next_cursor(Some(link)).as_deref(), Some("v1_123"));
        assert_eq!(next_cursor(Some(r#"<https://x/y?per_page=2>; rel="first""#)), None);
        assert_eq!(next_cursor(None), None);
    }

    #[test]
    fn deliveries_parse_and_the_list_ends_below_the_window() {
        let page = br#"[{"id": 22, "guid": "0b989ba4-242f-11e5-81e1-c7b6966d2516", "delivered_at": "2026-11-30T10:00:00Z", "redelivery": false, "status_code": 503, "event": "push"},
            {"id": 21, "guid": "aa", "delivered_at": "2026-11-30T09:00:00Z", "event": "issues"}]"#;
        let link = r#"<https://x/d?cursor=c2>; rel="next""#;
        let w = |since| Window { since_s: since, until_s: i64::MAX, types: vec![] };
        let p = parse_deliveries(page, Some(link), &w(0)).unwrap();
        assert_eq!(p.next.as_deref(), Some("c2"));
        assert_eq!(
            (p.events[0].event_id.as_str(), p.events[0].handle.as_deref()),
            ("0b989ba4-242f-11e5-81e1-c7b6966d2516", Some("22"))
        );
        assert_eq!(p.events[1].event_type.as_deref(), Some("issues"));
        assert!(p.events.iter().all(|e| e.body.is_none()));
        let at_10 = crate::verify::sns::parse_timestamp("2026-11-30T09:30:00Z").unwrap();
        assert_eq!(parse_deliveries(page, Some(link), &w(at_10)).unwrap().next, None, "older than the window: the end");
        assert!(parse_deliveries(br#"[{"id":1,"guid":"g","delivered_at":"yesterday"}]"#, None, &w(0)).is_err());
    }

    /// Issue 18.3: what GitHub cannot serve for one delivery is that
    /// delivery's (parked), what is about the key or the rate stops the run.
    #[test]
    fn a_delivery_github_cannot_serve_is_that_deliverys_failure() {
        use crate::ports::Unfetchable;
        let cause = |r: Result<Vec<u8>, SourceError>| match r {
            Err(SourceError::Unfetchable { cause, .. }) => Some(cause),
            _ => None,
        };
        assert_eq!(cause(delivery_payload(br#"{"request":{"payload":null}}"#, "g")), Some(Unfetchable::NoPayload));
        assert_eq!(cause(delivery_payload(br#"{"request":{}}"#, "g")), Some(Unfetchable::NoPayload));
        assert_eq!(cause(delivery_payload(b"<html>502</html>", "g")), Some(Unfetchable::NotJson));
        assert_eq!(delivery_payload(br#"{"request":{"payload":{"a": 1}}}"#, "g").unwrap(), br#"{"a":1}"#);
        for code in [404, 410, 422, 400] {
            assert!(
                matches!(event_refusal(code), SourceError::Unfetchable { cause: Unfetchable::Status(c), .. } if c == code),
                "{code}"
            );
        }
        assert!(matches!(event_refusal(401), SourceError::Rejected(_)), "a bad token stops the run");
        assert!(matches!(event_refusal(403), SourceError::Rejected(_)));
        assert!(matches!(event_refusal(408), SourceError::Unavailable(_)));
    }

    #[test]
    fn rate_limits_are_read_from_githubs_headers() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("x-ratelimit-remaining", "0".parse().unwrap());
        h.insert("x-ratelimit-reset", "1060".parse().unwrap());
        assert_eq!(classify(403, &h, 1_000), SourceError::RateLimited { retry_after_s: Some(60), should_retry: true });
        h.insert("retry-after", "7".parse().unwrap());
        assert_eq!(classify(403, &h, 1_000), SourceError::RateLimited { retry_after_s: Some(7), should_retry: true });
        let none = reqwest::header::HeaderMap::new();
        assert_eq!(classify(429, &none, 0), SourceError::RateLimited { retry_after_s: None, should_retry: true });
        assert!(matches!(classify(403, &none, 0), SourceError::Rejected(_)), "a plain 403 is a refusal");
        assert!(matches!(classify(502, &none, 0), SourceError::Unavailable(_)));
    }
}
