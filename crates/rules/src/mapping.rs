//! statsd_exporter mapping files: dotted name parts become a metric name and
//! labels.
//!
//! Prometheus's `statsd_exporter` reads a YAML file of rules that turn
//! `api.GET.users.200.latency` into `api_latency{method="GET", ...}`. Teams
//! bring that file along; [`MappingFile`] reads it as it is and maps a
//! series' name the way statsd_exporter does, before the collector hashes
//! the series id.
//!
//! - [`MappingFile::from_yaml`] / [`MappingFile::load`] read and validate a
//!   file. Every key statsd_exporter accepts either has an effect, or is
//!   reported in [`MappingFile::notes`] with what tessera does instead, or is
//!   refused; an unknown key is an error. Errors ([`MappingError`]) name the
//!   mapping, the key and the line.
//! - [`MappingFile::map`] maps one name and type into a reusable [`Mapped`]
//!   and says which rule applied ([`MapOutcome`]). It runs once per new
//!   series, never per line, and compiles nothing.
//! - [`MappingFile::rules`] labels each rule by its `match` string, for
//!   per-rule telemetry indexed by the `rule` of a [`MapOutcome`].
//!
//! ```
//! use tessera_core::parse::MetricKind;
//! use tessera_rules::{MapOutcome, Mapped, MappingFile};
//!
//! let file = MappingFile::from_yaml(
//!     r#"
//! mappings:
//! - match: "api.*.*.latency"
//!   name: "api_latency"
//!   labels:
//!     method: "$1"
//!     status: "${2}"
//! - match: "debug.*"
//!   action: drop
//! "#,
//! )?;
//! let mut out = Mapped::default();
//! let outcome = file.map("api.GET.200.latency", MetricKind::Timer, &mut out);
//! assert_eq!(outcome, MapOutcome::Mapped { rule: 0 });
//! assert_eq!(out.name, "api_latency");
//! assert_eq!(out.labels, [("method".into(), "GET".into()), ("status".into(), "200".into())]);
//! assert_eq!(file.map("debug.x", MetricKind::Counter, &mut out), MapOutcome::Drop { rule: 1 });
//! assert_eq!(file.rules().collect::<Vec<_>>(), ["api.*.*.latency", "debug.*"]);
//! # Ok::<(), tessera_rules::MappingError>(())
//! ```
//!
//! # Matching, as statsd_exporter does
//!
//! - Glob rules (`match_type: glob`, the default) are tried first, all of
//!   them, wherever they sit in the file; regex rules come after, in file
//!   order. A file with a regex rule before a glob rule gets a note.
//! - A glob is dot-separated components; `*` is a whole component and
//!   matches any one component, even an empty one. Among matching globs the
//!   first in the file wins, or, with `defaults.glob_disable_ordering: true`,
//!   the one with literal components furthest to the left. The globs form a
//!   tree matched without backtracking (see `glob.rs`): the cost per name
//!   does not grow with the number of rules.
//! - Regex rules use the regex crate, unanchored like Go's `regexp`. Its
//!   syntax is RE2's, but `\w`, `\d`, `\s` and `\b` are Unicode-aware where
//!   Go's are ASCII.
//! - `match_metric_type` limits a rule to `counter` (`c`), `gauge` (`g`) or
//!   `observer` (`ms`, `h`, `d`; older files say `timer`).
//! - **Sets** (`s`) never match: statsd_exporter refuses set lines ("no
//!   support for StatsD sets"), so its files say nothing about them; tessera
//!   keeps them unmapped ([`MapOutcome::NoMatch`]).
//! - `$1`, `${1}` and, in regex rules, `$name` / `${name}` in `name` and in
//!   label values expand to captures, with Go's `Regexp.Expand` rules (see
//!   `template.rs`): `$1_total` is the reference `${1_total}`, always empty.
//!   A reference that can never resolve is reported as a note.
//!
//! # Output, usable as tessera tags
//!
//! - The name is escaped like statsd_exporter's `EscapeMetricName`: every
//!   character outside `[A-Za-z0-9_]` becomes `_` (a `-` after a `-` is
//!   dropped), and a leading digit gets a `_` in front. A name that expands
//!   to nothing gives [`MapOutcome::EmptyName`]; statsd_exporter drops such
//!   a line (counted as `empty_metric_name`), and the caller should too.
//! - Label names are checked when the file loads (`[A-Za-z_][A-Za-z0-9_]*`),
//!   so they are valid tag keys. In label values, `|`, `,`, `\r` and `\n`
//!   (which end a tag or a line) become `_`. A label whose value is empty is
//!   left out, as Prometheus treats an empty label as an absent one.
//! - `honor_labels: true` is passed on in [`Mapped::honor_labels`]: the
//!   caller then keeps a tag the line already has over a mapped label of the
//!   same name; otherwise the mapped label replaces it.

