//! What the bill is made of, measured (`scripts/bench-cost` prices it with
//! `bench/prices.toml`). For each contract of the reference app, N events
//! through the intake and the processor against the emulator, every flow
//! the realistic mix has:
//!
//! - `intake_new` (a first delivery), `processor` (its processing),
//!   `intake_duplicate` (the provider's repeat: 10 % of events in the mix),
//!   `processor_redelivery` (the work message delivered again: 5 %), and, for
//!   the payment contract, `intake_large` and `processor_large` (a 64 KiB
//!   body: 1 %);
//! - each flow's AWS requests by operation, DynamoDB write and read units
//!   (the capacity model), SQS and SNS requests in 64 KB chunks, S3 requests;
//! - in a second pass with plain clients, each flow's own CPU time (this
//!   thread's, on a current-thread runtime: the code, the SDK and the HTTP
//!   client; not the emulator's) in the build it runs in (`--release` in the
//!   script), the log bytes it writes (JSON lines at INFO, as deployed), and
//!   the EMF document its invocation flushes (the functions' collector);
//! - the stored bytes each event leaves in the table (its items, by the
//!   capacity model's item size), for storage at the retention.
//!
//! Prints JSON. The test that every price names its source and the date it
//! was read is here too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hookledger::adapters::dynamodb::{DynamoLedger, table_definition};
use hookledger::adapters::sqs::{SqsQueue, WorkMessage};
use hookledger::adapters::stripe::StripeApi;
use hookledger::config::ProcessorSettings;
use hookledger::identity::EventKey;
use hookledger::intake::{Intake, IntakeRequest};
use hookledger::secret::Secret;
use hookledger_it::capacity::{Capacity, Recorded, item_size};
use hookledger_it::faults::emulator_http_client;
use http::Method;
use serde_json::json;

use crate::bench::{CONTRACTS, Event, contract_events, events, now_ms};
use crate::fake_provider::FakeStripe;
use crate::support::Stack;

/// The CPU time this thread has run, in nanoseconds (Linux's schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// A byte counter the log layer writes into.
#[derive(Clone, Default)]
struct Counted(Arc<Mutex<u64>>);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        *self.0.lock().unwrap() += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A payment event with a 64 KiB body (a note of hex: compresses about 2 to 1).
fn large_payment(id: &str) -> Vec<u8> {
    let mut v: serde_json::Value =
        serde_json::from_slice(&crate::processor::pi_succeeded(id, &format!("pi_{id}"), Some("cus_bench"), 100))
            .unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let note: String = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x % 16) as usize])
        })
        .collect();
    v["data"]["object"]["metadata"] = json!({ "note": note });
    v.to_string().into_bytes()
}

/// The flows of one contract's events, in the order they run: (flow, event, is it the intake).
fn flows_of(contract: &str, batch: &[Event]) -> Vec<(&'static str, usize)> {
    let mut out = Vec::new();
    for i in 0..batch.len() {
        let (new, processed) =
            if contract == "large" { ("intake_large", "processor_large") } else { ("intake_new", "processor") };
        out.push((new, i));
        out.push((processed, i));
        out.push(("intake_duplicate", i));
        out.push(("processor_redelivery", i));
    }
    out
}

/// Billed requests of the recorded sends to SQS (`SendMessage`,
/// `SendMessageBatch`) or SNS (`Publish`): one per started 64 KB of payload.
fn chunks(recorded: &[Recorded], service: &str) -> f64 {
    let size = |len: usize| (len.max(1) as f64 / 65_536.0).ceil();
    let mut n = 0.0;
    for r in recorded {
        let target = header(r, "x-amz-target").to_ascii_lowercase();
        let body = String::from_utf8_lossy(&r.body);
        match service {
            "sqs" if target.starts_with("amazonsqs.sendmessage") => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
                let len = match v["Entries"].as_array() {
                    // A batch is billed on its whole payload.
                    Some(entries) => entries.iter().map(|e| e["MessageBody"].as_str().map_or(0, str::len)).sum(),
                    None => v["MessageBody"].as_str().map_or(0, str::len),
                };
                n += size(len);
            }
            "sqs" if target.starts_with("amazonsqs.") => n += 1.0,
            // SNS speaks the query protocol: the message is in the form.
            "sns" if body.starts_with("Action=Publish") || body.contains("&Action=Publish") => n += size(body.len()),
            _ => {}
        }
    }
    n
}

