//! Shared test setup: fresh table and queue per test, endpoint configs with
//! known secrets, and helpers that read the emulator's state.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::{self, DynamoLedger};
use hookledger::adapters::sqs::{self, SqsQueue};
use hookledger::backoff::Backoff;
use hookledger::config::ProcessorSettings;
use hookledger::config::{self, Endpoint, SecretResolver, Settings};
use hookledger::identity::EventKey;
use hookledger::intake::Intake;
use hookledger::ledger::{NewEvent, SendLease};
use hookledger::ports::Ledger;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::secret::Secret;
use hookledger::verify::sns::{CertificateCache, FetchError, HttpsGet};
use url::Url;

pub const STRIPE_SECRET: &str = "whsec_it_stripe";
pub const GITHUB_SECRET: &str = "it-github";
pub const SVIX_SECRET: &str = "whsec_aXQtc3ZpeC1rZXktZm9yLXRlc3Rz";
pub const HMAC_SECRET: &str = "it-quiltt";
pub const SNS_TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:ses-events";

pub const ENDPOINTS: &str = r#"{
    "stripe-a": {"provider": "stripe", "tenant": "tenant-a", "secrets": ["env:STRIPE"]},
    "stripe-b": {"provider": "stripe", "tenant": "tenant-b", "secrets": ["env:STRIPE"]},
    "gh": {"provider": "github", "secrets": ["env:GITHUB"]},
    "svix": {"provider": "standard_webhooks", "secrets": ["env:SVIX"]},
    "ses": {"provider": "sns", "topic_arns": ["arn:aws:sns:eu-west-1:123456789012:ses-events"]},
    "quiltt": {"provider": "quiltt", "secrets": ["env:HMAC"]},
    "dropbox": {"provider": "dropbox", "secrets": ["env:HMAC"]},
    "shopify": {"provider": "shopify", "secrets": ["env:HMAC"]}
}"#;

pub fn testdata(rel: &str) -> String {
    format!("{}/../shared/testdata/{rel}", env!("CARGO_MANIFEST_DIR"))
}

struct TestSecrets;

impl SecretResolver for TestSecrets {
    fn resolve<'a>(&'a self, reference: &'a str) -> Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>> {
        Box::pin(async move {
            match reference {
                "env:STRIPE" => Ok(Secret::new(STRIPE_SECRET)),
                "env:GITHUB" => Ok(Secret::new(GITHUB_SECRET)),
                "env:SVIX" => Ok(Secret::new(SVIX_SECRET)),
                "env:HMAC" => Ok(Secret::new(HMAC_SECRET)),
                other => Err(format!("unknown {other}")),
            }
        })
    }
}

/// Serves the repository's test SNS certificate for any URL and records every
/// URL fetched (certificates and subscription confirmations).
#[derive(Default)]
pub struct TestSnsGetter {
    pub fetched: Mutex<Vec<String>>,
}

impl HttpsGet for TestSnsGetter {
    fn get<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, FetchError>> + Send + 'a>> {
        self.fetched.lock().unwrap().push(url.to_string());
        Box::pin(async move {
            if url.path().ends_with(".pem") {
                std::fs::read(testdata("test-sns/SimpleNotificationService-0000test0000.pem"))
                    .map_err(|e| FetchError::Failed(e.to_string()))
            } else {
                Ok(b"<ConfirmSubscriptionResponse/>".to_vec())
            }
        })
    }
}

pub async fn aws() -> aws_config::SdkConfig {
    assert!(
        std::env::var("AWS_ENDPOINT_URL").is_ok(),
        "AWS_ENDPOINT_URL is not set: run the integration tests through scripts/test, which starts the emulator"
    );
    hookledger::adapters::tls::install_tls();
    aws_config::from_env().http_client(hookledger::adapters::https::sdk_http_client()).load().await
}

pub fn now_s() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A fresh table and queue, and the pieces to build intakes over them.
pub struct Stack {
    pub aws: aws_config::SdkConfig,
    pub ddb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub table: String,
    pub queue_url: String,
    pub sns_getter: Arc<TestSnsGetter>,
}