mod config;
mod glob;
mod lines;
mod observer;
mod template;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use regex::{Regex, RegexSet};
use tessera_core::aggregate::Observer;
use tessera_core::parse::MetricKind;

use self::config::{DefaultsConfig, FileConfig, MappingConfig};
use self::glob::{GlobMatcher, GlobScratch, MAX_COMPONENTS, TypeClass};
use self::lines::LineIndex;
use self::observer::{ObserverSettings, ObserverType};
use self::template::{
    Reference, Template, escape_metric_name, is_glob_pattern, is_label_name, is_metric_name_template,
    sanitize_tag_value,
};

/// Prometheus' default histogram buckets (`prometheus.DefBuckets`), which statsd_exporter
/// gives a histogram that sets none.
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// statsd_exporter's default summary quantiles (0.5, 0.9 and 0.99), for a summary that sets
/// none.
pub const DEFAULT_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// A loaded, validated statsd_exporter mapping file.
#[derive(Debug)]
pub struct MappingFile {
    rules: Vec<Rule>,
    globs: GlobMatcher,
    /// Indexes into `rules` of the regex rules, in file order.
    regex_rules: Vec<usize>,
    /// Every regex rule's pattern, in the order of `regex_rules`: a name that matches
    /// none of several costs one search, not one per rule. `None` when they are too large
    /// to compile together (each was compiled alone): then each rule is tried in turn.
    regex_set: Option<RegexSet>,
    /// What a series no rule maps is written as, when `defaults.observer_type` is set.
    default_observer: Option<Observer>,
    notes: Vec<String>,
}

/// What [`MappingFile::map`] did with a name. `rule` is the index of the
/// mapping in the file, the same index as [`MappingFile::rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapOutcome {
    /// No rule matches: the series keeps its name and tags.
    NoMatch,
    /// The rule matched with `action: drop`: the series is dropped.
    Drop {
        /// The rule that matched.
        rule: usize,
    },
    /// The rule matched; the new name and labels are in [`Mapped`].
    Mapped {
        /// The rule that matched.
        rule: usize,
    },
    /// The rule matched but its `name` expanded to nothing: statsd_exporter
    /// drops the line (counted as `empty_metric_name`); the caller should
    /// drop the series too.
    EmptyName {
        /// The rule that matched.
        rule: usize,
    },
}

/// The result of a mapping, reused across calls to [`MappingFile::map`] so
/// that its buffers are allocated once.
#[derive(Debug, Default, Clone)]
pub struct Mapped {
    /// The Prometheus metric name (only `[A-Za-z0-9_]`, not starting with a
    /// digit).
    pub name: String,
    /// Mapped labels in the rule's order: valid tag keys, and values without
    /// `|`, `,`, `\r` or `\n`, never empty.
    pub labels: Vec<(String, String)>,
    /// `honor_labels` of the rule: when true, a tag the line already carries
    /// wins over a mapped label of the same key; when false the mapped label
    /// replaces it.
    pub honor_labels: bool,
    raw_name: String,
    captures: Vec<(usize, usize)>,
    glob: GlobScratch,
}

