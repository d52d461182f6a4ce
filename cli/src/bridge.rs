//! The local event-source bridge: what AWS does around the functions, for a
//! stack served by `cargo lambda watch`. It polls the work queue and the
//! delivery queue (the processor's two event sources) and invokes
//! the processor with SQS batches the way Lambda's event source mapping does
//! (batch size, partial batch failures: only failures stay; a failed
//! invocation leaves the whole batch; visibility; the queue's redrive policy
//! moves a message to the DLQ after its max receives), and it invokes the
//! reconciler on a timer as the schedule would.

use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct BridgeArgs {
    /// Where `cargo lambda watch` serves the Lambda invoke API.
    #[arg(long, env = "HOOKLEDGER_INVOKE_URL", default_value = "http://127.0.0.1:9000")]
    invoke_url: String,
    #[arg(long, default_value_t = 10)]
    batch_size: i32,
    /// Seconds between reconciler invocations (0: never).
    #[arg(long, default_value_t = 30)]
    reconcile_every_secs: u64,
    /// Stop after this many seconds (0: run until stopped).
    #[arg(long, default_value_t = 0)]
    run_for_secs: u64,
    /// The functions' output (`cargo lambda watch`'s log): its EMF lines are
    /// sent to CloudWatch as PutMetricData, as CloudWatch Logs does in AWS.
    #[arg(long)]
    emf_log: Option<std::path::PathBuf>,
}

/// Follows `path` from its end and forwards every EMF line in it, once a
/// second, until the process stops. A line is read whole (up to its newline).
async fn forward_emf(path: std::path::PathBuf, metrics: hookledger::adapters::cloudwatch::CloudWatchMetrics) {
    use std::io::{BufRead, Seek};
    let mut offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let (mut sent, mut failed) = (0usize, 0usize);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(mut file) = std::fs::File::open(&path) else { continue };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < offset {
            offset = 0; // truncated or replaced
        }
        if file.seek(std::io::SeekFrom::Start(offset)).is_err() {
            continue;
        }
        let mut reader = std::io::BufReader::new(file);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if !line.ends_with('\n') {
                break; // the rest of it is not written yet
            }
            offset += line.len() as u64;
            // cargo lambda watch prefixes nothing, but tolerate a prefix.
            if let Some(start) = line.find("{\"_aws\"") {
                match metrics.put_emf(&line[start..]).await {
                    Ok(n) => sent += n,
                    Err(e) => {
                        failed += 1;
                        eprintln!("bridge: EMF forward failed ({sent} sent, {failed} failed): {e}");
                    }
                }
            }
            line.clear();
        }
    }
}

async fn invoke(
    client: &reqwest::Client,
    base: &str,
    function: &str,
    payload: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let url = format!("{}/2015-03-31/functions/{function}/invocations", base.trim_end_matches('/'));
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(payload.to_string())
        .send()
        .await
        .map_err(|e| format!("invoke {function}: {e}"))?;
    let failed = resp.headers().contains_key("x-amz-function-error") || !resp.status().is_success();
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    if failed || body.get("errorType").is_some() {
        return Err(format!("{function} failed ({status}): {body}"));
    }
    Ok(body)
}

/// A queue the bridge takes to the processor, as an event source mapping.
struct Source {
    url: String,
    arn: String,
}

async fn source(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<Source, String> {
    let arn = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .unwrap_or_default();
    Ok(Source { url: url.to_owned(), arn })
}

pub async fn run(
    args: BridgeArgs,
    wiring: &hookledger::wiring::Wiring,
    queue_url: &str,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let aws = wiring.aws();
    let sqs = wiring.sqs_client();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(180)).build().map_err(|e| e.to_string())?;
    // The processor's two event sources: the work queue and, when there is
    // one, the delivery queue.
    let mut sources = vec![source(&sqs, queue_url).await?];
    if let Some(url) = &wiring.settings.delivery_queue_url {
        sources.push(source(&sqs, url).await?);
    }
    let region = aws.region().map(|r| r.to_string()).unwrap_or_else(|| "us-east-1".into());
    if let Some(path) = args.emf_log.clone() {
        let ns = std::env::var("HOOKLEDGER_METRICS_NAMESPACE").ok();
        // One attempt per PutMetricData (see `Wiring::metrics_writer_once`).
        tokio::spawn(forward_emf(path, wiring.metrics_writer_once(ns)));
    }
    let started = Instant::now();
    let mut last_reconcile: Option<Instant> = None;
    let urls: Vec<&str> = sources.iter().map(|s| s.url.as_str()).collect();
    writeln!(out, "bridge: {} -> processor; reconciler every {}s", urls.join(", "), args.reconcile_every_secs)
        .map_err(|e| e.to_string())?;
    loop {
        if args.run_for_secs > 0 && started.elapsed() >= Duration::from_secs(args.run_for_secs) {
            return Ok(());
        }
        if args.reconcile_every_secs > 0
            && last_reconcile.is_none_or(|t| t.elapsed() >= Duration::from_secs(args.reconcile_every_secs))
        {
            last_reconcile = Some(Instant::now());
            let event = json!({"version": "0", "id": uuid::Uuid::new_v4().to_string(), "detail-type": "Scheduled Event",
                "source": "aws.scheduler", "time": "", "region": region, "resources": [], "detail": {}});
            match invoke(&http, &args.invoke_url, "reconciler", &event).await {
                Ok(summary) => writeln!(out, "reconciler: {summary}").map_err(|e| e.to_string())?,
                Err(e) => writeln!(out, "reconciler: {e}").map_err(|e| e.to_string())?,
            }
        }
        for source in &sources {
            pump(&args, &sqs, &http, source, &region, out).await?;
        }
    }
}

/// One receive from `source` and, when it got messages, one processor
/// invocation with them; what the processor reports done is deleted.
async fn pump(
    args: &BridgeArgs,
    sqs: &aws_sdk_sqs::Client,
    http: &reqwest::Client,
    source: &Source,
    region: &str,
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), String> {
    let received = sqs
        .receive_message()
        .queue_url(&source.url)
        .max_number_of_messages(args.batch_size.clamp(1, 10))
        .wait_time_seconds(1)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await;
    let messages = match received {
        Ok(r) => r.messages.unwrap_or_default(),
        Err(e) => {
            writeln!(out, "bridge: receive failed: {e}").map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Ok(());
        }
    };
    if messages.is_empty() {
        return Ok(());
    }
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            let attrs: serde_json::Map<String, serde_json::Value> = m
                .attributes()
                .map(|a| a.iter().map(|(k, v)| (k.as_str().to_owned(), json!(v))).collect())
                .unwrap_or_default();
            json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(),
                "attributes": attrs, "messageAttributes": {}, "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs", "eventSourceARN": source.arn, "awsRegion": region})
        })
        .collect();
    match invoke(http, &args.invoke_url, "processor", &json!({ "Records": records })).await {
        Ok(resp) => {
            let failed: Vec<&str> = resp["batchItemFailures"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["itemIdentifier"].as_str())
                .collect();
            for m in &messages {
                if !failed.contains(&m.message_id().unwrap_or_default()) {
                    if let Some(receipt) = m.receipt_handle() {
                        let _ = sqs.delete_message().queue_url(&source.url).receipt_handle(receipt).send().await;
                    }
                }
            }
            writeln!(out, "processor: {} message(s), {} left on the queue", messages.len(), failed.len())
                .map_err(|e| e.to_string())?;
        }
        // A failed invocation: every message stays and comes back after its visibility.
        Err(e) => writeln!(out, "processor: {e}").map_err(|e| e.to_string())?,
    }
    Ok(())
}
