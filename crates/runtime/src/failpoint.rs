//! Failpoints: named places where a test can make a daemon wait, to put a race's
//! losing order on the table every time instead of hoping for it (FoundationDB's
//! `BUGGIFY`, TiKV's `fail-rs`).
//!
//! A failpoint is off unless the process was started with
//! `TESSERA_FAILPOINTS="<name>=<ms>[,<name>=<ms>...]"`; then [`delay`] sleeps that many
//! milliseconds where it is named, once per call, and logs that it did. The variable
//! is read once. Failpoints sit on cold paths only (start-up, elections), never on a
//! per-line or per-batch path.
//!
//! | name | where |
//! |---|---|
//! | `aggregator.election.before_register` | an aggregator's election task, before it registers its liveness lease |
//! | `liveness.before_regrant` | any daemon's liveness keep-alive, before it grants a lease again after the last one expired |
//!
//! ```
//! use std::time::Duration;
//!
//! // Unset: no delay.
//! assert_eq!(tessera_runtime::failpoint::configured("aggregator.election.before_register"), None);
//! assert_eq!(
//!     tessera_runtime::failpoint::parse("a=5,b=20", "b"),
//!     Some(Duration::from_millis(20))
//! );
//! ```

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable naming the failpoints.
pub const VARIABLE: &str = "TESSERA_FAILPOINTS";

/// The delay of failpoint `name` in `spec` (`name=ms,...`).
pub fn parse(spec: &str, name: &str) -> Option<Duration> {
    spec.split(',')
        .filter_map(|entry| entry.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, millis)| millis.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
}

/// The delay of failpoint `name` in this process, if it is set.
pub fn configured(name: &str) -> Option<Duration> {
    static SPEC: OnceLock<Option<String>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| std::env::var(VARIABLE).ok());
    parse(spec.as_deref()?, name)
}

/// Waits at failpoint `name` if it is set (tokio tasks).
pub async fn delay(name: &str) {
    if let Some(wait) = configured(name) {
        tracing::warn!(failpoint = name, wait_ms = wait.as_millis() as u64, "failpoint: waiting");
        tokio::time::sleep(wait).await;
    }
}
