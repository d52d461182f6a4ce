//! The contract suite (`hookledger::contract`) on the DynamoDB adapter
//! against the emulator: the same scenarios the memory world passes in the
//! library's unit tests. A fresh table per scenario, one index shard.

use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::adapters::dynamodb::{DynamoLedger, create_table};
use hookledger::adapters::sqs::{SqsQueue, create_queue, received};
use hookledger::clock::Ambient;
use hookledger::contract::{Backend, Item, T0};
use hookledger::ports::Received;

use crate::support::aws;

pub struct Dynamo {
    ddb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    table: String,
    queue_url: String,
}

impl Dynamo {
    pub async fn new() -> Self {
        let aws = aws().await;
        let (ddb, sqs) = (aws_sdk_dynamodb::Client::new(&aws), aws_sdk_sqs::Client::new(&aws));
        let name = format!("contract-{}", uuid::Uuid::new_v4().simple());
        create_table(&ddb, &name).await.expect("create table");
        let queue_url = create_queue(&sqs, &name).await.expect("create queue");
        Self { ddb, sqs, table: name, queue_url }
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

    type Queue = SqsQueue;

    fn queue(&self) -> SqsQueue {
        SqsQueue::new(self.sqs.clone(), &self.queue_url)
    }

    /// As the Lambda trigger receives: the receive count with each message.
    async fn receive(&self, max: usize) -> Vec<Received> {
        let out = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
            .visibility_timeout(hookledger::adapters::sqs::WORK_QUEUE_VISIBILITY_SECS)
            .send()
            .await
            .expect("receive");
        out.messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                let count = m
                    .attributes()
                    .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount))
                    .cloned();
                received(m.message_id.unwrap_or_default(), m.receipt_handle, m.body.as_deref(), count.as_deref())
            })
            .collect()
    }

    async fn wait(&self, ms: u64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

hookledger::contract_suite!(Dynamo::new().await);
