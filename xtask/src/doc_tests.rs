//! Which packages have doc tests: `cargo test --doc` runs rustdoc over every library of the
//! workspace (about ten seconds), and none of them had one. A package has doc tests when a
//! doc comment of its sources holds a code block rustdoc would run (a fence without a
//! language, or whose words are all Rust's or rustdoc's attributes), or its docs are
//! included from a file (`doc = include_str!`), which is counted as having them unread.

use crate::scan::{Package, rust_files};
use anyhow::{Context, Result};

/// The names of the packages (of `packages`) whose library sources hold doc tests (rustdoc
/// tests libraries only).
pub(crate) fn packages_with_doc_tests(packages: &[Package]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for package in packages.iter().filter(|p| p.dir.join("src").join("lib.rs").exists()) {
        for file in rust_files(&package.dir.join("src"))? {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            if has_doc_tests(&text) {
                names.push(package.name.clone());
                break;
            }
        }
    }
    Ok(names)
}

/// Whether `src` (one source file) has a doc comment with a code block rustdoc would test.
fn has_doc_tests(src: &str) -> bool {
    let mut in_block = false;
    for line in src.lines() {
        let line = line.trim_start();
        if (line.starts_with("#![doc") || line.starts_with("#[doc")) && line.contains("include_str!") {
            return true;
        }
        let Some(doc) = line.strip_prefix("///").or_else(|| line.strip_prefix("//!")) else {
            continue;
        };
        let doc = doc.trim();
        let Some(info) = doc.strip_prefix("```").or_else(|| doc.strip_prefix("~~~")) else {
            continue;
        };
        if in_block {
            in_block = false;
            continue;
        }
        in_block = true;
        if is_rust(info) {
            return true;
        }
    }
    false
}

/// Whether a fence's info string marks Rust to rustdoc: no word, the word `rust`, or only
/// rustdoc's own attributes (`ignore` blocks are compiled too, and counted).
fn is_rust(info: &str) -> bool {
    const ATTRIBUTES: [&str; 7] = [
        "ignore",
        "should_panic",
        "no_run",
        "compile_fail",
        "test_harness",
        "standalone_crate",
        "allow_fail",
    ];
    let words: Vec<&str> = info
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    words.is_empty()
        || words.contains(&"rust")
        || words
            .iter()
            .all(|w| ATTRIBUTES.contains(w) || w.starts_with("edition") || w.starts_with("ignore-"))
}

#[cfg(test)]
mod tests {
    use super::has_doc_tests;

    #[test]
    fn only_code_blocks_rustdoc_runs_count() {
        assert!(!has_doc_tests("//! ```text\n//! a b\n//! ```\n"));
        assert!(!has_doc_tests(
            "//! ```hcl\n//! a = 1\n//! ```\n/// ```json\n/// {}\n/// ```\n"
        ));
        assert!(!has_doc_tests("// ```\n// not a doc comment\n// ```\n"));
        assert!(has_doc_tests("/// ```\n/// let a = 1;\n/// ```\n"));
        assert!(has_doc_tests("    /// ```rust,no_run\n    /// f();\n    /// ```\n"));
        assert!(has_doc_tests("//! ```should_panic\n//! panic!();\n//! ```\n"));
        assert!(has_doc_tests("#![doc = include_str!(\"../README.md\")]\n"));
        // A closing fence is not taken for an opening one: the second block is Rust.
        assert!(has_doc_tests(
            "//! ```text\n//! x\n//! ```\n//! ```\n//! f();\n//! ```\n"
        ));
    }
}
