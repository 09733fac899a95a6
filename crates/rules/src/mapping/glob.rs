//! Glob rules as one trie per statsd_exporter metric type, matched without
//! backtracking.
//!
//! statsd_exporter's FSM (`pkg/mapper/fsm/fsm.go`) stores every glob rule in
//! a tree keyed by dot-separated components: one root per metric type
//! (`counter`, `gauge`, `observer`), a literal edge per component text and one
//! `*` edge that matches any single component, even an empty one. A rule
//! without `match_metric_type` is inserted under all three roots.
//!
//! ```text
//!  counter ── api ──┬── GET ── *      (rule 0: api.GET.*)
//!                   └── *  ── users   (rule 1: api.*.users)
//! ```
//!
//! statsd_exporter walks that tree depth first and backtracks. This module
//! walks it breadth first instead: it keeps the set of nodes the name's
//! prefix has reached (each with a bitmask of the components a `*` took) and
//! advances all of them one component at a time, like a Thompson NFA. Every
//! node has one path from its root, so the set never holds a node twice and
//! never outgrows the tree; in the common case it holds one or two nodes, and
//! each step is one hash lookup per node, whatever the number of rules.
//!
//! Which rule wins when several match, as in statsd_exporter:
//! - **ordered** (the default): the first rule in file order;
//! - **`glob_disable_ordering: true`**: a literal component beats `*`, from
//!   the left: the first match of a depth-first walk that tries the literal
//!   edge before `*`. The breadth-first set keeps exactly that order (each
//!   node pushes its literal child before its `*` child), so the winner is
//!   the first matching node of the final set.
//!
//! Each node also knows the fewest and most components still needed to reach
//! a rule below it, so names of the wrong length die at the first step.

use std::collections::HashMap;

/// Most components a glob rule may have: the captures of a walk are a `u64`
/// bitmask. Longer names cannot match any rule.
pub(super) const MAX_COMPONENTS: usize = 64;

/// statsd_exporter's three metric types, the roots of the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TypeClass {
    /// statsd `c`.
    Counter,
    /// statsd `g`.
    Gauge,
    /// statsd `ms`, `h` and `d`.
    Observer,
}

impl TypeClass {
    pub(super) const ALL: [TypeClass; 3] = [TypeClass::Counter, TypeClass::Gauge, TypeClass::Observer];

    fn root(self) -> usize {
        match self {
            TypeClass::Counter => 0,
            TypeClass::Gauge => 1,
            TypeClass::Observer => 2,
        }
    }
}

/// The glob rules of one mapping file.
#[derive(Debug)]
pub(super) struct GlobMatcher {
    /// Nodes; `0..3` are the roots. A child is always created after its
    /// parent, so a child's index is larger than its parent's.
    nodes: Vec<Node>,
    ordered: bool,
}

#[derive(Debug, Default, Clone)]
struct Node {
    literal: HashMap<Box<str>, u32>,
    star: Option<u32>,
    /// The rule (mapping index) that ends here, if any.
    rule: Option<u32>,
    /// Fewest further components that reach a rule (`u32::MAX`: none does).
    min_rest: u32,
    /// Most further components that reach a rule.
    max_rest: u32,
}

impl Node {
    fn fits(&self, rest: usize) -> bool {
        let rest = rest as u64;
        rest >= u64::from(self.min_rest) && rest <= u64::from(self.max_rest)
    }
}

/// Buffers reused across calls to [`GlobMatcher::find`].
#[derive(Debug, Default, Clone)]
pub(crate) struct GlobScratch {
    current: Vec<Walk>,
    next: Vec<Walk>,
}

#[derive(Debug, Clone, Copy)]
struct Walk {
    node: u32,
    /// Bit `i` is set when component `i` was taken by a `*`.
    stars: u64,
}

/// A glob rule that matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GlobMatch {
    /// The mapping index of the rule.
    pub rule: u32,
    /// Bit `i` is set when component `i` of the name is a capture.
    pub stars: u64,
}

impl GlobMatcher {
    /// An empty matcher; `ordered` is `!glob_disable_ordering`.
    pub(super) fn new(ordered: bool) -> GlobMatcher {
        GlobMatcher { nodes: vec![Node::default(); TypeClass::ALL.len()], ordered }
    }

    /// Adds the rule `rule` for `pattern` (validated: at most
    /// [`MAX_COMPONENTS`] components, `*` only as a whole component) under the
    /// root of `class`, or under every root when `class` is `None`.
    ///
    /// A pattern already held by an earlier rule under the same root keeps
    /// the earlier rule: the later one can never win.
    pub(super) fn insert(&mut self, pattern: &str, class: Option<TypeClass>, rule: u32) {
        for root in TypeClass::ALL {
            if class.is_some_and(|wanted| wanted != root) {
                continue;
            }
            let mut node = root.root();
            for component in pattern.split('.') {
                node = self.child_or_insert(node, component);
            }
            let end = &mut self.nodes[node];
            if end.rule.is_none() {
                end.rule = Some(rule);
            }
        }
    }

    fn child_or_insert(&mut self, parent: usize, component: &str) -> usize {
        let existing =
            if component == "*" { self.nodes[parent].star } else { self.nodes[parent].literal.get(component).copied() };
        if let Some(child) = existing {
            return child as usize;
        }
        let child = self.nodes.len();
        let child_id = u32::try_from(child).unwrap_or(u32::MAX);
        self.nodes.push(Node::default());
        if component == "*" {
            self.nodes[parent].star = Some(child_id);
        } else {
            self.nodes[parent].literal.insert(component.into(), child_id);
        }
        child
    }

