//! The pipeline bench: drives N events per contract through the intake and
//! the processor against the emulator, with the SDK-level recorder and the
//! capacity model (`hookledger_it::capacity`), and prints JSON:
//!
//! - requests and sequential round trips per event, by flow;
//! - modelled write units (table and indexes) and read units per event;
//! - events/s through the code, against what the emulator alone sustains
//!   replaying the same recorded requests;
//! - the index capacity at the design rate (`index_capacity`): index write
//!   units per event of each contract by the partition kind they land in
//!   (records, outbox, re-checks, attention), and the shards each kind needs
//!   so that no partition key takes more than 500 write units/s at 10,000
//!   events/s of its worst contract;
//! - what an idle reconciler run costs (`idle_reconciler`): its queries and
//!   read units at 16 shards and at the default.
//!
//! Not a test: `scripts/bench-pipeline` starts the emulator and runs it
//! (`cargo test --release -p hookledger-it --test it bench::pipeline --
//! --ignored --nocapture`, `BENCH_EVENTS` events per contract, default 20).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::{
    ATTENTION_INDEX, DUE_INDEX, DynamoLedger, attention_shard, due_partition, table_definition,
};
use hookledger::adapters::sqs::{SqsQueue, WorkMessage};
use hookledger::adapters::stripe::StripeApi;
use hookledger::config::ProcessorSettings;
use hookledger::identity::EventKey;
use hookledger::intake::{Intake, IntakeRequest};
use hookledger::ledger::DuePartition;
use hookledger::policy::DEFAULT_INDEX_SHARDS;
use hookledger::secret::Secret;
use hookledger::verify::{standard, stripe};
use hookledger_it::capacity::{Capacity, Tally, partition_kind, shards_needed};
use hookledger_it::faults::emulator_http_client;
use http::{HeaderMap, HeaderValue, Method};
use serde_json::json;

use crate::fake_provider::FakeStripe;
use crate::processor::{inventory, pi_succeeded, sub_updated};
use crate::support::{STRIPE_SECRET, SVIX_SECRET, Stack};

/// The reference app's contracts, in the order the bench drives them.
pub(crate) const CONTRACTS: [&str; 4] = ["payment", "seats_4k", "inventory", "subscription"];
/// The design rate: events per second of one contract.
const DESIGN_EVENTS_PER_SECOND: f64 = 10_000.0;
/// Write units per second one index partition key may take: half of
/// DynamoDB's 1,000, a margin for uneven hashing and retries.
const MAX_WCU_PER_PARTITION_KEY: f64 = 500.0;

pub(crate) fn events() -> usize {
    std::env::var("BENCH_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A seats snapshot of at least 4 KiB (assignments with provider ids and
/// addresses, which compress about 3 to 1, as real ones do).
pub(crate) fn seats_4k(account: &str, revision: i64) -> Vec<u8> {
    use hookledger::identity::payload_hash;
    let body = |n: u32| {
        let assignments: Vec<_> = (0..n)
            .map(|i| {
                let h = payload_hash(format!("{account}/{i}").as_bytes());
                let role = ["member", "admin", "billing"][i as usize % 3];
                json!({"user": format!("usr_{}", &h[..24]), "email": format!("{}@example.com", &h[24..34]),
                    "role": role, "since": 1_700_000_000 + i64::from(i) * 7_919})
            })
            .collect();
        json!({"type": "seats.snapshot", "data": {"account": account, "generation": 1, "revision": revision,
            "seats": n, "assignments": assignments}})
        .to_string()
        .into_bytes()
    };
    (30..).map(body).find(|b| b.len() >= 4096).unwrap_or_default()
}

pub(crate) struct Event {
    pub endpoint: &'static str,
    pub id: String,
    pub body: Vec<u8>,
}

impl Event {
    pub(crate) fn headers(&self, now_s: i64) -> HeaderMap {
        let mut h = HeaderMap::new();
        if self.endpoint.starts_with("stripe") {
            let sig = stripe::sign(&Secret::new(STRIPE_SECRET), now_s, &self.body);
            h.insert(stripe::SIGNATURE_HEADER, HeaderValue::from_str(&sig).unwrap());
        } else {
            let key = standard::decode_secret(&Secret::new(SVIX_SECRET)).unwrap();
            let sig = standard::sign(&key, &self.id, now_s, &self.body);
            h.insert("webhook-id", HeaderValue::from_str(&self.id).unwrap());
            h.insert("webhook-timestamp", HeaderValue::from(now_s));
            h.insert("webhook-signature", HeaderValue::from_str(&sig).unwrap());
        }
        h
    }
}

/// N events of one contract, each new (distinct subjects where order matters).
pub(crate) fn contract_events(contract: &str, n: usize, run: &str) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let id = format!("{contract}-{run}-{i}");
            let (endpoint, body) = match contract {
                "payment" => ("stripe-a", pi_succeeded(&id, &format!("pi_{id}"), Some("cus_bench"), 100)),
                "seats_4k" => ("svix", seats_4k(&format!("acct_{run}_{i}"), 1)),
                // One stream, in order: each delta is the next.
                "inventory" => ("svix", inventory(&format!("sku_{run}"), i as i64 + 1, 1)),
                "subscription" => ("stripe-a", sub_updated(&id, &format!("sub_{run}_{i}"), "cus_bench")),
                other => unreachable!("{other}"),
            };
            Event { endpoint, id, body }
        })
        .collect()
}

