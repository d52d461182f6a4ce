//! Typed configuration, read once at cold start and validated with clear errors.
//!
//! Environment variables (see docs/configuration.md; `wiring::Settings` reads them all once):
//! `HOOKLEDGER_TABLE`, `HOOKLEDGER_QUEUE_URL`, `HOOKLEDGER_ENDPOINTS` (JSON),
//! `HOOKLEDGER_MAX_BODY_BYTES`, `HOOKLEDGER_RETENTION_DAYS`, `HOOKLEDGER_INDEX_SHARDS`,
//! `HOOKLEDGER_PAYLOAD_BUCKET`.
//! Secrets are never inline: each is a reference, `env:NAME` or `ssm:/path`
//! (an SSM SecureString, or a Secrets Manager secret through
//! `ssm:/aws/reference/secretsmanager/<name>`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backoff::Backoff;
use crate::policy::{DEFAULT_INDEX_SHARDS, DEFAULT_RETENTION_DAYS};
use crate::secret::Secret;
use crate::verify::provider::{BuildContext, SecretStore, Verifier};
use crate::verify::sns::CertificateCache;

pub const DEFAULT_MAX_BODY_BYTES: usize = 256 * 1024;
/// Without a payload bucket, a payload lives in a DynamoDB item (at most
/// 400 KB; room for the key and attributes).
pub const MAX_MAX_BODY_BYTES: usize = 380 * 1024;
/// With a payload bucket (`HOOKLEDGER_PAYLOAD_BUCKET`): Lambda's request
/// limit, the default and the most a body may be.
pub const MAX_BODY_BYTES_WITH_BUCKET: usize = 6 * 1024 * 1024;

/// Default time bounds of the processor (see `processor` for what they bound).
pub const DEFAULT_GAP_BOUND_MS: i64 = 3_600_000;
/// How often re-checked projection state is compared with the provider, by default.
pub const DEFAULT_DRIFT_INTERVAL_MS: i64 = crate::projection::recheck::DEFAULT_INTERVAL_MS;
pub const DEFAULT_TRANSIENT_BOUND_MS: i64 = 6 * 3_600_000;

/// How a failed publish is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchPolicy {
    /// Delay before the next attempt after attempt `n` failed (the sweeper
    /// then takes the item once it is also past the reconciler's grace).
    pub backoff: Backoff,
    /// Attempts (claims) after which a projection's notification goes DEAD instead.
    pub max_attempts: u32,
    /// How long a route's delivery is retried (from its commit) before it
    /// goes DEAD: long enough that an outage of its destination for hours
    /// ends nothing DEAD.
    pub delivery_bound_ms: i64,
}

/// How long a route's delivery is retried by default: 24 hours.
pub const DEFAULT_DELIVERY_BOUND_MS: i64 = 24 * 3_600_000;

impl Default for DispatchPolicy {
    /// 10 attempts over about 3 hours: 30 s, then 1, 2, 4, 8, 16, 32, 60, 60 min
    /// between them (each jittered down to half), plus the sweeper's grace; a
    /// route's delivery the same way, then hourly, for 24 hours.
    fn default() -> Self {
        Self {
            backoff: Backoff { base_ms: 30_000, max_ms: 3_600_000 },
            max_attempts: 10,
            delivery_bound_ms: DEFAULT_DELIVERY_BOUND_MS,
        }
    }
}

/// The processor's settings (read from the environment by `processor_settings_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessorSettings {
    /// How long a lease lasts; keep it shorter than the queue visibility timeout.
    pub lease_ms: i64,
    /// Business failures (a projection's retryable error) before a record is
    /// dead-lettered (`attempts_exhausted`). Infrastructure faults, gaps and
    /// crashed workers do not count.
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub index_shards: u32,
    /// How long an event may wait for a missing predecessor before it is
    /// PARKED (`gap`); it is revived if the predecessor commits later.
    pub gap_bound_ms: i64,
    /// How long infrastructure faults may keep an event from an outcome
    /// before it is DEAD (`transient_exhausted`).
    pub transient_bound_ms: i64,
    /// How long the history and waiter items it writes are kept.
    pub retention_days: u32,
}

impl Default for ProcessorSettings {
    fn default() -> Self {
        Self {
            lease_ms: 30_000,
            max_attempts: 5,
            backoff: Backoff { base_ms: 2_000, max_ms: 300_000 },
            index_shards: DEFAULT_INDEX_SHARDS,
            gap_bound_ms: DEFAULT_GAP_BOUND_MS,
            transient_bound_ms: DEFAULT_TRANSIENT_BOUND_MS,
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }
}

/// The reconciler's settings (read by the reconciler function from its environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcilerSettings {
    /// Items acted on per run, at most.
    pub max_items: usize,
    /// When a re-driven record is looked at again if still not done (also
    /// when a failed drift check is retried).
    pub redrive_backoff_ms: i64,
    /// How old re-checked state's last provider check must be to check it again.
    pub drift_interval_ms: i64,
    /// Outbox items younger than this are left to their processor.
    pub outbox_grace_ms: i64,
    pub retention_days: u32,
    /// How far ahead of now an open record can be due (the longest it can be
    /// scheduled ahead: the larger of the re-drive backoff, the processor's
    /// retry-backoff cap and its lease): the records read for the oldest
    /// open record's age reach this far.
    pub lookahead_ms: i64,
}

