//! Retry scheduling: exponential backoff with jitter, bounded.

/// Backoff settings (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base_ms: i64,
    pub max_ms: i64,
}

impl Backoff {
    /// Delay before attempt `attempt + 1`, given that `attempt` (1-based) just
    /// failed. "Equal jitter": half the exponential step is fixed, half is
    /// random (`jitter` in `0.0..=1.0`), so retries spread out but never come
    /// back immediately.
    pub fn delay_ms(&self, attempt: u32, jitter: f64) -> i64 {
        let exp = self.base_ms.saturating_mul(1_i64 << attempt.saturating_sub(1).min(30));
        let step = exp.min(self.max_ms).max(1);
        let jitter = jitter.clamp(0.0, 1.0);
        step / 2 + ((step - step / 2) as f64 * jitter) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap_with_bounded_jitter() {
        let b = Backoff { base_ms: 1000, max_ms: 60_000 };
        assert_eq!(b.delay_ms(1, 1.0), 1000);
        assert_eq!(b.delay_ms(1, 0.0), 500);
        assert_eq!(b.delay_ms(3, 1.0), 4000);
        assert_eq!(b.delay_ms(20, 1.0), 60_000);
        assert_eq!(b.delay_ms(20, 0.0), 30_000);
        assert_eq!(b.delay_ms(u32::MAX, 0.5), 45_000);
        let entropy = crate::clock::SeededEntropy::new(3);
        for _ in 0..100 {
            let d = b.delay_ms(2, crate::clock::Entropy::jitter(&entropy));
            assert!((1000..=2000).contains(&d), "{d}");
        }
    }
}
