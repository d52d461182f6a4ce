//! HTTPS destinations: a route's delivery POSTed as Standard Webhooks.
//!
//! - `webhook-id` = the delivery's idempotency key (the same on every try),
//!   `webhook-timestamp` = the send's time in seconds, `webhook-signature`
//!   = `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` under each of the
//!   destination's `whsec_` secrets (two during a rotation, space-separated);
//!   the body is the route's envelope (`application/json`).
//! - Safe by default: no redirects followed, no proxy, a connect timeout of
//!   [`CONNECT_TIMEOUT`] and a whole-request one of [`REQUEST_TIMEOUT`], the
//!   answer read to at most [`ANSWER_BYTES`]. Every address the host
//!   resolves to is checked at connect time by the client's own resolver
//!   ([`GuardedResolver`], [`crate::netguard`]): one refused address refuses
//!   the name. An address in the URL is checked before the request.
//! - Answers: 2xx delivered; 408, 429 (its `Retry-After` honoured, at most
//!   an hour) and 5xx retried; another 4xx as the destination's
//!   `client_errors` class it (by default 401, 403, 404 and 410 retried for
//!   an hour from the delivery's commit, then DEAD; any other permanent);
//!   any other status is permanent (DEAD, with the status and the answer's
//!   first bytes). No answer (refused, timed out, reset) is retried.
//!
//! A destination's client and decoded secrets are built on its first
//! delivery and kept [`SECRETS_FOR`]; a rotation's new secret is picked up
//! after that (list both while consumers move).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::SecretResolver;
use crate::ports::{Publication, PublishError};
use crate::routes::{ClientErrorClass, ClientErrors, HttpsTarget, Routes};
use crate::secret::Secret;
use crate::verify::standard;

/// How long a connection (TCP and TLS) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the whole request may take, the answer's head and bytes read included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an answer is read (its first bytes are kept on a DEAD delivery).
pub const ANSWER_BYTES: usize = 4 * 1024;
/// How much of an answer is kept on the delivery (printable characters only).
pub const ANSWER_SHOWN: usize = 200;
/// How long a destination's decoded secrets are kept before they are read again.
pub const SECRETS_FOR: Duration = Duration::from_secs(300);

/// Resolves a host name to its addresses (the system resolver; tests answer their own).
pub trait Lookup: Send + Sync {
    fn lookup<'a>(&'a self, host: &'a str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;
}

/// The system's resolver (`getaddrinfo`, on tokio's blocking pool).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(&'a self, host: &'a str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, 0)).await?.map(|a| a.ip()).collect()) })
    }
}

/// The resolver of a destination's client: every address a name resolves
/// to must be allowed ([`crate::netguard::refused`]), or the connection is
/// not made.
pub struct GuardedResolver {
    lookup: Arc<dyn Lookup>,
    allow_private: bool,
}

impl GuardedResolver {
    pub fn new(lookup: Arc<dyn Lookup>, allow_private: bool) -> Self {
        Self { lookup, allow_private }
    }

