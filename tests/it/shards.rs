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

/// The CLI as an operator runs it: `--table` and `--queue-url`, no `--shards`
/// unless `extra` passes one.
async fn cli_without_shards(stack: &Stack, extra: &[&str]) -> (Result<(), String>, String) {
    let mut argv = vec!["hookledger", "--table", &stack.table, "--queue-url", &stack.queue_url];
    argv.extend_from_slice(extra);
    let mut out: Vec<u8> = Vec::new();
    let r = hookledger_cli::run(argv, &mut out).await.map_err(|e| e.to_string());
    (r, String::from_utf8(out).unwrap())
}

#[tokio::test]
async fn an_operator_replay_lands_in_a_shard_the_reconciler_reads_on_a_stack_kept_at_16() {
    use hookledger::identity::EventKey;
    use hookledger::policy::DEFAULT_INDEX_SHARDS;

    // A stack kept at 16 shards: its reconciler recorded 16 on the table.
    let (stack, _, _) = crate::cli::populated().await;
    shards::record(&stack.ledger().with_shards(16)).await.unwrap();
    let key = "evt#stripe#stripe-b#evt_dead";
    let event = EventKey::from_stored(key).unwrap();
    assert_ne!(event.shard(16), event.shard(DEFAULT_INDEX_SHARDS), "the test needs a key whose shards differ");

    let (r, out) = cli_without_shards(&stack, &["replay", key, "--reason", "fixed"]).await;
    r.unwrap();
    assert!(out.contains("replayed 1 of 1"), "{out}");
    let rec = stack.record(&event).await;
    let due = rec.get("due_shard").and_then(|v| v.as_s().ok()).cloned();
    assert_eq!(
        due.as_deref(),
        Some(hookledger::adapters::dynamodb::due_shard(event.shard(16)).as_str()),
        "the replay's due entry is in a shard the reconciler (16 shards) queries"
    );

    // A count that disagrees with the table's is refused, naming both.
    let (r, _) = cli_without_shards(&stack, &["--shards", "80", "replay", key, "--reason", "x"]).await;
    let refused = r.unwrap_err();
    assert!(refused.contains("is 80 but this table records 16"), "{refused}");
}

#[tokio::test]
async fn without_a_recorded_or_given_count_the_cli_refuses_and_setup_records_one() {
    let stack = Stack::new().await;
    let (r, _) = cli_without_shards(&stack, &["list"]).await;
    let refused = r.unwrap_err();
    assert!(refused.contains("records no index shard count") && refused.contains("--shards"), "{refused}");
    // A given count serves until one is recorded.
    let (r, out) = cli_without_shards(&stack, &["--shards", "16", "list"]).await;
    r.unwrap();
    assert!(out.contains("0 record(s)"), "{out}");
    assert_eq!(recorded(&stack).await.0, None, "reading never records");

    // `setup` creates a table that records its count from the start.
    let fresh = format!("it-setup-{}", uuid::Uuid::new_v4().simple());
    let mut out: Vec<u8> = Vec::new();
    let argv = ["hookledger", "--table", &fresh, "setup", "--queue", &fresh];
    hookledger_cli::run(argv, &mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let line = format!("HOOKLEDGER_INDEX_SHARDS={}", hookledger::policy::DEFAULT_INDEX_SHARDS);
    assert!(out.lines().any(|l| l == line), "{out}");
    let ledger = hookledger::adapters::dynamodb::DynamoLedger::new(stack.ddb.clone(), &fresh);
    assert_eq!(shards::recorded(&ledger).await.unwrap(), Some(hookledger::policy::DEFAULT_INDEX_SHARDS));
}
