//! `hookledger console`: a local web console for operators, run on the
//! operator's machine with their AWS credentials.
//!
//! - Overview: the figures of `stats` and `failures` (bounded reads), with
//!   plots of processing latency, the duplicate rate and failures by type.
//! - Search by provider event id (or event key); a record's timeline; its
//!   payload only on request.
//! - Replay, park or resolve one record or a filtered set (with progress),
//!   each after an explicit confirmation, with a reason; the ledger keeps
//!   who and why in the record's history, and the console prints an audit line.
//! - Destinations: each route destination's health (circuit, limits,
//!   pending, oldest pending, DEAD, last answers) and the replay of its DEAD
//!   deliveries by a filter, the count shown first (as `hookledger
//!   deliveries replay`: resumable, audited on each item).
//!
//! Safe by default (`guard.rs`): it binds to 127.0.0.1, answers only to its
//! own Host, refuses cross-origin writes and writes without its CSRF token,
//! and sends a CSP that allows no script and nothing from elsewhere. It
//! never reads a secret.

mod guard;
pub mod html;
mod plot;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hookledger::adapters::cloudwatch::CloudWatchMetrics;
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::identity::EventKey;
use hookledger::insight::Insight;
use hookledger::ledger::Status;
use hookledger::ops::{ListFilter, Ops, OpsError, parse_key};
use hookledger::ports::AuditLog;
use hookledger::ports::MetricWindow;

pub use guard::Guard;
use html::{csrf, esc, field, num, page, record_link, status, table, url, when};

/// Records a bulk action touches at most.
pub const BULK_MAX: usize = 1000;

/// Routes' deliveries on the ledger's table.
type LiveDeliveries = hookledger::outbox::Deliveries<hookledger::adapters::dynamodb::outbox::DynamoOutbox>;

/// A bulk action's progress.
#[derive(Debug, Clone, Default)]
struct Job {
    action: String,
    total: usize,
    done: usize,
    failed: usize,
    errors: Vec<String>,
    finished: bool,
}

/// The console: the operator's ledger, queue and metrics.
pub struct Console {
    ops: Ops<SqsQueue, DynamoLedger>,
    insight: Insight<DynamoLedger, CloudWatchMetrics>,
    /// (endpoint name, provider) of the configured endpoints, for search by id.
    endpoints: Vec<(String, String)>,
    operator: String,
    /// Who acts, as AWS reports the console's credentials (every action's audit entry).
    caller: hookledger::audit::Caller,
    /// The operator audit log (a record's entries on its page).
    ledger: DynamoLedger,
    jobs: Mutex<Vec<Job>>,
    /// Routes' deliveries and the destinations (names and limits): a row
    /// each on a record's page, and the destinations' page.
    deliveries: Option<(LiveDeliveries, Vec<(String, hookledger::routes::Limits)>)>,
}

struct App {
    console: Console,
    guard: Guard,
}

type Shared = Arc<App>;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

impl Console {
    pub fn new(
        ledger: DynamoLedger,
        queue: SqsQueue,
        metrics: CloudWatchMetrics,
        endpoints: Vec<(String, String)>,
        caller: hookledger::audit::Caller,
    ) -> Self {
        Self {
            ops: Ops::new(ledger.clone(), queue),
            insight: Insight::new(ledger.clone(), metrics),
            endpoints,
            operator: caller.operator.clone(),
            caller,
            ledger,
            jobs: Mutex::default(),
            deliveries: None,
        }
    }

    /// Shows each record's delivery to these destinations on its page.
    pub fn with_deliveries(
        mut self,
        deliveries: hookledger::outbox::Deliveries<hookledger::adapters::dynamodb::outbox::DynamoOutbox>,
        destinations: Vec<(String, hookledger::routes::Limits)>,
    ) -> Self {
        if !destinations.is_empty() {
            self.deliveries = Some((deliveries, destinations));
        }
        self
    }

    /// Serves the console on `listener` until the process stops. The CSRF
    /// token is new for every start.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let bound = listener.local_addr()?;
        let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let app = Arc::new(App { console: self, guard: Guard::new(bound, token) });
        axum::serve(listener, router(app)).await
    }
}

/// Whether an address is loopback (the default, and the only kind allowed
/// without `--allow-remote`).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

fn router(app: Shared) -> Router {
    let guard = app.guard.clone();
    Router::new()
        .route("/", get(overview))
        .route("/search", get(search))
        .route("/records", get(records))
        .route("/record", get(record))
        .route("/record/payload", post(payload))
        .route("/record/action", post(action))
        .route("/bulk", post(bulk))
        .route("/jobs/{id}", get(job))
        .route("/destinations", get(destinations))
        .route("/destinations/replay", post(replay_deliveries))
        .route("/audit", get(audit))
        .fallback(|| async { html(StatusCode::NOT_FOUND, "<h1>not found</h1>".into()) })
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(guard, guard::check))
}

type Params = HashMap<String, String>;

fn param<'a>(p: &'a Params, k: &str) -> &'a str {
    p.get(k).map(|s| s.trim()).unwrap_or("")
}

