//! Runs one bounded reconciliation per scheduled invocation (EventBridge),
//! then the scheduled backfills (`HOOKLEDGER_BACKFILL`) in the time left,
//! stopping a safety margin before the Lambda's deadline, and returns the
//! run summaries.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::https::lazy_subscription_source;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::config::ReconcilerSettings;
use hookledger::config::{self, ConfigError};
use hookledger::outbox::Dispatcher;
use hookledger::reconciler::{Reconciler, Summary};
use hookledger::telemetry::FunctionError;
use lambda_runtime::LambdaEvent;

pub use crate::backfills::Backfills;

pub struct App {
    pub reconciler: Reconciler<SqsQueue>,
    pub backfills: Backfills,
}

/// What one invocation did.
#[derive(Debug, serde::Serialize)]
pub struct Output {
    #[serde(flatten)]
    pub reconciliation: Summary,
    pub backfills: Vec<crate::backfills::Ran>,
}

/// Time kept free at the end of an invocation.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Reconciler settings (`HOOKLEDGER_RECONCILE_MAX_ITEMS`, `HOOKLEDGER_REDRIVE_BACKOFF_SECS`,
/// `HOOKLEDGER_DRIFT_INTERVAL_SECS`, `HOOKLEDGER_RETENTION_DAYS`).
pub fn settings_from(get: impl Fn(&str) -> Option<String>) -> Result<ReconcilerSettings, ConfigError> {
    let number =
        |name: &'static str, default: i64, min: i64, max: i64| config::env_number(&get, name, default, min, max);
    Ok(ReconcilerSettings {
        max_items: number("HOOKLEDGER_RECONCILE_MAX_ITEMS", 500, 1, 100_000)? as usize,
        redrive_backoff_ms: number("HOOKLEDGER_REDRIVE_BACKOFF_SECS", 300, 1, 86_400)? * 1000,
        drift_interval_ms: number("HOOKLEDGER_DRIFT_INTERVAL_SECS", 3600, 0, 30 * 86_400)? * 1000,
        outbox_grace_ms: 60_000,
        retention_days: number("HOOKLEDGER_RETENTION_DAYS", 30, 4, 3650)? as u32,
        lookahead_ms: 0,
    }
    .with_lookahead_for(&config::processor_settings_from(&get)?))
}

pub async fn from_env(aws: &aws_config::SdkConfig) -> Result<App, ConfigError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let table = env("HOOKLEDGER_TABLE").ok_or(ConfigError::Missing("HOOKLEDGER_TABLE"))?;
    let queue_url = env("HOOKLEDGER_QUEUE_URL").ok_or(ConfigError::Missing("HOOKLEDGER_QUEUE_URL"))?;
    let shards = config::processor_settings_from(env)?.index_shards;
    let settings = settings_from(env)?;
    // The Stripe key is read, and its client built, by the first drift check.
    let source = lazy_subscription_source(env, aws)?;
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let dispatcher = Dispatcher::new(ddb.clone(), aws_sdk_sns::Client::new(aws), table.clone());
    let ledger = DynamoLedger::new(ddb, table).with_shards(shards);
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(aws), queue_url);
    let backfills = Backfills::from_env(env, aws, ledger.clone(), queue.clone(), settings.retention_days)?;
    Ok(App { reconciler: Reconciler::new(ledger, queue, Some(dispatcher), source, settings), backfills })
}

/// Budget when the invocation carries no usable deadline (some emulators
/// send none); Lambda always does.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

/// The time a run may use: the remaining invocation time less a margin (half
/// of it when the invocation is short; [`DEFAULT_BUDGET`] without a deadline).
pub fn budget(remaining: Duration) -> Duration {
    if remaining.is_zero() {
        DEFAULT_BUDGET
    } else if remaining > DEADLINE_MARGIN * 2 {
        remaining - DEADLINE_MARGIN
    } else {
        remaining / 2
    }
}

/// Runs one reconciliation. The run isolates its failures (counted in the
/// summary and the `reconciler_errors` metric), so the invocation succeeds
/// and the schedule does not retry it; the next scheduled run continues.
pub async fn handle(app: &App, event: LambdaEvent<serde_json::Value>) -> Result<Output, FunctionError> {
    let remaining = event.context.deadline().duration_since(SystemTime::now()).unwrap_or_default();
    let deadline = Instant::now() + budget(remaining);
    tracing::info!(
        remaining_ms = remaining.as_millis() as u64,
        budget_ms = budget(remaining).as_millis() as u64,
        "reconciler invoked"
    );
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    let reconciliation = app.reconciler.run(now_ms, deadline).await;
    let backfills = app.backfills.run(now_ms, deadline).await;
    Ok(Output { reconciliation, backfills })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_keeps_a_margin_before_the_deadline() {
        assert_eq!(budget(Duration::from_secs(120)), Duration::from_secs(115));
        assert_eq!(budget(Duration::from_secs(6)), Duration::from_secs(3));
        assert_eq!(budget(Duration::ZERO), DEFAULT_BUDGET);
    }

    #[test]
    fn settings_have_defaults_and_bounds() {
        let s = settings_from(|_| None).unwrap();
        assert_eq!((s.max_items, s.redrive_backoff_ms, s.drift_interval_ms), (500, 300_000, 3_600_000));
        let bad = settings_from(|k| (k == "HOOKLEDGER_RECONCILE_MAX_ITEMS").then(|| "0".to_owned()));
        assert!(bad.unwrap_err().to_string().contains("HOOKLEDGER_RECONCILE_MAX_ITEMS"));
    }
}
