//! No two files of `engine/` import each other, directly or through others: the arrows of
//! the module graph point one way (config -> weights -> model -> backend -> kernels; tools
//! at the top, imported by nothing).
//!
//! Each file's `use` trees and inline paths (`crate::a::b`, `super::x`, `self::x`, and
//! `use` paths through a child module it declares) are resolved to the file that defines
//! the longest prefix of the path: `crate::gpu::Gpu` is `engine/gpu/mod.rs` (whatever it
//! re-exports), `crate::gpu::kernels::gemv::f` is `engine/gpu/kernels/gemv.rs`. Sibling
//! files of a folder count as separate files, and so does the folder's `mod.rs`. Comments
//! and string literals are ignored; inline modules (`mod tests { use super::*; }`) resolve
//! `super` from where they sit. A cycle is a strongly connected component of more than one
//! file, reported with the edges that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`["gpu", "kernels", "gemv"]`, `[]` for the crate root) of each file.
fn module_files(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                // main.rs is its own crate root; it may import anything and nothing imports it.
                if prefix.is_empty() && name == "main" {
                    continue;
                }
                let mut p = prefix.to_vec();
                if name != "mod" && !(prefix.is_empty() && name == "lib") {
                    p.push(name);
                }
                out.insert(p, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, &[], &mut out);
    out
}

