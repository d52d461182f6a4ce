//! Fault injection in the AWS SDK's HTTP client.
//!
//! `FaultClient` wraps a real smithy `HttpClient` (the one that talks to the
//! emulator) and, by [`Rule`], can at a chosen call:
//! - fail before sending: throttling, a 5xx, a connection reset (the SDK
//!   retries these);
//! - lose the acknowledgement of one attempt or of every attempt: the request
//!   reaches the service and commits, the caller sees an I/O error;
//! - delay the call;
//! - crash the invocation: the call's future never completes, and
//!   [`FaultPlan::run`] drops the invocation's future, so nothing after that
//!   point runs (cleanup included). Crash-before never sends; crash-after sends
//!   first, so the write commits and then the invocation dies.
//!
//! Interceptors are synchronous and cannot delay or hang a call, hence a
//! client wrapper. Every call is recorded in an ordered trace, per scope
//! ([`FaultPlan::scope`]), which also serves the benchmarks' request counts.
//!
//! DynamoDB absorbs a retried `TransactWriteItems` that carries the same
//! `ClientRequestToken`; the emulator ignores the token. With
//! [`FaultPlan::honour_transaction_tokens`] the wrapper answers a repeated
//! token as real DynamoDB does, without forwarding it; without it, the
//! emulator's behaviour stands. Code must be correct under both.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;

/// What to do to a matching call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Answer a throttling error without sending (the SDK retries it).
    Throttle,
    /// Answer HTTP 500 without sending (the SDK retries it).
    ServerError,
    /// Fail with a connection reset without sending (the SDK retries it).
    Reset,
    /// Send; the service commits; the response is lost (an I/O error).
    LoseAck,
    /// Wait, then send.
    Delay(Duration),
    /// The invocation dies at this call, before sending it.
    CrashBefore,
    /// The invocation dies at this call, after the service committed it.
    CrashAfter,
    /// A `TransactWriteItems` cancelled without sending, as DynamoDB cancels
    /// one that races another transaction on the same item (its first
    /// item's reason `TransactionConflict`; not retried by the SDK).
    TransactionConflict,
    /// A `BatchGetItem` answered 200 without sending, every requested key
    /// left in `UnprocessedKeys` (as DynamoDB answers a throttled read).
    Unprocessed,
}

impl Fault {
    pub fn label(self) -> &'static str {
        match self {
            Self::Throttle => "throttle",
            Self::ServerError => "5xx",
            Self::Reset => "reset",
            Self::LoseAck => "lost_ack",
            Self::Delay(_) => "delay",
            Self::CrashBefore => "crash_before",
            Self::CrashAfter => "crash",
            Self::TransactionConflict => "conflict",
            Self::Unprocessed => "unprocessed",
        }
    }
}

/// Which attempts of the matched operation the fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempts {
    /// Only the first attempt; the SDK's retry goes through.
    First,
    /// Every attempt, until the SDK gives up.
    Every,
}

/// A fault rule. Filters are ANDed; `nth` counts matching operations (not
/// attempts) from the moment the rule is armed, starting at 0.
#[derive(Debug, Clone)]
pub struct Rule {
    pub service: Option<&'static str>,
    pub operation: Option<String>,
    pub body_contains: Option<String>,
    pub nth: Option<usize>,
    /// Probability in [0, 1] that a matching operation is hit (seeded).
    pub probability: Option<f64>,
    pub attempts: Attempts,
    pub fault: Fault,
}

impl Rule {
    pub fn new(fault: Fault) -> Self {
        Self {
            service: None,
            operation: None,
            body_contains: None,
            nth: None,
            probability: None,
            attempts: Attempts::First,
            fault,
        }
    }

    /// The `n`th operation (0-based) of any service.
    pub fn at_call(fault: Fault, n: usize) -> Self {
        Self { nth: Some(n), ..Self::new(fault) }
    }

    pub fn on(mut self, service: &'static str, operation: &str) -> Self {
        self.service = Some(service);
        self.operation = Some(operation.to_owned());
        self
    }

    pub fn containing(mut self, needle: &str) -> Self {
        self.body_contains = Some(needle.to_owned());
        self
    }

