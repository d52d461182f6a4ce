//! The shard count recorded on the table (`adapters::dynamodb::shards`),
//! against the emulator: lowering it is refused, raising it and recording
//! the same count again are accepted, and the record is in no index.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use hookledger::adapters::dynamodb::shards::{self, CONFIG_PK, CONFIG_SK, Recorded, SHARDS, ShardsError};
use hookledger::adapters::dynamodb::table_definition;

use crate::support::Stack;

/// The count the table's record holds, and the record itself.
async fn recorded(stack: &Stack) -> (Option<u32>, HashMap<String, AttributeValue>) {
    let item = stack
        .ddb
        .get_item()
        .table_name(&stack.table)
        .key("pk", AttributeValue::S(CONFIG_PK.into()))
        .key("sk", AttributeValue::S(CONFIG_SK.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap_or_default();
    let count = item.get(SHARDS).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok());
    (count, item)
}

#[tokio::test]
async fn a_table_recorded_with_32_shards_refuses_16() {
    let stack = Stack::new().await;
    shards::record(&stack.ledger().with_shards(32)).await.unwrap();

    let refused = shards::record(&stack.ledger().with_shards(16)).await.unwrap_err();
    assert!(matches!(refused, ShardsError::Lowered { configured: 16, recorded: 32 }), "{refused:?}");
    let message = refused.to_string();
    for needed in ["HOOKLEDGER_INDEX_SHARDS is 16", "written over 32 shards", "IndexShards", "32 or more"] {
        assert!(message.contains(needed), "{needed:?} not in {message:?}");
    }
    assert_eq!(recorded(&stack).await.0, Some(32), "the refused count is not recorded");
}

#[tokio::test]
async fn raising_the_shard_count_is_accepted_and_the_record_is_in_no_index() {
    let stack = Stack::new().await;
    let first = shards::record(&stack.ledger().with_shards(16)).await.unwrap();
    assert_eq!(first, Recorded { configured: 16, previous: None });
    let raised = shards::record(&stack.ledger().with_shards(32)).await.unwrap();
    assert_eq!(raised, Recorded { configured: 32, previous: Some(16) });

    let (count, item) = recorded(&stack).await;
    assert_eq!(count, Some(32));
    // No index key of the table's definition is on the record.
    let definition = table_definition();
    for index in definition["GlobalSecondaryIndexes"].as_array().unwrap() {
        for key in index["KeySchema"].as_array().unwrap() {
            let name = key["AttributeName"].as_str().unwrap();
            assert!(!item.contains_key(name), "the record carries {name}, a key of the {} index", index["IndexName"]);
        }
    }
}

#[tokio::test]
async fn recording_the_same_count_again_is_accepted() {
    let stack = Stack::new().await;
    let ledger = stack.ledger().with_shards(32);
    shards::record(&ledger).await.unwrap();
    // A second cold start, or the SDK's retry of the same update.
    let again = shards::record(&ledger).await.unwrap();
    assert_eq!(again, Recorded { configured: 32, previous: Some(32) });
    assert_eq!(recorded(&stack).await.0, Some(32));
}
