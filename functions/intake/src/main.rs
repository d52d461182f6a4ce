//! Intake Lambda: API Gateway HTTP API → verify, claim, enqueue, answer.
//! `main` only initialises; the handler lives in `handler.rs`.

use intake::handler;
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when Lambda asks for them (AWS_LAMBDA_LOG_FORMAT=JSON).
    lambda_http::tracing::init_default_subscriber();
    let metrics = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(std::env::var("HOOKLEDGER_METRICS_NAMESPACE").unwrap_or_else(|_| "Hookledger".into()))
        .with_dimension("function", "intake")
        .init()?;
    hookledger::telemetry::describe();

    let aws = aws_config::load_from_env().await;
    let app = handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?;
    let app = &app;

    lambda_http::run(service_fn(move |req| async move {
        let resp = handler::handle(app, req).await;
        if let Err(e) = metrics.flush(std::io::stdout()) {
            tracing::warn!(error = %e, "metrics flush failed");
        }
        resp
    }))
    .await
}
