//! Line numbers for messages about a mapping file.
//!
//! serde_yaml reports a location for syntax and type errors, but a value it
//! has read carries none. Mapping files are block-style YAML (a top-level
//! `mappings:` sequence of `- match: ...` items and a `defaults:` map), so
//! this scanner finds where each item and each of its top-level keys starts.
//! It only serves messages: when the file's layout is unusual (flow style,
//! anchors) it finds nothing, or a count that disagrees with the parsed
//! mappings, and messages then name the mapping without a line.

/// Where the mappings and their keys start (1-based line numbers).
#[derive(Debug, Default)]
pub(super) struct LineIndex {
    defaults: Option<Block>,
    mappings: Vec<Block>,
}

#[derive(Debug, Default)]
struct Block {
    line: usize,
    keys: Vec<(String, usize)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Other,
    Defaults { key_indent: Option<usize> },
    Mappings { item_indent: Option<usize>, key_indent: usize },
}

impl LineIndex {
    /// Scans `text`; `mapping_count` is how many mappings serde_yaml read,
    /// and the item lines are kept only when the scanner found as many.
    pub(super) fn new(text: &str, mapping_count: usize) -> LineIndex {
        let mut index = LineIndex::default();
        let mut section = Section::Other;
        for (number, line) in text.lines().enumerate() {
            let number = number + 1;
            let body = line.trim_start();
            if body.is_empty() || body.starts_with('#') || line.starts_with("---") {
                continue;
            }
            let indent = line.len() - body.len();
            if indent == 0 && !body.starts_with('-') {
                section = match leading_key(body) {
                    Some("defaults") => {
                        index.defaults = Some(Block { line: number, keys: Vec::new() });
                        Section::Defaults { key_indent: None }
                    }
                    Some("mappings") => Section::Mappings { item_indent: None, key_indent: 0 },
                    _ => Section::Other,
                };
                continue;
            }
            match &mut section {
                Section::Other => {}
                Section::Defaults { key_indent } => {
                    let wanted = *key_indent.get_or_insert(indent);
                    if indent == wanted
                        && let (Some(block), Some(key)) = (&mut index.defaults, leading_key(body))
                    {
                        block.keys.push((key.to_owned(), number));
                    }
                }
                Section::Mappings { item_indent, key_indent } => {
                    let items_at = *item_indent.get_or_insert(indent);
                    if indent == items_at && (body == "-" || body.starts_with("- ")) {
                        let after_dash = body[1..].trim_start();
                        *key_indent = indent + (body.len() - after_dash.len());
                        let mut block = Block { line: number, keys: Vec::new() };
                        if let Some(key) = leading_key(after_dash) {
                            block.keys.push((key.to_owned(), number));
                        }
                        index.mappings.push(block);
                    } else if indent == *key_indent
                        && let (Some(block), Some(key)) = (index.mappings.last_mut(), leading_key(body))
                    {
                        block.keys.push((key.to_owned(), number));
                    }
                }
            }
        }
        if index.mappings.len() != mapping_count {
            index.mappings.clear();
        }
        index
    }

    /// The line of `defaults:`, or of its key `key` when given and found.
    pub(super) fn defaults(&self, key: Option<&str>) -> Option<usize> {
        let block = self.defaults.as_ref()?;
        Some(find_key(block, key))
    }

    /// The line where mapping `index` starts, or its key `key` when given
    /// and found.
    pub(super) fn mapping(&self, index: usize, key: Option<&str>) -> Option<usize> {
        let block = self.mappings.get(index)?;
        Some(find_key(block, key))
    }
}

fn find_key(block: &Block, key: Option<&str>) -> usize {
    key.and_then(|key| block.keys.iter().find(|(name, _)| name == key).map(|(_, line)| *line)).unwrap_or(block.line)
}

/// The key of a `key: value` line (optionally quoted), if it is one.
fn leading_key(body: &str) -> Option<&str> {
    let (key, rest) = if let Some(quoted) = body.strip_prefix('"') {
        let close = quoted.find('"')?;
        (&quoted[..close], &quoted[close + 1..])
    } else if let Some(quoted) = body.strip_prefix('\'') {
        let close = quoted.find('\'')?;
        (&quoted[..close], &quoted[close + 1..])
    } else {
        let end = body.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(body.len());
        (&body[..end], &body[end..])
    };
    let rest = rest.trim_start_matches([' ', '\t']);
    let after_colon = rest.strip_prefix(':')?;
    let separated = after_colon.is_empty() || after_colon.starts_with([' ', '\t']);
    (!key.is_empty() && separated).then_some(key)
}
