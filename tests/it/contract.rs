//! The contract suite (`hookledger::contract`) on the DynamoDB adapter
//! against the emulator: the same scenarios the memory world passes in the
//! library's unit tests. A fresh table per scenario, one index shard; the
//! handshake secrets in SSM under a path of the table's name.

use hookledger::adapters::dynamodb::outbox::DynamoOutbox;
use hookledger::adapters::dynamodb::{DynamoLedger, create_table};
use hookledger::adapters::handshake::SsmSecretStore;
use hookledger::adapters::sqs::{SqsQueue, create_queue, received};
use hookledger::clock::Ambient;
use hookledger::contract::{Backend, Item, MAX_RECEIVES, T0};
use hookledger::identity::EventKey;
use hookledger::ports::Received;

use crate::support::aws;

pub struct Dynamo {
    ddb: aws_sdk_dynamodb::Client,
    ssm: aws_sdk_ssm::Client,
    sqs: aws_sdk_sqs::Client,
    table: String,
    queue_url: String,
    dlq_url: String,
    deliveries_url: String,
}

impl Dynamo {
    pub async fn new() -> Self {
        let aws = aws().await;
        let (ddb, sqs) = (aws_sdk_dynamodb::Client::new(&aws), aws_sdk_sqs::Client::new(&aws));
        let ssm = aws_sdk_ssm::Client::new(&aws);
        let name = format!("contract-{}", uuid::Uuid::new_v4().simple());
        create_table(&ddb, &name).await.expect("create table");
        hookledger::adapters::dynamodb::keys::create_keys_table(&ddb, &format!("{name}-keys"))
            .await
            .expect("create the key table");
        // The work queue with a dead-letter queue after MAX_RECEIVES, as the
        // template's redrive policy (with its own count).
        let dlq_url = create_queue(&sqs, &format!("{name}-dlq")).await.expect("create dead-letter queue");
        let dlq_arn = sqs
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("dead-letter queue arn")
            .attributes
            .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::QueueArn).cloned())
            .expect("an arn");
        let policy = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"{MAX_RECEIVES}"}}"#);
        let queue_url = sqs
            .create_queue()
            .queue_name(&name)
            .attributes(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy, policy)
            .send()
            .await
            .expect("create queue")
            .queue_url
            .expect("a queue url");
        let deliveries_url = create_queue(&sqs, &format!("{name}-deliveries")).await.expect("create delivery queue");
        Self { ddb, ssm, sqs, table: name, queue_url, dlq_url, deliveries_url }
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
        let item = hookledger::adapters::dynamodb::item::item_to_sdk(&item);
        self.ddb.put_item().table_name(&self.table).set_item(Some(item)).send().await.expect("put");
    }

    async fn get(&self, pk: &str, sk: &str) -> Option<Item> {
        let key = |v: &str| aws_sdk_dynamodb::types::AttributeValue::S(v.to_owned());
        let out = self.ddb.get_item().table_name(&self.table).key("pk", key(pk)).key("sk", key(sk));
        let item = out.consistent_read(true).send().await.expect("get").item;
        item.as_ref().map(hookledger::adapters::dynamodb::item::item_from_sdk)
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
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
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
                let group = m
                    .attributes()
                    .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId))
                    .cloned();
                received(
                    m.message_id.unwrap_or_default(),
                    m.receipt_handle,
                    m.body.as_deref(),
                    count.as_deref(),
                    group.as_deref(),
                )
            })
            .collect()
    }

    async fn wait(&self, ms: u64) {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }

    async fn dead_letters(&self) -> Vec<EventKey> {
        let out = self
            .sqs
            .receive_message()
            .queue_url(&self.dlq_url)
            .max_number_of_messages(10)
            .send()
            .await
            .expect("receive the dead letters");
        out.messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| received(m.message_id.unwrap_or_default(), None, m.body.as_deref(), None, None).work)
            .map(|(k, _)| k)
            .collect()
    }

    type Secrets = SsmSecretStore;
    type Keys = hookledger::adapters::dynamodb::keys::DynamoKeys;

    /// The key table beside this scenario's table.
    fn keys(&self) -> Self::Keys {
        hookledger::adapters::dynamodb::keys::DynamoKeys::new(self.ddb.clone(), format!("{}-keys", self.table))
    }

    /// SSM, under a path of this scenario's table.
    fn secrets(&self) -> SsmSecretStore {
        SsmSecretStore::new(self.ssm.clone(), &format!("/hookledger/{}/handshake", self.table))
    }

    type Deliveries = hookledger::adapters::sqs::SqsDeliveries;

    fn deliveries(&self) -> hookledger::adapters::sqs::SqsDeliveries {
        hookledger::adapters::sqs::SqsDeliveries::new(self.sqs.clone(), &self.deliveries_url)
    }

    /// As the dispatcher's trigger receives (each message's group with it), then deleted.
    async fn receive_deliveries(&self, max: usize) -> Vec<(hookledger::ports::DeliveryMessage, Option<String>)> {
        use aws_sdk_sqs::types::MessageSystemAttributeName as A;
        let out = self
            .sqs
            .receive_message()
            .queue_url(&self.deliveries_url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .message_system_attribute_names(A::MessageGroupId)
            .send()
            .await
            .expect("receive");
        let mut got = Vec::new();
        for m in out.messages.unwrap_or_default() {
            let group = m.attributes().and_then(|a| a.get(&A::MessageGroupId)).cloned();
            let message =
                m.body.as_deref().and_then(hookledger::adapters::sqs::delivery_message).expect("a delivery message");
            let receipt = m.receipt_handle.expect("a receipt");
            self.sqs
                .delete_message()
                .queue_url(&self.deliveries_url)
                .receipt_handle(receipt)
                .send()
                .await
                .expect("delete");
            got.push((message, group));
        }
        got
    }
}

hookledger::contract_suite!(Dynamo::new().await);