/// Why a mapping file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    /// The file cannot be read.
    #[error("cannot read mapping file `{path}`")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed, or a key is unknown or of the wrong type;
    /// serde_yaml's message names the key and its line.
    #[error("invalid mapping file: {0}")]
    Yaml(serde_yaml::Error),
    /// A top-level key other than `defaults` and `mappings`.
    #[error(
        "{}unknown key `{key}`: a mapping file has only `defaults` and `mappings`",
        line.map(|line| format!("line {line}: ")).unwrap_or_default()
    )]
    UnknownKey {
        /// The key.
        key: String,
        /// Its line, when it could be found.
        line: Option<usize>,
    },
    /// A value is refused.
    #[error("{}: `{key}`: {message}", place(*.mapping, *.line))]
    Invalid {
        /// The index in `mappings`, or `None` for `defaults`.
        mapping: Option<usize>,
        /// The line of the key, when it could be found.
        line: Option<usize>,
        /// The key, e.g. `match` or `histogram_options`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// `mappings[3] (line 12)` or `defaults (line 2)`.
fn place(mapping: Option<usize>, line: Option<usize>) -> String {
    let what = match mapping {
        Some(index) => format!("mappings[{index}]"),
        None => "defaults".to_owned(),
    };
    match line {
        Some(line) => format!("{what} (line {line})"),
        None => what,
    }
}

#[derive(Debug)]
struct Rule {
    pattern: Box<str>,
    regex: Option<Regex>,
    class: Option<TypeClass>,
    drop: bool,
    name: Template,
    labels: Vec<(Box<str>, Template)>,
    honor_labels: bool,
    /// A classic histogram with its bucket bounds, or a summary with its quantiles, when
    /// the rule's observer type (its own or the default) says so.
    observer: Option<Observer>,
    /// The metric family and its `help`, for a rule with a help and a literal name.
    help: Option<(Box<str>, Box<str>)>,
}

/// What `defaults` sets for every mapping.
#[derive(Debug)]
struct Defaults {
    regex: bool,
    ordered: bool,
    observer_type: Option<ObserverType>,
    /// `defaults.histogram_options.buckets` or `defaults.buckets`, else Prometheus' default
    /// buckets (as statsd_exporter has them).
    buckets: Arc<[f64]>,
    /// `defaults.summary_options.quantiles` or `defaults.quantiles`, else statsd_exporter's.
    quantiles: Arc<[f64]>,
}

impl Defaults {
    /// What an observer of `observer_type` is written as, with `bounds` and `quantiles`
    /// where set, else the defaults'.
    fn observer(
        &self,
        observer_type: Option<ObserverType>,
        bounds: Option<Arc<[f64]>>,
        quantiles: Option<Arc<[f64]>>,
    ) -> Option<Observer> {
        match observer_type? {
            ObserverType::Histogram => Some(Observer::Histogram(bounds.unwrap_or_else(|| self.buckets.clone()))),
            ObserverType::Summary => Some(Observer::Summary(quantiles.unwrap_or_else(|| self.quantiles.clone()))),
        }
    }
}

impl MappingFile {
    /// Reads and validates a mapping file's text.
    pub fn from_yaml(text: &str) -> Result<MappingFile, MappingError> {
        refuse_unknown_top_level_keys(text)?;
        let config: Option<FileConfig> = serde_yaml::from_str(text).map_err(MappingError::Yaml)?;
        let config = config.unwrap_or_default();
        let mappings = config.mappings.unwrap_or_default();
        let mut loader = Loader { lines: LineIndex::new(text, mappings.len()), notes: Vec::new() };
        let defaults = loader.defaults(config.defaults.unwrap_or_default())?;
        let mut globs = GlobMatcher::new(defaults.ordered);
        let mut rules = Vec::with_capacity(mappings.len());
        let mut regex_rules = Vec::new();
        for (index, mapping) in mappings.into_iter().enumerate() {
            let rule = loader.rule(index, mapping, &defaults)?;
            match rule.regex {
                Some(_) => regex_rules.push(index),
                None => {
                    let rule_id = u32::try_from(index)
                        .map_err(|_| loader.invalid(Some(index), "match", "too many mappings".to_owned()))?;
                    globs.insert(&rule.pattern, rule.class, rule_id);
                }
            }
            rules.push(rule);
        }
        globs.finish();
        if let Some(&first_regex) = regex_rules.first()
            && rules[first_regex..].iter().any(|rule| rule.regex.is_none())
        {
            loader.note(
                Some(first_regex),
                "match_type",
                "glob rules are tried before every regex rule, wherever they are in the file \
                 (as in statsd_exporter), so a later glob rule wins over this regex rule",
            );
        }
        let patterns = regex_rules.iter().map(|&index| rules[index].pattern.as_ref());
        // Each pattern compiled alone above; together they may pass the size limit, which
        // costs speed, not the file.
        let regex_set = match RegexSet::new(patterns) {
            Ok(set) => Some(set),
            Err(error) => {
                let message = format!("the regex rules are tried one at a time ({error})");
                loader.note(regex_rules.first().copied(), "match", &message);
                None
            }
        };
        let default_observer = defaults.observer(defaults.observer_type, None, None);
        Ok(MappingFile { rules, globs, regex_rules, regex_set, default_observer, notes: loader.notes })
    }

    /// Reads and validates the mapping file at `path`.
    pub fn load(path: &Path) -> Result<MappingFile, MappingError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| MappingError::Read { path: path.to_owned(), source })?;
        MappingFile::from_yaml(&text)
    }

    /// What tessera does differently from statsd_exporter for keys of this
    /// file, one line each, e.g. `mappings[3] (line 12): histogram_options:
    /// ...`. For the caller to log at start-up and for `tessera check`.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// A short, stable label per mapping, its `match` string, in file order:
    /// index `i` is the `rule` of a [`MapOutcome`].
    pub fn rules(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.rules.iter().map(|rule| &*rule.pattern)
    }

    /// The `help` of every mapping with a literal `name`, by metric family (the escaped
    /// name), in file order: what the ingester writes as HELP (`# HELP`, remote write's
    /// metadata). A name made from captures has none (noted at load).
    pub fn helps(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.rules.iter().filter_map(|rule| rule.help.as_ref().map(|(family, help)| (&**family, &**help)))
    }

    /// What the statsd name `name` of a series of type `kind` is written as, when the
    /// mapping that matches it has an observer type (its own, or `defaults.observer_type`):
    /// a classic histogram with its bucket bounds, or a summary with its quantiles; for a
    /// name no mapping matches, what `defaults.observer_type` says. `None` otherwise: the
    /// series is written as the ingester's target says. `scratch` is reused.
    pub fn observer(&self, name: &str, kind: MetricKind, scratch: &mut Mapped) -> Option<Observer> {
        if type_class(kind) != Some(TypeClass::Observer) {
            return None;
        }
        match self.map(name, kind, scratch) {
            MapOutcome::Mapped { rule } => self.rules[rule].observer.clone(),
            MapOutcome::NoMatch => self.default_observer.clone(),
            MapOutcome::Drop { .. } | MapOutcome::EmptyName { .. } => None,
        }
    }

    /// Maps the statsd name `name` of a series of type `kind`. On
    /// [`MapOutcome::Mapped`], `out` holds the new name and labels; on any
    /// other outcome its name and labels are empty.
    pub fn map(&self, name: &str, kind: MetricKind, out: &mut Mapped) -> MapOutcome {
        out.name.clear();
        out.labels.clear();
        out.honor_labels = false;
        let Some(class) = type_class(kind) else {
            return MapOutcome::NoMatch;
        };
        // Every rule that is not a regex rule is a glob rule.
        if self.regex_rules.len() < self.rules.len()
            && let Some(found) = self.globs.find(name, class, &mut out.glob)
        {
            let index = found.rule as usize;
            let rule = &self.rules[index];
            if rule.drop {
                return MapOutcome::Drop { rule: index };
            }
            let mut captures = std::mem::take(&mut out.captures);
            captures.clear();
            let mut start = 0;
            for (position, component) in name.split('.').enumerate() {
                if position < MAX_COMPONENTS && found.stars & (1u64 << position) != 0 {
                    captures.push((start, start + component.len()));
                }
                start += component.len() + 1;
            }
            let outcome = render(rule, index, out, |capture| {
                let &(from, to) = captures.get(capture)?;
                name.get(from..to)
            });
            out.captures = captures;
            return outcome;
        }
        // With several regex rules, a name that matches none (the common case) costs one
        // search of them all; one that matches some is then tried rule by rule, in file
        // order. A miss costs each regex its fast search only; captures allocate, so only
        // a match takes them.
        if self.regex_rules.len() > 1 && self.regex_set.as_ref().is_some_and(|set| !set.is_match(name)) {
            return MapOutcome::NoMatch;
        }
        for &index in &self.regex_rules {
            let rule = &self.rules[index];
            if rule.class.is_some_and(|wanted| wanted != class) {
                continue;
            }
            let Some(regex) = &rule.regex else {
                continue;
            };
            if !regex.is_match(name) {
                continue;
            }
            let Some(captures) = regex.captures(name) else {
                continue;
            };
            if rule.drop {
                return MapOutcome::Drop { rule: index };
            }
            return render(rule, index, out, |group| captures.get(group).map(|found| found.as_str()));
        }
        MapOutcome::NoMatch
    }
}

