//! Name globs of the `[rules]` tables: `*` matches any run of characters (dots
//! included), everything else matches itself.
//!
//! A glob is split at its stars into literal pieces; a name matches when it starts with
//! the first piece, ends with the last, and holds the middle ones in order between them.
//! Taking each middle piece at its leftmost place is always right for `*`-only globs, so
//! matching is one pass over the name: no backtracking, whatever the glob.
//!
//! ```
//! use tessera_rules::NameGlob;
//!
//! let glob = NameGlob::new("api.*.latency").unwrap();
//! assert!(glob.matches(b"api.GET.users.latency"));
//! assert!(!glob.matches(b"db.query.latency"));
//! ```

use memchr::memmem;

/// A compiled name glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameGlob {
    text: String,
    /// The literal pieces between stars; one piece when there is no star.
    pieces: Vec<Vec<u8>>,
}

/// Why a glob is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    /// An empty glob matches nothing a user could mean.
    #[error("an empty glob matches nothing; use \"*\" for every name")]
    Empty,
    /// `|`, `,` and `#` cannot be in a series name.
    #[error("glob `{0}` holds `|`, `,` or `#`, which cannot be in a metric name")]
    Unmatchable(String),
}

impl NameGlob {
    /// Compiles `text`.
    pub fn new(text: &str) -> Result<NameGlob, GlobError> {
        if text.is_empty() {
            return Err(GlobError::Empty);
        }
        if text.contains(['|', ',', '#']) {
            return Err(GlobError::Unmatchable(text.to_owned()));
        }
        let pieces = text.split('*').map(|piece| piece.as_bytes().to_vec()).collect();
        Ok(NameGlob { text: text.to_owned(), pieces })
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &[u8]) -> bool {
        let (first, rest) = self.pieces.split_first().expect("split yields at least one piece");
        let Some((last, middle)) = rest.split_last() else { return name == first.as_slice() };
        if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
            return false;
        }
        let mut between = &name[first.len()..name.len() - last.len()];
        for piece in middle {
            match memmem::find(between, piece) {
                Some(at) => between = &between[at + piece.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_match_any_run_and_literals_match_themselves() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "anything.at.all", true),
            ("api.requests", "api.requests", true),
            ("api.requests", "api.requests2", false),
            ("api.*", "api.", true),
            ("api.*", "api.GET.users", true),
            ("api.*", "db.GET", false),
            ("*.latency", "api.latency", true),
            ("*.latency", "api.latency.p99", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a*bc*bc", "abcbc", true),
            ("a*bc*bc", "abc", false),
            ("ab*ba", "aba", false),
            ("**", "x", true),
        ];
        for (glob, name, expected) in cases {
            assert_eq!(NameGlob::new(glob).unwrap().matches(name.as_bytes()), *expected, "{glob} ~ {name}");
        }
    }

    #[test]
    fn globs_that_can_match_nothing_are_refused() {
        assert_eq!(NameGlob::new(""), Err(GlobError::Empty));
        assert!(matches!(NameGlob::new("a|b"), Err(GlobError::Unmatchable(_))));
        assert!(matches!(NameGlob::new("a,b"), Err(GlobError::Unmatchable(_))));
    }

    proptest::proptest! {
        #[test]
        fn matching_agrees_with_a_backtracking_matcher(glob in "[ab*]{1,6}", name in "[ab]{0,8}") {
            fn reference(glob: &[u8], name: &[u8]) -> bool {
                match glob.split_first() {
                    None => name.is_empty(),
                    Some((b'*', rest)) => (0..=name.len()).any(|skip| reference(rest, &name[skip..])),
                    Some((byte, rest)) => name.first() == Some(byte) && reference(rest, &name[1..]),
                }
            }
            let compiled = NameGlob::new(&glob).unwrap();
            proptest::prop_assert_eq!(compiled.matches(name.as_bytes()), reference(glob.as_bytes(), name.as_bytes()));
        }
    }
}
