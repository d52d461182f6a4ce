//! Eight processor invocations racing over the same 200 events, delivered
//! through the signed intake with duplicates (at the HTTP and the queue
//! level) in shuffled order. Lambda's SQS event source mapping is emulated:
//! batches of up to 10, partial batch failures stay, successes are deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hookledger::adapters::stripe::StripeApi;
use hookledger::config::ProcessorSettings;
use hookledger::intake::IntakeRequest;
use hookledger::secret::Secret;
use hookledger::verify::{standard, stripe};
use hookledger_app::account_ledger::balance_pk;
use hookledger_app::email_status::{email_pk, rank};
use hookledger_app::entitlement::entitlement_pk;
use hookledger_app::inventory::inventory_pk;
use hookledger_app::seats::seats_pk;
use http::{HeaderMap, HeaderValue, Method};
use processor::handler::App;
use serde_json::json;

use crate::fake_provider::FakeStripe;
use crate::intake::sns::signed_message;
use crate::processor::{charge_refunded, pi_succeeded, sub_updated};
use crate::support::{self, SNS_TOPIC, STRIPE_SECRET, Stack, n, now_s, run_processor, s};

/// A small deterministic generator, so a failure reproduces.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// One signed delivery: endpoint, headers, body.
struct Delivery(&'static str, HeaderMap, Vec<u8>);

fn stripe_delivery(body: Vec<u8>) -> Delivery {
    let mut h = HeaderMap::new();
    h.insert(
        stripe::SIGNATURE_HEADER,
        HeaderValue::from_str(&stripe::sign(&Secret::new(STRIPE_SECRET), now_s(), &body)).unwrap(),
    );
    Delivery("stripe-a", h, body)
}

fn svix_delivery(id: &str, body: serde_json::Value) -> Delivery {
    let body = body.to_string().into_bytes();
    let key = standard::decode_secret(&Secret::new(support::SVIX_SECRET)).unwrap();
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    h.insert("webhook-timestamp", HeaderValue::from_str(&now_s().to_string()).unwrap());
    h.insert("webhook-signature", HeaderValue::from_str(&standard::sign(&key, id, now_s(), &body)).unwrap());
    Delivery("svix", h, body)
}

fn ses_delivery(id: &str, mail: &str, status: &str) -> Delivery {
    let message = json!({"eventType": status, "mail": {"messageId": mail}}).to_string();
    Delivery("ses", HeaderMap::new(), signed_message("Notification", SNS_TOPIC, id, &message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_invocations_race_over_200_events_with_duplicates_and_converge() {
    let stack = Stack::new().await;
    let (fake, base) = FakeStripe::start().await;
    let (topic, inbox) = stack.notify_topic().await;
    let mut rng = Lcg(2026);

    // --- the 200 distinct events and what they must add up to -------------
    let mut events: Vec<Delivery> = Vec::new();
    let mut balances: HashMap<String, (i64, i64)> = HashMap::new(); // account -> (balance, entries)
    for c in 0..5 {
        stack.map_customer_in("tenant-a", &format!("cus_{c}"), &format!("acct_{c}")).await;
    }
    for i in 0..60 {
        let c = i % 5;
        let amount = 10 * i as i64 + 1;
        events.push(stripe_delivery(pi_succeeded(
            &format!("evt_pi_{i}"),
            &format!("pi_{i}"),
            Some(&format!("cus_{c}")),
            amount,
        )));
        let b = balances.entry(format!("acct_{c}")).or_default();
        b.0 += amount;
        b.1 += 1;
    }
    for ch in 0..10 {
        let c = ch % 5;
        let cus = format!("cus_{c}");
        let (ra, rb) = (format!("re_{ch}_a"), format!("re_{ch}_b"));
        events.push(stripe_delivery(charge_refunded(
            &format!("evt_ch_{ch}_1"),
            &format!("ch_{ch}"),
            &cus,
            &[(&ra, 3)],
        )));
        events.push(stripe_delivery(charge_refunded(
            &format!("evt_ch_{ch}_2"),
            &format!("ch_{ch}"),
            &cus,
            &[(&ra, 3), (&rb, 5)],
        )));
        let b = balances.entry(format!("acct_{c}")).or_default();
        b.0 -= 8;
        b.1 += 2;
    }
    let seat_value = |a: i64, rev: i64| (rev * 7 + a) % 50 + 1;
    for a in 0..5 {
        for rev in 1..=10 {
            let body = json!({"type": "seats.snapshot", "data": {"account": format!("acct_{a}"), "generation": 1, "revision": rev, "seats": seat_value(a, rev)}});
            events.push(svix_delivery(&format!("msg_seats_{a}_{rev}"), body));
        }
    }
    let mut mail_final: HashMap<String, &str> = HashMap::new();
    for m in 0..10 {
        let mail = format!("mail-{m}");
        let last = if m % 2 == 0 { "Bounce" } else { "Open" };
        for status in ["Send", "DeliveryDelay", "Delivery", last] {
            events.push(ses_delivery(&format!("sns-{m}-{status}"), &mail, status));
        }
        mail_final.insert(mail, if m % 2 == 0 { "Bounce" } else { "Delivery" });
    }
    for k in 0..5 {
        fake.set(&format!("sub_{k}"), &format!("cus_{k}"), "active", k + 1);
        for e in 0..4 {
            events.push(stripe_delivery(sub_updated(
                &format!("evt_sub_{k}_{e}"),
                &format!("sub_{k}"),
                &format!("cus_{k}"),
            )));
        }
    }
    for seq in 1..=10 {
        events.push(svix_delivery(
            &format!("msg_inv_{seq}"),
            json!({"type": "inventory.adjusted", "data": {"sku": "sku-race", "seq": seq, "delta": seq}}),
        ));
    }
    assert_eq!(events.len(), 200);

    // --- deliver: every event once, 40 of them twice, shuffled, 8 at a time --
    let mut order: Vec<usize> = (0..200).collect();
    order.extend((0..40).map(|_| (rng.next() % 200) as usize));
    rng.shuffle(&mut order);
    let intake = Arc::new(stack.intake().await);
    let events = Arc::new(events);
    let mut senders = tokio::task::JoinSet::new();
    for chunk in order.chunks(order.len().div_ceil(8)) {
        let (intake, events, chunk) = (intake.clone(), events.clone(), chunk.to_vec());
        senders.spawn(async move {
            let mut statuses = Vec::new();
            for i in chunk {
                let Delivery(endpoint, headers, body) = &events[i];
                let a = intake
                    .handle(IntakeRequest {
                        query: "",
                        endpoint,
                        method: &Method::POST,
                        headers,
                        body,
                        now: SystemTime::now(),
                        request_id: "race",
                    })
                    .await;
                statuses.push(a.status);
            }
            statuses
        });
    }
    let mut statuses = Vec::new();
    while let Some(r) = senders.join_next().await {
        statuses.extend(r.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 200, "every distinct event accepted once");
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 40, "HTTP duplicates acknowledged");
    // Queue-level duplicates too (SQS is at-least-once): 30 extra copies.
    let metas = stack.meta_items().await;
    for _ in 0..30 {
        let key = s(&metas[(rng.next() % 200) as usize], "pk");
        stack
            .sqs
            .send_message()
            .queue_url(&stack.queue_url)
            .message_body(json!({"v": 1, "key": key}).to_string())
            .send()
            .await
            .unwrap();
    }

    // --- eight racing processor invocations ---------------------------------
    let settings = ProcessorSettings { max_attempts: 100, ..support::fast_settings() };
    let source = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    let app = Arc::new(App {
        processor: Arc::new(stack.processor(settings, Some(source), Some(topic))),
        queue: Arc::new(hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url)),
        dispatcher: Arc::new(stack.dispatcher()),
    });
    let stack = Arc::new(stack);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (stack, app) = (stack.clone(), app.clone());
        workers.spawn(async move { run_processor(&stack, app, 12, Duration::from_secs(120)).await });
    }
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }

    // --- every event PROCESSED once, every projection converged --------------
    let metas = stack.meta_items().await;
    assert_eq!(metas.len(), 200);
    let not_done: Vec<String> = metas
        .iter()
        .filter(|m| s(m, "status") != "PROCESSED")
        .map(|m| format!("{} {}", s(m, "pk"), s(m, "status")))
        .collect();
    assert!(not_done.is_empty(), "{not_done:?}");
    assert!(metas.iter().all(|m| m.contains_key("completed_token") && !m.contains_key("lease_owner")));
    for (account, (balance, entries)) in &balances {
        let b = stack.state(&balance_pk("tenant-a", account)).await.unwrap();
        assert_eq!((n(&b, "balance"), n(&b, "entries")), (*balance, *entries), "{account}");
    }
    for a in 0..5 {
        let st = stack.state(&seats_pk("svix", &format!("acct_{a}"))).await.unwrap();
        assert_eq!((n(&st, "revision"), n(&st, "seats")), (10, seat_value(a, 10)), "acct_{a}");
    }
    for (mail, status) in &mail_final {
        let st = stack.state(&email_pk("ses", mail)).await.unwrap();
        assert_eq!((s(&st, "status").as_str(), n(&st, "rank")), (*status, rank(status).unwrap()), "{mail}");
    }
    let inv = stack.state(&inventory_pk("svix", "sku-race")).await.unwrap();
    assert_eq!((n(&inv, "on_hand"), n(&inv, "last_seq")), (55, 10));
    for k in 0..5 {
        let e = stack.state(&entitlement_pk("tenant-a", &format!("sub_{k}"))).await.unwrap();
        assert_eq!((s(&e, "status").as_str(), n(&e, "seats")), ("active", k + 1));
    }
    // Exactly one publish per outbox notification, none lost, none doubled.
    let outbox: Vec<_> = stack.items().await.into_iter().filter(|i| s(i, "pk").starts_with("outbox#")).collect();
    assert!(!outbox.is_empty() && outbox.len() <= 20, "one per applied entitlement change: {}", outbox.len());
    assert!(outbox.iter().all(|o| s(o, "status") == "SENT"));
    let published = stack.drain(&inbox).await;
    let keys: HashSet<String> = published
        .iter()
        .map(|b| {
            serde_json::from_str::<serde_json::Value>(b).unwrap()["MessageAttributes"]["idempotency-key"]["Value"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(published.len(), outbox.len());
    assert_eq!(keys.len(), outbox.len());
}
