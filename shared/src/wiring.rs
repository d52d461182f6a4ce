//! The composition root: the one place that builds adapters and puts the
//! use cases on them. [`Settings`] reads every variable once, with one
//! validation; [`Wiring`] builds the ledger (shards, retention, payload
//! bucket), the work queue, the dispatcher, the provider sources and the
//! secret resolver from them, each with the same [`Ambient`] (clock and
//! entropy). The three functions, every CLI verb and the demo start here.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::adapters::destinations::AwsPublisher;
use crate::adapters::dynamodb::DynamoLedger;
use crate::adapters::dynamodb::outbox::DynamoOutbox;
use crate::adapters::github::GithubDeliveries;
use crate::adapters::handshake::SsmSecretStore;
use crate::adapters::s3::S3Payloads;
use crate::adapters::secrets::AwsSecretResolver;
use crate::adapters::sources::ProviderSource;
use crate::adapters::sqs::SqsQueue;
use crate::adapters::stripe::StripeEvents;
use crate::adapters::timeouts::Timeouts;
use crate::adapters::webhooks::HttpsSender;
use crate::backfill::{self, Backfill, BackfillSettings, Schedule};
use crate::clock::Ambient;
use crate::config::{self, ConfigError, EndpointSpec, ProcessorSettings, ReconcilerSettings, SecretResolver};
use crate::intake::Intake;
use crate::ops::Ops;
use crate::outbox::Dispatcher;
use crate::processor::Processor;
use crate::projection::fetch::SubscriptionSource;
use crate::projection::recheck::Rechecks;
use crate::reconciler::Reconciler;
use crate::secret::Secret;
use crate::telemetry::TenantMetrics;
use crate::verify::provider::{BackfillList, SecretStore};
use crate::verify::sns::CertificateCache;

/// The use cases as deployed: on DynamoDB, SQS and SNS.
pub type LiveDispatcher = Dispatcher<DynamoOutbox, AwsPublisher>;
pub type LiveIntake = Intake<DynamoLedger, SqsQueue>;
pub type LiveProcessor = Processor<DynamoLedger, SqsQueue, LiveDispatcher>;
pub type LiveReconciler = Reconciler<SqsQueue, DynamoLedger, LiveDispatcher>;
pub type LiveOps = Ops<SqsQueue, DynamoLedger>;
pub type LiveBackfill = Backfill<DynamoLedger, SqsQueue, ProviderSource>;

pub const STRIPE_API_KEY: &str = "HOOKLEDGER_STRIPE_API_KEY";
pub const GITHUB_TOKEN: &str = "HOOKLEDGER_GITHUB_TOKEN";
const STRIPE_API_BASE: &str = "https://api.stripe.com";
const GITHUB_API_BASE: &str = "https://api.github.com";

/// Every setting of every function and verb, read once. A variable that is
/// set is validated whether or not the caller needs it; one that is needed
/// and missing is reported when the part that needs it is built.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `HOOKLEDGER_TABLE`
    pub table: Option<String>,
    /// `HOOKLEDGER_QUEUE_URL`
    pub queue_url: Option<String>,
    /// `HOOKLEDGER_DELIVERY_QUEUE_URL`: route deliveries sent apart
    /// (without it they are sent by the processor and the reconciler).
    pub delivery_queue_url: Option<String>,
    /// `HOOKLEDGER_PAYLOAD_BUCKET`
    pub payload_bucket: Option<String>,
    /// `HOOKLEDGER_KEYS_TABLE`: the data keys of erasable endpoints'
    /// payloads and the subject index ([`crate::sealing`]).
    pub keys_table: Option<String>,
    /// `HOOKLEDGER_NOTIFY_TOPIC_ARN`
    pub notify_topic: Option<String>,
    /// `HOOKLEDGER_INDEX_SHARDS`
    pub index_shards: u32,
    /// `HOOKLEDGER_RETENTION_DAYS`
    pub retention_days: u32,
    /// `HOOKLEDGER_AUDIT_RETENTION_DAYS`
    pub audit_retention_days: u32,
    /// `HOOKLEDGER_MAX_BODY_BYTES` (its default depends on the bucket)
    pub max_body_bytes: usize,
    /// `HOOKLEDGER_ENDPOINTS`, parsed (secrets not resolved); `None` when unset.
    pub endpoints: Option<BTreeMap<String, EndpointSpec>>,
    pub processor: ProcessorSettings,
    pub reconciler: ReconcilerSettings,
    /// `HOOKLEDGER_BACKFILL`: the scheduled backfills.
    pub backfill_schedules: BTreeMap<String, Schedule>,
    /// `HOOKLEDGER_MAX_BACKFILL_BODY_BYTES`
    pub max_backfill_body_bytes: usize,
    /// `HOOKLEDGER_STRIPE_API_KEY` (a secret reference) and `HOOKLEDGER_STRIPE_API_BASE`
    pub stripe_api_key: Option<String>,
    pub stripe_api_base: String,
    /// `HOOKLEDGER_GITHUB_TOKEN` (a secret reference) and `HOOKLEDGER_GITHUB_API_BASE`
    pub github_token: Option<String>,
    pub github_api_base: String,
    /// `HOOKLEDGER_TENANT_METRICS`: the tenants with metrics of their own.
    pub tenant_metrics: TenantMetrics,
    /// `HOOKLEDGER_HANDSHAKE_PATH`: the SSM path under which secrets handed
    /// over at a handshake (Asana) are kept, per endpoint (`adapters::handshake`).
    pub handshake_path: Option<String>,
    /// `HOOKLEDGER_ROUTES`: where verified events are handed on (none when unset).
    pub routes: Arc<crate::routes::Routes>,
}

/// A provider API base: the variable `name`, else `default`; `https://`, or
/// `http://` to a loopback host only (see [`crate::adapters::provider_http::check_api_base`]).
fn api_base(get: impl Fn(&str) -> Option<String>, name: &str, default: &str) -> Result<String, ConfigError> {
    let Some(base) = get(name) else { return Ok(default.to_owned()) };
    crate::adapters::provider_http::check_api_base(&base)
        .map_err(|reason| ConfigError::Invalid { name: name.to_owned(), reason })?;
    Ok(base)
}

