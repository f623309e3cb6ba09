//! The layer rule of `DESIGN.md` ("The engine, inside"), enforced from the engine's own
//! source: config < topology < memory < wire < metadata < transport < engine. A module may
//! use lower ones only; `wire` uses nothing else in the crate; `memory` uses no transport.
//!
//! Every `crate::...` and `super::...` path of `engine/src/**.rs` (in `use` items and in
//! code) is resolved to the top-level module it names, root re-exports of `lib.rs`
//! (`crate::Config`) included, and checked against [`MODULES`]. Comments and string
//! literals are skipped. A top-level module missing from [`MODULES`] fails the test: add
//! it there, with a rank and the reason for it.
//!
//! The same sources are held to a size: no file over [`FILE_LINES`] lines and no function
//! over [`FN_LINES`], unless a `// size: <reason>` comment says why ([`SIZE_MARKER`]: among
//! a file's opening lines, or right above a function), or [`SIZE_PENDING`] lists it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Every top-level module of the engine (`src/NAME.rs` or `src/NAME/`), keyed by name,
/// with its rank and why it sits there. A module may use modules of lower rank only.
/// The layers of `DESIGN.md` are at 10, 20, .. 70; shared modules sit where what they use
/// and who uses them puts them. To classify a new module, add a line.
const MODULES: &[(&str, u32, &str)] = &[
    (
        "net",
        5,
        "shared: socket helpers for metadata and transport; uses nothing of ours",
    ),
    (
        "conn_limit",
        3,
        "shared: caps on connections per listener and per peer address; uses nothing of ours",
    ),
    (
        "deadline_io",
        3,
        "shared: socket reads and writes under one whole-request deadline; uses nothing of ours",
    ),
    (
        "log_throttle",
        3,
        "shared: rate-limits the warning a bound logs when it bites; uses nothing of ours",
    ),
    (
        "http_serve",
        4,
        "shared: the bounded HTTP/1.1 server of the metadata server, the metrics endpoint \
         and the master's admin port; uses conn_limit and log_throttle",
    ),
    (
        "sys",
        3,
        "shared: the OS's C interface (libc) behind safe functions; uses nothing of ours",
    ),
    ("config", 10, "layer: typed MC_* configuration"),
    (
        "logging",
        12,
        "shared: the tracing subscriber; uses config's log level only",
    ),
    (
        "device",
        15,
        "shared: GPU runtimes loaded at run time; topology asks them for GPUs, memory for a \
         location's device, transports copy through them; uses config only",
    ),
    (
        "verbs",
        16,
        "shared: libibverbs loaded at run time (FFI and RAII wrappers); topology may ask it \
         for ports and GIDs, the RDMA transport drives it; uses nothing of ours",
    ),
    ("topology", 20, "layer: HCAs, NUMA, GPU-to-NIC distance"),
    ("memory", 30, "layer: registered regions"),
    ("wire", 40, "layer: pure codecs"),
    (
        "error",
        45,
        "shared: TransferError, why one request failed; filled by transports into batches \
         (the engine's own EngineError lives in engine/)",
    ),
    (
        "metrics",
        46,
        "shared: request counters and latency histograms that batches record into and the \
         engine reads; transports report their connection counters in its type; uses error",
    ),
    (
        "task",
        47,
        "shared: batch completion state that transports fill and the engine reads; uses error",
    ),
    ("metadata", 50, "layer: finding a peer's descriptor"),
    (
        "transport",
        60,
        "layer: TCP (and RDMA) behind the Transport trait",
    ),
    (
        "notify_queue",
        65,
        "shared: the byte-bounded queue of received notifications; uses wire, used by engine",
    ),
    ("engine", 70, "layer: the public API"),
];

/// `wire` is pure: it uses nothing else of the crate, whatever the ranks say.
const PURE: &str = "wire";

/// Pairs (from, to) that must never occur, whatever the ranks say.
const FORBIDDEN: &[(&str, &str, &str)] = &[(
    "memory",
    "transport",
    "memory knows no transport (DESIGN.md)",
)];

/// Paths a module must not name even where the ranks allow: (from, path prefix, why).
const HIDDEN: &[(&str, [&str; 2], &str)] = &[
    (
        "engine",
        ["transport", "tcp"],
        "the engine knows the Transport trait, not TCP's types (DESIGN.md)",
    ),
    (
        "engine",
        ["transport", "rdma"],
        "the engine knows the Transport trait, not RDMA's types (DESIGN.md)",
    ),
];

