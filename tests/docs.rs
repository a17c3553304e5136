//! The book in `docs/` against the tree it describes: a chapter that names a file, a function
//! or a command that no longer exists fails here, and so does a figure that is not in
//! `BENCHMARKS.md`. No GPU needed.
//!
//! The book is `docs/README.md` and every page of `docs/` it links to. In each page:
//!
//! - every relative Markdown link (`[text](path)`, images too) points at a file that exists;
//! - every backticked path with a `/` and a known extension (`gpu-kernels/src/gemv.rs`) exists,
//!   from the repository's root;
//! - every backticked identifier with an underscore (`gemv_bf16`, `Gpu::residual_add_f32`,
//!   `WGMMA_STAGES`), or written as a call with empty parentheses (`launch()`), is a word of
//!   some file of the source tree (`engine/`, `gpu-kernels/`, `tests/`, `scripts/`,
//!   `build.rs`, the manifests, `.ci/run`). Names the book brings in on purpose (the example
//!   kernel a chapter has the reader write) are declared in the page, in a comment:
//!   `<!-- not in the tree: geglu_f32 gelu -->`;
//! - every `rustle` command (in backticks, or a line of a fenced block; `cargo run --release
//!   -- ...` too) names a subcommand and flags that `rustle --help` / `rustle <sub> --help`
//!   list;
//! - every `cargo test ... --test NAME -- FILTER` names a test file that exists and a filter
//!   that occurs in it (`--lib FILTER`: in `engine/`);
//! - a fenced block whose first line is `// PATH` is an excerpt of that file: each of its
//!   other lines (indentation aside; `...` lines elide) occurs in it;
//! - a figure (a blockquote, or a table row naming a round) quotes `BENCHMARKS.md`: each
//!   "double-quoted" text and each backticked `rustle` command in it occurs there (line breaks
//!   aside), each round it names is a round there, and each date it gives is in the heading
//!   of a round it names. A figure names its GPU (the H200: every GPU round so far ran on
//!   it), or "no GPU" for one measured without (the build); a blockquote must also name a
//!   round and quote something.
//!
//! Numbered chapters (`docs/NN-*.md`) must each be linked from the index and end with an
//! exercise (a `## Exercise` heading and a `cargo test` command).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPUs `BENCHMARKS.md` has measured on; a figure names one, or says "no GPU" (the
/// kernels' build, timed on the CPU machine). (Add one here when a round runs on another.)
const GPUS: &[&str] = &["H200", "H100", "no GPU"];

/// Extensions of the files a backticked path is checked for.
const PATH_EXTENSIONS: &[&str] = &[".rs", ".md", ".json", ".svg", ".png", ".py", ".sh", ".toml"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- the source tree -----------------------------------------------------------------------

/// Every file whose words count as "in the tree", with its text. This file is left out, so
/// that the names its own checks use as examples of missing ones stay missing.
fn source_files() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let path = e.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("target") {
                    walk(&path, out);
                }
            } else if path
                .extension()
                .is_some_and(|x| ["rs", "py", "sh", "toml"].iter().any(|&e| x == e))
            {
                out.push(path);
            }
        }
    }
    let r = root();
    let mut paths = Vec::new();
    for dir in ["engine", "gpu-kernels", "tests", "scripts"] {
        walk(&r.join(dir), &mut paths);
    }
    for file in ["build.rs", "Cargo.toml", "rust-toolchain.toml", ".ci/run"] {
        paths.push(r.join(file));
    }
    let me = r.join("tests/docs.rs");
    paths.sort();
    paths
        .into_iter()
        .filter(|p| *p != me && p.is_file())
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect()
}

/// The words (`[A-Za-z0-9_]+`) of `text`, with the byte offset after each.
fn words(text: &str) -> impl Iterator<Item = (&str, usize)> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut rest = text.char_indices().peekable();
    std::iter::from_fn(move || {
        while rest.peek().is_some_and(|&(_, c)| !is_word(c)) {
            rest.next();
        }
        let (start, _) = *rest.peek()?;
        let mut end = start;
        while let Some(&(i, c)) = rest.peek() {
            if !is_word(c) {
                break;
            }
            end = i + c.len_utf8();
            rest.next();
        }
        Some((&text[start..end], end))
    })
}

