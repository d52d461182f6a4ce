//! Routes: which verified events are handed to which destinations
//! (`HOOKLEDGER_ROUTES`, template parameter `Routes`).
//!
//! ```json
//! {"destinations": {
//!    "orders":  {"arn": "arn:aws:sqs:eu-west-1:123456789012:orders"},
//!    "ordered": {"arn": "arn:aws:sqs:eu-west-1:123456789012:orders.fifo"},
//!    "bus":     {"arn": "arn:aws:events:eu-west-1:123456789012:event-bus/billing", "source": "acme.billing"},
//!    "topic":   {"arn": "arn:aws:sns:eu-west-1:123456789012:billing"},
//!    "partner": {"url": "https://hooks.partner.example/hookledger",
//!                "secrets": ["ssm:/hookledger/destinations/partner"]}},
//!  "routes": [
//!    {"provider": "stripe", "type": "invoice.*", "to": ["orders", "bus"]},
//!    {"endpoint": "github-*", "tenant": "acme", "to": ["topic"]}]}
//! ```
//!
//! A rule matches an event when each of its globs (`endpoint`, `provider`,
//! `tenant`, `type`; `*` any run, `?` one character; absent: anything)
//! matches; an event goes to the union of the destinations of the rules it
//! matches, each once. A route is a built-in projection: its deliveries are
//! outbox items committed with the completion marker, one per (event,
//! destination), keyed by [`delivery_action`] (`processor`, `outbox`).
//! Everything is checked at load: destination names, ARNs (SNS topic, SQS
//! queue, EventBridge bus), HTTPS destinations' URLs and secret references,
//! unknown names, and at most [`MAX_DESTINATIONS_PER_EVENT`] destinations
//! for any one event.
//!
//! An HTTPS destination (`url`) is sent the envelope signed as Standard
//! Webhooks with its own `whsec_` secrets (`secrets`: one, or two during a
//! rotation; references, `env:NAME` or `ssm:/path`). Its URL is `https://`;
//! plain `http://` only to a loopback host, and only with `allow_private`
//! (a local stack, a test). Private, loopback and link-local addresses are
//! refused at connect time unless `allow_private` is set
//! ([`crate::netguard`]); metadata addresses always. Its deliveries store
//! its name ([`https_reference`]), never its URL (a token may be in it).
//! Its 4xx answers are classed by `client_errors` ([`ClientErrors`]: by
//! default 401, 403, 404 and 410 retried for an hour, any other permanent).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// The most destinations one event may be delivered to.
pub const MAX_DESTINATIONS_PER_EVENT: usize = 20;

/// The EventBridge `Source` of a bus destination that names none.
pub const DEFAULT_SOURCE: &str = "hookledger";

/// What kind of AWS resource a destination is, read from its ARN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sns,
    /// A standard queue, or a FIFO one (its name ends in `.fifo`).
    Sqs {
        fifo: bool,
    },
    EventBridge,
    /// An HTTPS endpoint, sent Standard Webhooks.
    Https,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Self::Sns => "sns",
            Self::Sqs { fifo: false } => "sqs",
            Self::Sqs { fifo: true } => "sqs_fifo",
            Self::EventBridge => "eventbridge",
            Self::Https => "https",
        }
    }
}

/// A parsed destination ARN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arn {
    pub partition: String,
    pub region: String,
    pub account: String,
    /// The topic, queue or bus name.
    pub name: String,
    pub kind: Kind,
}

impl Arn {
    /// `arn:<partition>:sns|sqs:<region>:<account>:<name>` or
    /// `arn:<partition>:events:<region>:<account>:event-bus/<name>`.
    pub fn parse(arn: &str) -> Result<Self, String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let [scheme, partition, service, region, account, resource] = parts.as_slice() else {
            return Err(format!("{arn:?} is not an ARN"));
        };
        let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if *scheme != "arn" || !plain(partition) || !plain(region) {
            return Err(format!("{arn:?} is not an ARN"));
        }
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{arn:?}: the account must be 12 digits"));
        }
        let name_ok = |n: &str, max: usize| {
            (1..=max).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        // The ARN's service (not a webhook provider's name).
        const TOPIC: &str = "sns";
        const QUEUE: &str = "sqs";
        const BUS: &str = "events";
        let (kind, name) = match *service {
            s if s == TOPIC => (Kind::Sns, *resource),
            s if s == QUEUE => (Kind::Sqs { fifo: resource.ends_with(".fifo") }, *resource),
            s if s == BUS => {
                let name = resource
                    .strip_prefix("event-bus/")
                    .ok_or_else(|| format!("{arn:?}: an EventBridge destination is an event bus (event-bus/NAME)"))?;
                (Kind::EventBridge, name)
            }
            other => return Err(format!("{arn:?}: {other} is not a destination (sns, sqs or events)")),
        };
        if !name_ok(name, 256) {
            return Err(format!("{arn:?}: the name must be letters, digits, '-', '_' or '.'"));
        }
        Ok(Self {
            partition: (*partition).to_owned(),
            region: (*region).to_owned(),
            account: (*account).to_owned(),
            name: name.to_owned(),
            kind,
        })
    }

    /// An SQS queue's URL (what `SendMessage` takes), in its region.
    pub fn queue_url(&self) -> String {
        let domain = if self.partition == "aws-cn" { "amazonaws.com.cn" } else { "amazonaws.com" };
        format!("https://sqs.{}.{domain}/{}/{}", self.region, self.account, self.name)
    }
}

