//! A sampled report as pprof's `Profile` protobuf (gzipped) or as an SVG
//! flame graph.
//!
//! Each stack is read root first as: a frame named after the thread
//! (`[udp-reader-0]`), then the functions from `main` or the thread's entry
//! down to the sampled one. pprof wants the leaf first, so its samples list
//! locations in the other order. One location per function name (line
//! numbers of the call sites are not kept), as pprof-rs does.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;
use pprof::Report;
use prost::Message;

/// Every sampled stack, root first, with its sample count.
fn stacks(report: &Report) -> Vec<(Vec<String>, i64)> {
    let mut stacks: Vec<(Vec<String>, i64)> = report
        .data
        .iter()
        .map(|(frames, count)| {
            let mut names = vec![format!("[{}]", frames.thread_name_or_id())];
            // pprof-rs lists frames leaf first; an inlined frame holds several symbols, innermost first.
            for frame in frames.frames.iter().rev() {
                for symbol in frame.iter().rev() {
                    names.push(function_name(&symbol.sys_name()));
                }
            }
            (names, *count as i64)
        })
        .collect();
    stacks.sort();
    stacks
}

/// A symbol demangled with its whole path and without its hash
/// (`tessera_core::parse::parse_line`), which is what `pprof -focus` and a
/// reader of the flame graph want; pprof-rs's own demangling keeps only the
/// last segment of v0-mangled names.
fn function_name(mangled: &str) -> String {
    format!("{:#}", rustc_demangle::demangle(mangled))
}