fn word_set(files: &[(PathBuf, String)]) -> HashSet<String> {
    files
        .iter()
        .flat_map(|(_, text)| words(text).map(|(w, _)| w.to_owned()))
        .collect()
}

/// The names in a code span that must exist: identifiers (starting with a letter or `_`)
/// that hold an underscore, or are written as `name()`.
fn names_in_span(span: &str) -> Vec<&str> {
    words(span)
        .filter(|&(w, end)| {
            let ident = w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
            let call = span[end..].starts_with("()");
            ident && (w.trim_matches('_').contains('_') || call)
        })
        .map(|(w, _)| w)
        .collect()
}

// ---- rustle's command line -----------------------------------------------------------------

/// `rustle`'s subcommands, and the flags of the top level (key "") and of each subcommand,
/// as the built binary's `--help` lists them.
struct Cli {
    flags: HashMap<String, BTreeSet<String>>,
}

impl Cli {
    fn from_binary() -> Cli {
        // The binary cargo built, or `RUSTLE_BIN` where the test executables run without
        // cargo (the GPU machine: scripts/run-test-binaries.sh), as tests/cli.rs does.
        let bin =
            std::env::var("RUSTLE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_rustle").into());
        let help = |args: &[&str]| {
            let out = Command::new(&bin)
                .args(args)
                .arg("--help")
                .output()
                .expect("running rustle --help");
            assert!(out.status.success(), "rustle {args:?} --help failed");
            String::from_utf8(out.stdout).unwrap()
        };
        let top = help(&[]);
        let mut flags = HashMap::new();
        flags.insert(String::new(), option_flags(&top));
        for sub in subcommands(&top) {
            let text = help(&[&sub]);
            flags.insert(sub, option_flags(&text));
        }
        Cli { flags }
    }

    /// What is wrong with the `rustle` argument list `args` (after the program name).
    fn check(&self, args: &[&str]) -> Vec<String> {
        let (sub, rest) = match args.first() {
            Some(&s) if self.flags.contains_key(s) && !s.is_empty() => (s, &args[1..]),
            Some(&s) if !s.starts_with('-') => {
                return vec![format!("`rustle {s}`: no such subcommand")];
            }
            _ => ("", args),
        };
        let known = &self.flags[sub];
        rest.iter()
            .filter(|a| a.starts_with('-') && a.len() > 1 && !a[1..].starts_with(char::is_numeric))
            .map(|a| a.split('=').next().unwrap())
            .filter(|flag| !known.contains(*flag))
            .map(|flag| format!("`rustle {sub}`: no flag {flag}"))
            .collect()
    }
}

/// The subcommands in a `--help`'s "Commands:" section.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&s| s != "help")
        .map(str::to_owned)
        .collect()
}

/// The flags of a `--help`'s option lines: `-p, --prompt <PROMPT>` gives `-p` and `--prompt`.
fn option_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in help.lines().map(str::trim_start) {
        if !line.starts_with('-') {
            continue;
        }
        for token in line.split_whitespace() {
            let flag = token.trim_end_matches(',');
            if !flag.starts_with('-') {
                break;
            }
            flags.insert(flag.to_owned());
        }
    }
    flags
}

// ---- the book ------------------------------------------------------------------------------

/// One page of the book.
struct Page {
    path: PathBuf,
    /// As written in messages: `docs/03-gemv.md`.
    name: String,
    text: String,
}

impl Page {
    fn load(path: PathBuf) -> Page {
        let name = path
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        Page {
            text: read(&path),
            path,
            name,
        }
    }

    /// Names declared in `<!-- not in the tree: a b c -->` comments.
    fn declared_new(&self) -> HashSet<&str> {
        const TAG: &str = "<!-- not in the tree:";
        self.text
            .match_indices(TAG)
            .flat_map(|(at, _)| {
                let rest = &self.text[at + TAG.len()..];
                rest[..rest.find("-->").unwrap_or(rest.len())].split_whitespace()
            })
            .collect()
    }
}