fn header(r: &Recorded, name: &str) -> String {
    r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone()).unwrap_or_default()
}

struct Rig {
    stack: Stack,
    intake: Intake<DynamoLedger, SqsQueue>,
    processor: hookledger::wiring::LiveProcessor,
}

/// An intake and a processor on `stack`, their clients on `aws`.
async fn rig(stack: Stack, aws: &aws_config::SdkConfig, base: String) -> Rig {
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let sqs = aws_sdk_sqs::Client::new(aws);
    let sns = aws_sdk_sns::Client::new(aws);
    let (topic, _inbox) = stack.notify_topic().await;
    let source: Arc<dyn hookledger::projection::fetch::SubscriptionSource> =
        Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    stack.map_customer_in("tenant-a", "cus_bench", "acct_bench").await;
    let shards = stack.settings().index_shards;
    // As deployed: bodies up to the default 256 KiB.
    let mut intake_settings = stack.settings();
    intake_settings.max_body_bytes = hookledger::config::DEFAULT_MAX_BODY_BYTES;
    let intake = Intake::new(
        stack.endpoints().await,
        intake_settings,
        DynamoLedger::new(ddb.clone(), &stack.table).with_shards(shards),
        SqsQueue::new(sqs, &stack.queue_url),
    );
    let settings = ProcessorSettings { index_shards: shards, ..ProcessorSettings::default() };
    let processor = hookledger::wiring::processor(
        DynamoLedger::new(ddb.clone(), &stack.table),
        hookledger_app::reference_registry(Some(source), Some(topic)),
        Some(hookledger::wiring::dispatcher(ddb, sns, stack.table.clone())),
        settings,
    );
    Rig { stack, intake, processor }
}

/// Runs every flow of every contract's events on `rig`; `around` is called
/// before and after each flow's measured call with its name.
async fn drive(rig: &Rig, fake: &FakeStripe, n: usize, run: &str, mut around: impl FnMut(&str, Option<&str>)) -> usize {
    let mut events_total = 0;
    for contract in CONTRACTS.iter().copied().chain(["large"]) {
        let batch: Vec<Event> = if contract == "large" {
            (0..n.div_ceil(4))
                .map(|i| {
                    let id = format!("large-{run}-{i}");
                    Event { endpoint: "stripe-a", body: large_payment(&id), id }
                })
                .collect()
        } else {
            contract_events(contract, n, run)
        };
        if contract == "subscription" {
            for i in 0..batch.len() {
                fake.set(&format!("sub_{run}_{i}"), "cus_bench", "active", 3);
            }
        }
        let mut message = None;
        for (flow, i) in flows_of(contract, &batch) {
            let e = &batch[i];
            let now = SystemTime::now();
            let now_s = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            let headers = e.headers(now_s);
            let req = IntakeRequest {
                query: "",
                endpoint: e.endpoint,
                method: &Method::POST,
                headers: &headers,
                body: &e.body,
                now,
                request_id: "bench",
            };
            let scope = format!("{flow}/{contract}");
            match flow {
                "intake_new" | "intake_large" | "intake_duplicate" => {
                    around(&scope, None);
                    let answer = rig.intake.handle(req).await;
                    around(&scope, Some(flow));
                    let want = if flow == "intake_duplicate" { 200 } else { 202 };
                    assert_eq!(answer.status, want, "{scope}: {answer:?}");
                    if flow != "intake_duplicate" {
                        let out = rig
                            .stack
                            .sqs
                            .receive_message()
                            .queue_url(&rig.stack.queue_url)
                            .max_number_of_messages(1)
                            .send()
                            .await
                            .unwrap();
                        let m = out.messages.unwrap_or_default().pop().expect("a message");
                        let work: WorkMessage = serde_json::from_str(m.body().unwrap()).unwrap();
                        rig.stack
                            .sqs
                            .delete_message()
                            .queue_url(&rig.stack.queue_url)
                            .receipt_handle(m.receipt_handle().unwrap())
                            .send()
                            .await
                            .unwrap();
                        message = Some(work);
                    }
                }
                _ => {
                    let work = message.as_ref().expect("the event's work message");
                    let key = EventKey::from_stored(&work.key).unwrap();
                    around(&scope, None);
                    let report = rig.processor.process_message(&key, work.payload().as_deref(), now_ms()).await;
                    around(&scope, Some(flow));
                    let report = report.unwrap_or_else(|e| panic!("{scope}: {e}"));
                    let want = if flow == "processor_redelivery" {
                        hookledger::processor::Outcome::AlreadyFinal
                    } else {
                        hookledger::processor::Outcome::Applied
                    };
                    assert_eq!(report.outcome, want, "{scope}: {report:?}");
                }
            }
        }
        events_total += batch.len();
    }
    events_total
}

