//! `cargo xtask fn-lengths [--max N]`: the non-test functions longer than N lines (default
//! 100), longest first, across the workspace's sources (`src/`, `examples/`, `build.rs`).
//!
//! A function's length counts from its `fn` line to its closing brace. Test code is left
//! out: `tests/` and `benches/` directories, `tests.rs` files, and items under
//! `#[cfg(test)]`, `#[test]` or `#[tokio::test]`.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

use crate::scan::{self, Tok, Token};

/// One function found too long.
#[derive(Debug, PartialEq, Eq)]
struct Long {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
}

/// Parses `[--max N]` and prints each function over the limit; fails when there is one.
pub(crate) fn fn_lengths(root: &Path, args: &[String]) -> Result<()> {
    let max = match args {
        [] => 100,
        [flag, n] if flag == "--max" => n
            .parse()
            .with_context(|| format!("fn-lengths: {n:?} is not a number"))?,
        _ => bail!("usage: cargo xtask fn-lengths [--max N]"),
    };
    let mut long = Vec::new();
    for package in scan::packages(root)? {
        for file in source_files(&package.dir)? {
            let src = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let shown = file.strip_prefix(root).unwrap_or(&file).to_path_buf();
            long.extend(
                functions(&scan::tokenize(&src))
                    .into_iter()
                    .filter(|(_, _, lines)| *lines > max)
                    .map(|(line, name, lines)| Long {
                        file: shown.clone(),
                        line,
                        name,
                        lines,
                    }),
            );
        }
    }
    long.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.file.cmp(&b.file)));
    for f in &long {
        println!("{:>4} lines  {}:{}  {}", f.lines, f.file.display(), f.line, f.name);
    }
    if !long.is_empty() {
        bail!("{} non-test function(s) over {max} lines", long.len());
    }
    println!("fn-lengths: no non-test function over {max} lines");
    Ok(())
}

/// A package's non-test sources: `src/`, `examples/` and `build.rs`, without `tests.rs`
/// files or anything under a `tests/` or `benches/` directory.
fn source_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = scan::rust_files(&dir.join("src"))?;
    files.extend(scan::rust_files(&dir.join("examples"))?);
    let build = dir.join("build.rs");
    if build.exists() {
        files.push(build);
    }
    files.retain(|f| {
        let rel = f.strip_prefix(dir).unwrap_or(f);
        !rel.ends_with("tests.rs")
            && !rel
                .components()
                .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "benches")
    });
    Ok(files)
}

/// Each non-test function with a body: its `fn` line, name and length in lines.
fn functions(tokens: &[Token]) -> Vec<(usize, String, usize)> {
    let mut found = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        if token.test || !token.is_ident("fn") {
            continue;
        }
        let Some(name) = tokens.get(i + 1).and_then(Token::ident) else {
            continue;
        };
        if let Some(close) = body_end(tokens, i + 2) {
            found.push((token.line, name.to_owned(), tokens[close].line - token.line + 1));
        }
    }
    found
}

/// The closing brace of the body of the function whose signature continues at `i`, or
/// `None` for a declaration without one (`fn f();`).
fn body_end(tokens: &[Token], i: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (k, token) in tokens.iter().enumerate().skip(i) {
        match token.tok {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return None,
            Tok::Punct('{') if depth == 0 => return scan::matching(tokens, k, '{', '}'),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_bodies_and_skips_tests_and_declarations() {
        let src = "trait T { fn decl(&self) -> [u8; 2]; }\nfn a() -> [u8; 2] {\n    [0; 2]\n}\n#[test]\nfn t() {\n}\n";
        let found = functions(&scan::tokenize(src));
        assert_eq!(found, [(2, "a".to_owned(), 3)]);
    }
}