fn per_event(t: &Tally, n: usize) -> serde_json::Value {
    let n = n as f64;
    json!({
        "requests": t.requests as f64 / n,
        "round_trips": t.requests as f64 / n,
        "by_operation": t.by_operation.iter().map(|(k, v)| (k.clone(), json!(*v as f64 / n))).collect::<BTreeMap<_, _>>(),
        "write_units": t.wcu() / n,
        "table_write_units": t.table_wcu / n,
        "index_write_units": t.index_wcu / n,
        "index_write_units_by_partition":
            t.index_wcu_by_partition.iter().map(|(k, v)| (k.clone(), json!(v / n))).collect::<BTreeMap<_, _>>(),
        "read_units": t.rcu / n,
    })
}

/// The index partition kinds by name, each with its key in
/// [`Tally::index_wcu_by_partition`] (from the partition names the adapter writes).
fn partition_kinds() -> Vec<(&'static str, String)> {
    let kind = |index: &str, partition: String| partition_kind(index, Some(&AttributeValue::S(partition)));
    DuePartition::ALL
        .iter()
        .map(|&p| (p.name(), kind(DUE_INDEX, due_partition(p, 0))))
        .chain([("attention", kind(ATTENTION_INDEX, attention_shard(0)))])
        .collect()
}

/// Index write units per event of each contract by partition kind (every
/// flow of the contract: the new event, its processing, its duplicate), and
/// the shards each kind needs at the design rate of its worst contract.
fn index_capacity(tallies: &BTreeMap<String, Tally>, n: usize) -> serde_json::Value {
    let kinds = partition_kinds();
    let mut per_contract = BTreeMap::new();
    for contract in CONTRACTS {
        let mut units: BTreeMap<String, f64> = kinds.iter().map(|(name, _)| ((*name).to_owned(), 0.0)).collect();
        for (_, tally) in tallies.iter().filter(|(scope, _)| scope.rsplit('/').next() == Some(contract)) {
            for (key, u) in &tally.index_wcu_by_partition {
                let name = kinds.iter().find(|(_, k)| k == key).map_or(key.as_str(), |(name, _)| name);
                *units.entry(name.to_owned()).or_default() += u / n as f64;
            }
        }
        per_contract.insert(contract, units);
    }
    let mut needed = serde_json::Map::new();
    let mut at_default = serde_json::Map::new();
    let mut worst_kind = 1;
    for name in per_contract.values().flat_map(|u| u.keys()).collect::<std::collections::BTreeSet<_>>() {
        let of = |c: &str| per_contract[c].get(name).copied().unwrap_or(0.0);
        let units = CONTRACTS.iter().map(|c| of(c)).fold(0.0, f64::max);
        let worst: Vec<_> = CONTRACTS.iter().filter(|c| units > 0.0 && of(c) == units).collect();
        let shards = shards_needed(units, DESIGN_EVENTS_PER_SECOND, MAX_WCU_PER_PARTITION_KEY);
        worst_kind = worst_kind.max(shards);
        needed
            .insert(name.clone(), json!({"shards": shards, "worst_contracts": worst, "write_units_per_event": units}));
        at_default.insert(name.clone(), json!(units * DESIGN_EVENTS_PER_SECOND / f64::from(DEFAULT_INDEX_SHARDS)));
    }
    json!({
        "events_per_second": DESIGN_EVENTS_PER_SECOND,
        "max_write_units_per_partition_key": MAX_WCU_PER_PARTITION_KEY,
        "write_units_per_event": per_contract,
        "shards_needed": needed,
        "shards_needed_by_the_worst_kind": worst_kind,
        "default_shards": DEFAULT_INDEX_SHARDS,
        "default_carries_every_kind": DEFAULT_INDEX_SHARDS >= worst_kind,
        "write_units_per_partition_key_at_the_default": at_default,
    })
}