/// Every scheduled backfill names an endpoint of `HOOKLEDGER_ENDPOINTS` of
/// the same provider, and a schedule's `tenant`, if given, is that
/// endpoint's: an endpoint has one tenant, so a recovered event and the
/// webhook that may follow it are filed under the same one.
fn backfill_tenants(
    schedules: &BTreeMap<String, Schedule>,
    endpoints: Option<&BTreeMap<String, EndpointSpec>>,
) -> Result<(), String> {
    let Some((first, _)) = schedules.iter().next() else { return Ok(()) };
    let Some(endpoints) = endpoints else {
        return Err(format!(
            "{first} is backfilled, but HOOKLEDGER_ENDPOINTS is not set (the reconciler reads the endpoints' tenants from it)"
        ));
    };
    for (name, schedule) in schedules {
        let Some(spec) = endpoints.get(name) else {
            let known: Vec<&str> = endpoints.keys().map(String::as_str).collect();
            return Err(format!("{name} is not an endpoint of HOOKLEDGER_ENDPOINTS ({})", known.join(", ")));
        };
        if spec.provider != schedule.provider {
            return Err(format!(
                "{name} is backfilled from {}, but HOOKLEDGER_ENDPOINTS says {name} is a {} endpoint",
                schedule.provider,
                spec.provider.as_str()
            ));
        }
        let tenant = endpoint_tenant(name, spec);
        if let Some(given) = schedule.tenant.as_deref().filter(|t| *t != tenant) {
            return Err(format!(
                "{name}: the schedule's tenant {given:?} is not the endpoint's tenant {tenant:?} (HOOKLEDGER_ENDPOINTS); drop it or make them equal"
            ));
        }
    }
    Ok(())
}

/// An endpoint's tenant: as configured, else the endpoint's name.
fn endpoint_tenant<'a>(name: &'a str, spec: &'a EndpointSpec) -> &'a str {
    spec.tenant.as_deref().unwrap_or(name)
}

impl Settings {
    /// The tenant a scheduled backfill of `endpoint` files its events
    /// under: the endpoint's, from `HOOKLEDGER_ENDPOINTS` (checked at load
    /// to be the schedule's, if it names one).
    pub fn backfill_tenant(&self, endpoint: &str) -> Option<String> {
        let spec = self.endpoints.as_ref()?.get(endpoint)?;
        Some(endpoint_tenant(endpoint, spec).to_owned())
    }

    /// Whether `endpoint` is erasable in `HOOKLEDGER_ENDPOINTS`.
    pub fn erasable(&self, endpoint: &str) -> bool {
        self.endpoints.as_ref().and_then(|e| e.get(endpoint)).is_some_and(|s| s.erasable)
    }

    /// The payload policy of `endpoint`, from `HOOKLEDGER_ENDPOINTS`
    /// (`None`: not set, or no such endpoint).
    pub fn payload_policy(&self, endpoint: &str) -> Option<crate::redaction::PayloadPolicy> {
        Some(self.endpoints.as_ref()?.get(endpoint)?.payload.clone())
    }

    /// The process environment (empty values count as unset).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads every setting through `get`; the first invalid one is the error,
    /// named by its variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let invalid = |name: &str, reason: String| ConfigError::Invalid { name: name.into(), reason };
        let intake = config::intake_limits_from(&get)?;
        let processor = config::processor_settings_from(get)?;
        let reconciler = config::reconciler_settings_from(get)?;
        let endpoints = get("HOOKLEDGER_ENDPOINTS").map(|raw| config::parse_endpoints(&raw)).transpose()?;
        let backfill_schedules = match get("HOOKLEDGER_BACKFILL") {
            Some(json) => backfill::parse_schedules(&json, intake.retention_days)
                .map_err(|e| invalid("HOOKLEDGER_BACKFILL", e))?,
            None => BTreeMap::new(),
        };
        let max_backfill_body_bytes = config::env_number(
            &get,
            "HOOKLEDGER_MAX_BACKFILL_BODY_BYTES",
            backfill::DEFAULT_MAX_BODY_BYTES as i64,
            1024,
            backfill::MAX_MAX_BODY_BYTES as i64,
        )? as usize;
        let stripe_api_key = get(STRIPE_API_KEY);
        let github_token = get(GITHUB_TOKEN);
        for (endpoint, s) in &backfill_schedules {
            let (needs, have) = match s.provider.backfill() {
                Some(BackfillList::GithubDeliveries) => (GITHUB_TOKEN, &github_token),
                _ => (STRIPE_API_KEY, &stripe_api_key),
            };
            if have.is_none() {
                return Err(invalid(
                    "HOOKLEDGER_BACKFILL",
                    format!("{endpoint} is backfilled from {}: set {needs}", s.provider),
                ));
            }
        }
        backfill_tenants(&backfill_schedules, endpoints.as_ref()).map_err(|e| invalid("HOOKLEDGER_BACKFILL", e))?;
        let handshake_path = get("HOOKLEDGER_HANDSHAKE_PATH");
        if let Some(path) = &handshake_path {
            if !crate::adapters::handshake::valid_path(path) {
                return Err(invalid(
                    "HOOKLEDGER_HANDSHAKE_PATH",
                    "an SSM path: /, then segments of letters, digits, '_', '.' or '-', no trailing /".into(),
                ));
            }
        }
        let keys_table = get("HOOKLEDGER_KEYS_TABLE").filter(|t| !t.is_empty());
        if keys_table.is_none() {
            let erasable = endpoints.iter().flatten().find(|(_, spec)| spec.erasable);
            if let Some((name, _)) = erasable {
                return Err(invalid(
                    "HOOKLEDGER_ENDPOINTS",
                    format!("{name} is erasable: its data keys need HOOKLEDGER_KEYS_TABLE"),
                ));
            }
        }
        let routes = match get("HOOKLEDGER_ROUTES") {
            Some(json) => crate::routes::Routes::parse(&json).map_err(|e| invalid("HOOKLEDGER_ROUTES", e))?,
            None => crate::routes::Routes::none(),
        };
        Ok(Self {
            routes: Arc::new(routes),
            handshake_path,
            table: get("HOOKLEDGER_TABLE"),
            queue_url: get("HOOKLEDGER_QUEUE_URL"),
            delivery_queue_url: get("HOOKLEDGER_DELIVERY_QUEUE_URL").filter(|u| !u.is_empty()),
            payload_bucket: intake.payload_bucket,
            keys_table,
            notify_topic: get("HOOKLEDGER_NOTIFY_TOPIC_ARN"),
            index_shards: intake.index_shards,
            retention_days: intake.retention_days,
            audit_retention_days: crate::config::audit_retention_days(&get)?,
            max_body_bytes: intake.max_body_bytes,
            endpoints,
            processor,
            reconciler,
            backfill_schedules,
            max_backfill_body_bytes,
            stripe_api_key,
            stripe_api_base: api_base(get, "HOOKLEDGER_STRIPE_API_BASE", STRIPE_API_BASE)?,
            github_token,
            github_api_base: api_base(get, "HOOKLEDGER_GITHUB_API_BASE", GITHUB_API_BASE)?,
            tenant_metrics: get("HOOKLEDGER_TENANT_METRICS")
                .map(|raw| TenantMetrics::parse(&raw))
                .transpose()
                .map_err(|reason| invalid("HOOKLEDGER_TENANT_METRICS", reason))?
                .unwrap_or_default(),
        })
    }

    pub fn table(&self) -> Result<&str, ConfigError> {
        self.table.as_deref().ok_or(ConfigError::Missing("HOOKLEDGER_TABLE"))
    }

    pub fn queue_url(&self) -> Result<&str, ConfigError> {
        self.queue_url.as_deref().ok_or(ConfigError::Missing("HOOKLEDGER_QUEUE_URL"))
    }

    /// The intake's settings (table and queue required).
    pub fn intake(&self) -> Result<config::Settings, ConfigError> {
        Ok(config::Settings {
            table_name: self.table()?.to_owned(),
            queue_url: self.queue_url()?.to_owned(),
            max_body_bytes: self.max_body_bytes,
            retention_days: self.retention_days,
            index_shards: self.index_shards,
            payload_bucket: self.payload_bucket.clone(),
        })
    }

    /// The scheduled backfills' run settings.
    pub fn backfill(&self) -> BackfillSettings {
        BackfillSettings { max_body_bytes: self.max_backfill_body_bytes, ..BackfillSettings::default() }
    }
}