fn error_page(app: &App, status: StatusCode, message: &str) -> Response {
    html(status, page("Error", &app.console.operator, &format!("<p class=error>{}</p>", esc(message)), None))
}

fn age_ms(raw: &str) -> Option<i64> {
    let (n, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: i64 = n.parse().ok().filter(|n| *n > 0 && *n <= 10_000)?;
    Some(
        n * match unit {
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        },
    )
}

fn fig(label: &str, value: String) -> String {
    format!("<div class=fig>{}<b>{}</b></div>", esc(label), esc(&value))
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1} ms"))
}

async fn overview(State(app): State<Shared>, Query(q): Query<Params>) -> Response {
    let since = match param(&q, "since") {
        "" => 86_400_000,
        raw => match age_ms(raw) {
            Some(ms) => ms,
            None => return error_page(&app, StatusCode::BAD_REQUEST, "since: an age like 30m, 6h, 2d"),
        },
    };
    let now = now_ms();
    let period_s = ((since / 1000 / 24).max(60) / 60) * 60;
    let window = MetricWindow { since_ms: now - since, until_ms: now, period_s };
    let insight = &app.console.insight;
    let (stats, failures) = match insight.overview(&window, now).await {
        Ok(both) => both,
        Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &format!("reading the figures: {e}")),
    };
    let by = |s: &str| stats.now.by_status.get(s).copied().unwrap_or(0);
    let open = by("RECEIVED") + by("PROCESSING") + by("RETRYABLE");
    let mut body = format!(
        "<p class=muted>Last {} (metrics in {} s periods); now: the ledger's open, dead and parked records.</p>\
         <form method=get action=\"/\">window <select name=since>{}</select> <button type=submit>show</button></form>\
         <div class=figs id=figures>",
        esc(match param(&q, "since") {
            "" => "24h",
            s => s,
        }),
        period_s,
        ["1h", "6h", "24h", "7d"]
            .iter()
            .map(|o| {
                let chosen = match param(&q, "since") {
                    "" => *o == "24h",
                    s => s == *o,
                };
                format!("<option{}>{o}</option>", if chosen { " selected" } else { "" })
            })
            .collect::<String>()
    );
    for (label, value) in [
        ("received (new events)", stats.received.to_string()),
        ("duplicate deliveries", stats.duplicates.to_string()),
        ("duplicate rate", format!("{:.1}%", stats.duplicate_rate * 100.0)),
        ("processed (final state)", stats.processed_final().to_string()),
        ("redeliveries (nothing to do)", stats.redeliveries().to_string()),
        ("retries", stats.retried.to_string()),
        ("dead-lettered", stats.dead_lettered.to_string()),
        ("processing mean", ms(stats.processing.mean_ms)),
        ("processing max", ms(stats.processing.max_ms)),
        ("drift found / repaired", format!("{} / {}", stats.drift_found, stats.drift_repaired)),
        ("open now", open.to_string()),
        ("DEAD now", by("DEAD").to_string()),
        ("PARKED now", by("PARKED").to_string()),
        ("stuck leases", stats.now.stuck_leases.to_string()),
        (
            "oldest unprocessed",
            stats.now.oldest_unprocessed_age_ms.map_or("none".into(), |a| format!("{:.0} s", a as f64 / 1000.0)),
        ),
    ] {
        body.push_str(&fig(label, value));
    }
    body.push_str("</div>");
    if stats.now.truncated {
        body.push_str("<p class=muted>Some shard held more rows than the cap: counts are lower bounds.</p>");
    }
    let latency: Vec<(i64, f64)> =
        stats.periods.iter().filter_map(|p| p.processing.mean_ms.map(|m| (p.at_ms, m))).collect();
    let dup: Vec<(i64, f64)> =
        failures.duplicate_rate.iter().filter(|p| p.deliveries > 0).map(|p| (p.at_ms, p.rate * 100.0)).collect();
    let failed: Vec<(i64, f64)> = stats.periods.iter().map(|p| (p.at_ms, p.failed as f64)).collect();
    let types: Vec<(String, u64)> = failures.top_types.iter().map(|c| (c.key.clone(), c.count)).collect();
    body.push_str("<h2>Over time</h2><div class=charts>");
    body.push_str(&plot::line("processing latency (mean per period)", "ms", &latency));
    body.push_str(&plot::line("duplicate rate", "%", &dup));
    body.push_str(&plot::line("retries and dead letters per period", "", &failed));
    body.push_str(&plot::bars("failing now, by type (DEAD, PARKED, RETRYABLE)", &types));
    body.push_str("</div><h2>Failures</h2>");
    let rows: Vec<Vec<String>> =
        failures.repeated_subjects.iter().map(|c| vec![esc(&c.key), c.count.to_string()]).collect();
    body.push_str(&table("repeated-subjects", &["subject failing repeatedly", "records"], &rows));
    let rows: Vec<Vec<String>> = failures.reasons.iter().map(|c| vec![esc(&c.key), c.count.to_string()]).collect();
    body.push_str(&table("reasons", &["reason", "records"], &rows));
    let rows: Vec<Vec<String>> = failures
        .stuck_leases
        .iter()
        .map(|l| vec![record_link(&l.key), format!("{:.0} s", l.lease_expired_ms_ago as f64 / 1000.0)])
        .collect();
    body.push_str(&table("stuck-leases", &["stuck lease", "expired ago"], &rows));
    if let Some(o) = &failures.oldest_unprocessed {
        body.push_str(&format!(
            "<p>Oldest unprocessed: {} ({}, {:.0} s)</p>",
            record_link(&o.key),
            status(&o.status),
            o.age_ms as f64 / 1000.0
        ));
    }
    html(StatusCode::OK, page("Overview", &app.console.operator, &body, None))
}