/// One destination, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub name: String,
    /// Where it is: an ARN, or an HTTPS destination's reference by name
    /// ([`https_reference`]: what its deliveries store; the URL, which may
    /// carry a token, stays in [`HttpsTarget::url`] and is never stored).
    pub target: String,
    pub kind: Kind,
    /// An AWS destination's parsed ARN.
    pub arn: Option<Arn>,
    /// An HTTPS destination's secrets and address policy.
    pub https: Option<HttpsTarget>,
    /// EventBridge only: the events' `Source`.
    pub source: String,
    /// Its rate and concurrency limits (none by default).
    pub limits: Limits,
}

/// The most sends a second a destination may be given (one rate item takes
/// them all: a DynamoDB item takes 1,000 writes a second).
pub const MAX_PER_SECOND: f64 = 500.0;
/// The most sends in flight a destination may be given (one set holds them).
pub const MAX_IN_FLIGHT: u32 = 200;

/// Grants are this much further apart than the limit says (2 %), so the
/// network's jitter between two sends never puts the partner, counting
/// with its own clock, over its limit.
pub const GRANT_MARGIN: f64 = 1.02;

/// A destination's limits, enforced across every dispatcher
/// (`outbox::limit`): `max_per_second` (grants at least `1020 /
/// max_per_second` ms apart, whole ms, so no one-second window holds more) and
/// `max_in_flight` (sends at once). A delivery over a limit waits; it is
/// never failed for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// The least time between two grants, in ms (`None`: no rate limit).
    pub step_ms: Option<i64>,
    /// The most sends at once (`None`: no limit).
    pub in_flight: Option<u32>,
}

impl Limits {
    fn parse(max_per_second: Option<f64>, max_in_flight: Option<u32>) -> Result<Self, String> {
        let step_ms = match max_per_second {
            None => None,
            Some(r) if (0.001..=MAX_PER_SECOND).contains(&r) => Some((1000.0 * GRANT_MARGIN / r).ceil() as i64),
            Some(r) => return Err(format!("max_per_second must be 0.001 to {MAX_PER_SECOND}, not {r}")),
        };
        let in_flight = match max_in_flight {
            None => None,
            Some(n) if (1..=MAX_IN_FLIGHT).contains(&n) => Some(n),
            Some(n) => return Err(format!("max_in_flight must be 1 to {MAX_IN_FLIGHT}, not {n}")),
        };
        Ok(Self { step_ms, in_flight })
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.step_ms.is_some() || self.in_flight.is_some()
    }

    /// The rate the step gives, per second.
    pub fn per_second(&self) -> Option<f64> {
        self.step_ms.map(|s| 1000.0 / s as f64)
    }
}

/// An HTTPS destination.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpsTarget {
    /// Where it is POSTed. Its path and query may carry a token: it is
    /// never stored on a delivery, logged or shown (see the `Debug` form).
    pub url: url::Url,
    /// Its `whsec_` secrets, by reference (`env:` or `ssm:`): one, or two
    /// during a rotation (each signs; the consumer accepts either).
    pub secrets: Vec<String>,
    /// Private, loopback and link-local addresses allowed (never metadata ones).
    pub allow_private: bool,
    /// What each 4xx answer means: permanent, or retried for a bound.
    pub client_errors: ClientErrors,
}

impl std::fmt::Debug for HttpsTarget {
    /// The URL's scheme, host and port only: its path and query may carry a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsTarget")
            .field("origin", &self.url.origin().ascii_serialization())
            .field("secrets", &self.secrets)
            .field("allow_private", &self.allow_private)
            .field("client_errors", &self.client_errors)
            .finish()
    }
}

/// What an HTTPS destination's 4xx answer (other than 408 and 429, always
/// retried) means for the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorClass {
    /// DEAD at once: no retry can change the answer.
    Permanent,
    /// Retried (with the backoff) while the delivery is younger than this,
    /// counted from its commit or its replay; then DEAD.
    RetryFor { ms: i64 },
}