/// The book: the index and every `docs/` page it links to.
fn book() -> Vec<Page> {
    let index = Page::load(root().join("docs/README.md"));
    let mut paths: BTreeSet<PathBuf> = BTreeSet::new();
    for (target, _) in links(&index.text) {
        let p = root().join("docs").join(target);
        if p.extension().is_some_and(|e| e == "md") && p.parent() == Some(&root().join("docs")) {
            paths.insert(p);
        }
    }
    let mut pages = vec![index];
    pages.extend(paths.into_iter().filter(|p| p.is_file()).map(Page::load));
    pages
}

/// A page split into prose lines (outside fenced blocks, with line numbers) and fenced
/// blocks (their lines, and the line number of the fence).
struct Parsed<'a> {
    prose: Vec<(usize, &'a str)>,
    blocks: Vec<(usize, Vec<&'a str>)>,
}

fn parse(text: &str) -> Parsed<'_> {
    let (mut prose, mut blocks) = (Vec::new(), Vec::new());
    let mut block: Option<(usize, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => block = Some((n, Vec::new())),
            }
        } else if let Some((_, lines)) = block.as_mut() {
            lines.push(line);
        } else {
            prose.push((n, line));
        }
    }
    Parsed { prose, blocks }
}

/// The inline code spans of a prose line.
fn code_spans(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = &rest[start..start + ticks];
        let body = &rest[start + ticks..];
        let Some(end) = body.find(fence) else { break };
        spans.push(body[..end].trim());
        rest = &body[end + ticks..];
    }
    spans
}

/// The relative link targets of a page's prose (`[text](target)`, `![alt](target)`), anchors
/// cut off, with the line each is on.
fn links(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in parse(text).prose {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split('#').next().unwrap().trim();
            let external = target.contains("://") || target.starts_with("mailto:");
            if !target.is_empty() && !external {
                out.push((target.to_owned(), n));
            }
            rest = &after[end..];
        }
    }
    out
}

/// A backticked path to check: a file with a known extension, or a folder (`engine/tools/`).
fn is_path(span: &str) -> bool {
    span.contains('/')
        && (span.ends_with('/') || PATH_EXTENSIONS.iter().any(|e| span.ends_with(e)))
        && !span.contains(['<', '*', '{', ' ', '$', ':'])
}