    pub fn nth(mut self, n: usize) -> Self {
        self.nth = Some(n);
        self
    }

    pub fn every_attempt(mut self) -> Self {
        self.attempts = Attempts::Every;
        self
    }

    pub fn with_probability(mut self, p: f64) -> Self {
        self.probability = Some(p);
        self
    }

    fn filters(&self, call: &CallInfo) -> bool {
        self.service.is_none_or(|s| s == call.service)
            && self.operation.as_deref().is_none_or(|o| o == call.operation)
            && self.body_contains.as_deref().is_none_or(|n| call.body.contains(n))
    }
}

/// One HTTP attempt, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub scope: String,
    pub service: &'static str,
    pub operation: String,
    /// Index of the operation (all its attempts share it) since the plan's
    /// last [`FaultPlan::reset_counts`].
    pub op_index: usize,
    pub attempt: u32,
    pub fault: Option<&'static str>,
    /// The request's body as sent (the determinism test compares them).
    pub body: String,
}

struct CallInfo {
    service: &'static str,
    operation: String,
    body: String,
    invocation: String,
    attempt: u32,
}

/// An operation's index, the rules that hit it, and its chaos draw.
type OpFaults = (usize, Vec<usize>, Option<(Fault, Attempts)>);

#[derive(Default)]
struct State {
    rules: Vec<(Rule, usize)>,
    /// invocation id -> (op index, faults decided for this op per rule index,
    /// the chaos fault decided for it)
    ops: HashMap<String, OpFaults>,
    /// Seeded chaos: each invocation's nth operation draws its fault from a
    /// hash of (seed, invocation, n), so the draw does not depend on how
    /// concurrent invocations interleave.
    chaos: Option<Chaos>,
    /// Operations started per invocation (for the chaos draw).
    per_invocation: HashMap<u64, usize>,
    next_op: usize,
    trace: Vec<Call>,
    scope: String,
    rng: u64,
    invocations: u64,
    crashed: HashSet<u64>,
    crash_all: u64,
    honour_tokens: bool,
    committed_tokens: HashSet<String>,
    injected: HashMap<&'static str, u64>,
    /// Response body bytes per `service:operation` (Content-Length).
    response_bytes: std::collections::BTreeMap<String, u64>,
}

/// The shared, mutable plan behind every `FaultClient` built from it.
#[derive(Clone)]
pub struct FaultPlan {
    state: Arc<Mutex<State>>,
    crash: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::new(1)
    }
}

impl fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FaultPlan")
    }
}

tokio::task_local! {
    /// The invocation a call belongs to (set by [`FaultPlan::run`]).
    static INVOCATION: u64;
}

/// Seeded random faults at every call: `rates` are per-operation
/// probabilities, tried in order against one uniform draw.
#[derive(Debug, Clone)]
pub struct Chaos {
    pub seed: u64,
    pub rates: Vec<(Fault, Attempts, f64)>,
}

/// SplitMix64: a well-mixed hash of one word.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Chaos {
    fn draw(&self, invocation: u64, n: usize) -> Option<(Fault, Attempts)> {
        let h = mix(mix(self.seed ^ invocation.wrapping_mul(0x100_0000_01B3)) ^ n as u64);
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (fault, attempts, p) in &self.rates {
            acc += p;
            if u < acc {
                return Some((*fault, *attempts));
            }
        }
        None
    }
}

/// The invocation was dropped at a crash fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crashed;