async fn search(State(app): State<Shared>, Query(q): Query<Params>) -> Response {
    let wanted = param(&q, "q");
    if wanted.is_empty() || wanted.len() > 512 || wanted.chars().any(char::is_control) {
        return error_page(&app, StatusCode::BAD_REQUEST, "give a provider event id or an event key");
    }
    let candidates: Vec<EventKey> = match parse_key(wanted) {
        Ok(key) => vec![key],
        Err(_) => app.console.endpoints.iter().map(|(name, provider)| EventKey::new(provider, name, wanted)).collect(),
    };
    let mut found = Vec::new();
    for key in candidates {
        match app.console.ops.show(&key, false).await {
            Ok(_) => found.push(key),
            Err(OpsError::UnknownEvent(_)) => {}
            Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
        }
    }
    match found.as_slice() {
        [one] => see_other(&format!("/record?key={}", url(one.as_str()))),
        [] => html(
            StatusCode::NOT_FOUND,
            page(
                "Search",
                &app.console.operator,
                &format!("<p class=error id=not-found>No event {} on any endpoint.</p>", esc(wanted)),
                None,
            ),
        ),
        many => {
            let rows: Vec<Vec<String>> = many.iter().map(|k| vec![record_link(k.as_str())]).collect();
            html(StatusCode::OK, page("Search", &app.console.operator, &table("found", &["event"], &rows), None))
        }
    }
}

fn filter_from(q: &Params, limit: usize) -> Result<ListFilter, String> {
    let statuses = match param(q, "status") {
        "" => Vec::new(),
        s => vec![Status::parse(&s.to_ascii_uppercase()).ok_or_else(|| format!("unknown status {s:?}"))?],
    };
    let opt = |k: &str| Some(param(q, k).to_owned()).filter(|v| !v.is_empty());
    Ok(ListFilter {
        statuses,
        endpoint: opt("endpoint"),
        event_type: opt("type"),
        subject: opt("subject"),
        limit,
        ..Default::default()
    })
}

const FILTER_FIELDS: [&str; 4] = ["status", "endpoint", "type", "subject"];

fn hidden_filter(q: &Params) -> String {
    FILTER_FIELDS.iter().map(|k| format!("<input type=hidden name={k} value=\"{}\">", esc(param(q, k)))).collect()
}

async fn records(State(app): State<Shared>, Query(q): Query<Params>) -> Response {
    let mut filter = match filter_from(&q, 50) {
        Ok(f) => f,
        Err(e) => return error_page(&app, StatusCode::BAD_REQUEST, &e),
    };
    if let Some((at, pk)) = param(&q, "cursor").split_once(':') {
        filter.cursor = at.parse().ok().map(|at| (at, pk.to_owned()));
    }
    let (rows, next) = match app.console.ops.list(&filter).await {
        Ok(r) => r,
        Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let mut body = String::from("<form method=get action=\"/records\">");
    for k in FILTER_FIELDS {
        body.push_str(&format!("{k} <input name={k} value=\"{}\" size=14> ", esc(param(&q, k))));
    }
    body.push_str("<button type=submit>filter</button></form>");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let why = ["dead_reason", "park_reason", "error_code", "outcome"]
                .iter()
                .map(|k| field(r, k))
                .find(|v| !v.is_empty())
                .unwrap_or_default();
            vec![
                record_link(&field(r, "pk")),
                status(&field(r, "status")),
                esc(&field(r, "event_type")),
                esc(&field(r, "subject")),
                field(r, "attempts"),
                esc(&why),
                num(r, "received_at").map(when).unwrap_or_default(),
            ]
        })
        .collect();
    body.push_str(&table(
        "records",
        &["event", "status", "type", "subject", "attempts", "reason", "received (UTC)"],
        &cells,
    ));
    if let Some((at, pk)) = next {
        let mut link = format!("/records?cursor={}", url(&format!("{at}:{pk}")));
        for k in FILTER_FIELDS {
            link.push_str(&format!("&{k}={}", url(param(&q, k))));
        }
        body.push_str(&format!("<p><a href=\"{}\">next page</a></p>", esc(&link)));
    }
    body.push_str(&format!(
        "<h2>Act on every record matching this filter (at most {BULK_MAX})</h2>\
         <form method=post action=\"/bulk\">{}{}<select name=action>\
         <option value=replay>replay</option><option value=park>park</option><option value=resolve>resolve</option></select> \
         reason <input name=reason id=bulk-reason size=40 required> <button type=submit id=bulk-go>review</button></form>",
        csrf(app.guard.token()),
        hidden_filter(&q)
    ));
    html(StatusCode::OK, page("Records", &app.console.operator, &body, None))
}

