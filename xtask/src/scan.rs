//! A small Rust source scanner for the hygiene checks (`cycles`, `fn-lengths`): literals and
//! comments blanked, a flat token stream with line numbers, test items marked, and the
//! workspace's crates and source files. Not a parser: it knows just enough of the grammar to
//! find `use` trees, paths, module declarations and function bodies in rustfmt-shaped code.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// One token of code: an identifier (or keyword or number), `::`, or one other character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    /// An identifier, keyword, lifetime name or number.
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other single character of code.
    Punct(char),
}

/// A token with the 1-based line it starts on, and whether it belongs to test-only code.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) line: usize,
    pub(crate) test: bool,
}

impl Token {
    pub(crate) fn is_ident(&self, word: &str) -> bool {
        matches!(&self.tok, Tok::Ident(w) if w == word)
    }

    pub(crate) fn is_punct(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }

    pub(crate) fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(w) => Some(w),
            _ => None,
        }
    }
}

/// `src` with comments and string, byte-string, raw-string and char literals replaced by
/// spaces (newlines kept, so lines still count), leaving only code to scan.
pub(crate) fn sanitize(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < chars.len() {
        let end = literal_or_comment_end(&chars, i);
        if end > i {
            out.extend(chars[i..end].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Where the comment or literal starting at `i` ends (exclusive), or `i` when none starts there.
fn literal_or_comment_end(chars: &[char], i: usize) -> usize {
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    let after_ident = i > 0 && (at(i - 1).is_alphanumeric() || at(i - 1) == '_');
    match at(i) {
        '/' if at(i + 1) == '/' => (i..chars.len()).find(|&k| chars[k] == '\n').unwrap_or(chars.len()),
        '/' if at(i + 1) == '*' => block_comment_end(chars, i),
        '"' => quoted_end(chars, i + 1, '"'),
        '\'' if at(i + 1) == '\\' => quoted_end(chars, i + 1, '\''),
        '\'' if at(i + 2) == '\'' => i + 3,
        'r' | 'b' | 'c' if !after_ident => raw_string_end(chars, i).unwrap_or(i),
        _ => i,
    }
}

fn block_comment_end(chars: &[char], start: usize) -> usize {
    let mut depth = 0usize;
    let mut k = start;
    while k + 1 < chars.len() {
        match (chars[k], chars[k + 1]) {
            ('/', '*') => {
                depth += 1;
                k += 2;
            }
            ('*', '/') => {
                depth -= 1;
                k += 2;
                if depth == 0 {
                    return k;
                }
            }
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of a quoted literal whose body starts at `k`, honouring backslash escapes.
fn quoted_end(chars: &[char], mut k: usize, quote: char) -> usize {
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            c if c == quote => return k + 1,
            _ => k += 1,
        }
    }
    chars.len()
}

/// The end of `r"…"`, `r#"…"#`, `br"…"` or `cr"…"` starting at `i`, if one starts there.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut k = i;
    if matches!(chars[k], 'b' | 'c') {
        k += 1;
    }
    if chars.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let hashes = chars[k..].iter().take_while(|&&c| c == '#').count();
    k += hashes;
    if chars.get(k) != Some(&'"') {
        return None;
    }
    k += 1;
    while k < chars.len() {
        if chars[k] == '"' && chars[k + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(chars.len())
}

/// The tokens of sanitized source, with test-only items marked (see [`mark_tests`]).
pub(crate) fn tokenize(src: &str) -> Vec<Token> {
    let code = sanitize(src);
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            tokens.push(Token {
                tok: Tok::Ident(word),
                line,
                test: false,
            });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token {
                tok: Tok::PathSep,
                line,
                test: false,
            });
            i += 2;
        } else {
            tokens.push(Token {
                tok: Tok::Punct(c),
                line,
                test: false,
            });
            i += 1;
        }
    }
    mark_tests(&mut tokens);
    tokens
}

/// Marks the items under `#[cfg(test)]`, `#[test]` or `#[<runtime>::test]` (with any
/// attributes between) as test code, each whole item: to its `;` or its closing brace.
fn mark_tests(tokens: &mut [Token]) {
    let mut i = 0;
    while i < tokens.len() {
        let Some(attr_end) = attribute_end(tokens, i) else {
            i += 1;
            continue;
        };
        if !is_test_attribute(&tokens[i + 2..attr_end - 1]) {
            i = attr_end;
            continue;
        }
        let mut item = attr_end;
        while let Some(next) = attribute_end(tokens, item) {
            item = next;
        }
        let end = item_end(tokens, item);
        for token in &mut tokens[i..end] {
            token.test = true;
        }
        i = end;
    }
}

/// The index just past the `#[…]` attribute starting at `i`, if one starts there.
fn attribute_end(tokens: &[Token], i: usize) -> Option<usize> {
    if !tokens.get(i)?.is_punct('#') || !tokens.get(i + 1)?.is_punct('[') {
        return None;
    }
    Some(matching(tokens, i + 1, '[', ']')? + 1)
}

/// The inside of an attribute names a test: `cfg(test)`, `test`, or `tokio::test(…)`.
fn is_test_attribute(inner: &[Token]) -> bool {
    let words: Vec<&Tok> = inner.iter().map(|t| &t.tok).collect();
    let ident = |w: &str| Tok::Ident(w.to_owned());
    match words.as_slice() {
        [t] => **t == ident("test"),
        [c, Tok::Punct('('), t, Tok::Punct(')')] => **c == ident("cfg") && **t == ident("test"),
        [_, Tok::PathSep, t, ..] => **t == ident("test"),
        _ => false,
    }
}

/// The index just past the item starting at `i`: its `;` or the brace closing its body, at
/// bracket depth zero.
pub(crate) fn item_end(tokens: &[Token], i: usize) -> usize {
    let mut depth = 0i32;
    let mut k = i;
    while k < tokens.len() {
        match &tokens[k].tok {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return k + 1,
            Tok::Punct('{') if depth == 0 => return matching(tokens, k, '{', '}').map_or(tokens.len(), |e| e + 1),
            _ => {}
        }
        k += 1;
    }
    tokens.len()
}

/// The index of the bracket closing the one at `open`.
pub(crate) fn matching(tokens: &[Token], open: usize, left: char, right: char) -> Option<usize> {
    let mut depth = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(open) {
        if token.is_punct(left) {
            depth += 1;
        } else if token.is_punct(right) {
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        }
    }
    None
}

/// One package of the workspace: its name and directory.
#[derive(Debug)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
}

/// The workspace's packages (`crates/*` and `xtask`), sorted by name.
pub(crate) fn packages(root: &Path) -> Result<Vec<Package>> {
    let mut dirs = vec![root.join("xtask")];
    let crates = root.join("crates");
    for entry in std::fs::read_dir(&crates).with_context(|| format!("listing {}", crates.display()))? {
        dirs.push(entry.context("listing crates/")?.path());
    }
    let mut packages = Vec::new();
    for dir in dirs {
        let manifest = dir.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_owned())
            .with_context(|| format!("{} names no package", manifest.display()))?;
        packages.push(Package { name, dir });
    }
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(packages)
}

/// Every `.rs` file under `dir`, sorted.
pub(crate) fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.with_context(|| format!("listing {}", dir.display()))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanks_comments_and_literals_but_keeps_lines() {
        let src = "let a = \"x { y\"; // } z\nlet b = '{'; /* {\n */ let c = r#\"}\"#; 'l: loop {}\n";
        let out = sanitize(src);
        assert_eq!(out.lines().count(), src.lines().count());
        assert_eq!(out.matches('{').count(), 1);
        assert_eq!(out.matches('}').count(), 1);
        assert!(out.contains("'l: loop"));
    }

    #[test]
    fn marks_test_items() {
        let toks =
            tokenize("fn a() {}\n#[cfg(test)]\nmod tests { fn b() {} }\n#[tokio::test]\nasync fn c() {}\nfn d() {}");
        let live: Vec<&str> = toks.iter().filter(|t| !t.test).filter_map(Token::ident).collect();
        assert_eq!(live, ["fn", "a", "fn", "d"]);
    }
}
