//! The rules' metrics, nested in the collector's (`tessera_collector_` prefix).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `rule_partials_total` | counter | `rule`, `action` (mapped, dropped, rewritten, rolled_up, admitted, overflowed) |
//! | `rule_series_limit` | gauge | `rule`: each cardinality limit |
//! | `rule_series` | gauge | `rule`: the most distinct series one name of the limit holds now |
//! | `rule_evaluation_duration_seconds` | histogram | time to take one reader's cut of a window through the rules |
//! | `rule_cache_series` | gauge | series whose outcome the cache holds |
//! | `rules_reloads_total` | counter | `result` (applied, failed) |
//! | `rule_truncated_series_total` | counter | evaluations that gave a series more tags than a line may carry |
//!
//! A *partial* is one series in one window of one reader: rules run once per series per
//! window, never per line. `rule` labels come from the configuration (a closed set):
//! `mapping[3]:api.*.*`, `allow`, `deny[0]:debug.*`, `tags[1]:api_*`, `rollup[0]:…`,
//! `limit[0]:…`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::labels::ByResult;
use tessera_runtime::telemetry::latency_histogram;

use crate::Action;

/// `{rule, action}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByRuleAction {
    rule: String,
    action: &'static str,
}

/// `{rule}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByRule {
    rule: String,
}

tessera_runtime::metrics! {
    /// The rules' metrics.
    pub struct RuleMetrics {
        /// Series partials (one series in one window of one reader) each rule acted on, per rule
        /// and action
        rule_partials: Family<ByRuleAction, Counter>,
        /// Most distinct series each cardinality limit admits for one name on this collector
        rule_series_limit: Family<ByRule, Gauge>,
        /// Distinct series now held by the name closest to each cardinality limit
        rule_series: Family<ByRule, Gauge>,
        /// Time to take one reader's cut of a window through the rules
        pub rule_evaluation_duration: Histogram [seconds] = latency_histogram(),
        /// Series whose rule outcome is cached (until the series goes idle)
        pub rule_cache_series: Gauge,
        /// Rule reloads, per result (applied; failed: the previous rules stay)
        rules_reloads: Family<ByResult, Counter>,
        /// Series given more tags than a line may carry by the rules (a mapping's labels beside
        /// the line's tags): the first ones in the rules' order are kept. Counted each time the
        /// rules evaluate such a series: when it is first seen, and again after a reload or once
        /// it idled out of the cache
        pub rule_truncated_series: Counter,
    }
}

impl RuleMetrics {
    /// The counter of `rule` taking `action`.
    pub fn partials(&self, rule: &str, action: Action) -> Counter {
        self.rule_partials.get_or_create(&ByRuleAction { rule: rule.to_owned(), action: action.as_str() }).clone()
    }

    /// The gauge of a limit's most series.
    pub fn series_limit(&self, rule: &str) -> Gauge {
        self.rule_series_limit.get_or_create(&ByRule { rule: rule.to_owned() }).clone()
    }

    /// The gauge of a limit's series.
    pub fn limited_series(&self, rule: &str) -> Gauge {
        self.rule_series.get_or_create(&ByRule { rule: rule.to_owned() }).clone()
    }

    /// Counts a reload that was applied (`true`) or refused.
    pub fn reloaded(&self, applied: bool) {
        let result = if applied { "applied" } else { "failed" };
        self.rules_reloads.get_or_create(&ByResult { result }).inc();
    }
}