/// Builds every adapter and use case from one [`Settings`] and one AWS
/// configuration (endpoints from `AWS_ENDPOINT_URL*`).
#[derive(Clone)]
pub struct Wiring {
    aws: aws_config::SdkConfig,
    pub settings: Settings,
    ambient: Ambient,
}

impl Wiring {
    /// The AWS configuration of the environment within a function's
    /// `timeouts` (see [`load_aws`]), and the settings of the environment.
    pub async fn from_env(timeouts: Timeouts) -> Result<Self, ConfigError> {
        let settings = Settings::from_env()?;
        Ok(Self::new(load_aws(timeouts).await, settings))
    }

    pub fn new(aws: aws_config::SdkConfig, settings: Settings) -> Self {
        Self { aws, settings, ambient: Ambient::system() }
    }

    /// Every part built from here reads time and randomness from `ambient`.
    pub fn with_ambient(mut self, ambient: Ambient) -> Self {
        self.ambient = ambient;
        self
    }

    pub fn ambient(&self) -> &Ambient {
        &self.ambient
    }

    pub fn aws(&self) -> &aws_config::SdkConfig {
        &self.aws
    }

    pub fn dynamodb_client(&self) -> aws_sdk_dynamodb::Client {
        aws_sdk_dynamodb::Client::new(&self.aws)
    }

    pub fn sqs_client(&self) -> aws_sdk_sqs::Client {
        aws_sdk_sqs::Client::new(&self.aws)
    }

    /// The ledger: table, shards, retention, payload bucket.
    pub fn ledger(&self) -> Result<DynamoLedger, ConfigError> {
        let s = &self.settings;
        let ledger = DynamoLedger::new(self.dynamodb_client(), self.settings.table()?)
            .with_shards(s.index_shards)
            .with_retention(s.retention_days)
            .with_audit_retention(s.audit_retention_days)
            .with_ambient(self.ambient.clone());
        Ok(match &s.payload_bucket {
            Some(bucket) => ledger.with_payload_bucket(S3Payloads::from_config(&self.aws, bucket.clone())),
            None => ledger,
        })
    }

    /// The data keys of sealed payloads (`HOOKLEDGER_KEYS_TABLE`), if set.
    pub fn keys(&self) -> Option<Arc<dyn crate::ports::PayloadKeys>> {
        let table = self.settings.keys_table.clone()?;
        Some(Arc::new(crate::adapters::dynamodb::keys::DynamoKeys::new(self.dynamodb_client(), table)))
    }

    /// The work queue.
    pub fn queue(&self) -> Result<SqsQueue, ConfigError> {
        Ok(self.queue_at(self.settings.queue_url()?))
    }

    /// A queue by URL (the dead-letter queue a replay reads).
    pub fn queue_at(&self, url: &str) -> SqsQueue {
        SqsQueue::new(self.sqs_client(), url)
    }

    /// Routes' deliveries as an operator sees them (`hookledger deliveries`).
    pub fn deliveries(&self) -> Result<crate::outbox::Deliveries<DynamoOutbox>, ConfigError> {
        Ok(crate::outbox::Deliveries::new(DynamoOutbox::on(self.ledger()?), self.settings.index_shards))
    }

