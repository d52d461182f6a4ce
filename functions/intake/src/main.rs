//! Intake Lambda: API Gateway HTTP API → verify, claim, enqueue, answer.
//! `main` only initialises; the handler lives in `handler.rs`.

use intake::handler;
use lambda_http::{Error, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // JSON logs when Lambda asks for them (AWS_LAMBDA_LOG_FORMAT=JSON).
    lambda_http::tracing::init_default_subscriber();
    let metrics = hookledger::telemetry::init_metrics("intake")?;

    // The SDK's defaults; its HTTPS client loads the root certificates on the
    // first AWS request, not in every SDK client's constructor.
    let aws = aws_config::from_env().http_client(hookledger::adapters::https::sdk_http_client()).load().await;
    let app = handler::from_env(&aws).await.inspect_err(|e| tracing::error!(error = %e, "invalid configuration"))?;
    let app = &app;

    lambda_http::run(service_fn(move |req| async move {
        let resp = handler::handle(app, req).await;
        hookledger::telemetry::flush(metrics);
        resp
    }))
    .await
}
