//! The index shard count the table's items were written with, recorded on
//! the table itself so that a lower one is refused.
//!
//! Every item in the `due` and `attention` indexes carries its shard in its
//! partition name (`due#007`), and the reconciler and the operators query
//! shards `0 … HOOKLEDGER_INDEX_SHARDS − 1`. Raising the count is safe: the
//! items already written stay in shards still queried. Lowering it is not:
//! items in the shards at or above the new count would never be queried
//! again (never re-driven, never reported). So each reconciler execution
//! environment, before its first run, records its count with one conditional
//! update on a config item, which only raises it, and stops with
//! [`ShardsError::Lowered`] when the table was written with more shards than
//! configured (`functions/reconciler/src/main.rs`).
//!
//! The config item (`pk = sk = "config#index"`) carries no index key and no
//! TTL: it is in no index and never expires. Its condition is no step of a
//! record's or an outbox item's state machine, so it is written here rather
//! than in `conditions`; a retry of the same update passes its own condition
//! (the count it wrote is not above itself).

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::{DynamoLedger, get_n};
use crate::adapters::port_error;
use crate::ledger::PortError;

/// The config item's key: the same value for the partition and sort keys.
pub const CONFIG_PK: &str = "config#index";
pub const CONFIG_SK: &str = "config#index";
/// The attribute holding the recorded count.
pub const SHARDS: &str = "shards";

/// Raises the recorded count to the configured one, or keeps it.
pub const RECORD: &str = "SET #shards = :n";
/// The condition of [`RECORD`]: nothing recorded yet, or not more than configured.
pub const NOT_LOWERED: &str = "attribute_not_exists(#shards) OR #shards <= :n";

/// What [`record`] found and left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The ledger's count, now the recorded one.
    pub configured: u32,
    /// The count recorded before (`None`: the first cold start to record one).
    pub previous: Option<u32>,
}

/// Why the count was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    #[error(
        "HOOKLEDGER_INDEX_SHARDS is {configured} but this table's items were written over {recorded} shards: \
         the items in shards {configured} to {last} would never be queried again. Lowering the shard count is \
         refused; set HOOKLEDGER_INDEX_SHARDS (the template's IndexShards parameter) back to {recorded} or more, \
         the same value for every function and the CLI",
        last = recorded.saturating_sub(1)
    )]
    Lowered { configured: u32, recorded: u32 },
    #[error("the recorded index shard count could not be checked: {0}")]
    Unavailable(#[from] PortError),
}

/// Why an operator's tool has no shard count to compute partitions with.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    #[error(
        "this table records no index shard count yet (the reconciler records it at its first run, `hookledger \
         setup` when it creates the table): pass --shards or set HOOKLEDGER_INDEX_SHARDS to the stack's \
         IndexShards, or let the reconciler run once"
    )]
    NoneRecorded,
    #[error(
        "--shards / HOOKLEDGER_INDEX_SHARDS is {given} but this table records {recorded} index shards, the ones the \
         reconciler reads: a record or delivery written for {given} shards could land where it never looks. Drop \
         --shards (the recorded count is used) or pass {recorded}"
    )]
    Disagrees { given: u32, recorded: u32 },
}

/// The count the table records (one consistent `GetItem`); `None` before
/// any reconciler run or `setup` recorded one.
pub async fn recorded(ledger: &DynamoLedger) -> Result<Option<u32>, PortError> {
    Ok(ledger.read_item(CONFIG_PK, CONFIG_SK).await?.as_ref().and_then(count))
}

/// The count an operator's tool computes partitions with: the one the table
/// records, which the reconciler reads; a `given` one only where none is
/// recorded yet. A given count that disagrees with the record is refused,
/// and so is having neither.
pub fn resolve(given: Option<u32>, recorded: Option<u32>) -> Result<u32, CountError> {
    match (given, recorded) {
        (Some(given), Some(recorded)) if given != recorded => Err(CountError::Disagrees { given, recorded }),
        (_, Some(recorded)) => Ok(recorded),
        (Some(given), None) => Ok(given),
        (None, None) => Err(CountError::NoneRecorded),
    }
}

/// Records `ledger`'s shard count on its table (one conditional
/// `UpdateItem`), refusing a count below the one recorded.
pub async fn record(ledger: &DynamoLedger) -> Result<Recorded, ShardsError> {
    let configured = ledger.shards();
    let sent = ledger
        .client()
        .update_item()
        .table_name(ledger.table())
        .set_key(Some(DynamoLedger::item_key(CONFIG_PK, CONFIG_SK)))
        .update_expression(RECORD)
        .condition_expression(NOT_LOWERED)
        .expression_attribute_names("#shards", SHARDS)
        .expression_attribute_values(":n", AttributeValue::N(configured.to_string()))
        .return_values(ReturnValue::AllOld)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    match sent {
        Ok(out) => Ok(Recorded { configured, previous: out.attributes.as_ref().and_then(count) }),
        Err(e) => match e.as_service_error() {
            Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                // The item the condition met (read when the endpoint does not return it).
                let met = match c.item() {
                    Some(item) => Some(item.clone()),
                    None => ledger.read_item(CONFIG_PK, CONFIG_SK).await?,
                };
                let recorded = met.as_ref().and_then(count).unwrap_or(configured);
                Err(ShardsError::Lowered { configured, recorded })
            }
            _ => Err(port_error("dynamodb", &e).into()),
        },
    }
}

fn count(item: &super::Item) -> Option<u32> {
    get_n(item, SHARDS).and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_count_wins_and_a_disagreeing_or_missing_one_is_refused() {
        assert_eq!(resolve(None, Some(16)).unwrap(), 16);
        assert_eq!(resolve(Some(16), Some(16)).unwrap(), 16);
        assert_eq!(resolve(Some(16), None).unwrap(), 16);
        let disagrees = resolve(Some(80), Some(16)).unwrap_err();
        assert!(matches!(disagrees, CountError::Disagrees { given: 80, recorded: 16 }), "{disagrees:?}");
        assert!(disagrees.to_string().contains("records 16 index shards"), "{disagrees}");
        let none = resolve(None, None).unwrap_err().to_string();
        for needed in ["records no index shard count", "--shards", "HOOKLEDGER_INDEX_SHARDS"] {
            assert!(none.contains(needed), "{needed:?} not in {none:?}");
        }
    }
}
