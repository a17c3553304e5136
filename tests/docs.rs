//! The book in `docs/` against the tree it describes: a chapter that names a file, a function
//! or a command that no longer exists fails here, and so does a figure that is not in the
//! benchmark notebook (`bench/history/rounds.md`, rounds 1-59). And `BENCHMARKS.md` against
//! the records it is made from (`scripts/bench-tables.py --check`). No GPU needed.
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
//! - a figure (a blockquote, or a table row naming a round) quotes the notebook: each
//!   "double-quoted" text and each backticked `rustle` command in it occurs there (line breaks
//!   aside), each round it names is a round there, and each date it gives is in the heading
//!   of a round it names. A figure names its GPU (the H200 or the H100), or "no GPU" for one
//!   measured without (the build); a blockquote must also name a round and quote something;
//! - on the lessons page (`docs/lessons.md`), every list item names a round and a GPU, and
//!   every number of a list item or of a table row naming rounds (`4.52`, `1,083`, `660`: a
//!   decimal, or three digits or more) occurs in the text of the rounds it names.
//!
//! Numbered chapters (`docs/NN-*.md`) must each be linked from the index and end with an
//! exercise (a `## Exercise` heading and a `cargo test` command).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPUs the notebook has measured on; a figure names one, or says "no GPU" (the kernels'
/// build, timed on the CPU machine). (Add one here when a figure comes from another.)
const GPUS: &[&str] = &["H200", "H100", "no GPU"];

/// The round-by-round notebook the book's figures quote.
const NOTEBOOK: &str = "bench/history/rounds.md";

/// The page whose lessons are checked number by number against the rounds they name.
const LESSONS: &str = "docs/lessons.md";

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
    notebook: Notebook,
}

impl Tree {
    fn load() -> Tree {
        let files = source_files();
        Tree {
            words: word_set(&files),
            files,
            cli: Cli::from_binary(),
            notebook: Notebook::load(),
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

/// The round numbers `text` names: "round 4", "Round 16"; after "rounds", a list of numbers
/// and ranges ("rounds 11, 16 and 18"; "rounds 27-29" counts 27, 28 and 29). A date or a
/// decimal is not a round ("round 4, 2026-11-30" names round 4).
fn rounds_named(text: &str) -> Vec<u32> {
    let lower = text.to_lowercase();
    let mut out = Vec::new();
    for (at, _) in lower.match_indices("round") {
        let after = &lower[at + 5..];
        let plural = after.starts_with('s');
        let Some((mut n, mut rest)) = round_number(after.trim_start_matches('s').trim_start())
        else {
            continue;
        };
        loop {
            let range = rest.strip_prefix('-').and_then(round_number);
            match range {
                Some((m, r)) if plural && m > n => {
                    out.extend(n..=m);
                    rest = r;
                }
                _ => out.push(n),
            }
            let next = [", and ", ", ", " and "]
                .iter()
                .find_map(|sep| rest.strip_prefix(sep).and_then(round_number));
            match next {
                Some((m, r)) if plural => (n, rest) = (m, r),
                _ => break,
            }
        }
    }
    out
}

/// A round number at the start of `s`, and what follows it: one to three digits, not the
/// start of a longer number (a date, a decimal).
fn round_number(s: &str) -> Option<(u32, &str)> {
    let digits = s.chars().take_while(|c| c.is_ascii_digit()).count();
    let rest = &s[digits..];
    let longer =
        rest.starts_with(['.', ',']) && rest[1..].starts_with(|c: char| c.is_ascii_digit());
    if !(1..=3).contains(&digits) || longer || rest.starts_with(|c: char| c.is_alphanumeric()) {
        return None;
    }
    Some((s[..digits].parse().ok()?, rest))
}

/// The numbers of `text` a lesson is held to, as the notebook writes them (`1,083`, `0.477`,
/// `4224`): a decimal, or three digits or more; not inside a word (`H200`, `sm_90`).
fn numbers(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let in_word = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !digit(i) || in_word {
            i += 1;
            continue;
        }
        let start = i;
        // A thousands comma or a decimal point between two digits continues the number.
        while digit(i) || (matches!(b.get(i), Some(b'.' | b',')) && digit(i + 1)) {
            i += 1;
        }
        let n = &text[start..i];
        if n.contains(['.', ',']) || n.len() >= 3 {
            out.push(n);
        }
    }
    out
}

/// Whether `number` stands alone in `text`: not inside a longer number.
fn occurs_alone(number: &str, text: &str) -> bool {
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + number.len()..];
        let mut next = after.chars();
        let continues = match next.next() {
            Some(c) if c.is_ascii_digit() => true,
            Some('.' | ',') => next.next().is_some_and(|c| c.is_ascii_digit()),
            _ => false,
        };
        !before.is_some_and(|c| c.is_ascii_digit() || c == '.' || c == ',') && !continues
    })
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

