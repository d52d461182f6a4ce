//! Cold start, measured: each function is started as Lambda starts it, under a
//! fake Lambda Runtime API on 127.0.0.1, and timed from spawn to its first
//! `GET /2018-06-01/runtime/invocation/next` (its init) and from the event it
//! is then handed to its answer (its first invocation). The same harness
//! starts Powertools for AWS Lambda (Python)'s idempotent handler through the
//! official runtime interface client (`python -m awslambdaric handler.fn`,
//! `bench/powertools/handler.py`). Prints medians and p90 as JSON.
//!
//! ```text
//! cargo build --release --locked -p intake -p processor -p reconciler
//! cargo run --release --locked -p hookledger-bench --bin init_bench [-- RUNS]
//! ```
//!
//! The function binaries are taken from the directory of this program (the
//! release target directory) or `INIT_BENCH_BIN_DIR`; Python from the
//! project's `.venv` (`scripts/bench-init` installs the pinned Powertools,
//! awslambdaric, boto3). `INIT_BENCH_ONLY=intake,powertools` measures only
//! those; `INIT_BENCH_WRAP="strace -f -tt -o /tmp/trace"` runs each function
//! under a tool (a profiler: the function then exits by itself).
//!
//! The functions get the local stack's configuration (`infra/local/`: its
//! endpoints, their `env:` secret references and the development secrets)
//! and Lambda's own variables. Every AWS endpoint (`AWS_ENDPOINT_URL`) and
//! the Stripe API base point at a listener of this program that counts the
//! connections it is offered and closes them: init must not call AWS, and the
//! benched requests are answered before any AWS call, so the count must be 0.
//!
//! - intake: an API Gateway v2 request to `stripe-demo` with a wrong
//!   signature, answered 401;
//! - processor: an SQS batch whose one message is not a work message, reported
//!   as a batch item failure;
//! - reconciler: init only (any run reads the ledger);
//! - powertools: an API Gateway v2 request without an idempotency key, which
//!   the decorator passes to the handler without touching DynamoDB.
//!
//! `INIT_BENCH_WITH_AWS=1` adds `intake_accepted`: an intake whose request is a
//! new, validly signed GitHub delivery, answered 202 after its AWS calls to
//! `AWS_ENDPOINT_URL`, `HOOKLEDGER_TABLE` and `HOOKLEDGER_QUEUE_URL` of this
//! program's environment (moto, with the table and queue set up).
//!
//! Runs are interleaved (one of each function per round, after one warm-up
//! round that is not counted) so that machine noise falls on all alike. Next
//! to the wall time, `init_cpu_ms` is the CPU time of the process's threads
//! when its first `GET /next` arrives, which other load disturbs less.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookledger::secret::Secret;
use hookledger::verify::github;
use serde_json::{Value, json};

const DEFAULT_RUNS: usize = 20;
/// One run (spawn, init, first invocation) must finish within this.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const FUNCTION_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:bench";

type Error = Box<dyn std::error::Error>;