impl Stack {
    pub async fn new() -> Self {
        let aws = aws().await;
        let ddb = aws_sdk_dynamodb::Client::new(&aws);
        let sqs = aws_sdk_sqs::Client::new(&aws);
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let table = format!("it-{suffix}");
        dynamodb::create_table(&ddb, &table).await.expect("create table");
        let queue_url = sqs::create_queue(&sqs, &format!("it-{suffix}")).await.expect("create queue");
        Self { aws, ddb, sqs, table, queue_url, sns_getter: Arc::new(TestSnsGetter::default()) }
    }

    pub fn settings(&self) -> Settings {
        Settings {
            table_name: self.table.clone(),
            queue_url: self.queue_url.clone(),
            max_body_bytes: 16 * 1024,
            retention_days: 30,
            index_shards: 16,
            payload_bucket: None,
        }
    }

    pub async fn endpoints(&self) -> BTreeMap<String, Endpoint> {
        self.endpoints_from(ENDPOINTS).await
    }

    /// Endpoints from an `HOOKLEDGER_ENDPOINTS` value (secrets: `env:STRIPE`,
    /// `env:GITHUB`, `env:SVIX`, `env:HMAC`, as the tests' constants).
    pub async fn endpoints_from(&self, json: &str) -> BTreeMap<String, Endpoint> {
        let specs = config::parse_endpoints(json).unwrap();
        let certs = Arc::new(CertificateCache::new(self.sns_getter.clone()));
        config::build_endpoints(specs, &TestSecrets, certs, None).await.unwrap()
    }

    /// The ledger on this stack's shards (`settings().index_shards`: 16, not
    /// the deployed default, so the tests' reconciler runs stay short).
    pub fn ledger(&self) -> DynamoLedger {
        DynamoLedger::new(self.ddb.clone(), &self.table).with_shards(16)
    }

    pub async fn intake(&self) -> Intake<DynamoLedger, SqsQueue> {
        self.intake_with_queue(SqsQueue::new(self.sqs.clone(), &self.queue_url)).await
    }

    pub async fn intake_with_queue(&self, queue: SqsQueue) -> Intake<DynamoLedger, SqsQueue> {
        Intake::new(self.endpoints().await, self.settings(), self.ledger(), queue)
    }

    /// Writes `requests` to the table, 25 at a time, until none is left unprocessed.
    pub async fn put_all(&self, requests: &[aws_sdk_dynamodb::types::WriteRequest]) {
        for chunk in requests.chunks(25) {
            let mut pending = chunk.to_vec();
            while !pending.is_empty() {
                let out = self.ddb.batch_write_item().request_items(&self.table, pending.clone()).send().await.unwrap();
                pending = out.unprocessed_items.and_then(|mut u| u.remove(&self.table)).unwrap_or_default();
            }
        }
    }

    /// Every item in the table (a scan is fine for a test's small table).
    pub async fn items(&self) -> Vec<HashMap<String, AttributeValue>> {
        let out = self.ddb.scan().table_name(&self.table).consistent_read(true).send().await.unwrap();
        out.items.unwrap_or_default()
    }

    pub async fn meta_items(&self) -> Vec<HashMap<String, AttributeValue>> {
        self.items().await.into_iter().filter(|i| i["sk"].as_s().unwrap() == "meta").collect()
    }

    /// Drains the work queue and returns the message bodies.
    pub async fn drain_queue(&self) -> Vec<String> {
        self.drain(&self.queue_url).await
    }

    /// Drains the work queue: each message's body with its `MessageGroupId`.
    pub async fn drain_queue_grouped(&self) -> Vec<(String, Option<String>)> {
        self.drain_grouped(&self.queue_url).await
    }

    /// An intake over this stack with the endpoints of `endpoints` (JSON as
    /// `HOOKLEDGER_ENDPOINTS` holds it) instead of [`ENDPOINTS`].
    pub async fn intake_for(&self, endpoints: &str) -> Intake<DynamoLedger, SqsQueue> {
        let specs = config::parse_endpoints(endpoints).unwrap();
        let certs = Arc::new(CertificateCache::new(self.sns_getter.clone()));
        let endpoints = config::build_endpoints(specs, &TestSecrets, certs, None).await.unwrap();
        Intake::new(endpoints, self.settings(), self.ledger(), SqsQueue::new(self.sqs.clone(), &self.queue_url))
    }
}