    /// The addresses of `host`, each allowed; `Err`: why not.
    pub async fn allowed(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let ips = self.lookup.lookup(host).await.map_err(|e| format!("resolving {host}: {e}"))?;
        if ips.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        for ip in &ips {
            if let Some(why) = crate::netguard::refused(*ip, self.allow_private) {
                return Err(format!("refused: {host} resolves to {ip}, {why}"));
            }
        }
        Ok(ips)
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        let guard = GuardedResolver { lookup: self.lookup.clone(), allow_private: self.allow_private };
        Box::pin(async move {
            let ips =
                guard.allowed(&host).await.map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
            let addrs: reqwest::dns::Addrs = Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// One destination, ready to send to.
struct Ready {
    client: reqwest::Client,
    keys: Vec<Secret>,
    /// When it was built (the dispatcher's clock).
    built_ms: i64,
}

/// Sends routes' deliveries to their HTTPS destinations.
#[derive(Clone)]
pub struct HttpsSender {
    routes: Arc<Routes>,
    secrets: Arc<dyn SecretResolver>,
    lookup: Arc<dyn Lookup>,
    ready: Arc<Mutex<HashMap<String, Arc<Ready>>>>,
}

impl HttpsSender {
    pub fn new(routes: Arc<Routes>, secrets: Arc<dyn SecretResolver>) -> Self {
        Self::with_lookup(routes, secrets, Arc::new(SystemLookup))
    }

    /// With names resolved by `lookup` (tests: a resolver that answers
    /// what a hostile DNS would).
    pub fn with_lookup(routes: Arc<Routes>, secrets: Arc<dyn SecretResolver>, lookup: Arc<dyn Lookup>) -> Self {
        Self { routes, secrets, lookup, ready: Arc::default() }
    }

    fn target(&self, destination: &str) -> Result<&HttpsTarget, PublishError> {
        self.routes
            .destination(destination)
            .and_then(|d| d.https.as_ref())
            .ok_or_else(|| format!("{destination} is not an HTTPS destination of these routes").into())
    }

    async fn ready(&self, destination: &str, target: &HttpsTarget, now_ms: i64) -> Result<Arc<Ready>, PublishError> {
        {
            let ready = self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let fresh = |r: &&Arc<Ready>| (0..SECRETS_FOR.as_millis() as i64).contains(&(now_ms - r.built_ms));
            if let Some(r) = ready.get(destination).filter(fresh) {
                return Ok(r.clone());
            }
        }
        let mut keys = Vec::with_capacity(target.secrets.len());
        for reference in &target.secrets {
            let secret =
                self.secrets.resolve(reference).await.map_err(|e| format!("{destination}: reading its secret: {e}"))?;
            // A secret that is not whsec_<base64> is a configuration error:
            // retried (its circuit opens), so the deliveries wait for the
            // operator's fix (read again within SECRETS_FOR) instead of dying.
            let key = standard::decode_secret(&secret).map_err(|e| format!("{destination}: its secret: {e}"))?;
            keys.push(key);
        }
        crate::adapters::tls::install_tls();
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver::new(self.lookup.clone(), target.allow_private)))
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("Hookledger/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("{destination}: building its client: {}", crate::ledger::error_chain(&e)))?;
        let ready = Arc::new(Ready { client, keys, built_ms: now_ms });
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(destination.to_owned(), ready.clone());
        Ok(ready)
    }

    /// POSTs one delivery (see the module docs for what each answer means).
    pub async fn send(&self, out: Publication<'_>) -> Result<(), PublishError> {
        let destination = out.destination.ok_or_else(|| "an HTTPS target without a destination".to_owned())?;
        let target = self.target(destination)?;
        // An address in the URL is not resolved: it is checked here.
        let literal = match target.url.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(why) = literal.and_then(|ip| crate::netguard::refused(ip, target.allow_private)) {
            return Err(format!("refused: {destination}'s address is {why}").into());
        }
        let ready = self.ready(destination, target, out.now_ms).await?;
        let timestamp = out.now_ms.div_euclid(1000);
        let signature = ready
            .keys
            .iter()
            .map(|k| standard::sign(k, out.idempotency_key, timestamp, out.body.as_bytes()))
            .collect::<Vec<_>>()
            .join(" ");
        let sent = ready
            .client
            .post(target.url.clone())
            .header("content-type", "application/json")
            .header("webhook-id", out.idempotency_key)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(out.body.to_owned())
            .send()
            .await;
        let mut answer = match sent {
            Ok(a) => a,
            Err(e) => return Err(format!("{destination}: {}", super::provider_http::request_failure(e)).into()),
        };
        let status = answer.status().as_u16();
        let retry_after = answer
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after_ms(v, out.now_ms));
        // Read what the bound allows (the connection is then reusable, or dropped).
        // Its first bytes, at most the bound: nothing beyond is read.
        let mut head = Vec::new();
        while head.len() < ANSWER_BYTES {
            match answer.chunk().await {
                Ok(Some(chunk)) => head.extend_from_slice(&chunk[..chunk.len().min(ANSWER_BYTES - head.len())]),
                _ => break,
            }
        }
        classify(destination, status, &head, retry_after, &target.client_errors)
    }
}

/// What an answer means for the delivery: 2xx delivered; 408, 429 and 5xx
/// retried; another 4xx as its class for this destination says (retried
/// for a bound, or permanent); anything else permanent.
pub fn classify(
    destination: &str,
    status: u16,
    body: &[u8],
    retry_after: Option<i64>,
    client_errors: &ClientErrors,
) -> Result<(), PublishError> {
    let shown = shown(body);
    let said = if shown.is_empty() {
        format!("{destination}: answered {status}")
    } else {
        format!("{destination}: answered {status}: {shown}")
    };
    match status {
        200..=299 => Ok(()),
        408 | 429 | 500..=599 => Err(PublishError::Retry {
            message: said,
            after_ms: retry_after,
            throttled: status == 429 || retry_after.is_some(),
        }),
        400..=499 => match client_errors.class(status) {
            ClientErrorClass::RetryFor { ms } => Err(PublishError::Refused { message: said, retry_for_ms: ms }),
            ClientErrorClass::Permanent => Err(PublishError::Permanent(said)),
        },
        _ => Err(PublishError::Permanent(said)),
    }
}

/// An answer's first bytes as kept on the delivery: printable characters,
/// at most [`ANSWER_SHOWN`].
fn shown(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ANSWER_SHOWN)
        .collect::<String>()
        .trim()
        .to_owned()
}

/// `Retry-After` in milliseconds from now: seconds, or an HTTP date.
pub fn retry_after_ms(value: &str, now_ms: i64) -> Option<i64> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<i64>() {
        return (secs >= 0).then(|| secs.saturating_mul(1000));
    }
    let at = httpdate_ms(value)?;
    Some((at - now_ms).max(0))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) in milliseconds.
