//! `hookledger replay-sns`: sends what SNS could not deliver to the intake
//! (the subscription's dead-letter queue) through the intake's path. Only a
//! notification is replayed, and only within bounds: no older than the
//! identity retention or the queue's retention, queued (its SQS
//! `SentTimestamp`) no earlier than SNS sent it (its `Timestamp`) and no
//! later than the subscription's retries allow, and — with
//! `--sns-sender-id` — queued by that sender. Then it is verified as of the
//! moment SNS sent it and claimed like any delivery. A message the intake
//! takes (recorded, or a duplicate of one that did arrive) is deleted from
//! the queue; one refused, or that the intake cannot take now, stays there
//! and is counted (refusals by reason).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::SystemTime;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use clap::Args;
use hookledger::config::{self, ProviderKind};
use hookledger::intake::{DeadLetter, DeadLetterQueue, Intake};
use hookledger::ports::{Ledger, WorkQueue};

/// The longest total retry time an SNS delivery policy allows for HTTP/S
/// endpoints (the template's policy retries for about 45 minutes).
pub const MAX_HTTPS_RETRY_SECS: i64 = 3_600;

/// How long a message read stays invisible: a run shorter than this reads no
/// message twice, and a refused one is visible again after it.
const VISIBILITY_SECS: i32 = 300;

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
    /// The subscription's total retry time, in seconds (its delivery
    /// policy's). A message queued later than this plus 300 s after its
    /// Timestamp is refused. The default, the most SNS allows for HTTP/S,
    /// never refuses a genuine dead letter.
    #[arg(long, default_value_t = MAX_HTTPS_RETRY_SECS,
          value_parser = clap::value_parser!(i64).range(0..=MAX_HTTPS_RETRY_SECS))]
    max_retry_seconds: i64,
    /// Replay only messages whose SQS SenderId is this one (as SQS records
    /// it for the dead letters SNS moves); any other is refused.
    #[arg(long)]
    sns_sender_id: Option<String>,
}

/// What a replay reads and how it judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The subscription's dead-letter queue.
    pub dlq_url: String,
    /// The SNS endpoint whose verification the messages go through.
    pub endpoint: String,
    /// Messages read at most.
    pub max: usize,
    /// The subscription's total retry time (see [`DeadLetterQueue`]).
    pub max_retry_secs: i64,
    /// When set, the only SQS `SenderId` admitted.
    pub sender_id: Option<String>,
}

/// What a replay did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplaySummary {
    pub read: usize,
    /// New to the ledger (202): SNS had given up on them.
    pub recorded: usize,
    /// Already recorded (200): they had arrived after all.
    pub duplicates: usize,
    /// Refused: left in the queue. The sum of `refused_by_reason`.
    pub refused: usize,
    /// Refused messages by reason: `sender_not_allowed`, `no_sent_timestamp`,
    /// `malformed` (not an SNS envelope), `not_a_notification`, `too_old`,
    /// `sent_outside_retry_window`, and `unverified` (the intake refused it:
    /// signature, certificate, topic or content).
    pub refused_by_reason: BTreeMap<&'static str, usize>,
    /// The ledger could not take them now (5xx): left in the queue.
    pub failed: usize,
}

/// What became of one message.
enum Verdict {
    Recorded,
    Duplicate,
    Refused(&'static str),
    Failed,
}

impl ReplaySummary {
    /// Counts one message read; whether it leaves the queue.
    fn count(&mut self, verdict: Verdict) -> bool {
        self.read += 1;
        match verdict {
            Verdict::Recorded => self.recorded += 1,
            Verdict::Duplicate => self.duplicates += 1,
            Verdict::Refused(reason) => {
                self.refused += 1;
                *self.refused_by_reason.entry(reason).or_default() += 1;
                return false;
            }
            Verdict::Failed => {
                self.failed += 1;
                return false;
            }
        }
        true
    }

    /// The refusals by reason, for people: "too_old 2, unverified 1".
    fn reasons_text(&self) -> String {
        let each: Vec<String> = self.refused_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        each.join(", ")
    }
}

/// Replays up to `options.max` messages of the dead-letter queue through
/// `intake`'s SNS endpoint, judging their age at `now`.
pub async fn replay<L: Ledger, Q: WorkQueue>(
    intake: &Intake<L, Q>,
    sqs: &aws_sdk_sqs::Client,
    options: &ReplayOptions,
    now: SystemTime,
) -> Result<ReplaySummary, String> {
    let queue = DeadLetterQueue {
        max_retry_secs: options.max_retry_secs,
        retention_secs: retention_secs(sqs, &options.dlq_url).await?,
    };
    let mut s = ReplaySummary::default();
    while s.read < options.max {
        let messages = receive(sqs, &options.dlq_url, options.max - s.read).await?;
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let taken = s.count(judge(intake, &queue, options, &m, now).await);
            if let (true, Some(receipt)) = (taken, m.receipt_handle) {
                sqs.delete_message()
                    .queue_url(&options.dlq_url)
                    .receipt_handle(receipt)
                    .send()
                    .await
                    .map_err(|e| format!("deleting a replayed message: {e}"))?;
            }
        }
    }
    Ok(s)
}

/// The queue's `MessageRetentionPeriod`, in seconds.
async fn retention_secs(sqs: &aws_sdk_sqs::Client, dlq_url: &str) -> Result<i64, String> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(dlq_url)
        .attribute_names(QueueAttributeName::MessageRetentionPeriod)
        .send()
        .await
        .map_err(|e| format!("reading the dead-letter queue's retention period: {e}"))?;
    out.attributes
        .and_then(|a| a.get(&QueueAttributeName::MessageRetentionPeriod).and_then(|v| v.parse().ok()))
        .ok_or_else(|| "the dead-letter queue reported no MessageRetentionPeriod".to_owned())
}