impl FaultPlan {
    pub fn new(seed: u64) -> Self {
        let state = State { rng: seed.max(1), ..Default::default() };
        Self { state: Arc::new(Mutex::new(state)), crash: Arc::new(tokio::sync::watch::channel(0u64).0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a rule; its `nth` counts operations from now on.
    pub fn arm(&self, rule: Rule) {
        self.lock().rules.push((rule, 0));
    }

    pub fn disarm(&self) {
        let mut st = self.lock();
        st.rules.clear();
        st.chaos = None;
    }

    /// Seeded random faults on every call of an invocation run by
    /// [`FaultPlan::run`] (calls outside one are left alone).
    pub fn chaos(&self, chaos: Chaos) {
        self.lock().chaos = Some(chaos);
    }

    /// Calls with a fault injected, in order: `(scope, service, operation, fault)`.
    pub fn faulted(&self) -> Vec<(String, &'static str, String, &'static str)> {
        self.lock()
            .trace
            .iter()
            .filter_map(|c| c.fault.map(|f| (c.scope.clone(), c.service, c.operation.clone(), f)))
            .collect()
    }

    /// Emulates real DynamoDB's idempotent `TransactWriteItems` (same token,
    /// already committed: success without executing again).
    pub fn honour_transaction_tokens(&self, on: bool) {
        self.lock().honour_tokens = on;
    }

    /// Names the calls that follow (e.g. `intake#1`, `processor`).
    pub fn scope(&self, name: &str) {
        self.lock().scope = name.to_owned();
    }

    /// Restarts the operation index at 0 (and forgets the trace).
    pub fn reset_counts(&self) {
        let mut st = self.lock();
        st.ops.clear();
        st.next_op = 0;
        st.trace.clear();
        st.response_bytes.clear();
    }

    pub fn trace(&self) -> Vec<Call> {
        self.lock().trace.clone()
    }

    /// Distinct operations in order: `(service, operation)`.
    pub fn operations(&self) -> Vec<(String, &'static str, String)> {
        let st = self.lock();
        let mut seen = HashSet::new();
        st.trace
            .iter()
            .filter(|c| seen.insert(c.op_index))
            .map(|c| (c.scope.clone(), c.service, c.operation.clone()))
            .collect()
    }

    /// Attempts per `service:operation` in the trace.
    pub fn request_counts(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for c in self.lock().trace.iter() {
            *out.entry(format!("{}:{}", c.service, c.operation)).or_insert(0) += 1;
        }
        out
    }

    /// Response bytes read per `service:operation` since the last
    /// [`FaultPlan::reset_counts`] (what the emulator sent back).
    pub fn response_bytes(&self) -> std::collections::BTreeMap<String, u64> {
        self.lock().response_bytes.clone()
    }

    /// Faults injected so far, by kind.
    pub fn injected(&self) -> HashMap<&'static str, u64> {
        self.lock().injected.clone()
    }

    /// Runs one invocation; `Err(Crashed)` if a crash fault fired while it
    /// ran, in which case its future was dropped at that point.
    ///
    /// Invocations run at once under one plan crash independently: a crash
    /// fault kills the invocation whose call it hit (calls made from tasks the
    /// invocation spawned, which do not inherit its identity, kill every
    /// running invocation).
    pub async fn run<F: std::future::Future>(&self, invocation: F) -> Result<F::Output, Crashed> {
        let (id, crash_all_at_start) = {
            let mut st = self.lock();
            st.invocations += 1;
            (st.invocations, st.crash_all)
        };
        let mut rx = self.crash.subscribe();
        let _ = rx.borrow_and_update();
        let invocation = INVOCATION.scope(id, invocation);
        tokio::pin!(invocation);
        loop {
            tokio::select! {
                out = &mut invocation => return Ok(out),
                changed = rx.changed() => {
                    let st = self.lock();
                    if changed.is_err() || st.crashed.contains(&id) || st.crash_all > crash_all_at_start {
                        return Err(Crashed);
                    }
                }
            }
        }
    }

    /// A client that applies this plan over `inner`.
    pub fn client(&self, inner: SharedHttpClient) -> SharedHttpClient {
        SharedHttpClient::new(FaultClient { inner, plan: self.clone() })
    }

    fn next_random(st: &mut State) -> f64 {
        // xorshift64*: deterministic per seed.
        let mut x = st.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        st.rng = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Decides the fault for one attempt and records it.
    fn decide(&self, call: &CallInfo, invocation: u64) -> Option<Fault> {
        let mut st = self.lock();
        let st = &mut *st;
        let first_attempt_of_op = !st.ops.contains_key(&call.invocation);
        if first_attempt_of_op {
            let index = st.next_op;
            st.next_op += 1;
            let mut hits = Vec::new();
            for i in 0..st.rules.len() {
                if !st.rules[i].0.filters(call) {
                    continue;
                }
                let seen = st.rules[i].1;
                st.rules[i].1 += 1;
                let nth_ok = st.rules[i].0.nth.is_none_or(|n| n == seen);
                let p = st.rules[i].0.probability;
                let lucky = p.is_none_or(|p| Self::next_random(st) < p);
                if nth_ok && lucky {
                    hits.push(i);
                }
            }
            let chaos = match (&st.chaos, invocation) {
                (Some(chaos), id) if id != 0 => {
                    let n = st.per_invocation.entry(id).or_insert(0);
                    *n += 1;
                    chaos.draw(id, *n - 1)
                }
                _ => None,
            };
            st.ops.insert(call.invocation.clone(), (index, hits, chaos));
        }
        let (op_index, hits, chaos) = st.ops[&call.invocation].clone();
        let by_attempt = |fault: Fault, attempts: Attempts| match attempts {
            Attempts::Every => Some(fault),
            Attempts::First if call.attempt <= 1 => Some(fault),
            Attempts::First => None,
        };
        let fault = hits
            .iter()
            .map(|i| &st.rules[*i].0)
            .find_map(|r| by_attempt(r.fault, r.attempts))
            .or_else(|| chaos.and_then(|(f, a)| by_attempt(f, a)));
        if let Some(f) = fault {
            *st.injected.entry(f.label()).or_insert(0) += 1;
        }
        st.trace.push(Call {
            scope: st.scope.clone(),
            service: call.service,
            operation: call.operation.clone(),
            op_index,
            attempt: call.attempt,
            fault: fault.map(Fault::label),
            body: call.body.clone(),
        });
        fault
    }

    /// Crashes the invocation the call belongs to (0, unknown: every
    /// invocation running now).
    fn crash_now(&self, invocation: u64) {
        {
            let mut st = self.lock();
            if invocation == 0 {
                st.crash_all += 1;
            } else {
                st.crashed.insert(invocation);
            }
        }
        self.crash.send_modify(|n| *n += 1);
    }
}

#[derive(Debug)]
struct FaultClient {
    inner: SharedHttpClient,
    plan: FaultPlan,
}

impl HttpClient for FaultClient {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        let inner = self.inner.http_connector(settings, components);
        SharedHttpConnector::new(FaultConnector { inner, plan: self.plan.clone() })
    }
}

#[derive(Debug)]
struct FaultConnector {
    inner: SharedHttpConnector,
    plan: FaultPlan,
}

fn describe(request: &HttpRequest) -> CallInfo {
    let header = |name: &str| request.headers().get(name).unwrap_or_default().to_owned();
    let body = request.body().bytes().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    let target = header("x-amz-target");
    let (service, operation) = if let Some(op) = target.strip_prefix("DynamoDB_20120810.") {
        ("dynamodb", op.to_owned())
    } else if let Some(op) = target.strip_prefix("AmazonSQS.") {
        ("sqs", op.to_owned())
    } else if let Some(op) = target.strip_prefix("AmazonSSM.") {
        ("ssm", op.to_owned())
    } else if let Some(op) = target.strip_prefix("AWSEvents.") {
        ("events", op.to_owned())
    } else if let Some(action) = body.split('&').find_map(|kv| kv.strip_prefix("Action=")) {
        let service = if request.uri().contains("sns") || body.contains("TopicArn") {
            "sns"
        } else if body.contains("Version=2010-08-01") {
            "cloudwatch"
        } else {
            "query"
        };
        (service, action.to_owned())
    } else if !header("x-amz-content-sha256").is_empty() || request.uri().contains("/payloads/") {
        // S3's REST calls: the operation by method.
        let op = match request.method() {
            "PUT" => "PutObject",
            "GET" => "GetObject",
            "HEAD" => "HeadObject",
            "DELETE" => "DeleteObject",
            other => other,
        };
        ("s3", op.to_owned())
    } else {
        ("other", target)
    };
    let attempt = header("amz-sdk-request")
        .split(';')
        .find_map(|p| p.trim().strip_prefix("attempt=").and_then(|n| n.parse().ok()))
        .unwrap_or(1);
    let invocation = match header("amz-sdk-invocation-id") {
        id if id.is_empty() => uuid::Uuid::new_v4().to_string(),
        id => id,
    };
    CallInfo { service, operation, body, invocation, attempt }
}

fn transaction_token(call: &CallInfo) -> Option<String> {
    if call.service != "dynamodb" || call.operation != "TransactWriteItems" {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&call.body).ok()?;
    v.get("ClientRequestToken")?.as_str().map(str::to_owned)
}

fn response(status: u16, content_type: &'static str, body: String) -> HttpResponse {
    let mut r = HttpResponse::new(
        StatusCode::try_from(status).unwrap_or_else(|_| unreachable!("valid status")),
        SdkBody::from(body),
    );
    r.headers_mut().insert("content-type", content_type);
    r
}

fn throttling(service: &'static str) -> HttpResponse {
    match service {
        "sns" | "query" => response(
            400,
            "text/xml",
            "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>\
             <Message>Rate exceeded (injected)</Message></Error><RequestId>injected</RequestId></ErrorResponse>"
                .into(),
        ),
        "sqs" => response(
            400,
            "application/x-amz-json-1.0",
            r#"{"__type":"com.amazonaws.sqs#ThrottlingException","message":"Rate exceeded (injected)"}"#.into(),
        ),
        "events" => response(
            400,
            "application/x-amz-json-1.1",
            r#"{"__type":"ThrottlingException","message":"Rate exceeded (injected)"}"#.into(),
        ),
        _ => response(
            400,
            "application/x-amz-json-1.0",
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate exceeded (injected)"}"#
                .into(),
        ),
    }
}

impl HttpConnector for FaultConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let call = describe(&request);
        let invocation = INVOCATION.try_with(|id| *id).unwrap_or(0);
        let fault = self.plan.decide(&call, invocation);
        let inner = self.inner.clone();
        let plan = self.plan.clone();
        let token = transaction_token(&call);
        HttpConnectorFuture::new(async move {
            if let Some(tok) = &token {
                let st = plan.lock();
                if st.honour_tokens && st.committed_tokens.contains(tok) {
                    drop(st);
                    return Ok(response(200, "application/x-amz-json-1.0", "{}".into()));
                }
            }
            match fault {
                Some(Fault::Throttle) => return Ok(throttling(call.service)),
                Some(Fault::ServerError) => {
                    return Ok(response(
                        500,
                        "application/x-amz-json-1.0",
                        r#"{"__type":"InternalServerError","message":"injected"}"#.into(),
                    ));
                }
                Some(Fault::Reset) => {
                    return Err(ConnectorError::io(
                        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset").into(),
                    ));
                }
                Some(Fault::CrashBefore) => {
                    plan.crash_now(invocation);
                    std::future::pending::<()>().await;
                }
                Some(Fault::Unprocessed) => {
                    let asked = serde_json::from_str::<serde_json::Value>(&call.body)
                        .ok()
                        .and_then(|v| v.get("RequestItems").cloned())
                        .unwrap_or_else(|| serde_json::json!({}));
                    let body = serde_json::json!({"Responses": {}, "UnprocessedKeys": asked});
                    return Ok(response(200, "application/x-amz-json-1.0", body.to_string()));
                }
                Some(Fault::TransactionConflict) => {
                    let items = serde_json::from_str::<serde_json::Value>(&call.body)
                        .ok()
                        .and_then(|v| v.get("TransactItems").and_then(|t| t.as_array()).map(Vec::len))
                        .unwrap_or(1);
                    let reasons: Vec<serde_json::Value> = (0..items)
                        .map(|i| {
                            if i == 0 {
                                serde_json::json!({"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"})
                            } else {
                                serde_json::json!({"Code": "None"})
                            }
                        })
                        .collect();
                    let body = serde_json::json!({
                        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                        "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict] (injected)",
                        "CancellationReasons": reasons,
                    });
                    return Ok(response(400, "application/x-amz-json-1.0", body.to_string()));
                }
                Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
                _ => {}
            }
            let result = inner.call(request).await;
            if let Ok(r) = &result {
                let len = r
                    .headers()
                    .get("content-length")
                    .and_then(|v| v.parse::<u64>().ok())
                    .or_else(|| r.body().bytes().map(|b| b.len() as u64))
                    .unwrap_or(0);
                *plan.lock().response_bytes.entry(format!("{}:{}", call.service, call.operation)).or_insert(0) += len;
            }
            if let (Some(tok), Ok(r)) = (&token, &result) {
                if r.status().is_success() {
                    plan.lock().committed_tokens.insert(tok.clone());
                }
            }
            match fault {
                Some(Fault::LoseAck) => {
                    drop(result);
                    Err(ConnectorError::io(
                        std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "injected lost acknowledgement")
                            .into(),
                    ))
                }
                Some(Fault::CrashAfter) => {
                    drop(result);
                    plan.crash_now(invocation);
                    std::future::pending().await
                }
                _ => result,
            }
        })
    }
}

