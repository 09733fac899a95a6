//! Logs: set-up for daemons, and rate limiting for bad input on hot paths.
//!
//! [`init`] installs a `tracing` subscriber writing to stderr, as text or as one JSON
//! object per line. The level comes from `RUST_LOG` when set (any `EnvFilter` directive,
//! e.g. `info,tessera_collector=debug`), else from the daemon's default.
//!
//! [`RateLimitedLog`] keeps a flood of bad input from turning into a flood of log lines:
//! one `static` per call site lets a few messages a second through and reports how many
//! it held back.
//!
//! ```
//! use tessera_runtime::RateLimitedLog;
//!
//! static BAD_LINE_LOG: RateLimitedLog = RateLimitedLog::new("collector.bad_line", 5);
//!
//! fn on_bad_line(peer: std::net::SocketAddr, reason: &'static str) {
//!     // Count the bad line in a metric first, always; the log is only a sample.
//!     if BAD_LINE_LOG.allow() {
//!         tracing::warn!(%peer, reason, "bad statsd line skipped");
//!     }
//! }
//! # on_bad_line(([127, 0, 0, 1], 1).into(), "no type");
//! ```

use std::io::IsTerminal;
use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, coloured when stderr is a terminal and `NO_COLOR` is unset.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl FromStr for LogFormat {
    type Err = LoggingError;

    /// Parses `text` or `json`, so that the type works as a `clap` flag value.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(LoggingError::UnknownFormat(other.to_owned())),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// A log format other than `text` or `json` was asked for.
    #[error("unknown log format `{0}`, expected `text` or `json`")]
    UnknownFormat(String),
    /// `RUST_LOG` or the default level is not a valid filter.
    #[error("invalid log filter `{directives}` (from {origin}): {error}")]
    Filter {
        /// The directives as given.
        directives: String,
        /// Where they came from: `RUST_LOG` or `the default level`.
        origin: &'static str,
        /// What the parser said.
        error: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber is already installed (`init` called twice, or by a test harness).
    #[error("a global log subscriber is already installed")]
    AlreadyInitialised,
}

/// Installs the global `tracing` subscriber: `format` to stderr, filtered by `RUST_LOG`
/// when set, else by `default_level` (an `EnvFilter` directive such as `"info"`).
///
/// # Errors
///
/// When `RUST_LOG` or `default_level` does not parse, or a subscriber is already installed.
pub fn init(format: LogFormat, default_level: &str) -> Result<(), LoggingError> {
    let filter = filter_from(std::env::var(EnvFilter::DEFAULT_ENV).ok(), default_level)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).try_init()
        }
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    installed.map_err(|_| LoggingError::AlreadyInitialised)
}

fn filter_from(rust_log: Option<String>, default_level: &str) -> Result<EnvFilter, LoggingError> {
    let (directives, origin) = match rust_log {
        Some(directives) if !directives.trim().is_empty() => (directives, "RUST_LOG"),
        _ => (default_level.to_owned(), "the default level"),
    };
    EnvFilter::try_new(&directives).map_err(|error| LoggingError::Filter { directives, origin, error })
}

/// A per-call-site limit on log lines: at most `max_per_second` pass in each second, and
/// the first to pass after a second with suppressions is preceded by one
/// `"N similar messages suppressed"` warning naming the site.
///
/// Meant as a `static` next to the `warn!` it guards (see the [module docs](self)). Lock
/// free: a message that is let through costs a compare-and-swap; a suppressed one, a load
/// and an add. Seconds are counted from the first use in the process. Limits are exact
/// under contention; the suppressed count reported for a second may include a message or
/// two from the turn of the next one.
#[derive(Debug)]
pub struct RateLimitedLog {
    site: &'static str,
    max_per_second: u32,
    /// `(second << 32) | messages let through in that second`; `u64::MAX` before first use.
    window: AtomicU64,
    suppressed: AtomicU64,
}

/// What [`RateLimitedLog`] decided for one message.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Suppressed,
    Allowed {
        /// Messages held back since the last one let through.
        suppressed_before: u64,
    },
}

impl RateLimitedLog {
    /// A limit for the call site named `site` (e.g. `"collector.bad_line"`), letting at
    /// most `max_per_second` messages through each second (0 silences the site).
    pub const fn new(site: &'static str, max_per_second: u32) -> Self {
        Self { site, max_per_second, window: AtomicU64::new(u64::MAX), suppressed: AtomicU64::new(0) }
    }

