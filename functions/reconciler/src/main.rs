//! Reconciler Lambda: EventBridge schedule → one bounded reconciliation run.
//! `main` only initialises.

use lambda_runtime::{Error, service_fn};
use reconciler::handler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let metrics = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(std::env::var("HOOKLEDGER_METRICS_NAMESPACE").unwrap_or_else(|_| "Hookledger".into()))
        .with_dimension("function", "reconciler")
        .init()?;
    hookledger::telemetry::describe();

    let aws = aws_config::load_from_env().await;
    let app = handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?;
    let app = &app;
    lambda_runtime::run(service_fn(move |event| async move {
        let summary = handler::handle(app, event).await;
        if let Err(e) = metrics.flush(std::io::stdout()) {
            tracing::warn!(error = %e, "metrics flush failed");
        }
        summary
    }))
    .await
}