    /// The outbox dispatcher on the ledger's table: SNS, SQS, EventBridge
    /// and, when the routes name any, HTTPS destinations.
    pub fn dispatcher(&self) -> Result<LiveDispatcher, ConfigError> {
        let store = DynamoOutbox::on(self.ledger()?);
        let payloads: Arc<dyn crate::ports::EventPayloads> = Arc::new(self.ledger()?);
        let mut publisher = AwsPublisher::new(&self.aws);
        if self.settings.routes.destinations().iter().any(|d| d.https.is_some()) {
            let secrets: Arc<dyn SecretResolver> = Arc::new(self.secrets());
            publisher = publisher.with_https(HttpsSender::new(self.settings.routes.clone(), secrets));
        }
        let destinations = self.settings.routes.destinations().iter().map(|d| d.name.clone()).collect();
        let mut dispatcher = Dispatcher::with_ports(store, publisher)
            .with_payloads(payloads)
            .with_ambient(self.ambient.clone())
            .with_destinations(destinations)
            .with_limits(self.settings.routes.destinations().iter().map(|d| (d.name.clone(), d.limits)));
        if let Some(url) = &self.settings.delivery_queue_url {
            dispatcher =
                dispatcher.with_queue(Arc::new(crate::adapters::sqs::SqsDeliveries::new(self.sqs_client(), url)));
        }
        if let Some(keys) = self.keys() {
            dispatcher = dispatcher.with_keys(keys);
        }
        Ok(dispatcher)
    }

    /// Resolves `env:` and `ssm:` secret references.
    pub fn secrets(&self) -> AwsSecretResolver {
        AwsSecretResolver::new(aws_sdk_ssm::Client::new(&self.aws))
    }

    pub async fn secret(&self, reference: &str) -> Result<Secret, String> {
        if reference.starts_with("env:") {
            config::EnvSecrets.resolve(reference).await
        } else {
            self.secrets().resolve(reference).await
        }
    }

    /// The Stripe subscription source (`HOOKLEDGER_STRIPE_API_KEY`), its key
    /// read by the first fetch; `None` without a key.
    pub fn subscriptions(&self) -> Result<Option<Arc<dyn SubscriptionSource>>, ConfigError> {
        let s = &self.settings;
        let get = |k: &str| match k {
            STRIPE_API_KEY => s.stripe_api_key.clone(),
            "HOOKLEDGER_STRIPE_API_BASE" => Some(s.stripe_api_base.clone()),
            _ => None,
        };
        crate::adapters::https::lazy_subscription_source(get, Arc::new(self.secrets()), Timeouts::of(&self.aws))
    }

    /// The intake: endpoints with their secrets resolved (SSM only when a
    /// reference needs it), the SNS certificate cache, ledger and queue.
    pub async fn intake(&self) -> Result<LiveIntake, ConfigError> {
        let specs = self.settings.endpoints.clone().ok_or(ConfigError::Missing("HOOKLEDGER_ENDPOINTS"))?;
        self.intake_for(specs).await
    }

    /// Where secrets handed over at a handshake are kept
    /// (`HOOKLEDGER_HANDSHAKE_PATH`), if the setting names a path.
    pub fn secret_store(&self) -> Option<Arc<dyn SecretStore>> {
        let path = self.settings.handshake_path.as_deref()?;
        Some(Arc::new(SsmSecretStore::new(aws_sdk_ssm::Client::new(&self.aws), path)))
    }

    /// The intake of these endpoints only (a replay of one endpoint's messages).
    pub async fn intake_for(&self, specs: BTreeMap<String, EndpointSpec>) -> Result<LiveIntake, ConfigError> {
        let getter = crate::adapters::https::ReqwestGetter::new(Timeouts::of(&self.aws));
        let certificates = Arc::new(CertificateCache::new(Arc::new(getter)));
        let secrets: Arc<dyn SecretResolver> =
            if config::uses_ssm(&specs) { Arc::new(self.secrets()) } else { Arc::new(config::EnvSecrets) };
        // An SSM client only where an endpoint learns its secret at a handshake.
        let learned = if specs.values().any(|s| s.provider.learns_secret()) { self.secret_store() } else { None };
        // Every endpoint's secrets at once; one that cannot be resolved
        // waits apart (503 to its deliveries) and the others work.
        let builder = config::EndpointBuilder::new(secrets, certificates, learned);
        let built = builder.build_all(specs).await?;
        let waiting = crate::intake::waiting::WaitingEndpoints::new(builder, built.waiting, self.ambient.now_ms());
        let mut intake = Intake::new(built.ready, self.settings.intake()?, self.ledger()?, self.queue()?);
        if let Some(keys) = self.keys() {
            intake = intake.with_keys(keys);
        }
        Ok(intake
            .with_waiting(waiting)
            .with_ambient(self.ambient.clone())
            .with_tenant_metrics(self.settings.tenant_metrics.clone()))
    }

    /// The topic outbox notifications of the application go to
    /// (`HOOKLEDGER_NOTIFY_TOPIC_ARN`), if set.
    pub fn notify_topic(&self) -> Option<String> {
        self.settings.notify_topic.clone()
    }

    /// The processor with the application's projections (registered by the
    /// function's `main.rs`), the dispatcher and the queue that woken gap
    /// waiters go to.
    pub fn processor(&self, registry: crate::projection::Registry) -> Result<LiveProcessor, ConfigError> {
        Ok(self.processor_with(registry, Some(self.dispatcher()?))?.with_queue(self.queue()?))
    }

    /// A processor over the ledger with these projections and dispatcher.
    pub fn processor_with(
        &self,
        registry: crate::projection::Registry,
        dispatcher: Option<LiveDispatcher>,
    ) -> Result<LiveProcessor, ConfigError> {
        let processor = processor(self.ledger()?, registry, dispatcher, self.settings.processor)
            .with_routes(self.settings.routes.clone())
            .with_ambient(self.ambient.clone())
            .with_tenant_metrics(self.settings.tenant_metrics.clone());
        Ok(match self.keys() {
            Some(keys) => processor.with_keys(keys),
            None => processor,
        })
    }

    /// The reconciler with its configured settings and the application's
    /// re-checks (`registry.rechecks()`).
    pub fn reconciler(&self, rechecks: Rechecks) -> Result<LiveReconciler, ConfigError> {
        self.reconciler_with(rechecks, self.settings.reconciler)
    }