/// The argument lists of the commands on one line of shell (`$ ` prompts, `VAR=value`
/// prefixes and `# comments` removed; `&&`, `;` and `|` separate commands).
fn commands(line: &str) -> Vec<Vec<&str>> {
    let line = line.trim().trim_start_matches("$ ");
    let line = line.split(" #").next().unwrap();
    line.split("&&")
        .flat_map(|s| s.split(';'))
        .flat_map(|s| s.split('|'))
        .map(|s| {
            s.split_whitespace()
                .skip_while(|t| t.contains('=') && !t.starts_with('-'))
                .collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty())
        .collect()
}

/// What the checks hold the book against.
struct Tree {
    /// The source files and their text.
    files: Vec<(PathBuf, String)>,
    /// Every word of them.
    words: HashSet<String>,
    cli: Cli,
    bench: Benchmarks,
}

impl Tree {
    fn load() -> Tree {
        let files = source_files();
        Tree {
            words: word_set(&files),
            files,
            cli: Cli::from_binary(),
            bench: Benchmarks::load(),
        }
    }
}

/// What is wrong with one command: a `rustle` (or `cargo run ... --`) command checked
/// against the CLI, a `cargo test` against the test files (or `engine/`, for `--lib`).
fn check_command(cmd: &[&str], tree: &Tree, new: &HashSet<&str>) -> Vec<String> {
    let root = root();
    match cmd {
        ["rustle", args @ ..] => tree.cli.check(args),
        ["cargo", "run", rest @ ..] => match rest.iter().position(|&a| a == "--") {
            Some(i) => tree.cli.check(&rest[i + 1..]),
            None => tree.cli.check(&[]),
        },
        ["cargo", "test", rest @ ..] => {
            let (opts, filter) = match rest.iter().position(|&a| a == "--") {
                Some(i) => (
                    &rest[..i],
                    rest[i + 1..].iter().find(|a| !a.starts_with('-')),
                ),
                None => (rest, None),
            };
            let test = opts
                .iter()
                .position(|&a| a == "--test")
                .and_then(|i| opts.get(i + 1));
            let lib_filter = opts
                .iter()
                .position(|&a| a == "--lib")
                .and_then(|i| opts.get(i + 1))
                .filter(|a| !a.starts_with('-'));
            let mut errors = Vec::new();
            let haystack = match test {
                Some(name) => {
                    let file = [format!("tests/{name}.rs"), format!("tests/{name}/main.rs")]
                        .into_iter()
                        .map(|f| root.join(f))
                        .find(|p| p.is_file());
                    match file {
                        Some(f) => read(&f),
                        None => {
                            return vec![format!("`cargo test --test {name}`: no tests/{name}.rs")];
                        }
                    }
                }
                None => tree
                    .files
                    .iter()
                    .filter(|(p, _)| p.starts_with(root.join("engine")))
                    .map(|(_, t)| t.as_str())
                    .collect(),
            };
            for f in filter.into_iter().chain(lib_filter) {
                let declared = names_in_span(f).iter().any(|n| new.contains(n));
                if !declared && !haystack.contains(*f) {
                    errors.push(format!(
                        "`cargo test`: the filter {f} matches no test there"
                    ));
                }
            }
            errors
        }
        _ => Vec::new(),
    }
}

/// `text` with runs of whitespace made one space, and `\|` (a pipe inside a table) a pipe.
fn normalized(text: &str) -> String {
    text.replace("\\|", "|")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The round numbers `text` names ("round 4", "Round 16", "rounds 11, 16 and 18" counts 11).
fn rounds_named(text: &str) -> Vec<u32> {
    let lower = text.to_lowercase();
    let mut out = Vec::new();
    for (at, _) in lower.match_indices("round") {
        let rest = lower[at + 5..].trim_start_matches('s').trim_start();
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(n) = digits.parse() {
            out.push(n);
        }
    }
    out
}

/// The `YYYY-MM-DD` dates in `text`.
fn dates(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(9))
        .filter(|&i| {
            let d = |j: usize| b[i + j].is_ascii_digit();
            (i == 0 || !b[i - 1].is_ascii_digit())
                && d(0)
                && d(1)
                && d(2)
                && d(3)
                && b[i + 4] == b'-'
                && d(5)
                && d(6)
                && b[i + 7] == b'-'
                && d(8)
                && d(9)
        })
        .map(|i| &text[i..i + 10])
        .collect()
}

/// The "double-quoted" texts of a line.
fn quotes(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

/// BENCHMARKS.md: its text (normalized) and each round's heading line by number.
struct Benchmarks {
    text: String,
    headings: HashMap<u32, String>,
}

impl Benchmarks {
    fn load() -> Benchmarks {
        let raw = read(&root().join("BENCHMARKS.md"));
        let headings = raw
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("### ")?;
                let (n, _) = rest.split_once(". ")?;
                Some((n.parse().ok()?, l.to_owned()))
            })
            .collect();
        Benchmarks {
            text: normalized(&raw),
            headings,
        }
    }

    /// What is wrong with one figure: a blockquote's text or a table row.
    fn check_figure(&self, figure: &str, blockquote: bool, tree: &Tree) -> Vec<String> {
        let mut errors = Vec::new();
        let rounds = rounds_named(figure);
        let quoted = quotes(figure);
        if blockquote && (rounds.is_empty() || quoted.is_empty()) {
            errors.push("a figure (blockquote) must name its round and quote BENCHMARKS.md".into());
        }
        if !GPUS.iter().any(|g| figure.contains(g)) {
            errors.push(format!(
                "a figure must name the GPU it was measured on ({GPUS:?})"
            ));
        }
        for q in quoted {
            if !self.text.contains(&normalized(q)) {
                errors.push(format!("\"{q}\" is not in BENCHMARKS.md"));
            }
        }
        for span in code_spans(figure) {
            if span.starts_with("rustle ") {
                if !self.text.contains(&normalized(span)) {
                    errors.push(format!("the command `{span}` is not in BENCHMARKS.md"));
                }
                for cmd in commands(span) {
                    errors.extend(check_command(&cmd, tree, &HashSet::new()));
                }
            }
        }
        for &n in &rounds {
            if !self.headings.contains_key(&n) {
                errors.push(format!("BENCHMARKS.md has no round {n}"));
            }
        }
        for date in dates(figure) {
            let in_heading = rounds
                .iter()
                .any(|n| self.headings.get(n).is_some_and(|h| h.contains(date)));
            if !in_heading {
                errors.push(format!("{date} is the date of none of rounds {rounds:?}"));
            }
        }
        errors
    }
}