    /// Whether the caller may log now. When this is the first message let through after
    /// some were held back, logs the `"N similar messages suppressed"` warning first.
    pub fn allow(&self) -> bool {
        self.allow_in(seconds_since_first_use())
    }

    fn allow_in(&self, second: u32) -> bool {
        match self.admit(second) {
            Admission::Suppressed => false,
            Admission::Allowed { suppressed_before: 0 } => true,
            Admission::Allowed { suppressed_before } => {
                tracing::warn!(
                    site = self.site,
                    suppressed = suppressed_before,
                    "{suppressed_before} similar messages suppressed"
                );
                true
            }
        }
    }

    fn admit(&self, second: u32) -> Admission {
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let current_second = (current >> 32) as u32;
            // A thread that read the clock just before the turn of a second counts in the new one.
            let (window_second, let_through) = match current {
                u64::MAX => (second, 0),
                _ if second > current_second => (second, 0),
                _ => (current_second, current as u32),
            };
            if let_through >= self.max_per_second {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return Admission::Suppressed;
            }
            let next = (u64::from(window_second) << 32) | u64::from(let_through + 1);
            match self.window.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // Suppressions only happen in a full second, so only the first message
                    // of a new second has any to report.
                    let suppressed_before =
                        if let_through == 0 { self.suppressed.swap(0, Ordering::AcqRel) } else { 0 };
                    return Admission::Allowed { suppressed_before };
                }
                Err(actual) => current = actual,
            }
        }
    }
}

fn seconds_since_first_use() -> u32 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    // u32 seconds last 136 years.
    start.elapsed().as_secs() as u32
}

/// An error and every `source()` below it, joined by `: `, for one log field.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_through_at_most_the_limit_per_second_and_counts_the_rest() {
        let log = RateLimitedLog::new("test", 3);
        let second_0: Vec<_> = (0..10).map(|_| log.admit(0)).collect();
        assert_eq!(second_0.iter().filter(|a| **a != Admission::Suppressed).count(), 3);
        assert_eq!(second_0[0], Admission::Allowed { suppressed_before: 0 });
        assert_eq!(second_0[3..], [const { Admission::Suppressed }; 7]);

        // The next second lets messages through again and reports the 7 held back, once.
        assert_eq!(log.admit(1), Admission::Allowed { suppressed_before: 7 });
        assert_eq!(log.admit(1), Admission::Allowed { suppressed_before: 0 });
        assert_eq!(log.admit(1), Admission::Allowed { suppressed_before: 0 });
        assert_eq!(log.admit(1), Admission::Suppressed);

        // A quiet gap: the one suppression from second 1 is still reported.
        assert_eq!(log.admit(9), Admission::Allowed { suppressed_before: 1 });
    }

    #[test]
    fn reports_suppressed_messages_in_one_warning_naming_the_site() {
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer({
            let captured = captured.clone();
            move || captured.clone()
        });
        let log = RateLimitedLog::new("test.bad_line", 2);
        let allowed = tracing::subscriber::with_default(subscriber.finish(), || {
            (0..5).filter(|_| log.allow_in(0)).count() + (0..5).filter(|_| log.allow_in(1)).count()
        });
        assert_eq!(allowed, 4);
        let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(output.lines().count(), 1, "{output}");
        assert!(output.contains("3 similar messages suppressed"), "{output}");
        assert!(output.contains("site=\"test.bad_line\""), "{output}");
    }

    #[test]
    fn zero_limit_suppresses_everything() {
        let log = RateLimitedLog::new("test", 0);
        assert_eq!(log.admit(0), Admission::Suppressed);
        assert_eq!(log.admit(1), Admission::Suppressed);
    }

    #[test]
    fn counts_hold_under_contention() {
        let log = RateLimitedLog::new("test", 100);
        let allowed: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..1000).filter(|_| log.admit(5) != Admission::Suppressed).count() as u64))
                .collect();
            workers.into_iter().map(|worker| worker.join().expect("worker did not panic")).sum()
        });
        assert_eq!(allowed, 100);
        assert_eq!(log.admit(6), Admission::Allowed { suppressed_before: 3900 });
    }

    #[test]
    fn parses_formats_and_filters() {
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert!("yaml".parse::<LogFormat>().unwrap_err().to_string().contains("`yaml`"));

        assert!(filter_from(None, "info").is_ok());
        assert!(filter_from(Some(String::new()), "info").is_ok());
        let error = filter_from(Some("info,tessera=loud".to_owned()), "info").unwrap_err().to_string();
        assert!(error.contains("RUST_LOG"), "{error}");
    }
}