    /// The reconciler with other settings (the CLI's overrides).
    pub fn reconciler_with(
        &self,
        rechecks: Rechecks,
        settings: ReconcilerSettings,
    ) -> Result<LiveReconciler, ConfigError> {
        let r = Reconciler::new(self.ledger()?, self.queue()?, Some(self.dispatcher()?), rechecks, settings);
        Ok(r.with_ambient(self.ambient.clone()))
    }

    /// Operator actions (sends go to the work queue).
    pub fn ops(&self) -> Result<LiveOps, ConfigError> {
        Ok(self.with_keys(Ops::new(self.ledger()?, self.queue()?)))
    }

    fn with_keys(&self, ops: LiveOps) -> LiveOps {
        match self.keys() {
            Some(keys) => ops.with_keys(keys),
            None => ops,
        }
    }

    /// Operator reads: never send, so no queue needs to be configured.
    pub fn ops_read_only(&self) -> Result<LiveOps, ConfigError> {
        let url = self.settings.queue_url.clone().unwrap_or_default();
        Ok(self.with_keys(Ops::new(self.ledger()?, self.queue_at(&url))))
    }

    /// The backfill source of one provider: Stripe's event list (an account's
    /// when `account` is set) or a GitHub hook's deliveries, with `secret`
    /// (a reference) resolved now.
    pub async fn provider_source(&self, spec: SourceSpec<'_>) -> Result<ProviderSource, String> {
        let key = self.secret(spec.secret).await.map_err(|e| format!("secret {}: {e}", spec.secret))?;
        let clock = self.ambient.clock.clone();
        let s = &self.settings;
        if spec.list == BackfillList::GithubDeliveries {
            let base = spec.base.unwrap_or(&s.github_api_base);
            let api = GithubDeliveries::new_within(base, spec.hook.unwrap_or_default(), key, Timeouts::of(&self.aws))?;
            return Ok(ProviderSource::Github(api.with_max_body_bytes(spec.max_body_bytes).with_clock(clock)));
        }
        let base = spec.base.unwrap_or(&s.stripe_api_base);
        let api = StripeEvents::new_within(base, key, spec.account, Timeouts::of(&self.aws))?;
        Ok(ProviderSource::Stripe(api.with_max_body_bytes(spec.max_body_bytes).with_clock(clock)))
    }

    /// The source of a scheduled backfill, with the configured key or token.
    pub async fn scheduled_source(&self, schedule: &Schedule) -> Result<ProviderSource, String> {
        let s = &self.settings;
        let list = schedule.provider.backfill().ok_or_else(|| format!("{} keeps no list", schedule.provider))?;
        let secret = if list == BackfillList::GithubDeliveries { &s.github_token } else { &s.stripe_api_key };
        let secret = secret.as_deref().ok_or_else(|| format!("no secret for {}", schedule.provider))?;
        self.provider_source(SourceSpec {
            list,
            base: None,
            hook: schedule.hook.as_deref(),
            account: schedule.account.clone(),
            secret,
            max_body_bytes: s.max_backfill_body_bytes,
        })
        .await
    }

    /// A backfill from `source` into the ledger and queue.
    pub fn backfill<S: crate::ports::BackfillSource>(
        &self,
        source: S,
        settings: BackfillSettings,
    ) -> Result<Backfill<DynamoLedger, SqsQueue, S>, ConfigError> {
        let backfill =
            Backfill::new(self.ledger()?, self.queue()?, source, settings).with_ambient(self.ambient.clone());
        Ok(match self.keys() {
            Some(keys) => backfill.with_keys(keys),
            None => backfill,
        })
    }

    /// The operator's metrics reader (CloudWatch).
    #[cfg(feature = "cloudwatch")]
    pub fn metrics(&self, namespace: Option<String>) -> crate::adapters::cloudwatch::CloudWatchMetrics {
        crate::adapters::cloudwatch::CloudWatchMetrics::from_config(&self.aws, namespace)
    }

    /// The metrics writer of the local stack's log bridge: one attempt per
    /// `PutMetricData` (a retry after a lost acknowledgement would count a
    /// line twice; a failed line is reported instead).
    #[cfg(feature = "cloudwatch")]
    pub fn metrics_writer_once(&self, namespace: Option<String>) -> crate::adapters::cloudwatch::CloudWatchMetrics {
        let once = self.aws.to_builder().retry_config(aws_config::retry::RetryConfig::disabled()).build();
        crate::adapters::cloudwatch::CloudWatchMetrics::from_config(&once, namespace)
    }

    /// Creates what `scripts/run` needs and the template declares: the table,
    /// the work queue with its dead-letter queue, the notification topic and
    /// the payload bucket (each idempotent).
    pub async fn setup(&self, queue: &str) -> Result<Created, String> {
        crate::adapters::dynamodb::create_table(
            &self.dynamodb_client(),
            self.settings.table().map_err(|e| e.to_string())?,
        )
        .await?;
        let queues = crate::adapters::sqs::create_work_queues(&self.sqs_client(), queue).await?;
        let topic = aws_sdk_sns::Client::new(&self.aws)
            .create_topic()
            .name(format!("{queue}-notify"))
            .send()
            .await
            .map_err(|e| crate::ledger::error_chain(&e))?
            .topic_arn
            .unwrap_or_default();
        let bucket = format!("{queue}-payloads");
        crate::adapters::s3::create_bucket(&aws_sdk_s3::Client::new(&self.aws), &bucket).await?;
        // The delivery queue, with its dead-letter queue, as the template's.
        let deliveries =
            crate::adapters::sqs::create_work_queues(&self.sqs_client(), &format!("{queue}-delivery")).await?;
        // The key table of erasable endpoints' payloads, as the template's.
        let keys_table = format!("{queue}-keys");
        crate::adapters::dynamodb::keys::create_keys_table(&self.dynamodb_client(), &keys_table)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Created {
            queue_url: queues.work_url,
            dead_letter_url: queues.dead_letter_url,
            topic,
            bucket,
            delivery_queue_url: deliveries.work_url,
            keys_table,
        })
    }
}