/// Reconciler runs at `at` on `stack` (after activity, as at load), through
/// the capacity model under `scope`: (read units, write units).
async fn reconciler_runs(
    stack: &Stack,
    aws: &aws_config::SdkConfig,
    capacity: &Capacity,
    scope: &str,
    at: [i64; 2],
) -> (f64, f64) {
    use hookledger::ports::Activity;
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let ledger = DynamoLedger::new(ddb.clone(), &stack.table).with_shards(stack.settings().index_shards);
    let reconciler = hookledger::reconciler::Reconciler::new(
        ledger.clone(),
        SqsQueue::new(aws_sdk_sqs::Client::new(aws), &stack.queue_url),
        Some(hookledger::wiring::dispatcher(ddb, aws_sdk_sns::Client::new(aws), stack.table.clone())),
        hookledger::projection::recheck::Rechecks::new(),
        hookledger::config::ReconcilerSettings::default(),
    );
    for t in at {
        ledger.note_activity(t).await;
        capacity.scope(scope);
        let summary = reconciler.run(t, std::time::Instant::now() + std::time::Duration::from_secs(300)).await;
        capacity.scope("harness");
        assert!(summary.errors.is_empty() && summary.due_seen == 0, "{scope}: {summary:?}");
    }
    let tally = capacity.tallies().remove(scope).unwrap_or_default();
    (tally.rcu, tally.wcu())
}

