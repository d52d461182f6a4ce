//! `hookledger demo`: sends signed deliveries to the running local stack as
//! real providers would — duplicates, out-of-order revisions (3, 1, 2, 2, 1),
//! a concurrent burst, out-of-order deltas, a malformed one, a bad signature —
//! waits for the processor, then prints the HTTP answers and the resulting
//! states, and checks them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use clap::Args;
use hookledger::app::account_ledger::balance_pk;
use hookledger::app::inventory::inventory_pk;
use hookledger::app::seats::seats_pk;
use hookledger::config::{self, SecretResolver};
use serde_json::json;

use crate::send::{Delivery, sign};
use crate::table::columns;

#[derive(Args)]
pub struct DemoArgs {
    /// Base URL of the intake (as for `send`).
    #[arg(long, env = "HOOKLEDGER_INTAKE_URL", default_value = "http://127.0.0.1:9000/lambda-url/intake")]
    url: String,
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS", hide_env_values = true)]
    endpoints: String,
    /// How long to wait for processing.
    #[arg(long, default_value_t = 120)]
    wait_secs: u64,
}

struct Step {
    scenario: &'static str,
    endpoint: &'static str,
    event_id: String,
    body: serde_json::Value,
    event_type: &'static str,
    bad_signature: bool,
}