fn main() {
    if let Err(e) = run() {
        eprintln!("init_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let runs = match std::env::args().nth(1) {
        Some(n) => n.parse::<usize>().map_err(|_| format!("RUNS must be a number, not {n:?}"))?.max(1),
        None => DEFAULT_RUNS,
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // INIT_BENCH_BIN_DIR takes the function binaries from elsewhere (another build to compare).
    let bin_dir = match std::env::var_os("INIT_BENCH_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()?.parent().ok_or("no directory of this program")?.to_path_buf(),
    };
    let aws = CountingListener::start()?;
    let mut subjects = subjects(&root, &bin_dir, aws.addr)?;
    // INIT_BENCH_ONLY=intake,powertools measures only those.
    if let Ok(only) = std::env::var("INIT_BENCH_ONLY") {
        subjects.retain(|s| only.split(',').any(|o| o.trim() == s.name));
    }

    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    for round in 0..=runs {
        for subject in &subjects {
            let sample = measure(subject)
                .map_err(|e| format!("{}: {e} (its stderr: {})", subject.name, log_path(subject.name).display()))?;
            if round > 0 {
                samples.entry(subject.name).or_default().push(sample);
            }
        }
    }

    let mut out = serde_json::Map::new();
    out.insert("runs".into(), json!(runs));
    out.insert("cores".into(), json!(std::thread::available_parallelism().map(usize::from).unwrap_or(0)));
    for subject in &subjects {
        let s = &samples[subject.name];
        let init: Vec<f64> = s.iter().map(|x| x.init_ms).collect();
        let mut entry = json!({
            "init_ms": stats(&init),
            "max_rss_kb": stats(&s.iter().map(|x| x.max_rss_kb as f64).collect::<Vec<_>>())["median"],
        });
        let cpu: Vec<f64> = s.iter().filter_map(|x| x.init_cpu_ms).collect();
        if !cpu.is_empty() {
            entry["init_cpu_ms"] = stats(&cpu);
        }
        let invoked: Vec<f64> = s.iter().filter_map(|x| x.first_invocation_ms).collect();
        if !invoked.is_empty() {
            entry["first_invocation_ms"] = stats(&invoked);
            entry["answer"] = json!(s[0].answer);
        }
        out.insert(subject.name.into(), entry);
    }
    out.insert("aws_connections".into(), json!(aws.count.load(Ordering::SeqCst)));
    // Powertools' median over each Rust function's, by wall time and by CPU time.
    type Measure = fn(&Sample) -> Option<f64>;
    let median = |name: &str, of: Measure| {
        let xs: Vec<f64> = samples.get(name)?.iter().filter_map(of).collect();
        stats(&xs)["median"].as_f64()
    };
    let (wall, cpu): (Measure, Measure) = (|x| Some(x.init_ms), |x| x.init_cpu_ms);
    for (key, of) in [("init_ratio", wall), ("init_cpu_ratio", cpu)] {
        let mut ratios = serde_json::Map::new();
        for rust in ["intake", "processor", "reconciler"] {
            if let (Some(py), Some(r)) = (median("powertools", of), median(rust, of)) {
                ratios.insert(format!("powertools_over_{rust}"), json!(round2(py / r)));
            }
        }
        if !ratios.is_empty() {
            out.insert(key.into(), Value::Object(ratios));
        }
    }
    println!("{}", Value::Object(out));
    Ok(())
}

/// What is started, with what, and what it is asked.
struct Subject {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    /// Makes the invocation event of a run, or `None` to measure init only.
    event: Option<Box<dyn Fn() -> Value>>,
    /// Checks the answer to the event; returns a short description of it.
    check: fn(&[u8]) -> Result<String, String>,
}

fn subjects(root: &Path, bin_dir: &Path, aws: SocketAddr) -> Result<Vec<Subject>, Error> {
    let binary = |name: &str| -> Result<PathBuf, Error> {
        let path = bin_dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{} not found: build it first (cargo build --release -p {name})", path.display()).into())
        }
    };
    let python = root.join(".venv/bin/python");
    if !python.is_file() {
        return Err(format!("{} not found: run scripts/bench-init", python.display()).into());
    }
    let aws_url = format!("http://{aws}");
    // What Lambda sets for every function (less the runtime API address, set per run).
    let mut lambda = vec![
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128".to_owned()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench".to_owned()),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "bench".to_owned()),
        ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_DEFAULT_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_SESSION_TOKEN", "testing".to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_ENDPOINT_URL", aws_url.clone()),
        ("TZ", ":UTC".to_owned()),
        ("LANG", "en_US.UTF-8".to_owned()),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".to_owned()),
    ];
    // The local stack's configuration (scripts/lib.sh `local_env`, scripts/run).
    let endpoints = std::fs::read_to_string(root.join("infra/local/endpoints.json"))?;
    let hookledger = vec![
        ("HOOKLEDGER_TABLE", "hookledger-local".to_owned()),
        ("HOOKLEDGER_QUEUE_URL", format!("{aws_url}/123456789012/hookledger-local")),
        ("HOOKLEDGER_NOTIFY_TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:hookledger-local-notify".to_owned()),
        ("HOOKLEDGER_ENDPOINTS", endpoints),
        // The key table of erasable endpoints' payloads (`hookledger setup`'s, the template's).
        ("HOOKLEDGER_KEYS_TABLE", "hookledger-local-keys".to_owned()),
        // Where a handshake's secret is kept (the local stack's Asana endpoint learns one).
        ("HOOKLEDGER_HANDSHAKE_PATH", "/hookledger/local/handshake".to_owned()),
        // As deployed with a Stripe key (the template's HasStripeKey), through an env reference.
        ("HOOKLEDGER_STRIPE_API_KEY", "env:BENCH_STRIPE_API_KEY".to_owned()),
        ("BENCH_STRIPE_API_KEY", "sk_test_bench_only".to_owned()),
        ("HOOKLEDGER_STRIPE_API_BASE", aws_url.clone()),
    ];
    let mut dev_secrets = Vec::new();
    for line in std::fs::read_to_string(root.join("infra/local/dev.env"))?.lines() {
        if let Some((k, v)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
            dev_secrets.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    lambda.extend(hookledger);
    let rust_env = |function: &str| -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = lambda.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        env.extend(dev_secrets.iter().cloned());
        env.push(("AWS_LAMBDA_FUNCTION_NAME".into(), function.into()));
        env.push(("_HANDLER".into(), "bootstrap".into()));
        env.push(("AWS_EXECUTION_ENV".into(), "AWS_Lambda_provided.al2023".into()));
        env
    };
    let powertools = root.join("bench/powertools");
    let mut python_env = rust_env("powertools");
    python_env.retain(|(k, _)| {
        !(k.starts_with("HOOKLEDGER_") || k.starts_with("DEV_") || k.starts_with("BENCH_"))
            && k != "_HANDLER"
            && k != "AWS_EXECUTION_ENV"
    });
    python_env.extend([
        ("_HANDLER".into(), "handler.fn".into()),
        ("AWS_EXECUTION_ENV".into(), "AWS_Lambda_python3.11".into()),
        ("LAMBDA_TASK_ROOT".into(), powertools.display().to_string()),
        ("IDEMPOTENCY_TABLE".into(), "hookledger-idempotency".into()),
        ("POWERTOOLS_SERVICE_NAME".into(), "bench".into()),
    ]);

    let mut subjects = vec![
        Subject {
            name: "intake",
            program: binary("intake")?,
            args: vec![],
            cwd: root.to_path_buf(),
            env: rust_env("intake"),
            event: Some(Box::new(webhook_event)),
            check: |body| status_code(body, 401),
        },
        Subject {
            name: "processor",
            program: binary("processor")?,
            args: vec![],
            cwd: root.to_path_buf(),
            env: rust_env("processor"),
            event: Some(Box::new(sqs_event)),
            check: |body| {
                let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
                match v["batchItemFailures"][0]["itemIdentifier"].as_str() {
                    Some("bench-message-1") => Ok("batchItemFailures [bench-message-1]".into()),
                    _ => Err(format!("expected one batch item failure, got {v}")),
                }
            },
        },
        Subject {
            name: "reconciler",
            program: binary("reconciler")?,
            args: vec![],
            cwd: root.to_path_buf(),
            env: rust_env("reconciler"),
            event: None,
            check: |_| Ok(String::new()),
        },
        Subject {
            name: "powertools",
            program: python,
            args: vec!["-m".into(), "awslambdaric".into(), "handler.fn".into()],
            cwd: powertools,
            env: python_env,
            event: Some(Box::new(webhook_event)),
            check: |body| status_code(body, 202),
        },
    ];

    // INIT_BENCH_WITH_AWS=1: also an intake whose first request is accepted, so
    // makes its AWS calls (claim, enqueue) against AWS_ENDPOINT_URL, the table
    // HOOKLEDGER_TABLE and the queue HOOKLEDGER_QUEUE_URL of this environment
    // (the local stack's: `source .local/env` while `scripts/run` runs).
    if std::env::var_os("INIT_BENCH_WITH_AWS").is_some() {
        let var = |k: &str| std::env::var(k).map_err(|_| format!("INIT_BENCH_WITH_AWS needs {k}"));
        let overrides = [
            ("AWS_ENDPOINT_URL", var("AWS_ENDPOINT_URL")?),
            ("HOOKLEDGER_TABLE", var("HOOKLEDGER_TABLE")?),
            ("HOOKLEDGER_QUEUE_URL", var("HOOKLEDGER_QUEUE_URL")?),
        ];
        let mut env = rust_env("intake");
        env.retain(|(k, _)| !overrides.iter().any(|(o, _)| k == o));
        env.extend(overrides.map(|(k, v)| (k.to_owned(), v)));
        let secret = dev_secrets
            .iter()
            .find(|(k, _)| k == "DEV_GITHUB_SECRET")
            .map(|(_, v)| Secret::new(v.as_bytes()))
            .ok_or("infra/local/dev.env has no DEV_GITHUB_SECRET")?;
        subjects.push(Subject {
            name: "intake_accepted",
            program: binary("intake")?,
            args: vec![],
            cwd: root.to_path_buf(),
            env,
            event: Some(Box::new(move || github_delivery(&secret))),
            check: |body| status_code(body, 202),
        });
    }
    Ok(subjects)
}