impl ReconcilerSettings {
    /// The look-ahead for a processor with `processor`'s lease and retry cap.
    pub fn with_lookahead_for(self, processor: &ProcessorSettings) -> Self {
        let lookahead_ms = self.redrive_backoff_ms.max(processor.backoff.max_ms).max(processor.lease_ms);
        Self { lookahead_ms, ..self }
    }
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        Self {
            max_items: 500,
            redrive_backoff_ms: 300_000,
            drift_interval_ms: DEFAULT_DRIFT_INTERVAL_MS,
            outbox_grace_ms: 60_000,
            retention_days: DEFAULT_RETENTION_DAYS,
            lookahead_ms: 300_000,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{name} is invalid: {reason}")]
    Invalid { name: String, reason: String },
    #[error("endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("endpoint {endpoint:?}: secret {reference:?} could not be resolved: {reason}")]
    Secret { endpoint: String, reference: String, reason: String },
}

pub use crate::verify::provider::{EndpointSpec, HmacSpec, ProviderKind};

/// Resolves secret references (`env:`, `ssm:`). The AWS implementation lives
/// in `adapters::secrets`; tests use a map.
pub trait SecretResolver: Send + Sync {
    fn resolve<'a>(&'a self, reference: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>>;
}

/// Resolves `env:` references alone (any other is an error): the resolver of
/// a function whose configuration has no `ssm:` reference, so that it creates
/// no SSM client (see [`uses_ssm`]).
pub struct EnvSecrets;

impl SecretResolver for EnvSecrets {
    fn resolve<'a>(&'a self, reference: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
        Box::pin(async move {
            match reference.strip_prefix("env:") {
                Some(name) => {
                    std::env::var(name).map(Secret::new).map_err(|_| format!("environment variable {name} is not set"))
                }
                None => Err("only env: references are resolved here".to_owned()),
            }
        })
    }
}

/// Whether any endpoint's secret is an `ssm:` reference.
pub fn uses_ssm(specs: &BTreeMap<String, EndpointSpec>) -> bool {
    specs.values().flat_map(|s| &s.secrets).any(|r| !r.starts_with("env:"))
}

/// A configured endpoint, its verifier ready to use.
pub struct Endpoint {
    pub name: String,
    pub tenant: String,
    pub provider: ProviderKind,
    pub verifier: Box<dyn Verifier>,
    /// What is kept of its verified payloads.
    pub payload: crate::redaction::PayloadPolicy,
    /// Whether its payloads are sealed under their events' own keys.
    pub erasable: bool,
}

/// Runtime settings other than endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub table_name: String,
    pub queue_url: String,
    pub max_body_bytes: usize,
    pub retention_days: u32,
    pub index_shards: u32,
    /// Where payloads too large for a DynamoDB item go (S3).
    pub payload_bucket: Option<String>,
}

/// An integer setting: `default` when unset, else it must parse and lie in `min..=max`.
pub fn env_number(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ConfigError> {
    match get(name) {
        None => Ok(default),
        Some(raw) => match raw.trim().parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(ConfigError::Invalid {
                name: name.to_owned(),
                reason: format!("expected an integer in {min}..={max}"),
            }),
        },
    }
}

/// The intake's limits: what [`Settings`] holds besides the table and queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntakeLimits {
    pub max_body_bytes: usize,
    pub retention_days: u32,
    pub index_shards: u32,
    pub payload_bucket: Option<String>,
}

/// `HOOKLEDGER_MAX_BODY_BYTES` (its default and bound depend on
/// `HOOKLEDGER_PAYLOAD_BUCKET`), `HOOKLEDGER_RETENTION_DAYS`, `HOOKLEDGER_INDEX_SHARDS`.
pub fn intake_limits_from(get: &impl Fn(&str) -> Option<String>) -> Result<IntakeLimits, ConfigError> {
    let number = |name: &'static str, default: i64, min: i64, max: i64| env_number(get, name, default, min, max);
    let payload_bucket = get("HOOKLEDGER_PAYLOAD_BUCKET").filter(|v| !v.trim().is_empty());
    let most = if payload_bucket.is_some() { MAX_BODY_BYTES_WITH_BUCKET } else { MAX_MAX_BODY_BYTES };
    let default = if payload_bucket.is_some() { MAX_BODY_BYTES_WITH_BUCKET } else { DEFAULT_MAX_BODY_BYTES };
    Ok(IntakeLimits {
        max_body_bytes: number("HOOKLEDGER_MAX_BODY_BYTES", default as i64, 1024, most as i64)? as usize,
        retention_days: retention_days(get)?,
        index_shards: number("HOOKLEDGER_INDEX_SHARDS", DEFAULT_INDEX_SHARDS.into(), 1, 256)? as u32,
        payload_bucket,
    })
}