/// The 4xx answers a consumer gives briefly while it deploys or rotates a
/// secret, retried by default for [`CLIENT_ERROR_RETRY_MS`].
pub const BRIEF_CLIENT_ERRORS: [u16; 4] = [401, 403, 404, 410];
/// How long a brief 4xx is retried by default (an hour).
pub const CLIENT_ERROR_RETRY_MS: i64 = 3_600_000;
/// The longest a 4xx may be retried: a delivery's own bound (24 hours).
pub const MAX_CLIENT_ERROR_RETRY_SECS: i64 = 86_400;

/// An HTTPS destination's classes of 4xx answers (`client_errors`): the
/// defaults ([`BRIEF_CLIENT_ERRORS`] retried for an hour, any other 4xx
/// permanent) with the destination's own classes over them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientErrors(BTreeMap<u16, ClientErrorClass>);

impl Default for ClientErrors {
    fn default() -> Self {
        Self(
            BRIEF_CLIENT_ERRORS
                .iter()
                .map(|&s| (s, ClientErrorClass::RetryFor { ms: CLIENT_ERROR_RETRY_MS }))
                .collect(),
        )
    }
}

impl ClientErrors {
    /// The class of a 4xx `status` (any status not named: permanent).
    pub fn class(&self, status: u16) -> ClientErrorClass {
        self.0.get(&status).copied().unwrap_or(ClientErrorClass::Permanent)
    }

    /// The defaults with `spec`'s classes over them: each key a 4xx status
    /// (not 408 or 429), each value `"permanent"` or the seconds it is
    /// retried (1 to a day).
    fn parse(spec: &BTreeMap<String, serde_json::Value>) -> Result<Self, String> {
        let mut classes = Self::default();
        for (key, value) in spec {
            let status = key
                .parse::<u16>()
                .ok()
                .filter(|s| (400..=499).contains(s))
                .ok_or_else(|| format!("client_errors: {key:?} is not a 4xx status"))?;
            if matches!(status, 408 | 429) {
                return Err(format!("client_errors: {status} is always retried (with its Retry-After)"));
            }
            let class = match value {
                serde_json::Value::String(s) if s == "permanent" => ClientErrorClass::Permanent,
                serde_json::Value::Number(n)
                    if n.as_i64().is_some_and(|secs| (1..=MAX_CLIENT_ERROR_RETRY_SECS).contains(&secs)) =>
                {
                    ClientErrorClass::RetryFor { ms: n.as_i64().unwrap_or(0) * 1000 }
                }
                other => {
                    return Err(format!(
                        "client_errors.{status}: \"permanent\" or the seconds it is retried \
                         (1-{MAX_CLIENT_ERROR_RETRY_SECS}), not {other}"
                    ));
                }
            };
            classes.0.insert(status, class);
        }
        Ok(classes)
    }
}

/// What an HTTPS destination's deliveries store as their target: the
/// destination's name, never its URL (which may carry a token).
pub fn https_reference(name: &str) -> String {
    format!("{HTTPS_REFERENCE}{name}")
}

/// The prefix of [`https_reference`].
pub const HTTPS_REFERENCE: &str = "destination:";

/// Whether a delivery's stored target is an HTTPS destination: its
/// reference by name, or (an item an earlier release wrote) its URL.
pub fn is_https_target(target: &str) -> bool {
    target.starts_with(HTTPS_REFERENCE) || target.starts_with("https://") || target.starts_with("http://")
}

/// What a destination counts against its 256 KiB for a message of `body`
/// (bytes), from its stored target: SNS and SQS the body and each message
/// attribute's name, type and value (the idempotency key's); EventBridge
/// the entry's `Detail`, `Source`, `DetailType` and `Time` (14 bytes,
/// counted though not sent); an HTTPS destination the body.
pub fn counted_bytes(
    target: &str,
    body: usize,
    idempotency_key: &str,
    source: Option<&str>,
    detail_type: Option<&str>,
) -> usize {
    if is_https_target(target) {
        return body;
    }
    match Arn::parse(target).map(|a| a.kind) {
        Ok(Kind::EventBridge) => {
            body + 14 + source.unwrap_or(DEFAULT_SOURCE).len() + detail_type.unwrap_or(DEFAULT_DETAIL_TYPE).len()
        }
        Ok(Kind::Sns | Kind::Sqs { .. }) | Err(_) => {
            body + crate::message::IDEMPOTENCY_ATTRIBUTE.len() + "String".len() + idempotency_key.len()
        }
        Ok(Kind::Https) => body,
    }
}

/// The EventBridge `DetailType` of an entry without an event type.
pub const DEFAULT_DETAIL_TYPE: &str = "event";

/// The most secrets an HTTPS destination signs with (a rotation's two).
pub const MAX_DESTINATION_SECRETS: usize = 2;

