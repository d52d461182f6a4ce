//! Time and randomness as ports: a [`Clock`] (wall time, monotonic
//! deadlines, sleep) and an [`Entropy`] (tokens, jitter), carried together
//! as an [`Ambient`]. The use cases and adapters read time and randomness
//! only through these; this module holds the only code that reads the
//! system's ([`SystemClock`], [`OsEntropy`]) and the deterministic pair
//! ([`ManualClock`], [`SeededEntropy`]) that makes a run replayable.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A future a port returns without naming its type.
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Wall time, monotonic time and sleep.
pub trait Clock: Send + Sync {
    /// Wall time, Unix milliseconds.
    fn now_ms(&self) -> i64;
    /// Monotonic time, for deadlines and durations (never for records).
    fn instant(&self) -> Instant;
    /// Waits `d` (a manual clock advances instead).
    fn sleep(&self, d: Duration) -> Sleep<'_>;
}

/// Randomness: lease and claim tokens, backoff jitter.
pub trait Entropy: Send + Sync {
    /// 128 random bits.
    fn bits(&self) -> u128;

    /// A token in the UUID v4 text form (leases, claims, operator tokens).
    fn token(&self) -> String {
        uuid::Builder::from_random_bytes(self.bits().to_be_bytes()).into_uuid().to_string()
    }

    /// The same bits in 32 hex digits without dashes.
    fn token_simple(&self) -> String {
        uuid::Builder::from_random_bytes(self.bits().to_be_bytes()).into_uuid().simple().to_string()
    }

    /// A jitter factor in `[0, 1]`.
    fn jitter(&self) -> f64 {
        f64::from((self.bits() >> 96) as u32) / f64::from(u32::MAX)
    }
}

/// The clock and entropy a use case or adapter runs with.
#[derive(Clone)]
pub struct Ambient {
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
}

impl Ambient {
    /// The system's clock and the operating system's randomness.
    pub fn system() -> Self {
        Self { clock: Arc::new(SystemClock), entropy: Arc::new(OsEntropy) }
    }

    /// A manual clock at `now_ms` and entropy from `seed`: every run with
    /// the same inputs makes the same requests.
    pub fn fixed(now_ms: i64, seed: u64) -> Self {
        Self { clock: Arc::new(ManualClock::at(now_ms)), entropy: Arc::new(SeededEntropy::new(seed)) }
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn instant(&self) -> Instant {
        self.clock.instant()
    }

    /// Whether the monotonic `deadline` has passed.
    pub fn past(&self, deadline: Instant) -> bool {
        self.clock.instant() >= deadline
    }

    pub fn token(&self) -> String {
        self.entropy.token()
    }

    pub fn jitter(&self) -> f64 {
        self.entropy.jitter()
    }
}

impl Default for Ambient {
    fn default() -> Self {
        Self::system()
    }
}

impl std::fmt::Debug for Ambient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ambient")
    }
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) -> Sleep<'_> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// The operating system's randomness (UUID v4's generator).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn bits(&self) -> u128 {
        u128::from_be_bytes(uuid::Uuid::new_v4().into_bytes())
    }
}

/// A clock that moves only when told to (or when slept on): wall time
/// starts at a given instant, the monotonic axis at a fixed origin.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    start_ms: i64,
    elapsed_ms: AtomicI64,
}

impl ManualClock {
    pub fn at(now_ms: i64) -> Self {
        Self { origin: Instant::now(), start_ms: now_ms, elapsed_ms: AtomicI64::new(0) }
    }

    pub fn advance(&self, d: Duration) {
        self.elapsed_ms.fetch_add(d.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.start_ms + self.elapsed_ms.load(Ordering::SeqCst)
    }

    fn instant(&self) -> Instant {
        self.origin + Duration::from_millis(self.elapsed_ms.load(Ordering::SeqCst).max(0) as u64)
    }

    fn sleep(&self, d: Duration) -> Sleep<'_> {
        self.advance(d);
        Box::pin(std::future::ready(()))
    }
}

/// Deterministic randomness (SplitMix64) from a seed.
#[derive(Debug)]
pub struct SeededEntropy {
    state: AtomicU64,
}

impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        Self { state: AtomicU64::new(seed) }
    }

    fn next(&self) -> u64 {
        let mut z = self.state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::SeqCst).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Entropy for SeededEntropy {
    fn bits(&self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_tokens_and_another_seed_others() {
        let (a, b, c) = (SeededEntropy::new(7), SeededEntropy::new(7), SeededEntropy::new(8));
        let ta: Vec<String> = (0..3).map(|_| a.token()).collect();
        let tb: Vec<String> = (0..3).map(|_| b.token()).collect();
        assert_eq!(ta, tb);
        assert_ne!(ta[0], c.token());
        assert_ne!(ta[0], ta[1]);
        assert!(uuid::Uuid::parse_str(&ta[0]).is_ok_and(|u| u.get_version_num() == 4));
    }

    #[test]
    fn jitter_stays_in_the_unit_interval() {
        let e = SeededEntropy::new(1);
        assert!((0..1000).map(|_| e.jitter()).all(|j| (0.0..=1.0).contains(&j)));
    }

    #[tokio::test]
    async fn a_manual_clock_moves_only_when_slept_on() {
        let c = ManualClock::at(1_000);
        let (t0, i0) = (c.now_ms(), c.instant());
        assert_eq!((c.now_ms(), c.instant()), (t0, i0));
        c.sleep(Duration::from_millis(250)).await;
        assert_eq!(c.now_ms(), 1_250);
        assert_eq!(c.instant() - i0, Duration::from_millis(250));
    }
}
