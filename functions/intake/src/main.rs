//! Intake Lambda: API Gateway HTTP API → verify, claim, enqueue, answer.
//! `main` only initialises; the handler lives in `handler.rs`.

use intake::handler;
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when Lambda asks for them (AWS_LAMBDA_LOG_FORMAT=JSON).
    lambda_http::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("intake")?;

    let aws = aws_config::load_from_env().await;
    let app = handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?;
    let app = &app;

    lambda_http::run(service_fn(move |req| async move {
        let resp = handler::handle(app, req).await;
        hookledger::telemetry::flush(metrics);
        resp
    }))
    .await
}