/// serde_yaml reports an unknown key at the top of the document without a
/// line; this check finds it first, with its line.
fn refuse_unknown_top_level_keys(text: &str) -> Result<(), MappingError> {
    let Ok(serde_yaml::Value::Mapping(top)) = serde_yaml::from_str::<serde_yaml::Value>(text) else {
        return Ok(());
    };
    for key in top.keys() {
        let Some(key) = key.as_str() else {
            continue;
        };
        if key == "defaults" || key == "mappings" {
            continue;
        }
        let line =
            text.lines().position(|line| line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with(':')));
        return Err(MappingError::UnknownKey { key: key.to_owned(), line: line.map(|index| index + 1) });
    }
    Ok(())
}

/// statsd_exporter's metric type of a tessera kind; sets have none.
fn type_class(kind: MetricKind) -> Option<TypeClass> {
    match kind {
        MetricKind::Counter => Some(TypeClass::Counter),
        MetricKind::Gauge => Some(TypeClass::Gauge),
        MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution => Some(TypeClass::Observer),
        MetricKind::Set => None,
    }
}

/// Expands `rule`'s name and labels into `out`.
fn render<'s>(rule: &Rule, index: usize, out: &mut Mapped, capture: impl Fn(usize) -> Option<&'s str>) -> MapOutcome {
    out.raw_name.clear();
    rule.name.expand(&mut out.raw_name, &capture);
    escape_metric_name(&out.raw_name, &mut out.name);
    if out.name.is_empty() {
        return MapOutcome::EmptyName { rule: index };
    }
    for (key, value_template) in &rule.labels {
        let mut value = String::new();
        value_template.expand(&mut value, &capture);
        sanitize_tag_value(&mut value);
        if !value.is_empty() {
            out.labels.push((key.to_string(), value));
        }
    }
    out.honor_labels = rule.honor_labels;
    MapOutcome::Mapped { rule: index }
}

