//! The work queue as `hookledger setup` creates it (the template's settings):
//! a message received more than `MAX_RECEIVE_COUNT` times moves to the DLQ.
//! The local bridge relies on this, as Lambda's event source mapping does.

use hookledger::adapters::sqs::{MAX_RECEIVE_COUNT, WORK_QUEUE_VISIBILITY_SECS, create_work_queues};

use crate::support::aws;

#[tokio::test]
async fn a_message_received_too_often_moves_to_the_dead_letter_queue() {
    let sqs = aws_sdk_sqs::Client::new(&aws().await);
    let name = format!("dlq-{}", uuid::Uuid::new_v4().simple());
    let q = create_work_queues(&sqs, &name).await.unwrap();
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(&q.work_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    assert_eq!(
        attrs[&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout],
        WORK_QUEUE_VISIBILITY_SECS.to_string()
    );
    let redrive: serde_json::Value =
        serde_json::from_str(&attrs[&aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy]).unwrap();
    let max = redrive["maxReceiveCount"]
        .as_i64()
        .or_else(|| redrive["maxReceiveCount"].as_str().and_then(|s| s.parse().ok()));
    assert_eq!(max, Some(i64::from(MAX_RECEIVE_COUNT)), "{redrive}");

    sqs.send_message().queue_url(&q.work_url).message_body("poison").send().await.unwrap();
    let mut receives = 0;
    for _ in 0..(MAX_RECEIVE_COUNT + 3) {
        let got = sqs.receive_message().queue_url(&q.work_url).visibility_timeout(0).send().await.unwrap();
        receives += got.messages.unwrap_or_default().len() as i32;
    }
    assert_eq!(receives, MAX_RECEIVE_COUNT, "delivered at most maxReceiveCount times");
    let dead = sqs.receive_message().queue_url(&q.dead_letter_url).send().await.unwrap().messages.unwrap_or_default();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body(), Some("poison"));
}
