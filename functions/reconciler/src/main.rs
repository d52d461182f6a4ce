//! Reconciler Lambda: EventBridge schedule → one bounded reconciliation run.
//! `main` only initialises; each execution environment's first invocation
//! records the index shard count first (a lower count than the table's is refused).
// The run's future nests deeply (phases, batch reads, retries).
#![recursion_limit = "256"]

use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::dynamodb::shards::{self, ShardsError};
use hookledger::adapters::timeouts::Timeouts;
use lambda_runtime::{Diagnostic, Error, service_fn};
use reconciler::handler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("reconciler")?;

    // The SDK's defaults within the reconciler's timeouts (a stalled call fails
    // in seconds, not at the Lambda timeout); its HTTPS client loads the root
    // certificates on the first AWS request, not in every SDK client's constructor.
    let invalid = |e: &hookledger::config::ConfigError| tracing::error!(error = %e, "invalid configuration");
    let wiring = hookledger::wiring::Wiring::from_env(Timeouts::RECONCILER).await.inspect_err(invalid)?;
    // The application's re-checks, registered here (beside its projections).
    let registry =
        hookledger_app::reference_registry(wiring.subscriptions().inspect_err(invalid)?, wiring.notify_topic());
    let app = handler::from_wiring(&wiring, registry.rechecks()).inspect_err(invalid)?;
    let ledger = wiring.ledger().inspect_err(invalid)?;
    let recorded = tokio::sync::OnceCell::new();
    let (app, ledger, recorded) = (&app, &ledger, &recorded);
    lambda_runtime::run(service_fn(move |event| async move {
        // Once per execution environment, before its first run (init makes
        // no AWS call); a refusal fails every invocation until it is fixed.
        recorded.get_or_try_init(|| record_shards(ledger)).await?;
        let summary = handler::handle(app, event).await;
        hookledger::telemetry::flush(metrics);
        summary.map_err(Diagnostic::from)
    }))
    .await
}

/// Records the index shard count on the table; a count below the recorded
/// one is refused (the items in the shards above it would never be queried
/// again): `hookledger::adapters::dynamodb::shards`.
async fn record_shards(ledger: &DynamoLedger) -> Result<(), Diagnostic> {
    match shards::record(ledger).await {
        Ok(r) => {
            if r.previous != Some(r.configured) {
                tracing::info!(configured = r.configured, previous = ?r.previous, "index shard count recorded");
            }
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "index shard count not recorded");
            let error_type = match e {
                ShardsError::Lowered { .. } => "Hookledger.IndexShardsLowered",
                ShardsError::Unavailable(_) => "Hookledger.IndexShardsUnchecked",
            };
            Err(Diagnostic { error_type: error_type.to_owned(), error_message: e.to_string() })
        }
    }
}
