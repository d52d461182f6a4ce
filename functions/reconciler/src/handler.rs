//! Runs one bounded reconciliation per scheduled invocation (EventBridge),
//! stopping a safety margin before the Lambda's deadline, and returns the
//! run summary.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::secrets::AwsSecretResolver;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::config::{self, ConfigError};
use hookledger::outbox::Dispatcher;
use hookledger::reconciler::{Reconciler, ReconcilerSettings, Summary};
use lambda_runtime::{Error, LambdaEvent};

pub type App = Reconciler<SqsQueue>;

/// Time kept free at the end of an invocation.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Reconciler settings (`HOOKLEDGER_RECONCILE_MAX_ITEMS`, `HOOKLEDGER_REDRIVE_BACKOFF_SECS`,
/// `HOOKLEDGER_DRIFT_INTERVAL_SECS`, `HOOKLEDGER_RETENTION_DAYS`).
pub fn settings_from(get: impl Fn(&str) -> Option<String>) -> Result<ReconcilerSettings, ConfigError> {
    let number = |name: &'static str, default: i64, min: i64, max: i64| -> Result<i64, ConfigError> {
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
    };
    Ok(ReconcilerSettings {
        max_items: number("HOOKLEDGER_RECONCILE_MAX_ITEMS", 500, 1, 100_000)? as usize,
        redrive_backoff_ms: number("HOOKLEDGER_REDRIVE_BACKOFF_SECS", 300, 1, 86_400)? * 1000,
        drift_interval_ms: number("HOOKLEDGER_DRIFT_INTERVAL_SECS", 3600, 0, 30 * 86_400)? * 1000,
        outbox_grace_ms: 60_000,
        retention_days: number("HOOKLEDGER_RETENTION_DAYS", 30, 4, 3650)? as u32,
    })
}

pub async fn from_env(aws: &aws_config::SdkConfig) -> Result<App, ConfigError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let table = env("HOOKLEDGER_TABLE").ok_or(ConfigError::Missing("HOOKLEDGER_TABLE"))?;
    let queue_url = env("HOOKLEDGER_QUEUE_URL").ok_or(ConfigError::Missing("HOOKLEDGER_QUEUE_URL"))?;
    let shards = config::processor_settings_from(env)?.index_shards;
    let settings = settings_from(env)?;
    let resolver = AwsSecretResolver::new(aws_sdk_ssm::Client::new(aws));
    let source = hookledger::adapters::stripe::source_from_env(env, &resolver).await?;
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let dispatcher = Dispatcher::new(ddb.clone(), aws_sdk_sns::Client::new(aws), table.clone());
    let ledger = DynamoLedger::new(ddb, table).with_shards(shards);
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(aws), queue_url);
    Ok(Reconciler::new(ledger, queue, Some(dispatcher), source, settings))
}

pub async fn handle(app: &App, event: LambdaEvent<serde_json::Value>) -> Result<Summary, Error> {
    let remaining = event.context.deadline().duration_since(SystemTime::now()).unwrap_or_default();
    let deadline = Instant::now() + remaining.saturating_sub(DEADLINE_MARGIN);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    Ok(app.run(now_ms, deadline).await?)
}
