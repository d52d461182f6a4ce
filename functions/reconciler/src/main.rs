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
    let aws = aws_config::from_env().http_client(hookledger::adapters::https::sdk_http_client()).load().await;
    let app = handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?;
    let app = &app;
    lambda_runtime::run(service_fn(move |event| async move {
        let summary = handler::handle(app, event).await;
        hookledger::telemetry::flush(metrics);
        summary
    }))
    .await
}
