//! Processor Lambda: SQS event source → lease, project, commit, dispatch;
//! partial batch responses (`ReportBatchItemFailures`). `main` only initialises.

use std::sync::Arc;

use hookledger::adapters::timeouts::Timeouts;
use lambda_runtime::{Error, service_fn};
use processor::handler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("processor")?;

    // Every setting and adapter from the composition root, every call within
    // the processor's timeouts; the SDK's HTTPS client loads the root
    // certificates on the first AWS request.
    let invalid = |e: &hookledger::config::ConfigError| tracing::error!(error = %e, "invalid configuration");
    let wiring = hookledger::wiring::Wiring::from_env(Timeouts::PROCESSOR).await.inspect_err(invalid)?;
    // The application: its projections and re-checks, registered here.
    let registry =
        hookledger_app::reference_registry(wiring.subscriptions().inspect_err(invalid)?, wiring.notify_topic());
    let app = Arc::new(handler::from_wiring(&wiring, registry).inspect_err(invalid)?);

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