/// Up to `up_to` (at most 10) messages, with their `SentTimestamp` and `SenderId`.
async fn receive(sqs: &aws_sdk_sqs::Client, dlq_url: &str, up_to: usize) -> Result<Vec<Message>, String> {
    let out = sqs
        .receive_message()
        .queue_url(dlq_url)
        .max_number_of_messages(up_to.min(10) as i32)
        .visibility_timeout(VISIBILITY_SECS)
        .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
        .message_system_attribute_names(MessageSystemAttributeName::SenderId)
        .send()
        .await
        .map_err(|e| format!("reading the dead-letter queue: {e}"))?;
    Ok(out.messages.unwrap_or_default())
}

/// The sender check, then the intake's bounds and verification.
async fn judge<L: Ledger, Q: WorkQueue>(
    intake: &Intake<L, Q>,
    queue: &DeadLetterQueue,
    options: &ReplayOptions,
    m: &Message,
    now: SystemTime,
) -> Verdict {
    let attribute = |name| m.attributes.as_ref().and_then(|a| a.get(&name)).map(String::as_str);
    let sender = attribute(MessageSystemAttributeName::SenderId);
    if options.sender_id.as_deref().is_some_and(|pinned| sender != Some(pinned)) {
        return Verdict::Refused("sender_not_allowed");
    }
    let Some(sent_ms) = attribute(MessageSystemAttributeName::SentTimestamp).and_then(|v| v.parse::<i64>().ok()) else {
        return Verdict::Refused("no_sent_timestamp");
    };
    let letter = DeadLetter { envelope: m.body().unwrap_or_default().as_bytes(), sent_s: sent_ms.div_euclid(1000) };
    match intake.replay_sns_dead_letter(&options.endpoint, queue, &letter, now).await {
        Err(refusal) => Verdict::Refused(refusal.reason()),
        Ok(a) if a.status == 202 => Verdict::Recorded,
        Ok(a) if (200..300).contains(&a.status) => Verdict::Duplicate,
        Ok(a) if a.status >= 500 => Verdict::Failed,
        Ok(_) => Verdict::Refused("unverified"),
    }
}

impl ReplaySnsArgs {
    /// The endpoint its messages are for (the audit entry's target).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
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
        Some(spec) if spec.provider == ProviderKind::SNS => {}
        Some(_) => return Err(format!("endpoint {:?} is not an sns endpoint", args.endpoint)),
        None => return Err(format!("no endpoint {:?} in HOOKLEDGER_ENDPOINTS", args.endpoint)),
    }
    let intake = wiring.intake_for(specs).await.map_err(|e| e.to_string())?;
    let options = ReplayOptions {
        dlq_url: args.dlq_url,
        endpoint: args.endpoint,
        max: args.max,
        max_retry_secs: args.max_retry_seconds,
        sender_id: args.sns_sender_id,
    };
    let s = replay(&intake, &wiring.sqs_client(), &options, intake.now()).await?;
    if json {
        writeln!(out, "{}", serde_json::to_string(&s).unwrap_or_default()).map_err(|e| e.to_string())?;
    } else {
        writeln!(
            out,
            "replayed {} from the dead-letter queue: recorded {}, already recorded {}, refused {} (left in the queue{}{}), failed {} (left in the queue)",
            s.read,
            s.recorded,
            s.duplicates,
            s.refused,
            if s.refused > 0 { ": " } else { "" },
            s.reasons_text(),
            s.failed
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_reason_and_only_taken_messages_leave_the_queue() {
        let mut s = ReplaySummary::default();
        let left = [
            Verdict::Refused("too_old"),
            Verdict::Recorded,
            Verdict::Refused("too_old"),
            Verdict::Duplicate,
            Verdict::Refused("unverified"),
            Verdict::Failed,
        ]
        .map(|v| s.count(v));
        assert_eq!(left, [false, true, false, true, false, false]);
        assert_eq!((s.read, s.recorded, s.duplicates, s.refused, s.failed), (6, 1, 1, 3, 1));
        assert_eq!(s.refused_by_reason, BTreeMap::from([("too_old", 2), ("unverified", 1)]));
        assert_eq!(s.reasons_text(), "too_old 2, unverified 1");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["refused_by_reason"], serde_json::json!({"too_old": 2, "unverified": 1}));
    }

    #[test]
    fn the_retry_time_defaults_to_the_most_sns_allows_and_cannot_exceed_it() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ReplaySnsArgs,
        }
        let parse = |extra: &[&str]| {
            let base = ["hookledger", "--dlq-url", "q", "--endpoint", "ses", "--endpoints", "{}"];
            <Cli as clap::Parser>::try_parse_from(base.iter().chain(extra))
        };
        let default = parse(&[]).unwrap().args;
        assert_eq!((default.max_retry_seconds, default.sns_sender_id), (3_600, None));
        assert_eq!(parse(&["--max-retry-seconds", "900"]).unwrap().args.max_retry_seconds, 900);
        assert!(parse(&["--max-retry-seconds", "3601"]).is_err());
        let pinned = parse(&["--sns-sender-id", "AIDAEXAMPLE"]).unwrap().args;
        assert_eq!(pinned.sns_sender_id.as_deref(), Some("AIDAEXAMPLE"));
    }
}
