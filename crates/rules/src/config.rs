//! The rules' configuration: the collector's `[mapping]` and `[rules]` tables (TOML).
//!
//! ```toml
//! [mapping]
//! file = "/etc/tessera/statsd_mapping.yml"   # a statsd_exporter mapping file, as it is
//!
//! [rules]
//! allow = ["api_*", "db.*"]        # only names matching one of these (after mapping)
//! deny = ["debug.*"]               # never names matching one of these
//! global_tags = { region = "eu-west-1" }
//! name_prefix = "myapp_"
//!
//! [[rules.tags]]                   # in order, for names matching `match`
//! match = "api_*"
//! drop = ["request_id"]
//! rename = { env = "environment" }
//! keep = []                        # when set, only these keys stay
//!
//! [[rules.rollup]]                 # fold a tag away before sharding
//! match = "api_request_seconds"
//! aggregate_without = ["user_id"]
//! keep_original = false            # M3's keep_original; needs `name` when true
//!
//! [[rules.limit]]                  # distinct series of each name, on this collector
//! match = "api_*"
//! max_series = 10000
//! overflow = "fold"                # or "drop"
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// `[mapping]`: a Prometheus statsd_exporter mapping file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MappingConfig {
    /// Path of the YAML mapping file (statsd_exporter's format); none by default.
    pub file: Option<PathBuf>,
}

/// `[rules]`: what happens to every series, in this order, after the mapping file:
/// allow/deny, tag rules, rollups, global tags, the name prefix, then cardinality limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RulesConfig {
    /// Name globs; when not empty, a series whose name matches none of them is dropped.
    pub allow: Vec<String>,
    /// Name globs; a series whose name matches one of them is dropped.
    pub deny: Vec<String>,
    /// Tag rules, applied in order to the series whose name matches.
    pub tags: Vec<TagRuleConfig>,
    /// Rollups: tags aggregated away before sharding.
    pub rollup: Vec<RollupConfig>,
    /// Tags added to every series that does not already carry the key.
    pub global_tags: BTreeMap<String, String>,
    /// Prepended to every name.
    pub name_prefix: Option<String>,
    /// Cardinality limits per metric name.
    pub limit: Vec<LimitConfig>,
}

/// `[[rules.tags]]`: drop, rename or keep tags.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagRuleConfig {
    /// Name glob (`*` matches any run of characters); every name by default.
    #[serde(rename = "match", default = "every_name")]
    pub matches: String,
    /// Tag keys removed.
    #[serde(default)]
    pub drop: Vec<String>,
    /// Tag keys renamed, old = new.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// When not empty, only tags with these keys stay (after `drop` and `rename`).
    #[serde(default)]
    pub keep: Vec<String>,
}

/// `[[rules.rollup]]`: aggregate series across the values of some tags.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollupConfig {
    /// Name glob of the series rolled up.
    #[serde(rename = "match")]
    pub matches: String,
    /// Tag keys aggregated away: series that differ only in these become one.
    pub aggregate_without: Vec<String>,
    /// Also keep the original series (M3's `keep_original`); the rolled-up series then
    /// needs its own `name`, or both would be one Prometheus metric and sums would count
    /// twice.
    #[serde(default)]
    pub keep_original: bool,
    /// Name of the rolled-up series; the original name by default.
    #[serde(default)]
    pub name: Option<String>,
}

/// `[[rules.limit]]`: at most `max_series` distinct series for each name matching.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// Name glob; every name it matches may have at most `max_series` series.
    #[serde(rename = "match")]
    pub matches: String,
    /// Most distinct series of one name at once on this collector (idle series expire
    /// and free their place).
    pub max_series: usize,
    /// What happens to a series past the limit.
    #[serde(default)]
    pub overflow: Overflow,
}

/// What a series past its limit becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Folded into one overflow series per name: its tags replaced by
    /// `tessera_overflow:true` (and the global tags), so its data still counts in sums.
    #[default]
    Fold,
    /// Dropped (and counted).
    Drop,
}

fn every_name() -> String {
    "*".to_owned()
}