/// State while a file is validated: line numbers and the notes so far.
struct Loader {
    lines: LineIndex,
    notes: Vec<String>,
}

impl Loader {
    fn line(&self, mapping: Option<usize>, key: &str) -> Option<usize> {
        match mapping {
            Some(index) => self.lines.mapping(index, Some(key)),
            None => self.lines.defaults(Some(key)),
        }
    }

    fn invalid(&self, mapping: Option<usize>, key: &str, message: String) -> MappingError {
        MappingError::Invalid { mapping, line: self.line(mapping, key), key: key.to_owned(), message }
    }

    fn note(&mut self, mapping: Option<usize>, key: &str, message: &str) {
        let place = place(mapping, self.line(mapping, key));
        self.notes.push(format!("{place}: {key}: {message}"));
    }

    fn defaults(&mut self, config: DefaultsConfig) -> Result<Defaults, MappingError> {
        let regex = match &config.match_type {
            Some(value) => self.match_type(None, value)?,
            None => false,
        };
        let choice = self.observer_settings(
            None,
            ObserverSettings {
                observer_type: config.observer_type.as_deref(),
                timer_type: config.timer_type.as_deref(),
                buckets: config.buckets.as_deref(),
                quantiles: config.quantiles.as_deref(),
                histogram_options: config.histogram_options.as_ref(),
                summary_options: config.summary_options.as_ref(),
                ttl: config.ttl.as_ref(),
            },
        )?;
        Ok(Defaults {
            regex,
            ordered: !config.glob_disable_ordering.unwrap_or(false),
            observer_type: choice.observer_type,
            buckets: choice.bounds.unwrap_or_else(|| DEFAULT_BUCKETS.into()),
            quantiles: choice.quantiles.unwrap_or_else(|| DEFAULT_QUANTILES.into()),
        })
    }

