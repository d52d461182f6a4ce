//! Planted protocol bugs: the simulator's proof that it can fail.
//!
//! Each [`Bug`] is one deliberate mistake in the protocol, at the one place
//! the protocol would make it (the commit's fence, the claim's `due` entry,
//! ...). A bug is planted for the current thread only, and only with the
//! `testkit` feature: without it [`is`] is a constant `false` and the
//! compiler removes every check. The deterministic simulator
//! (`hookledger-sim`) runs its seeds with one bug planted and must report a
//! violation; its table of seeds to first failure is in
//! `docs/guarantees.md`.

/// One deliberate protocol mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// The commit (completion and projection writes in one transaction)
    /// carries no condition: a worker whose lease was taken over, or whose
    /// record is already PROCESSED, commits again.
    NoFence,
    /// The claim writes the record without its `due` entry: a record whose
    /// enqueue was lost is never re-driven.
    NoDueAtClaim,
    /// The record is completed in a write of its own before the projection's
    /// writes, which are then fenced out (they are no longer one outcome).
    CompleteBeforeProjection,
    /// A claim refused because the key is recorded is taken as a new claim
    /// (a later notification is not given its own generation).
    RefusedClaimIsOurs,
    /// A delivery retried is sent under a new idempotency key.
    NewDeliveryKeyOnRetry,
    /// A snapshot write carries no revision guard: an older revision planned
    /// before a newer one committed overwrites it.
    NoRevisionGuard,
}

impl Bug {
    pub const ALL: [Bug; 6] = [
        Bug::NoFence,
        Bug::NoDueAtClaim,
        Bug::CompleteBeforeProjection,
        Bug::RefusedClaimIsOurs,
        Bug::NewDeliveryKeyOnRetry,
        Bug::NoRevisionGuard,
    ];

    /// Its name on the command line (`scripts/simulate --plant NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Bug::NoFence => "no-fence",
            Bug::NoDueAtClaim => "no-due-at-claim",
            Bug::CompleteBeforeProjection => "complete-before-projection",
            Bug::RefusedClaimIsOurs => "refused-claim-is-ours",
            Bug::NewDeliveryKeyOnRetry => "new-delivery-key-on-retry",
            Bug::NoRevisionGuard => "no-revision-guard",
        }
    }

    pub fn parse(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

#[cfg(any(test, feature = "testkit"))]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Whether `bug` is planted on this thread (never without `testkit`).
#[inline(always)]
pub fn is(bug: Bug) -> bool {
    #[cfg(any(test, feature = "testkit"))]
    {
        PLANTED.with(|p| p.get() == Some(bug))
    }
    #[cfg(not(any(test, feature = "testkit")))]
    {
        let _ = bug;
        false
    }
}

/// Plants `bug` on this thread (`None`: the protocol as written).
#[cfg(any(test, feature = "testkit"))]
pub fn plant(bug: Option<Bug>) {
    PLANTED.with(|p| p.set(bug));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bug_is_planted_on_its_thread_only() {
        plant(Some(Bug::NoFence));
        assert!(is(Bug::NoFence));
        assert!(!is(Bug::NoRevisionGuard));
        assert!(!std::thread::spawn(|| is(Bug::NoFence)).join().unwrap());
        plant(None);
        assert!(!is(Bug::NoFence));
        for b in Bug::ALL {
            assert_eq!(Bug::parse(b.name()), Some(b));
        }
    }
}