/// A new, validly signed GitHub delivery to `github-demo` (a new delivery id each call).
fn github_delivery(secret: &Secret) -> Value {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let body = json!({"zen": "Keep it logically awesome.", "hook_id": nanos % 1_000_000_007}).to_string();
    api_gateway_request(
        "github-demo",
        &body,
        json!({
            "content-type": "application/json",
            "x-github-event": "ping",
            "x-github-delivery": format!("bench-{nanos}"),
            "x-hub-signature-256": github::sign(secret, body.as_bytes()),
        }),
    )
}

fn status_code(body: &[u8], expected: u64) -> Result<String, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    match v["statusCode"].as_u64() {
        Some(s) if s == expected => Ok(format!("statusCode {s}")),
        _ => Err(format!("expected statusCode {expected}, got {v}")),
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// An API Gateway (HTTP API, payload 2.0) delivery to `stripe-demo`, its
/// signature current but wrong.
fn webhook_event() -> Value {
    let body = json!({"id": "evt_bench", "object": "event", "type": "invoice.paid", "created": now_secs(),
        "data": {"object": {"id": "in_bench", "customer": "cus_bench"}}})
    .to_string();
    let signature = format!("t={},v1={}", now_secs(), "0".repeat(64));
    api_gateway_request(
        "stripe-demo",
        &body,
        json!({"content-type": "application/json", "stripe-signature": signature,
               "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)"}),
    )
}

/// `POST /webhooks/{endpoint}` through API Gateway (HTTP API, payload 2.0).
fn api_gateway_request(endpoint: &str, body: &str, mut headers: Value) -> Value {
    headers["content-length"] = json!(body.len().to_string());
    headers["host"] = json!("bench.execute-api.us-east-1.amazonaws.com");
    let path = format!("/webhooks/{endpoint}");
    json!({
        "version": "2.0",
        "routeKey": "POST /webhooks/{endpoint}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "bench",
            "domainName": "bench.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "bench",
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": "127.0.0.1", "userAgent": "init_bench"},
            "requestId": "bench-request-1",
            "routeKey": "POST /webhooks/{endpoint}",
            "stage": "$default",
            "time": "01/Jan/2026:00:00:00 +0000",
            "timeEpoch": now_secs() * 1000
        },
        "pathParameters": {"endpoint": endpoint},
        "body": body,
        "isBase64Encoded": false
    })
}

