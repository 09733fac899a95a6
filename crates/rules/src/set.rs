//! A compiled rule set: what the rules make of one series.
//!
//! [`RuleSet::apply`] takes a series (its kind and canonical id) through every rule, in
//! this order:
//!
//! ```text
//!  id ─▶ mapping file ─▶ allow / deny ─▶ tag rules ─▶ rollup ─▶ global tags ─▶ prefix ─▶ limit ─▶ ids
//!        (name parts      (drop)         (drop,        (fold a    (added when   (on every  (fold into
//!         become labels)                  rename,       tag away;  the key is    name)      overflow,
//!                                         keep)         maybe keep absent)                  or drop)
//!                                                       the original)
//! ```
//!
//! Globs of allow, deny, tag, rollup and limit rules match the name after the mapping
//! file and before the prefix. The result is zero ids (dropped), the id unchanged, or one
//! or two new canonical ids (a rollup that keeps the original gives two). Every rule that
//! acted is recorded as a *hit* (rule, action), counted by the caller per window in
//! `rule_partials_total{rule,action}`.
//!
//! It runs once per new series (the window stage caches the outcome, see
//! [`crate::RuleCache`]), so it may allocate.

use std::collections::HashMap;
use std::num::NonZeroU16;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tessera_core::parse::{MAX_TAGS, MetricKind};
use tessera_core::series::{SeriesKey, split_id};

use crate::config::{LimitConfig, MappingConfig, Overflow, RollupConfig, RulesConfig, TagRuleConfig};
use crate::mapping::{MapOutcome, Mapped, MappingFile};
use crate::metrics::RuleMetrics;
use crate::pattern::NameGlob;
use crate::{Action, RulesError};

/// The tag a series past its limit is folded into.
pub const OVERFLOW_TAG: &str = "tessera_overflow:true";

/// Every rule, compiled, with its counters.
pub struct RuleSet {
    mapping: Option<MappingFile>,
    allow: Vec<NameGlob>,
    deny: Vec<NameGlob>,
    tags: Vec<TagRule>,
    rollups: Vec<Rollup>,
    global_tags: Vec<(Vec<u8>, Vec<u8>)>,
    prefix: Vec<u8>,
    limits: Vec<Limit>,
    /// One counter per hit slot: each rule holds the slots of the actions it takes.
    hit_counters: Vec<Counter>,
    /// The rule label and action of each hit slot.
    hit_labels: Vec<(String, Action)>,
    /// Hit slots of each mapping rule: (mapped, dropped).
    mapping_slots: Vec<(u32, u32)>,
    /// Hit slot of a name no allow glob matches.
    allow_slot: u32,
    /// Hit slot of each deny glob.
    deny_slots: Vec<u32>,
    /// Series whose tags the rules took past `MAX_TAGS`.
    truncated: Counter,
    notes: Vec<String>,
}

/// Hands out hit slots, each with its counter.
struct Slots<'m> {
    counters: Vec<Counter>,
    labels: Vec<(String, Action)>,
    metrics: &'m RuleMetrics,
}

impl Slots<'_> {
    fn slot(&mut self, rule: &str, action: Action) -> u32 {
        self.counters.push(self.metrics.partials(rule, action));
        self.labels.push((rule.to_owned(), action));
        (self.counters.len() - 1) as u32
    }
}

struct TagRule {
    glob: NameGlob,
    drop: Vec<Vec<u8>>,
    rename: Vec<(Vec<u8>, Vec<u8>)>,
    keep: Vec<Vec<u8>>,
    slot: u32,
}

struct Rollup {
    glob: NameGlob,
    without: Vec<Vec<u8>>,
    keep_original: bool,
    name: Option<Vec<u8>>,
    slot: u32,
}

struct Limit {
    glob: NameGlob,
    max_series: usize,
    overflow: Overflow,
    /// Hit slots: admitted, and past the limit (overflowed or dropped).
    slots: (u32, u32),
    label: String,
    state: Mutex<LimitState>,
    /// The series of the name closest to the limit.
    series: Gauge,
}

