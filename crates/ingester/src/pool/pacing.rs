//! Pacing writes to what storage can take: an adaptive in-flight limit and a samples/s
//! ceiling.
//!
//! **[`Aimd`]** is the decision logic alone (no clock, no I/O, tested with made-up times),
//! after TCP congestion control and Vector's adaptive request concurrency:
//!
//! - every response is fed in with its latency and the time its request started;
//! - after a window of `limit` successful responses, their mean latency is compared with a
//!   baseline, the lowest window mean seen (allowed to rise by 2 % per window, so that a
//!   lasting change of storage's normal latency is learnt): at most `latency_ratio` ×
//!   baseline and the limit grows by one (additive increase), but only if the window
//!   used the whole limit (a limit that is not reached says nothing about storage);
//!   above it the limit halves;
//! - a 429, a 5xx, a timeout or a network error halves the limit at once (multiplicative
//!   decrease), but only once per round trip: responses to requests that started before
//!   the last decrease do not decrease it again;
//! - the limit stays within `[min, max]`.
//!
//! **[`AdaptiveLimit`]** applies an [`Aimd`] to the workers: a worker takes a
//! [`Permit`] before each request and reports the outcome when it is done.
//!
//! **[`Pace`]** is the optional samples/s ceiling: each request reserves its samples and
//! waits for its start time, so requests start spaced by `samples / rate`.
//!
//! ```
//! use std::time::Duration;
//! use tessera_ingester::{Aimd, Outcome};
//!
//! let mut aimd = Aimd::new(1, 8, 2, 2.0);
//! let ms = Duration::from_millis;
//! // Two fast successes while both slots were in use (one window at limit 2): grow.
//! aimd.on_in_flight(2);
//! aimd.on_response(ms(0), ms(10), Outcome::Success);
//! aimd.on_response(ms(0), ms(10), Outcome::Success);
//! assert_eq!(aimd.limit(), 3);
//! // Storage says 503: halve.
//! aimd.on_response(ms(20), ms(15), Outcome::Overloaded);
//! assert_eq!(aimd.limit(), 1);
//! ```

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

/// What a response says about storage's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written.
    Success,
    /// 429, 5xx, a timeout or a network error: back off.
    Overloaded,
    /// Refused for good (4xx other than 429): says nothing about load.
    Neutral,
}

/// The AIMD decision logic; see the [module docs](self). Times are offsets from any fixed
/// origin (tests pass made-up values).
#[derive(Debug, Clone)]
pub struct Aimd {
    limit: usize,
    min: usize,
    max: usize,
    latency_ratio: f64,
    window_count: usize,
    window_latency_sum: f64,
    window_saturated: bool,
    baseline: Option<f64>,
    last_decrease: Option<Duration>,
}

impl Aimd {
    /// A limit starting at `initial`, kept within `[min, max]`, growing while windows stay
    /// within `latency_ratio` × the baseline latency.
    pub fn new(min: usize, max: usize, initial: usize, latency_ratio: f64) -> Aimd {
        let min = min.max(1);
        let max = max.max(min);
        Aimd {
            limit: initial.clamp(min, max),
            min,
            max,
            latency_ratio,
            window_count: 0,
            window_latency_sum: 0.0,
            window_saturated: false,
            baseline: None,
            last_decrease: None,
        }
    }

    /// Requests allowed in flight now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The baseline latency windows are compared with, once there is one.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline.map(Duration::from_secs_f64)
    }

    /// Notes how many requests are in flight (at each start of one): a window only grows
    /// the limit if the limit was reached in it.
    pub fn on_in_flight(&mut self, in_flight: usize) {
        if in_flight >= self.limit {
            self.window_saturated = true;
        }
    }

    /// Feeds one response: its request started at `started` and took `latency`.
    pub fn on_response(&mut self, started: Duration, latency: Duration, outcome: Outcome) {
        match outcome {
            Outcome::Neutral => {}
            Outcome::Overloaded => self.decrease(started + latency, started),
            Outcome::Success => {
                self.window_count += 1;
                self.window_latency_sum += latency.as_secs_f64();
                if self.window_count < self.limit {
                    return;
                }
                let mean = self.window_latency_sum / self.window_count as f64;
                let saturated = self.window_saturated;
                self.window_count = 0;
                self.window_latency_sum = 0.0;
                self.window_saturated = false;
                let baseline = self.baseline.map_or(mean, |baseline| mean.min(baseline * 1.02));
                self.baseline = Some(baseline);
                if mean > baseline * self.latency_ratio {
                    self.decrease(started + latency, started);
                } else if saturated {
                    self.limit = (self.limit + 1).min(self.max);
                }
            }
        }
    }

    fn decrease(&mut self, now: Duration, started: Duration) {
        if self.last_decrease.is_some_and(|last| started < last) {
            return;
        }
        self.limit = (self.limit / 2).max(self.min);
        self.last_decrease = Some(now);
        self.window_count = 0;
        self.window_latency_sum = 0.0;
        self.window_saturated = false;
    }
}