/// An SQS batch of one message that is not a work message.
fn sqs_event() -> Value {
    json!({"Records": [{
        "messageId": "bench-message-1",
        "receiptHandle": "bench-receipt-1",
        "body": "not a work message",
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": (now_secs() * 1000).to_string()},
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:hookledger-local",
        "awsRegion": "us-east-1"
    }]})
}

struct Sample {
    init_ms: f64,
    /// CPU time of the process's threads up to its first `GET /next`.
    init_cpu_ms: Option<f64>,
    first_invocation_ms: Option<f64>,
    answer: String,
    max_rss_kb: u64,
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("init_bench-{name}.log"))
}

/// One cold start of `subject`.
fn measure(subject: &Subject) -> Result<Sample, Error> {
    let api = RuntimeApi::start(subject.event.as_ref().map(|make| make()))?;
    let log = std::fs::File::create(log_path(subject.name))?;
    let started = Instant::now();
    // INIT_BENCH_WRAP (e.g. "strace -f -tt -o /tmp/trace") runs each function under a tool.
    let wrap: Vec<String> =
        std::env::var("INIT_BENCH_WRAP").unwrap_or_default().split_whitespace().map(str::to_owned).collect();
    let (program, args) = match wrap.split_first() {
        Some((tool, tool_args)) => {
            let mut args = tool_args.to_vec();
            args.push(subject.program.display().to_string());
            args.extend(subject.args.iter().cloned());
            (PathBuf::from(tool), args)
        }
        None => (subject.program.clone(), subject.args.clone()),
    };
    let child = Command::new(program)
        .args(&args)
        .current_dir(&subject.cwd)
        .env_clear()
        .envs(subject.env.iter().map(|(k, v)| (k, v)))
        .env("AWS_LAMBDA_RUNTIME_API", api.addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    api.set_pid(child.id());
    let mut child = KillOnDrop(child);
    let outcome = api.wait(&mut child.0, subject.event.is_some());
    let max_rss_kb = max_rss_kb(child.0.id());
    api.stop();
    if !wrap.is_empty() {
        // A tool (a profiler) may need its process to end by itself: with the
        // Runtime API gone, the runtime's next request fails and it exits.
        let until = Instant::now() + Duration::from_secs(10);
        while child.0.try_wait()?.is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    drop(child);
    let outcome = outcome?;
    let init_ms = ms(outcome.next_at - started);
    let (first_invocation_ms, answer) = match outcome.answered {
        Some((sent, at, body)) => (Some(ms(at - sent)), (subject.check)(&body)?),
        None => (None, String::new()),
    };
    Ok(Sample { init_ms, init_cpu_ms: outcome.init_cpu_ms, first_invocation_ms, answer, max_rss_kb })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Peak resident memory of a live process (Linux), 0 where unknown.
fn max_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Time on CPU of a process's live threads (Linux schedstat, ns), in ms.
fn cpu_ms(pid: u32) -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e6)
}

/// Median and p90 (nearest rank), in ms rounded to µs.
fn stats(xs: &[f64]) -> Value {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return Value::Null;
    }
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    let p90 = v[(n * 9).div_ceil(10).max(1) - 1];
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({"median": r(median), "p90": r(p90), "min": r(v[0]), "max": r(v[n - 1])})
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Accepts and at once closes every connection, counting them (the AWS
/// endpoints and the Stripe API base of the benched functions).
struct CountingListener {
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
}

impl CountingListener {
    fn start() -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(conn);
            }
        });
        Ok(Self { addr, count })
    }
}

