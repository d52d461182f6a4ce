//! Runs one bounded reconciliation per scheduled invocation (EventBridge),
//! then the scheduled backfills (`HOOKLEDGER_BACKFILL`) in the time left,
//! stopping a safety margin before the Lambda's deadline, and returns the
//! run summaries. An invocation whose input is `{"task": "delivery-health"}`
//! (its own schedule) reads each route destination's health instead and
//! writes it as metrics (`hookledger::outbox::health`).

use std::time::{Duration, SystemTime};

use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::clock::Ambient;
use hookledger::config::ConfigError;
use hookledger::outbox::Deliveries;
use hookledger::outbox::health::Health;
use hookledger::projection::recheck::Rechecks;
use hookledger::reconciler::Summary;
use hookledger::routes::Limits;
use hookledger::telemetry::FunctionError;
use hookledger::wiring::{LiveReconciler, Wiring};
use lambda_runtime::LambdaEvent;

pub use crate::backfills::Backfills;

pub struct App {
    pub reconciler: LiveReconciler,
    pub backfills: Backfills,
    pub ambient: Ambient,
    /// Route deliveries (the health task reads them) and each destination's limits.
    pub deliveries: Deliveries<DynamoOutbox>,
    pub destinations: Vec<(String, Limits)>,
}

/// What one invocation did.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum Output {
    Run {
        #[serde(flatten)]
        reconciliation: Box<Summary>,
        backfills: Vec<crate::backfills::Ran>,
    },
    Health {
        health: Vec<Health>,
    },
}

/// The most items a health census reads per partition.
pub const HEALTH_READS: usize = 10_000;

/// The input of the health task's schedule.
pub const HEALTH_TASK: &str = "delivery-health";

/// Time kept free at the end of an invocation.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// The reconciler and the scheduled backfills from the composition root
/// (settings: `hookledger::config::reconciler_settings_from`), with the
/// application's re-checks (`main.rs` registers them).
pub fn from_wiring(wiring: &Wiring, rechecks: Rechecks) -> Result<App, ConfigError> {
    Ok(App {
        reconciler: wiring.reconciler(rechecks)?,
        backfills: Backfills::new(wiring.clone())?,
        ambient: wiring.ambient().clone(),
        deliveries: wiring.deliveries()?,
        destinations: wiring.settings.routes.destinations().iter().map(|d| (d.name.clone(), d.limits)).collect(),
    })
}

/// Each route destination's health, written as metrics; a destination
/// whose census fails is logged and left out (the next run reads it).
pub async fn health(app: &App) -> Vec<Health> {
    let mut out = Vec::new();
    for (name, limits) in &app.destinations {
        match app.deliveries.health(name, *limits, app.ambient.now_ms(), HEALTH_READS).await {
            Ok(h) => {
                h.record();
                out.push(h);
            }
            Err(e) => tracing::warn!(destination = %name, error = %e, "destination health unread"),
        }
    }
    hookledger::outbox::health::record_oldest(&out);
    out
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
    if event.payload.get("task").and_then(|t| t.as_str()) == Some(HEALTH_TASK) {
        return Ok(Output::Health { health: health(app).await });
    }
    // Lambda's deadline is wall time; the run's is on the monotonic clock.
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(app.ambient.now_ms().max(0) as u64);
    let remaining = event.context.deadline().duration_since(now).unwrap_or_default();
    let deadline = app.ambient.instant() + budget(remaining);
    tracing::info!(
        remaining_ms = remaining.as_millis() as u64,
        budget_ms = budget(remaining).as_millis() as u64,
        "reconciler invoked"
    );
    let now_ms = app.ambient.now_ms();
    let reconciliation = app.reconciler.run(now_ms, deadline).await;
    let backfills = app.backfills.run(now_ms, deadline).await;
    Ok(Output::Run { reconciliation: Box::new(reconciliation), backfills })
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
}