/// What a limit has admitted.
#[derive(Default)]
struct LimitState {
    /// Admitted ids and how many cache entries hold each.
    admitted: HashMap<Box<[u8]>, u32>,
    /// Admitted ids per name.
    per_name: HashMap<Box<[u8]>, usize>,
    /// How many names have each count of ids (the last key is the most any name has).
    names_by_count: std::collections::BTreeMap<usize, usize>,
}

impl LimitState {
    /// Moves one name from `from` ids to `to` (0: no entry) in `names_by_count`.
    fn recount(&mut self, from: usize, to: usize) {
        if from > 0
            && let Some(names) = self.names_by_count.get_mut(&from)
        {
            *names -= 1;
            if *names == 0 {
                self.names_by_count.remove(&from);
            }
        }
        if to > 0 {
            *self.names_by_count.entry(to).or_insert(0) += 1;
        }
    }

    /// The most ids any name has.
    fn most(&self) -> i64 {
        self.names_by_count.keys().next_back().copied().unwrap_or(0) as i64
    }
}

/// Series past a limit, logged with their name at most this often a second.
static PAST_LIMIT_LOG: tessera_runtime::logging::RateLimitedLog =
    tessera_runtime::logging::RateLimitedLog::new("collector.rule_limit", 1);

/// A place a limit holds for one id of a series; handed back with [`RuleSet::release`]
/// and that id (kept once, by whoever holds the outcome, not copied here).
///
/// Two bytes, and `Option<Admission>` too: the cache keeps one per id of each series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The limit's index plus one.
    limit: NonZeroU16,
}

impl Admission {
    /// A place held by the limit at `index` (below [`MAX_LIMITS`]).
    pub(crate) fn new(index: usize) -> Admission {
        let limit = u16::try_from(index + 1).ok().and_then(NonZeroU16::new);
        Admission { limit: limit.expect("compile refuses more than MAX_LIMITS limits") }
    }

    /// The index of the limit that holds the place.
    fn index(self) -> usize {
        usize::from(self.limit.get()) - 1
    }
}

/// Most `[[rules.limit]]` tables: an [`Admission`] names its limit in 16 bits.
pub const MAX_LIMITS: usize = u16::MAX as usize;

/// Where a series' partial goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Under its own id.
    Same,
    /// Nowhere: a rule dropped it.
    Dropped,
    /// Under a new id.
    One(Box<[u8]>),
    /// Under two ids: the original and its rollup (a rollup that keeps the original).
    Two(Box<[u8]>, Box<[u8]>),
}

impl Targets {
    /// The new ids (none for [`Targets::Same`] and [`Targets::Dropped`]).
    pub fn new_ids(&self) -> impl Iterator<Item = &[u8]> {
        let (first, second) = match self {
            Targets::Same | Targets::Dropped => (None, None),
            Targets::One(id) => (Some(&**id), None),
            Targets::Two(first, second) => (Some(&**first), Some(&**second)),
        };
        first.into_iter().chain(second)
    }
}

/// What the rules made of one series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Where its partials go.
    pub targets: Targets,
    /// The hit slots of the rules that acted on it.
    pub hits: Vec<u32>,
    /// The limits' places it holds: `admissions[i]` for the `i`th id it goes under (its
    /// own for [`Targets::Same`]).
    pub admissions: [Option<Admission>; 2],
}

/// A series on its way through the rules.
#[derive(Debug, Clone)]
struct Draft {
    name: Vec<u8>,
    /// `(key, value)`; a bare tag has no value.
    tags: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The name the globs match (after mapping, before the prefix).
    matched_name: Vec<u8>,
}

impl RuleSet {
    /// Compiles `[mapping]` and `[rules]`, reading the mapping file; counters are
    /// registered in `metrics`.
    pub fn load(mapping: &MappingConfig, rules: &RulesConfig, metrics: &RuleMetrics) -> Result<RuleSet, RulesError> {
        let mapping = match &mapping.file {
            Some(path) => {
                Some(MappingFile::load(path).map_err(|source| RulesError::Mapping { path: path.clone(), source })?)
            }
            None => None,
        };
        RuleSet::compile(mapping, rules, metrics)
    }

