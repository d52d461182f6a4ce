//! The queue batch on the memory world's queue and ledger.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::clock::Ambient;
use crate::ledger::{Status, WorkRecord};
use crate::ports::WorkQueue;
use crate::processor::tests::{NOW, apply, harness, key, put, record, scripted};

/// The queue batch: a done message is deleted; one that must come back
/// stays and is shown again after its delay, unless this is its last
/// receive (deleted: its record is due in the index); an unreadable one
/// stays for the dead-letter queue; repeats of a key run in order.
#[tokio::test]
async fn a_batch_deletes_what_is_done_and_shows_again_what_must_come_back() {
    let (proj, calls) = scripted(|_| apply(&["x"]));
    let h = harness(proj);
    let busy = || WorkRecord {
        lease_owner: Some("other".into()),
        lease_expires_at_ms: Some(NOW + 20_000),
        ..record("b", Status::Processing)
    };
    let (ok, held) = (put(&h, record("a", Status::Received)), put(&h, busy()));
    let last = put(&h, WorkRecord { key: key("c"), event_id: "c".into(), ..busy() });
    // The batch as the queue hands it over: ok, held, unreadable, last (its
    // last receive), ok again.
    let q = h.queue.clone();
    q.send(&ok, "t").await.unwrap();
    q.send(&held, "t").await.unwrap();
    q.send_raw("not a work message");
    q.send(&last, "t").await.unwrap();
    q.send(&ok, "t").await.unwrap();
    h.world.state().queue.messages[3].receives = crate::adapters::sqs::MAX_RECEIVE_COUNT.unsigned_abs() - 1;
    let batch = q.receive(10);
    assert_eq!(batch.iter().map(|r| r.last_receive).collect::<Vec<_>>(), [false, false, false, true, false]);
    let ids: Vec<String> = batch.iter().map(|r| r.message_id.clone()).collect();

    let p = Arc::new(h.p.with_ambient(Ambient::fixed(NOW, 1)));
    let stay = crate::batch::process(p, Arc::new(q.clone()), batch).await.unwrap();
    assert_eq!(stay, vec![ids[1].clone(), ids[2].clone()]);
    let shown: Vec<(String, i64)> =
        h.world.state().queue.messages.iter().map(|m| (m.id.clone(), m.visible_at_ms)).collect();
    let visibility = i64::from(crate::adapters::sqs::WORK_QUEUE_VISIBILITY_SECS) * 1000;
    assert_eq!(shown[1], (ids[1].clone(), NOW + 20_000), "shown again when the lease ends");
    assert_eq!(shown[2], (ids[2].clone(), NOW + visibility), "left for the dead-letter queue");
    assert_eq!(h.ledger.get(&ok).rec.status, Status::Processed);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the repeat of a finished key is not applied again");
}
