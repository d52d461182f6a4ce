//! `hookledger demo`: sends signed deliveries to the running local stack as
//! real providers would — duplicates, out-of-order revisions (3, 1, 2, 2, 1),
//! a concurrent burst, out-of-order deltas, a malformed one, a bad signature —
//! waits for the processor, then prints the HTTP answers and the resulting
//! states, and checks them. With a Stripe API (the local stack's fake one,
//! `HOOKLEDGER_STRIPE_API_BASE`), it also shows a subscription fetched for
//! the entitlement projection, drift repaired by the reconciler, and a
//! payment that never reached the endpoint recovered by a backfill.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use clap::Args;
use hookledger::config::{self, SecretResolver};
use hookledger::secret::Secret;
use hookledger_app::account_ledger::balance_pk;
use hookledger_app::inventory::inventory_pk;
use hookledger_app::seats::seats_pk;

const STRIPE: ProviderKind = ProviderKind::STRIPE;
use hookledger::config::ProviderKind;
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
    wiring: &hookledger::wiring::Wiring,
    table: &str,
    stack: Option<&hookledger::wiring::Wiring>,
    json_out: bool,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    let resolver = wiring.secrets();
    let ddb = wiring.dynamodb_client();
    let run = wiring.ambient().entropy.token_simple()[..8].to_owned();
    let (customer, account, sku) = (format!("cus_{run}"), format!("acct_{run}"), format!("sku-{run}"));
    crate::map_subject(&ddb, table, STRIPE.as_str(), "demo", &customer, &account).await?;

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
    // A concurrent burst: 16 identical GitHub deliveries at once. Each run
    // pushes its own commit, as GitHub's pushes do: a body GitHub delivered
    // before under another delivery id is a replay (GitHub does not sign
    // its delivery id), answered 200 and not recorded.
    let gh = specs.get("github-demo").ok_or("endpoint github-demo is not configured")?;
    let gh_secret = resolver.resolve(gh.secrets.first().ok_or("github-demo needs a secret")?).await?;
    let delivery_id = wiring.ambient().token();
    let after = hookledger::identity::payload_hash(delivery_id.as_bytes())[..40].to_owned();
    let body = json!({"ref": "refs/heads/main", "before": "0".repeat(40), "after": after, "repository": {"full_name": "demo/app"}}).to_string();
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

    // Slack, when the stack serves it: its handshake (answered with the
    // challenge, nothing recorded), a forged one, and an event sent twice.
    let mut slack_keys = Vec::new();
    let mut slack_problems = Vec::new();
    if let Some(slack) = specs.get("slack-demo") {
        let secret = resolver.resolve(slack.secrets.first().ok_or("slack-demo needs a secret")?).await?;
        let url = format!("{}/webhooks/slack-demo", args.url.trim_end_matches('/'));
        let challenge = format!("demo-challenge-{run}");
        let handshake = json!({"token": "demo", "challenge": challenge, "type": "url_verification"}).to_string();
        for (scenario, key) in [
            ("Slack handshake (url_verification)", secret.clone()),
            ("Slack forged handshake", Secret::new("not-the-secret")),
        ] {
            let d = sign(slack, &key, "", "", handshake.clone().into_bytes(), now)?;
            let mut req = client.post(&url).body(d.body);
            for (k, v) in d.headers {
                req = req.header(k, v);
            }
            let resp = req.send().await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            if (status == 200) != (text == challenge) {
                slack_problems.push(format!("{scenario}: answered {status} {text:?}"));
            }
            answers.push((scenario.to_owned(), vec![status]));
        }
        let event_id = format!("Ev{run}");
        let event = json!({"token": "demo", "team_id": "T0DEMO", "api_app_id": "A0DEMO", "type": "event_callback",
            "event_id": event_id, "event_time": now,
            "event": {"type": "app_mention", "user": "U0DEMO", "text": "<@U0BOT> hello", "channel": "C0DEMO"}});
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let d = sign(slack, &secret, &event_id, "app_mention", event.to_string().into_bytes(), now)?;
            statuses.push(post(d, "slack-demo").await?);
        }
        answers.push(("Slack event (x2)".to_owned(), statuses));
        slack_keys.push(format!("evt#{}#slack-demo#{event_id}", slack.provider));
    }

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
    .into_iter()
    .chain(slack_keys)
    .collect();
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
    let mut problems = slack_problems;
    let providers = match (std::env::var("HOOKLEDGER_STRIPE_API_BASE").ok(), stack) {
        (Some(base), Some(wiring)) => {
            let stripe = specs.get("stripe-demo").ok_or("endpoint stripe-demo is not configured")?;
            let secret = resolver.resolve(stripe.secrets.first().ok_or("stripe-demo needs a secret")?).await?;
            let ctx = Providers { base, wiring, ddb: &ddb, table, run: &run, now, wait: args.wait_secs };
            let sign_post = |event_id: String, event_type: &'static str, body: serde_json::Value| {
                let d = sign(stripe, &secret, &event_id, event_type, body.to_string().into_bytes(), now);
                let post = &post;
                async move { post(d?, "stripe-demo").await }
            };
            ctx.show(&customer, sign_post, &mut problems).await?
        }
        _ => json!({"skipped": "no provider API (HOOKLEDGER_STRIPE_API_BASE)"}),
    };
    // Routes, when the local stack has them: what each destination received.
    let routed = match (std::env::var("HOOKLEDGER_ROUTED_QUEUE_URL"), std::env::var("HOOKLEDGER_BUS_QUEUE_URL")) {
        (Ok(queue), Ok(bus)) => {
            let sqs = wiring.sqs_client();
            // Every record that ended applied or ignored is owed to both.
            let owed: BTreeSet<String> = records
                .iter()
                .filter(|(_, r)| matches!(text(r, "outcome").as_str(), "applied" | "ignored"))
                .map(|(_, r)| text(r, "event_id"))
                .collect();
            let mut seen = json!({});
            for (name, url) in [("queue", queue), ("bus", bus)] {
                let until = Instant::now() + Duration::from_secs(args.wait_secs.min(30));
                let got = drain_deliveries(&sqs, &url, &owed, until).await?;
                for event in &owed {
                    if !got.contains_key(event) {
                        problems.push(format!("{name}: {event} was not delivered"));
                    }
                }
                seen[name] = json!(got);
            }
            // What an HTTPS consumer of the same routes must have accepted, once each.
            seen["owed"] = records
                .iter()
                .filter(|(_, r)| matches!(text(r, "outcome").as_str(), "applied" | "ignored"))
                .map(|(_, r)| json!({"provider": text(r, "provider"), "event_id": text(r, "event_id")}))
                .collect();
            seen
        }
        _ => json!({"skipped": "no routes (scripts/run sets them up)"}),
    };
    let expected_answers: &[(&str, &[u16])] = &[
        ("duplicate payment (x3)", &[202, 200, 200]),
        ("seat snapshots, revisions 3,1,2,2,1", &[202, 202, 202, 200, 200]),
        ("inventory deltas, sequence 3,1,2", &[202, 202, 202]),
        ("malformed (signed, no id)", &[400]),
        ("bad signature", &[401]),
    ];
    // Slack needs a 200 for an event, new or not (its own success answer).
    let slack_answers: &[(&str, &[u16])] = &[
        ("Slack handshake (url_verification)", &[200]),
        ("Slack forged handshake", &[401]),
        ("Slack event (x2)", &[200, 200]),
    ];
    let expected_answers: Vec<(&str, &[u16])> = expected_answers
        .iter()
        .copied()
        .chain(slack_answers.iter().copied().filter(|_| specs.contains_key("slack-demo")))
        .collect();
    for (scenario, want) in &expected_answers {
        let got = answers.iter().find(|(s, _)| s == scenario).map(|(_, v)| v.as_slice()).unwrap_or(&[]);
        if got != *want {
            problems.push(format!("{scenario}: answers {got:?}, expected {want:?}"));
        }
    }
    let burst =
        &answers.iter().find(|a| a.0 == "concurrent burst (16 at once)").map(|a| a.1.clone()).unwrap_or_default();
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
        let v = json!({"run": run, "answers": answers.iter().map(|(s, a)| json!({"scenario": s, "answers": a})).collect::<Vec<_>>(), "final": finals, "providers": providers, "routes": routed, "problems": problems});
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
        if routed.get("skipped").is_none() {
            writeln!(out).map_err(|e| e.to_string())?;
            let mut rows = Vec::new();
            for name in ["queue", "bus"] {
                for (event, keys) in routed[name].as_object().into_iter().flatten() {
                    let keys: Vec<&str> = keys.as_array().into_iter().flatten().filter_map(|k| k.as_str()).collect();
                    rows.push(vec![
                        name.to_owned(),
                        event.clone(),
                        keys.iter().map(|k| &k[..12]).collect::<Vec<_>>().join(" "),
                    ]);
                }
            }
            columns(out, &["DESTINATION", "EVENT RECEIVED", "ITS KEY (EACH TIME)"], &rows)
                .map_err(|e| e.to_string())?;
        }
        if providers.get("skipped").is_none() {
            writeln!(out).map_err(|e| e.to_string())?;
            let rows = vec![
                vec!["entitled seats, fetched from Stripe (5)".into(), providers["entitled_seats"].to_string()],
                vec![
                    "after Stripe changed it silently: drift repaired (8)".into(),
                    providers["seats_after_drift"].to_string(),
                ],
                vec![
                    "payment Stripe sent while the endpoint was down: backfill recovered".into(),
                    providers["backfill"]["recovered"].to_string(),
                ],
                vec!["its ledger balance (700)".into(), providers["missed_balance"].to_string()],
            ];
            columns(out, &["PROVIDER API", "VALUE"], &rows).map_err(|e| e.to_string())?;
        }
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

