//! Reconciler Lambda: EventBridge schedule → one bounded reconciliation run.
//! `main` only initialises.
// The run's future nests deeply (phases, batch reads, retries).
#![recursion_limit = "256"]

use lambda_runtime::{Error, service_fn};
use reconciler::handler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("reconciler")?;

    // The SDK's defaults; its HTTPS client loads the root certificates on the
    // first AWS request, not in every SDK client's constructor.
    let invalid = |e: &hookledger::config::ConfigError| tracing::error!(error = %e, "invalid configuration");
    let wiring = hookledger::wiring::Wiring::from_env().await.inspect_err(invalid)?;
    let app = handler::from_wiring(&wiring).inspect_err(invalid)?;
    let app = &app;
    lambda_runtime::run(service_fn(move |event| async move {
        let summary = handler::handle(app, event).await;
        hookledger::telemetry::flush(metrics);
        summary
    }))
    .await
}