#[tokio::test]
#[ignore = "a bench: run by scripts/bench-cost, prints JSON"]
async fn cost() {
    let n = events();
    let run = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
    let (fake, base) = FakeStripe::start().await;

    // Pass 1: requests and units, through the recorder and the capacity model.
    let stack = Stack::new().await;
    let capacity = Capacity::new(stack.ddb.clone(), &stack.table, &table_definition());
    let measured = aws_config::from_env().http_client(capacity.client(emulator_http_client())).load().await;
    let table = stack.table.clone();
    let units = rig(stack, &measured, base.clone()).await;
    capacity.record_requests(true);
    let scoped = capacity.clone();
    let mut events_of: BTreeMap<String, usize> = BTreeMap::new();
    drive(&units, &fake, n, &run, |scope, done| {
        if done.is_none() {
            scoped.scope(scope);
        } else {
            scoped.scope("harness");
            *events_of.entry(scope.to_owned()).or_default() += 1;
        }
    })
    .await;
    capacity.record_requests(false);
    let items = units.stack.items().await;
    let stored: Vec<usize> = items.iter().map(item_size).collect();
    // The `due` index's entries the records keep (keys only): their keys
    // and DynamoDB's 100 bytes of index overhead each.
    let indexed: usize = items
        .iter()
        .filter(|i| i.contains_key("due_shard") && i.contains_key("due_at"))
        .map(|i| {
            let keys: hookledger::adapters::dynamodb::Item = ["pk", "sk", "due_shard", "due_at"]
                .iter()
                .filter_map(|k| i.get(*k).map(|v| ((*k).to_owned(), v.clone())))
                .collect();
            item_size(&keys) + 100
        })
        .sum();
    let stored_events = CONTRACTS.len() * n + n.div_ceil(4);
    // The reconciler at load: finished records' entries stay in the due
    // index, and the records phase reads each one in the runs that meet it
    // (the look-ahead, then the run that passes it). Two runs over them
    // (before, then past them), less the same two runs over an empty
    // table: what an entry costs per run that reads it.
    let past = now_ms() + hookledger::policy::REDRIVE_GRACE_MS + hookledger::ledger::CURSOR_SETTLE_MS + 1_000;
    let at = [now_ms(), past];
    let loaded = reconciler_runs(&units.stack, &measured, &capacity, "reconciler_loaded", at).await;
    let empty = reconciler_runs(&Stack::new().await, &measured, &capacity, "reconciler_empty", at).await;
    let reconciler = json!({
        "entries": stored_events,
        "read_units_per_entry_per_run": (loaded.0 - empty.0).max(0.0) / stored_events as f64 / 2.0,
        "write_units_per_run": (loaded.1 - empty.1).max(0.0) / 2.0,
        // A run at load reads every shard whatever it finds: at the stack's shards.
        "read_units_per_run_empty": empty.0 / 2.0,
        "shards": units.stack.settings().index_shards,
    });

    // Pass 2: CPU time and log bytes, with plain clients and the functions' log format.
    let plain = aws_config::from_env().http_client(emulator_http_client()).load().await;
    let timing = rig(Stack::new().await, &plain, base).await;
    let logs = Counted::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // The functions' metrics collector: the EMF document each invocation
    // flushes, measured (one message per processor invocation here; the
    // bench divides it by the batch).
    let emf = hookledger::telemetry::init_metrics("processor").expect("the only metrics recorder in this process");
    let mut cpu: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let (mut cpu_at, mut log_at) = (0, 0);
    let counted = logs.clone();
    drive(&timing, &fake, n, &format!("{run}t"), |scope, done| {
        let (now_cpu, now_log) = (thread_cpu_ns(), *counted.0.lock().unwrap());
        if done.is_none() {
            hookledger::telemetry::write_emf(emf, std::io::sink()).expect("a sink takes anything");
            (cpu_at, log_at) = (now_cpu, now_log);
        } else {
            let mut doc = Vec::new();
            hookledger::telemetry::write_emf(emf, &mut doc).expect("a vector takes anything");
            let e = cpu.entry(scope.to_owned()).or_default();
            e.0 += now_cpu - cpu_at;
            e.1 += now_log - log_at;
            e.2 += doc.len() as u64;
        }
    })
    .await;

    let tallies = capacity.tallies();
    let mut flows = serde_json::Map::new();
    for (scope, count) in &events_of {
        let tally = tallies.get(scope).cloned().unwrap_or_default();
        let recorded = capacity.recorded(scope);
        let per = |x: f64| x / *count as f64;
        let (cpu_ns, log_bytes, emf_bytes) = cpu.get(scope).copied().unwrap_or_default();
        let by_service = |prefix: &str| {
            tally.by_operation.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| *v as f64).sum::<f64>()
        };
        flows.insert(
            scope.clone(),
            json!({
                "events": count,
                "requests": per(tally.requests as f64),
                "by_operation": tally.by_operation.iter().map(|(k, v)| (k.clone(), json!(per(*v as f64)))).collect::<BTreeMap<_, _>>(),
                "dynamodb_requests": per(by_service("dynamodb:")),
                "write_units": per(tally.wcu()),
                "write_units_by_item": tally.wcu_by_item.iter().map(|(k, v)| (k.clone(), json!(per(*v)))).collect::<BTreeMap<_, _>>(),
                "read_units": per(tally.rcu),
                "sqs_requests": per(chunks(&recorded, "sqs")),
                "sns_requests": per(chunks(&recorded, "sns")),
                "s3_put_requests": per(by_service("s3:Put")) + 0.0,
                "s3_get_requests": per(by_service("s3:Get")) + 0.0,
                "cpu_ms": per(cpu_ns as f64 / 1e6),
                "log_bytes": per(log_bytes as f64),
                "emf_bytes": per(emf_bytes as f64),
            }),
        );
    }
    // One event of each contract as sent, for the comparison that runs the same bodies.
    let samples: BTreeMap<&str, serde_json::Value> = CONTRACTS
        .iter()
        .map(|c| {
            let e = contract_events(c, 1, "sample").remove(0);
            (
                *c,
                json!({"provider": if e.endpoint.starts_with("stripe") { "stripe" } else { "standard_webhooks" },
                        "body": String::from_utf8_lossy(&e.body)}),
            )
        })
        .chain([("large", json!({"provider": "stripe", "body": String::from_utf8_lossy(&large_payment("sample"))}))])
        .collect();
    let out = json!({
        "samples": samples,
        "events_per_contract": n,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "table": table,
        "flows": flows,
        "stored_bytes_per_event": stored.iter().sum::<usize>() as f64 / stored_events as f64,
        "index_bytes_per_event": indexed as f64 / stored_events as f64,
        "reconciler": reconciler,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}

/// Every price in `bench/prices.toml` names the page it is published on and
/// the date it was read, and has a number and a unit.
#[test]
fn every_price_names_its_source_and_the_date_it_was_read() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/prices.toml")).unwrap();
    let entries = prices(&text);
    assert!(entries.len() >= 20, "{} entries", entries.len());
    for (name, fields) in &entries {
        for key in ["price", "per", "unit", "source", "read"] {
            assert!(fields.contains_key(key), "[{name}] has no {key}");
        }
        let source = &fields["source"];
        assert!(source.starts_with("\"https://"), "[{name}] source {source} is not a page");
        let read = fields["read"].trim_matches('"');
        let ok = read.len() == 10 && read.as_bytes()[4] == b'-' && read.as_bytes()[7] == b'-';
        assert!(ok && read.replace('-', "").bytes().all(|b| b.is_ascii_digit()), "[{name}] read {read}: YYYY-MM-DD");
        assert!(fields["price"].replace('_', "").parse::<f64>().is_ok(), "[{name}] price");
    }
    // The checker can fail: an entry without its date is refused.
    let planted = prices("[x]\nprice = 1\nper = 1\nunit = \"u\"\nsource = \"https://example.com\"\n");
    assert!(!planted["x"].contains_key("read"));
}