/// A plain-HTTP client to the emulator, for [`FaultPlan::client`].
pub fn emulator_http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new().build_http()
}

/// SDK configuration for tests: the environment's endpoint and credentials,
/// the fault plan's client, 3 attempts with zero backoff, and a retry
/// partition of its own (a fresh retry quota).
pub async fn sdk_config(plan: &FaultPlan) -> aws_config::SdkConfig {
    use aws_config::retry::RetryConfig;
    aws_config::from_env()
        .http_client(plan.client(emulator_http_client()))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(3)
                .with_initial_backoff(Duration::ZERO)
                .with_max_backoff(Duration::from_millis(1)),
        )
        .load()
        .await
}

/// A DynamoDB client with a retry partition (and so a retry quota) of its own.
pub fn dynamodb_client(config: &aws_config::SdkConfig) -> aws_sdk_dynamodb::Client {
    let conf = aws_sdk_dynamodb::config::Builder::from(config)
        .retry_partition(aws_smithy_runtime::client::retries::RetryPartition::new(format!(
            "ddb-{}",
            uuid::Uuid::new_v4().simple()
        )))
        .build();
    aws_sdk_dynamodb::Client::from_conf(conf)
}

/// An SQS client with a retry quota of its own.
pub fn sqs_client(config: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    let conf = aws_sdk_sqs::config::Builder::from(config)
        .retry_partition(aws_smithy_runtime::client::retries::RetryPartition::new(format!(
            "sqs-{}",
            uuid::Uuid::new_v4().simple()
        )))
        .build();
    aws_sdk_sqs::Client::from_conf(conf)
}