/// What a unit of prose is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Text,
    Quote,
    Row,
}

/// A page's prose in the units the checks read, each with its first line: a paragraph's or a
/// blockquote's lines joined (a code span or a quotation may run over a line break), a table
/// row alone.
fn units(prose: &[(usize, &str)]) -> Vec<(usize, Unit, String)> {
    let mut out: Vec<(usize, Unit, String)> = Vec::new();
    let mut open = false;
    for &(n, line) in prose {
        let line = line.trim();
        let (kind, body) = match line.strip_prefix('>') {
            Some(body) => (Unit::Quote, body.trim()),
            None if line.starts_with('|') => (Unit::Row, line),
            None => (Unit::Text, line),
        };
        if line.is_empty() {
            open = false;
            continue;
        }
        match out.last_mut() {
            Some((_, k, text)) if open && *k == kind && kind != Unit::Row => {
                text.push(' ');
                text.push_str(body);
            }
            _ => out.push((n, kind, body.to_owned())),
        }
        open = true;
    }
    out
}

/// Every problem of one page, as `page:line: what`.
fn check_page(page: &Page, tree: &Tree) -> Vec<String> {
    let root = root();
    let dir = page.path.parent().unwrap();
    let new = page.declared_new();
    let mut errors = Vec::new();
    let mut err = |n: usize, what: String| errors.push(format!("{}:{n}: {what}", page.name));

    for (target, n) in links(&page.text) {
        if !dir.join(&target).exists() {
            err(n, format!("link to {target}, which does not exist"));
        }
    }

    let parsed = parse(&page.text);
    for (n, kind, text) in units(&parsed.prose) {
        // A figure's names are the history's, checked against BENCHMARKS.md alone.
        match kind {
            Unit::Quote => {
                for e in tree.bench.check_figure(&text, true, tree) {
                    err(n, e);
                }
                continue;
            }
            Unit::Row if !rounds_named(&text).is_empty() => {
                for e in tree.bench.check_figure(&text, false, tree) {
                    err(n, e);
                }
                continue;
            }
            _ => {}
        }
        for span in code_spans(&text) {
            if is_path(span) {
                if !root.join(span).exists() {
                    err(n, format!("`{span}` does not exist"));
                }
                continue;
            }
            if span.starts_with("rustle") || span.starts_with("cargo ") {
                for cmd in commands(span) {
                    for e in check_command(&cmd, tree, &new) {
                        err(n, e);
                    }
                }
            }
            for name in names_in_span(span) {
                if !tree.words.contains(name) && !new.contains(name) {
                    err(
                        n,
                        format!("`{name}` (in `{span}`) is nowhere in the source tree"),
                    );
                }
            }
        }
    }

    for (fence, lines) in &parsed.blocks {
        for (i, line) in lines.iter().enumerate() {
            for cmd in commands(line) {
                for e in check_command(&cmd, tree, &new) {
                    err(fence + 1 + i, e);
                }
            }
        }
        // An excerpt: `// PATH` on its first line.
        let Some(path) = lines
            .first()
            .and_then(|l| l.trim().strip_prefix("// "))
            .and_then(|l| l.split_whitespace().next())
            .filter(|p| is_path(p))
        else {
            continue;
        };
        let Some((_, source)) = tree.files.iter().find(|(p, _)| *p == root.join(path)) else {
            err(
                *fence,
                format!("excerpt of `{path}`, which is not in the source tree"),
            );
            continue;
        };
        for (i, line) in lines.iter().enumerate().skip(1) {
            let line = line.trim();
            let elided = line.is_empty() || line == "..." || line.starts_with("// ...");
            if !elided && !source.contains(line) {
                err(fence + 1 + i, format!("excerpt line not in {path}: {line}"));
            }
        }
    }
    errors
}