/// The (event key, group) of each drained message, sorted: its body's `key`
/// (a [`sqs::WorkMessage`]) and its `MessageGroupId`.
pub fn key_groups(drained: &[(String, Option<String>)]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = drained
        .iter()
        .map(|(body, group)| {
            let m: sqs::WorkMessage =
                serde_json::from_str(body).unwrap_or_else(|e| panic!("not a work message ({e}): {body}"));
            (m.key, group.clone())
        })
        .collect();
    out.sort();
    out
}

impl Stack {
    /// Claims an event and stores its payload directly (no signature: the
    /// processor tests start after intake), never sent: its send lease given
    /// back, as after a failed send.
    pub async fn claim(
        &self,
        provider: &str,
        endpoint: &str,
        event_id: &str,
        event_type: Option<&str>,
        body: &[u8],
    ) -> EventKey {
        let now_ms = now_s() * 1000;
        self.claim_as("t1", provider, endpoint, event_id, event_type, body, now_ms).await
    }

    /// As [`Stack::claim`], for `tenant` (whatever the endpoint's
    /// configuration says), its send lease already lapsed.
    pub async fn claim_in(
        &self,
        tenant: &str,
        provider: &str,
        endpoint: &str,
        event_id: &str,
        body: &[u8],
    ) -> EventKey {
        let lapsed = now_s() * 1000 - 1_000;
        self.claim_as(tenant, provider, endpoint, event_id, None, body, lapsed).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn claim_as(
        &self,
        tenant: &str,
        provider: &str,
        endpoint: &str,
        event_id: &str,
        event_type: Option<&str>,
        body: &[u8],
        lease_until_ms: i64,
    ) -> EventKey {
        let key = EventKey::new(provider, endpoint, event_id);
        let hash = hookledger::identity::payload_hash(body);
        let now_ms = now_s() * 1000;
        let event = NewEvent {
            key: key.clone(),
            provider: provider.into(),
            endpoint: endpoint.into(),
            tenant: tenant.into(),
            event_id: event_id.into(),
            event_type: event_type.map(str::to_owned),
            payload_hash: hash.clone(),
            content_hash: hash.clone(),
            received_at_ms: now_ms,
            expires_at: now_s() + 86_400,
            shard: key.shard(16),
            send: SendLease { token: "test".into(), until_ms: lease_until_ms },
            via: hookledger::ledger::Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        };
        let ledger = self.ledger();
        ledger.claim(&event, body).await.unwrap();
        // Never sent: as the intake does when its send fails, the send lease
        // is given back (a lease held to its end means handed over).
        Ledger::release_send_lease(&ledger, &key, &event.send).await.unwrap();
        key
    }

    pub async fn state(&self, pk: &str) -> Option<HashMap<String, AttributeValue>> {
        self.ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.into()))
            .key("sk", AttributeValue::S("state".into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
    }

    /// The item at (`pk`, `sk`), read consistently.
    pub async fn get_item(&self, pk: &str, sk: &str) -> Option<HashMap<String, AttributeValue>> {
        self.ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.into()))
            .key("sk", AttributeValue::S(sk.into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
    }

    pub async fn record(&self, key: &EventKey) -> HashMap<String, AttributeValue> {
        self.ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(key.as_str().into()))
            .key("sk", AttributeValue::S("meta".into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .unwrap()
    }

    /// An SNS topic for notifications with an SQS queue subscribed to it,
    /// so tests can count what was published.
    pub async fn notify_topic(&self) -> (String, String) {
        let sns = aws_sdk_sns::Client::new(&self.aws);
        let name = format!("notify-{}", uuid::Uuid::new_v4().simple());
        let topic = sns.create_topic().name(&name).send().await.unwrap().topic_arn.unwrap();
        let q = sqs::create_queue(&self.sqs, &name).await.unwrap();
        let arn = self
            .sqs
            .get_queue_attributes()
            .queue_url(&q)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
            .clone();
        sns.subscribe().topic_arn(&topic).protocol("sqs").endpoint(arn).send().await.unwrap();
        (topic, q)
    }

    /// Drains any queue; returns the message bodies.
    pub async fn drain(&self, queue_url: &str) -> Vec<String> {
        self.drain_grouped(queue_url).await.into_iter().map(|(body, _)| body).collect()
    }

    /// Drains any queue; returns each message's body with its
    /// `MessageGroupId` (the tenant it was sent for).
    pub async fn drain_grouped(&self, queue_url: &str) -> Vec<(String, Option<String>)> {
        use aws_sdk_sqs::types::MessageSystemAttributeName;
        let mut messages = Vec::new();
        loop {
            let out = self
                .sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .visibility_timeout(60)
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .send()
                .await
                .unwrap();
            let msgs = out.messages.unwrap_or_default();
            if msgs.is_empty() {
                return messages;
            }
            messages.extend(msgs.into_iter().filter_map(|m| {
                let group = m.attributes.as_ref().and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
                let group = group.cloned();
                m.body.map(|body| (body, group))
            }));
        }
    }

    /// The dispatcher the processor function's delivery queue source uses.
    pub fn dispatcher(&self) -> hookledger::wiring::LiveDispatcher {
        hookledger::wiring::dispatcher(self.ddb.clone(), aws_sdk_sns::Client::new(&self.aws), self.table.clone())
    }

    pub fn processor(
        &self,
        settings: ProcessorSettings,
        source: Option<Arc<dyn SubscriptionSource>>,
        topic: Option<String>,
    ) -> hookledger::wiring::LiveProcessor {
        let dispatcher =
            hookledger::wiring::dispatcher(self.ddb.clone(), aws_sdk_sns::Client::new(&self.aws), self.table.clone());
        hookledger::wiring::processor(
            self.ledger(),
            hookledger_app::reference_registry(source, topic),
            Some(dispatcher),
            settings,
        )
    }

    pub async fn map_customer(&self, customer: &str, account: &str) {
        self.map_customer_in("t1", customer, account).await;
    }

    pub async fn map_customer_in(&self, tenant: &str, customer: &str, account: &str) {
        map_subject(&self.ddb, &self.table, "stripe", tenant, customer, account).await.unwrap();
    }
}

pub use hookledger_cli::map_subject;

/// The reference app's re-checks over `source` (none without one).
pub fn rechecks(source: Option<Arc<dyn SubscriptionSource>>) -> hookledger::projection::recheck::Rechecks {
    hookledger_app::reference_registry(source, None).rechecks()
}

/// The reference app as the functions register it from a wiring.
pub fn reference(wiring: &hookledger::wiring::Wiring) -> hookledger::projection::Registry {
    hookledger_app::reference_registry(wiring.subscriptions().unwrap_or_else(|e| panic!("{e}")), wiring.notify_topic())
}

pub fn n(item: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {name} in {item:?}"))
}

pub fn fast_settings() -> ProcessorSettings {
    ProcessorSettings {
        lease_ms: 30_000,
        max_attempts: 5,
        backoff: Backoff { base_ms: 100, max_ms: 1_000 },
        index_shards: 16,
        ..ProcessorSettings::default()
    }
}

pub fn s(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

/// Emulates Lambda's SQS event source mapping for `app` until the queue stays
/// empty for `idle_polls` polls (or `max` elapses): batches of up to 10,
/// partial failures stay on the queue, successes are deleted.
pub async fn run_processor(
    stack: &Stack,
    app: Arc<processor::handler::App>,
    idle_polls: u32,
    max: std::time::Duration,
) {
    use aws_lambda_events::event::sqs::SqsEvent;
    let deadline = std::time::Instant::now() + max;
    let mut idle = 0;
    while std::time::Instant::now() < deadline && idle < idle_polls {
        let out = stack
            .sqs
            .receive_message()
            .queue_url(&stack.queue_url)
            .max_number_of_messages(10)
            .visibility_timeout(30)
            .send()
            .await
            .unwrap();
        let msgs = out.messages.unwrap_or_default();
        if msgs.is_empty() {
            idle += 1;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        }
        idle = 0;
        let records: Vec<serde_json::Value> = msgs
            .iter()
            .map(|m| serde_json::json!({"messageId": m.message_id, "receiptHandle": m.receipt_handle, "body": m.body, "eventSource": "aws:sqs"}))
            .collect();
        let event: SqsEvent = serde_json::from_value(serde_json::json!({ "Records": records })).unwrap();
        let resp = processor::handler::handle(
            app.clone(),
            lambda_runtime::LambdaEvent::new(event, lambda_runtime::Context::default()),
        )
        .await
        .unwrap();
        for m in &msgs {
            let id = m.message_id.clone().unwrap();
            if !resp.batch_item_failures.iter().any(|f| f.item_identifier == id) {
                stack
                    .sqs
                    .delete_message()
                    .queue_url(&stack.queue_url)
                    .receipt_handle(m.receipt_handle.clone().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }
}

impl Stack {
    pub fn app(
        &self,
        settings: ProcessorSettings,
        source: Option<Arc<dyn SubscriptionSource>>,
    ) -> Arc<processor::handler::App> {
        Arc::new(processor::handler::App {
            processor: std::sync::Arc::new(self.processor(settings, source, None)),
            queue: std::sync::Arc::new(hookledger::adapters::sqs::SqsQueue::new(self.sqs.clone(), &self.queue_url)),
            dispatcher: std::sync::Arc::new(self.dispatcher()),
        })
    }

    pub fn reconciler(
        &self,
        settings: hookledger::config::ReconcilerSettings,
        source: Option<Arc<dyn SubscriptionSource>>,
    ) -> hookledger::wiring::LiveReconciler {
        let dispatcher =
            hookledger::wiring::dispatcher(self.ddb.clone(), aws_sdk_sns::Client::new(&self.aws), self.table.clone());
        hookledger::reconciler::Reconciler::new(
            self.ledger(),
            SqsQueue::new(self.sqs.clone(), &self.queue_url),
            Some(dispatcher),
            rechecks(source),
            settings,
        )
    }

    /// Runs the CLI in-process against this stack; returns (ok, output).
    /// The operator audit log of the last day, oldest first (`audit-log --json`).
    pub async fn audit_log(&self) -> Vec<serde_json::Value> {
        let (r, out) = self.cli(&["audit-log", "--since", "1d", "--limit", "1000", "--json"]).await;
        r.unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["entries"].as_array().cloned().unwrap_or_default()
    }

    pub async fn cli(&self, args: &[&str]) -> (Result<(), String>, String) {
        // The stack's shards (16), as its intake and ledger use them.
        let mut argv = vec!["hookledger", "--table", &self.table, "--queue-url", &self.queue_url, "--shards", "16"];
        argv.extend_from_slice(args);
        let mut out: Vec<u8> = Vec::new();
        let r = hookledger_cli::run(argv, &mut out).await.map_err(|e| e.to_string());
        (r, String::from_utf8(out).unwrap())
    }
}

/// PROCESSING(token) → RETRYABLE due at `next_at_ms` (an infrastructure
/// fault: no failure counted). `false`: fenced.
pub async fn retry(
    ledger: &DynamoLedger,
    key: &hookledger::identity::EventKey,
    token: &str,
    next_at_ms: i64,
    code: &str,
    message: &str,
) -> bool {
    use hookledger::ports::WorkLedger;
    let exit = hookledger::ledger::Exit::Retry { next_at_ms, code, message, failure: false };
    ledger.leave(key, token, &exit, next_at_ms).await.unwrap()
}

/// The stored copies of every payload in `items`: (record key, decoded body),
/// one per record that carries its payload and one per payload item.
pub fn payload_copies(items: &[HashMap<String, AttributeValue>]) -> Vec<(String, Vec<u8>)> {
    use hookledger::adapters::dynamodb::payload::body;
    items
        .iter()
        .filter(|i| s(i, "sk") == "meta" || s(i, "sk").starts_with("payload#"))
        .filter_map(|i| body(i).map(|b| (s(i, "pk"), b)))
        .collect()
}