    fn match_type(&self, mapping: Option<usize>, value: &str) -> Result<bool, MappingError> {
        match value {
            "glob" | "" => Ok(false),
            "regex" => Ok(true),
            other => Err(self.invalid(mapping, "match_type", format!("`{other}` is not `glob` or `regex`"))),
        }
    }

    fn rule(&mut self, index: usize, mapping: MappingConfig, defaults: &Defaults) -> Result<Rule, MappingError> {
        let at = Some(index);
        let is_regex = match &mapping.match_type {
            Some(value) => self.match_type(at, value)?,
            None => defaults.regex,
        };
        let drop = match mapping.action.as_deref() {
            None | Some("" | "map") => false,
            Some("drop") => true,
            Some(other) => {
                return Err(self.invalid(at, "action", format!("`{other}` is not `map` or `drop`")));
            }
        };
        let class = match mapping.match_metric_type.as_deref() {
            None | Some("") => None,
            Some("counter") => Some(TypeClass::Counter),
            Some("gauge") => Some(TypeClass::Gauge),
            Some("observer" | "timer") => Some(TypeClass::Observer),
            Some(other) => {
                return Err(self.invalid(
                    at,
                    "match_metric_type",
                    format!("`{other}` is not `counter`, `gauge` or `observer`"),
                ));
            }
        };
        let pattern = mapping.pattern;
        let regex = if is_regex {
            let compiled =
                Regex::new(&pattern).map_err(|error| self.invalid(at, "match", format!("invalid regex: {error}")))?;
            Some(compiled)
        } else {
            if !is_glob_pattern(&pattern) {
                return Err(self.invalid(
                    at,
                    "match",
                    format!(
                        "`{pattern}` is not a valid glob: components of `[A-Za-z0-9_]` joined by \
                         single `-`, or `*`, separated by `.`; the first may not start with a digit"
                    ),
                ));
            }
            if pattern.split('.').count() > MAX_COMPONENTS {
                return Err(self.invalid(at, "match", format!("a glob has at most {MAX_COMPONENTS} components")));
            }
            None
        };
        let name_text = mapping.name.unwrap_or_default();
        if name_text.is_empty() && !drop {
            return Err(self.invalid(at, "name", "a mapping without `action: drop` needs a `name`".to_owned()));
        }
        if !name_text.is_empty() && !is_metric_name_template(&name_text) {
            return Err(self.invalid(
                at,
                "name",
                format!(
                    "`{name_text}` is not a valid metric name: use `[A-Za-z0-9_]` and `$n` / \
                     `${{n}}`, not starting with a digit"
                ),
            ));
        }
        let wildcards = pattern.split('.').filter(|part| *part == "*").count();
        let name = self.template(index, "name", &name_text, regex.as_ref(), wildcards);
        let mut labels = Vec::new();
        for (key, value) in mapping.labels.unwrap_or_default() {
            let Some(key) = key.as_str() else {
                return Err(self.invalid(at, "labels", format!("label name {key:?} is not a string")));
            };
            if !is_label_name(key) {
                return Err(self.invalid(
                    at,
                    "labels",
                    format!("`{key}` is not a valid label name (`[A-Za-z_][A-Za-z0-9_]*`)"),
                ));
            }
            let text = match &value {
                serde_yaml::Value::String(text) => text.clone(),
                serde_yaml::Value::Number(number) => number.to_string(),
                serde_yaml::Value::Bool(flag) => flag.to_string(),
                serde_yaml::Value::Null => String::new(),
                other => {
                    return Err(self.invalid(
                        at,
                        "labels",
                        format!("the value of label `{key}` is not a scalar: {other:?}"),
                    ));
                }
            };
            let key_path = format!("labels.{key}");
            if let Some(message) = tessera_core::series::reserved_label_note(key) {
                self.note(at, "labels", &message);
            }
            let template = self.template(index, &key_path, &text, regex.as_ref(), wildcards);
            labels.push((Box::from(key), template));
        }
        if let Some(scale) = mapping.scale
            && scale != 1.0
        {
            return Err(self.invalid(
                at,
                "scale",
                format!(
                    "`scale: {scale}` is not supported: tessera does not rewrite values in the \
                     collector; scale in the sender or in queries"
                ),
            ));
        }
        let choice = self.observer_settings(
            at,
            ObserverSettings {
                observer_type: mapping.observer_type.as_deref(),
                timer_type: mapping.timer_type.as_deref(),
                buckets: mapping.buckets.as_deref(),
                quantiles: mapping.quantiles.as_deref(),
                histogram_options: mapping.histogram_options.as_ref(),
                summary_options: mapping.summary_options.as_ref(),
                ttl: mapping.ttl.as_ref(),
            },
        )?;
        let effective = choice.observer_type.or(defaults.observer_type);
        if effective == Some(ObserverType::Histogram) && mapping.summary_options.is_some() {
            return Err(self.invalid(
                at,
                "summary_options",
                "cannot be used with `observer_type: histogram`".to_owned(),
            ));
        }
        if effective == Some(ObserverType::Summary) && mapping.histogram_options.is_some() {
            return Err(self.invalid(
                at,
                "histogram_options",
                "cannot be used with `observer_type: summary`".to_owned(),
            ));
        }
        if choice.bounds.is_some() && effective != Some(ObserverType::Histogram) {
            self.note(
                at,
                "buckets",
                "buckets apply to `observer_type: histogram` only (as in statsd_exporter); not used",
            );
        }
        if choice.quantiles.is_some() && effective != Some(ObserverType::Summary) {
            self.note(
                at,
                "quantiles",
                "quantiles apply to `observer_type: summary` only (as in statsd_exporter); not used",
            );
        }
        let observer = defaults.observer(effective, choice.bounds, choice.quantiles);
        // The ingester finds a help text by the metric name: a name made from captures
        // has no one name to find it by.
        let help = match mapping.help.filter(|help| !help.is_empty()) {
            Some(help) if !name_text.contains('$') => {
                let mut family = String::new();
                escape_metric_name(&name_text, &mut family);
                Some((family.into_boxed_str(), help.into_boxed_str()))
            }
            Some(_) => {
                self.note(
                    at,
                    "help",
                    "the help of a mapping whose name is made from captures is not used (the ingester \
                     finds a help by the metric name)",
                );
                None
            }
            None => None,
        };
        Ok(Rule {
            pattern: pattern.into(),
            regex,
            class,
            drop,
            name,
            labels,
            honor_labels: mapping.honor_labels.unwrap_or(false),
            observer,
            help,
        })
    }