/// One reconciler run over an empty table at each shard count: its
/// requests (all queries), modelled read units and seconds against the emulator.
async fn idle_reconciler(capacity: &Capacity, measured: &aws_config::SdkConfig) -> serde_json::Value {
    use hookledger::reconciler::Reconciler;
    let idle = Stack::new().await;
    let ddb = aws_sdk_dynamodb::Client::new(measured);
    let mut runs = serde_json::Map::new();
    let mut counts = vec![16, DEFAULT_INDEX_SHARDS];
    counts.dedup();
    for shards in counts {
        let dispatcher =
            hookledger::wiring::dispatcher(ddb.clone(), aws_sdk_sns::Client::new(measured), idle.table.clone());
        let reconciler = Reconciler::new(
            DynamoLedger::new(ddb.clone(), &idle.table).with_shards(shards),
            SqsQueue::new(aws_sdk_sqs::Client::new(measured), &idle.queue_url),
            Some(dispatcher),
            hookledger::projection::recheck::Rechecks::new(),
            hookledger::config::ReconcilerSettings::default(),
        );
        let scope = format!("reconciler_idle/{shards}");
        capacity.scope(&scope);
        let started = Instant::now();
        let summary = reconciler.run(now_ms(), Instant::now() + std::time::Duration::from_secs(300)).await;
        let seconds = started.elapsed().as_secs_f64();
        assert!(summary.complete && summary.errors.is_empty(), "{summary:?}");
        let tally = capacity.tallies().remove(&scope).unwrap_or_default();
        runs.insert(
            shards.to_string(),
            json!({"requests": tally.requests, "by_operation": tally.by_operation, "read_units": tally.rcu,
                "seconds_against_the_emulator": seconds}),
        );
    }
    serde_json::Value::Object(runs)
}

/// Replays recorded requests against the emulator, one after another (a
/// connection each, `Connection: close`), and returns the seconds it took.
async fn replay(requests: &[hookledger_it::capacity::Recorded]) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    for r in requests {
        let url = url::Url::parse(&r.uri).unwrap();
        let addr = format!("{}:{}", url.host_str().unwrap(), url.port_or_known_default().unwrap());
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut head =
            format!("POST {} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n", url.path(), url.host_str().unwrap());
        for (k, v) in &r.headers {
            if !matches!(k.as_str(), "content-length" | "host" | "connection") {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", r.body.len()));
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&r.body).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
    }
    started.elapsed().as_secs_f64()
}