/// An S3 client with a retry quota of its own.
pub fn s3_client(config: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::from(config)
        .retry_partition(aws_smithy_runtime::client::retries::RetryPartition::new(format!(
            "s3-{}",
            uuid::Uuid::new_v4().simple()
        )))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// An SNS client with a retry quota of its own.
pub fn sns_client(config: &aws_config::SdkConfig) -> aws_sdk_sns::Client {
    let conf = aws_sdk_sns::config::Builder::from(config)
        .retry_partition(aws_smithy_runtime::client::retries::RetryPartition::new(format!(
            "sns-{}",
            uuid::Uuid::new_v4().simple()
        )))
        .build();
    aws_sdk_sns::Client::from_conf(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(operation: &str, invocation: &str, attempt: u32) -> CallInfo {
        CallInfo {
            service: "dynamodb",
            operation: operation.to_owned(),
            body: format!("{{\"op\":\"{operation}\"}}"),
            invocation: invocation.to_owned(),
            attempt,
        }
    }

    #[test]
    fn nth_counts_operations_not_attempts() {
        let plan = FaultPlan::new(1);
        plan.arm(Rule::new(Fault::LoseAck).on("dynamodb", "PutItem").nth(1));
        assert_eq!(plan.decide(&call("PutItem", "a", 1), 0), None);
        assert_eq!(plan.decide(&call("PutItem", "a", 2), 0), None, "a retry is the same operation");
        assert_eq!(plan.decide(&call("GetItem", "b", 1), 0), None, "other operations do not count");
        assert_eq!(plan.decide(&call("PutItem", "c", 1), 0), Some(Fault::LoseAck));
        assert_eq!(plan.decide(&call("PutItem", "c", 2), 0), None, "first attempt only");
        assert_eq!(plan.decide(&call("PutItem", "d", 1), 0), None);
        let ops: Vec<usize> = plan.trace().iter().map(|c| c.op_index).collect();
        assert_eq!(ops, [0, 0, 1, 2, 2, 3]);
    }

    #[test]
    fn every_attempt_hits_the_retries_too() {
        let plan = FaultPlan::new(1);
        plan.arm(Rule::at_call(Fault::Throttle, 0).every_attempt());
        for attempt in 1..=3 {
            assert_eq!(plan.decide(&call("UpdateItem", "x", attempt), 0), Some(Fault::Throttle));
        }
        assert_eq!(plan.decide(&call("UpdateItem", "y", 1), 0), None);
        assert_eq!(plan.injected().get("throttle"), Some(&3));
    }

    #[test]
    fn probability_is_reproducible_per_seed() {
        let pattern = |seed| {
            let plan = FaultPlan::new(seed);
            plan.arm(Rule::new(Fault::ServerError).with_probability(0.5));
            (0..64).map(|i| plan.decide(&call("Query", &i.to_string(), 1), 0).is_some()).collect::<Vec<_>>()
        };
        assert_eq!(pattern(42), pattern(42));
        assert_ne!(pattern(42), pattern(43));
        let hits = pattern(42).iter().filter(|h| **h).count();
        assert!((16..=48).contains(&hits), "about half: {hits}");
    }

    #[test]
    fn body_filters_select_the_call() {
        let plan = FaultPlan::new(1);
        plan.arm(Rule::new(Fault::CrashAfter).containing("\"op\":\"PutItem\""));
        assert_eq!(plan.decide(&call("GetItem", "a", 1), 0), None);
        assert_eq!(plan.decide(&call("PutItem", "b", 1), 0), Some(Fault::CrashAfter));
    }

    #[test]
    fn chaos_draws_by_invocation_and_position_not_by_arrival_order() {
        let rates = vec![(Fault::LoseAck, Attempts::First, 0.3), (Fault::Throttle, Attempts::Every, 0.2)];
        let draws = |order: &[(u64, usize)]| {
            let plan = FaultPlan::new(1);
            plan.chaos(Chaos { seed: 9, rates: rates.clone() });
            let mut out = std::collections::BTreeMap::new();
            for (inv, op) in order {
                out.insert((*inv, *op), plan.decide(&call("PutItem", &format!("{inv}-{op}"), 1), *inv));
            }
            out
        };
        let a = draws(&[(1, 0), (1, 1), (2, 0), (1, 2), (2, 1), (2, 2)]);
        let b = draws(&[(2, 0), (1, 0), (2, 1), (2, 2), (1, 1), (1, 2)]);
        assert_eq!(a, b, "interleaving does not change the draws");
        let plan = FaultPlan::new(1);
        plan.chaos(Chaos { seed: 9, rates: rates.clone() });
        let hits = (0..400u64).filter(|i| plan.decide(&call("Query", &i.to_string(), 1), 1 + i % 7).is_some()).count();
        assert!((150..=250).contains(&hits), "about half: {hits}");
        let outside = FaultPlan::new(1);
        outside.chaos(Chaos { seed: 9, rates: vec![(Fault::LoseAck, Attempts::First, 1.0)] });
        assert_eq!(outside.decide(&call("Query", "z", 1), 0), None, "calls outside an invocation are left alone");
        outside.disarm();
        assert_eq!(outside.decide(&call("Query", "y", 1), 3), None, "disarm ends chaos");
    }
}

#[cfg(test)]
mod crash_tests {
    use super::*;

    /// Two invocations at once under one plan: the crash kills only the one
    /// whose call it hit.
    #[tokio::test]
    async fn a_crash_kills_only_its_own_invocation() {
        let plan = FaultPlan::new(1);
        let (p1, p2) = (plan.clone(), plan.clone());
        let victim = plan.run(async move {
            let id = INVOCATION.try_with(|id| *id).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(20)).await;
            p1.crash_now(id);
            std::future::pending::<()>().await;
        });
        let survivor = plan.run(async move {
            tokio::time::sleep(Duration::from_millis(60)).await;
            drop(p2);
            7
        });
        let (v, s) = tokio::join!(victim, survivor);
        assert_eq!(v, Err(Crashed));
        assert_eq!(s, Ok(7));
    }
}