/// Reads settings from a variable lookup (the process environment in production).
pub fn settings_from(get: impl Fn(&str) -> Option<String>) -> Result<Settings, ConfigError> {
    let required = |name: &'static str| get(name).filter(|v| !v.trim().is_empty()).ok_or(ConfigError::Missing(name));
    let limits = intake_limits_from(&get)?;
    Ok(Settings {
        table_name: required("HOOKLEDGER_TABLE")?,
        queue_url: required("HOOKLEDGER_QUEUE_URL")?,
        max_body_bytes: limits.max_body_bytes,
        retention_days: limits.retention_days,
        index_shards: limits.index_shards,
        payload_bucket: limits.payload_bucket,
    })
}

/// Processor settings (`HOOKLEDGER_LEASE_SECS`, `HOOKLEDGER_MAX_ATTEMPTS`,
/// `HOOKLEDGER_BACKOFF_BASE_MS`, `HOOKLEDGER_BACKOFF_MAX_MS`, `HOOKLEDGER_INDEX_SHARDS`,
/// `HOOKLEDGER_GAP_BOUND_SECS`, `HOOKLEDGER_TRANSIENT_BOUND_SECS`).
pub fn processor_settings_from(get: impl Fn(&str) -> Option<String>) -> Result<ProcessorSettings, ConfigError> {
    let number = |name: &'static str, default: i64, min: i64, max: i64| env_number(&get, name, default, min, max);
    let base_ms = number("HOOKLEDGER_BACKOFF_BASE_MS", 2_000, 10, 3_600_000)?;
    let max_ms = number("HOOKLEDGER_BACKOFF_MAX_MS", 300_000, 10, 43_200_000)?;
    if max_ms < base_ms {
        return Err(ConfigError::Invalid {
            name: "HOOKLEDGER_BACKOFF_MAX_MS".into(),
            reason: "must be >= HOOKLEDGER_BACKOFF_BASE_MS".into(),
        });
    }
    // Both bounds stay well inside the identity retention (at least 4 days).
    let week = 7 * 86_400;
    let gap_secs = number("HOOKLEDGER_GAP_BOUND_SECS", DEFAULT_GAP_BOUND_MS / 1000, 1, week)?;
    let transient_secs = number("HOOKLEDGER_TRANSIENT_BOUND_SECS", DEFAULT_TRANSIENT_BOUND_MS / 1000, 60, week)?;
    if gap_secs >= transient_secs {
        // A record waiting on a gap would otherwise be dead-lettered as
        // transient first: its last look lands on the gap bound, where the
        // transient bound (checked first) must not have passed yet.
        return Err(ConfigError::Invalid {
            name: "HOOKLEDGER_GAP_BOUND_SECS".into(),
            reason: "must be < HOOKLEDGER_TRANSIENT_BOUND_SECS".into(),
        });
    }
    Ok(ProcessorSettings {
        lease_ms: number("HOOKLEDGER_LEASE_SECS", 30, 1, 900)? * 1000,
        max_attempts: number("HOOKLEDGER_MAX_ATTEMPTS", 5, 1, 100)? as u32,
        backoff: Backoff { base_ms, max_ms },
        index_shards: number("HOOKLEDGER_INDEX_SHARDS", DEFAULT_INDEX_SHARDS.into(), 1, 256)? as u32,
        gap_bound_ms: gap_secs * 1000,
        transient_bound_ms: transient_secs * 1000,
        retention_days: retention_days(&get)?,
    })
}

/// `HOOKLEDGER_RETENTION_DAYS`: how long identities, history and every other
/// item with a TTL are kept (4 days at least: longer than every time bound).
pub fn retention_days(get: &impl Fn(&str) -> Option<String>) -> Result<u32, ConfigError> {
    Ok(env_number(get, "HOOKLEDGER_RETENTION_DAYS", DEFAULT_RETENTION_DAYS.into(), 4, 3650)? as u32)
}

/// `HOOKLEDGER_AUDIT_RETENTION_DAYS`: how long operator audit entries are
/// kept (the template's `AuditRetentionDays`); at least the records'
/// retention, so an entry never expires before the record it names.
pub fn audit_retention_days(get: &impl Fn(&str) -> Option<String>) -> Result<u32, ConfigError> {
    let records = retention_days(get)?;
    let days = env_number(
        get,
        "HOOKLEDGER_AUDIT_RETENTION_DAYS",
        i64::from(crate::audit::DEFAULT_AUDIT_RETENTION_DAYS.max(records)),
        1,
        3650,
    )? as u32;
    if days < records {
        return Err(ConfigError::Invalid {
            name: "HOOKLEDGER_AUDIT_RETENTION_DAYS".into(),
            reason: format!(
                "{days} days is shorter than the records' retention (HOOKLEDGER_RETENTION_DAYS = {records}): an entry \
                 would expire before the record it names"
            ),
        });
    }
    Ok(days)
}