/// What the fake Runtime API saw of one run.
#[derive(Default)]
struct State {
    /// The function's process.
    pid: Option<u32>,
    /// The first `GET /next`.
    next_at: Option<Instant>,
    /// The process's CPU time then.
    init_cpu_ms: Option<f64>,
    /// The event was handed out at this instant.
    event_sent_at: Option<Instant>,
    /// (event sent, answer received, answer body) of `/response`.
    response: Option<(Instant, Instant, Vec<u8>)>,
    /// An `/error` or `/init/error` body.
    error: Option<String>,
    stop: bool,
}

struct Outcome {
    next_at: Instant,
    init_cpu_ms: Option<f64>,
    answered: Option<(Instant, Instant, Vec<u8>)>,
}

/// A minimal Lambda Runtime API (HTTP/1.1, keep-alive) that hands out one event.
struct RuntimeApi {
    addr: SocketAddr,
    shared: Arc<(Mutex<State>, Condvar)>,
    stopping: Arc<AtomicBool>,
}

impl RuntimeApi {
    fn start(event: Option<Value>) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let stopping = Arc::new(AtomicBool::new(false));
        let (s, stop) = (shared.clone(), stopping.clone());
        let event = Arc::new(event.map(|e| e.to_string()));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (s, event) = (s.clone(), event.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &s, event.as_deref());
                });
            }
        });
        Ok(Self { addr, shared, stopping })
    }

    /// Waits for the first `GET /next` and, when an event is handed out, its answer.
    fn wait(&self, child: &mut Child, answer_expected: bool) -> Result<Outcome, Error> {
        let deadline = Instant::now() + RUN_TIMEOUT;
        let (lock, cv) = &*self.shared;
        let mut state = lock.lock().map_err(|_| "state lock poisoned")?;
        loop {
            if let Some(e) = &state.error {
                return Err(format!("the function reported an error: {e}").into());
            }
            if let Some(next_at) = state.next_at {
                if !answer_expected {
                    return Ok(Outcome { next_at, init_cpu_ms: state.init_cpu_ms, answered: None });
                }
                if let Some(answered) = state.response.take() {
                    return Ok(Outcome { next_at, init_cpu_ms: state.init_cpu_ms, answered: Some(answered) });
                }
            }
            if Instant::now() > deadline {
                return Err("timed out".into());
            }
            if let Some(status) = child.try_wait()? {
                return Err(format!("the function exited ({status})").into());
            }
            state = cv.wait_timeout(state, Duration::from_millis(5)).map_err(|_| "state lock poisoned")?.0;
        }
    }

    fn set_pid(&self, pid: u32) {
        if let Ok(mut s) = self.shared.0.lock() {
            s.pid = Some(pid);
        }
    }

    fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        let (lock, cv) = &*self.shared;
        if let Ok(mut s) = lock.lock() {
            s.stop = true;
        }
        cv.notify_all();
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// Reads one HTTP/1.1 request (Content-Length or chunked body); `None` at EOF.
fn read_request(reader: &mut BufReader<TcpStream>) -> Result<Option<HttpRequest>, Error> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let (mut length, mut chunked, mut expect_continue) = (0usize, false, false);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse()?,
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "expect" => expect_continue = value.eq_ignore_ascii_case("100-continue"),
                _ => {}
            }
        }
    }
    if expect_continue {
        reader.get_mut().write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    Ok(Some(HttpRequest { method, path, body }))
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    stream.write_all(&out)?;
    stream.flush()
}

