//! The contract suite (`hookledger::contract`) on the DynamoDB adapter
//! against the emulator: the same scenarios the memory world passes in the
//! library's unit tests. A fresh table per scenario, one index shard.

use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::adapters::dynamodb::{DynamoLedger, create_table};
use hookledger::clock::Ambient;
use hookledger::contract::{Backend, Item, T0};

use crate::support::aws;

pub struct Dynamo {
    ddb: aws_sdk_dynamodb::Client,
    table: String,
}

impl Dynamo {
    pub async fn new() -> Self {
        let ddb = aws_sdk_dynamodb::Client::new(&aws().await);
        let table = format!("contract-{}", uuid::Uuid::new_v4().simple());
        create_table(&ddb, &table).await.expect("create table");
        Self { ddb, table }
    }
}

impl Backend for Dynamo {
    type Ledger = DynamoLedger;
    type Outbox = DynamoOutbox;

    fn ledger(&self, seed: u64) -> DynamoLedger {
        DynamoLedger::new(self.ddb.clone(), &self.table).with_shards(1).with_ambient(Ambient::fixed(T0, seed))
    }

    fn outbox(&self) -> DynamoOutbox {
        DynamoOutbox::on(self.ledger(0))
    }

    fn table(&self) -> String {
        self.table.clone()
    }

    async fn put(&self, item: Item) {
        self.ddb.put_item().table_name(&self.table).set_item(Some(item)).send().await.expect("put");
    }
}

hookledger::contract_suite!(Dynamo::new().await);