async fn record_page(app: &App, key_raw: &str, with_payload: bool, notice: &str) -> Response {
    let key = match parse_key(key_raw) {
        Ok(k) => k,
        Err(e) => return error_page(app, StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let (record, history, payload) = match app.console.ops.show(&key, with_payload).await {
        Ok(shown) => shown,
        Err(OpsError::UnknownEvent(k)) => {
            return error_page(app, StatusCode::NOT_FOUND, &format!("no event with key {k}"));
        }
        Err(e) => return error_page(app, StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let st = field(&record, "status");
    let mut body = String::new();
    if !notice.is_empty() {
        body.push_str(&format!("<p class=notice id=notice>{}</p>", esc(notice)));
    }
    body.push_str(&format!(
        "<p id=record-status>Status: {} · type {} · provider {} · endpoint {} · attempts {}</p>",
        status(&st),
        esc(&field(&record, "event_type")),
        esc(&field(&record, "provider")),
        esc(&field(&record, "endpoint")),
        esc(&field(&record, "attempts"))
    ));
    let rows: Vec<Vec<String>> = html::timeline(&record, &history)
        .into_iter()
        .map(|(at, kind, detail)| vec![if at == i64::MAX { String::new() } else { when(at) }, esc(&kind), esc(&detail)])
        .collect();
    body.push_str("<h2>Timeline</h2>");
    body.push_str(&table("timeline", &["when (UTC)", "what", "detail"], &rows));
    if let Some((deliveries, names)) = &app.console.deliveries {
        let names: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        body.push_str("<h2>Deliveries</h2>");
        match deliveries.of_event(&key, &names).await {
            Ok(rows) if rows.is_empty() => body.push_str("<p id=deliveries>No route delivers this event.</p>"),
            Ok(rows) => {
                let cells: Vec<Vec<String>> = rows
                    .iter()
                    .map(|d| {
                        let next =
                            if matches!(d.status.as_str(), "PENDING" | "SENDING") { d.due_at.map(when) } else { None };
                        vec![
                            esc(d.destination.as_deref().unwrap_or("-")),
                            status(&d.status),
                            d.attempts.to_string(),
                            esc(d.last_error.as_deref().unwrap_or("")),
                            next.unwrap_or_default(),
                            d.sent_at.map(when).unwrap_or_default(),
                            esc(&d.idempotency_key),
                        ]
                    })
                    .collect();
                body.push_str(&table(
                    "deliveries",
                    &["destination", "status", "attempts", "last answer", "next try (UTC)", "sent (UTC)", "key"],
                    &cells,
                ));
            }
            Err(e) => body
                .push_str(&format!("<p id=deliveries>The deliveries could not be read: {}</p>", esc(&e.to_string()))),
        }
    }
    let token = csrf(app.guard.token());
    let k = esc(key.as_str());
    body.push_str("<h2>Actions</h2>");
    for (action, label, allowed) in [
        ("replay", "Replay", ["DEAD", "PARKED"].contains(&st.as_str())),
        ("park", "Park", ["RECEIVED", "RETRYABLE", "DEAD"].contains(&st.as_str())),
        ("resolve", "Resolve", ["DEAD", "PARKED"].contains(&st.as_str())),
    ] {
        if allowed {
            body.push_str(&format!(
                "<form class=inline method=post action=\"/record/action\">{token}<input type=hidden name=key value=\"{k}\">\
                 <input type=hidden name=action value={action}> <button type=submit id=\"{action}\">{label}…</button></form> "
            ));
        }
    }
    body.push_str("<h2>Payload</h2>");
    match (with_payload, payload) {
        (true, Some(p)) => body.push_str(&format!(
            "<pre id=payload>{}</pre><p class=muted>{} bytes, shown on request.</p>",
            esc(&String::from_utf8_lossy(&p)),
            p.len()
        )),
        (true, None) => body.push_str("<p id=payload>The payload is not stored (expired, dropped by its endpoint's payload policy, or never kept).</p>"),
        (false, _) => body.push_str(&format!(
            "<form method=post action=\"/record/payload\">{token}<input type=hidden name=key value=\"{k}\">\
             <button type=submit id=show-payload>Show the payload</button></form>"
        )),
    }
    body.push_str("<h2>Operator audit</h2>");
    match app.console.ledger.audit_of(&key).await {
        Ok(entries) if entries.is_empty() => {
            body.push_str("<p id=audit>No operator has acted on this record.</p>");
        }
        Ok(entries) => {
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        when(e.at_ms),
                        esc(&e.verb),
                        esc(&e.operator),
                        esc(&e.principal),
                        esc(&e.reason),
                        esc(&e.result),
                    ]
                })
                .collect();
            body.push_str(&table(
                "audit",
                &["at (UTC)", "verb", "operator", "principal (AWS)", "reason", "result"],
                &rows,
            ));
        }
        Err(e) => body.push_str(&format!("<p id=audit>The audit log could not be read: {}</p>", esc(&e.to_string()))),
    }
    body.push_str("<h2>Fields</h2>");
    let mut keys: Vec<&String> = record.keys().collect();
    keys.sort();
    let rows: Vec<Vec<String>> = keys.iter().map(|f| vec![esc(f), esc(&html::field_value(&record, f))]).collect();
    body.push_str(&table("fields", &["field", "value"], &rows));
    html(StatusCode::OK, page(key.as_str(), &app.console.operator, &body, None))
}

async fn record(State(app): State<Shared>, Query(q): Query<Params>) -> Response {
    let notice = match param(&q, "done") {
        "replay" => "Replayed: the record is RETRYABLE and queued; the processor takes it next.",
        "park" => "Parked.",
        "resolve" => "Resolved.",
        _ => "",
    };
    record_page(&app, param(&q, "key"), false, notice).await
}

/// The refusal of a form without the console's token, if it has none.
fn unchecked(app: &App, f: &Params) -> Option<Response> {
    (!app.guard.token_matches(param(f, "csrf")))
        .then(|| error_page(app, StatusCode::FORBIDDEN, "missing or stale form token: reload the page and try again"))
}

async fn payload(State(app): State<Shared>, Form(f): Form<Params>) -> Response {
    if let Some(refused) = unchecked(&app, &f) {
        return refused;
    }
    record_page(&app, param(&f, "key"), true, "").await
}

fn reason_ok(reason: &str) -> Result<(), &'static str> {
    match reason.chars().count() {
        0 => Err("say why: the reason is kept in the record's history"),
        n if n > 500 => Err("the reason is too long (500 characters at most)"),
        _ => Ok(()),
    }
}

