//! The operator CLI against the emulator: every command, its output and its
//! error messages. The CLI runs in-process (`hookledger_cli::run`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hookledger::adapters::stripe::StripeApi;
use hookledger::config::ProcessorSettings;
use hookledger::processor::Outcome;
use hookledger::projection::fetch::SubscriptionSource;
use hookledger::secret::Secret;
use hookledger_app::account_ledger::balance_pk;

use crate::fake_provider::FakeStripe;
use crate::processor::{failing_rules, pi_succeeded, sub_updated};
use crate::support::{Stack, fast_settings, n, now_s, run_processor, s};

fn now_ms() -> i64 {
    now_s() * 1000
}

/// A stack with one PROCESSED, one PARKED and one DEAD (attempts exhausted) record.
pub(crate) async fn populated() -> (Stack, Arc<FakeStripe>, Arc<dyn SubscriptionSource>) {
    let stack = Stack::new().await;
    stack.map_customer("cus_ok", "acct_ok").await;
    let (fake, base) = FakeStripe::start().await;
    let source: Arc<dyn SubscriptionSource> = Arc::new(StripeApi::new(base, Secret::new("sk_test_fake")).unwrap());
    // The DEAD one fails a business rule (provider outages do not spend the attempt budget).
    let p = hookledger::wiring::processor(
        stack.ledger(),
        failing_rules(Some(source.clone())),
        None,
        ProcessorSettings { max_attempts: 2, ..fast_settings() },
    );
    let ok =
        stack.claim("stripe", "stripe-a", "evt_ok", None, &pi_succeeded("evt_ok", "pi_ok", Some("cus_ok"), 100)).await;
    assert_eq!(p.process(&ok, now_ms()).await.unwrap().outcome, Outcome::Applied);
    let parked = stack
        .claim(
            "stripe",
            "stripe-a",
            "evt_park",
            Some("payment_intent.succeeded"),
            &pi_succeeded("evt_park", "pi_park", Some("cus_new"), 250),
        )
        .await;
    assert_eq!(p.process(&parked, now_ms()).await.unwrap().outcome, Outcome::Parked);
    let dead = stack
        .claim(
            "stripe",
            "stripe-b",
            "evt_dead",
            Some("customer.subscription.updated"),
            &sub_updated("evt_dead", "sub_dead", "cus_ok"),
        )
        .await;
    let mut now = now_ms();
    for _ in 0..2 {
        let r = p.process(&dead, now).await.unwrap();
        now += r.retry_after_ms.unwrap_or(0) + 1;
    }
    assert_eq!(s(&stack.record(&dead).await, "status"), "DEAD");
    (stack, fake, source)
}