/// The source with comments, string and char literals blanked (lengths kept).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            out.push_str(&" ".repeat(end));
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            out.extend(
                rest[..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let end = rest[body..]
                .find(&close)
                .map_or(rest.len(), |e| body + e + close.len());
            out.extend(
                rest[..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i += end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            out.extend(
                src[i..end]
                    .chars()
                    .map(|c| if c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else if b[i] == b'\''
            && (rest.len() > 2 && (rest.as_bytes()[2] == b'\'' || rest.as_bytes()[1] == b'\\'))
        {
            // A char literal ('a', '\n', '\''); a lifetime ('a) has no closing quote.
            let end = if rest.as_bytes()[1] == b'\\' {
                rest[3..].find('\'').map_or(1, |e| e + 4)
            } else {
                3
            };
            out.push_str(&" ".repeat(end));
            i += end;
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    // ASCII only from here on: byte offsets and char offsets agree.
    out.chars()
        .map(|c| if c.is_ascii() { c } else { ' ' })
        .collect()
}

/// Expands a `use` tree (`a::{b, c::{self, d as e}}`) into its leaf paths.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut parts) = (0, 0, vec![]);
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        parts
    }
    let segments = |s: &str| -> Vec<String> {
        s.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "*")
            .map(str::to_owned)
            .collect()
    };
    let mut out = vec![];
    for part in split_top(tree)
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match part.find('{') {
            // `d as e` names `d`.
            None => out.push(segments(part.split(" as ").next().unwrap())),
            Some(open) => {
                let prefix = segments(&part[..open]);
                let inner = &part[open + 1..part.rfind('}').unwrap()];
                for leaf in expand(inner) {
                    let mut p = prefix.clone();
                    p.extend(leaf.into_iter().filter(|s| s != "self"));
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Every path one file names, each with the module it is named from (the file's own, or an
/// inline module inside it). `code` is ASCII (`code_only`).
fn paths_of(module: &[String], code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = code.as_bytes();
    let mut found = vec![];
    // Inline modules: a stack of (name, brace depth at which it closes).
    let mut stack: Vec<(String, usize)> = vec![];
    let mut depth = 0usize;
    let current = |stack: &[(String, usize)]| -> Vec<String> {
        let mut m = module.to_vec();
        m.extend(stack.iter().map(|(n, _)| n.clone()));
        m
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &code[i..];
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if b[i] == b'{' {
            depth += 1;
            i += 1;
        } else if b[i] == b'}' {
            depth -= 1;
            if stack.last().is_some_and(|&(_, d)| d == depth) {
                stack.pop();
            }
            i += 1;
        } else if word_start && rest.starts_with("mod ") {
            // `mod name {` opens an inline module; `mod name;` declares a file.
            let after = rest[4..].trim_start();
            let len = after.bytes().take_while(|&c| is_ident(c)).count();
            if after[len..].trim_start().starts_with('{') {
                stack.push((after[..len].to_owned(), depth));
            }
            i += 4;
        } else if word_start && rest.starts_with("use ") {
            let end = rest.find(';').unwrap();
            for p in expand(&rest[4..end]) {
                found.push((current(&stack), p));
            }
            i += end;
        } else if word_start
            && (rest.starts_with("crate::")
                || rest.starts_with("super::")
                || rest.starts_with("self::"))
        {
            let len = rest
                .bytes()
                .take_while(|&c| is_ident(c) || c == b':')
                .count();
            let p: Vec<String> = rest[..len]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            found.push((current(&stack), p));
            i += len;
        } else {
            i += 1;
        }
    }
    found
}

/// The file a path named from `from` lands in, or `None` for another crate.
fn resolve(
    files: &BTreeMap<Vec<String>, PathBuf>,
    from: &[String],
    path: &[String],
) -> Option<Vec<String>> {
    let mut abs: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            abs = vec![];
            rest = &path[1..];
        }
        Some("self" | "super") => {
            abs = from.to_vec();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "self" => {}
                    "super" => {
                        abs.pop();
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A path through a child module the current one declares (`use timed::Ops`).
            let mut child = from.to_vec();
            child.push(first.to_owned());
            if !files.keys().any(|k| k.starts_with(&child)) {
                return None;
            }
            abs = from.to_vec();
        }
        None => return None,
    }
    abs.extend(rest.iter().cloned());
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|p| files.contains_key(p))
}

/// Strongly connected components (Tarjan), each of more than one node.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = vec![];
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on_stack: BTreeSet::new(),
        out: vec![],
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Each file's imports of other files of `root`.
fn import_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = module_files(root);
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, path) in &files {
        let code = code_only(&std::fs::read_to_string(path).unwrap());
        let edges = graph.entry(module.clone()).or_default();
        for (from, p) in paths_of(module, &code) {
            if let Some(target) = resolve(&files, &from, &p)
                && target != *module
            {
                edges.insert(target);
            }
        }
    }
    graph
}

fn file_name(root: &Path, files: &BTreeMap<Vec<String>, PathBuf>, m: &[String]) -> String {
    files[m]
        .strip_prefix(root.parent().unwrap())
        .unwrap()
        .display()
        .to_string()
}

#[test]
fn no_two_engine_files_import_each_other() {
    // From the repository root, where cargo (and scripts/run-test-binaries.sh) runs tests.
    let root = Path::new("engine");
    let files = module_files(root);
    let graph = import_graph(root);
    let found = cycles(&graph);
    let mut report = String::new();
    for component in &found {
        let members: BTreeSet<&Vec<String>> = component.iter().collect();
        report.push_str("cycle among:\n");
        for m in component {
            let into: Vec<String> = graph[m]
                .iter()
                .filter(|t| members.contains(t))
                .map(|t| file_name(root, &files, t))
                .collect();
            report.push_str(&format!(
                "  {} imports {}\n",
                file_name(root, &files, m),
                into.join(", ")
            ));
        }
    }
    assert!(found.is_empty(), "{report}");
}

/// Nothing in the engine imports the measuring tools: only `main.rs` and the tests do.
#[test]
fn nothing_in_the_engine_imports_the_tools() {
    // From the repository root, where cargo (and scripts/run-test-binaries.sh) runs tests.
    let root = Path::new("engine");
    let files = module_files(root);
    let tools = vec!["tools".to_string()];
    if !files.keys().any(|k| k.starts_with(&tools)) {
        return;
    }
    let mut found = vec![];
    for (module, targets) in import_graph(root) {
        if module.starts_with(&tools) {
            continue;
        }
        for t in targets.iter().filter(|t| t.starts_with(&tools)) {
            found.push(format!(
                "{} imports {}",
                file_name(root, &files, &module),
                file_name(root, &files, t)
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The resolver itself, on a made-up tree.
#[test]
fn the_parser_finds_what_a_file_names() {
    let m = |s: &str| -> Vec<String> {
        s.split("::")
            .filter(|x| !x.is_empty())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        expand("crate::a::{self, b::{C, d as e}, f::*}"),
        vec![
            m("crate::a"),
            m("crate::a::b::C"),
            m("crate::a::b::d"),
            m("crate::a::f")
        ]
    );
    let code = code_only(
        "use super::x::Y; // crate::not::this\nfn f() { let s = \"crate::nor::this\"; crate::tiles::Z; }\nmod tests { use super::*; }",
    );
    let found = paths_of(&m("gpu::kernels::gemv"), &code);
    assert_eq!(
        found,
        vec![
            (m("gpu::kernels::gemv"), m("super::x::Y")),
            (m("gpu::kernels::gemv"), m("crate::tiles::Z")),
            (m("gpu::kernels::gemv::tests"), m("super")),
        ]
    );
    let files: BTreeMap<Vec<String>, PathBuf> = [
        "",
        "gpu",
        "gpu::kernels",
        "gpu::kernels::gemv",
        "gpu::kernels::x",
        "gpu::tiles",
    ]
    .iter()
    .map(|s| (m(s), PathBuf::new()))
    .collect();
    let r = |from: &str, p: &str| resolve(&files, &m(from), &m(p));
    assert_eq!(
        r("gpu::kernels::gemv", "super::x::Y"),
        Some(m("gpu::kernels::x"))
    );
    assert_eq!(
        r("gpu::kernels::gemv::tests", "super"),
        Some(m("gpu::kernels::gemv"))
    );
    assert_eq!(r("gpu::kernels::gemv", "crate::gpu::Gpu"), Some(m("gpu")));
    assert_eq!(r("gpu", "kernels::gemv::f"), Some(m("gpu::kernels::gemv")));
    assert_eq!(r("gpu", "cudarc::driver"), None);
}