async fn act(app: &App, action: &str, key: &EventKey, reason: &str) -> Result<(), OpsError> {
    let (ops, op, now) = (&app.console.ops, &app.console.operator, now_ms());
    let caller = &app.console.caller;
    let r = match action {
        "replay" => ops.replay(key, caller, reason, now).await,
        "park" => ops.park(key, caller, reason, now).await,
        _ => ops.resolve(key, caller, reason, now).await,
    };
    // The audit line (the ledger keeps the same in the record's history).
    println!(
        "audit: {} {action} {} by {op}: {reason:?}{}",
        when(now),
        key,
        r.as_ref().err().map(|e| format!(" (refused: {e})")).unwrap_or_default()
    );
    r
}

async fn action(State(app): State<Shared>, Form(f): Form<Params>) -> Response {
    if let Some(refused) = unchecked(&app, &f) {
        return refused;
    }
    let action = param(&f, "action");
    if !["replay", "park", "resolve"].contains(&action) {
        return error_page(&app, StatusCode::BAD_REQUEST, "unknown action");
    }
    let key = match parse_key(param(&f, "key")) {
        Ok(k) => k,
        Err(e) => return error_page(&app, StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let reason = param(&f, "reason");
    if param(&f, "confirm") != "yes" || reason_ok(reason).is_err() {
        let problem = if param(&f, "confirm") == "yes" { reason_ok(reason).err().unwrap_or("") } else { "" };
        let body = format!(
            "{}<p>{} <b>{}</b>? This is recorded with your name ({}) and your reason.</p>\
             <form method=post action=\"/record/action\">{}<input type=hidden name=key value=\"{}\">\
             <input type=hidden name=action value={action}><input type=hidden name=confirm value=yes>\
             reason <input name=reason id=reason size=50 value=\"{}\" required> \
             <button type=submit class=danger id=confirm>{action}</button> <a href=\"/record?key={}\">cancel</a></form>",
            if problem.is_empty() { String::new() } else { format!("<p class=error>{}</p>", esc(problem)) },
            esc(&format!("{}{}", &action[..1].to_ascii_uppercase(), &action[1..])),
            esc(key.as_str()),
            esc(&app.console.operator),
            csrf(app.guard.token()),
            esc(key.as_str()),
            esc(reason),
            url(key.as_str()),
        );
        let code = if problem.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
        return html(code, page("Confirm", &app.console.operator, &body, None));
    }
    match act(&app, action, &key, reason).await {
        Ok(()) => see_other(&format!("/record?key={}&done={action}", url(key.as_str()))),
        Err(e @ OpsError::IllegalTransition { .. }) => error_page(&app, StatusCode::CONFLICT, &e.to_string()),
        Err(e) => error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

async fn bulk(State(app): State<Shared>, Form(f): Form<Params>) -> Response {
    if let Some(refused) = unchecked(&app, &f) {
        return refused;
    }
    let action = param(&f, "action").to_owned();
    if !["replay", "park", "resolve"].contains(&action.as_str()) {
        return error_page(&app, StatusCode::BAD_REQUEST, "unknown action");
    }
    let reason = param(&f, "reason").to_owned();
    if let Err(e) = reason_ok(&reason) {
        return error_page(&app, StatusCode::BAD_REQUEST, e);
    }
    let filter = match filter_from(&f, BULK_MAX) {
        Ok(filter) => filter,
        Err(e) => return error_page(&app, StatusCode::BAD_REQUEST, &e),
    };
    if filter.statuses.is_empty()
        && filter.endpoint.is_none()
        && filter.event_type.is_none()
        && filter.subject.is_none()
    {
        return error_page(&app, StatusCode::BAD_REQUEST, "choose a filter first (status, endpoint, type or subject)");
    }
    if action == "replay" {
        return bulk_replay(app, f, filter, reason).await;
    }
    let keys: Vec<String> = match app.console.ops.list(&filter).await {
        Ok((rows, _)) => rows.iter().map(|r| field(r, "pk")).filter(|k| !k.is_empty()).collect(),
        Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    if param(&f, "confirm") != "yes" {
        let sample: String = keys.iter().take(10).map(|k| format!("<li>{}</li>", esc(k))).collect();
        let body = format!(
            "<p id=bulk-count>{action} {} record(s) matching the filter, with the reason <b>{}</b>, as {}.</p><ul>{sample}</ul>\
             <form method=post action=\"/bulk\">{}{}<input type=hidden name=action value={action}>\
             <input type=hidden name=reason value=\"{}\"><input type=hidden name=confirm value=yes>\
             <button type=submit class=danger id=confirm>{action} {}</button> <a href=\"/records\">cancel</a></form>",
            keys.len(),
            esc(&reason),
            esc(&app.console.operator),
            csrf(app.guard.token()),
            hidden_filter(&f),
            esc(&reason),
            keys.len()
        );
        return html(StatusCode::OK, page("Confirm", &app.console.operator, &body, None));
    }
    let id = {
        let mut jobs = app.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.push(Job { action: action.clone(), total: keys.len(), ..Job::default() });
        jobs.len() - 1
    };
    let worker = app.clone();
    tokio::spawn(async move {
        for raw in keys {
            let result = match parse_key(&raw) {
                Ok(key) => act(&worker, &action, &key, &reason).await,
                Err(e) => Err(e),
            };
            let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let job = &mut jobs[id];
            match result {
                Ok(()) => job.done += 1,
                Err(e) => {
                    job.failed += 1;
                    if job.errors.len() < 20 {
                        job.errors.push(e.to_string());
                    }
                }
            }
        }
        let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs[id].finished = true;
    });
    see_other(&format!("/jobs/{id}"))
}

/// A replay by filter as the CLI's (`hookledger replay --status ...`): the
/// count and a sample first, then the run in batches, each replay audited
/// in the run; the same filter and reason again resume it, never replaying
/// twice what it replayed.
async fn bulk_replay(app: Shared, f: Params, filter: ListFilter, reason: String) -> Response {
    use hookledger::ops::bulk::RecordFilter;
    let filter = RecordFilter {
        endpoint: filter.endpoint,
        event_type: filter.event_type,
        subject: filter.subject,
        statuses: filter.statuses,
        reason: reason.clone(),
        ..RecordFilter::default()
    };
    if let Err(e) = filter.check() {
        return error_page(&app, StatusCode::BAD_REQUEST, &e);
    }
    let (selection, _) = match app.console.ops.matching(&filter, BULK_MAX).await {
        Ok(found) => found,
        Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let count = selection.records.len();
    if param(&f, "confirm") != "yes" {
        let sample: String = selection.records.iter().take(10).map(|m| format!("<li>{}</li>", esc(&m.key))).collect();
        let skipped = if selection.replayed_by_this_run > 0 {
            format!(" {} replayed by this run before are left out.", selection.replayed_by_this_run)
        } else {
            String::new()
        };
        let body = format!(
            "<p id=bulk-count>replay {count} record(s) matching the filter, with the reason <b>{}</b>, as {} \
             (run {}).{skipped}</p><ul>{sample}</ul>\
             <form method=post action=\"/bulk\">{}{}<input type=hidden name=action value=replay>\
             <input type=hidden name=reason value=\"{}\"><input type=hidden name=confirm value=yes>\
             <button type=submit class=danger id=confirm>replay {count}</button> <a href=\"/records\">cancel</a></form>",
            esc(&reason),
            esc(&app.console.operator),
            esc(&filter.run()),
            csrf(app.guard.token()),
            hidden_filter(&f),
            esc(&reason),
        );
        return html(StatusCode::OK, page("Confirm", &app.console.operator, &body, None));
    }
    let id = {
        let mut jobs = app.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.push(Job { action: "replay".into(), total: count, ..Job::default() });
        jobs.len() - 1
    };
    let worker = app.clone();
    tokio::spawn(async move {
        for batch in selection.records.chunks(10) {
            let result = worker.console.ops.replay_batch(&filter, batch, &worker.console.caller, now_ms()).await;
            let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let job = &mut jobs[id];
            match result {
                Ok(done) => {
                    job.done += done.replayed;
                    job.failed += done.skipped;
                    if done.skipped > 0 && job.errors.len() < 20 {
                        job.errors.push(format!("{} moved meanwhile (left as they are)", done.skipped));
                    }
                }
                Err(e) => {
                    job.failed += batch.len();
                    if job.errors.len() < 20 {
                        job.errors.push(e.to_string());
                    }
                }
            }
        }
        let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs[id].finished = true;
    });
    see_other(&format!("/jobs/{id}"))
}

async fn job(State(app): State<Shared>, Path(id): Path<usize>) -> Response {
    let Some(job) = app.console.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned() else {
        return error_page(&app, StatusCode::NOT_FOUND, "no such job");
    };
    let seen = job.done + job.failed;
    let mut body = format!(
        "<p id=job-progress><progress max=\"{}\" value=\"{seen}\"></progress> {} of {}: {} done, {} failed{}</p>",
        job.total.max(1),
        seen,
        job.total,
        job.done,
        job.failed,
        if job.finished { " — finished" } else { " — working" }
    );
    for e in &job.errors {
        body.push_str(&format!("<p class=error>{}</p>", esc(e)));
    }
    let refresh = (!job.finished).then_some(1);
    html(StatusCode::OK, page(&format!("Bulk {}", job.action), &app.console.operator, &body, refresh))
}

/// The last scheduled audit of each configured endpoint (kept by the
/// reconciler, `audit_window_secs`): its counts, its missing, doubled, DEAD
/// and PARKED identities, each linked to its record or with the command
/// that repairs it.
async fn audit(State(app): State<Shared>) -> Response {
    use hookledger::completeness::Report;
    use hookledger::ports::BackfillLedger;
    let mut body = String::new();
    let mut any = false;
    for (endpoint, _) in &app.console.endpoints {
        let report = match app.console.ledger.last_audit(endpoint).await {
            Ok(Some(raw)) => match serde_json::from_str::<Report>(&raw) {
                Ok(r) => r,
                Err(e) => {
                    body.push_str(&format!(
                        "<p class=error>{}: unreadable audit ({})</p>",
                        esc(endpoint),
                        esc(&e.to_string())
                    ));
                    continue;
                }
            },
            Ok(None) => continue,
            Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
        };
        any = true;
        let verdict = if report.failed() { "<b class=error>missing or doubled</b>" } else { "complete" };
        body.push_str(&format!(
            "<section class=audit id=\"audit-{e}\"><h2>{e} ({p})</h2><p>window {since} – {until}, audited {at} ago: {verdict}</p>",
            e = esc(endpoint),
            p = esc(&report.provider),
            since = when(report.since * 1000),
            until = when(report.until * 1000),
            at = ago(now_ms() - report.at_ms),
        ));
        let figures = [
            ("listed", report.listed),
            ("recorded", report.recorded),
            ("applied", report.applied),
            ("ignored", report.ignored),
            ("in flight", report.in_flight),
            ("parked", report.parked),
            ("dead", report.dead),
            ("missing", report.missing),
            ("doubled", report.doubled),
        ];
        body.push_str(&figures.iter().map(|(l, v)| fig(l, v.to_string())).collect::<String>());
        for (name, t) in &report.routes {
            body.push_str(&format!(
                "<p>route {}: delivered {}, pending {}{}, dead {}, never queued {}</p>",
                esc(name),
                t.delivered,
                t.pending,
                t.oldest_pending_ms.map_or(String::new(), |a| format!(" (oldest {})", ago(a))),
                t.dead,
                t.never_queued
            ));
        }
        for (title, items, linked) in [
            ("Missing", &report.missing_items, false),
            ("Doubled", &report.doubled_items, true),
            ("Dead", &report.dead_items, true),
            ("Parked", &report.parked_items, true),
            ("Dead deliveries", &report.dead_deliveries, true),
        ] {
            if items.is_empty() {
                continue;
            }
            let rows: String = items
                .iter()
                .map(|n| {
                    let key = if linked { record_link(&n.key) } else { esc(&n.key) };
                    let repair = n.repair.as_deref().map(|r| format!("<code>{}</code>", esc(r))).unwrap_or_default();
                    format!(
                        "<li>{key} {} {} {repair}</li>",
                        esc(n.event_type.as_deref().unwrap_or("")),
                        esc(n.why.as_deref().unwrap_or(""))
                    )
                })
                .collect();
            body.push_str(&format!(
                "<h3>{title}</h3><ul class=\"audit-{}\">{rows}</ul>",
                title.to_lowercase().replace(' ', "-")
            ));
        }
        for note in &report.notes {
            body.push_str(&format!("<p>{}</p>", esc(note)));
        }
        body.push_str("</section>");
    }
    if !any {
        body.push_str(
            "<p id=audit-none>No scheduled audit yet: set <code>audit_window_secs</code> on an endpoint's \
             schedule in HOOKLEDGER_BACKFILL, or run <code>hookledger audit --endpoint E --since T</code>.</p>",
        );
    }
    html(StatusCode::OK, page("Audit", &app.console.operator, &body, None))
}

/// Items a destination's census reads per partition.
const HEALTH_READS: usize = 10_000;

fn ago(ms: i64) -> String {
    match ms.max(0) / 1000 {
        s if s >= 3600 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m {}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// Each route destination's health, and a form to replay its DEAD deliveries.
async fn destinations(State(app): State<Shared>) -> Response {
    let Some((deliveries, names)) = &app.console.deliveries else {
        let body = "<p id=destinations>No routes: no destination to show (HOOKLEDGER_ROUTES).</p>";
        return html(StatusCode::OK, page("Destinations", &app.console.operator, body, None));
    };
    let now = now_ms();
    let mut rows = Vec::new();
    let mut forms = String::new();
    for (name, limits) in names {
        let h = match deliveries.health(name, *limits, now, HEALTH_READS).await {
            Ok(h) => h,
            Err(e) => {
                rows.push(vec![esc(name), format!("unreadable: {}", esc(&e.to_string()))]);
                continue;
            }
        };
        let circuit = match h.open_until {
            Some(u) if h.circuit != "closed" => format!("{} (until {})", h.circuit, when(u)),
            _ => format!("closed, {} failures in a row", h.failures),
        };
        let rate = match (h.limit_per_second, h.rate_in_force) {
            (Some(l), Some(f)) if (l - f).abs() > f64::EPSILON => format!("{f:.2}/s of {l}/s (throttled)"),
            (Some(l), _) => format!("{l}/s"),
            (None, _) => "none".into(),
        };
        let flights = h.max_in_flight.map_or("-".into(), |m| format!("{} of {m}", h.in_flight));
        let answer = h.last_answers.first().map(|(at, a)| format!("{} ({} ago)", esc(a), ago(now - at)));
        rows.push(vec![
            esc(name),
            esc(&circuit),
            esc(&rate),
            flights,
            format!("{}{}", h.pending + h.waiting, if h.partial { "+" } else { "" }),
            h.oldest_pending_age_ms.map(ago).unwrap_or_default(),
            h.dead.to_string(),
            answer.unwrap_or_default(),
        ]);
        if h.dead > 0 {
            forms.push_str(&format!(
                "<form method=post action=\"/destinations/replay\">{}<input type=hidden name=destination value=\"{n}\">\
                 replay {n}'s DEAD deliveries, reason <input name=reason required size=40> \
                 <button type=submit id=\"count-{n}\">count them first</button></form>",
                csrf(app.guard.token()),
                n = esc(name)
            ));
        }
    }
    let mut body = table(
        "destinations",
        &["destination", "circuit", "rate limit", "in flight", "pending", "oldest pending", "dead", "last answer"],
        &rows,
    );
    body.push_str(&forms);
    html(StatusCode::OK, page("Destinations", &app.console.operator, &body, None))
}

/// A destination's DEAD deliveries replayed by its filter: counted and
/// shown first; replayed (in batches, resumable, audited) once confirmed.
async fn replay_deliveries(State(app): State<Shared>, Form(f): Form<Params>) -> Response {
    if let Some(refused) = unchecked(&app, &f) {
        return refused;
    }
    let Some((deliveries, names)) = &app.console.deliveries else {
        return error_page(&app, StatusCode::NOT_FOUND, "no routes");
    };
    let destination = param(&f, "destination").to_owned();
    if !names.iter().any(|(n, _)| *n == destination) {
        return error_page(&app, StatusCode::BAD_REQUEST, "no such destination");
    }
    let reason = param(&f, "reason").to_owned();
    if let Err(e) = reason_ok(&reason) {
        return error_page(&app, StatusCode::BAD_REQUEST, e);
    }
    let filter = hookledger::outbox::health::ReplayFilter {
        destination: destination.clone(),
        since: None,
        until: None,
        reason: reason.clone(),
    };
    let matched = match deliveries.matching(&filter, HEALTH_READS).await {
        Ok((matched, _)) => matched,
        Err(e) => return error_page(&app, StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    if param(&f, "confirm") != "yes" {
        let sample: String = matched.iter().take(10).map(|d| format!("<li>{}</li>", esc(&d.idempotency_key))).collect();
        let body = format!(
            "<p id=replay-count>replay {} DEAD deliveries to {} with the reason <b>{}</b>, as {} (run {}).</p>\
             <ul>{sample}</ul><form method=post action=\"/destinations/replay\">{}\
             <input type=hidden name=destination value=\"{}\"><input type=hidden name=reason value=\"{}\">\
             <input type=hidden name=confirm value=yes><button type=submit class=danger id=confirm>replay {}</button> \
             <a href=\"/destinations\">cancel</a></form>",
            matched.len(),
            esc(&destination),
            esc(&reason),
            esc(&app.console.operator),
            esc(&filter.run()),
            csrf(app.guard.token()),
            esc(&destination),
            esc(&reason),
            matched.len()
        );
        return html(StatusCode::OK, page("Confirm", &app.console.operator, &body, None));
    }
    let id = {
        let mut jobs = app.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.push(Job {
            action: format!("replay of {destination}'s deliveries"),
            total: matched.len(),
            ..Job::default()
        });
        jobs.len() - 1
    };
    let worker = app.clone();
    tokio::spawn(async move {
        let Some((deliveries, _)) = &worker.console.deliveries else { return };
        for batch in matched.chunks(100) {
            let done = deliveries.replay_batch(&filter, batch, &worker.console.caller, now_ms()).await;
            let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let job = &mut jobs[id];
            match done {
                Ok(d) => {
                    job.done += d.replayed;
                    job.failed += d.skipped;
                }
                Err(e) => {
                    job.failed += batch.len();
                    job.errors.push(e.to_string());
                    break;
                }
            }
        }
        let mut jobs = worker.console.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs[id].finished = true;
    });
    see_other(&format!("/jobs/{id}"))
}