    /// Compiles `[rules]` around an already loaded mapping file.
    pub fn compile(
        mapping: Option<MappingFile>,
        rules: &RulesConfig,
        metrics: &RuleMetrics,
    ) -> Result<RuleSet, RulesError> {
        let glob = |key: String, text: &str| NameGlob::new(text).map_err(|source| RulesError::Glob { key, source });
        let mut slots = Slots { counters: Vec::new(), labels: Vec::new(), metrics };
        let mapping_slots = match &mapping {
            Some(file) => file
                .rules()
                .enumerate()
                .map(|(index, rule)| {
                    let label = format!("mapping[{index}]:{rule}");
                    (slots.slot(&label, Action::Mapped), slots.slot(&label, Action::Dropped))
                })
                .collect(),
            None => Vec::new(),
        };
        let allow = rules.allow.iter().map(|text| glob("rules.allow".into(), text)).collect::<Result<Vec<_>, _>>()?;
        let allow_slot = if allow.is_empty() { 0 } else { slots.slot("allow", Action::Dropped) };
        let mut deny = Vec::new();
        let mut deny_slots = Vec::new();
        for (index, text) in rules.deny.iter().enumerate() {
            deny.push(glob("rules.deny".into(), text)?);
            deny_slots.push(slots.slot(&format!("deny[{index}]:{text}"), Action::Dropped));
        }
        let tags = each_rule("tags", &rules.tags, |rule| &rule.matches, &mut slots, compile_tag_rule)?;
        let rollups = each_rule("rollup", &rules.rollup, |rule| &rule.matches, &mut slots, compile_rollup)?;
        let mut global_tags = Vec::new();
        for (key, value) in &rules.global_tags {
            check_tag_part(&format!("rules.global_tags.{key}"), key)?;
            check_tag_part(&format!("rules.global_tags.{key}"), value)?;
            global_tags.push((key.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
        let prefix = rules.name_prefix.clone().unwrap_or_default();
        if prefix.contains(['|', ',', '#', ':']) || prefix.trim() != prefix {
            return Err(RulesError::Invalid {
                key: "rules.name_prefix".into(),
                reason: format!(
                    "`{prefix}` holds a character a metric name cannot hold (`|`, `,`, `#`, `:` or a space)"
                ),
            });
        }
        if rules.limit.len() > MAX_LIMITS {
            let reason = format!("{} tables; at most {MAX_LIMITS}", rules.limit.len());
            return Err(RulesError::Invalid { key: "rules.limit".into(), reason });
        }
        let limits = each_rule("limit", &rules.limit, |rule| &rule.matches, &mut slots, compile_limit)?;
        let mut notes = mapping.as_ref().map(|file| file.notes().to_vec()).unwrap_or_default();
        notes.extend(reserved_tag_notes(rules));
        Ok(RuleSet {
            notes,
            mapping,
            allow,
            deny,
            tags,
            rollups,
            global_tags,
            prefix: prefix.into_bytes(),
            limits,
            hit_counters: slots.counters,
            hit_labels: slots.labels,
            mapping_slots,
            allow_slot,
            deny_slots,
            truncated: metrics.rule_truncated_series.clone(),
        })
    }

    /// Whether the set does nothing to any series (no mapping file, no rule).
    pub fn is_empty(&self) -> bool {
        self.mapping.is_none()
            && self.allow.is_empty()
            && self.deny.is_empty()
            && self.tags.is_empty()
            && self.rollups.is_empty()
            && self.global_tags.is_empty()
            && self.prefix.is_empty()
            && self.limits.is_empty()
    }

    /// What the mapping file's keys mean in tessera where they differ from
    /// statsd_exporter (logged at load, printed by `tessera check`).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The rule label and the action of hit slot `slot` (see [`Outcome::hits`]).
    pub fn hit_label(&self, slot: u32) -> Option<(&str, Action)> {
        self.hit_labels.get(slot as usize).map(|(rule, action)| (rule.as_str(), *action))
    }

    /// The counters of the hit slots, in slot order.
    pub fn hit_counters(&self) -> &[Counter] {
        &self.hit_counters
    }

    /// Takes the series `id` of `kind` through every rule.
    pub fn apply(&self, kind: MetricKind, id: &[u8]) -> Outcome {
        self.apply_with(kind, id, &mut Mapped::default())
    }

    /// What a new series of `kind` with the statsd name `name` is written as, from the
    /// mapping file ([`MappingFile::observer`]); `None` without one.
    pub fn observer(&self, kind: MetricKind, name: &[u8]) -> Option<tessera_core::aggregate::Observer> {
        let mapping = self.mapping.as_ref()?;
        mapping.observer(std::str::from_utf8(name).ok()?, kind, &mut Mapped::default())
    }

    /// [`RuleSet::apply`] with the mapping file's buffers in `mapped`, kept by the caller
    /// from one series to the next.
    pub fn apply_with(&self, kind: MetricKind, id: &[u8], mapped: &mut Mapped) -> Outcome {
        let mut hits = Vec::new();
        let dropped = |hits| Outcome { targets: Targets::Dropped, hits, admissions: [None; 2] };
        let (name, raw_tags) = split_id(id);
        let mut draft = Draft { name: name.to_vec(), tags: parse_tags(raw_tags), matched_name: Vec::new() };

        if let (Some(mapping), Ok(text)) = (&self.mapping, std::str::from_utf8(name)) {
            match mapping.map(text, kind, mapped) {
                MapOutcome::NoMatch => {}
                MapOutcome::Drop { rule } | MapOutcome::EmptyName { rule } => {
                    hits.push(self.mapping_slots[rule].1);
                    return dropped(hits);
                }
                MapOutcome::Mapped { rule } => {
                    hits.push(self.mapping_slots[rule].0);
                    // The mapping file gives names, label names and values a tag can hold.
                    draft.name = mapped.name.as_bytes().to_vec();
                    for (key, value) in &mapped.labels {
                        let key = key.as_bytes();
                        let carried = draft.tags.iter().any(|(existing, _)| existing == key);
                        if carried && mapped.honor_labels {
                            continue;
                        }
                        draft.tags.retain(|(existing, _)| existing != key);
                        draft.tags.push((key.to_vec(), Some(value.as_bytes().to_vec())));
                    }
                }
            }
        }
        draft.matched_name.clone_from(&draft.name);

        if !self.allow.is_empty() && !self.allow.iter().any(|glob| glob.matches(&draft.name)) {
            hits.push(self.allow_slot);
            return dropped(hits);
        }
        if let Some(index) = self.deny.iter().position(|glob| glob.matches(&draft.name)) {
            hits.push(self.deny_slots[index]);
            return dropped(hits);
        }
        for rule in self.tags.iter().filter(|rule| rule.glob.matches(&draft.matched_name)) {
            if rule.apply(&mut draft.tags) {
                hits.push(rule.slot);
            }
        }
        let mut drafts = vec![draft];
        if let Some(rollup) = self.rollups.iter().find(|rule| rule.glob.matches(&drafts[0].matched_name)) {
            let mut rolled = drafts[0].clone();
            rolled.tags.retain(|(key, _)| !rollup.without.contains(key));
            if let Some(name) = &rollup.name {
                rolled.name.clone_from(name);
            }
            hits.push(rollup.slot);
            if rollup.keep_original {
                drafts.push(rolled);
            } else {
                drafts[0] = rolled;
            }
        }
        for draft in &mut drafts {
            for (key, value) in &self.global_tags {
                if !draft.tags.iter().any(|(existing, _)| existing == key) {
                    draft.tags.push((key.clone(), Some(value.clone())));
                }
            }
            draft.name.splice(0..0, self.prefix.iter().copied());
        }
        let mut admissions = [None; 2];
        let mut ids = Vec::with_capacity(drafts.len());
        let mut key = SeriesKey::default();
        for draft in &drafts {
            if draft.tags.len() > MAX_TAGS {
                self.truncated.inc();
            }
            let mut id = canonical_id(&mut key, kind, &draft.name, &draft.tags);
            if let Some((index, limit)) =
                self.limits.iter().enumerate().find(|(_, limit)| limit.glob.matches(&draft.matched_name))
            {
                if limit.admit(&id) {
                    hits.push(limit.slots.0);
                    // At most two drafts; the limits were counted at compile.
                    admissions[ids.len()] = Some(Admission::new(index));
                } else if limit.overflow == Overflow::Fold {
                    hits.push(limit.slots.1);
                    id = self.overflow_id(&mut key, kind, &draft.name);
                } else {
                    hits.push(limit.slots.1);
                    continue;
                }
            }
            ids.push(id);
        }
        // Ids are canonical on both sides: a series the rules left as it was has its own.
        // There are at most two drafts: the series and its rollup.
        let mut ids = ids.into_iter();
        let targets = match (ids.next(), ids.next()) {
            (None, _) => Targets::Dropped,
            (Some(only), None) if *only == *id => Targets::Same,
            (Some(only), None) => Targets::One(only),
            (Some(first), Some(second)) => Targets::Two(first, second),
        };
        Outcome { targets, hits, admissions }
    }

    /// Hands back every place [`RuleSet::apply`] took for `outcome`, the outcome of the
    /// series `own_id` (what a caller that keeps no outcome does at once).
    pub fn release_outcome(&self, outcome: &Outcome, own_id: &[u8]) {
        let own = matches!(outcome.targets, Targets::Same).then_some(own_id);
        for (admission, id) in outcome.admissions.iter().zip(own.into_iter().chain(outcome.targets.new_ids())) {
            if let Some(admission) = admission {
                self.release(*admission, id);
            }
        }
    }

    /// Hands back the place [`RuleSet::apply`] took for `id` (the id of the outcome the
    /// admission stands beside).
    pub fn release(&self, admission: Admission, id: &[u8]) {
        if let Some(limit) = self.limits.get(admission.index()) {
            limit.release(id);
        }
    }

    /// The id a series past its limit is folded into: its name, the global tags and
    /// [`OVERFLOW_TAG`].
    fn overflow_id(&self, key: &mut SeriesKey, kind: MetricKind, name: &[u8]) -> Box<[u8]> {
        let mut tags: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            self.global_tags.iter().map(|(key, value)| (key.clone(), Some(value.clone()))).collect();
        let (key_part, value_part) = OVERFLOW_TAG.split_once(':').expect("the overflow tag has a value");
        tags.push((key_part.as_bytes().to_vec(), Some(value_part.as_bytes().to_vec())));
        canonical_id(key, kind, name, &tags)
    }
}

impl TagRule {
    /// Applies the rule to `tags`; whether anything changed.
    fn apply(&self, tags: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>) -> bool {
        let before = tags.len();
        let mut changed = false;
        tags.retain(|(key, _)| !self.drop.contains(key));
        for (key, _) in tags.iter_mut() {
            if let Some((_, new)) = self.rename.iter().find(|(old, _)| old == key) {
                key.clone_from(new);
                changed = true;
            }
        }
        if !self.keep.is_empty() {
            tags.retain(|(key, _)| self.keep.contains(key));
        }
        changed || tags.len() != before
    }
}

impl Limit {
    /// Takes a place for `id` among the series of its name (or shares the one it holds);
    /// false when its name has `max_series` series already.
    fn admit(&self, id: &[u8]) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(holders) = state.admitted.get_mut(id) {
            *holders += 1;
            return true;
        }
        let (name, _) = split_id(id);
        let count = state.per_name.get(name).copied().unwrap_or(0);
        if count >= self.max_series {
            if PAST_LIMIT_LOG.allow() {
                let name = String::from_utf8_lossy(name);
                tracing::warn!(rule = self.label, %name, max_series = self.max_series, "series past the limit of its name");
            }
            return false;
        }
        state.admitted.insert(id.into(), 1);
        match state.per_name.get_mut(name) {
            Some(count) => *count += 1,
            None => {
                state.per_name.insert(name.into(), 1);
            }
        }
        state.recount(count, count + 1);
        self.series.set(state.most());
        true
    }

    fn release(&self, id: &[u8]) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(holders) = state.admitted.get_mut(id) else { return };
        *holders -= 1;
        if *holders > 0 {
            return;
        }
        state.admitted.remove(id);
        let (name, _) = split_id(id);
        let Some(count) = state.per_name.get_mut(name) else { return };
        *count -= 1;
        let now = *count;
        if now == 0 {
            state.per_name.remove(name);
        }
        state.recount(now + 1, now);
        self.series.set(state.most());
    }
}

/// A note for each tag `rules` gives series under a reserved label name (a global tag,
/// a tag rule's rename), naming its key.
fn reserved_tag_notes(rules: &RulesConfig) -> Vec<String> {
    let global = rules.global_tags.keys().map(|key| (format!("rules.global_tags.{key}"), key));
    let renamed = rules.tags.iter().enumerate().flat_map(|(index, rule)| {
        rule.rename.iter().map(move |(old, new)| (format!("rules.tags[{index}].rename.{old}"), new))
    });
    global
        .chain(renamed)
        .filter_map(|(at, key)| tessera_core::series::reserved_label_note(key).map(|note| format!("{at}: {note}")))
        .collect()
}

/// Compiles every rule of `[[rules.<table>]]` with `compile(key, rule, glob, slots)`,
/// where `key` is `rules.<table>[<index>]` and `glob` the rule's `match`, compiled.
fn each_rule<C, R>(
    table: &str,
    rules: &[C],
    matches: impl Fn(&C) -> &String,
    slots: &mut Slots,
    compile: fn(&str, &C, NameGlob, &mut Slots) -> Result<R, RulesError>,
) -> Result<Vec<R>, RulesError> {
    let mut compiled = Vec::with_capacity(rules.len());
    for (index, rule) in rules.iter().enumerate() {
        let key = format!("rules.{table}[{index}]");
        let glob =
            NameGlob::new(matches(rule)).map_err(|source| RulesError::Glob { key: format!("{key}.match"), source })?;
        compiled.push(compile(&key, rule, glob, slots)?);
    }
    Ok(compiled)
}

/// The `rule` label of the rule at `key` (`rules.tags[0]` → `tags[0]:<glob>`).
fn rule_label(key: &str, glob: &NameGlob) -> String {
    format!("{}:{}", key.trim_start_matches("rules."), glob.as_str())
}

fn compile_tag_rule(key: &str, rule: &TagRuleConfig, glob: NameGlob, slots: &mut Slots) -> Result<TagRule, RulesError> {
    let mut rename = Vec::new();
    for (old, new) in &rule.rename {
        check_tag_part(&format!("{key}.rename.{old}"), old)?;
        check_tag_part(&format!("{key}.rename.{old}"), new)?;
        rename.push((old.as_bytes().to_vec(), new.as_bytes().to_vec()));
    }
    let drop = tag_keys(&format!("{key}.drop"), &rule.drop)?;
    let keep = tag_keys(&format!("{key}.keep"), &rule.keep)?;
    if drop.is_empty() && rename.is_empty() && keep.is_empty() {
        let reason = "the rule has no `drop`, `rename` or `keep`".into();
        return Err(RulesError::Invalid { key: key.to_owned(), reason });
    }
    let slot = slots.slot(&rule_label(key, &glob), Action::Rewritten);
    Ok(TagRule { glob, drop, rename, keep, slot })
}

fn compile_rollup(key: &str, rule: &RollupConfig, glob: NameGlob, slots: &mut Slots) -> Result<Rollup, RulesError> {
    if rule.aggregate_without.is_empty() {
        let reason = "`aggregate_without` is empty: nothing to roll up".into();
        return Err(RulesError::Invalid { key: key.to_owned(), reason });
    }
    let without = tag_keys(&format!("{key}.aggregate_without"), &rule.aggregate_without)?;
    if rule.keep_original && rule.name.is_none() {
        return Err(RulesError::Invalid {
            key: key.to_owned(),
            reason: "`keep_original = true` needs a `name` for the rolled-up series: under the same name, \
                     Prometheus sums would count every value twice"
                .into(),
        });
    }
    if let Some(name) = &rule.name
        && (name.is_empty() || name.contains(['|', ',', '#', ':']))
    {
        return Err(RulesError::Invalid {
            key: format!("{key}.name"),
            reason: format!("`{name}` is not a metric name"),
        });
    }
    Ok(Rollup {
        slot: slots.slot(&rule_label(key, &glob), Action::RolledUp),
        glob,
        without,
        keep_original: rule.keep_original,
        name: rule.name.as_ref().map(|name| name.as_bytes().to_vec()),
    })
}

fn compile_limit(key: &str, rule: &LimitConfig, glob: NameGlob, slots: &mut Slots) -> Result<Limit, RulesError> {
    if rule.max_series == 0 {
        return Err(RulesError::Invalid {
            key: format!("{key}.max_series"),
            reason: "0 admits no series; use `deny` to drop a name".into(),
        });
    }
    let label = rule_label(key, &glob);
    slots.metrics.series_limit(&label).set(rule.max_series as i64);
    let series = slots.metrics.limited_series(&label);
    series.set(0);
    let past = if rule.overflow == Overflow::Fold { Action::Overflowed } else { Action::Dropped };
    let slots = (slots.slot(&label, Action::Admitted), slots.slot(&label, past));
    Ok(Limit {
        glob,
        max_series: rule.max_series,
        overflow: rule.overflow,
        slots,
        label,
        state: Mutex::default(),
        series,
    })
}

/// The tag keys of `list` (the value of `key`), each checked with [`check_tag_part`].
fn tag_keys(key: &str, list: &[String]) -> Result<Vec<Vec<u8>>, RulesError> {
    list.iter().map(|tag| check_tag_part(key, tag).map(|()| tag.as_bytes().to_vec())).collect()
}

/// Refuses a tag key or value that cannot be written in a canonical id.
fn check_tag_part(key: &str, text: &str) -> Result<(), RulesError> {
    if text.is_empty() || text.contains(['|', ',']) || text.trim() != text {
        return Err(RulesError::Invalid {
            key: key.to_owned(),
            reason: format!("`{text}` is empty or holds `|`, `,` or surrounding spaces, which a tag cannot hold"),
        });
    }
    Ok(())
}

fn parse_tags(raw: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    raw.split(|byte| *byte == b',')
        .filter(|tag| !tag.is_empty())
        .map(|tag| match tag.iter().position(|byte| *byte == b':') {
            Some(colon) => (tag[..colon].to_vec(), Some(tag[colon + 1..].to_vec())),
            None => (tag.to_vec(), None),
        })
        .collect()
}

/// The canonical id of `name` with `tags` (sorted, duplicates collapsed).
fn canonical_id(key: &mut SeriesKey, kind: MetricKind, name: &[u8], tags: &[(Vec<u8>, Option<Vec<u8>>)]) -> Box<[u8]> {
    // A mapping may add labels past what a line may carry: keep the first ones rather
    // than lose the series (counted by the caller).
    let tags = &tags[..tags.len().min(MAX_TAGS)];
    let mut raw = Vec::new();
    for (tag_key, value) in tags {
        if !raw.is_empty() {
            raw.push(b',');
        }
        raw.extend_from_slice(tag_key);
        if let Some(value) = value {
            raw.push(b':');
            raw.extend_from_slice(value);
        }
    }
    match key.build_from_parts(kind, name, &raw) {
        Ok(()) => key.id().into(),
        // Only too many tags fails, ruled out above; the bare name keeps the data.
        Err(_) => name.into(),
    }
}

#[cfg(test)]
mod tests;
