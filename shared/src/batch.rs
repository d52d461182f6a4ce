//! The processor's queue batch: each received work message is processed on
//! its own (an unreadable one fails alone); messages for different keys run
//! concurrently, repeats of one key in a batch run in order, in the order
//! received. The answer is the ids of the messages to leave on the queue
//! (SQS's partial batch response).
//!
//! A message that must come back later stays on the queue, shown again
//! after its delay ([`Redelivery::show_again`]: never early, an early
//! return only burns a receive). On its last receive before the queue's
//! dead-letter redrive it is deleted instead: the ledger record is RETRYABLE
//! (or leased) with its due time in the `due` index, and the reconciler
//! re-drives it then. Long waits (gaps, infrastructure outages) thus never
//! reach the dead-letter queue, which stays for messages that cannot be read.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ports::{Dispatch, Ledger, Received, Redelivery, WorkLedger, WorkQueue};
use crate::processor::Processor;

/// Processes a batch; returns the message ids that stay on the queue, or
/// an error when a worker died (nothing is reported done: the invocation
/// fails and the whole batch comes back).
pub async fn process<L, Q, D, R>(
    processor: Arc<Processor<L, Q, D>>,
    queue: Arc<R>,
    batch: Vec<Received>,
) -> Result<Vec<String>, String>
where
    L: WorkLedger + Ledger + 'static,
    Q: WorkQueue + 'static,
    D: Dispatch + 'static,
    R: Redelivery + 'static,
{
    // One group per key, in the order received; unreadable messages alone.
    let mut groups: BTreeMap<String, Vec<Received>> = BTreeMap::new();
    for (i, r) in batch.into_iter().enumerate() {
        let group = match &r.work {
            Some((key, _)) => format!("k{}", key.as_str()),
            None => format!("u{i}"),
        };
        groups.entry(group).or_default().push(r);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (_, messages) in groups {
        let (processor, queue) = (processor.clone(), queue.clone());
        tasks.spawn(async move {
            let mut stay = Vec::new();
            for m in messages {
                if !one(&processor, queue.as_ref(), &m).await {
                    stay.push(m.message_id);
                }
            }
            stay
        });
    }
    let mut stay = Vec::new();
    while let Some(done) = tasks.join_next().await {
        stay.extend(done.map_err(|e| e.to_string())?);
    }
    stay.sort();
    Ok(stay)
}

/// One message's fate: `true` delete it, `false` leave it on the queue.
pub async fn one<L: WorkLedger + Ledger, Q: WorkQueue, D: Dispatch, R: Redelivery>(
    processor: &Processor<L, Q, D>,
    queue: &R,
    m: &Received,
) -> bool {
    let message_id = m.message_id.as_str();
    let Some((key, carried)) = &m.work else {
        tracing::error!(message_id, "malformed work message; leaving it for the dead-letter queue");
        return false;
    };
    let now_ms = processor.ambient().now_ms();
    match processor.process_message(key, carried.as_deref(), now_ms).await {
        Ok(report) => match report.retry_after_ms {
            None => true,
            Some(delay_ms) if m.last_receive => {
                tracing::info!(message_id, key = %key, delay_ms, "last receive; the reconciler re-drives it when due");
                true
            }
            Some(delay_ms) => {
                if let Some(receipt) = &m.receipt
                    && let Err(e) = queue.show_again(receipt, delay_ms).await
                {
                    tracing::warn!(message_id, error = %e, "could not change visibility; default redelivery applies");
                }
                false
            }
        },
        Err(e) => {
            tracing::warn!(message_id, key = %key, error = %e, "processing failed; message stays on the queue");
            false
        }
    }
}

#[cfg(test)]
mod tests;
