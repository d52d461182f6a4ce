//! Intake Lambda: API Gateway HTTP API → verify, claim, enqueue, answer.
//! `main` only initialises; the handler lives in `handler.rs`.

#![recursion_limit = "256"]

use hookledger::adapters::timeouts::Timeouts;
use intake::handler;
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when Lambda asks for them (AWS_LAMBDA_LOG_FORMAT=JSON).
    lambda_http::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("intake")?;

    // The SDK's defaults within the intake's timeouts (a stalled call fails
    // in seconds, not at the Lambda timeout); its HTTPS client loads the root
    // certificates on the first AWS request, not in every SDK client's constructor.
    let invalid = |e: &hookledger::config::ConfigError| tracing::error!(error = %e, "invalid configuration");
    let wiring = hookledger::wiring::Wiring::from_env(Timeouts::INTAKE).await.inspect_err(invalid)?;
    let app = wiring.intake().await.inspect_err(invalid)?;
    let app = &app;

    // The raw event first: see `handler::serve`.
    lambda_http::lambda_runtime::run(service_fn(move |event| async move {
        let resp = handler::serve(app, event).await;
        hookledger::telemetry::flush(metrics);
        resp
    }))
    .await
}