/// An [`Aimd`] limit on requests in flight, shared by a target's workers.
#[derive(Clone)]
pub struct AdaptiveLimit {
    inner: Arc<LimitInner>,
}

struct LimitInner {
    state: Mutex<LimitState>,
    changed: Notify,
    origin: Instant,
    limit_gauge: Gauge,
    in_flight_gauge: Gauge,
}

struct LimitState {
    aimd: Aimd,
    in_flight: usize,
}

/// Leave to send one request; give it back with [`Permit::finish`].
#[must_use = "a permit holds a slot until finished"]
pub struct Permit {
    limit: AdaptiveLimit,
    started: Instant,
    finished: bool,
}

impl AdaptiveLimit {
    /// A limit driven by `aimd`, exported on the two gauges.
    pub fn new(aimd: Aimd, limit_gauge: Gauge, in_flight_gauge: Gauge) -> AdaptiveLimit {
        limit_gauge.set(aimd.limit() as i64);
        AdaptiveLimit {
            inner: Arc::new(LimitInner {
                state: Mutex::new(LimitState { aimd, in_flight: 0 }),
                changed: Notify::new(),
                origin: Instant::now(),
                limit_gauge,
                in_flight_gauge,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LimitState> {
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for a slot under the current limit.
    pub async fn acquire(&self) -> Permit {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                if state.in_flight < state.aimd.limit() {
                    state.in_flight += 1;
                    let in_flight = state.in_flight;
                    state.aimd.on_in_flight(in_flight);
                    self.inner.in_flight_gauge.set(state.in_flight as i64);
                    return Permit { limit: self.clone(), started: Instant::now(), finished: false };
                }
            }
            notified.await;
        }
    }

    fn release(&self, report: Option<(Instant, Outcome)>) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some((started, outcome)) = report {
            let now = Instant::now();
            let started_offset = started.saturating_duration_since(self.inner.origin);
            state.aimd.on_response(started_offset, now.saturating_duration_since(started), outcome);
            self.inner.limit_gauge.set(state.aimd.limit() as i64);
        }
        self.inner.in_flight_gauge.set(state.in_flight as i64);
        drop(state);
        self.inner.changed.notify_waiters();
    }
}

impl Permit {
    /// Gives the slot back, reporting how the request went.
    pub fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        self.limit.release(Some((self.started, outcome)));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.finished {
            self.limit.release(None);
        }
    }
}

/// An optional samples/s ceiling; see the [module docs](self).
#[derive(Clone)]
pub struct Pace {
    inner: Option<Arc<Mutex<PaceState>>>,
}

/// The reservation arithmetic of [`Pace`], without a clock.
#[derive(Debug, Clone)]
pub struct PaceState {
    samples_per_sec: f64,
    next_start: Option<Instant>,
}

impl PaceState {
    /// A ceiling of `samples_per_sec`.
    pub fn new(samples_per_sec: f64) -> PaceState {
        PaceState { samples_per_sec, next_start: None }
    }

    /// Reserves `samples` at `now`; returns when the request may start.
    pub fn reserve(&mut self, now: Instant, samples: usize) -> Instant {
        let start = self.next_start.map_or(now, |next| next.max(now));
        self.next_start = Some(start + Duration::from_secs_f64(samples as f64 / self.samples_per_sec));
        start
    }
}

impl Pace {
    /// No ceiling when `samples_per_sec` is `None`.
    pub fn new(samples_per_sec: Option<f64>) -> Pace {
        Pace { inner: samples_per_sec.map(|rate| Arc::new(Mutex::new(PaceState::new(rate)))) }
    }