/// `[section]` → its `key = value` lines (the subset of TOML the file uses).
fn prices(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut at = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            at = Some(name.to_owned());
            out.entry(name.to_owned()).or_default();
        } else if let (Some(section), Some((k, v))) = (&at, line.split_once('=')) {
            out.get_mut(section).unwrap().insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    out
}

/// The write and read units of the identity contracts' intake flows (issue
/// 41), by the same capacity model: a body bound to its identity (Shopify:
/// new, its own retry, a replay under another id) and a notification
/// claimed by generation (Dropbox: new, repeated while it waits, repeated
/// once processed, and the same again at generation 3, which reads the
/// generation the first record notes). Prints JSON, per flow; run by
/// `scripts/bench-identity`.
#[tokio::test]
#[ignore = "a bench: run by scripts/bench-identity, prints JSON"]
async fn identity_units() {
    use hookledger::config::ProviderKind;
    let n = events();
    let stack = Stack::new().await;
    let capacity = Capacity::new(stack.ddb.clone(), &stack.table, &table_definition());
    let measured = aws_config::from_env().http_client(capacity.client(emulator_http_client())).load().await;
    let ddb = aws_sdk_dynamodb::Client::new(&measured);
    let shards = stack.settings().index_shards;
    let intake = Intake::new(
        stack.endpoints().await,
        stack.settings(),
        DynamoLedger::new(ddb.clone(), &stack.table).with_shards(shards),
        SqsQueue::new(aws_sdk_sqs::Client::new(&measured), &stack.queue_url),
    );
    let ledger = DynamoLedger::new(ddb, &stack.table).with_shards(shards);
    let post = |endpoint: &'static str, id: String, body: Vec<u8>| {
        let intake = &intake;
        async move {
            let p = ProviderKind::named(endpoint).unwrap();
            let spec = serde_json::from_value(json!({"provider": endpoint, "secrets": ["env:HMAC"]})).unwrap();
            let now = SystemTime::now();
            let now_s = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            let signed = p.sign(&spec, &Secret::new(crate::support::HMAC_SECRET), &id, "orders/paid", now_s, &body);
            let mut headers = http::HeaderMap::new();
            for (k, v) in signed.unwrap() {
                let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap();
                headers.insert(name, http::HeaderValue::from_str(&v).unwrap());
            }
            let req = IntakeRequest {
                query: "",
                endpoint,
                method: &Method::POST,
                headers: &headers,
                body: &body,
                now,
                request_id: "bench",
            };
            intake.handle(req).await
        }
    };
    // Finishes a record as the processor would (lease, then commit).
    let finish = |key: EventKey| {
        let ledger = &ledger;
        async move {
            use hookledger::ports::WorkLedger;
            let t = now_ms();
            ledger.lease(&key, "bench", t, 30_000).await.unwrap();
            ledger.commit(&key, "bench", &[], "ignored", None, t + 1).await.unwrap();
        }
    };
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    capacity.record_requests(true);
    for i in 0..n {
        let order = format!(r#"{{"id":{i},"email":"jon@example.com","total_price":"199.00"}}"#).into_bytes();
        let mut step = |flow: &'static str| {
            capacity.scope(flow);
            *counts.entry(flow).or_default() += 1;
        };
        step("shopify_new");
        assert_eq!(post("shopify", format!("a{i}"), order.clone()).await.code, "accepted");
        step("shopify_retry");
        assert_eq!(post("shopify", format!("a{i}"), order.clone()).await.code, "duplicate");
        step("shopify_replay");
        assert_eq!(post("shopify", format!("b{i}"), order.clone()).await.code, "replay");
        let note = format!(r#"{{"list_folder":{{"accounts":["dbid:bench-{i}"]}},"delta":{{"users":[{i}]}}}}"#);
        let note = note.into_bytes();
        let first = EventKey::new("dropbox", "dropbox", &hookledger::identity::payload_hash(&note));
        step("dropbox_new");
        assert_eq!(post("dropbox", String::new(), note.clone()).await.code, "accepted");
        step("dropbox_repeat_waiting");
        assert_eq!(post("dropbox", String::new(), note.clone()).await.code, "duplicate");
        capacity.scope("harness");
        finish(first.clone()).await;
        step("dropbox_repeat_processed");
        assert_eq!(post("dropbox", String::new(), note.clone()).await.code, "accepted");
        capacity.scope("harness");
        finish(EventKey::new("dropbox", "dropbox", &format!("{}@g2", first.event_id()))).await;
        step("dropbox_repeat_generation_3");
        assert_eq!(post("dropbox", String::new(), note.clone()).await.code, "accepted");
        capacity.scope("harness");
    }
    capacity.record_requests(false);
    let tallies = capacity.tallies();
    let mut flows = serde_json::Map::new();
    for (flow, count) in counts {
        let tally = tallies.get(flow).cloned().unwrap_or_default();
        let per = |x: f64| x / count as f64;
        flows.insert(
            flow.to_owned(),
            json!({
                "events": count,
                "requests": per(tally.requests as f64),
                "by_operation": tally.by_operation.iter().map(|(k, v)| (k.clone(), json!(per(*v as f64)))).collect::<BTreeMap<_, _>>(),
                "write_units": per(tally.wcu()),
                "write_units_by_item": tally.wcu_by_item.iter().map(|(k, v)| (k.clone(), json!(per(*v)))).collect::<BTreeMap<_, _>>(),
                "read_units": per(tally.rcu),
            }),
        );
    }
    println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(flows)).unwrap());
}