#[tokio::test]
#[ignore = "a bench: run by scripts/bench-pipeline, prints JSON"]
async fn pipeline() {
    let n = events();
    let stack = Stack::new().await;
    let capacity = Capacity::new(stack.ddb.clone(), &stack.table, &table_definition());
    let measured = aws_config::from_env().http_client(capacity.client(emulator_http_client())).load().await;
    let ddb = aws_sdk_dynamodb::Client::new(&measured);
    let sqs = aws_sdk_sqs::Client::new(&measured);
    let sns = aws_sdk_sns::Client::new(&measured);
    let (topic, _inbox) = stack.notify_topic().await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn hookledger::projection::fetch::SubscriptionSource> =
        Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    stack.map_customer_in("tenant-a", "cus_bench", "acct_bench").await;

    let shards = stack.settings().index_shards;
    let intake = Intake::new(
        stack.endpoints().await,
        stack.settings(),
        DynamoLedger::new(ddb.clone(), &stack.table).with_shards(shards),
        SqsQueue::new(sqs.clone(), &stack.queue_url),
    );
    let settings = ProcessorSettings { index_shards: shards, ..ProcessorSettings::default() };
    let processor = hookledger::wiring::processor(
        DynamoLedger::new(ddb.clone(), &stack.table),
        hookledger_app::reference_registry(Some(source), Some(topic)),
        Some(hookledger::wiring::dispatcher(ddb.clone(), sns, stack.table.clone())),
        settings,
    );

    let mut flows = serde_json::Map::new();
    let mut code_seconds = 0.0;
    let mut total_events = 0usize;
    let run = uuid::Uuid::new_v4().simple().to_string()[..6].to_owned();
    capacity.record_requests(true);
    for contract in CONTRACTS {
        let batch = contract_events(contract, n, &run);
        if contract == "subscription" {
            for (i, _) in batch.iter().enumerate() {
                fake.set(&format!("sub_{run}_{i}"), "cus_bench", "active", 3);
            }
        }
        let started = Instant::now();
        for e in &batch {
            let now = SystemTime::now();
            let now_s = now.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
            let headers = e.headers(now_s);
            capacity.scope(&format!("intake_new/{contract}"));
            let req = IntakeRequest {
                query: "",
                endpoint: e.endpoint,
                method: &Method::POST,
                headers: &headers,
                body: &e.body,
                now,
                request_id: "bench",
            };
            let answer = intake.handle(req).await;
            assert_eq!(answer.status, 202, "{contract}: {answer:?}");
            // The processor function's receive is the harness's, not measured.
            let out =
                stack.sqs.receive_message().queue_url(&stack.queue_url).max_number_of_messages(1).send().await.unwrap();
            let m = out.messages.unwrap_or_default().pop().expect("a message");
            let message: WorkMessage = serde_json::from_str(m.body().unwrap()).unwrap();
            let key = EventKey::from_stored(&message.key).unwrap();
            capacity.scope(&format!("processor/{contract}"));
            let report = processor.process_message(&key, message.payload().as_deref(), now_ms()).await.unwrap();
            assert_eq!(report.outcome, hookledger::processor::Outcome::Applied, "{contract}: {report:?}");
            stack
                .sqs
                .delete_message()
                .queue_url(&stack.queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
            // The provider's retry of the same event.
            capacity.scope(&format!("intake_duplicate/{contract}"));
            let req = IntakeRequest {
                query: "",
                endpoint: e.endpoint,
                method: &Method::POST,
                headers: &headers,
                body: &e.body,
                now,
                request_id: "bench",
            };
            assert_eq!(intake.handle(req).await.status, 200);
        }
        code_seconds += started.elapsed().as_secs_f64();
        total_events += batch.len();
    }
    capacity.record_requests(false);

    // The emulator alone, replaying the same requests (on a fresh table and
    // queue, so conditions meet the same empty state).
    let fresh = Stack::new().await;
    let mut emulator_seconds = 0.0;
    let tallies = capacity.tallies();
    for scope in tallies.keys() {
        let rewritten: Vec<_> = capacity
            .recorded(scope)
            .into_iter()
            .map(|mut r| {
                let text = String::from_utf8_lossy(&r.body)
                    .replace(&stack.table, &fresh.table)
                    .replace(&stack.queue_url, &fresh.queue_url);
                r.body = text.into_bytes();
                r
            })
            .collect();
        emulator_seconds += replay(&rewritten).await;
    }

    for (scope, tally) in &tallies {
        flows.insert(scope.clone(), per_event(tally, n));
    }
    let code_rate = total_events as f64 / code_seconds;
    let emulator_rate = total_events as f64 / emulator_seconds;
    let out = json!({
        "events_per_contract": n,
        "flows": flows,
        "events_per_second": code_rate,
        "emulator_alone_events_per_second": emulator_rate,
        "code_vs_emulator_alone": code_rate / emulator_rate,
        "index_capacity": index_capacity(&tallies, n),
        "idle_reconciler": idle_reconciler(&capacity, &measured).await,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}