    /// Waits until `samples` more samples fit under the ceiling.
    pub async fn wait(&self, samples: usize) {
        let Some(state) = &self.inner else { return };
        let start = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).reserve(Instant::now(), samples);
        tokio::time::sleep_until(start.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grows_by_one_per_fast_window_up_to_max() {
        let mut aimd = Aimd::new(1, 5, 1, 2.0);
        let mut clock = 0;
        let mut limits = Vec::new();
        for _ in 0..20 {
            aimd.on_in_flight(aimd.limit());
            for _ in 0..aimd.limit() {
                aimd.on_response(ms(clock), ms(10), Outcome::Success);
                clock += 10;
            }
            limits.push(aimd.limit());
        }
        assert_eq!(&limits[..5], &[2, 3, 4, 5, 5]);
        assert_eq!(aimd.limit(), 5);
    }

    #[test]
    fn halves_on_overload_once_per_round_trip() {
        let mut aimd = Aimd::new(1, 64, 32, 2.0);
        // Eight requests in flight all started at t=0 and all get 503s.
        for i in 0..8 {
            aimd.on_response(ms(0), ms(50 + i), Outcome::Overloaded);
        }
        assert_eq!(aimd.limit(), 16, "one decrease for requests sent before it");
        // A request sent after the decrease fails too: decrease again.
        aimd.on_response(ms(60), ms(50), Outcome::Overloaded);
        assert_eq!(aimd.limit(), 8);
        for round in 1..10 {
            aimd.on_response(ms(20_000 * round), ms(50), Outcome::Overloaded);
        }
        assert_eq!(aimd.limit(), 1, "never below min");
    }

    #[test]
    fn rising_latency_backs_off_and_neutral_answers_change_nothing() {
        let mut aimd = Aimd::new(2, 32, 4, 2.0);
        let mut clock = 0;
        let mut window = |aimd: &mut Aimd, latency: u64| {
            aimd.on_in_flight(aimd.limit());
            for _ in 0..aimd.limit() {
                aimd.on_response(ms(clock), ms(latency), Outcome::Success);
                clock += latency;
            }
        };
        window(&mut aimd, 10);
        window(&mut aimd, 12);
        assert_eq!(aimd.limit(), 6);
        window(&mut aimd, 50); // 5x the baseline
        assert_eq!(aimd.limit(), 3);
        for _ in 0..100 {
            aimd.on_response(ms(10_000), ms(1), Outcome::Neutral);
        }
        assert_eq!(aimd.limit(), 3);
        window(&mut aimd, 11);
        assert_eq!(aimd.limit(), 4, "fast again: grows again");
    }

    #[test]
    fn an_unused_limit_does_not_grow_and_the_baseline_is_the_lowest_mean() {
        let mut aimd = Aimd::new(1, 16, 2, 2.0);
        for round in 0..50 {
            aimd.on_in_flight(1);
            aimd.on_response(ms(round * 10), ms(10), Outcome::Success);
            aimd.on_response(ms(round * 10), ms(10), Outcome::Success);
        }
        assert_eq!(aimd.limit(), 2, "never more than one request in flight: no growth");
        aimd.on_in_flight(2);
        aimd.on_response(ms(1000), ms(5), Outcome::Success);
        aimd.on_response(ms(1000), ms(7), Outcome::Success);
        assert_eq!(aimd.baseline(), Some(ms(6)));
        assert_eq!(aimd.limit(), 3);
        // Slower windows raise the baseline by at most 2 % each.
        aimd.on_in_flight(3);
        for _ in 0..3 {
            aimd.on_response(ms(2000), ms(11), Outcome::Success);
        }
        assert_eq!(aimd.baseline(), Some(Duration::from_secs_f64(0.006 * 1.02)));
        assert_eq!(aimd.limit(), 4);
    }

    #[test]
    fn pace_spaces_requests_by_their_samples() {
        let mut pace = PaceState::new(1000.0);
        let now = Instant::now();
        assert_eq!(pace.reserve(now, 500), now);
        assert_eq!(pace.reserve(now, 500), now + ms(500));
        assert_eq!(pace.reserve(now + ms(100), 1000), now + ms(1000));
        // After an idle spell, the next request starts at once (no stored burst).
        let later = now + ms(10_000);
        assert_eq!(pace.reserve(later, 1), later);
    }

    #[tokio::test]
    async fn adaptive_limit_caps_concurrency_and_wakes_waiters() {
        let limit = AdaptiveLimit::new(Aimd::new(1, 4, 2, 2.0), Gauge::default(), Gauge::default());
        let first = limit.acquire().await;
        let second = limit.acquire().await;
        let third = tokio::spawn({
            let limit = limit.clone();
            async move { limit.acquire().await.finish(Outcome::Neutral) }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "a third permit waits at limit 2");
        first.finish(Outcome::Neutral);
        tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
        drop(second);
        assert_eq!(limit.lock().in_flight, 0);
    }
}