/// The local stack's routes ([`Wiring::setup_routes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRoutes {
    /// `HOOKLEDGER_ROUTES`: every event to the queue and the bus.
    pub routes: String,
    /// The destination queue (`HOOKLEDGER_ROUTED_QUEUE_URL`), and the queue
    /// the bus's rule forwards to.
    pub queue_url: String,
    pub bus_queue_url: String,
}

impl Wiring {
    /// Routes for a local stack: an SQS queue (`{prefix}-deliveries`) and an
    /// EventBridge bus (`{prefix}`) whose rule forwards Hookledger's events to
    /// a second queue (`{prefix}-bus-deliveries`); every event goes to both,
    /// and to the HTTPS consumer at `consumer` when one is given (on
    /// loopback, its secret `env:DEV_DESTINATION_SECRET`).
    pub async fn setup_routes(&self, prefix: &str, consumer: Option<&str>) -> Result<LocalRoutes, String> {
        let sqs = self.sqs_client();
        let arn_of = |url: String| {
            let sqs = sqs.clone();
            async move { crate::adapters::sqs::queue_arn(&sqs, &url).await.map(|arn| (url, arn)) }
        };
        let (queue_url, queue_arn) =
            arn_of(crate::adapters::sqs::create_queue(&sqs, &format!("{prefix}-deliveries")).await?).await?;
        let (bus_queue_url, bus_queue_arn) =
            arn_of(crate::adapters::sqs::create_queue(&sqs, &format!("{prefix}-bus-deliveries")).await?).await?;
        let events = aws_sdk_eventbridge::Client::new(&self.aws);
        let bus_arn = match events.create_event_bus().name(prefix).send().await {
            Ok(out) => out.event_bus_arn.unwrap_or_default(),
            Err(_) => events
                .describe_event_bus()
                .name(prefix)
                .send()
                .await
                .map_err(|e| crate::ledger::error_chain(&e))?
                .arn
                .unwrap_or_default(),
        };
        let rule = format!("{prefix}-to-queue");
        let pattern = serde_json::json!({"source": [crate::routes::DEFAULT_SOURCE]}).to_string();
        events
            .put_rule()
            .name(&rule)
            .event_bus_name(prefix)
            .event_pattern(pattern)
            .send()
            .await
            .map_err(|e| crate::ledger::error_chain(&e))?;
        let target = aws_sdk_eventbridge::types::Target::builder()
            .id("deliveries")
            .arn(bus_queue_arn)
            .build()
            .map_err(|e| e.to_string())?;
        events
            .put_targets()
            .rule(&rule)
            .event_bus_name(prefix)
            .targets(target)
            .send()
            .await
            .map_err(|e| crate::ledger::error_chain(&e))?;
        let mut routes = serde_json::json!({
            "destinations": {"queue": {"arn": queue_arn}, "bus": {"arn": bus_arn}},
            "routes": [{"to": ["queue", "bus"]}],
        });
        if let Some(url) = consumer {
            // The example consumer answers 409 to a repeat it is still handling: retried a while.
            routes["destinations"]["consumer"] = serde_json::json!({"url": url, "secrets": ["env:DEV_DESTINATION_SECRET"],
                "allow_private": true, "client_errors": {"409": 300}});
            routes["routes"][0]["to"] = serde_json::json!(["queue", "bus", "consumer"]);
        }
        let routes = routes.to_string();
        crate::routes::Routes::parse(&routes)?;
        Ok(LocalRoutes { routes, queue_url, bus_queue_url })
    }
}

/// Which provider list a backfill reads, and with what.
pub struct SourceSpec<'a> {
    /// The provider's list: Stripe's events or a GitHub hook's deliveries.
    pub list: BackfillList,
    /// The API's base URL; `None`: the configured one.
    pub base: Option<&'a str>,
    /// GitHub: the hook whose deliveries are listed.
    pub hook: Option<&'a str>,
    /// Stripe: the connected account.
    pub account: Option<String>,
    /// The key or token, as a secret reference.
    pub secret: &'a str,
    /// The largest event body taken.
    pub max_body_bytes: usize,
}

/// What [`Wiring::setup`] created (or found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub queue_url: String,
    pub dead_letter_url: String,
    pub topic: String,
    pub bucket: String,
    /// The delivery queue (`HOOKLEDGER_DELIVERY_QUEUE_URL`).
    pub delivery_queue_url: String,
    /// The key table of sealed payloads (`HOOKLEDGER_KEYS_TABLE`).
    pub keys_table: String,
}

/// The environment's AWS configuration for one function (or the CLI): its
/// HTTPS client built on first use, and every SDK call within `timeouts`
/// (connect, each attempt, the whole operation). The provider clients the
/// wiring builds on it take the same profile ([`Timeouts::of`]).
pub async fn load_aws(timeouts: Timeouts) -> aws_config::SdkConfig {
    aws_loader(timeouts).load().await
}

/// The loader of [`load_aws`], before it reads the environment.
fn aws_loader(timeouts: Timeouts) -> aws_config::ConfigLoader {
    aws_config::from_env().http_client(crate::adapters::https::sdk_http_client()).timeout_config(timeouts.sdk())
}

/// The processor on a DynamoDB ledger: the projections read and write the
/// ledger's table.
pub fn processor(
    ledger: DynamoLedger,
    registry: crate::projection::Registry,
    dispatcher: Option<LiveDispatcher>,
    settings: ProcessorSettings,
) -> LiveProcessor {
    let ledger = ledger.with_shards(settings.index_shards).with_retention(settings.retention_days);
    let cx = crate::projection::ProjectionContext::new(
        Arc::new(ledger.clone()),
        settings.index_shards,
        settings.retention_days,
    );
    Processor::with_ports(ledger, cx, registry, dispatcher, settings)
}