/// The profile as pprof's protobuf, gzipped (what `pprof` and `go tool pprof` read);
/// `started_ns`: when sampling began, unix nanoseconds.
pub fn pprof_gzipped(report: &Report, frequency_hz: u32, started_ns: i64, duration: Duration) -> Vec<u8> {
    let mut strings = Strings::default();
    let (samples_type, count_unit) = (strings.id("samples"), strings.id("count"));
    let (cpu_type, nanos_unit) = (strings.id("cpu"), strings.id("nanoseconds"));
    let thread_key = strings.id("thread");
    let period_ns = 1_000_000_000 / i64::from(frequency_hz.max(1));
    let mut profile = Profile {
        sample_type: vec![
            ValueType { r#type: samples_type, unit: count_unit },
            ValueType { r#type: cpu_type, unit: nanos_unit },
        ],
        time_nanos: started_ns,
        duration_nanos: duration.as_nanos() as i64,
        period_type: Some(ValueType { r#type: cpu_type, unit: nanos_unit }),
        period: period_ns,
        ..Profile::default()
    };
    let mut locations: HashMap<String, u64> = HashMap::new();
    for (names, count) in stacks(report) {
        let thread = strings.id(names[0].trim_start_matches('[').trim_end_matches(']'));
        let mut location_ids = Vec::with_capacity(names.len());
        for name in names.iter().rev() {
            let next_id = locations.len() as u64 + 1;
            let id = *locations.entry(name.clone()).or_insert_with(|| {
                let name_id = strings.id(name);
                profile.function.push(Function {
                    id: next_id,
                    name: name_id,
                    system_name: name_id,
                    ..Function::default()
                });
                profile.location.push(Location { id: next_id, line: vec![Line { function_id: next_id, line: 0 }] });
                next_id
            });
            location_ids.push(id);
        }
        profile.sample.push(Sample {
            location_id: location_ids,
            value: vec![count, count * period_ns],
            label: vec![Label { key: thread_key, str: thread }],
        });
    }
    profile.string_table = strings.table;
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    gzip.write_all(&profile.encode_to_vec()).expect("writing to a Vec cannot fail");
    gzip.finish().expect("writing to a Vec cannot fail")
}

/// pprof's string table: index 0 is the empty string.
struct Strings {
    table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Self {
        Strings { table: vec![String::new()], ids: HashMap::from([(String::new(), 0)]) }
    }
}

impl Strings {
    fn id(&mut self, text: &str) -> i64 {
        if let Some(id) = self.ids.get(text) {
            return *id;
        }
        let id = self.table.len() as i64;
        self.table.push(text.to_owned());
        self.ids.insert(text.to_owned(), id);
        id
    }
}

/// pprof's `profile.proto`, the fields tessera writes.
#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// Width of the flame graph, in SVG units.
const WIDTH: f64 = 1200.0;
/// Height of one frame.
const FRAME_HEIGHT: f64 = 16.0;

/// A node of the merged call tree.
#[derive(Default)]
struct Node {
    count: i64,
    children: Vec<(String, Node)>,
}

impl Node {
    fn add(&mut self, names: &[String], count: i64) {
        self.count += count;
        let Some((first, rest)) = names.split_first() else { return };
        let index = match self.children.iter().position(|(name, _)| name == first) {
            Some(index) => index,
            None => {
                self.children.push((first.clone(), Node::default()));
                self.children.len() - 1
            }
        };
        self.children[index].1.add(rest, count);
    }

    fn depth(&self) -> usize {
        self.children.iter().map(|(_, child)| child.depth() + 1).max().unwrap_or(0)
    }
}

/// The profile as an SVG flame graph: roots (threads) at the bottom, each
/// frame as wide as its share of the samples, its name and share in a tooltip.
pub fn flamegraph_svg(report: &Report) -> String {
    let mut root = Node::default();
    for (names, count) in stacks(report) {
        root.add(&names, count);
    }
    let depth = root.depth();
    let height = (depth as f64 + 2.0) * FRAME_HEIGHT;
    let mut svg = String::with_capacity(4096);
    let _ = write!(
        svg,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" font-family=\"monospace\" font-size=\"11\">\n\
         <text x=\"4\" y=\"12\">tessera CPU profile: {} samples</text>\n",
        root.count
    );
    if root.count > 0 {
        draw(&mut svg, &root, 0.0, height, root.count);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Draws `node`'s children in the row just above `bottom` (SVG y grows
/// downwards), and theirs above that.
fn draw(svg: &mut String, node: &Node, x: f64, bottom: f64, total: i64) {
    let mut left = x;
    let y = bottom - FRAME_HEIGHT;
    for (name, child) in &node.children {
        let width = child.count as f64 / total as f64 * WIDTH;
        let share = child.count as f64 * 100.0 / total as f64;
        let title = escape(name);
        // Warm colours, varied by name so neighbours differ.
        let hue = name.bytes().fold(0u32, |hash, byte| hash.wrapping_mul(31).wrapping_add(u32::from(byte))) % 40;
        let _ = write!(
            svg,
            "<g><title>{title} ({} samples, {share:.2} %)</title><rect x=\"{left:.2}\" y=\"{y:.1}\" width=\"{width:.2}\" \
             height=\"{:.1}\" fill=\"hsl({hue}, 85%, 60%)\"/>",
            child.count,
            FRAME_HEIGHT - 1.0
        );
        // About 7 units a character: show a name only where it fits.
        let fits = (width / 7.0) as usize;
        if fits >= 4 {
            // Cut the name, then escape it: cutting an escaped name could split an entity.
            let shown: String = name.chars().take(fits.saturating_sub(1)).collect();
            let shown = escape(&shown);
            let _ = write!(svg, "<text x=\"{:.2}\" y=\"{:.1}\">{shown}</text>", left + 2.0, y + FRAME_HEIGHT - 4.0);
        }
        svg.push_str("</g>\n");
        draw(svg, child, left, y, total);
        left += width;
    }
}

fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_for_xml() {
        assert_eq!(escape("<T as Iterator>::next & 'x'"), "&lt;T as Iterator&gt;::next &amp; &apos;x&apos;");
    }

    #[test]
    fn names_keep_their_path_and_lose_their_hash() {
        assert_eq!(
            function_name("_ZN12tessera_core5parse10parse_line17h0123456789abcdefE"),
            "tessera_core::parse::parse_line"
        );
        assert_eq!(function_name("_RNvNtCs1234_12tessera_core5parse10parse_line"), "tessera_core::parse::parse_line");
        assert_eq!(function_name("not_mangled"), "not_mangled");
    }

    #[test]
    fn the_call_tree_merges_common_prefixes() {
        let mut root = Node::default();
        let stack = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
        root.add(&stack(&["[t]", "main", "parse"]), 3);
        root.add(&stack(&["[t]", "main", "merge"]), 1);
        assert_eq!(root.count, 4);
        assert_eq!(root.depth(), 3);
        let main = &root.children[0].1.children[0].1;
        assert_eq!(main.children.len(), 2);
    }
}
