//! `cargo xtask cycles`: file-level import cycles within each crate of the workspace.
//!
//! File A depends on file B when A names an item of B: a `use crate::…`, `use super::…`,
//! `use self::…` or `use <child module>::…`, or such a path written inline in code. A path
//! is followed through `pub use` re-exports (named or glob) to the file that defines the
//! item, so a facade module that re-exports its children does not count as a dependency;
//! a re-export of a child's item is not an edge either. Test code (`#[cfg(test)]` items and
//! the modules they declare) is left out. Two files that reach each other are a cycle.

use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use crate::scan::{self, Tok, Token};

/// A module's path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// What one module holds: the file it lives in, the names it defines, and its `pub use`
/// re-exports (named: alias to absolute path; glob: absolute module path).
#[derive(Debug, Default)]
struct Module {
    file: usize,
    defines: BTreeSet<String>,
    reexports: BTreeMap<String, ModPath>,
    glob_reexports: Vec<ModPath>,
}

/// A path one module names, where, and whether it is a re-export (`pub use`).
#[derive(Debug)]
struct Reference {
    from: ModPath,
    path: ModPath,
    line: usize,
    reexport: bool,
    text: String,
}

/// One crate root's module tree, built by following `mod` declarations from the root file.
#[derive(Debug, Default)]
struct Tree {
    files: Vec<PathBuf>,
    modules: BTreeMap<ModPath, Module>,
    references: Vec<(usize, Reference)>,
}

/// Runs the check over every package; fails when any crate has a cycle.
pub(crate) fn cycles(root: &Path) -> Result<()> {
    let mut found = 0;
    for package in scan::packages(root)? {
        for crate_root in crate_roots(&package.dir) {
            let tree = Tree::load(&crate_root)?;
            for cycle in tree.cycles() {
                found += 1;
                println!("{}: {}", package.name, tree.describe(&cycle, &package.dir));
            }
        }
    }
    if found > 0 {
        bail!("{found} file-level import cycle(s)");
    }
    println!("cycles: none");
    Ok(())
}

/// The files each crate of a package starts from: the library, the binary, and `src/bin/*`.
fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let src = dir.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|p| p.exists())
        .collect();
    roots.extend(scan::rust_files(&src.join("bin")).unwrap_or_default());
    roots
}

impl Tree {
    fn load(root_file: &Path) -> Result<Self> {
        let mut tree = Self::default();
        let mut pending = vec![(Vec::new(), root_file.to_path_buf())];
        while let Some((path, file)) = pending.pop() {
            let src = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let index = tree.files.len();
            tree.files.push(file.clone());
            let children_dir = child_dir(&file);
            for child in tree.scan_file(index, &path, &scan::tokenize(&src)) {
                let stem = children_dir.join(child.last().map_or("", String::as_str));
                let candidates = [stem.with_extension("rs"), stem.join("mod.rs")];
                if let Some(found) = candidates.into_iter().find(|c| c.exists()) {
                    pending.push((child, found));
                }
            }
        }
        Ok(tree)
    }