/// The notebook (`bench/history/rounds.md`): its text (normalized), each round's heading line
/// and each round's own text (its heading to the next heading of its level or above).
struct Notebook {
    text: String,
    headings: HashMap<u32, String>,
    rounds: HashMap<u32, String>,
}

impl Notebook {
    fn load() -> Notebook {
        Notebook::parse(&read(&root().join(NOTEBOOK)))
    }

    fn parse(raw: &str) -> Notebook {
        let (mut headings, mut rounds) = (HashMap::new(), HashMap::new());
        let mut current: Option<(u32, String)> = None;
        for line in raw.lines() {
            let heading = line.starts_with("## ") || line.starts_with("### ");
            if heading && let Some((n, text)) = current.take() {
                rounds.insert(n, text);
            }
            let round = line
                .strip_prefix("### ")
                .and_then(|rest| rest.split_once(". "))
                .and_then(|(n, _)| n.parse().ok());
            if let Some(n) = round {
                headings.insert(n, line.to_owned());
                current = Some((n, String::new()));
            }
            if let Some((_, text)) = current.as_mut() {
                text.push_str(line);
                text.push('\n');
            }
        }
        if let Some((n, text)) = current {
            rounds.insert(n, text);
        }
        Notebook {
            text: normalized(raw),
            headings,
            rounds,
        }
    }

