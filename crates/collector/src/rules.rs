//! The rules stage's plumbing: the rule set compiled at start, and reloaded on SIGHUP and
//! when its files change.
//!
//! The rules themselves (`tessera_rules`) run in the window stage (`window.rs`), once per
//! series per reader's cut, as the flusher merges the readers' cuts of a window: that is
//! where every series' id becomes final, before the outbound side hashes it to a shard.
//! The readers, which read the sockets, never wait on a rule.
//!
//! **Reload.** Once a second, and at once on SIGHUP, the reloader looks at the `--config`
//! file and the mapping file. When one changed (or on SIGHUP), it reads `[mapping]` and
//! `[rules]` again and compiles them. A set that does not compile leaves the rules in
//! force as they are: the reason is logged and `rules_reloads_total{result="failed"}`
//! counted. A set that compiles is in force from the next window, for every reader at
//! once, so no window is split between two sets. Only the rules reload; the rest of the
//! file applies at the next start.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tessera_core::clock::now_ms;
use tessera_rules::RulesHandle;
use tessera_runtime::Shutdown;
use tessera_runtime::file_stamp;

use crate::config::Config;
use tessera_rules::RuleMetrics;

/// How often the files are looked at.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where reloaded rules come from: the configuration in force, whose `config_file` is
/// read again on reload; without one, the rules given at start stay and only the mapping
/// file is read again.
pub struct RuleSource {
    /// The configuration in force.
    pub config: Config,
}

type Stamp = Option<(SystemTime, u64)>;

impl RuleSource {
    fn stamps(&self) -> (Stamp, Stamp) {
        let config = self.config.config_file.as_deref().and_then(file_stamp);
        let mapping = self.config.mapping.file.as_deref().and_then(file_stamp);
        (config, mapping)
    }

    /// Reads and compiles the rules again; the error says why they were refused.
    fn reload(&mut self, metrics: &RuleMetrics) -> Result<tessera_rules::RuleSet, String> {
        if let Some(path) = &self.config.config_file {
            let mut config = read_config(path)?;
            config.config_file = Some(path.clone());
            self.config = config;
        }
        self.config.rule_set(metrics).map_err(|error| error.to_string())
    }
}

fn read_config(path: &Path) -> Result<Config, String> {
    tessera_runtime::config::load_toml::<Config>(Some(path)).map_err(|error| error.to_string())
}

/// Reloads the rules on SIGHUP and when their files change, until `shutdown`.
pub async fn reload_loop(
    handle: Arc<RulesHandle>,
    mut source: RuleSource,
    window_ms: i64,
    metrics: RuleMetrics,
    shutdown: Shutdown,
) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; rules reload on file change only");
            None
        }
    };
    let mut seen = source.stamps();
    loop {
        let hangup = async {
            match hangups.as_mut() {
                Some(hangups) => hangups.recv().await,
                None => std::future::pending().await,
            }
        };
        let why = tokio::select! {
            () = shutdown.wait() => return,
            _ = hangup => "SIGHUP",
            () = tokio::time::sleep(CHECK_INTERVAL) => {
                let now = source.stamps();
                if now == seen {
                    continue;
                }
                "a file changed"
            }
        };
        let previous = source.config.clone();
        match source.reload(&metrics) {
            Ok(set) => {
                let now = now_ms();
                let from_ms = now - now.rem_euclid(window_ms) + window_ms;
                for note in set.notes() {
                    tracing::info!(note, "mapping file");
                }
                handle.replace(set, from_ms);
                metrics.reloaded(true);
                tracing::info!(why, from_window_ms = from_ms, "rules reloaded; in force from the next window");
            }
            Err(error) => {
                source.config = previous;
                metrics.reloaded(false);
                tracing::warn!(why, %error, "rules not reloaded; the rules in force stay");
            }
        }
        seen = source.stamps();
    }
}