    /// Records the modules, definitions and references of one file whose top module is
    /// `top`; returns the file modules it declares (`mod x;`).
    fn scan_file(&mut self, file: usize, top: &ModPath, tokens: &[Token]) -> Vec<ModPath> {
        let tokens: Vec<Token> = tokens.iter().filter(|t| !t.test).cloned().collect();
        let declared = declared_modules(top, &tokens);
        let children: BTreeSet<String> = declared.iter().filter_map(|p| p.last()).cloned().collect();
        let mut stack: Vec<(ModPath, usize)> = vec![(top.clone(), 0)];
        self.modules.entry(top.clone()).or_default().file = file;
        let mut depth = 0usize;
        let mut i = 0;
        while i < tokens.len() {
            let (current, module_depth) = stack.last().cloned().unwrap_or_default();
            match &tokens[i].tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if stack.len() > 1 && module_depth > depth {
                        stack.pop();
                    }
                }
                Tok::Ident(w) if w == "mod" && tokens.get(i + 2).is_some_and(|t| t.is_punct('{')) => {
                    if let Some(name) = tokens[i + 1].ident() {
                        let mut inline = current.clone();
                        inline.push(name.to_owned());
                        self.modules.entry(inline.clone()).or_default().file = file;
                        stack.push((inline, depth + 1));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    let end = scan::item_end(&tokens, i);
                    self.record_use(
                        file,
                        &current,
                        &children,
                        &tokens[i..end],
                        i > 0 && is_public(&tokens[i - 1]),
                    );
                    i = end;
                    continue;
                }
                Tok::Ident(w) if depth == module_depth && DEFINING.contains(&w.as_str()) => {
                    if let Some(name) = tokens.get(i + 1).and_then(Token::ident) {
                        self.modules
                            .entry(current.clone())
                            .or_default()
                            .defines
                            .insert(name.to_owned());
                    }
                }
                Tok::Ident(_) if starts_inline_path(&tokens, i, &children) => {
                    i = self.record_inline_path(file, &current, &children, &tokens, i);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        declared
    }
}

/// The modules a file declares with `mod x;`, as children of its top module `top`.
fn declared_modules(top: &ModPath, tokens: &[Token]) -> Vec<ModPath> {
    tokens
        .windows(3)
        .filter(|w| w[0].is_ident("mod") && w[2].is_punct(';'))
        .filter_map(|w| w[1].ident())
        .map(|name| {
            let mut child = top.clone();
            child.push(name.to_owned());
            child
        })
        .collect()
}

/// The token before `use` makes it a re-export: `pub` or the `)` of `pub(crate)`.
fn is_public(before: &Token) -> bool {
    before.is_ident("pub") || before.is_punct(')')
}

/// A path in code starts at `tokens[i]`: `crate::`, `self::`, `super::` or `<child>::`, not
/// itself the tail of a longer path.
fn starts_inline_path(tokens: &[Token], i: usize, children: &BTreeSet<String>) -> bool {
    let starts = tokens[i]
        .ident()
        .is_some_and(|w| matches!(w, "crate" | "self" | "super") || children.contains(w));
    let after_sep = i > 0 && tokens[i - 1].tok == Tok::PathSep;
    starts && !after_sep && tokens.get(i + 1).is_some_and(|t| t.tok == Tok::PathSep)
}

/// Keywords that define a named item in the module they appear in.
const DEFINING: &[&str] = &[
    "struct",
    "enum",
    "union",
    "trait",
    "type",
    "fn",
    "const",
    "static",
    "macro_rules",
];

/// The directory a file's `mod x;` children live in: beside `lib.rs`, `main.rs` and `mod.rs`,
/// in `foo/` for `foo.rs`.
fn child_dir(file: &Path) -> PathBuf {
    let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("lib" | "main" | "mod") | None => parent,
        Some(stem) => parent.join(stem),
    }
}

impl Tree {
    /// Records the leaves of one `use` item (`tokens`, from `use` to `;`).
    fn record_use(
        &mut self,
        file: usize,
        current: &ModPath,
        children: &BTreeSet<String>,
        tokens: &[Token],
        public: bool,
    ) {
        let mut leaves = Vec::new();
        use_leaves(&tokens[1..], &[], &mut leaves);
        for (segments, alias) in leaves {
            let Some(path) = self.absolute(current, &segments, children) else {
                continue;
            };
            if public {
                let module = self.modules.entry(current.clone()).or_default();
                match alias.as_deref() {
                    Some("*") => module.glob_reexports.push(path.clone()),
                    Some(name) => drop(module.reexports.insert(name.to_owned(), path.clone())),
                    None => {}
                }
            }
            let reference = Reference {
                from: current.clone(),
                line: tokens[0].line,
                reexport: public,
                text: segments.join("::"),
                path,
            };
            self.references.push((file, reference));
        }
    }

    /// Records the path written in code at `tokens[i]`; returns the index past it.
    fn record_inline_path(
        &mut self,
        file: usize,
        current: &ModPath,
        children: &BTreeSet<String>,
        tokens: &[Token],
        i: usize,
    ) -> usize {
        let mut segments = Vec::new();
        let mut k = i;
        while let Some(word) = tokens.get(k).and_then(Token::ident) {
            segments.push(word.to_owned());
            if tokens.get(k + 1).map(|t| &t.tok) != Some(&Tok::PathSep) {
                break;
            }
            k += 2;
        }
        if let Some(path) = self.absolute(current, &segments, children) {
            let reference = Reference {
                from: current.clone(),
                path,
                line: tokens[i].line,
                reexport: false,
                text: segments.join("::"),
            };
            self.references.push((file, reference));
        }
        k + 1
    }

    /// `segments` made absolute from module `current`, when it names this crate at all.
    fn absolute(&self, current: &ModPath, segments: &[String], children: &BTreeSet<String>) -> Option<ModPath> {
        let first = segments.first()?;
        let mut path = current.clone();
        match first.as_str() {
            "crate" => path.clear(),
            "self" => {}
            "super" => drop(path.pop()?),
            child => {
                path.push(child.to_owned());
                if !children.contains(child) && !self.modules.contains_key(&path) {
                    return None;
                }
            }
        }
        let mut rest = &segments[1..];
        while rest.first().is_some_and(|s| s == "super") {
            path.pop()?;
            rest = &rest[1..];
        }
        path.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(path)
    }
}

/// The leaves of a `use` tree (the tokens after `use`): each full path and its alias
/// (its last name, the `as` name, or `*` for a glob).
fn use_leaves(tokens: &[Token], prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Ident(w) if w == "as" => {
                let alias = tokens.get(i + 1).and_then(Token::ident).map(str::to_owned);
                out.push((path.clone(), alias));
                return;
            }
            Tok::Ident(w) => path.push(w.clone()),
            Tok::Punct('*') => {
                out.push((path.clone(), Some("*".into())));
                return;
            }
            Tok::Punct('{') => {
                let close = scan::matching(tokens, i, '{', '}').unwrap_or(tokens.len());
                for part in split_top_level(&tokens[i + 1..close]) {
                    use_leaves(part, &path, out);
                }
                return;
            }
            _ => {}
        }
        i += 1;
    }
    if path.len() > prefix.len() {
        let alias = path.iter().rev().find(|s| *s != "self").cloned();
        out.push((path, alias));
    }
}