/// Reconciler settings (`HOOKLEDGER_RECONCILE_MAX_ITEMS`, `HOOKLEDGER_REDRIVE_BACKOFF_SECS`,
/// `HOOKLEDGER_DRIFT_INTERVAL_SECS`, `HOOKLEDGER_OUTBOX_GRACE_SECS`, `HOOKLEDGER_RETENTION_DAYS`),
/// with the look-ahead of the processor these variables configure.
pub fn reconciler_settings_from(get: impl Fn(&str) -> Option<String>) -> Result<ReconcilerSettings, ConfigError> {
    let number = |name: &'static str, default: i64, min: i64, max: i64| env_number(&get, name, default, min, max);
    let d = ReconcilerSettings::default();
    Ok(ReconcilerSettings {
        max_items: number("HOOKLEDGER_RECONCILE_MAX_ITEMS", d.max_items as i64, 1, 100_000)? as usize,
        redrive_backoff_ms: number("HOOKLEDGER_REDRIVE_BACKOFF_SECS", d.redrive_backoff_ms / 1000, 1, 86_400)? * 1000,
        drift_interval_ms: number("HOOKLEDGER_DRIFT_INTERVAL_SECS", d.drift_interval_ms / 1000, 0, 30 * 86_400)? * 1000,
        outbox_grace_ms: number("HOOKLEDGER_OUTBOX_GRACE_SECS", d.outbox_grace_ms / 1000, 1, 3600)? * 1000,
        retention_days: retention_days(&get)?,
        lookahead_ms: 0,
    }
    .with_lookahead_for(&processor_settings_from(&get)?))
}

