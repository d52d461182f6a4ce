//! The operator's console against the emulator: in a real headless
//! Chromium (find an event by id, open its timeline, replay a DEAD record
//! and see it processed, with screenshots), and its guards over plain HTTP
//! (loopback by default, Host check, CSRF, no secret, payload on request).

use std::time::Duration;

use hookledger::adapters::cloudwatch::CloudWatchMetrics;
use hookledger::adapters::sqs::SqsQueue;
use hookledger::identity::EventKey;
use hookledger_cli::console::Console;

use crate::browser::Browser;
use crate::cli::populated;
use crate::insight::emf;
use crate::support::{STRIPE_SECRET, Stack, fast_settings, now_s, run_processor, s};

const DEAD: &str = "evt#stripe#stripe-b#evt_dead";

/// Starts a console for `stack` on a free loopback port; returns its base
/// URL and its metrics namespace.
async fn console(stack: &Stack) -> (String, String) {
    let namespace = format!("it-{}", uuid::Uuid::new_v4().simple());
    let metrics = CloudWatchMetrics::new(aws_sdk_cloudwatch::Client::new(&stack.aws), &namespace);
    let endpoints = vec![("stripe-a".to_owned(), "stripe".to_owned()), ("stripe-b".to_owned(), "stripe".to_owned())];
    let c = Console::new(
        stack.ledger(),
        SqsQueue::new(stack.sqs.clone(), &stack.queue_url),
        metrics,
        endpoints,
        hookledger::audit::Caller::named("ana"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(c.serve(listener));
    (base, namespace)
}

/// An hour of the functions' metrics, as the bridge forwards them: twelve
/// five-minute periods of deliveries, duplicates, processing times and
/// failures.
async fn an_hour_of_metrics(stack: &Stack, namespace: &str) {
    let cw = CloudWatchMetrics::new(aws_sdk_cloudwatch::Client::new(&stack.aws), namespace);
    // The emulator matches dimensions without the namespace: run-unique names.
    let (intake, processor) = (format!("intake-{namespace}"), format!("processor-{namespace}"));
    let now = now_s() * 1000;
    for i in 0..12i64 {
        let at = now - 3_600_000 + i * 300_000 + 1_000;
        let (received, dups) = (40 + 7 * (i % 5), 2 + (i * 3) % 7);
        let latency: Vec<f64> = (0..5).map(|k| (20 + 9 * ((i + k) % 6)) as f64).collect();
        let stripe = [("provider", "stripe"), ("endpoint", "stripe-a")];
        for line in [
            emf(&intake, at, &stripe, &[("received", received.into())]),
            emf(&intake, at, &stripe, &[("duplicate", dups.into())]),
            emf(&processor, at, &[("outcome", "applied"), ("provider", "stripe")], &[("processed", received.into())]),
            emf(&processor, at, &[("provider", "stripe")], &[("processing_duration", serde_json::json!(latency))]),
            emf(&processor, at, &[("code", "throttled"), ("provider", "stripe")], &[("retried", (i % 4).into())]),
        ] {
            cw.put_emf(&line.replace("\"NS\"", &format!("\"{namespace}\""))).await.unwrap();
        }
    }
}

fn shots() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_browser_the_operator_finds_an_event_opens_its_timeline_and_replays_it_to_processed() {
    let (stack, _fake, source) = populated().await;
    let (base, namespace) = console(&stack).await;
    an_hour_of_metrics(&stack, &namespace).await;
    let b = Browser::start().await;

    // The overview: figures and plots.
    b.goto(&format!("{base}/?since=1h")).await;
    b.wait_title("Overview · Hookledger").await;
    let figures = b.text("#figures").await;
    assert!(figures.contains("DEAD now\n1") && figures.contains("PARKED now\n1"), "{figures}");
    assert!(
        figures.contains("received (new events)\n") && !figures.contains("received (new events)\n0\n"),
        "{figures}"
    );
    // Only final outcomes count as processed; the hour's metrics are all `applied`.
    assert!(
        figures.contains("processed (final state)\n") && !figures.contains("processed (final state)\n0\n"),
        "{figures}"
    );
    assert!(figures.contains("redeliveries (nothing to do)\n0\n"), "{figures}");
    assert!(b.screenshot(&shots().join("overview.png")).await > 10_000);

    // Search by the provider's event id.
    b.type_into("#search", "evt_dead").await;
    b.click("#search-go").await;
    b.wait_title("evt#stripe#stripe-b#evt_dead · Hookledger").await;
    assert!(b.url().await.ends_with("/record?key=evt%23stripe%23stripe-b%23evt_dead"), "{}", b.url().await);
    assert!(b.text("#record-status").await.starts_with("Status: DEAD"));
    let timeline = b.text("#timeline").await;
    assert!(timeline.contains("received") && timeline.contains("attempts_exhausted"), "{timeline}");
    let fields = b.text("#fields").await;
    assert!(fields.lines().any(|l| l.starts_with("received_at") && l.ends_with(" UTC")), "{fields}");
    assert!(b.screenshot(&shots().join("timeline.png")).await > 10_000);

    // Replay: a confirmation with a reason, then the record is queued.
    b.click("#replay").await;
    b.wait_title("Confirm · Hookledger").await;
    b.type_into("#reason", "rule fixed in release 42").await;
    b.click("#confirm").await;
    b.wait_title("evt#stripe#stripe-b#evt_dead · Hookledger").await;
    assert!(b.text("#notice").await.starts_with("Replayed"), "{}", b.text("#notice").await);
    assert!(b.text("#record-status").await.starts_with("Status: RETRYABLE"));

    run_processor(&stack, stack.app(fast_settings(), Some(source)), 3, Duration::from_secs(20)).await;
    b.goto(&format!("{base}/record?key=evt%23stripe%23stripe-b%23evt_dead")).await;
    assert!(b.text("#record-status").await.starts_with("Status: PROCESSED"), "{}", b.text("#record-status").await);
    let timeline = b.text("#timeline").await;
    assert!(timeline.contains("replay") && timeline.contains("by ana: rule fixed in release 42"), "{timeline}");
    assert!(timeline.contains("completed"), "{timeline}");
    assert!(b.screenshot(&shots().join("replayed.png")).await > 10_000);
    b.quit().await;

    let rec = stack.record(&EventKey::from_stored(DEAD).unwrap()).await;
    assert_eq!(s(&rec, "status"), "PROCESSED");
}

fn http() -> reqwest::Client {
    hookledger::adapters::tls::client_builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// A bulk job's page once it says it finished (within 10 s).
async fn finished_job(c: &reqwest::Client, job: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = c.get(job).send().await.unwrap().text().await.unwrap();
        if page.contains("finished") {
            return page;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn token_of(page: &str) -> String {
    let at = page.find("name=csrf value=\"").expect("a form token") + "name=csrf value=\"".len();
    page[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn the_console_binds_to_loopback_checks_host_and_csrf_renders_no_secret_and_shows_payloads_on_request() {
    let (stack, _fake, _source) = populated().await;
    // A type a sender controls, with markup in it: rendered as text.
    stack.claim("stripe", "stripe-a", "evt_markup", Some("<script>alert(1)</script>"), b"{}").await;
    let (base, _) = console(&stack).await;
    let c = http();
    let record_url = format!("{base}/record?key=evt%23stripe%23stripe-b%23evt_dead");

    // Loopback only, unless asked.
    let (r, _) = stack.cli(&["console", "--bind", "0.0.0.0:0"]).await;
    assert!(r.unwrap_err().contains("refusing to listen on 0.0.0.0:0"));

    // DNS rebinding: another Host is refused, even on the right socket.
    let r = c.get(format!("{base}/")).header("host", "evil.example").send().await.unwrap();
    assert_eq!(r.status(), 421);
    let r = c.get(format!("{base}/")).header("host", "evil.example:80").send().await.unwrap();
    assert_eq!(r.status(), 421);

    // Pages: security headers, escaped text, no payload until asked.
    let r = c.get(&record_url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("default-src 'none'") && !csp.contains("script-src"), "{csp}");
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    assert_eq!(r.headers()["cache-control"], "no-store");
    let page = r.text().await.unwrap();
    assert!(!page.contains("sub_dead"), "the payload is not on the page until asked");
    let token = token_of(&page);
    let r = c.get(format!("{base}/record?key=evt%23stripe%23stripe-a%23evt_markup")).send().await.unwrap();
    let markup = r.text().await.unwrap();
    assert!(markup.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !markup.contains("<script>"), "escaped");

    // The payload, on request (a POST with the token).
    let form = [("key", DEAD), ("csrf", token.as_str())];
    let r = c.post(format!("{base}/record/payload")).form(&form).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("sub_dead"));

    // CSRF: a write without the token, with another token, or from another
    // origin is refused and changes nothing; GET cannot write.
    let act = |token: &str, confirm: &str| {
        vec![
            ("key", DEAD.to_owned()),
            ("action", "resolve".to_owned()),
            ("reason", "x".to_owned()),
            ("confirm", confirm.to_owned()),
            ("csrf", token.to_owned()),
        ]
    };
    for (form, origin) in [
        (act("", "yes"), None),
        (act("0123456789abcdef", "yes"), None),
        (act(&token, "yes"), Some("http://evil.example")),
        (act(&token, "yes"), Some("null")),
    ] {
        let mut req = c.post(format!("{base}/record/action")).form(&form);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        assert_eq!(req.send().await.unwrap().status(), 403, "{origin:?}");
    }
    let r = c.get(format!("{base}/record/action?key={DEAD}&action=resolve&reason=x&confirm=yes")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    // Without the confirmation: a page that asks, and nothing changes.
    let r = c.post(format!("{base}/record/action")).form(&act(&token, "")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("id=confirm"));
    let key = EventKey::from_stored(DEAD).unwrap();
    assert_eq!(s(&stack.record(&key).await, "status"), "DEAD", "nothing was written");
    // A confirmed action with an empty reason is refused too.
    let mut empty = act(&token, "yes");
    empty[2].1 = String::new();
    let r = c.post(format!("{base}/record/action")).form(&empty).send().await.unwrap();
    assert_eq!(r.status(), 400);
    // The real thing, from the console's own origin.
    let r = c
        .post(format!("{base}/record/action"))
        .header("origin", base.clone())
        .form(&act(&token, "yes"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(s(&stack.record(&key).await, "status"), "PROCESSED");

    // No page renders a secret (the endpoints' secrets are the stack's).
    for path in ["/", "/records", "/records?status=DEAD", "/search?q=evt_park", &record_url[base.len()..]] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert!(r.status().is_success() || r.status().is_redirection(), "{path}: {}", r.status());
        let body = r.text().await.unwrap();
        assert!(!body.contains(STRIPE_SECRET) && !body.contains("whsec_"), "{path}");
    }
}

#[tokio::test]
async fn a_bulk_replay_asks_first_then_works_through_the_filter_with_progress() {
    let (stack, _fake, _source) = populated().await;
    let (base, _) = console(&stack).await;
    let c = http();
    let token = token_of(&c.get(format!("{base}/records?status=PARKED")).send().await.unwrap().text().await.unwrap());
    let mut form = vec![("status", "PARKED"), ("action", "resolve"), ("reason", "settled by hand"), ("csrf", &token)];
    let r = c.post(format!("{base}/bulk")).form(&form).send().await.unwrap();
    let page = r.text().await.unwrap();
    assert!(page.contains("resolve 1 record(s) matching the filter"), "{page}");
    form.push(("confirm", "yes"));
    let r = c.post(format!("{base}/bulk")).form(&form).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let job = format!("{base}{}", r.headers()["location"].to_str().unwrap());
    let page = finished_job(&c, &job).await;
    assert!(page.contains("1 of 1: 1 done, 0 failed"), "{page}");
    let rec = stack.record(&EventKey::from_stored("evt#stripe#stripe-a#evt_park").unwrap()).await;
    assert_eq!((s(&rec, "status").as_str(), s(&rec, "outcome").as_str()), ("PROCESSED", "resolved"));
    // A bulk action without a filter is refused.
    let form = [("action", "replay"), ("reason", "all of it"), ("csrf", token.as_str())];
    assert_eq!(c.post(format!("{base}/bulk")).form(&form).send().await.unwrap().status(), 400);
}

/// Issue 49: the console's replay by filter shows the count and the run
/// first, replays in the run, and the same filter and reason again find
/// nothing left to replay; the audit page shows each endpoint's last
/// scheduled audit, its missing and DEAD identities linked or with their
/// repair.
#[tokio::test]
async fn a_console_replay_by_filter_counts_first_and_the_audit_page_lists_what_is_missing() {
    use hookledger::ports::BackfillLedger;
    let (stack, _fake, _source) = populated().await;
    let (base, _) = console(&stack).await;
    let c = http();
    let token = token_of(&c.get(format!("{base}/records?status=DEAD")).send().await.unwrap().text().await.unwrap());
    let mut form = vec![("status", "DEAD"), ("action", "replay"), ("reason", "fixed upstream"), ("csrf", &token)];
    let page = c.post(format!("{base}/bulk")).form(&form).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("replay 1 record(s) matching the filter") && page.contains("(run replay-"), "{page}");
    form.push(("confirm", "yes"));
    let r = c.post(format!("{base}/bulk")).form(&form).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let job = format!("{base}{}", r.headers()["location"].to_str().unwrap());
    let page = finished_job(&c, &job).await;
    assert!(page.contains("1 of 1: 1 done, 0 failed"), "{page}");
    let rec = stack.record(&EventKey::from_stored(DEAD).unwrap()).await;
    assert_eq!(s(&rec, "status"), "RETRYABLE");
    assert!(s(&rec, "replay_run").starts_with("replay-"), "marked with its run");

    let page = c.get(format!("{base}/audit")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("id=audit-none"), "{page}");
    let report = serde_json::json!({
        "endpoint": "stripe-a", "provider": "stripe", "since": 1_000, "until": 2_000, "at_ms": 2_000_000,
        "provider_truth": true, "listed": 50, "recorded": 47, "applied": 46, "ignored": 0, "parked": 0, "dead": 1,
        "in_flight": 0, "missing": 3, "doubled": 0, "outcomes": {}, "routes": {}, "outcome_p50_ms": 10,
        "outcome_p99_ms": 90, "pages": 1, "notes": [], "parked_items": [], "doubled_items": [], "dead_deliveries": [],
        "missing_items": [{"key": "evt#stripe#stripe-a#evt_gone", "event_type": "invoice.paid", "why": "listed",
            "repair": "hookledger backfill --endpoint stripe-a --since 1500 --until 1501"}],
        "dead_items": [{"key": DEAD, "event_type": null, "why": "permanent", "repair": "hookledger replay"}],
    });
    stack.ledger().save_audit("stripe-a", &report.to_string(), 2_000_000).await.unwrap();
    let page = c.get(format!("{base}/audit")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("id=\"audit-stripe-a\"") && page.contains("missing or doubled"), "{page}");
    assert!(
        page.contains("evt#stripe#stripe-a#evt_gone") && page.contains("hookledger backfill --endpoint stripe-a"),
        "{page}"
    );
    assert!(page.contains(&format!("href=\"/record?key={}\"", hookledger_cli::console::html::url(DEAD))), "{page}");
}