/// The dispatcher on a table and SNS (tests that wire by hand).
pub fn dispatcher(ddb: aws_sdk_dynamodb::Client, sns: aws_sdk_sns::Client, table: impl Into<String>) -> LiveDispatcher {
    let ledger = DynamoLedger::new(ddb, table);
    let payloads: Arc<dyn crate::ports::EventPayloads> = Arc::new(ledger.clone());
    Dispatcher::with_ports(DynamoOutbox::on(ledger), AwsPublisher::sns_only(sns)).with_payloads(payloads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn every_part_reads_the_same_settings_and_names_what_is_missing() {
        let s = Settings::from_lookup(vars(&[("HOOKLEDGER_RETENTION_DAYS", "9"), ("HOOKLEDGER_INDEX_SHARDS", "4")]))
            .unwrap();
        assert_eq!(s.table().err(), Some(ConfigError::Missing("HOOKLEDGER_TABLE")));
        assert_eq!((s.retention_days, s.processor.retention_days, s.reconciler.retention_days), (9, 9, 9));
        assert_eq!((s.index_shards, s.processor.index_shards), (4, 4));
        assert_eq!(s.intake().unwrap_err(), ConfigError::Missing("HOOKLEDGER_TABLE"));
        let aws = aws_config::SdkConfig::builder().behavior_version(aws_config::BehaviorVersion::latest()).build();
        let with_table = Settings { table: Some("t".into()), ..s };
        let w = Wiring::new(aws, with_table);
        assert_eq!(w.queue().err(), Some(ConfigError::Missing("HOOKLEDGER_QUEUE_URL")));
        assert_eq!(w.ledger().unwrap().shards(), 4);
    }

    #[test]
    fn the_reconciler_variables_are_read_with_bounds_the_outbox_grace_included() {
        let defaults = Settings::from_lookup(vars(&[])).unwrap();
        let r = defaults.reconciler;
        assert_eq!(
            (r.max_items, r.redrive_backoff_ms, r.drift_interval_ms, r.outbox_grace_ms),
            (500, 300_000, 3_600_000, 60_000)
        );
        assert_eq!(defaults.max_backfill_body_bytes, 25 * 1024 * 1024);
        let s = Settings::from_lookup(vars(&[("HOOKLEDGER_OUTBOX_GRACE_SECS", "90")])).unwrap();
        assert_eq!(s.reconciler.outbox_grace_ms, 90_000);
        for (name, bad) in [
            ("HOOKLEDGER_OUTBOX_GRACE_SECS", "0"),
            ("HOOKLEDGER_RECONCILE_MAX_ITEMS", "0"),
            ("HOOKLEDGER_MAX_BACKFILL_BODY_BYTES", "10"),
            ("HOOKLEDGER_RETENTION_DAYS", "1"),
        ] {
            let err = Settings::from_lookup(move |k| (k == name).then(|| bad.to_owned())).unwrap_err();
            assert!(err.to_string().contains(name), "{name}={bad}: {err}");
        }
        let no_key = Settings::from_lookup(vars(&[("HOOKLEDGER_BACKFILL", r#"{"s": {"provider": "stripe"}}"#)]));
        assert!(no_key.unwrap_err().to_string().contains(STRIPE_API_KEY));
    }

    const ENDPOINTS: &str = r#"{"stripe-a": {"provider": "stripe", "tenant": "acme", "secrets": ["ssm:/hl/never-resolved"]},
        "gh": {"provider": "github", "secrets": ["env:A"]}}"#;

    fn with_backfill(schedules: &'static str, endpoints: Option<&'static str>) -> Result<Settings, ConfigError> {
        Settings::from_lookup(move |k| match k {
            "HOOKLEDGER_BACKFILL" => Some(schedules.to_owned()),
            "HOOKLEDGER_ENDPOINTS" => endpoints.map(str::to_owned),
            "HOOKLEDGER_STRIPE_API_KEY" | "HOOKLEDGER_GITHUB_TOKEN" => Some("env:K".to_owned()),
            _ => None,
        })
    }

    /// The backfill files its events under the endpoint's tenant (read from
    /// `HOOKLEDGER_ENDPOINTS`, no secret resolved), not under the endpoint's
    /// name, whether or not the schedule repeats it.
    #[test]
    fn a_backfill_files_its_events_under_its_endpoints_tenant() {
        let s = with_backfill(r#"{"stripe-a": {"provider": "stripe"}}"#, Some(ENDPOINTS)).unwrap();
        assert_eq!(s.backfill_tenant("stripe-a").as_deref(), Some("acme"));
        let same = with_backfill(r#"{"stripe-a": {"provider": "stripe", "tenant": "acme"}}"#, Some(ENDPOINTS));
        assert_eq!(same.unwrap().backfill_tenant("stripe-a").as_deref(), Some("acme"));
        let gh = r#"{"gh": {"provider": "github", "hook": "repos/o/r/hooks/1"}}"#;
        assert_eq!(with_backfill(gh, Some(ENDPOINTS)).unwrap().backfill_tenant("gh").as_deref(), Some("gh"));
    }

    /// A schedule's tenant other than its endpoint's, an endpoint the
    /// endpoints do not name, another provider, or no endpoints at all: the
    /// settings (and so the reconciler's cold start) fail, naming both.
    #[test]
    fn a_backfill_schedule_that_disagrees_with_its_endpoint_fails_the_cold_start() {
        let cases = [
            (
                r#"{"stripe-a": {"provider": "stripe", "tenant": "other"}}"#,
                Some(ENDPOINTS),
                vec!["\"other\"", "\"acme\""],
            ),
            (r#"{"stripe-b": {"provider": "stripe"}}"#, Some(ENDPOINTS), vec!["stripe-b", "gh, stripe-a"]),
            (r#"{"gh": {"provider": "stripe"}}"#, Some(ENDPOINTS), vec!["gh", "github"]),
            (r#"{"stripe-a": {"provider": "stripe"}}"#, None, vec!["stripe-a", "HOOKLEDGER_ENDPOINTS"]),
        ];
        for (schedules, endpoints, names) in cases {
            let err = with_backfill(schedules, endpoints).unwrap_err().to_string();
            assert!(err.contains("HOOKLEDGER_BACKFILL"), "{err}");
            for name in names {
                assert!(err.contains(name), "{schedules}: {err} should name {name}");
            }
        }
    }

    /// Issue 39.12: a scheduled backfill whose first window starts before
    /// the identity retention would re-import events whose identities TTL
    /// already deleted (and apply them again): the cold start fails, naming
    /// the retention; a lookback inside it loads.
    #[test]
    fn a_backfill_lookback_beyond_the_identity_retention_fails_the_cold_start() {
        let load = |retention: &'static str, lookback: &'static str| {
            Settings::from_lookup(move |k| match k {
                "HOOKLEDGER_BACKFILL" => {
                    Some(format!(r#"{{"stripe-a": {{"provider": "stripe", "lookback_secs": {lookback}}}}}"#))
                }
                "HOOKLEDGER_ENDPOINTS" => Some(ENDPOINTS.to_owned()),
                "HOOKLEDGER_RETENTION_DAYS" => Some(retention.to_owned()),
                "HOOKLEDGER_STRIPE_API_KEY" => Some("env:K".to_owned()),
                _ => None,
            })
        };
        // Stripe keeps 30 days of events; the default retention is 30 days too.
        for (retention, lookback) in [("30", "2592000"), ("10", "864000"), ("10", "9000000")] {
            let err = load(retention, lookback).map(|_| ()).unwrap_err().to_string();
            for name in ["HOOKLEDGER_BACKFILL", "stripe-a", "lookback_secs", "HOOKLEDGER_RETENTION_DAYS"] {
                assert!(err.contains(name), "lookback {lookback} s, retention {retention} d: {err} should name {name}");
            }
        }
        assert!(load("30", "2505600").is_ok(), "29 days inside 30 days of retention load");
        assert!(load("10", "86400").is_ok());
    }

    /// A function's profile, shortened so that the test takes a moment.
    const SHORT: Timeouts = Timeouts {
        connect: std::time::Duration::from_millis(200),
        attempt: std::time::Duration::from_millis(200),
        operation: std::time::Duration::from_millis(500),
    };

    /// Issue 21.5: an SDK client on the wiring's configuration, its endpoint
    /// a server that accepts the connection and never answers, gets a
    /// timeout error (not a hang until Lambda's own timeout).
    #[tokio::test]
    async fn an_sdk_call_that_never_answers_fails_with_a_timeout() {
        use aws_sdk_dynamodb::config::{Credentials, Region};
        let aws = aws_loader(SHORT)
            .endpoint_url(crate::adapters::provider_http::test_servers::silent())
            .region(Region::new("eu-west-1"))
            .credentials_provider(Credentials::new("AKIDTEST", "secret", None, None, "test"))
            .load()
            .await;
        assert_eq!(Timeouts::of(&aws), SHORT, "the provider clients take the same profile");
        let call = aws_sdk_dynamodb::Client::new(&aws).describe_table().table_name("t").send();
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), call).await;
        let err = outcome.expect("the SDK's own timeout ends the call").unwrap_err();
        assert!(matches!(err, aws_sdk_dynamodb::error::SdkError::TimeoutError(_)), "{err:?}");
    }

    fn with_api_base(name: &'static str, base: &'static str) -> Result<Settings, ConfigError> {
        Settings::from_lookup(move |k| (k == name).then(|| base.to_owned()))
    }

    /// Issue 21.7: a provider API base is `https://`, or `http://` to a
    /// loopback host (the tests' and the local stack's fake providers).
    #[test]
    fn a_provider_api_base_is_https_or_loopback_http() {
        let defaults = Settings::from_lookup(vars(&[])).unwrap();
        assert_eq!(defaults.stripe_api_base, STRIPE_API_BASE);
        assert_eq!(defaults.github_api_base, GITHUB_API_BASE);
        const OK: [&str; 5] = [
            "https://api.example.com",
            "https://ghe.example.com/api/v3",
            "http://127.0.0.1:5056",
            "http://[::1]:80",
            "http://localhost:9",
        ];
        const REFUSED: [&str; 6] = [
            "http://api.stripe.com",
            "http://10.0.0.7:80",
            "ftp://127.0.0.1",
            "api.stripe.com",
            "not a url",
            "https://",
        ];
        for name in ["HOOKLEDGER_STRIPE_API_BASE", "HOOKLEDGER_GITHUB_API_BASE"] {
            for ok in OK {
                assert!(with_api_base(name, ok).is_ok(), "{name}={ok}");
            }
            for bad in REFUSED {
                let err = with_api_base(name, bad).unwrap_err().to_string();
                assert!(err.contains(name), "{name}={bad}: {err}");
            }
        }
        let github = Settings::from_lookup(vars(&[("HOOKLEDGER_GITHUB_API_BASE", "http://127.0.0.1:5056")])).unwrap();
        assert_eq!(github.github_api_base, "http://127.0.0.1:5056");
    }

    /// Issue 22.2: the tenants with metrics of their own, none by default;
    /// a name that cannot be a tenant, or too many, is refused at load.
    #[test]
    fn tenant_metrics_are_for_the_tenants_listed_only() {
        let none = Settings::from_lookup(vars(&[])).unwrap();
        assert_eq!(none.tenant_metrics, TenantMetrics::default());
        let listed = Settings::from_lookup(vars(&[("HOOKLEDGER_TENANT_METRICS", " acme, globex ,acme,")])).unwrap();
        assert_eq!(listed.tenant_metrics.tenants().collect::<Vec<_>>(), ["acme", "globex"]);
        assert!(listed.tenant_metrics.covers("acme") && !listed.tenant_metrics.covers("initech"));
        let with =
            |raw: String| Settings::from_lookup(move |k| (k == "HOOKLEDGER_TENANT_METRICS").then(|| raw.clone()));
        for bad in ["acme,has space".to_owned(), "caf\u{e9}".to_owned(), "x".repeat(129)] {
            let err = with(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("HOOKLEDGER_TENANT_METRICS") && err.contains("tenant must be"), "{bad}: {err}");
        }
        let many: Vec<String> = (0..=crate::telemetry::MAX_TENANT_METRICS).map(|i| format!("t{i}")).collect();
        let err = with(many.join(",")).unwrap_err();
        assert!(err.to_string().contains("at most 50"), "{err}");
    }
}