#[tokio::test]
async fn exhausted_attempts_are_visible_in_list_and_stats() {
    let (stack, _, _) = populated().await;
    let (r, out) = stack.cli(&["list", "--status", "dead"]).await;
    r.unwrap();
    assert!(out.contains("evt#stripe#stripe-b#evt_dead") && out.contains("attempts_exhausted"), "{out}");
    assert!(out.contains("1 record(s)") && !out.contains("evt_ok"), "{out}");

    let (r, out) = stack.cli(&["stats"]).await;
    r.unwrap();
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["DEAD", "1"]), "{out}");
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["PARKED", "1"]), "{out}");
    assert!(out.contains("PROCESSED records are in no index"), "{out}");
    assert!(out.contains("duplicate rate"), "{out}");

    let (r, out) = stack.cli(&["stats", "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["now"]["by_status"]["DEAD"].as_u64(), v["now"]["by_status"]["RECEIVED"].as_u64()),
        (Some(1), Some(0))
    );

    let (r, out) = stack.cli(&["failures", "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let types: Vec<(&str, u64)> = v["top_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["key"].as_str().unwrap(), c["count"].as_u64().unwrap()))
        .collect();
    assert!(types.contains(&("stripe customer.subscription.updated", 1)), "{out}");
    let (r, out) = stack.cli(&["failures"]).await;
    r.unwrap();
    assert!(out.contains("FAILING (PROVIDER TYPE)") && out.contains("attempts_exhausted"), "{out}");
    // One tenant's: its records only (the attention index does not carry
    // the tenant; the records behind it are read).
    let dead_tenant =
        s(&stack.record(&hookledger::identity::EventKey::new("stripe", "stripe-b", "evt_dead")).await, "tenant");
    let (r, out) = stack.cli(&["stats", "--tenant", &dead_tenant, "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["tenant"].as_str(), v["now"]["by_status"]["DEAD"].as_u64()), (Some(dead_tenant.as_str()), Some(1)));
    assert!(v["metrics"].is_null(), "not listed in TenantMetrics: {out}");
    let (r, out) = stack.cli(&["stats", "--tenant", "nobody-here"]).await;
    r.unwrap();
    assert!(out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["DEAD", "0"]), "{out}");
    assert!(out.contains("no metrics of its own"), "{out}");
    let (r, _) = stack.cli(&["stats", "--tenant", "two words"]).await;
    assert!(r.unwrap_err().contains("tenant must be"));
    let (r, _) = stack.cli(&["stats", "--since", "3w"]).await;
    assert!(r.unwrap_err().to_string().contains("unknown unit"));
    let (r, _) = stack.cli(&["stats", "--period", "90"]).await;
    assert!(r.unwrap_err().to_string().contains("multiple of 60"));
}

#[tokio::test]
async fn list_filters_paginate_and_speak_json() {
    let (stack, _, _) = populated().await;
    let (r, out) = stack.cli(&["list", "--endpoint", "stripe-a", "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = v["items"].as_array().unwrap().iter().map(|i| i["pk"].as_str().unwrap()).collect();
    // evt_ok is PROCESSED: finished records are in no index, `list` does not show them.
    assert_eq!(keys, ["evt#stripe#stripe-a#evt_park"], "{keys:?}");
    let (r, out) = stack.cli(&["list", "--subject", "cus_new"]).await;
    r.unwrap();
    assert!(out.contains("evt_park") && out.contains("1 record(s)"), "{out}");
    let (r, out) =
        stack.cli(&["list", "--type", "customer.subscription.updated", "--status", "dead", "--status", "parked"]).await;
    r.unwrap();
    assert!(out.contains("evt_dead") && out.contains("1 record(s)"), "{out}");

    // Pages: one record per page, following the cursor, sees the two unfinished ones once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let mut args = vec!["list", "--limit", "1", "--json"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let (r, out) = stack.cli(&args).await;
        r.unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        seen.extend(v["items"].as_array().unwrap().iter().map(|i| i["pk"].as_str().unwrap().to_owned()));
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 2, "{seen:?}");

    let (r, _) = stack.cli(&["list", "--status", "finished"]).await;
    assert!(r.unwrap_err().contains("unknown status \"finished\""));
    let (r, _) = stack.cli(&["list", "--cursor", "yesterday"]).await;
    assert!(r.unwrap_err().contains("is not a cursor"));
    let (r, _) = stack.cli(&["list", "--since", "3w"]).await;
    assert!(r.unwrap_err().contains("unknown unit"));
}

#[tokio::test]
async fn show_prints_the_record_and_its_history_with_the_payload_redacted_unless_asked() {
    let (stack, _, _) = populated().await;
    let (r, out) = stack.cli(&["show", "evt#stripe#stripe-b#evt_dead"]).await;
    r.unwrap();
    assert!(out.contains("dead_reason") && out.contains("attempts_exhausted"), "{out}");
    assert!(out.contains("retry: attempt 1 failed") && out.contains("dead: attempts_exhausted"), "{out}");
    assert!(out.contains("payload: redacted") && !out.contains("sub_dead\""), "{out}");
    let (r, out) = stack.cli(&["show", "evt#stripe#stripe-b#evt_dead", "--payload"]).await;
    r.unwrap();
    assert!(out.contains("\"sub_dead\""), "{out}");
    let (r, out) = stack.cli(&["show", "evt#stripe#stripe-a#evt_ok", "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["record"]["status"].as_str(), v["record"]["outcome"].as_str()), (Some("PROCESSED"), Some("applied")));
    assert!(v["payload"].is_null());

    let (r, _) = stack.cli(&["show", "evt#stripe#stripe-a#evt_nope"]).await;
    assert_eq!(r.unwrap_err(), "no event with key evt#stripe#stripe-a#evt_nope");
    let (r, _) = stack.cli(&["show", "not-a-key"]).await;
    assert!(r.unwrap_err().contains("is not an event key"));
}

#[tokio::test]
async fn replay_after_repair_keeps_the_identity_makes_a_new_attempt_and_is_audited() {
    let (stack, _, source) = populated().await;
    let key = "evt#stripe#stripe-a#evt_park";
    // Repair: the missing subject mapping is added.
    let (r, out) = stack.cli(&["map-subject", "--tenant", "t1", "--subject", "cus_new", "--account", "acct_new"]).await;
    r.unwrap();
    assert!(out.contains("mapped stripe subject cus_new"), "{out}");
    let (r, out) = stack.cli(&["replay", key, "--operator", "ana", "--reason", "customer mapping added"]).await;
    r.unwrap();
    assert!(out.contains("[1/1] replayed evt#stripe#stripe-a#evt_park") && out.contains("replayed 1 of 1"), "{out}");
    let rec = stack.record(&hookledger::identity::EventKey::from_stored(key).unwrap()).await;
    assert_eq!((s(&rec, "status").as_str(), n(&rec, "attempts"), n(&rec, "replays")), ("RETRYABLE", 0, 1));

    run_processor(&stack, stack.app(fast_settings(), Some(source)), 3, Duration::from_secs(20)).await;
    let rec = stack.record(&hookledger::identity::EventKey::from_stored(key).unwrap()).await;
    assert_eq!(
        (s(&rec, "status").as_str(), s(&rec, "event_id").as_str(), n(&rec, "attempts")),
        ("PROCESSED", "evt_park", 1)
    );
    assert_eq!(n(&stack.state(&balance_pk("t1", "acct_new")).await.unwrap(), "balance"), 250);
    let (_, out) = stack.cli(&["show", key]).await;
    assert!(out.contains("parked: unknown stripe customer cus_new"), "{out}");
    assert!(out.contains("replay: by ana (arn:aws:") && out.contains("): customer mapping added"), "{out}");
    assert!(out.contains("completed (applied)"), "{out}");
    // Both writes in the audit log: who (as AWS reports the caller, and the
    // name given), what, why, the result; the replay listed by its record too.
    let log = stack.audit_log().await;
    let listed: Vec<(&str, &str)> =
        log.iter().map(|e| (e["verb"].as_str().unwrap(), e["result"].as_str().unwrap())).collect();
    assert_eq!(listed, [("map-subject", "done"), ("replay", "done")], "{log:?}");
    assert!(log.iter().all(|e| e["principal"].as_str().unwrap().starts_with("arn:aws:")), "{log:?}");
    assert_eq!((log[1]["target"].as_str(), log[1]["operator"].as_str()), (Some(key), Some("ana")));
    assert_eq!(log[1]["reason"], "customer mapping added");
    let (r, out) = stack.cli(&["audit-log", "--record", key, "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(1), "{v}");

    // A PROCESSED record cannot be replayed; an unknown one is named.
    let (r, _) = stack.cli(&["replay", key, "--reason", "again"]).await;
    assert_eq!(
        r.unwrap_err(),
        "cannot replay evt#stripe#stripe-a#evt_park: it is PROCESSED (only DEAD or PARKED records can be replayed)"
    );
    let (r, _) = stack.cli(&["replay", "evt#stripe#stripe-a#ghost", "--reason", "x"]).await;
    assert_eq!(r.unwrap_err(), "no event with key evt#stripe#stripe-a#ghost");
    let (r, _) = stack.cli(&["replay", "--reason", "x"]).await;
    assert!(r.unwrap_err().contains("nothing selected"));
    let (r, _) = stack.cli(&["replay", key, "--reason", " "]).await;
    assert!(r.unwrap_err().contains("--reason must say why"));
}

#[tokio::test]
async fn filtered_replay_shows_progress_and_park_and_resolve_are_conditional() {
    let (stack, fake, _) = populated().await;
    fake.fail.store(false, Ordering::SeqCst);
    // Park the DEAD one, then resolve it; resolving again is refused.
    let dead = "evt#stripe#stripe-b#evt_dead";
    let (r, out) = stack.cli(&["park", dead, "--operator", "bo", "--reason", "provider incident"]).await;
    r.unwrap();
    assert!(out.contains("parked 1 of 1"), "{out}");
    let (r, out) =
        stack.cli(&["replay", "--status", "parked", "--operator", "bo", "--reason", "incident over", "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["replayed"].as_u64(), v["skipped"].as_u64()), (Some(2), Some(0)), "{v}");
    assert!(v["run"].as_str().unwrap().starts_with("replay-"), "a replay by filter is a run: {v}");
    // Both parked records are RETRYABLE now.
    let (r, out) = stack.cli(&["resolve", dead, "--operator", "bo", "--reason", "fixed by hand"]).await;
    assert_eq!(
        r.unwrap_err(),
        "cannot resolve evt#stripe#stripe-b#evt_dead: it is RETRYABLE (only DEAD or PARKED records can be resolved)"
    );
    assert!(out.contains("failed: cannot resolve"), "{out}");
    let (r, _) = stack.cli(&["park", "evt#stripe#stripe-a#evt_ok", "--reason", "x"]).await;
    assert!(r.unwrap_err().contains("it is PROCESSED (only RECEIVED, RETRYABLE or DEAD records can be parked"));
    let (r, _) = stack.cli(&["park", dead, "--reason", "hold"]).await;
    r.unwrap();
    let (r, out) = stack.cli(&["resolve", dead, "--operator", "bo", "--reason", "refunded by hand"]).await;
    r.unwrap();
    assert!(out.contains("resolved 1 of 1"), "{out}");
    // Every write audited, no refused one: park, the two replays, park, resolve.
    let (r, out) = stack.cli(&["audit-log", "--record", dead, "--json"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let verbs: Vec<&str> = v["entries"].as_array().unwrap().iter().map(|e| e["verb"].as_str().unwrap()).collect();
    assert_eq!(verbs, ["park", "replay", "park", "resolve"], "{v}");
    assert_eq!(stack.audit_log().await.len(), 5, "and the filtered replay of the other parked record");
    let rec = stack.record(&hookledger::identity::EventKey::from_stored(dead).unwrap()).await;
    assert_eq!(
        (s(&rec, "status").as_str(), s(&rec, "outcome").as_str(), s(&rec, "resolved_by").as_str()),
        ("PROCESSED", "resolved", "bo")
    );
    assert!(!rec.contains_key("due_shard"));
}

#[tokio::test]
async fn reconcile_and_setup_commands_run() {
    let stack = Stack::new().await;
    stack.claim("standard_webhooks", "svix", "msg_cli", None, br#"{"type":"x"}"#).await;
    let (r, out) = stack.cli(&["reconcile"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["complete"], true);
    let (r, out) = stack.cli(&["setup", "--queue", &format!("cli-{}", uuid::Uuid::new_v4().simple())]).await;
    r.unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("HOOKLEDGER_QUEUE_URL=http://"), "{out}");
    assert!(lines[1].starts_with("HOOKLEDGER_DLQ_URL=http://") && lines[1].ends_with("-dlq"), "{out}");
    assert!(lines[2].starts_with("HOOKLEDGER_NOTIFY_TOPIC_ARN=arn:aws:sns:"), "{out}");
    assert!(lines[3].starts_with("HOOKLEDGER_PAYLOAD_BUCKET=cli-") && lines[3].ends_with("-payloads"), "{out}");
    assert!(lines[4].starts_with("HOOKLEDGER_DELIVERY_QUEUE_URL=http://") && lines[4].ends_with("-delivery"), "{out}");
    assert!(lines[5].starts_with("HOOKLEDGER_KEYS_TABLE=cli-") && lines[5].ends_with("-keys"), "{out}");
    let (r, out) = stack.cli(&["schema"]).await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["queue"]["maxReceiveCount"], 10);
    assert_eq!(v["table"]["GlobalSecondaryIndexes"].as_array().unwrap().len(), 2);
    assert!(v["metrics"]["reconciler"].as_array().unwrap().iter().any(|m| m == "reconciler_runs"), "{out}");
    let (r, _) = stack.cli(&["no-such-command"]).await;
    assert!(r.unwrap_err().contains("unrecognized subcommand"));
}

/// `erase --event`: a record in flight is left alone (non-zero, saying
/// why); finished, a dry run changes nothing, then the record loses its
/// payload and says who erased it, the output saying it was not sealed (no
/// key table here: only the ledger's copies). `--subject` needs the key
/// table and says so; one of `--event` and `--subject` is required.
#[tokio::test]
async fn erase_by_event_marks_the_finished_record_and_says_what_it_touched() {
    use hookledger::ports::WorkLedger;
    let stack = Stack::new().await;
    let body = br#"{"type":"x","email":"someone@example.com"}"#;
    let key = stack.claim("standard_webhooks", "svix", "msg_erase", None, body).await;
    let k = key.as_str();
    let (r, out) = stack.cli(&["erase", "--event", k, "--reason", "asked"]).await;
    assert!(r.unwrap_err().contains("in flight"), "{out}");
    assert!(out.contains("in flight") && out.contains("RECEIVED"), "{out}");
    let ledger = stack.ledger();
    ledger.lease(&key, "tok", now_ms(), 30_000).await.unwrap();
    ledger.commit(&key, "tok", &[], "applied", None, now_ms()).await.unwrap();
    let (r, out) = stack.cli(&["erase", "--event", k, "--reason", "asked", "--dry-run"]).await;
    r.unwrap();
    assert!(out.contains("would erase") && out.contains("nothing changed"), "{out}");
    assert!(stack.record(&key).await.contains_key("body"), "a dry run changes nothing");
    let (r, out) = stack.cli(&["erase", "--event", k, "--reason", "asked", "--operator", "dpo"]).await;
    r.unwrap();
    assert!(out.contains("erased") && out.contains("not sealed"), "{out}");
    let record = stack.record(&key).await;
    assert!(!record.contains_key("body") && s(&record, "erased_by") == "dpo", "{record:?}");
    assert_eq!(s(&record, "status"), "PROCESSED", "its status stays");
    let (r, _) = stack.cli(&["erase", "--subject", "cus_1", "--reason", "asked"]).await;
    assert!(r.unwrap_err().contains("HOOKLEDGER_KEYS_TABLE"));
    let (r, _) = stack.cli(&["erase", "--reason", "asked"]).await;
    assert!(r.is_err(), "neither --event nor --subject");
}