#[test]
fn the_book_names_only_what_exists() {
    let tree = Tree::load();
    let pages = book();
    let errors: Vec<String> = pages.iter().flat_map(|p| check_page(p, &tree)).collect();
    assert!(
        errors.is_empty(),
        "{} problems in the book:\n{}",
        errors.len(),
        errors.join("\n")
    );
    assert!(
        pages.len() > 9,
        "the index links to {} pages",
        pages.len() - 1
    );
}

#[test]
fn every_chapter_is_in_the_index_and_ends_with_an_exercise() {
    let index = read(&root().join("docs/README.md"));
    let linked: HashSet<String> = links(&index).into_iter().map(|(t, _)| t).collect();
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".md")
                && name.len() > 2
                && name.as_bytes()[..2].iter().all(u8::is_ascii_digit)
        })
        .collect();
    chapters.sort();
    assert!(chapters.len() >= 9, "{} chapters", chapters.len());
    for path in chapters {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            linked.contains(&name),
            "docs/README.md does not link {name}"
        );
        let text = read(&path);
        let exercise = text
            .find("\n## Exercise")
            .unwrap_or_else(|| panic!("{name} has no `## Exercise` section"));
        assert!(
            text[exercise..].contains("cargo test"),
            "{name}'s exercise names no `cargo test` command to check it with"
        );
    }
}

/// The checks catch what they are for: a made-up name, path, link, flag, subcommand, test
/// filter, excerpt line and figure each fail. (The made-up names are missing from the tree
/// because this file is left out of it.)
#[test]
fn the_checks_catch_what_they_are_for() {
    let tree = Tree::load();
    let problems = |text: &str| {
        let page = Page {
            path: root().join("docs/check.md"),
            name: "docs/check.md".into(),
            text: text.to_owned(),
        };
        check_page(&page, &tree)
    };
    let right = [
        "`gemv_bf16` in `gpu-kernels/src/gemv.rs`, `Gpu::residual_add_f32`, `sync_threads()`",
        "[a page](deploy.md) and `rustle profile --from docs/profile-llama3-8b-h200.json`",
        "`cargo run --release -- bench --shape llama3-8b --ctx 512,8192`",
        "`cargo test --release --test gpu -- kernel::gemv_bf16`",
        "```rust\n// gpu-kernels/src/residual.rs\n    crate::device::wait_for_previous_kernel();\n    ...\n```",
        "> Round 4, 2026-11-30, H200: \"RMSNorm went from 908.7 to 413.1 us per 8B step\"",
        "| a step | \"17.2 us\" | H200 | round 4 |",
        "<!-- not in the tree: geglu_f32 -->`geglu_f32`, `cargo test --test gpu -- kernel::geglu_f32`",
    ];
    for text in right {
        assert_eq!(problems(text), Vec::<String>::new(), "{text}");
    }
    let wrong = [
        "`gemv_bf17` in `gpu-kernels/src/gemv.rs`",
        "`gpu-kernels/src/gemv2.rs`",
        "`engine/no-such-folder/`",
        "[a chapter](99-missing.md)",
        "`launch_everything()`",
        "`rustle profile --no-such-flag`",
        "`rustle frobnicate --shape llama3-8b`",
        "`cargo test --release --test gpu -- kernel::gemv_bf17`",
        "`cargo test --release --test no_such_test_file`",
        "```rust\n// gpu-kernels/src/residual.rs\n    unsafe { *x.add(i) -= *delta.add(i) };\n```",
        "> Round 4, 2026-11-30, H200: \"RMSNorm went from 908.7 to 13.1 us per 8B step\"",
        "> Round 4, 2026-11-29, H200: \"RMSNorm went from 908.7 to 413.1 us per 8B step\"",
        "> Round 4, 2026-11-30: \"RMSNorm went from 908.7 to 413.1 us per 8B step\"",
        "> H200: \"RMSNorm went from 908.7 to 413.1 us per 8B step\"",
        "| a step | \"17.2 us\" | H200 | round 99 |",
    ];
    for text in wrong {
        assert!(!problems(text).is_empty(), "not caught: {text}");
    }
}