/// The demo's provider-API part, against the local stack's fake Stripe.
struct Providers<'a> {
    base: String,
    wiring: &'a hookledger::wiring::Wiring,
    ddb: &'a aws_sdk_dynamodb::Client,
    table: &'a str,
    run: &'a str,
    now: i64,
    wait: u64,
}

impl Providers<'_> {
    async fn admin(&self, what: &str, body: serde_json::Value) -> Result<(), String> {
        let resp = reqwest::Client::new()
            .post(format!("{}/_admin/stripe/{what}", self.base.trim_end_matches('/')))
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("fake Stripe: {e}"))?;
        if resp.status().is_success() { Ok(()) } else { Err(format!("fake Stripe: HTTP {}", resp.status())) }
    }

    /// Waits until `pk`'s state item satisfies `ok` (or the wait ends); returns it.
    async fn state_until(
        &self,
        pk: &str,
        ok: impl Fn(&HashMap<String, AttributeValue>) -> bool,
    ) -> Result<Option<HashMap<String, AttributeValue>>, String> {
        let deadline = Instant::now() + Duration::from_secs(self.wait);
        loop {
            let item = get(self.ddb, self.table, pk, "state").await?;
            if item.as_ref().is_some_and(&ok) || Instant::now() >= deadline {
                return Ok(item);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn show<F, Fut>(
        &self,
        customer: &str,
        sign_post: F,
        problems: &mut Vec<String>,
    ) -> Result<serde_json::Value, String>
    where
        F: Fn(String, &'static str, serde_json::Value) -> Fut,
        Fut: std::future::Future<Output = Result<u16, String>>,
    {
        use hookledger_app::entitlement::entitlement_pk;
        let run = self.run;
        // 1. A subscription event: the entitlement projection fetches the
        //    subscription from Stripe (the webhook's copy may be stale).
        let sub = format!("sub_{run}");
        let subscription = |quantity: i64| json!({"id": sub, "object": "subscription", "customer": customer, "status": "active", "quantity": quantity});
        self.admin("subscriptions", subscription(5)).await?;
        let event = json!({"id": format!("evt_{run}_sub"), "object": "event", "type": "customer.subscription.updated", "created": self.now,
            "data": {"object": subscription(1)}});
        let status = sign_post(format!("evt_{run}_sub"), "customer.subscription.updated", event).await?;
        let pk = entitlement_pk("demo", &sub);
        let seats = |i: &HashMap<String, AttributeValue>| number(i, "seats");
        let entitled = self.state_until(&pk, |i| seats(i) == Some(5)).await?.as_ref().and_then(seats);
        // 2. Stripe changes it and no webhook says so: the reconciler's drift
        //    check finds and repairs it. An entitlement is next checked an
        //    hour after it was read, so the demo runs that check with the
        //    reconciler's clock an hour ahead (what the scheduled run will do then).
        self.admin("subscriptions", subscription(8)).await?;
        let settings =
            hookledger::config::ReconcilerSettings { drift_interval_ms: 0, ..self.wiring.settings.reconciler };
        let rechecks = crate::app(self.wiring).map_err(|e| e.to_string())?.rechecks();
        let reconciler = self.wiring.reconciler_with(rechecks, settings).map_err(|e| e.to_string())?;
        let ambient = self.wiring.ambient();
        let now_ms = ambient.now_ms();
        let check_at = now_ms + 1_000 + hookledger::config::DEFAULT_DRIFT_INTERVAL_MS;
        // Its metrics written as the reconciler function's are, so that
        // `hookledger stats` and the console show this run's drift.
        let checked = reconciler.run(check_at, ambient.instant() + Duration::from_secs(30));
        let summary = crate::reported::reconciler_run(&self.wiring.metrics_writer_once(None), checked).await;
        let after_drift = self.state_until(&pk, |i| seats(i) == Some(8)).await?.as_ref().and_then(seats);
        // 3. A payment Stripe sent while the endpoint was down (it never
        //    reached the intake): a backfill of the last minutes recovers it.
        let (missed_customer, missed_account) = (format!("cus_{run}_m"), format!("acct_{run}_m"));
        crate::map_subject(self.ddb, self.table, STRIPE.as_str(), "demo", &missed_customer, &missed_account).await?;
        self.admin("events", json!({"id": format!("evt_{run}_missed"), "object": "event", "type": "payment_intent.succeeded",
            "created": self.now, "pending_webhooks": 0,
            "data": {"object": {"id": format!("pi_{run}_m"), "object": "payment_intent", "customer": missed_customer, "amount": 700, "amount_received": 700}}})).await?;
        let key = self.wiring.settings.stripe_api_key.clone().ok_or("HOOKLEDGER_STRIPE_API_KEY is not set")?;
        let source = self
            .wiring
            .provider_source(hookledger::wiring::SourceSpec {
                list: hookledger::verify::provider::BackfillList::StripeEvents,
                base: Some(&self.base),
                hook: None,
                account: None,
                secret: &key,
                max_body_bytes: self.wiring.settings.max_backfill_body_bytes,
            })
            .await?;
        let backfill = self
            .wiring
            .backfill(source, hookledger::backfill::BackfillSettings::default())
            .map_err(|e| e.to_string())?;
        let target = hookledger::backfill::Target {
            provider: STRIPE.as_str().to_owned(),
            endpoint: "stripe-demo".into(),
            tenant: "demo".into(),
            retention_days: self.wiring.settings.retention_days,
            index_shards: self.wiring.settings.index_shards,
            mode: hookledger::backfill::Mode::Import,
            payload: Default::default(),
            erasable: false,
        };
        let window = hookledger::ports::Window {
            since_s: self.now - 60,
            until_s: self.now + 1,
            types: vec!["payment_intent.succeeded".into()],
        };
        let recovered =
            backfill.run(&target, &window, false, now_ms, ambient.instant() + Duration::from_secs(30), |_| {}).await;
        let balance =
            self.state_until(&balance_pk("demo", &missed_account), |i| number(i, "balance") == Some(700)).await?;
        let result = json!({
            "subscription_webhook": status,
            "entitled_seats": entitled,
            "drift_found": summary.drift_found,
            "drift_repaired": summary.drift_repaired,
            "seats_after_drift": after_drift,
            "backfill": recovered,
            "missed_balance": balance.as_ref().and_then(|b| number(b, "balance")),
            "missed_entries": balance.as_ref().and_then(|b| number(b, "entries")),
        });
        for (what, got, want) in [
            ("subscription webhook", Some(i64::from(status)), 202),
            ("entitled seats (fetched from Stripe)", entitled, 5),
            ("seats after drift repair", after_drift, 8),
            ("backfill recovered", Some(recovered.recovered as i64), 1),
            ("missed payment balance", result["missed_balance"].as_i64(), 700),
            ("missed payment ledger entries", result["missed_entries"].as_i64(), 1),
        ] {
            if got != Some(want) {
                problems.push(format!("{what}: {got:?}, expected {want}"));
            }
        }
        Ok(result)
    }
}

/// What a destination queue received of the events `owed` (bounded wait
/// until each is there): event id -> the idempotency key of each
/// message (a repeat shows its key again). An EventBridge rule's message
/// carries the envelope as its `detail`.
async fn drain_deliveries(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    owed: &BTreeSet<String>,
    deadline: Instant,
) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    let mut got: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    loop {
        let answer = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| format!("receiving from {url}: {e}"))?;
        for m in answer.messages.unwrap_or_default() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(m.body().unwrap_or_default()) else { continue };
            let envelope = if v.get("detail").is_some() { &v["detail"] } else { &v };
            let (Some(event), Some(key)) = (envelope["event_id"].as_str(), envelope["idempotency_key"].as_str()) else {
                continue;
            };
            if owed.contains(event) {
                got.entry(event.to_owned()).or_default().push(key.to_owned());
                if let Some(r) = m.receipt_handle() {
                    let _ = sqs.delete_message().queue_url(url).receipt_handle(r).send().await;
                }
            }
        }
        if got.len() >= owed.len() || Instant::now() >= deadline {
            return Ok(got);
        }
    }
}