    /// Compiles a template of mapping `index` and notes references that are
    /// always empty.
    fn template(&mut self, index: usize, key: &str, text: &str, regex: Option<&Regex>, wildcards: usize) -> Template {
        let mut unresolved = Vec::new();
        let template = Template::compile(
            text,
            |reference| match (reference, regex) {
                (Reference::Number(number), None) => (1..=wildcards).contains(number).then(|| number - 1),
                (Reference::Number(number), Some(regex)) => (*number < regex.captures_len()).then_some(*number),
                (Reference::Name(name), Some(regex)) => regex.capture_names().position(|group| group == Some(*name)),
                (Reference::Name(_), None) => None,
            },
            |written| unresolved.push(written.to_owned()),
        );
        let top_key = key.split('.').next().unwrap_or(key);
        for written in unresolved {
            let message = format!(
                "{key}: `{written}` refers to no capture of this match and is always empty{}",
                split_capture_hint(&written)
            );
            let place = place(Some(index), self.lines.mapping(index, Some(top_key)));
            self.notes.push(format!("{place}: {message}"));
        }
        template
    }
}

/// For `$1_foo` (read as `${1_foo}`): a hint to write `${1}_foo`.
fn split_capture_hint(written: &str) -> String {
    let Some(name) = written.strip_prefix('$') else {
        return String::new();
    };
    let digits = name.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 || digits == name.len() || name.starts_with('{') {
        return String::new();
    }
    let (number, rest) = name.split_at(digits);
    format!(" (it reads as `${{{name}}}`; write `${{{number}}}{rest}` for capture {number})")
}