/// One connection of the function to the Runtime API.
fn serve(conn: TcpStream, shared: &(Mutex<State>, Condvar), event: Option<&str>) -> Result<(), Error> {
    conn.set_nodelay(true)?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    let (lock, cv) = shared;
    while let Some(req) = read_request(&mut reader)? {
        let received = Instant::now();
        const PREFIX: &str = "/2018-06-01/runtime/";
        let route = req.path.strip_prefix(PREFIX).unwrap_or(&req.path);
        match (req.method.as_str(), route) {
            ("GET", "invocation/next") => {
                let mut state = lock.lock().map_err(|_| "poisoned")?;
                if state.next_at.is_none() {
                    // The process waits for the answer now: its CPU time is its init's.
                    state.next_at = Some(received);
                    state.init_cpu_ms = state.pid.and_then(cpu_ms);
                }
                cv.notify_all();
                match event.filter(|_| state.event_sent_at.is_none()) {
                    Some(event) => {
                        let deadline_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() + 30_000;
                        let headers = [
                            ("Lambda-Runtime-Aws-Request-Id", "bench-invocation-1".to_owned()),
                            ("Lambda-Runtime-Deadline-Ms", deadline_ms.to_string()),
                            ("Lambda-Runtime-Invoked-Function-Arn", FUNCTION_ARN.to_owned()),
                            (
                                "Lambda-Runtime-Trace-Id",
                                "Root=1-00000000-000000000000000000000000;Sampled=0".to_owned(),
                            ),
                        ];
                        state.event_sent_at = Some(Instant::now());
                        drop(state);
                        respond(&mut writer, "200 OK", &headers, event.as_bytes())?;
                    }
                    // No more events: hold the request until the run is over.
                    None => {
                        while !state.stop {
                            state = cv.wait(state).map_err(|_| "poisoned")?;
                        }
                        return Ok(());
                    }
                }
            }
            ("POST", "init/error") => {
                lock.lock().map_err(|_| "poisoned")?.error =
                    Some(format!("init error: {}", String::from_utf8_lossy(&req.body)));
                cv.notify_all();
                respond(&mut writer, "202 Accepted", &[], br#"{"status":"OK"}"#)?;
            }
            ("POST", r) if r.starts_with("invocation/") && (r.ends_with("/response") || r.ends_with("/error")) => {
                let mut state = lock.lock().map_err(|_| "poisoned")?;
                if r.ends_with("/error") {
                    state.error = Some(format!("invocation error: {}", String::from_utf8_lossy(&req.body)));
                } else {
                    let sent = state.event_sent_at.unwrap_or(received);
                    state.response = Some((sent, received, req.body));
                }
                drop(state);
                cv.notify_all();
                respond(&mut writer, "202 Accepted", &[], br#"{"status":"OK"}"#)?;
            }
            _ => respond(&mut writer, "404 Not Found", &[], br#"{"errorMessage":"unknown route"}"#)?,
        }
    }
    Ok(())
}