pub async fn run(
    args: DemoArgs,
    aws: &aws_config::SdkConfig,
    table: &str,
    json_out: bool,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let resolver = hookledger::adapters::secrets::AwsSecretResolver::new(aws_sdk_ssm::Client::new(aws));
    let ddb = aws_sdk_dynamodb::Client::new(aws);
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (customer, account, sku) = (format!("cus_{run}"), format!("acct_{run}"), format!("sku-{run}"));
    hookledger::app::subjects::map_subject(&ddb, table, "stripe", "demo", &customer, &account).await?;

    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs() as i64;
    let payment = json!({"id": format!("evt_{run}_pay"), "object": "event", "type": "payment_intent.succeeded", "created": now,
        "data": {"object": {"id": format!("pi_{run}"), "object": "payment_intent", "customer": customer, "amount": 1500, "amount_received": 1500}}});
    let mut steps: Vec<Step> = Vec::new();
    for _ in 0..3 {
        steps.push(Step {
            scenario: "duplicate payment (x3)",
            endpoint: "stripe-demo",
            event_id: format!("evt_{run}_pay"),
            body: payment.clone(),
            event_type: "payment_intent.succeeded",
            bad_signature: false,
        });
    }
    for (rev, seats) in [(3, 20), (1, 10), (2, 30), (2, 30), (1, 10)] {
        steps.push(Step {
            scenario: "seat snapshots, revisions 3,1,2,2,1",
            endpoint: "svix-demo",
            event_id: format!("msg_{run}_rev{rev}"),
            body: json!({"type": "seats.snapshot", "data": {"account": account, "generation": 1, "revision": rev, "seats": seats}}),
            event_type: "seats.snapshot",
            bad_signature: false,
        });
    }
    for (seq, delta) in [(3, 5), (1, 10), (2, -3)] {
        steps.push(Step {
            scenario: "inventory deltas, sequence 3,1,2",
            endpoint: "svix-demo",
            event_id: format!("msg_{run}_seq{seq}"),
            body: json!({"type": "inventory.adjusted", "data": {"sku": sku, "seq": seq, "delta": delta}}),
            event_type: "inventory.adjusted",
            bad_signature: false,
        });
    }
    steps.push(Step {
        scenario: "malformed (signed, no id)",
        endpoint: "stripe-demo",
        event_id: format!("evt_{run}_bad"),
        body: json!({"object": "event", "type": "invoice.paid"}),
        event_type: "invoice.paid",
        bad_signature: false,
    });
    steps.push(Step {
        scenario: "bad signature",
        endpoint: "stripe-demo",
        event_id: format!("evt_{run}_forged"),
        body: payment.clone(),
        event_type: "payment_intent.succeeded",
        bad_signature: true,
    });

    let client = reqwest::Client::new();
    let mut answers: Vec<(String, Vec<u16>)> = Vec::new();
    let post = |d: Delivery, endpoint: &str| {
        let url = format!("{}/webhooks/{endpoint}", args.url.trim_end_matches('/'));
        let mut req = client.post(url).body(d.body);
        for (k, v) in d.headers {
            req = req.header(k, v);
        }
        async move { req.send().await.map(|r| r.status().as_u16()).map_err(|e| e.to_string()) }
    };
    for step in &steps {
        let spec = specs.get(step.endpoint).ok_or_else(|| format!("endpoint {} is not configured", step.endpoint))?;
        let reference = spec.secrets.first().ok_or("demo endpoints need a secret")?;
        let secret = if step.bad_signature {
            hookledger::secret::Secret::new("not-the-secret")
        } else {
            resolver.resolve(reference).await?
        };
        let d = sign(spec, &secret, &step.event_id, step.event_type, step.body.to_string().into_bytes(), now)?;
        let status = post(d, step.endpoint).await?;
        match answers.last_mut() {
            Some((s, list)) if s == step.scenario => list.push(status),
            _ => answers.push((step.scenario.to_owned(), vec![status])),
        }
    }
    // A concurrent burst: 16 identical GitHub deliveries at once.
    let gh = specs.get("github-demo").ok_or("endpoint github-demo is not configured")?;
    let gh_secret = resolver.resolve(gh.secrets.first().ok_or("github-demo needs a secret")?).await?;
    let delivery_id = uuid::Uuid::new_v4().to_string();
    let body = json!({"ref": "refs/heads/main", "before": "0".repeat(40), "after": "1".repeat(40), "repository": {"full_name": "demo/app"}}).to_string();
    let mut burst = Vec::new();
    for _ in 0..16 {
        let d = sign(gh, &gh_secret, &delivery_id, "push", body.clone().into_bytes(), now)?;
        burst.push(post(d, "github-demo"));
    }
    let mut statuses = Vec::new();
    for r in futures_join(burst).await {
        statuses.push(r?);
    }
    statuses.sort_unstable_by(|a, b| b.cmp(a));
    answers.push(("concurrent burst (16 at once)".to_owned(), statuses));

    // Wait for every record of this run to reach a final state.
    let deadline = Instant::now() + Duration::from_secs(args.wait_secs);
    let keys: Vec<String> = [
        format!("evt#stripe#stripe-demo#evt_{run}_pay"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_rev1"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_rev2"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_rev3"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_seq1"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_seq2"),
        format!("evt#standard_webhooks#svix-demo#msg_{run}_seq3"),
        format!("evt#github#github-demo#{delivery_id}"),
    ]
    .to_vec();
    let mut records: HashMap<String, HashMap<String, AttributeValue>> = HashMap::new();
    loop {
        records.clear();
        for k in &keys {
            if let Some(item) = get(&ddb, table, k, "meta").await? {
                records.insert(k.clone(), item);
            }
        }
        let done = records.len() == keys.len()
            && records.values().all(|r| matches!(text(r, "status").as_str(), "PROCESSED" | "DEAD" | "PARKED"));
        if done || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let seats = get(&ddb, table, &seats_pk("demo", &account), "state").await?;
    let balance = get(&ddb, table, &balance_pk("demo", &account), "state").await?;
    let inventory = get(&ddb, table, &inventory_pk("demo", &sku), "state").await?;
    let finals = json!({
        "seats": seats.as_ref().map(|i| number(i, "seats")),
        "seat_revision": seats.as_ref().map(|i| number(i, "revision")),
        "balance": balance.as_ref().map(|i| number(i, "balance")),
        "ledger_entries": balance.as_ref().map(|i| number(i, "entries")),
        "inventory_on_hand": inventory.as_ref().map(|i| number(i, "on_hand")),
        "records": keys.iter().map(|k| (k.clone(), records.get(k).map(|r| format!("{} {}", text(r, "status"), text(r, "outcome"))).unwrap_or_else(|| "missing".into()))).collect::<HashMap<_, _>>(),
    });
    let expected_answers: &[(&str, &[u16])] = &[
        ("duplicate payment (x3)", &[202, 200, 200]),
        ("seat snapshots, revisions 3,1,2,2,1", &[202, 202, 202, 200, 200]),
        ("inventory deltas, sequence 3,1,2", &[202, 202, 202]),
        ("malformed (signed, no id)", &[400]),
        ("bad signature", &[401]),
    ];
    let mut problems = Vec::new();
    for (scenario, want) in expected_answers {
        let got = answers.iter().find(|(s, _)| s == scenario).map(|(_, v)| v.as_slice()).unwrap_or(&[]);
        if got != *want {
            problems.push(format!("{scenario}: answers {got:?}, expected {want:?}"));
        }
    }
    let burst = &answers.last().map(|a| a.1.clone()).unwrap_or_default();
    if burst.iter().filter(|s| **s == 202).count() != 1 || burst.iter().filter(|s| **s == 200).count() != 15 {
        problems.push(format!("burst: answers {burst:?}, expected one 202 and fifteen 200"));
    }
    for (what, got, want) in [
        ("seats", &finals["seats"], 20),
        ("balance", &finals["balance"], 1500),
        ("ledger entries", &finals["ledger_entries"], 1),
        ("inventory", &finals["inventory_on_hand"], 12),
    ] {
        if got.as_i64() != Some(want) {
            problems.push(format!("{what}: {got}, expected {want}"));
        }
    }
    for (k, r) in &records {
        if text(r, "status") != "PROCESSED" {
            problems.push(format!("{k}: {}", text(r, "status")));
        }
    }
    if records.len() != keys.len() {
        problems.push(format!("only {} of {} records were found", records.len(), keys.len()));
    }

    if json_out {
        let v = json!({"run": run, "answers": answers.iter().map(|(s, a)| json!({"scenario": s, "answers": a})).collect::<Vec<_>>(), "final": finals, "problems": problems});
        writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(|e| e.to_string())?;
    } else {
        let rows: Vec<Vec<String>> = answers
            .iter()
            .map(|(s, a)| vec![s.clone(), a.iter().map(u16::to_string).collect::<Vec<_>>().join(" ")])
            .collect();
        columns(out, &["SCENARIO", "HTTP ANSWERS"], &rows).map_err(|e| e.to_string())?;
        writeln!(out).map_err(|e| e.to_string())?;
        let rows = vec![
            vec!["seat allowance (intended 20)".into(), finals["seats"].to_string()],
            vec!["account balance (one payment of 1500)".into(), finals["balance"].to_string()],
            vec!["ledger entries".into(), finals["ledger_entries"].to_string()],
            vec!["inventory on hand (10 - 3 + 5)".into(), finals["inventory_on_hand"].to_string()],
        ];
        columns(out, &["STATE", "VALUE"], &rows).map_err(|e| e.to_string())?;
        writeln!(out).map_err(|e| e.to_string())?;
        let mut rows: Vec<Vec<String>> =
            keys.iter().map(|k| vec![k.clone(), finals["records"][k].as_str().unwrap_or("").to_owned()]).collect();
        rows.sort();
        columns(out, &["RECORD", "STATUS OUTCOME"], &rows).map_err(|e| e.to_string())?;
    }
    if problems.is_empty() { Ok(()) } else { Err(format!("demo expectations not met: {}", problems.join("; "))) }
}

async fn futures_join<F: std::future::Future<Output = T> + Send + 'static, T: Send + 'static>(
    futures: Vec<F>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

async fn get(
    ddb: &aws_sdk_dynamodb::Client,
    table: &str,
    pk: &str,
    sk: &str,
) -> Result<Option<HashMap<String, AttributeValue>>, String> {
    let out = ddb
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.to_owned()))
        .key("sk", AttributeValue::S(sk.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(out.item)
}

fn text(item: &HashMap<String, AttributeValue>, k: &str) -> String {
    item.get(k).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

fn number(item: &HashMap<String, AttributeValue>, k: &str) -> Option<i64> {
    item.get(k).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())
}
