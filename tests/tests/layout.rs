//! How the code is laid out, checked: no top-level modules of a crate import each
//! other in a circle (`crate::b` in `a` and `crate::a` in `b`, or longer: `a` → `b` →
//! `c` → `a`; outside comments and tests), so that each crate's modules form layers a
//! reader can follow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src` belongs to (`flush` for `flush.rs` and `flush/x.rs`).
fn top_module(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

/// The code of `text` before its test module (`#[cfg(test)]` then `mod`); a
/// `#[cfg(test)]` on a single item does not end the code.
fn code_before_tests(text: &str) -> &str {
    let mut rest = text;
    let mut offset = 0;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        if after.starts_with("mod ") || after.starts_with("pub mod ") {
            return &text[..offset + at];
        }
        offset += at + 1;
        rest = &rest[at + 1..];
    }
    text
}

/// Modules named as `crate::<module>` in the code of `text` (not in comments, not in the
/// `#[cfg(test)]` part at the end of a file).
fn imported_modules(text: &str) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    let code = code_before_tests(text);
    for line in code.lines().filter(|line| !line.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() {
                modules.insert(name);
            }
        }
    }
    modules
}

/// Circles in `imports` (module → modules it names), each as the path that closes it
/// (`a -> b -> c -> a`): a depth-first search reports the circle each back edge closes,
/// so that the tree has a circle exactly when this is not empty.
fn circles_in(imports: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit<'a>(
        module: &'a str,
        imports: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        circles: &mut Vec<Vec<String>>,
    ) {
        if let Some(at) = path.iter().position(|on_path| *on_path == module) {
            let mut circle: Vec<String> = path[at..].iter().map(|name| (*name).to_owned()).collect();
            circle.push(module.to_owned());
            circles.push(circle);
            return;
        }
        if done.contains(module) {
            return;
        }
        path.push(module);
        for next in imports.get(module).into_iter().flatten() {
            visit(next, imports, path, done, circles);
        }
        path.pop();
        done.insert(module);
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for module in imports.keys() {
        visit(module, imports, &mut Vec::new(), &mut done, &mut circles);
    }
    circles
}

#[test]
fn no_modules_of_a_crate_import_each_other_in_a_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut circles = Vec::new();
    let mut crates_seen = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        crates_seen += 1;
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let module = top_module(&src, &file);
            if module == "lib" || module == "main" || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let found: Vec<String> = imported_modules(&text).into_iter().filter(|other| *other != module).collect();
            imports.entry(module).or_default().extend(found);
        }
        for circle in circles_in(&imports) {
            circles.push(format!("{}: {}", src.display(), circle.join(" -> ")));
        }
    }
    assert!(crates_seen >= 8, "found {crates_seen} crates under {}", crates.display());
    assert!(circles.is_empty(), "modules that import each other:\n{}", circles.join("\n"));
}

#[test]
fn circles_of_any_length_are_found_and_layers_are_not() {
    let graph = |edges: &[(&str, &str)]| {
        let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            imports.entry((*from).to_owned()).or_default().insert((*to).to_owned());
        }
        imports
    };
    let layers = graph(&[("a", "b"), ("a", "c"), ("b", "c"), ("d", "c")]);
    assert!(circles_in(&layers).is_empty());
    assert_eq!(circles_in(&graph(&[("a", "b"), ("b", "a")])), [["a", "b", "a"]]);
    assert_eq!(circles_in(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])), [["a", "b", "c", "a"]]);
}

#[test]
fn the_scan_sees_imports_and_skips_comments() {
    let text = "use crate::flush::Flusher;\n// crate::ignored\n/// see [`crate::docs`]\nlet x = crate::metrics::labels();\n\
                #[cfg(test)]\nfn helper() {}\nuse crate::later;\n#[cfg(test)]\nmod tests {\n    use crate::testing;\n}\n";
    let found: Vec<String> = imported_modules(text).into_iter().collect();
    assert_eq!(found, ["flush", "later", "metrics"], "a test-only item does not end the code; the test module does");
}

/// `SystemTime::now` outside the `#[cfg(test)]` part of `text` and outside comments.
fn reads_the_wall_clock(text: &str) -> bool {
    code_before_tests(text)
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .any(|line| line.contains("SystemTime::now"))
}

/// One clock: every crate reads the wall clock through `tessera_core::clock`, so no module
/// takes it from a sibling or keeps its own copy.
#[test]
fn the_wall_clock_is_read_only_in_core_clock() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let crate_dir = entry.unwrap().path();
        for dir in ["src", "examples"] {
            if crate_dir.join(dir).is_dir() {
                rust_files(&crate_dir.join(dir), &mut files);
            }
        }
    }
    rust_files(&root.join("benches"), &mut files);
    assert!(files.len() > 100, "found {} files", files.len());
    let clock = Path::new("crates/core/src/clock.rs");
    let readers: Vec<String> = files
        .iter()
        .filter(|file| !file.ends_with(clock))
        .filter(|file| reads_the_wall_clock(&std::fs::read_to_string(file).unwrap()))
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        readers.is_empty(),
        "files that read SystemTime::now instead of tessera_core::clock:\n{}",
        readers.join("\n")
    );
    assert!(reads_the_wall_clock(&std::fs::read_to_string(root.join(clock)).unwrap()));
}

/// The modules of `src` (a crate's) that files of its top-level module `module` name.
fn imports_of(src: &Path, module: &str) -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = BTreeSet::new();
    for file in files.iter().filter(|file| top_module(src, file) == module) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        found.extend(imported_modules(&std::fs::read_to_string(file).unwrap()));
    }
    found.remove(module);
    found
}

/// Each daemon's intake is the first stage: it reads and answers, and hands on what it
/// read in types of its own. It names no later stage (the collector's windows, the
/// aggregator's tiles, the ingester's writer, queue or sink); those import it.
#[test]
fn no_daemon_s_intake_imports_from_the_stages_after_it() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut wrong = Vec::new();
    for daemon in ["collector", "aggregator", "ingester"] {
        let src = crates.join(daemon).join("src");
        assert!(src.join("intake.rs").is_file(), "{daemon} has an intake module");
        let imports = imports_of(&src, "intake");
        for module in imports.iter().filter(|module| *module != "config") {
            wrong.push(format!("{daemon}'s intake imports crate::{module}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The scan sees the imports the other way round.
    assert!(imports_of(&crates.join("aggregator/src"), "tile").contains("intake"));
    assert!(imports_of(&crates.join("ingester/src"), "writer").contains("intake"));
}