fn rank(module: &str) -> Option<u32> {
    MODULES
        .iter()
        .find(|(name, _, _)| *name == module)
        .map(|&(_, r, _)| r)
}

// ---------------------------------------------------------------------------------------
// Tokens: identifiers, `::` and single punctuation, with comments, strings and chars gone.
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens of `src` with their line numbers (1-based).
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let at = |j: usize| c.get(j).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i, false, 0, &mut line);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\'', '\u{..}') or a lifetime ('a, which stays an ident).
            if at(i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr");
            if prefix && (at(i) == '"' || (at(i) == '#' && word.ends_with('r'))) {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i = skip_string(&c, i, word.ends_with('r'), hashes, &mut line);
            } else if word == "b" && at(i) == '\'' {
                i += if at(i + 1) == '\\' { 4 } else { 3 };
                while i < c.len() && c[i - 1] != '\'' {
                    i += 1;
                }
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Skips the string literal whose opening quote is at `c[i]` (raw: no escapes, closed by
/// `"` and `hashes` `#`s); returns the index after its end.
fn skip_string(c: &[char], mut i: usize, raw: bool, hashes: usize, line: &mut usize) -> usize {
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' if !raw => {
                // An escaped line break (a string continued on the next line) is a line.
                *line += usize::from(c.get(i + 1) == Some(&'\n'));
                i += 2;
            }
            '"' if (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) => return i + 1 + hashes,
            ch => {
                *line += usize::from(ch == '\n');
                i += 1;
            }
        }
    }
    i
}

// ---------------------------------------------------------------------------------------
// References: which top-level module each path names.
// ---------------------------------------------------------------------------------------

/// One path of a file that starts at the crate root.
#[derive(Debug)]
struct Reference {
    line: usize,
    /// Its segments after the crate root (`crate::transport::tcp::Slice` gives
    /// `["transport", "tcp", "Slice"]`); `*` for a glob.
    path: Vec<String>,
}

/// The paths of the use tree (or code path) that starts at `toks[i]`: `X::y`, `{A, B::c}`,
/// `*`, nested; `as` aliases and generic arguments end a path.
fn expand(toks: &[(Tok, usize)], i: usize) -> Vec<Vec<String>> {
    match toks.get(i) {
        Some((Tok::Ident(name), _)) => {
            let tails = match toks.get(i + 1) {
                Some((Tok::PathSep, _)) => expand(toks, i + 2),
                _ => Vec::new(),
            };
            if tails.is_empty() {
                return vec![vec![name.clone()]];
            }
            tails
                .into_iter()
                .map(|t| std::iter::once(name.clone()).chain(t).collect())
                .collect()
        }
        Some((Tok::Punct('*'), _)) => vec![vec!["*".to_string()]],
        Some((Tok::Punct('{'), _)) => {
            // Each item of the group starts after `{` or after a `,` at this depth.
            let (mut out, mut depth, mut item_start) = (Vec::new(), 0, true);
            for j in i + 1..toks.len() {
                match toks[j].0 {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') if depth == 0 => break,
                    Tok::Punct('}') => depth -= 1,
                    Tok::Punct(',') if depth == 0 => {
                        item_start = true;
                        continue;
                    }
                    _ => {}
                }
                if item_start && depth == 0 {
                    out.extend(expand(toks, j));
                }
                item_start = false;
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Paths of `src` that start at the crate root, for a file whose module path is `path`
/// (`["transport", "tcp", "client"]`); inline `mod x { .. }` blocks count as a level.
fn root_references(src: &str, path: &[String]) -> Vec<Reference> {
    let toks = tokenize(src);
    let ident = |j: usize, s: &str| matches!(toks.get(j), Some((Tok::Ident(w), _)) if w == s);
    let sep = |j: usize| matches!(toks.get(j), Some((Tok::PathSep, _)));
    let (mut refs, mut depth, mut inline) = (Vec::new(), 0usize, Vec::<usize>::new());
    for (i, (t, line)) in toks.iter().enumerate() {
        match t {
            Tok::Punct('{') => {
                depth += 1;
                if i >= 2 && ident(i - 2, "mod") {
                    inline.push(depth);
                }
            }
            Tok::Punct('}') => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        // Only the start of a path: not `a::crate`, not `$crate`.
        let starts = i == 0 || !(sep(i - 1) || toks[i - 1].0 == Tok::Punct('$'));
        if !starts {
            continue;
        }
        let after = if ident(i, "crate") && sep(i + 1) {
            Some(i + 2)
        } else if ident(i, "super") && sep(i + 1) {
            let mut j = i;
            let mut ups = 0;
            while ident(j, "super") && sep(j + 1) {
                ups += 1;
                j += 2;
            }
            // Up `ups` levels from path + inline modules: the root only when it climbs them all.
            (ups == path.len() + inline.len()).then_some(j)
        } else {
            None
        };
        if let Some(j) = after {
            refs.extend(
                expand(&toks, j)
                    .into_iter()
                    .map(|path| Reference { line: *line, path }),
            );
        }
    }
    refs
}

/// Root re-exports of `lib.rs` (`pub use config::Config;`): exported name -> module.
fn root_reexports(lib_rs: &str) -> BTreeMap<String, String> {
    let toks = tokenize(lib_rs);
    let mut map = BTreeMap::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].0 == Tok::Ident("use".into()) {
            let end = (i..toks.len())
                .find(|&j| toks[j].0 == Tok::Punct(';'))
                .unwrap_or(toks.len());
            // `use crate::x::..` and `use self::x::..` name the module after the prefix.
            let prefixed =
                matches!(&toks.get(i + 1), Some((Tok::Ident(w), _)) if w == "crate" || w == "self");
            let first = if prefixed { i + 3 } else { i + 1 };
            if let Some((Tok::Ident(module), _)) = toks.get(first) {
                // The names it binds: each ident that ends a path (before `,`, `}` or `;`),
                // or the alias after `as`.
                for j in first + 1..end {
                    if let Tok::Ident(name) = &toks[j].0 {
                        let ends =
                            matches!(toks.get(j + 1), Some((Tok::Punct(',' | '}' | ';'), _)));
                        if ends && name != "self" {
                            map.insert(name.clone(), module.clone());
                        }
                    }
                }
            }
            i = end;
        }
        i += 1;
    }
    map
}

// ---------------------------------------------------------------------------------------
// The check.
// ---------------------------------------------------------------------------------------

/// The top-level module and module path of a file under `src/` (`None` for the crate
/// root and binaries, which are not part of a layer).
fn module_path(rel: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.first().map(String::as_str) {
        None | Some("lib" | "main" | "bin") => None,
        _ if parts.last().map(String::as_str) == Some("mod") => {
            Some(parts[..parts.len() - 1].to_vec())
        }
        _ => Some(parts),
    }
}

/// Every breach of the rules among `files` (paths relative to `src/`, with their text).
fn check(files: &[(PathBuf, String)]) -> Vec<String> {
    scan(files).0.into_iter().map(|(_, p)| p).collect()
}

/// Which rule a problem breaks: the layers (ranks, `PURE`, `FORBIDDEN`, classification) or
/// the transport seam (`HIDDEN`, which issue 10 brings in), checked by separate tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rule {
    Layers,
    Seam,
}

/// Uses (from, to) between top-level modules.
type Edges = BTreeSet<(String, String)>;

/// The breaches of the rules among `files`, and every use (from, to) between top-level
/// modules.
fn scan(files: &[(PathBuf, String)]) -> (Vec<(Rule, String)>, Edges) {
    let lib_rs = files
        .iter()
        .find(|(p, _)| p == Path::new("lib.rs"))
        .map_or("", |(_, s)| s.as_str());
    let reexports = root_reexports(lib_rs);
    let (mut problems, mut edges, mut unclassified) =
        (Vec::new(), BTreeSet::new(), BTreeSet::new());
    for (rel, src) in files {
        let Some(path) = module_path(rel) else {
            continue;
        };
        let from = path[0].as_str();
        let Some(from_rank) = rank(from) else {
            unclassified.insert(from.to_string());
            continue;
        };
        for r in root_references(src, &path) {
            let at = format!("src/{}:{}", rel.display(), r.line);
            let name = r.path[0].as_str();
            let to = if rank(name).is_some() {
                name.to_string()
            } else if let Some(m) = reexports.get(name) {
                m.clone()
            } else {
                let p = format!(
                    "{at}: `crate::{name}` is neither a top-level module nor a re-export of \
                     lib.rs (a glob of the root hides what is used; name the module)"
                );
                problems.push((Rule::Layers, p));
                continue;
            };
            if to == from {
                continue;
            }
            edges.insert((from.to_string(), to.clone()));
            let Some(to_rank) = rank(&to) else {
                unclassified.insert(to);
                continue;
            };
            let hidden = HIDDEN
                .iter()
                .find(|(f, prefix, _)| *f == from && r.path.len() > 1 && r.path[..2] == prefix[..]);
            let forbidden = FORBIDDEN
                .iter()
                .find(|(f, t, _)| (*f, *t) == (from, to.as_str()));
            if let Some((_, _, why)) = hidden {
                let p = format!("{at}: {from} uses crate::{}: {why}", r.path.join("::"));
                problems.push((Rule::Seam, p));
            }
            let layers = if from == PURE {
                Some(format!(
                    "{at}: {from} uses {to}: {PURE} uses nothing else of the crate"
                ))
            } else if let Some((_, _, why)) = forbidden {
                Some(format!("{at}: {from} uses {to}: {why}"))
            } else if to_rank >= from_rank {
                Some(format!(
                    "{at}: {from} (rank {from_rank}) uses {to} (rank {to_rank}): \
                     a module may use lower ranks only"
                ))
            } else {
                None
            };
            problems.extend(layers.map(|p| (Rule::Layers, p)));
        }
    }
    for m in unclassified {
        let p = format!(
            "module `{m}` is not classified: add it to MODULES in engine/tests/layering.rs \
             with its rank and the reason"
        );
        problems.push((Rule::Layers, p));
    }
    problems.sort();
    (problems, edges)
}

/// Every `.rs` file under `dir`, relative to `root`, with its text.
fn sources(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let p = entry
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .path();
        if p.is_dir() {
            sources(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            out.push((rel, text));
        }
    }
}

fn engine_sources() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    files.sort();
    files
}

/// The problems of the engine's own source that break `rule`, one per line.
fn engine_problems(rule: Rule) -> Vec<String> {
    let files = engine_sources();
    assert!(files.len() > 10, "found only {} source files", files.len());
    let (problems, edges) = scan(&files);
    eprintln!("uses between top-level modules: {edges:?}");
    // The engine chooses among transports: a scan that misses that use is blind.
    assert!(
        edges.contains(&("engine".to_string(), "transport".to_string())),
        "the scan found no use of transport by engine: {edges:?}"
    );
    let mut out: Vec<String> = problems
        .into_iter()
        .filter(|(r, _)| *r == rule)
        .map(|(_, p)| p)
        .collect();
    if rule == Rule::Layers {
        // The table names only modules that exist.
        let present: BTreeSet<String> = files
            .iter()
            .filter_map(|(rel, _)| module_path(rel).map(|p| p[0].clone()))
            .collect();
        for (name, _, _) in MODULES {
            if !present.contains(*name) {
                out.push(format!(
                    "MODULES lists `{name}`, which src/ no longer has: remove its line"
                ));
            }
        }
    }
    out
}

fn report(problems: &[String]) -> String {
    let mut report = String::new();
    for p in problems {
        let _ = writeln!(report, "  {p}");
    }
    report
}

#[test]
fn the_engine_keeps_its_layers() {
    let problems = engine_problems(Rule::Layers);
    assert!(
        problems.is_empty(),
        "layer rule broken ({}):\n{}",
        problems.len(),
        report(&problems)
    );
}

/// DESIGN.md: the engine picks a transport through the `Transport` trait and knows none of
/// a transport's own types (issue 10, part 3). Fails until the engine is rewritten so.
#[test]
fn the_engine_knows_no_transport_types() {
    let problems = engine_problems(Rule::Seam);
    assert!(
        problems.is_empty(),
        "the engine names a transport's types ({}):\n{}",
        problems.len(),
        report(&problems)
    );
}

// ---------------------------------------------------------------------------------------
// Sizes: no file over FILE_LINES lines, no function over FN_LINES, unless it says why.
// ---------------------------------------------------------------------------------------

/// Lines an engine source file may have without saying why it needs more.
const FILE_LINES: usize = 800;

/// Lines a function may span (from its `fn` line to its closing brace, comments and
/// blank lines included) without saying why it needs more.
const FN_LINES: usize = 80;

/// The comment that says why a file or function is longer: `// size: <reason>`, the
/// reason not empty. A file's is among its opening lines (before the first line that
/// starts with a letter: its module doc, inner attributes and comments); a function's is
/// among the comment and attribute lines right above its `fn` line. Test modules and
/// test functions are held to the same limits.
const SIZE_MARKER: &str = "// size:";

/// Files and functions over the limits that are left as they are for now, each with why:
/// (file under `src/`, function or `""` for the file itself, why). An entry that is no
/// longer over its limit, or that has its own marker, fails the test: remove its line.
const SIZE_PENDING: &[(&str, &str, &str)] = &[];

/// The reason of a `// size:` marker on `line`, if it is one with a reason.
fn size_reason(line: &str) -> Option<&str> {
    let reason = line.trim().strip_prefix(SIZE_MARKER)?.trim();
    (!reason.is_empty()).then_some(reason)
}

/// Whether the opening lines of `src` carry a size marker.
fn file_says_why(src: &str) -> bool {
    src.lines()
        .take_while(|l| !l.starts_with(|c: char| c.is_alphabetic()))
        .any(|l| size_reason(l).is_some())
}

/// Whether the comment and attribute lines right above line `fn_line` (1-based) carry a
/// size marker.
fn fn_says_why(lines: &[&str], fn_line: usize) -> bool {
    lines[..fn_line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("//") || l.starts_with("#["))
        .any(|l| size_reason(l).is_some())
}

/// A function of a file: its name, and the lines of its `fn` and of its closing brace.
#[derive(Debug)]
struct FnSpan {
    name: String,
    first: usize,
    last: usize,
}

impl FnSpan {
    fn lines(&self) -> usize {
        self.last - self.first + 1
    }
}

/// Every function with a body in `src` (nested ones too, each counted whole), found by
/// matching braces over its tokens (comments and literals are gone, so braces in them do
/// not count). A declaration without a body (`fn f();` in a trait or `extern` block) and
/// a `fn(..)` pointer type are not functions here.
fn functions(src: &str) -> Vec<FnSpan> {
    let toks = tokenize(src);
    let mut out = Vec::new();
    for (i, (t, line)) in toks.iter().enumerate() {
        let (Tok::Ident(kw), Some((Tok::Ident(name), _))) = (t, toks.get(i + 1)) else {
            continue;
        };
        if kw != "fn" {
            continue;
        }
        // The body's `{` is the first one outside the signature's parentheses and
        // brackets (`-> [u8; 4]` has a `;` that does not end it).
        let mut nesting = 0i32;
        let mut body = None;
        for (j, (tok, _)) in toks.iter().enumerate().skip(i + 2) {
            match tok {
                Tok::Punct('(' | '[') => nesting += 1,
                Tok::Punct(')' | ']') => nesting -= 1,
                Tok::Punct(';') if nesting == 0 => break,
                Tok::Punct('{') if nesting == 0 => {
                    body = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = body else { continue };
        let mut depth = 0usize;
        for (tok, end_line) in &toks[open..] {
            match tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        out.push(FnSpan {
                            name: name.clone(),
                            first: *line,
                            last: *end_line,
                        });
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every file and function of `files` over its limit without a marker or a line of
/// `pending` (as [`SIZE_PENDING`]), and every line of `pending` no longer needed.
fn size_problems(files: &[(PathBuf, String)], pending: &[(&str, &str, &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut pending_used = BTreeSet::new();
    let pending_at = |rel: &Path, name: &str| {
        pending
            .iter()
            .position(|(f, n, _)| Path::new(f) == rel && *n == name)
    };
    for (rel, src) in files {
        let lines: Vec<&str> = src.lines().collect();
        if lines.len() > FILE_LINES && !file_says_why(src) {
            match pending_at(rel, "") {
                Some(k) => {
                    pending_used.insert(k);
                }
                None => problems.push(format!(
                    "src/{}: {} lines (over {FILE_LINES}): split it by responsibility, or say \
                     why among its opening lines with `{SIZE_MARKER} <reason>`",
                    rel.display(),
                    lines.len()
                )),
            }
        }
        for f in functions(src) {
            if f.lines() <= FN_LINES || fn_says_why(&lines, f.first) {
                continue;
            }
            match pending_at(rel, &f.name) {
                Some(k) => {
                    pending_used.insert(k);
                }
                None => problems.push(format!(
                    "src/{}:{}: fn {} spans {} lines (over {FN_LINES}): cut it into named \
                     steps, or say why right above it with `{SIZE_MARKER} <reason>`",
                    rel.display(),
                    f.first,
                    f.name,
                    f.lines()
                )),
            }
        }
    }
    for (k, (file, name, _)) in pending.iter().enumerate() {
        if !pending_used.contains(&k) {
            let what = if name.is_empty() {
                String::new()
            } else {
                format!(" fn {name}")
            };
            problems.push(format!(
                "SIZE_PENDING lists src/{file}{what}, which is within its limit or says why \
                 itself now: remove its line"
            ));
        }
    }
    problems
}

#[test]
fn no_file_or_function_is_over_its_size_without_saying_why() {
    let files = engine_sources();
    assert!(files.len() > 10, "found only {} source files", files.len());
    let problems = size_problems(&files, SIZE_PENDING);
    assert!(
        problems.is_empty(),
        "size limit passed ({}):\n{}",
        problems.len(),
        report(&problems)
    );
}

// ---------------------------------------------------------------------------------------
// The checker itself, on synthetic trees: it can fail, and it does not cry wolf.
// ---------------------------------------------------------------------------------------

fn tree(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(p, s)| (PathBuf::from(p), s.to_string()))
        .collect()
}

#[test]
fn a_lower_layer_importing_a_higher_one_is_caught() {
    let problems = check(&tree(&[
        ("config.rs", "use crate::engine::TransferEngine;\n"),
        ("engine.rs", "use crate::config::Config;\n"),
    ]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("src/config.rs:1: config (rank 10) uses engine"),
        "{problems:?}"
    );
}

#[test]
fn wire_may_use_nothing_and_memory_no_transport() {
    let problems = check(&tree(&[
        ("wire/mod.rs", "pub mod tcp;\nuse super::config::Config;\n"),
        ("wire/tcp.rs", "fn f() { let _ = crate::net::connect(); }\n"),
        (
            "memory/raw/io.rs",
            "use super::super::super::transport::tcp::Lane;\n",
        ),
    ]));
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0]
        .contains("src/memory/raw/io.rs:1: memory uses transport: memory knows no transport"));
    assert!(problems[1].contains("src/wire/mod.rs:2: wire uses config: wire uses nothing else"));
    assert!(problems[2].contains("src/wire/tcp.rs:1: wire uses net"));
}

#[test]
fn groups_reexports_and_code_paths_are_resolved() {
    let problems = check(&tree(&[
        (
            "lib.rs",
            "pub mod engine;\npub use engine::{Batch, TransferEngine as Te};\n",
        ),
        (
            "topology.rs",
            "use crate::{config::Config, Te};\nfn f() { crate::transport::pick(); }\n",
        ),
    ]));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("src/topology.rs:1: topology (rank 20) uses engine"));
    assert!(problems[1].contains("src/topology.rs:2: topology (rank 20) uses transport"));
}

#[test]
fn comments_strings_inner_modules_and_upward_uses_pass() {
    let problems = check(&tree(&[
        (
            "memory.rs",
            "// use crate::engine;\n/* crate::transport /* nested */ */\n\
             const S: &str = \"crate::engine::X\";\nconst R: &str = r#\"crate::engine\"#;\n\
             fn f<'a>(x: &'a u8) -> char { 'c' }\n\
             use crate::device::Vendor;\nmod tests { use super::*; mod deep { use super::super::X; } }\n",
        ),
        ("transport/tcp/client.rs", "use super::Slice;\nuse crate::memory::MemoryRegistry;\n"),
        ("engine.rs", "use crate::transport::{self, Transport};\n"),
    ]));
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn an_unclassified_module_fails_with_what_to_do() {
    let problems = check(&tree(&[(
        "rdma_verbs/mod.rs",
        "use crate::config::Config;\n",
    )]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`rdma_verbs` is not classified: add it to MODULES"));
}

#[test]
fn a_glob_of_the_crate_root_is_refused() {
    let problems = check(&tree(&[("engine.rs", "use crate::*;\n")]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`crate::*`"), "{problems:?}");
}

/// A function of `lines` lines (its `fn` line and closing brace included), with `above`
/// right above it.
fn long_fn(name: &str, lines: usize, above: &str) -> String {
    let body = "    let _ = 1;\n".repeat(lines - 2);
    format!("{above}fn {name}() -> [u8; 2] {{\n{body}}}\n")
}

#[test]
fn a_long_function_is_caught_and_a_marked_one_passes() {
    let src = format!(
        "//! A module.\n\n{}\n{}\n{}",
        long_fn("at_the_limit", FN_LINES, ""),
        long_fn("over", FN_LINES + 1, "/// Docs.\n"),
        long_fn(
            "marked",
            FN_LINES + 1,
            "/// Docs.\n// size: one table, read top to bottom\n#[inline]\n"
        ),
    );
    let problems = size_problems(&tree(&[("wire/tables.rs", &src)]), &[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("src/wire/tables.rs:") && problems[0].contains("fn over spans 81"),
        "{problems:?}"
    );
}

#[test]
fn functions_are_found_by_their_braces_not_their_text() {
    let src = "trait T { fn decl(&self); }\n\
               type P = fn(u8) -> u8;\n\
               fn outer() {\n    let s = \"}\";\n    let c = '{';\n    fn inner() {}\n}\n";
    let fns = functions(src);
    let spans: Vec<(&str, usize, usize)> = fns
        .iter()
        .map(|f| (f.name.as_str(), f.first, f.last))
        .collect();
    assert_eq!(spans, [("outer", 3, 7), ("inner", 6, 6)]);
}

#[test]
fn a_long_file_is_caught_unless_its_opening_lines_say_why() {
    let body = "const X: u8 = 0;\n".repeat(FILE_LINES);
    let bare = format!("//! A module.\n{body}");
    let marked = format!("//! A module.\n// size: generated-like constants\n{body}");
    // A marker further down is a function's, not the file's.
    let late = format!("//! A module.\n{body}// size: too late\n");
    let problems = size_problems(
        &tree(&[
            ("bare.rs", &bare),
            ("late.rs", &late),
            ("marked.rs", &marked),
            ("short.rs", "//! Short.\n"),
        ]),
        &[],
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("src/bare.rs: 801 lines"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("src/late.rs: 802 lines"),
        "{problems:?}"
    );
    assert!(size_problems(&tree(&[("x.rs", "// size:\nfn f() {}\n")]), &[]).is_empty());
    assert!(
        !file_says_why("// size:   \nfn f() {}\n"),
        "a marker needs a reason"
    );
}

#[test]
fn a_pending_entry_excuses_its_own_and_must_go_once_unneeded() {
    let long = format!("//! A module.\n{}", long_fn("encode", FN_LINES + 1, ""));
    let pending = [
        ("metrics.rs", "encode", "rewritten elsewhere"),
        ("gone.rs", "", "why"),
    ];
    let problems = size_problems(&tree(&[("metrics.rs", &long)]), &pending);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("src/gone.rs") && problems[0].contains("remove its line"));
}

#[test]
fn a_string_continued_on_the_next_line_counts_its_lines() {
    let src = "fn f() {\n    let s = \"a \\\n             b\";\n}\nfn g() {}\n";
    let spans: Vec<(String, usize, usize)> = functions(src)
        .into_iter()
        .map(|f| (f.name, f.first, f.last))
        .collect();
    assert_eq!(spans, [("f".into(), 1, 4), ("g".into(), 5, 5)]);
}

// ---------------------------------------------------------------------------------------
// `unsafe` blocks and impls only where raw pointers and FFI live (DESIGN.md: memory/ is
// "the one place" for raw-pointer byte movement; device/, verbs/ and sys/ hold the FFI).
// An `unsafe fn` or `unsafe trait` declaration is a contract and allowed anywhere.
// ---------------------------------------------------------------------------------------

/// Where `unsafe {` and `unsafe impl` may appear: a folder (ending in `/`) or a file of
/// `src/`, and why.
const UNSAFE_ALLOWED: &[(&str, &str)] = &[
    (
        "memory/",
        "raw-pointer byte movement, under MemSpan's one contract",
    ),
    ("device/", "GPU runtimes loaded at run time (FFI)"),
    ("verbs/", "libibverbs loaded at run time (FFI)"),
    ("sys/", "libc calls behind safe functions"),
    (
        "transport/rdma/verbs_backend.rs",
        "the RDMA Backend trait's adapter onto verbs/: meets the verbs contracts beneath its \
         safe methods (leased registrations, posts checked against them)",
    ),
    (
        "transport/rdma/fake.rs",
        "the software NIC: its DMA is a memcpy between registered ranges",
    ),
];

/// Files outside [`UNSAFE_ALLOWED`] still holding `unsafe` blocks, and why: each is to be
/// emptied, and the check fails once a line here is no longer needed.
const UNSAFE_PENDING: &[(&str, &str)] = &[];

fn unsafe_allowed(rel: &str, list: &[(&str, &str)]) -> bool {
    list.iter().any(|(place, _)| {
        if place.ends_with('/') {
            rel.starts_with(place)
        } else {
            rel == *place
        }
    })
}

/// `src/<file>:<line>` of every `unsafe {` / `unsafe impl` outside `allowed` and
/// `pending`, and every line of `pending` that no file needs any more.
fn unsafe_problems(
    files: &[(PathBuf, String)],
    allowed: &[(&str, &str)],
    pending: &[(&str, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut needed = BTreeSet::new();
    for (path, src) in files {
        let rel = path.to_string_lossy().replace('\\', "/");
        if unsafe_allowed(&rel, allowed) {
            continue;
        }
        let toks = tokenize(src);
        for (i, (tok, line)) in toks.iter().enumerate() {
            let what = match (tok, toks.get(i + 1).map(|t| &t.0)) {
                (Tok::Ident(u), Some(Tok::Punct('{'))) if u == "unsafe" => "block",
                (Tok::Ident(u), Some(Tok::Ident(n))) if u == "unsafe" && n == "impl" => "impl",
                _ => continue,
            };
            if unsafe_allowed(&rel, pending) {
                needed.insert(rel.clone());
                continue;
            }
            out.push(format!(
                "src/{rel}:{line}: an unsafe {what} outside the modules that own unsafe code: \
                 move it behind a safe function in sys/ (libc), memory/ (raw memory), \
                 device/ or verbs/ (FFI), or list the file in UNSAFE_ALLOWED with why"
            ));
        }
    }
    for (place, _) in pending {
        if !needed.contains(*place) {
            out.push(format!(
                "UNSAFE_PENDING lists {place}, which holds no unsafe block now: remove its line"
            ));
        }
    }
    out
}

#[test]
fn unsafe_code_stays_in_the_modules_that_own_it() {
    let files = engine_sources();
    assert!(files.len() > 10, "found only {} source files", files.len());
    let problems = unsafe_problems(&files, UNSAFE_ALLOWED, UNSAFE_PENDING);
    assert!(
        problems.is_empty(),
        "unsafe code out of place ({}):\n{}",
        problems.len(),
        report(&problems)
    );
}

#[test]
fn an_unsafe_block_outside_the_list_is_caught_and_declarations_pass() {
    let files = tree(&[
        (
            "transport/tcp/x.rs",
            "// unsafe { in a comment }\nfn f() { let s = \"unsafe {\"; }\n\
             pub unsafe fn g() {}\nunsafe trait T {}\nfn h() {\n    unsafe { g() }\n}\n",
        ),
        ("transport/y.rs", "struct S;\nunsafe impl Send for S {}\n"),
        (
            "memory/z.rs",
            "fn f() { unsafe { g() } }\nunsafe impl Sync for S {}\n",
        ),
        ("sys/mod.rs", "pub fn f() { unsafe { libc::getuid() }; }\n"),
    ]);
    let allowed = [("memory/", ""), ("sys/", "")];
    let problems = unsafe_problems(&files, &allowed, &[]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("src/transport/tcp/x.rs:6: an unsafe block"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("src/transport/y.rs:2: an unsafe impl"),
        "{problems:?}"
    );
    // A pending file is excused, and a pending line no file needs is reported.
    let pending = [
        ("transport/tcp/x.rs", ""),
        ("transport/y.rs", ""),
        ("gone.rs", ""),
    ];
    let problems = unsafe_problems(&files, &allowed, &pending);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("gone.rs"), "{problems:?}");
}
