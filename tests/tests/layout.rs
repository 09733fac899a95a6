//! How the code is laid out, checked: no two top-level modules of a crate
//! import each other (`crate::a` in `b` and `crate::b` in `a`, outside comments
//! and tests), so that each crate's modules form layers a reader can follow.

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

/// Modules named as `crate::<module>` in the code of `text` (not in comments, not in the
/// `#[cfg(test)]` part at the end of a file).
fn imported_modules(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut modules = BTreeSet::new();
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

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
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
        for (module, others) in &imports {
            for other in others {
                if module < other && imports.get(other).is_some_and(|back| back.contains(module)) {
                    circles.push(format!("{}: {module} <-> {other}", src.display()));
                }
            }
        }
    }
    assert!(crates_seen >= 8, "found {crates_seen} crates under {}", crates.display());
    assert!(circles.is_empty(), "modules that import each other:\n{}", circles.join("\n"));
}

#[test]
fn the_scan_sees_imports_and_skips_comments() {
    let text = "use crate::flush::Flusher;\n// crate::ignored\n/// see [`crate::docs`]\nlet x = crate::metrics::labels();\n#[cfg(test)]\nuse crate::testing;\n";
    let found: Vec<String> = imported_modules(text).into_iter().collect();
    assert_eq!(found, ["flush", "metrics"]);
}