fn httpdate_ms(value: &str) -> Option<i64> {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else { return None };
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .iter()
        .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else { return None };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400) + h * 3600 + m * 60 + s) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_delivered_retried_or_permanent() {
        let defaults = ClientErrors::default();
        assert_eq!(classify("d", 204, b"", None, &defaults), Ok(()));
        assert_eq!(classify("d", 200, b"ok", None, &defaults), Ok(()));
        for status in [408, 429, 500, 502, 503] {
            let answer = classify("d", status, b"", Some(5), &defaults);
            assert!(matches!(answer, Err(PublishError::Retry { after_ms: Some(5), .. })));
        }
        let defaults = ClientErrors::default();
        for status in [401, 403, 404, 410] {
            assert!(matches!(
                classify("d", status, b"", None, &defaults),
                Err(PublishError::Refused { retry_for_ms: 3_600_000, .. })
            ));
        }
        for status in [301, 302, 400, 413, 422] {
            match classify("d", status, b"nope\n\x1b[31m", None, &defaults) {
                Err(PublishError::Permanent(m)) => assert_eq!(m, format!("d: answered {status}: nope  [31m")),
                other => panic!("{status}: {other:?}"),
            }
        }
        let long = vec![b'x'; 5000];
        let Err(PublishError::Permanent(m)) = classify("d", 400, &long, None, &defaults) else { panic!() };
        assert_eq!(m.len(), "d: answered 400: ".len() + ANSWER_SHOWN);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(retry_after_ms("120", 0), Some(120_000));
        assert_eq!(retry_after_ms("-1", 0), None);
        assert_eq!(retry_after_ms("soon", 0), None);
        // 784111777 s since the epoch.
        let at = 784_111_777_000;
        assert_eq!(retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", at - 30_000), Some(30_000));
        assert_eq!(retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", at + 1), Some(0));
    }

    struct Answers(Vec<IpAddr>);

    impl Lookup for Answers {
        fn lookup<'a>(&'a self, _: &'a str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
            Box::pin(async move { Ok(self.0.clone()) })
        }
    }

    /// A loopback server that counts connections and answers 204; its port.
    fn counting_server() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = [0u8; 8192];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        });
        (port, count)
    }

    struct Resolved;

    impl crate::config::SecretResolver for Resolved {
        fn resolve<'a>(&'a self, _: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
            Box::pin(async { Ok(Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")) })
        }
    }

    /// A name whose resolver answers the metadata address, a private one, a
    /// loopback one (not allowed) or an IPv6 link-local one is refused when
    /// the connection is made, and nothing is connected to; the same name
    /// answering a loopback address a destination allows is delivered.
    #[tokio::test]
    async fn names_resolving_to_metadata_private_loopback_or_link_local_addresses_are_refused_at_connect() {
        let (port, connections) = counting_server();
        let send = |answers: &'static [&'static str], allow_private: bool| async move {
            let routes = Routes::parse(&format!(
                r#"{{"destinations": {{"d": {{"url": "https://hooks.internal.test:{port}/in", "secrets": ["env:D"],
                   "allow_private": {allow_private}}}}}, "routes": [{{"to": ["d"]}}]}}"#
            ))
            .unwrap();
            let lookup = Answers(answers.iter().map(|a| a.parse().unwrap()).collect());
            let sender = HttpsSender::with_lookup(Arc::new(routes), Arc::new(Resolved), Arc::new(lookup));
            let out = publication("https://hooks.internal.test/in");
            sender.send(out).await
        };
        for (answers, allow, why) in [
            (&["169.254.169.254"][..], true, "metadata"),
            (&["10.1.2.3"][..], false, "private"),
            (&["127.0.0.1"][..], false, "loopback"),
            (&["fe80::1"][..], false, "link-local"),
            (&["93.184.216.34", "127.0.0.1"][..], false, "loopback"),
        ] {
            let err = send(answers, allow).await.unwrap_err();
            let PublishError::Retry { message, .. } = &err else { panic!("{err:?}") };
            assert!(message.contains("refused") && message.contains(why), "{answers:?}: {message}");
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was connected to");
        // Plain https to a plain-TCP server fails the handshake, but it is connected to: the guard let it through.
        let allowed = send(&["127.0.0.1"], true).await.unwrap_err();
        assert!(!allowed.message().contains("refused:"), "{allowed:?}");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    struct NotAWhsec;

    impl crate::config::SecretResolver for NotAWhsec {
        fn resolve<'a>(&'a self, _: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
            Box::pin(async { Ok(Secret::new("plain words, not base64!")) })
        }
    }

    /// A destination whose secret is not `whsec_<base64>` is a configuration
    /// error: retried (the deliveries wait for the fix), never sent, and the
    /// secret is not repeated in the error.
    #[tokio::test]
    async fn a_malformed_secret_is_retried_and_not_repeated() {
        let routes = Routes::parse(
            r#"{"destinations": {"d": {"url": "https://hooks.example.com/in", "secrets": ["env:D"]}},
                "routes": [{"to": ["d"]}]}"#,
        )
        .unwrap();
        let sender = HttpsSender::with_lookup(Arc::new(routes), Arc::new(NotAWhsec), Arc::new(Answers(vec![])));
        let out = publication("https://hooks.example.com/in");
        match sender.send(out).await {
            Err(PublishError::Retry { message, .. }) => {
                assert!(message.contains("its secret") && !message.contains("plain words"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A loopback server answering every request `status`; its port.
    fn answering_server(status: u16) -> u16 {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 8192];
                let _ = conn.read(&mut buf);
                let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 4\r\nconnection: close\r\n\r\nnope");
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        port
    }

    /// A delivery of `{}` to the destination `d`, keyed `k`.
    fn publication(target: &str) -> Publication<'_> {
        Publication {
            target,
            body: "{}",
            idempotency_key: "k",
            group: "",
            source: None,
            detail_type: None,
            destination: Some("d"),
            now_ms: 1_800_000_000_000,
        }
    }

    /// What `status` from a destination configured with `extra` means.
    async fn answer_of(status: u16, extra: &str) -> Result<(), PublishError> {
        let port = answering_server(status);
        let routes = Routes::parse(&format!(
            r#"{{"destinations": {{"d": {{"url": "http://127.0.0.1:{port}/in", "secrets": ["env:D"],
               "allow_private": true{extra}}}}}, "routes": [{{"to": ["d"]}}]}}"#
        ))
        .unwrap();
        let sender = HttpsSender::with_lookup(Arc::new(routes), Arc::new(Resolved), Arc::new(SystemLookup));
        let out = publication("destination:d");
        sender.send(out).await
    }

    /// A consumer's brief 401, 403, 404 or 410 (its own deploy, a secret
    /// rotation) is retried for an hour by default, then DEAD; any other
    /// 4xx is permanent; each status's class is the destination's to set.
    #[tokio::test]
    async fn a_consumers_brief_401_403_404_410_is_retried_for_an_hour_and_each_4xx_class_is_configurable() {
        for status in [401, 403, 404, 410] {
            let answer = answer_of(status, "").await;
            assert!(!matches!(answer, Err(PublishError::Permanent(_))), "{status}: {answer:?}");
            match answer {
                Err(PublishError::Refused { message, retry_for_ms: 3_600_000 }) => {
                    assert_eq!(message, format!("d: answered {status}: nope"))
                }
                other => panic!("{status}: {other:?}"),
            }
        }
        for status in [400, 422] {
            let answer = answer_of(status, "").await;
            assert!(matches!(answer, Err(PublishError::Permanent(_))), "{status}: {answer:?}");
        }
        let configured = r#", "client_errors": {"404": "permanent", "422": 600}"#;
        assert!(matches!(answer_of(404, configured).await, Err(PublishError::Permanent(_))));
        assert!(!matches!(answer_of(422, configured).await, Err(PublishError::Permanent(_))));
        let answer = answer_of(422, configured).await;
        assert!(matches!(answer, Err(PublishError::Refused { retry_for_ms: 600_000, .. })), "{answer:?}");
        let answer = answer_of(401, configured).await;
        assert!(matches!(answer, Err(PublishError::Refused { retry_for_ms: 3_600_000, .. })), "the defaults kept");
    }

    #[tokio::test]
    async fn a_name_is_refused_when_any_address_it_resolves_to_is_refused() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let guard = |ips: Vec<IpAddr>, allow| GuardedResolver::new(Arc::new(Answers(ips)), allow);
        assert!(guard(vec![ip("93.184.216.34")], false).allowed("h").await.is_ok());
        let err = guard(vec![ip("93.184.216.34"), ip("169.254.169.254")], true).allowed("h").await.unwrap_err();
        assert!(err.contains("169.254.169.254") && err.contains("metadata"), "{err}");
        assert!(guard(vec![ip("10.0.0.1")], false).allowed("h").await.is_err());
        assert!(guard(vec![ip("10.0.0.1")], true).allowed("h").await.is_ok());
        assert!(guard(vec![], true).allowed("h").await.is_err());
    }
}