    /// What is wrong with one figure: a blockquote's text or a table row.
    fn check_figure(&self, figure: &str, blockquote: bool, tree: &Tree) -> Vec<String> {
        let mut errors = Vec::new();
        let rounds = rounds_named(figure);
        let quoted = quotes(figure);
        if blockquote && (rounds.is_empty() || quoted.is_empty()) {
            errors.push("a figure (blockquote) must name its round and quote the notebook".into());
        }
        if !GPUS.iter().any(|g| figure.contains(g)) {
            errors.push(format!(
                "a figure must name the GPU it was measured on ({GPUS:?})"
            ));
        }
        for q in quoted {
            if !self.text.contains(&normalized(q)) {
                errors.push(format!("\"{q}\" is not in {NOTEBOOK}"));
            }
        }
        for span in code_spans(figure) {
            if span.starts_with("rustle ") {
                if !self.text.contains(&normalized(span)) {
                    errors.push(format!("the command `{span}` is not in {NOTEBOOK}"));
                }
                for cmd in commands(span) {
                    errors.extend(check_command(&cmd, tree, &HashSet::new()));
                }
            }
        }
        for &n in &rounds {
            if !self.headings.contains_key(&n) {
                errors.push(format!("{NOTEBOOK} has no round {n}"));
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

/// The lessons page's list items and table rows, each with its first line: an item is a line
/// starting `- ` and the indented lines after it.
fn lessons(text: &str) -> Vec<(usize, Unit, String)> {
    let mut out: Vec<(usize, Unit, String)> = Vec::new();
    let mut open = false;
    for (n, line) in parse(text).prose {
        if let Some(item) = line.strip_prefix("- ") {
            out.push((n, Unit::Text, item.to_owned()));
            open = true;
        } else if line.starts_with('|') {
            out.push((n, Unit::Row, line.to_owned()));
            open = false;
        } else if open && line.starts_with("  ") {
            let (_, _, item) = out.last_mut().unwrap();
            item.push(' ');
            item.push_str(line.trim());
        } else {
            open = false;
        }
    }
    out
}

/// What is wrong with the lessons page: a list item that names no round or no GPU, a round the
/// notebook lacks, or a number (of an item, or of a table row naming rounds) that none of the
/// rounds it names holds.
fn check_lessons(text: &str, notebook: &Notebook) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for (n, kind, lesson) in lessons(text) {
        let rounds = rounds_named(&lesson);
        if kind == Unit::Row && rounds.is_empty() {
            continue;
        }
        if rounds.is_empty() {
            errors.push((n, "a lesson must name the rounds it comes from".to_owned()));
            continue;
        }
        if !GPUS.iter().any(|g| lesson.contains(g)) {
            errors.push((n, format!("a lesson must name its GPU ({GPUS:?})")));
        }
        let mut haystack = String::new();
        for r in &rounds {
            match notebook.rounds.get(r) {
                Some(round) => haystack.push_str(round),
                None => errors.push((n, format!("{NOTEBOOK} has no round {r}"))),
            }
        }
        for number in numbers(&lesson) {
            if !occurs_alone(number, &haystack) {
                errors.push((n, format!("{number} is in none of rounds {rounds:?}")));
            }
        }
    }
    errors
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
        // A figure's names are the history's, checked against the notebook alone.
        match kind {
            Unit::Quote => {
                for e in tree.notebook.check_figure(&text, true, tree) {
                    err(n, e);
                }
                continue;
            }
            Unit::Row if !rounds_named(&text).is_empty() => {
                for e in tree.notebook.check_figure(&text, false, tree) {
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
    if page.name == LESSONS {
        for (n, e) in check_lessons(&page.text, &tree.notebook) {
            err(n, e);
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

/// The rounds a figure or a lesson names, and the numbers a lesson is held to.
#[test]
fn rounds_and_numbers_are_read_as_written() {
    assert_eq!(rounds_named("Round 4, 2026-11-30, H200"), [4]);
    assert_eq!(rounds_named("rounds 11, 16 and 18"), [11, 16, 18]);
    assert_eq!(
        rounds_named("(rounds 27-29; round 31's code)"),
        [27, 28, 29, 31]
    );
    assert_eq!(rounds_named("round 16, 8 sequences"), [16]);
    assert_eq!(rounds_named("rounds 33, 35, and 42."), [33, 35, 42]);
    assert_eq!(
        numbers("H200: 1,083 tok/s, 0.477 of copy, 660 blocks, 4 warps, sm_90, 17.3%."),
        ["1,083", "0.477", "660", "17.3"]
    );
    assert!(occurs_alone("0.65", "0.65 of it"));
    assert!(!occurs_alone("0.65", "0.654 of it"));
    assert!(!occurs_alone("1.3", "11.3 us"));
}

/// The lessons check catches a number its rounds do not hold, a lesson with no round or no
/// GPU, and a round the notebook lacks.
#[test]
fn the_lessons_check_catches_what_it_is_for() {
    let notebook = Notebook::load();
    let problems = |text: &str| check_lessons(text, &notebook);
    let right = [
        "- **Graphs.** +6% (8B) and +13% (1B), not +60% (H200, round 2).",
        "- The ceilings: copy 4209 to 4261 GB/s and read 4463 to 4537 (H200,\n  round 2).",
        "| a row | 0 MB 203.6 tok/s (H200) | round 8 |",
        "| tried | measured | round |",
    ];
    for text in right {
        assert_eq!(problems(text), Vec::<(usize, String)>::new(), "{text}");
    }
    let wrong = [
        "- Copy measured 4209 to 4262 GB/s (H200, round 2).",
        "- Copy measured 4209 GB/s (H200).",
        "- Copy measured 4209 GB/s (round 2).",
        "- Copy measured 4209 GB/s (H200, round 99).",
        "| a row | 0 MB 203.7 tok/s (H200) | round 8 |",
    ];
    for text in wrong {
        assert!(!problems(text).is_empty(), "not caught: {text}");
    }
}

/// Code comments point at the lessons page by section (`docs/lessons.md#quantized-gemvs`):
/// each section they name is a heading of the page.
#[test]
fn comments_point_at_sections_of_the_lessons_page() {
    let page = read(&root().join(LESSONS));
    let slugs: HashSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut cited = 0;
    for (path, text) in source_files() {
        for (at, _) in text.match_indices("docs/lessons.md#") {
            let rest = &text[at + "docs/lessons.md#".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .unwrap_or(rest.len());
            let section = &rest[..end];
            assert!(
                slugs.contains(section),
                "{}: docs/lessons.md#{section} is no section of the page (sections: {slugs:?})",
                path.display()
            );
            cited += 1;
        }
    }
    assert!(cited > 0, "no code comment points at docs/lessons.md");
}

/// `BENCHMARKS.md` is what `scripts/bench-tables.py` makes of the records in `bench/results/`
/// (and each transcribed figure is in the round it names).
#[test]
fn benchmarks_md_is_what_the_records_make() {
    let out = Command::new("python3")
        .arg(root().join("scripts/bench-tables.py"))
        .arg("--check")
        .output()
        .expect("running python3 scripts/bench-tables.py --check");
    assert!(
        out.status.success(),
        "BENCHMARKS.md is not what the records make; run scripts/bench-tables.py:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tables script reads the reports `rustle bench --json` writes: each of the three, made
/// by the engine's own types and serialized as `--json` does, goes into the row it should.
#[test]
fn the_tables_script_reads_what_rustle_bench_writes() {
    use rustle::tools::batch_bench::BatchResult;
    use rustle::tools::bench::{BenchReport, DecodeResult, PrefillResult};
    use rustle::tools::ceilings::Bandwidth;
    use rustle::tools::prefill_matmuls::GemmResult;
    use rustle::tools::serve_bench::{Percentiles, Roofline, ServeReport, StepGaps};
    use rustle::tools::speculate_bench::{PromptRun, SpeculateReport, VerifyCost};

    let decode = |ctx, graph, tok_per_s: f64, ceiling: f64| DecodeResult {
        ctx,
        graph,
        tok_per_s,
        bytes_per_token: 4.68e9,
        achieved_bytes_per_s: tok_per_s * 4.68e9,
        share_of_copy: tok_per_s / ceiling,
        share_of_read: tok_per_s / ceiling * 0.97,
        ceiling_tok_per_s: ceiling,
    };
    let batch1 = BenchReport {
        gpu: "NVIDIA H100 80GB HBM3".into(),
        model: "llama3-8b (synthetic)".into(),
        weight_bytes_per_token: 4_680_000_000,
        bandwidth: Bandwidth {
            copy_bytes_per_s: 3.0e12,
            read_bytes_per_s: 3.1e12,
        },
        gemv: vec![],
        gemm: vec![GemmResult {
            name: "qkv".into(),
            n: 512,
            n_in: 4096,
            n_out: 6144,
            wgmma_us: Some(50.0),
            mma_us: 125.0,
            skinny_us: None,
            cublas_us: Some(40.0),
            wgmma_plan: None,
            plans: vec![],
        }],
        decode: vec![
            decode(512, true, 376.4, 641.0),
            decode(8192, true, 300.0, 500.0),
            decode(512, false, 355.1, 641.0),
        ],
        step_profiles: vec![],
        prefill: PrefillResult {
            tokens: 512,
            seconds: 0.0231,
            tok_per_s: 512.0 / 0.0231,
            time_to_first_token_ms: 23.1,
        },
    };
    let batched = vec![BatchResult {
        sequences: 8,
        prompt_len: 512,
        steps: 32,
        prefill_tok_per_s: 9000.0,
        decode_tok_per_s: 1337.4,
        ms_per_step: 5.98,
        bytes_per_step: 5.0e9,
        ceiling_tok_per_s: 4800.0,
        kernels: vec![],
    }];
    let p = |p50, p99| Percentiles { p50, p90: p99, p99 };
    let serve = ServeReport {
        model: "llama3-8b (synthetic)".into(),
        device: "NVIDIA H100 80GB HBM3".into(),
        workload: "fixed: 512 in, 128 out".into(),
        requests: 256,
        seconds: 10.0,
        prompt_tokens: 131_072,
        output_tokens: 32_768,
        output_tok_per_s: 3276.8,
        total_tok_per_s: 16_384.0,
        ttft_ms: p(3982.0, 8580.0),
        tpot_ms: p(27.4, 30.0),
        steps: 300,
        peak_kv_blocks: 10_000,
        kv_blocks: 20_000,
        kv_dtype: "bf16".into(),
        preemptions: 0,
        prefix_hit_rate: 0.0,
        decode_steady: None,
        roofline: Some(Roofline {
            bandwidth: 3.0e12,
            matrix_flops: 7.0e14,
            bytes: 1.0e13,
            flops: 1.0e15,
            memory_seconds: 3.0,
            compute_seconds: 1.5,
            bound_seconds: 4.0,
            of_bound: 2.5,
        }),
        gaps: Some(StepGaps {
            gpu_seconds: 8.0,
            gap_seconds: 1.5,
            gap_ms: p(5.0, 6.0),
            gpu_of_bound: Some(2.0),
        }),
        kernels: vec![],
    };
    let verify = vec![
        VerifyCost {
            tokens: 1,
            ms: 5.767,
            of_decode: 1.0,
        },
        VerifyCost {
            tokens: 8,
            ms: 6.827,
            of_decode: 1.1838,
        },
    ];
    let run = |same_tokens| PromptRun {
        task: "repeat".into(),
        prompt_tokens: 104,
        tokens: 42,
        plain_tok_per_s: 1200.0,
        speculative_tok_per_s: 3000.0,
        drafted: 60,
        accepted: 45,
        passes: 12,
        same_tokens,
    };
    let speculate = SpeculateReport {
        model: "SmolLM2-135M-Instruct.Q4_1.gguf (GGUF, llama)".into(),
        device: "NVIDIA H100 80GB HBM3".into(),
        guesser: "prompt lookup".into(),
        speculate: 16,
        runs: vec![run(true), run(false)],
        plain_tok_per_s: 1287.7,
        speculative_tok_per_s: 2400.5,
        acceptance: 0.53,
        tokens_per_pass: 3.04,
        speedup: 1.864,
    };
    let dir = std::env::temp_dir().join(format!("rustle-bench-tables-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = |name: &str, command: &str, report: serde_json::Value| {
        let record = serde_json::json!({
            "kind": "rustle-bench", "commit": "abc1234", "date": "2026-12-07", "gpu": "H100",
            "command": command, "report": report,
            "anchor": {"engine": "llama.cpp llama-bench", "command": "llama-bench -n 128",
                       "figures": [{"ctx": 512, "tok/s": "279.3"}]},
        });
        std::fs::write(dir.join(name), record.to_string()).unwrap();
    };
    record(
        "a.json",
        "rustle bench --shape llama3-8b --weights q4_k_m --ctx 512,8192 --json",
        serde_json::to_value(&batch1).unwrap(),
    );
    record(
        "b.json",
        "rustle bench --batch 8 --prompt-len 512 --steps 32 --weights q4_k_m --json",
        serde_json::to_value(&batched).unwrap(),
    );
    record(
        "c.json",
        "rustle bench --serve --shape llama3-8b --requests 256 --json",
        serde_json::to_value(&serve).unwrap(),
    );
    record(
        "d.json",
        "rustle bench --verify 8 --shape llama3-8b --prompt-len 512 --json",
        serde_json::to_value(&verify).unwrap(),
    );
    record(
        "e.json",
        "rustle bench --speculate 16 --output-len 256 --json",
        serde_json::to_value(&speculate).unwrap(),
    );
    let out = Command::new("python3")
        .arg(root().join("scripts/bench-tables.py"))
        .args(["--print", "--records"])
        .arg(&dir)
        .output()
        .expect("running python3 scripts/bench-tables.py");
    std::fs::remove_dir_all(&dir).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let command = "`rustle bench --shape llama3-8b --weights q4_k_m --ctx 512,8192 --json`";
    let rows = [
        format!(
            "| H100 | llama3-8b | q4_k_m | 512 | 376.4 | 58.7% (641.0) | llama.cpp 279.3 | abc1234 | 2026-12-07 | {command} | record |"
        ),
        format!(
            "| H100 | llama3-8b | q4_k_m | 8192 | 300.0 | 60.0% (500.0) | - | abc1234 | 2026-12-07 | {command} | record |"
        ),
        format!(
            "| H100 | llama3-8b | q4_k_m | 512 | 23.1 | 22,165 | 0.80 | - | abc1234 | 2026-12-07 | {command} | record |"
        ),
        "| H100 | llama3-8b | q4_k_m | 8 | 512 + 32 | 1,337.4 | 27.9% (4,800) | 5.98 | - |".into(),
        "| H100 | llama3-8b | bf16 | fixed: 512 in, 128 out | 256 | all at once | 512 | 3,276.8 | 3,982.0 / 8,580.0 | 27.4 | 40.0% | 50.0% | 1.50 s (15%) |"
            .into(),
        "| H100 | llama3-8b | bf16 | 512 | 8 | 6.827 | 1.18x |".into(),
        "| H100 | SmolLM2-135M-Instruct.Q4_1.gguf | stored | prompt lookup | 16 | 256 | 1,287.7 | 2,400.5 | 1.86x | 53% | 3.04 | 1 of 2 |".into(),
    ];
    for row in rows {
        assert!(text.contains(&row), "no row {row} in:\n{text}");
    }
    assert!(
        !text.contains("355.1"),
        "a decode row with graphs off is in the tables:\n{text}"
    );
}
