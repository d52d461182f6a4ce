//! The operator audit log on the emulator: the verbs no other suite runs
//! through the CLI (arming a handshake, an SNS dead-letter replay), and the
//! cost of reading it beside 100 and 10,000 unrelated records. (Replay,
//! park, resolve and map-subject: `cli`; deliveries replay: `deliveries`;
//! backfill and release: `backfill`; migrate: `upgrade`; the entry and the
//! action as one outcome under faults: `explore`.)

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use hookledger::adapters::dynamodb::DynamoLedger;
use hookledger::audit::Caller;
use hookledger::identity::EventKey;
use hookledger::ports::AuditLog;

use crate::support::{ENDPOINTS, Stack, now_s};
use hookledger_it::faults::{self, FaultPlan};

fn now_ms() -> i64 {
    now_s() * 1000
}

#[tokio::test]
async fn arming_a_handshake_and_an_sns_dead_letter_replay_are_audited_as_runs() {
    let stack = Stack::new().await;
    let path = format!("/hookledger/it-{}/handshake", uuid::Uuid::new_v4().simple());
    let asana = r#"{"asana-it": {"provider": "asana"}, "stripe-a": {"provider": "stripe", "secrets": ["env:PATH"]}}"#;
    let arm = |provider: &'static str, endpoint: &'static str| {
        let path = path.clone();
        let stack = &stack;
        async move {
            let args = [
                "--handshake-path",
                &path,
                "providers",
                "arm",
                provider,
                "--endpoint",
                endpoint,
                "--for",
                "90s",
                "--endpoints",
                asana,
                "--operator",
                "ana",
                "--reason",
                "new Asana webhook",
            ];
            stack.cli(&args).await
        }
    };
    let (r, out) = arm("asana", "asana-it").await;
    r.unwrap();
    assert!(out.contains("handshake window open"), "{out}");
    // Refused before anything is written: its entry says so.
    let (r, _) = arm("stripe", "stripe-a").await;
    assert!(r.unwrap_err().contains("does not hand its secret over"));

    let dlq = hookledger::adapters::sqs::create_queue(&stack.sqs, &format!("{}-sns-dlq", &stack.table)).await.unwrap();
    let (r, out) = stack
        .cli(&["replay-sns", "--dlq-url", &dlq, "--endpoint", "ses", "--endpoints", ENDPOINTS, "--reason", "incident"])
        .await;
    r.unwrap();
    assert!(!out.is_empty());

    let log = stack.audit_log().await;
    let listed: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|e| (e["verb"].as_str().unwrap(), e["target"].as_str().unwrap(), e["result"].as_str().unwrap()))
        .collect();
    assert_eq!(listed[0], ("arm", "endpoint asana-it", "done: window open"));
    assert_eq!((listed[1].0, listed[1].1), ("arm", "endpoint stripe-a"));
    assert!(listed[1].2.starts_with("failed: ") && listed[1].2.contains("nothing to arm"), "{listed:?}");
    assert_eq!((listed[2].0, listed[2].1), ("replay-sns", "endpoint ses"));
    assert!(listed[2].2.starts_with("done: {"), "{listed:?}");
    assert_eq!(log.len(), 3, "{log:?}");
    assert!(log.iter().all(|e| e["principal"].as_str().unwrap().starts_with("arn:aws:")), "{log:?}");
}

/// `count` unrelated records (finished events of another endpoint), written
/// as they are.
async fn records(stack: &Stack, from: usize, count: usize) {
    let requests: Vec<WriteRequest> = (from..from + count)
        .map(|i| {
            let key = EventKey::new("stripe", "stripe-b", &format!("evt_other_{i}"));
            let item = [
                ("pk", AttributeValue::S(key.as_str().to_owned())),
                ("sk", AttributeValue::S("meta".into())),
                ("status", AttributeValue::S("PROCESSED".into())),
                ("received_at", AttributeValue::N(now_ms().to_string())),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(item)).build().unwrap()).build()
        })
        .collect();
    stack.put_all(&requests).await;
}

/// Reads the whole log of the window page by page, and one record's
/// entries, through the request recorder: the requests by operation.
async fn read_log(stack: &Stack, since: i64, until: i64, record: &EventKey) -> (BTreeMap<String, u64>, usize) {
    let plan = FaultPlan::new(3);
    let cfg = faults::sdk_config(&plan).await;
    let ledger = DynamoLedger::new(faults::dynamodb_client(&cfg), &stack.table);
    plan.reset_counts();
    let (mut seen, mut after) = (0, None);
    loop {
        let page = ledger.audit_page(since, until, after.as_deref(), 4).await.unwrap();
        seen += page.entries.len();
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(ledger.audit_of(record).await.unwrap().len(), 1);
    (plan.request_counts(), seen)
}

#[tokio::test]
async fn reading_the_audit_log_costs_the_same_beside_100_and_10000_records() {
    let stack = Stack::new().await;
    let ledger = stack.ledger();
    let caller = Caller::named("ana");
    let now = now_ms();
    // Ten entries (runs) across two months, and one action on a record.
    let last_month = now - 35 * 86_400_000;
    for i in 0..10 {
        let at = if i < 5 { last_month + i } else { now - 1_000 + i };
        let run = hookledger::audit::AuditEntry::new(ledger.audit_id(), at, "migrate", "table", &caller);
        ledger.audit_begin(&run).await.unwrap();
    }
    let key = stack.claim("stripe", "stripe-a", "evt_audited", None, b"{}").await;
    let queue = hookledger::adapters::sqs::SqsQueue::new(stack.sqs.clone(), &stack.queue_url);
    let ops = hookledger::ops::Ops::new(ledger.clone().with_shards(16), queue);
    ops.park(&key, &caller, "holding it", now).await.unwrap();

    records(&stack, 0, 100).await;
    let (small, seen) = read_log(&stack, last_month - 1, now + 1, &key).await;
    assert_eq!(seen, 11, "every entry of the window, paged");
    records(&stack, 100, 9_900).await;
    let (large, seen_after) = read_log(&stack, last_month - 1, now + 1, &key).await;
    assert_eq!(seen_after, 11);
    assert_eq!(large, small, "the same requests beside 100 and 10,000 records");
    assert!(!small.contains_key("dynamodb:Scan"), "{small:?}");
    // Pages of 4 over 2 months: at most a query per page per month, plus the record's.
    let queries = small.get("dynamodb:Query").copied().unwrap_or(0);
    assert!(queries <= 3 * 2 + 1, "{small:?}");
    println!("audit-log: 11 entries over two months, pages of 4: {small:?} beside 100 and 10,000 records");
}
