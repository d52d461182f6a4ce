//! Re-checks: state a projection keeps that the reconciler later compares
//! with the provider's truth (an entitlement with the subscription Stripe
//! has now, say). A re-check is a plug-in registered beside its projection
//! ([`super::Registry::recheck`]); the core knows none by name.
//!
//! - **what**: the state items whose `pk` starts with [`Recheck::prefix`];
//! - **when**: the projection puts the item in the re-check schedule
//!   ([`super::ProjectionContext::recheck_at`]: the `due` index's
//!   `chk#NNN` partitions); after each check the reconciler schedules the
//!   next look one re-check interval later (`HOOKLEDGER_DRIFT_INTERVAL_SECS`),
//!   or after its re-drive backoff when the check could not be made;
//! - **how**: [`Recheck::check`] reads the provider and answers
//!   [`Verdict::Same`] or [`Verdict::Drift`] with the [`Repair`]: an event
//!   the reconciler records and queues through the normal pipeline, whose
//!   identity is fixed by the drift instance, so a check retried after a
//!   lost acknowledgement or a crash meets its own repair.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::ProjectionError;
use crate::item::Item;

/// How long after its provider check a re-checked item is looked at again,
/// by default (one hour).
pub const DEFAULT_INTERVAL_MS: i64 = 3_600_000;

/// What a re-check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The local state agrees with the provider.
    Same,
    /// It does not: this event repairs it.
    Drift(Repair),
}

/// The event that repairs a drift, recorded and processed like a delivery
/// (`via` reconciliation). `event_id` must be the same for the same drift
/// instance (the local state's source and the provider's answer), so a
/// repeated check meets its own repair record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub provider: String,
    pub endpoint: String,
    pub tenant: String,
    pub event_id: String,
    pub event_type: String,
    pub body: Vec<u8>,
    /// What differs, for the log (no payload, no secret).
    pub detail: String,
}

pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Result<Verdict, ProjectionError>> + Send + 'a>>;

/// A re-check plug-in.
pub trait Recheck: Send + Sync {
    /// Its name, in metrics (`drift_found{projection=…}`) and logs.
    fn name(&self) -> &'static str;
    /// The state items it re-checks: those whose `pk` starts with this.
    fn prefix(&self) -> &'static str;
    /// Compares one state item (as stored, keys included) with the
    /// provider. A provider that cannot answer is
    /// [`ProjectionError::Unavailable`] (the check is retried after the
    /// re-drive backoff); an item it cannot read is `Permanent` (looked at
    /// again after the interval).
    fn check<'a>(&'a self, item: &'a Item, now_ms: i64) -> CheckFuture<'a>;
}

/// The registered re-checks.
#[derive(Clone, Default)]
pub struct Rechecks {
    checks: Vec<Arc<dyn Recheck>>,
}

impl Rechecks {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(mut self, r: impl Recheck + 'static) -> Self {
        self.checks.push(Arc::new(r));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }

    /// The re-check of the state item `pk` (the longest matching prefix).
    pub fn of(&self, pk: &str) -> Option<&Arc<dyn Recheck>> {
        self.checks.iter().filter(|r| pk.starts_with(r.prefix())).max_by_key(|r| r.prefix().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str, &'static str);

    impl Recheck for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn prefix(&self) -> &'static str {
            self.1
        }
        fn check<'a>(&'a self, _item: &'a Item, _now_ms: i64) -> CheckFuture<'a> {
            Box::pin(async { Ok(Verdict::Same) })
        }
    }

    #[test]
    fn an_item_goes_to_the_recheck_of_its_longest_prefix_and_others_to_none() {
        let r = Rechecks::new().register(Named("broad", "proj#a")).register(Named("narrow", "proj#ab#"));
        assert_eq!(r.of("proj#ab#t1#x").map(|r| r.name()), Some("narrow"));
        assert_eq!(r.of("proj#a#t1#x").map(|r| r.name()), Some("broad"));
        assert!(r.of("proj#b#t1").is_none());
        assert!(Rechecks::new().is_empty() && !r.is_empty());
    }
}
