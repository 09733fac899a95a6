//! The collector's rules, applied to every series before it is sharded.
//!
//! Rules rewrite or drop a series by its name and tags, so that every host's partials
//! of a mapped or rolled-up series hash to the same shard and meet on one aggregator,
//! where they merge exactly. They run once per series per reader's cut of a window, as
//! the collector's window stage merges the cuts, never once per line: the outcome of
//! each series is cached until the series goes idle ([`RuleCache`]).
//!
//! ```text
//!  [mapping] file ─┐
//!  [rules] ────────┴─▶ RuleSet (compiled) ──▶ RulesHandle (reload: the next window)
//!                                                   │ for_window(start)
//!                 readers' cuts ──▶ RuleCache (cache: id → Outcome) ──▶ ids of the window
//! ```
//!
//! - [`MappingConfig`] and [`RulesConfig`]: `[mapping]` and `[rules]`;
//! - [`RuleSet`]: the compiled rules and what they make of one series;
//! - the statsd_exporter mapping file ([`MappingFile`]);
//! - [`RuleCache`]: the window stage's cache of outcomes, and its counts;
//! - [`RulesHandle`]: the rules in force, swapped on reload at a window boundary;
//! - [`RuleMetrics`]: `rule_partials_total{rule,action}` and the rest.
//!
//! ```
//! use tessera_core::parse::MetricKind;
//! use tessera_rules::{MappingConfig, RuleMetrics, RuleSet, RulesConfig, Targets};
//!
//! let rules: RulesConfig = toml::from_str(r#"
//!     global_tags = { region = "eu" }
//!     [[rules.rollup]]
//!     match = "api.*"
//!     aggregate_without = ["user"]
//! "#.replace("[[rules.", "[[").as_str()).unwrap();
//! let set = RuleSet::load(&MappingConfig::default(), &rules, &RuleMetrics::default()).unwrap();
//! let outcome = set.apply(MetricKind::Counter, b"api.hits|#route:/a,user:42");
//! assert_eq!(outcome.targets, Targets::One(b"api.hits|#region:eu,route:/a".as_slice().into()));
//! ```

mod cache;
mod config;
mod handle;
mod mapping;
mod metrics;
mod pattern;
mod set;

use std::path::PathBuf;

pub use cache::{CutRules, RuleCache};
pub use config::{LimitConfig, MappingConfig, Overflow, RollupConfig, RulesConfig, TagRuleConfig};
pub use handle::RulesHandle;
pub use mapping::{MapOutcome, Mapped, MappingError, MappingFile};
pub use metrics::RuleMetrics;
pub use pattern::{GlobError, NameGlob};
pub use set::{Admission, OVERFLOW_TAG, Outcome, RuleSet, Targets};

/// What a rule did to a series (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A mapping rule gave it a new name and labels.
    Mapped,
    /// A rule dropped it.
    Dropped,
    /// A tag rule dropped, renamed or kept tags.
    Rewritten,
    /// A rollup folded tags away.
    RolledUp,
    /// A cardinality limit admitted it.
    Admitted,
    /// A cardinality limit was full: folded into the overflow series.
    Overflowed,
}

impl Action {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Mapped => "mapped",
            Action::Dropped => "dropped",
            Action::Rewritten => "rewritten",
            Action::RolledUp => "rolled_up",
            Action::Admitted => "admitted",
            Action::Overflowed => "overflowed",
        }
    }
}

/// Why rules cannot be loaded. Every variant names the key or the file.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The mapping file does not load.
    #[error("[mapping] file {}: {source}", path.display())]
    Mapping {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: MappingError,
    },
    /// A glob is refused.
    #[error("{key}: {source}")]
    Glob {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: GlobError,
    },
    /// A value is refused.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
}
