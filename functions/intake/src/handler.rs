//! Translates API Gateway (HTTP API, payload v2) requests into intake
//! requests and intake answers into HTTP responses. Nothing more.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use hookledger::intake::{Intake, IntakeRequest};
use hookledger::telemetry::{FailureKind, FunctionError};
use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpResponse;
use lambda_http::request::RequestContext;
use lambda_http::{Body, LambdaEvent, Request, RequestExt, Response};
use serde_json::value::RawValue;

/// The intake as deployed; built by `hookledger::wiring::Wiring::intake`.
pub type App = hookledger::wiring::LiveIntake;

/// `/webhooks/{endpoint}`: the path parameter when API Gateway routed it,
/// else the segment after `webhooks` in the raw path (function URLs, local).
pub fn endpoint_name(req: &Request) -> Option<String> {
    if let Some(name) = req.path_parameters_ref().and_then(|p| p.first("endpoint")) {
        return Some(name.to_owned());
    }
    let segments: Vec<&str> = req.uri().path().split('/').filter(|s| !s.is_empty()).collect();
    let at = segments.iter().rposition(|s| *s == "webhooks")?;
    match &segments[at + 1..] {
        [name] => Some((*name).to_owned()),
        _ => None,
    }
}

fn request_id(req: &Request) -> String {
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.request_id.clone().unwrap_or_default(),
        _ => req.lambda_context_ref().map(|c| c.request_id.clone()).unwrap_or_default(),
    }
}

pub async fn handle<L, Q>(intake: &Intake<L, Q>, req: Request) -> Result<Response<Body>, FunctionError>
where
    L: hookledger::ports::Ledger,
    Q: hookledger::ports::WorkQueue,
{
    let name = endpoint_name(&req).unwrap_or_default();
    let request_id = request_id(&req);
    let answer = intake
        .handle(IntakeRequest {
            query: req.uri().query().unwrap_or(""),
            endpoint: &name,
            method: req.method(),
            headers: req.headers(),
            body: req.body().as_ref(),
            now: intake.now(),
            request_id: &request_id,
        })
        .await;
    let (content_type, body) = answer.body();
    let mut resp = Response::builder()
        .status(answer.status)
        .header("content-type", content_type)
        .header("x-content-type-options", "nosniff");
    if let Some(secs) = answer.retry_after {
        resp = resp.header("retry-after", secs.to_string());
    }
    if let Some((name, value)) = &answer.header {
        resp = resp.header(*name, value.as_str());
    }
    resp.body(Body::Text(body)).map_err(|e| FunctionError::new(FailureKind::Response, e))
}

#[derive(serde::Deserialize)]
struct Encoding<'a> {
    #[serde(rename = "isBase64Encoded", default)]
    base64: bool,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
}

/// Whether an API Gateway event says its body is base64 and the body is not.
pub fn body_not_base64(event: &str) -> bool {
    serde_json::from_str::<Encoding<'_>>(event)
        .is_ok_and(|e| e.base64 && e.body.is_some_and(|b| STANDARD.decode(b.as_bytes()).is_err()))
}

/// The function's service over the raw API Gateway event. lambda_http's own
/// conversion panics on a body that claims base64 and is not (the sender
/// would see a 500 and retry it for days), so that is answered here first,
/// 400 `body_not_base64`; every other event becomes a request for
/// [`handle`], and its answer an HTTP API (payload v2) response.
pub async fn serve<L, Q>(
    intake: &Intake<L, Q>,
    event: LambdaEvent<Box<RawValue>>,
) -> Result<ApiGatewayV2httpResponse, FunctionError>
where
    L: hookledger::ports::Ledger,
    Q: hookledger::ports::WorkQueue,
{
    let LambdaEvent { payload, context } = event;
    if body_not_base64(payload.get()) {
        tracing::warn!(code = "body_not_base64", "refused: the event says its body is base64 and it is not");
        let answer = Response::builder()
            .status(400)
            .header("content-type", "application/json")
            .body(Body::Text(
                serde_json::json!({
                    "code": "body_not_base64",
                    "detail": "the request is marked base64-encoded and its body is not valid base64"
                })
                .to_string(),
            ))
            .map_err(|e| FunctionError::new(FailureKind::Response, e))?;
        return Ok(http_api_response(answer));
    }
    let req = lambda_http::request::from_str(payload.get())
        // serde's message may quote the event; only its position is kept.
        .map_err(|e| {
            FunctionError::new(
                FailureKind::BadEvent,
                format!("not an API Gateway event (line {}, column {})", e.line(), e.column()),
            )
        })?
        .with_lambda_context(context);
    Ok(http_api_response(handle(intake, req).await?))
}

/// An HTTP API (payload v2) response for API Gateway.
pub fn http_api_response(resp: Response<Body>) -> ApiGatewayV2httpResponse {
    let (parts, body) = resp.into_parts();
    let mut out = ApiGatewayV2httpResponse::default();
    out.status_code = i64::from(parts.status.as_u16());
    out.is_base64_encoded = matches!(body, Body::Binary(_));
    out.headers = parts.headers;
    out.body = match body {
        Body::Empty => None,
        other => Some(other),
    };
    out
}