impl HttpsTarget {
    fn parse(
        url: &str,
        secrets: Vec<String>,
        allow_private: bool,
        client_errors: Option<&BTreeMap<String, serde_json::Value>>,
    ) -> Result<Self, String> {
        // Errors name the URL without its query (it may carry a token).
        let url_shown = url.split(['?', '#']).next().unwrap_or_default();
        if url.len() > 2048 {
            return Err("the url is longer than 2048 characters".into());
        }
        let parsed = url::Url::parse(url).map_err(|e| format!("{url_shown:?} is not a URL ({e})"))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err("the url must not carry credentials (the deliveries are signed)".into());
        }
        if parsed.fragment().is_some() {
            return Err("the url must not have a fragment".into());
        }
        let host = parsed.host().ok_or_else(|| format!("{url_shown:?} has no host"))?;
        let literal = match &host {
            url::Host::Ipv4(ip) => Some(std::net::IpAddr::V4(*ip)),
            url::Host::Ipv6(ip) => Some(std::net::IpAddr::V6(*ip)),
            url::Host::Domain(_) => None,
        };
        let loopback = match &host {
            url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
            _ => literal.is_some_and(|ip| ip.is_loopback()),
        };
        match parsed.scheme() {
            "https" => {}
            "http" if loopback && allow_private => {}
            "http" if loopback => {
                return Err(
                    "plain http to a loopback host needs \"allow_private\": true (local stacks and tests)".into()
                );
            }
            _ => {
                return Err(format!(
                    "{url_shown:?}: a destination's url is https:// (plain http only to a loopback host)"
                ));
            }
        }
        if let Some(why) = literal.and_then(|ip| crate::netguard::refused(ip, allow_private)) {
            return Err(format!("{url_shown:?} is {why}; set \"allow_private\": true to allow private networks"));
        }
        if secrets.is_empty() || secrets.len() > MAX_DESTINATION_SECRETS {
            return Err(format!("an HTTPS destination signs with 1 or {MAX_DESTINATION_SECRETS} secrets (`secrets`)"));
        }
        if let Some(bad) = secrets.iter().find(|r| !(r.starts_with("env:") || r.starts_with("ssm:"))) {
            let shown = if bad.len() > 6 { &bad[..6] } else { bad.as_str() };
            return Err(format!(
                "secrets must be references (env:NAME or ssm:/path), never inline values (one starts {shown:?})"
            ));
        }
        let client_errors = client_errors.map_or_else(|| Ok(ClientErrors::default()), ClientErrors::parse)?;
        Ok(Self { url: parsed, secrets, allow_private, client_errors })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationSpec {
    #[serde(default)]
    arn: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    secrets: Option<Vec<String>>,
    #[serde(default)]
    allow_private: Option<bool>,
    #[serde(default)]
    client_errors: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    max_per_second: Option<f64>,
    #[serde(default)]
    max_in_flight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default, rename = "type")]
    event_type: Option<String>,
    to: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    destinations: BTreeMap<String, DestinationSpec>,
    routes: Vec<RuleSpec>,
}

/// A rule: its globs and the destinations (indices into [`Routes`]'s list).
#[derive(Debug, Clone)]
struct Rule {
    globs: [Glob; 4],
    to: Vec<usize>,
}

/// A pattern of `*` (any run) and `?` (one character); absent: `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    pub fn new(p: Option<&str>) -> Self {
        Self(p.unwrap_or("*").to_owned())
    }

    fn literal(&self) -> bool {
        !self.0.contains(['*', '?'])
    }

    pub fn matches(&self, text: &str) -> bool {
        glob_match(self.0.as_bytes(), text.as_bytes())
    }

    /// Whether some text may match both (conservative: two patterns with
    /// wildcards are taken to overlap).
    fn may_overlap(&self, other: &Glob) -> bool {
        match (self.literal(), other.literal()) {
            (true, true) => self.0 == other.0,
            (true, false) => other.matches(&self.0),
            (false, true) => self.matches(&other.0),
            (false, false) => true,
        }
    }
}

/// Iterative glob matching with backtracking on the last `*`.
fn glob_match(p: &[u8], t: &[u8]) -> bool {
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The routes of a deployment.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    destinations: Vec<Destination>,
    rules: Vec<Rule>,
}