    /// Computes each node's remaining-length bounds; call once after the
    /// last [`GlobMatcher::insert`].
    pub(super) fn finish(&mut self) {
        for index in (0..self.nodes.len()).rev() {
            let node = &self.nodes[index];
            let (mut min_rest, mut max_rest) = match node.rule {
                Some(_) => (0u32, 0u32),
                None => (u32::MAX, 0u32),
            };
            let children = node.literal.values().copied().chain(node.star);
            for child in children {
                let child = &self.nodes[child as usize];
                if child.min_rest == u32::MAX {
                    continue;
                }
                min_rest = min_rest.min(child.min_rest.saturating_add(1));
                max_rest = max_rest.max(child.max_rest.saturating_add(1));
            }
            let node = &mut self.nodes[index];
            node.min_rest = min_rest;
            node.max_rest = max_rest;
        }
    }

    /// The rule that `name` (a statsd name, components separated by `.`)
    /// matches under the root of `class`, if any.
    pub(super) fn find(&self, name: &str, class: TypeClass, scratch: &mut GlobScratch) -> Option<GlobMatch> {
        let components = name.bytes().filter(|&byte| byte == b'.').count() + 1;
        if components > MAX_COMPONENTS {
            return None;
        }
        let root = class.root();
        if !self.nodes[root].fits(components) {
            return None;
        }
        let GlobScratch { current, next } = scratch;
        current.clear();
        current.push(Walk { node: root as u32, stars: 0 });
        for (index, component) in name.split('.').enumerate() {
            let rest = components - index - 1;
            next.clear();
            for walk in current.iter() {
                let node = &self.nodes[walk.node as usize];
                if let Some(&child) = node.literal.get(component)
                    && self.nodes[child as usize].fits(rest)
                {
                    next.push(Walk { node: child, stars: walk.stars });
                }
                if let Some(child) = node.star
                    && self.nodes[child as usize].fits(rest)
                {
                    next.push(Walk { node: child, stars: walk.stars | (1u64 << index) });
                }
            }
            std::mem::swap(current, next);
            if current.is_empty() {
                return None;
            }
        }
        let mut ends = current.iter().filter_map(|walk| {
            let rule = self.nodes[walk.node as usize].rule?;
            Some(GlobMatch { rule, stars: walk.stars })
        });
        if self.ordered { ends.min_by_key(|found| found.rule) } else { ends.next() }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// statsd_exporter's glob rules read literally: every rule of `class` whose components
    /// are each `*` or equal to the name's; the first in file order when `ordered`, else
    /// the one with a literal before a `*` furthest left (the earliest of equal patterns).
    fn naive(rules: &[(String, Option<TypeClass>)], ordered: bool, name: &str, class: TypeClass) -> Option<GlobMatch> {
        let parts: Vec<&str> = name.split('.').collect();
        let matching = rules.iter().enumerate().filter_map(|(index, (pattern, rule_class))| {
            if rule_class.is_some_and(|wanted| wanted != class) {
                return None;
            }
            let components: Vec<&str> = pattern.split('.').collect();
            let fits = components.len() == parts.len()
                && components.iter().zip(&parts).all(|(component, part)| *component == "*" || component == part);
            let stars: Vec<bool> = components.iter().map(|component| *component == "*").collect();
            fits.then_some((index, stars))
        });
        let best = if ordered {
            matching.min_by_key(|(index, _)| *index)
        } else {
            matching.min_by(|(a_index, a_stars), (b_index, b_stars)| (a_stars, a_index).cmp(&(b_stars, b_index)))
        };
        best.map(|(index, stars)| GlobMatch {
            rule: index as u32,
            stars: stars.iter().enumerate().filter(|(_, star)| **star).fold(0, |mask, (at, _)| mask | (1u64 << at)),
        })
    }

    fn component() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("a"), Just("b"), Just("*")]
    }

    fn class() -> impl Strategy<Value = Option<TypeClass>> {
        prop_oneof![
            Just(None),
            Just(Some(TypeClass::Counter)),
            Just(Some(TypeClass::Gauge)),
            Just(Some(TypeClass::Observer))
        ]
    }

    proptest! {
        /// The breadth-first trie finds the rule and the captures the literal reading
        /// does, ordered or not, for every name and type.
        #[test]
        fn the_trie_agrees_with_the_literal_reading(
            rules in prop::collection::vec((prop::collection::vec(component(), 1..5), class()), 0..12),
            names in prop::collection::vec(prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c"), Just("")], 1..5), 1..20),
            ordered in any::<bool>(),
        ) {
            let rules: Vec<(String, Option<TypeClass>)> =
                rules.into_iter().map(|(components, class)| (components.join("."), class)).collect();
            let mut matcher = GlobMatcher::new(ordered);
            for (index, (pattern, class)) in rules.iter().enumerate() {
                matcher.insert(pattern, *class, index as u32);
            }
            matcher.finish();
            let mut scratch = GlobScratch::default();
            for name in names {
                let name = name.join(".");
                for class in TypeClass::ALL {
                    let expected = naive(&rules, ordered, &name, class);
                    prop_assert_eq!(matcher.find(&name, class, &mut scratch), expected, "{} as {:?}", name, class);
                }
            }
        }
    }
}