/// `tokens` split at the commas outside braces.
fn split_top_level(tokens: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (k, token) in tokens.iter().enumerate() {
        match token.tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth -= 1,
            Tok::Punct(',') if depth == 0 => {
                parts.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    parts
}

/// The evidence of one file-to-file dependency: the first line that makes it, and its path.
type Edges = BTreeMap<(usize, usize), (usize, String)>;

impl Tree {
    /// The module that defines the item `path` names, following re-exports.
    fn resolve(&self, path: &[String], hops: usize) -> Option<&ModPath> {
        let (prefix, module) = (0..=path.len())
            .rev()
            .find_map(|n| self.modules.get_key_value(&path[..n]))?;
        let Some(item) = path.get(prefix.len()) else {
            return Some(prefix);
        };
        if hops == 0 || module.defines.contains(item) {
            return Some(prefix);
        }
        if let Some(target) = module.reexports.get(item) {
            let mut next = target.clone();
            next.extend(path[prefix.len() + 1..].iter().cloned());
            return self.resolve(&next, hops - 1).or(Some(prefix));
        }
        for glob in &module.glob_reexports {
            let mut next = glob.clone();
            next.extend(path[prefix.len()..].iter().cloned());
            if let Some(found) = self.resolve(&next, hops - 1)
                && self
                    .modules
                    .get(found)
                    .is_some_and(|m| m.defines.contains(item) || found.len() > glob.len())
            {
                return Some(found);
            }
        }
        Some(prefix)
    }

    /// File-to-file dependencies, each with the first reference that makes it.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (file, reference) in &self.references {
            let Some(target) = self.resolve(&reference.path, 8) else {
                continue;
            };
            // A facade re-exporting its own children's items depends on nothing.
            if reference.reexport && target.starts_with(&reference.from) {
                continue;
            }
            let Some(to) = self.modules.get(target).map(|m| m.file) else {
                continue;
            };
            if to != *file {
                edges
                    .entry((*file, to))
                    .or_insert_with(|| (reference.line, reference.text.clone()));
            }
        }
        edges
    }

    /// One shortest cycle through each strongly connected group of files.
    fn cycles(&self) -> Vec<Vec<(usize, usize, String)>> {
        let edges = self.edges();
        let mut seen = BTreeSet::new();
        let mut cycles = Vec::new();
        for start in 0..self.files.len() {
            if seen.contains(&start) {
                continue;
            }
            if let Some(cycle) = shortest_cycle(&edges, start) {
                seen.extend(cycle.iter().map(|(from, _, _)| *from));
                cycles.push(cycle);
            }
        }
        cycles
    }

    fn describe(&self, cycle: &[(usize, usize, String)], dir: &Path) -> String {
        let name = |f: usize| {
            self.files[f]
                .strip_prefix(dir)
                .unwrap_or(&self.files[f])
                .display()
                .to_string()
        };
        let mut chain: Vec<String> = cycle.iter().map(|(from, _, _)| name(*from)).collect();
        chain.push(name(cycle[0].0));
        let mut text = format!("cycle: {}", chain.join(" -> "));
        for (from, _, why) in cycle {
            text.push_str(&format!("\n    {}:{why}", name(*from)));
        }
        text
    }
}

/// The shortest path from `start` back to itself: each step's file, next file, and the
/// line and path that make it.
fn shortest_cycle(edges: &Edges, start: usize) -> Option<Vec<(usize, usize, String)>> {
    let mut previous: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for (&(_, to), _) in edges.range((node, 0)..=(node, usize::MAX)) {
            if to == start {
                let mut steps = vec![node];
                while let Some(&p) = previous.get(steps.last()?) {
                    steps.push(p);
                }
                steps.reverse();
                steps.push(start);
                let cycle = steps
                    .windows(2)
                    .map(|w| {
                        let (line, text) = &edges[&(w[0], w[1])];
                        (w[0], w[1], format!("{line} uses {text}"))
                    })
                    .collect();
                return Some(cycle);
            }
            if to != start && !previous.contains_key(&to) {
                previous.insert(to, node);
                queue.push_back(to);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Tree {
        // One directory per call: tests run in parallel in one process.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtask-cycles-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Tree::load(&dir.join("lib.rs")).unwrap()
    }

    #[test]
    fn finds_a_two_file_cycle_but_not_a_facade() {
        let t = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub use a::A;\npub use b::*;\n"),
            ("a.rs", "use crate::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\nfn f() -> crate::a::A { todo!() }\n"),
        ]);
        let cycles = t.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].len(), 2);
    }

    #[test]
    fn a_child_using_its_parent_alone_is_no_cycle() {
        let t = tree(&[
            ("lib.rs", "mod m;\n"),
            (
                "m/mod.rs",
                "mod x;\npub use x::X;\npub struct P;\n#[cfg(test)]\nmod tests { use super::x::X; }\n",
            ),
            ("m/x.rs", "use super::P;\npub struct X(P);\n"),
        ]);
        assert!(t.cycles().is_empty(), "{:?}", t.cycles());
    }
}
