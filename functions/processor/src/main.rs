//! Processor Lambda: SQS event source → lease, project, commit, dispatch;
//! partial batch responses (`ReportBatchItemFailures`). `main` only initialises.

use std::sync::Arc;

use lambda_runtime::{Error, service_fn};
use processor::handler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("processor")?;

    // The SDK's defaults; its HTTPS client loads the root certificates on the
    // first AWS request, not in every SDK client's constructor.
    let aws = aws_config::from_env().http_client(hookledger::adapters::https::sdk_http_client()).load().await;
    let app =
        Arc::new(handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?);

    lambda_runtime::run(service_fn(move |event| {
        let app = app.clone();
        async move {
            let resp = handler::handle(app, event).await;
            hookledger::telemetry::flush(metrics);
            resp
        }
    }))
    .await
}
