//! `hookledger replay-sns`: sends what SNS could not deliver to the intake
//! (the subscription's dead-letter queue) through the intake's path:
//! verified as of the moment SNS sent it, then claimed like any delivery. A
//! message the intake takes (recorded, or a duplicate of one that did
//! arrive) is deleted from the queue; one it refuses or cannot take now
//! stays there, and is counted.

use std::io::Write;

use clap::Args;
use hookledger::config::{self, ProviderKind};
use hookledger::intake::Intake;
use hookledger::ports::{Ledger, WorkQueue};

#[derive(Args)]
pub struct ReplaySnsArgs {
    /// The subscription's dead-letter queue (the template's SesDeadLetterQueueUrl).
    #[arg(long)]
    dlq_url: String,
    /// The SNS endpoint (in HOOKLEDGER_ENDPOINTS) the subscription delivers to.
    #[arg(long)]
    endpoint: String,
    #[arg(long, env = "HOOKLEDGER_ENDPOINTS", hide_env_values = true)]
    endpoints: String,
    /// Messages read at most.
    #[arg(long, default_value_t = 1000)]
    max: usize,
}

/// What a replay did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplaySummary {
    pub read: usize,
    /// New to the ledger (202): SNS had given up on them.
    pub recorded: usize,
    /// Already recorded (200): they had arrived after all.
    pub duplicates: usize,
    /// Refused (not an SNS message, bad signature or certificate, topic not
    /// allowed): left in the queue.
    pub refused: usize,
    /// The ledger could not take them now (5xx): left in the queue.
    pub failed: usize,
}

/// Replays up to `max` messages of `dlq_url` through `intake`'s SNS `endpoint`.
pub async fn replay<L: Ledger, Q: WorkQueue>(
    intake: &Intake<L, Q>,
    sqs: &aws_sdk_sqs::Client,
    dlq_url: &str,
    endpoint: &str,
    max: usize,
) -> Result<ReplaySummary, String> {
    let mut s = ReplaySummary::default();
    while s.read < max {
        let out = sqs
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(10.min((max - s.read) as i32))
            .visibility_timeout(300)
            .send()
            .await
            .map_err(|e| format!("reading the dead-letter queue: {e}"))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            s.read += 1;
            let body = m.body.unwrap_or_default();
            let answer = intake.replay_sns_dead_letter(endpoint, body.as_bytes(), intake.now()).await;
            match answer.map(|a| a.status) {
                Some(202) => s.recorded += 1,
                Some(st) if (200..300).contains(&st) => s.duplicates += 1,
                Some(st) if st >= 500 => {
                    s.failed += 1;
                    continue;
                }
                _ => {
                    s.refused += 1;
                    continue;
                }
            }
            if let Some(receipt) = m.receipt_handle {
                sqs.delete_message()
                    .queue_url(dlq_url)
                    .receipt_handle(receipt)
                    .send()
                    .await
                    .map_err(|e| format!("deleting a replayed message: {e}"))?;
            }
        }
    }
    Ok(s)
}

pub async fn run(
    args: ReplaySnsArgs,
    wiring: &hookledger::wiring::Wiring,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<ReplaySummary, String> {
    let mut specs = config::parse_endpoints(&args.endpoints).map_err(|e| e.to_string())?;
    specs.retain(|name, _| *name == args.endpoint);
    match specs.get(&args.endpoint) {
        Some(spec) if spec.provider == ProviderKind::Sns => {}
        Some(_) => return Err(format!("endpoint {:?} is not an sns endpoint", args.endpoint)),
        None => return Err(format!("no endpoint {:?} in HOOKLEDGER_ENDPOINTS", args.endpoint)),
    }
    let intake = wiring.intake_for(specs).await.map_err(|e| e.to_string())?;
    let s = replay(&intake, &wiring.sqs_client(), &args.dlq_url, &args.endpoint, args.max).await?;
    if json {
        writeln!(out, "{}", serde_json::to_string(&s).unwrap_or_default()).map_err(|e| e.to_string())?;
    } else {
        writeln!(
            out,
            "replayed {} from the dead-letter queue: recorded {}, already recorded {}, refused {} (left in the queue), failed {} (left in the queue)",
            s.read, s.recorded, s.duplicates, s.refused, s.failed
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(s)
}
