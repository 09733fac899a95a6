//! `GET /debug/pprof/profile`: a CPU profile of every thread, taken in
//! process while the daemon runs.
//!
//! The sampler is pprof-rs: a `SIGPROF` interval timer interrupts a running
//! thread `frequency` times a CPU-second, and the signal handler walks the
//! stack by its **frame pointers** (release builds keep them, see
//! `.cargo/config.toml`), recording the return addresses and the thread's
//! name in a fixed-size table. Nothing is allocated or symbolised in the
//! handler; symbols are resolved once, when the profile ends. That is what
//! makes a 99 Hz profile cheap enough to take from a collector at full load
//! (BENCHMARKS.md, *Profiling*).
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `seconds` | how long to sample, 1 to [`MAX_PROFILE_SECONDS`] | 30 |
//! | `frequency` | samples per CPU-second, 1 to [`MAX_FREQUENCY_HZ`] | 99 |
//! | `format` | `pprof` (gzipped protobuf, for `pprof` and `go tool pprof`) or `flamegraph` (SVG) | `pprof` |
//!
//! One profile runs at a time in the process (the sampler is process-wide):
//! a second request gets 409. Bad parameters get 400 with the reason.
//! Every sample carries a `thread` label, and its stack starts with a frame
//! named after the thread (`[udp-reader-0]`, `[agg-merge-1]`), so
//! the cost of each pipeline stage reads straight off the profile.

mod encode;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::Shutdown;

/// Longest profile a request may ask for.
pub const MAX_PROFILE_SECONDS: u64 = 300;
/// Highest sampling frequency a request may ask for.
pub const MAX_FREQUENCY_HZ: u32 = 1_000;
const DEFAULT_SECONDS: u64 = 30;
const DEFAULT_FREQUENCY_HZ: u32 = 99;

/// The sampler is one per process: so is the right to run it.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// What a profile is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// pprof's protobuf `Profile`, gzipped.
    Pprof,
    /// An SVG flame graph.
    Flamegraph,
}

impl Format {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Flamegraph => "flamegraph",
        }
    }

    /// The HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Pprof => "application/octet-stream",
            Format::Flamegraph => "image/svg+xml",
        }
    }
}

/// A valid profile request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRequest {
    /// How long to sample.
    pub seconds: u64,
    /// Samples per CPU-second.
    pub frequency_hz: u32,
    /// What to answer with.
    pub format: Format,
}

impl ProfileRequest {
    /// Reads `seconds`, `frequency` and `format` from a URL query string;
    /// the error is the reason for a 400.
    pub fn from_query(query: &str) -> Result<ProfileRequest, String> {
        let mut request =
            ProfileRequest { seconds: DEFAULT_SECONDS, frequency_hz: DEFAULT_FREQUENCY_HZ, format: Format::Pprof };
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "seconds" => {
                    request.seconds = match value.parse() {
                        Ok(seconds @ 1..=MAX_PROFILE_SECONDS) => seconds,
                        _ => return Err(format!("`seconds` must be 1 to {MAX_PROFILE_SECONDS}, not `{value}`")),
                    }
                }
                "frequency" => {
                    request.frequency_hz = match value.parse() {
                        Ok(hz @ 1..=MAX_FREQUENCY_HZ) => hz,
                        _ => return Err(format!("`frequency` must be 1 to {MAX_FREQUENCY_HZ} Hz, not `{value}`")),
                    }
                }
                "format" => {
                    request.format = match value {
                        "pprof" | "proto" => Format::Pprof,
                        "flamegraph" | "svg" => Format::Flamegraph,
                        _ => return Err(format!("`format` must be `pprof` or `flamegraph`, not `{value}`")),
                    }
                }
                _ => return Err(format!("unknown parameter `{key}` (seconds, frequency, format)")),
            }
        }
        Ok(request)
    }
}

/// Why no profile was taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Another profile is running in this process.
    #[error("a profile is already running in this process; try again when it ends")]
    Busy,
    /// The sampler failed to start or to report.
    #[error("the sampler failed: {0}")]
    Sampler(#[from] pprof::Error),
}

/// Profile counters, registered with the daemon's telemetry.
#[derive(Debug, Clone, Default)]
pub struct ProfileMetrics {
    /// Profiles taken, by format.
    pub taken: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Whole seconds spent sampling.
    pub seconds: Counter,
    /// Requests refused, by reason (`busy`, `bad_request`, `sampler`, `disabled`).
    pub refused: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl ProfileMetrics {
    /// Counts a refused request.
    pub fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&vec![("reason", reason)]).inc();
    }
}

/// Samples every thread for `request.seconds` (less if `shutdown` fires
/// first) and encodes the profile. Blocks: run it on a blocking thread.
pub fn take_profile(
    request: ProfileRequest,
    shutdown: &Shutdown,
    metrics: &ProfileMetrics,
) -> Result<Vec<u8>, ProfileError> {
    let Some(_running) = Running::claim() else {
        metrics.refuse("busy");
        return Err(ProfileError::Busy);
    };
    match sample(request, shutdown) {
        Ok((profile, sampled)) => {
            metrics.taken.get_or_create(&vec![("format", request.format.as_str())]).inc();
            metrics.seconds.inc_by(sampled.as_secs());
            Ok(profile)
        }
        Err(error) => {
            metrics.refuse("sampler");
            Err(error)
        }
    }
}

/// The right to run the sampler, given back when dropped (a panic included).
struct Running;

impl Running {
    fn claim() -> Option<Running> {
        RUNNING.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok().then_some(Running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// The encoded profile and how long it sampled (shutdown may end it early).
fn sample(request: ProfileRequest, shutdown: &Shutdown) -> Result<(Vec<u8>, Duration), ProfileError> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(request.frequency_hz as i32)
        // Frames inside the C library and the vDSO have no frame pointers to follow.
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    // Sampling starts now (building the guard reads the loaded libraries first).
    let (started_ns, sampling) = (tessera_core::clock::now_ns(), std::time::Instant::now());
    shutdown.wait_blocking_timeout(Duration::from_secs(request.seconds));
    // How long it sampled; symbolising the report comes after.
    let duration = sampling.elapsed();
    let report = guard.report().build()?;
    drop(guard);
    let profile = match request.format {
        Format::Pprof => encode::pprof_gzipped(&report, request.frequency_hz, started_ns, duration),
        Format::Flamegraph => encode::flamegraph_svg(&report).into_bytes(),
    };
    Ok((profile, duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_from_the_query_with_defaults_and_bounds() {
        let default = ProfileRequest::from_query("").unwrap();
        assert_eq!(default, ProfileRequest { seconds: 30, frequency_hz: 99, format: Format::Pprof });
        let svg = ProfileRequest::from_query("seconds=5&frequency=250&format=flamegraph").unwrap();
        assert_eq!(svg, ProfileRequest { seconds: 5, frequency_hz: 250, format: Format::Flamegraph });
        for (query, reason) in [
            ("seconds=0", "`seconds` must be 1 to 300"),
            ("seconds=100000", "`seconds` must be 1 to 300"),
            ("seconds=abc", "not `abc`"),
            ("frequency=0", "`frequency` must be 1 to 1000"),
            ("frequency=5000", "`frequency`"),
            ("format=png", "`format` must be"),
            ("debug=1", "unknown parameter `debug`"),
        ] {
            let error = ProfileRequest::from_query(query).unwrap_err();
            assert!(error.contains(reason), "{query}: {error}");
        }
    }
}