/// What a destination's name may be (it is part of each delivery's key and metrics).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Routes {
    /// No routes: every event is recorded as without them.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn parse(json: &str) -> Result<Self, String> {
        let spec: Spec = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let mut destinations = Vec::with_capacity(spec.destinations.len());
        for (name, d) in spec.destinations {
            if !valid_name(&name) {
                return Err(format!("destination {name:?}: a name is 1-64 characters of a-z, 0-9, '-', '_'"));
            }
            let limits =
                Limits::parse(d.max_per_second, d.max_in_flight).map_err(|e| format!("destination {name}: {e}"))?;
            let destination = match (d.arn, d.url) {
                (Some(arn), None) => {
                    if d.secrets.is_some() || d.allow_private.is_some() || d.client_errors.is_some() {
                        return Err(format!(
                            "destination {name}: secrets, allow_private and client_errors are for HTTPS destinations (url)"
                        ));
                    }
                    let parsed = Arn::parse(&arn).map_err(|e| format!("destination {name}: {e}"))?;
                    let source = match (&d.source, parsed.kind) {
                        (Some(s), Kind::EventBridge) => {
                            if s.is_empty() || s.len() > 256 || s.starts_with("aws.") {
                                return Err(format!("destination {name}: source must be 1-256 characters, not aws.*"));
                            }
                            s.clone()
                        }
                        (Some(_), _) => {
                            return Err(format!("destination {name}: source is for EventBridge buses only"));
                        }
                        (None, _) => DEFAULT_SOURCE.to_owned(),
                    };
                    Destination { name, target: arn, kind: parsed.kind, arn: Some(parsed), https: None, source, limits }
                }
                (None, Some(url)) => {
                    if d.source.is_some() {
                        return Err(format!("destination {name}: source is for EventBridge buses only"));
                    }
                    let https = HttpsTarget::parse(
                        &url,
                        d.secrets.unwrap_or_default(),
                        d.allow_private.unwrap_or(false),
                        d.client_errors.as_ref(),
                    )
                    .map_err(|e| format!("destination {name}: {e}"))?;
                    Destination {
                        target: https_reference(&name),
                        name,
                        kind: Kind::Https,
                        arn: None,
                        https: Some(https),
                        source: DEFAULT_SOURCE.to_owned(),
                        limits,
                    }
                }
                _ => return Err(format!("destination {name}: give an arn (SNS, SQS, EventBridge) or a url (HTTPS)")),
            };
            destinations.push(destination);
        }
        let mut rules = Vec::with_capacity(spec.routes.len());
        for (i, r) in spec.routes.into_iter().enumerate() {
            if r.to.is_empty() {
                return Err(format!("route {i}: `to` names no destination"));
            }
            let mut to = Vec::new();
            for name in &r.to {
                let at = destinations
                    .iter()
                    .position(|d| &d.name == name)
                    .ok_or_else(|| format!("route {i}: no destination named {name:?}"))?;
                if !to.contains(&at) {
                    to.push(at);
                }
            }
            let globs = [
                Glob::new(r.endpoint.as_deref()),
                Glob::new(r.provider.as_deref()),
                Glob::new(r.tenant.as_deref()),
                Glob::new(r.event_type.as_deref()),
            ];
            rules.push(Rule { globs, to });
        }
        let routes = Self { destinations, rules };
        routes.check_fan_out()?;
        Ok(routes)
    }

    /// No event may go to more than [`MAX_DESTINATIONS_PER_EVENT`]: for each
    /// rule, the destinations of every rule that may match an event with it.
    fn check_fan_out(&self) -> Result<(), String> {
        for (i, r) in self.rules.iter().enumerate() {
            let mut all: BTreeSet<usize> = BTreeSet::new();
            for other in &self.rules {
                if r.globs.iter().zip(&other.globs).all(|(a, b)| a.may_overlap(b)) {
                    all.extend(&other.to);
                }
            }
            if all.len() > MAX_DESTINATIONS_PER_EVENT {
                return Err(format!(
                    "route {i}: an event it matches may go to {} destinations (at most {MAX_DESTINATIONS_PER_EVENT})",
                    all.len()
                ));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The destinations an event goes to, each once, by name.
    pub fn matching(&self, endpoint: &str, provider: &str, tenant: &str, event_type: &str) -> Vec<&Destination> {
        let fields = [endpoint, provider, tenant, event_type];
        let mut at: BTreeSet<usize> = BTreeSet::new();
        for r in &self.rules {
            if r.globs.iter().zip(fields).all(|(g, f)| g.matches(f)) {
                at.extend(&r.to);
            }
        }
        at.into_iter().map(|i| &self.destinations[i]).collect()
    }

    pub fn destinations(&self) -> &[Destination] {
        &self.destinations
    }

    /// A destination by name.
    pub fn destination(&self, name: &str) -> Option<&Destination> {
        self.destinations.iter().find(|d| d.name == name)
    }
}

/// The outbox action of a delivery to `destination`: part of its stable
/// idempotency key, one per (event, destination).
pub fn delivery_action(destination: &str) -> String {
    format!("route:{destination}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SQS: &str = "arn:aws:sqs:eu-west-1:123456789012:orders";

    fn routes(rules: &str) -> Result<Routes, String> {
        Routes::parse(&format!(
            r#"{{"destinations": {{
                "orders": {{"arn": "{SQS}"}},
                "ordered": {{"arn": "arn:aws:sqs:eu-west-1:123456789012:orders.fifo"}},
                "bus": {{"arn": "arn:aws:events:eu-west-1:123456789012:event-bus/billing", "source": "acme.billing"}},
                "topic": {{"arn": "arn:aws:sns:eu-west-1:123456789012:billing"}}}},
              "routes": {rules}}}"#
        ))
    }

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (p, t, ok) in [
            ("*", "", true),
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoices.paid", false),
            ("*.paid", "invoice.paid", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b", "xxaxxbxxc", false),
            ("stripe", "stripe", true),
            ("stripe", "stripe2", false),
        ] {
            assert_eq!(Glob::new(Some(p)).matches(t), ok, "{p} ~ {t}");
        }
    }

    #[test]
    fn an_event_goes_to_the_union_of_its_rules_each_destination_once() {
        let r = routes(
            r#"[{"provider": "stripe", "type": "invoice.*", "to": ["orders", "bus"]},
                {"tenant": "acme", "to": ["bus", "topic"]},
                {"endpoint": "github-*", "to": ["ordered"]}]"#,
        )
        .unwrap();
        let names = |e, p, t, ty| r.matching(e, p, t, ty).into_iter().map(|d| d.name.as_str()).collect::<Vec<_>>();
        assert_eq!(names("billing", "stripe", "acme", "invoice.paid"), ["bus", "orders", "topic"]);
        assert_eq!(names("billing", "stripe", "other", "invoice.paid"), ["bus", "orders"]);
        assert_eq!(names("billing", "stripe", "other", "customer.created"), Vec::<&str>::new());
        assert_eq!(names("github-app", "github", "other", "push"), ["ordered"]);
        let bus = r.destination("bus").unwrap();
        assert_eq!(
            (bus.kind, bus.source.as_str(), bus.arn.as_ref().unwrap().name.as_str()),
            (Kind::EventBridge, "acme.billing", "billing")
        );
        assert_eq!(r.destination("ordered").unwrap().kind, Kind::Sqs { fifo: true });
        assert_eq!(r.destination("topic").unwrap().source, DEFAULT_SOURCE);
        assert_eq!(
            r.destination("orders").unwrap().arn.as_ref().unwrap().queue_url(),
            "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
        );
    }

    #[test]
    fn bad_configurations_are_refused_with_what_is_wrong() {
        let cases = [
            (r#"[{"to": ["nowhere"]}]"#, "no destination named \"nowhere\""),
            (r#"[{"to": []}]"#, "names no destination"),
            (r#"[{"to": ["orders"], "colour": "red"}]"#, "unknown field"),
        ];
        for (rules, want) in cases {
            let err = routes(rules).unwrap_err();
            assert!(err.contains(want), "{rules}: {err}");
        }
        for (dest, want) in [
            (r#"{"arn": "arn:aws:lambda:eu-west-1:123456789012:function:f"}"#, "not a destination"),
            (r#"{"arn": "arn:aws:events:eu-west-1:123456789012:rule/r"}"#, "event bus"),
            (r#"{"arn": "arn:aws:sqs:eu-west-1:1234:orders"}"#, "12 digits"),
            (r#"{"arn": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"}"#, "not an ARN"),
            (r#"{"arn": "arn:aws:sns:eu-west-1:123456789012:t", "source": "x"}"#, "EventBridge buses only"),
            (r#"{"arn": "arn:aws:events:eu-west-1:123456789012:event-bus/b", "source": "aws.events"}"#, "not aws.*"),
        ] {
            let err = Routes::parse(&format!(r#"{{"destinations": {{"d": {dest}}}, "routes": []}}"#)).unwrap_err();
            assert!(err.contains(want), "{dest}: {err}");
        }
        let err = Routes::parse(&format!(r#"{{"destinations": {{"Bad Name": {{"arn": "{SQS}"}}}}, "routes": []}}"#));
        assert!(err.unwrap_err().contains("a-z, 0-9"));
    }

    /// `max_per_second` becomes the least time between grants (2 % more,
    /// rounded up, so no one-second window holds more than the rate); both limits are
    /// checked at load, on any kind of destination.
    #[test]
    fn limits_are_a_step_between_grants_and_a_count_in_flight() {
        let one = |d: &str| Routes::parse(&format!(r#"{{"destinations": {{"d": {d}}}, "routes": [{{"to": ["d"]}}]}}"#));
        let limits = |d: &str| one(d).unwrap().destination("d").unwrap().limits;
        assert_eq!(limits(&format!(r#"{{"arn": "{SQS}"}}"#)), Limits::default());
        let l = limits(&format!(r#"{{"arn": "{SQS}", "max_per_second": 5, "max_in_flight": 2}}"#));
        assert_eq!((l.step_ms, l.in_flight, l.any()), (Some(204), Some(2), true));
        // 3 a second: 340 ms apart (3 fit in a second, never 4).
        assert_eq!(limits(&format!(r#"{{"arn": "{SQS}", "max_per_second": 3}}"#)).step_ms, Some(340));
        let https = r#"{"url": "https://hooks.example.com/in", "secrets": ["env:D"], "max_per_second": 0.5}"#;
        assert_eq!(limits(https).step_ms, Some(2040));
        for (d, want) in [
            (format!(r#"{{"arn": "{SQS}", "max_per_second": 0}}"#), "max_per_second must be"),
            (format!(r#"{{"arn": "{SQS}", "max_per_second": 501}}"#), "max_per_second must be"),
            (format!(r#"{{"arn": "{SQS}", "max_in_flight": 0}}"#), "max_in_flight must be"),
            (format!(r#"{{"arn": "{SQS}", "max_in_flight": 201}}"#), "max_in_flight must be"),
        ] {
            let err = one(&d).unwrap_err();
            assert!(err.contains(want) && err.starts_with("destination d:"), "{d}: {err}");
        }
    }

    #[test]
    fn https_destinations_are_https_signed_by_references_and_public_unless_allowed() {
        let one = |d: &str| Routes::parse(&format!(r#"{{"destinations": {{"d": {d}}}, "routes": [{{"to": ["d"]}}]}}"#));
        let ok = one(r#"{"url": "https://hooks.example.com/in?x=1", "secrets": ["ssm:/hl/d", "env:D2"]}"#).unwrap();
        let d = ok.destination("d").unwrap();
        // Its deliveries name it; the URL (its query may carry a token) stays here.
        assert_eq!((d.kind, d.target.as_str()), (Kind::Https, "destination:d"));
        let https = d.https.as_ref().unwrap();
        assert_eq!(https.url.as_str(), "https://hooks.example.com/in?x=1");
        assert!(!format!("{ok:?}").contains("x=1") && !format!("{ok:?}").contains("/in"), "{ok:?}");
        assert_eq!((https.secrets.len(), https.allow_private), (2, false));
        let local = one(r#"{"url": "http://127.0.0.1:8080/hooks", "secrets": ["env:D"], "allow_private": true}"#);
        assert!(local.is_ok(), "{local:?}");
        for (dest, want) in [
            (r#"{"url": "http://hooks.example.com/", "secrets": ["env:D"]}"#, "https://"),
            (r#"{"url": "http://127.0.0.1:8080/", "secrets": ["env:D"]}"#, "allow_private"),
            (r#"{"url": "ftp://hooks.example.com/", "secrets": ["env:D"]}"#, "https://"),
            (r#"{"url": "https://169.254.169.254/latest", "secrets": ["env:D"], "allow_private": true}"#, "metadata"),
            (r#"{"url": "https://10.0.0.7/hooks", "secrets": ["env:D"]}"#, "private address"),
            (r#"{"url": "https://[fe80::1]/hooks", "secrets": ["env:D"]}"#, "link-local"),
            (r#"{"url": "https://user:pw@hooks.example.com/", "secrets": ["env:D"]}"#, "credentials"),
            (r#"{"url": "https://hooks.example.com/"}"#, "1 or 2 secrets"),
            (r#"{"url": "https://hooks.example.com/", "secrets": ["a", "b", "c"]}"#, "1 or 2 secrets"),
            (r#"{"url": "https://hooks.example.com/", "secrets": ["whsec_inline"]}"#, "never inline"),
            (
                r#"{"url": "https://h.example.com/", "arn": "arn:aws:sns:eu-west-1:123456789012:t", "secrets": ["env:D"]}"#,
                "an arn",
            ),
            (r#"{"arn": "arn:aws:sns:eu-west-1:123456789012:t", "secrets": ["env:D"]}"#, "for HTTPS destinations"),
            (r#"{"url": "https://h.example.com/", "secrets": ["env:D"], "source": "x"}"#, "EventBridge buses only"),
            (r#"{"url": "not a url", "secrets": ["env:D"]}"#, "not a URL"),
        ] {
            let err = one(dest).unwrap_err();
            assert!(err.contains(want), "{dest}: {err}");
            assert!(!err.contains("whsec_inline"), "a secret is never repeated: {err}");
        }
        // With allow_private: private addresses, never metadata ones.
        assert!(one(r#"{"url": "https://10.0.0.7/hooks", "secrets": ["env:D"], "allow_private": true}"#).is_ok());
    }

    /// An HTTPS destination's 4xx classes: 401/403/404/410 retried for an
    /// hour and any other 4xx permanent by default; `client_errors` sets a
    /// status's class (`"permanent"`, or the seconds it is retried, at most
    /// a day), checked at load with what is wrong.
    #[test]
    fn client_error_classes_default_to_an_hour_for_brief_refusals_and_are_checked_at_load() {
        let one = |extra: &str| {
            Routes::parse(&format!(
                r#"{{"destinations": {{"d": {{"url": "https://h.example.com/?token=t0ken", "secrets": ["env:D"]{extra}}}}},
                    "routes": [{{"to": ["d"]}}]}}"#
            ))
        };
        let classes = |r: &Routes| r.destination("d").unwrap().https.as_ref().unwrap().client_errors.clone();
        let defaults = classes(&one("").unwrap());
        for status in [401, 403, 404, 410] {
            assert_eq!(defaults.class(status), ClientErrorClass::RetryFor { ms: 3_600_000 }, "{status}");
        }
        for status in [400, 402, 405, 409, 413, 422, 451] {
            assert_eq!(defaults.class(status), ClientErrorClass::Permanent, "{status}");
        }
        let set = classes(&one(r#", "client_errors": {"404": "permanent", "422": 600, "401": 86400}"#).unwrap());
        assert_eq!(set.class(404), ClientErrorClass::Permanent);
        assert_eq!(set.class(422), ClientErrorClass::RetryFor { ms: 600_000 });
        assert_eq!(set.class(401), ClientErrorClass::RetryFor { ms: 86_400_000 });
        assert_eq!(set.class(403), ClientErrorClass::RetryFor { ms: 3_600_000 }, "the other defaults kept");
        for (extra, want) in [
            (r#", "client_errors": {"500": "permanent"}"#, "\"500\" is not a 4xx status"),
            (r#", "client_errors": {"4xx": 60}"#, "\"4xx\" is not a 4xx status"),
            (r#", "client_errors": {"429": "permanent"}"#, "429 is always retried"),
            (r#", "client_errors": {"408": 60}"#, "408 is always retried"),
            (r#", "client_errors": {"401": "retry"}"#, "client_errors.401: \"permanent\" or the seconds"),
            (r#", "client_errors": {"401": 0}"#, "(1-86400)"),
            (r#", "client_errors": {"401": 86401}"#, "(1-86400)"),
            (r#", "client_errors": {"401": 1.5}"#, "not 1.5"),
        ] {
            let err = one(extra).unwrap_err();
            assert!(err.contains(want) && err.starts_with("destination d: "), "{extra}: {err}");
            assert!(!err.contains("t0ken"), "{err}");
        }
        let err = Routes::parse(
            r#"{"destinations": {"q": {"arn": "arn:aws:sqs:eu-west-1:123456789012:q", "client_errors": {}}}, "routes": []}"#,
        )
        .unwrap_err();
        assert!(err.contains("for HTTPS destinations"), "{err}");
        let err = Routes::parse(
            r#"{"destinations": {"d": {"url": "http://h.example.com/in?token=t0ken", "secrets": ["env:D"]}}, "routes": []}"#,
        )
        .unwrap_err();
        assert!(err.contains("h.example.com/in") && !err.contains("t0ken"), "shown without its query: {err}");
    }

    /// What each kind of destination counts against its limit besides the body.
    #[test]
    fn what_a_destination_counts_is_its_body_and_its_attributes_or_entry_fields() {
        let key = "k".repeat(64);
        let sqs = counted_bytes(SQS, 1000, &key, None, None);
        assert_eq!(sqs, 1000 + "idempotency-key".len() + "String".len() + 64);
        assert_eq!(counted_bytes("arn:aws:sns:eu-west-1:123456789012:t", 1000, &key, None, None), sqs);
        let bus = "arn:aws:events:eu-west-1:123456789012:event-bus/b";
        assert_eq!(counted_bytes(bus, 1000, &key, Some("acme.billing"), Some("invoice.paid")), 1000 + 14 + 12 + 12);
        assert_eq!(counted_bytes(bus, 1000, &key, None, None), 1000 + 14 + "hookledger".len() + "event".len());
        assert_eq!(counted_bytes("destination:d", 1000, &key, None, None), 1000);
        assert_eq!(
            counted_bytes("https://h.example.com/in", 1000, &key, None, None),
            1000,
            "an earlier release's item"
        );
    }

    #[test]
    fn no_event_may_go_to_more_than_twenty_destinations() {
        let dest = |n: usize| format!(r#""d{n}": {{"arn": "arn:aws:sqs:eu-west-1:123456789012:q{n}"}}"#);
        let all: Vec<String> = (0..21).map(dest).collect();
        let names = |r: std::ops::Range<usize>| r.map(|n| format!("\"d{n}\"")).collect::<Vec<_>>().join(",");
        let config = |rules: String| format!(r#"{{"destinations": {{{}}}, "routes": {rules}}}"#, all.join(","));
        // Twenty on one rule, one more on a rule that may match the same events: refused.
        let err = Routes::parse(&config(format!(
            r#"[{{"provider": "stripe", "to": [{}]}}, {{"type": "invoice.*", "to": ["d20"]}}]"#,
            names(0..20)
        )))
        .unwrap_err();
        assert!(err.contains("21 destinations"), "{err}");
        // The same split over two providers that never meet: accepted.
        let ok = Routes::parse(&config(format!(
            r#"[{{"provider": "stripe", "to": [{}]}}, {{"provider": "github", "to": [{}]}}]"#,
            names(0..20),
            names(1..21)
        )));
        assert!(ok.is_ok(), "{ok:?}");
    }
}
