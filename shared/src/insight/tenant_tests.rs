//! `stats --tenant` over the memory world (kept out of `insight.rs`, a use
//! case, which names no adapter).

use super::*;

const NOW: i64 = 1_700_000_000_000;
const WINDOW: MetricWindow = MetricWindow { since_ms: NOW - 3_600_000, until_ms: NOW, period_s: 300 };

struct Fixed(Vec<MetricSeries>);

impl MetricsReader for Fixed {
    async fn read(&self, names: &[&str], _: &MetricWindow) -> Result<Vec<MetricSeries>, PortError> {
        Ok(self.0.iter().filter(|s| names.contains(&s.name.as_str())).cloned().collect())
    }
}

/// `stats --tenant`: the standing counts that tenant's open, dead and
/// parked records only.
#[tokio::test]
async fn a_tenants_standing_counts_its_records_only() {
    use crate::ledger::{Exit, NewEvent, SendLease, Via};
    use crate::ports::{Ledger, WorkLedger};
    let w = crate::adapters::memory::World::new(crate::clock::Ambient::fixed(NOW, 3)).with_shards(2);
    let l = w.ledger();
    let claim = |id: &str, tenant: &str| {
        let key = crate::identity::EventKey::new("stripe", "e", id);
        NewEvent {
            shard: key.shard(2),
            key,
            provider: "stripe".into(),
            endpoint: "e".into(),
            tenant: tenant.into(),
            event_id: id.into(),
            event_type: Some("invoice.paid".into()),
            payload_hash: "h".into(),
            content_hash: "h".into(),
            received_at_ms: NOW - 60_000,
            expires_at: NOW / 1000 + 86_400,
            send: SendLease { token: "s".into(), until_ms: NOW },
            via: Via::Webhook,
            batch_hash: None,
            kept: None,
            notification: None,
        }
    };
    for (id, tenant) in [("1", "acme"), ("2", "acme"), ("3", "globex"), ("4", "globex")] {
        Ledger::claim(&l, &claim(id, tenant), b"{}").await.unwrap();
    }
    for (id, token) in [("2", "t-2"), ("4", "t-4")] {
        let key = crate::identity::EventKey::new("stripe", "e", id);
        assert!(matches!(l.lease(&key, token, NOW, 30_000).await.unwrap(), crate::ledger::LeaseResult::Leased(_)));
        assert!(l.leave(&key, token, &Exit::Dead { reason: "r", message: "m" }, NOW).await.unwrap());
    }
    let insight = Insight::new(l, Fixed(Vec::new()));
    let acme = insight.tenant_stats("acme", &WINDOW, NOW).await.unwrap();
    assert_eq!((acme.now.by_status["RECEIVED"], acme.now.by_status["DEAD"]), (1, 1), "{acme:?}");
    assert_eq!(acme.metrics, None);
    let nobody = insight.tenant_stats("initech", &WINDOW, NOW).await.unwrap();
    assert_eq!(nobody.now.by_status.values().sum::<u64>(), 0);
    let all = insight.stats(&WINDOW, NOW).await.unwrap();
    assert_eq!((all.now.by_status["RECEIVED"], all.now.by_status["DEAD"]), (2, 2));
}