/// Parses the endpoints JSON (`{"name": {...}, ...}`) without resolving secrets.
pub fn parse_endpoints(json: &str) -> Result<BTreeMap<String, EndpointSpec>, ConfigError> {
    let specs: BTreeMap<String, EndpointSpec> = serde_json::from_str(json)
        .map_err(|e| ConfigError::Invalid { name: "HOOKLEDGER_ENDPOINTS".into(), reason: e.to_string() })?;
    if specs.is_empty() {
        return Err(ConfigError::Invalid {
            name: "HOOKLEDGER_ENDPOINTS".into(),
            reason: "no endpoints configured".into(),
        });
    }
    for (name, spec) in &specs {
        validate_spec(name, spec).map_err(|reason| ConfigError::Endpoint { endpoint: name.clone(), reason })?;
    }
    Ok(specs)
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

/// What a tenant may be: also a valid SQS `MessageGroupId` (at most 128
/// characters of punctuation and alphanumerics).
pub const TENANT_RULE: &str = "tenant must be 1-128 characters of A-Z, a-z, 0-9, '-', '_', '.', ':'";

pub fn valid_tenant(t: &str) -> bool {
    (1..=128).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

fn validate_spec(name: &str, spec: &EndpointSpec) -> Result<(), String> {
    if !valid_name(name) {
        return Err("name must be 1-64 characters of a-z, 0-9, '-' or '_' starting with a letter or digit".into());
    }
    if let Some(t) = &spec.tenant {
        if !valid_tenant(t) {
            return Err(TENANT_RULE.into());
        }
    }
    // A notification's later generations are records of their own, claimed
    // with the first delivery's bytes: sealed under the first one's key,
    // they would not open. Such providers cannot be erasable yet.
    if spec.erasable && spec.provider.repeats() {
        return Err(format!(
            "erasable is not available for {} yet: its notifications repeat as later generations of one identity",
            spec.provider.as_str()
        ));
    }
    if let Some(tol) = spec.tolerance_secs {
        if !(1..=86_400).contains(&tol) {
            return Err("tolerance_secs must be within 1..=86400".into());
        }
    }
    for r in &spec.secrets {
        if !(r.starts_with("env:") || r.starts_with("ssm:")) {
            return Err("secrets must be references (env:NAME or ssm:/path), never inline values".into());
        }
    }
    match (&spec.verify_token, spec.provider.takes_verify_token()) {
        (Some(r), true) if !(r.starts_with("env:") || r.starts_with("ssm:")) => {
            return Err("verify_token must be a reference (env:NAME or ssm:/path), never an inline value".into());
        }
        (Some(_), false) => {
            return Err(format!(
                "verify_token is for providers that check the endpoint with a GET, not {}",
                spec.provider
            ));
        }
        (None, true) => {
            return Err(format!("{} endpoints need a verify_token (the value given to the provider)", spec.provider));
        }
        _ => {}
    }
    spec.payload.validate()?;
    let needs_secrets = spec.provider.takes_secrets();
    if needs_secrets && spec.secrets.is_empty() && !spec.provider.learns_secret() {
        return Err(format!("provider {} needs at least one secret", spec.provider));
    }
    if !needs_secrets && !spec.secrets.is_empty() {
        return Err(format!("{} endpoints are not verified with shared secrets and take no secrets", spec.provider));
    }
    spec.provider.validate(spec)
}

/// Resolves secrets and builds every endpoint's verifier; `learned` keeps
/// the secrets providers hand over at a handshake (Asana), for the
/// endpoints of such providers. Every endpoint must be built: the first
/// failure is the error (tools and tests; the intake uses
/// [`EndpointBuilder::build_all`], which keeps the others working).
pub async fn build_endpoints(
    specs: BTreeMap<String, EndpointSpec>,
    secrets: &dyn SecretResolver,
    certificates: Arc<CertificateCache>,
    learned: Option<Arc<dyn SecretStore>>,
) -> Result<BTreeMap<String, Endpoint>, ConfigError> {
    let built = futures::future::join_all(
        specs.iter().map(|(name, spec)| build_endpoint(name, spec, secrets, &certificates, learned.as_ref())),
    )
    .await;
    let mut out = BTreeMap::new();
    for endpoint in built {
        let endpoint = endpoint?;
        out.insert(endpoint.name.clone(), endpoint);
    }
    Ok(out)
}

/// One endpoint: its secret references resolved concurrently, then its verifier.
pub async fn build_endpoint(
    name: &str,
    spec: &EndpointSpec,
    secrets: &dyn SecretResolver,
    certificates: &Arc<CertificateCache>,
    learned: Option<&Arc<dyn SecretStore>>,
) -> Result<Endpoint, ConfigError> {
    let secret_error = |reference: &str, reason: String| ConfigError::Secret {
        endpoint: name.to_owned(),
        reference: reference.to_owned(),
        reason,
    };
    let (resolved, verify_token) =
        futures::future::join(futures::future::join_all(spec.secrets.iter().map(|r| secrets.resolve(r))), async {
            match &spec.verify_token {
                Some(reference) => Some(secrets.resolve(reference).await),
                None => None,
            }
        })
        .await;
    let mut keys = Vec::with_capacity(resolved.len());
    for (reference, secret) in spec.secrets.iter().zip(resolved) {
        let secret = secret.map_err(|reason| secret_error(reference, reason))?;
        if secret.is_empty() {
            return Err(secret_error(reference, "empty".into()));
        }
        keys.push(secret);
    }
    let verify_token = match (verify_token, &spec.verify_token) {
        (Some(token), Some(reference)) => Some(token.map_err(|reason| secret_error(reference, reason))?),
        _ => None,
    };
    let learned = match (learned, spec.provider.learns_secret()) {
        (Some(store), true) => Some((store.clone(), name.to_owned())),
        _ => None,
    };
    let cx = BuildContext { certificates: certificates.clone(), verify_token, learned };
    let verifier = spec
        .provider
        .verifier(spec, keys, &cx)
        .map_err(|reason| ConfigError::Endpoint { endpoint: name.to_owned(), reason })?;
    let tenant = spec.tenant.clone().unwrap_or_else(|| name.to_owned());
    Ok(Endpoint {
        name: name.to_owned(),
        tenant,
        provider: spec.provider,
        verifier,
        payload: spec.payload.clone(),
        erasable: spec.erasable,
    })
}

/// What builds the intake's endpoints, kept by the intake so that an
/// endpoint whose secret could not be resolved at its cold start is built
/// again later ([`crate::intake`]'s waiting endpoints).
#[derive(Clone)]
pub struct EndpointBuilder {
    secrets: Arc<dyn SecretResolver>,
    certificates: Arc<CertificateCache>,
    learned: Option<Arc<dyn SecretStore>>,
}

/// Every endpoint built at a cold start, and those whose secret could not
/// be resolved then (with why).
pub struct Built {
    pub ready: BTreeMap<String, Endpoint>,
    pub waiting: BTreeMap<String, (EndpointSpec, ConfigError)>,
}

impl EndpointBuilder {
    pub fn new(
        secrets: Arc<dyn SecretResolver>,
        certificates: Arc<CertificateCache>,
        learned: Option<Arc<dyn SecretStore>>,
    ) -> Self {
        Self { secrets, certificates, learned }
    }

    pub async fn build(&self, name: &str, spec: &EndpointSpec) -> Result<Endpoint, ConfigError> {
        build_endpoint(name, spec, self.secrets.as_ref(), &self.certificates, self.learned.as_ref()).await
    }

    /// Every endpoint at once (their secrets resolved concurrently). One
    /// whose secret cannot be resolved (unreachable, missing, empty) waits
    /// apart and the others work; a verifier the configuration cannot build
    /// is still an error (no retry helps it).
    pub async fn build_all(&self, specs: BTreeMap<String, EndpointSpec>) -> Result<Built, ConfigError> {
        let built = futures::future::join_all(specs.iter().map(|(name, spec)| self.build(name, spec))).await;
        let mut out = Built { ready: BTreeMap::new(), waiting: BTreeMap::new() };
        for ((name, spec), endpoint) in specs.into_iter().zip(built) {
            match endpoint {
                Ok(endpoint) => {
                    out.ready.insert(name, endpoint);
                }
                Err(e @ ConfigError::Secret { .. }) => {
                    out.waiting.insert(name, (spec, e));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::sns::{FetchError, HttpsGet};
    use std::collections::HashMap;

    struct MapSecrets(HashMap<&'static str, &'static str>);

    impl SecretResolver for MapSecrets {
        fn resolve<'a>(
            &'a self,
            reference: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
            Box::pin(
                async move { self.0.get(reference).map(|s| Secret::new(*s)).ok_or_else(|| "not found".to_owned()) },
            )
        }
    }

    struct NoFetch;
    impl HttpsGet for NoFetch {
        fn get<'a>(
            &'a self,
            _: &'a url::Url,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
            Box::pin(async { Err(FetchError::Failed("offline".into())) })
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn settings_have_defaults_and_bounds() {
        let s = settings_from(env(&[("HOOKLEDGER_TABLE", "t"), ("HOOKLEDGER_QUEUE_URL", "q")])).unwrap();
        assert_eq!((s.max_body_bytes, s.retention_days, s.index_shards), (256 * 1024, 30, DEFAULT_INDEX_SHARDS));
        assert_eq!(settings_from(env(&[("HOOKLEDGER_QUEUE_URL", "q")])), Err(ConfigError::Missing("HOOKLEDGER_TABLE")));
        let too_big = settings_from(env(&[
            ("HOOKLEDGER_TABLE", "t"),
            ("HOOKLEDGER_QUEUE_URL", "q"),
            ("HOOKLEDGER_MAX_BODY_BYTES", "999999"),
        ]));
        assert!(matches!(too_big, Err(ConfigError::Invalid { .. })));
        let short = settings_from(env(&[
            ("HOOKLEDGER_TABLE", "t"),
            ("HOOKLEDGER_QUEUE_URL", "q"),
            ("HOOKLEDGER_RETENTION_DAYS", "1"),
        ]));
        assert!(short.unwrap_err().to_string().contains("HOOKLEDGER_RETENTION_DAYS"));
    }

    #[test]
    fn processor_time_bounds_have_defaults_and_are_checked() {
        let p = processor_settings_from(env(&[])).unwrap();
        assert_eq!(p, ProcessorSettings::default());
        assert_eq!((p.gap_bound_ms, p.transient_bound_ms), (3_600_000, 21_600_000));
        let set = processor_settings_from(env(&[
            ("HOOKLEDGER_GAP_BOUND_SECS", "600"),
            ("HOOKLEDGER_TRANSIENT_BOUND_SECS", "7200"),
        ]))
        .unwrap();
        assert_eq!((set.gap_bound_ms, set.transient_bound_ms), (600_000, 7_200_000));
        let inverted = processor_settings_from(env(&[
            ("HOOKLEDGER_GAP_BOUND_SECS", "7200"),
            ("HOOKLEDGER_TRANSIENT_BOUND_SECS", "600"),
        ]));
        assert!(inverted.unwrap_err().to_string().contains("HOOKLEDGER_TRANSIENT_BOUND_SECS"));
        let equal = processor_settings_from(env(&[
            ("HOOKLEDGER_GAP_BOUND_SECS", "3600"),
            ("HOOKLEDGER_TRANSIENT_BOUND_SECS", "3600"),
        ]));
        assert!(equal.unwrap_err().to_string().contains("must be <"), "equal bounds dead-letter a gap waiter");
        let zero = processor_settings_from(env(&[("HOOKLEDGER_TRANSIENT_BOUND_SECS", "0")]));
        assert!(zero.unwrap_err().to_string().contains("HOOKLEDGER_TRANSIENT_BOUND_SECS"));
    }

    /// Resolves each reference only once `n` resolutions are under way at
    /// the same time: a cold start that resolves one secret after another
    /// never gets past the first.
    struct AllAtOnce(tokio::sync::Barrier);

    impl SecretResolver for AllAtOnce {
        fn resolve<'a>(
            &'a self,
            reference: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
            Box::pin(async move {
                self.0.wait().await;
                match reference {
                    "ssm:/hl/gone" => Err("ParameterNotFound".into()),
                    _ => Ok(Secret::new("s")),
                }
            })
        }
    }

    #[test]
    fn secrets_are_resolved_at_once_and_one_that_cannot_be_waits_apart() {
        let specs = parse_endpoints(
            r#"{"a": {"provider": "github", "secrets": ["ssm:/hl/a", "ssm:/hl/a2"]},
                "b": {"provider": "github", "secrets": ["ssm:/hl/b"]},
                "gone": {"provider": "github", "secrets": ["ssm:/hl/gone"]}}"#,
        )
        .unwrap();
        let builder = EndpointBuilder::new(
            Arc::new(AllAtOnce(tokio::sync::Barrier::new(4))),
            Arc::new(CertificateCache::new(Arc::new(NoFetch))),
            None,
        );
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let built = rt
            .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(5), builder.build_all(specs)).await })
            .expect("the four references are resolved at the same time")
            .expect("one missing secret does not fail the others");
        assert_eq!(built.ready.keys().collect::<Vec<_>>(), ["a", "b"]);
        let (_, why) = &built.waiting["gone"];
        assert!(why.to_string().contains("ParameterNotFound") && !why.to_string().contains("\"s\""), "{why}");
    }

    const ALL: &str = r#"{
        "stripe-eu": {"provider": "stripe", "tenant": "acme", "secrets": ["env:A", "env:B"]},
        "gh": {"provider": "github", "secrets": ["env:A"]},
        "svix": {"provider": "standard_webhooks", "secrets": ["env:W"], "tolerance_secs": 600},
        "ses": {"provider": "sns", "topic_arns": ["arn:aws:sns:eu-west-1:123456789012:ses"]},
        "quiltt": {"provider": "quiltt", "secrets": ["env:A"]},
        "discord": {"provider": "discord", "secrets": ["env:D"]},
        "graph": {"provider": "microsoft_graph", "secrets": ["env:A"]},
        "asana": {"provider": "asana", "secrets": ["env:A"]},
        "cashfree": {"provider": "hmac", "secrets": ["env:A"], "hmac": {
            "signature_header": "x-webhook-signature", "encoding": "base64",
            "timestamp_header": "x-webhook-timestamp", "signed_content": "{timestamp}{body}",
            "id": {"json_pointer": "/data/order/order_id"}, "type": {"json_pointer": "/type"}}}
    }"#;

    #[test]
    fn every_provider_kind_builds() {
        // The presets, each as its provider needs it.
        let mut all: serde_json::Map<String, serde_json::Value> = serde_json::from_str(ALL).unwrap();
        for p in crate::verify::presets::PRESETS {
            let mut spec = serde_json::json!({"provider": p.name, "secrets": ["env:A"]});
            if p.public_url {
                spec["public_url"] = format!("https://hooks.example.com/webhooks/{}", p.name).into();
            }
            if crate::verify::provider::Provider::takes_verify_token(p) {
                spec["verify_token"] = "env:B".into();
            }
            all.insert(format!("preset-{}", p.name.replace('_', "-")), spec);
        }
        for a in crate::verify::presets::ALIASES {
            all.insert(format!("alias-{}", a.name), serde_json::json!({"provider": a.name, "secrets": ["env:W"]}));
        }
        let specs = parse_endpoints(&serde_json::Value::Object(all).to_string()).unwrap();
        let secrets = MapSecrets(HashMap::from([
            ("env:A", "a"),
            ("env:B", "b"),
            ("env:W", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("env:D", "ea4a6c63e29c520abef5507b132ec5f9954776aebebe7b92421eea691446d22c"),
        ]));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let built = rt
            .block_on(build_endpoints(specs, &secrets, Arc::new(CertificateCache::new(Arc::new(NoFetch))), None))
            .unwrap();
        assert_eq!(built.len(), 9 + crate::verify::presets::PRESETS.len() + crate::verify::presets::ALIASES.len());
        assert_eq!(built["stripe-eu"].tenant, "acme");
        assert_eq!(built["quiltt"].provider, ProviderKind::QUILTT);
        assert_eq!(built["gh"].tenant, "gh");
        assert_eq!(built["ses"].provider, ProviderKind::SNS);
        // Every registered provider is configured in ALL.
        let configured: Vec<&str> = built.values().map(|e| e.provider.as_str()).collect();
        for p in crate::verify::registry::providers() {
            assert!(configured.contains(&p.name()), "{} is not in ALL", p.name());
        }
    }

    #[test]
    fn env_only_configurations_need_no_ssm_client() {
        let env_only = parse_endpoints(
            r#"{"gh": {"provider": "github", "secrets": ["env:A", "env:B"]},
            "ses": {"provider": "sns", "topic_arns": ["arn:aws:sns:eu-west-1:123456789012:ses"]}}"#,
        )
        .unwrap();
        assert!(!uses_ssm(&env_only));
        let mixed = parse_endpoints(r#"{"gh": {"provider": "github", "secrets": ["env:A", "ssm:/hl/gh"]}}"#).unwrap();
        assert!(uses_ssm(&mixed));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let path = rt.block_on(EnvSecrets.resolve("env:PATH")).unwrap();
        assert!(!path.is_empty());
        assert!(rt.block_on(EnvSecrets.resolve("env:HOOKLEDGER_TEST_SURELY_UNSET_VAR")).is_err());
        assert!(rt.block_on(EnvSecrets.resolve("ssm:/hl/gh")).is_err());
    }

    #[test]
    fn unresolvable_secret_names_endpoint_and_reference_but_not_value() {
        let specs = parse_endpoints(r#"{"gh": {"provider": "github", "secrets": ["env:MISSING"]}}"#).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let err = rt
            .block_on(build_endpoints(
                specs,
                &MapSecrets(HashMap::new()),
                Arc::new(CertificateCache::new(Arc::new(NoFetch))),
                None,
            ))
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "endpoint \"gh\": secret \"env:MISSING\" could not be resolved: not found");
    }

    #[test]
    fn invalid_specs_give_clear_errors() {
        let cases = [
            (r#"{}"#, "no endpoints"),
            (r#"{"Bad Name": {"provider": "github", "secrets": ["env:A"]}}"#, "name must be"),
            (r#"{"gh": {"provider": "github"}}"#, "needs at least one secret"),
            (r#"{"gh": {"provider": "github", "secrets": ["whsec_inline"]}}"#, "never inline"),
            (r#"{"ses": {"provider": "sns"}}"#, "topic_arns"),
            (r#"{"ses": {"provider": "sns", "topic_arns": ["nope"]}}"#, "not an SNS topic ARN"),
            (
                r#"{"ses": {"provider": "sns", "topic_arns": ["arn:aws:sns:r:1:t"], "secrets": ["env:A"]}}"#,
                "take no secrets",
            ),
            (r#"{"h": {"provider": "hmac", "secrets": ["env:A"]}}"#, "need an \"hmac\" section"),
            (
                r#"{"h": {"provider": "hmac", "secrets": ["env:A"], "hmac": {"signature_header": "x-sig", "encoding": "hex", "signed_content": "{timestamp}.{body}", "id": {"header": "x-id"}}}}"#,
                "{timestamp}",
            ),
            (r#"{"gh": {"provider": "github", "secrets": ["env:A"], "tolerance_secs": 0}}"#, "tolerance_secs"),
            (r#"{"gh": {"provider": "paypal", "secrets": ["env:A"]}}"#, "unknown provider \"paypal\" (known: stripe,"),
            (
                r#"{"s": {"provider": "stripe", "secrets": ["env:A"], "topic_arns": ["arn:aws:sns:r:1:t"]}}"#,
                "topic_arns only applies to sns endpoints",
            ),
            (
                r#"{"q": {"provider": "quiltt", "secrets": ["env:A"], "hmac": {"signature_header": "x", "encoding": "hex", "id": {"header": "x-id"}}}}"#,
                "the hmac section only applies to hmac endpoints",
            ),
            (r#"{"gh": {"provider": "github", "secrets": ["env:A"], "extra": 1}}"#, "unknown field"),
            (r#"{"m": {"provider": "meta", "secrets": ["env:A"]}}"#, "need a verify_token"),
            (
                r#"{"m": {"provider": "meta", "secrets": ["env:A"], "verify_token": "hunter2"}}"#,
                "never an inline value",
            ),
            (
                r#"{"s": {"provider": "shopify", "secrets": ["env:A"], "verify_token": "env:T"}}"#,
                "verify_token is for providers that check the endpoint with a GET",
            ),
            (r#"{"t": {"provider": "twilio", "secrets": ["env:A"]}}"#, "needs its public_url"),
            (
                r#"{"s": {"provider": "stripe", "secrets": ["env:A"], "payload": {"policy": "redact", "remove": ["data"]}}}"#,
                "payload policy pointer \"data\": must start with '/'",
            ),
            (
                r#"{"s": {"provider": "stripe", "secrets": ["env:A"], "payload": {"policy": "redact"}}}"#,
                "at least one pointer",
            ),
            (
                r#"{"s": {"provider": "stripe", "secrets": ["env:A"], "payload": {"policy": "drop_after", "mask": ["/a"]}}}"#,
                "redact policy only",
            ),
            (
                r#"{"s": {"provider": "stripe", "secrets": ["env:A"], "payload": {"policy": "shred"}}}"#,
                "unknown payload policy",
            ),
        ];
        for (json, needle) in cases {
            let err = parse_endpoints(json).err().unwrap_or_else(|| panic!("accepted {json}"));
            assert!(err.to_string().contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn an_erasable_endpoint_of_a_provider_whose_notifications_repeat_is_refused_with_why() {
        let ok = parse_endpoints(r#"{"s": {"provider": "stripe", "secrets": ["env:S"], "erasable": true}}"#);
        assert!(ok.is_ok(), "{ok:?}");
        for provider in ["dropbox", "microsoft_graph"] {
            let json = format!(r#"{{"n": {{"provider": "{provider}", "secrets": ["env:S"], "erasable": true}}}}"#);
            let err = parse_endpoints(&json).unwrap_err().to_string();
            assert!(err.contains("erasable is not available"), "{provider}: {err}");
        }
    }
}
