//! Retry delays: exponential backoff with jitter, and a sleep that ends
//! early on shutdown.
//!
//! ```
//! use std::time::Duration;
//! use tessera_runtime::Backoff;
//!
//! let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
//! let first = backoff.next_delay();
//! assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
//! backoff.reset();
//! ```

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::Shutdown;

/// Doubling delays from `min` to `max`, each drawn in `[delay / 2, delay]`
/// so that many clients retrying together spread out.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
    rng: SmallRng,
}

impl Backoff {
    /// Starts at `min`, never waits longer than `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max: max.max(min), current: min, rng: SmallRng::from_os_rng() }
    }

    /// The next delay to wait; the one after it is twice as long (up to the maximum).
    pub fn next_delay(&mut self) -> Duration {
        let millis = self.current.as_millis() as u64;
        let delay = Duration::from_millis(millis / 2 + self.rng.random_range(0..=millis / 2));
        self.current = (self.current * 2).min(self.max);
        delay
    }

    /// Back to the shortest delay, after a success.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// Sleeps for `duration`; returns false early if `stop` fires first.
pub async fn sleep_or_stop(duration: Duration, stop: &Shutdown) -> bool {
    tokio::select! {
        () = tokio::time::sleep(duration) => true,
        () = stop.wait() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_jitter_up_to_the_maximum_and_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let bounds = [(50, 100), (100, 200), (200, 400), (200, 400)];
        for (low, high) in bounds {
            let delay = backoff.next_delay().as_millis() as u64;
            assert!((low..=high).contains(&delay), "{delay} not in {low}..={high}");
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
