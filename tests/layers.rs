//! The layers of `src/`, lowest first, kept one-way: a module imports only modules of its own
//! layer or a lower one, and no file comes back to itself through the files it imports. Read
//! from the product code's `crate::`, `super::` and `self::` paths (tests are left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/` by layer, lowest first. A module not listed fails the test:
/// a new module is given its place here.
const LAYERS: &[&[&str]] = &[
    // Names and values every layer reads, and the process's plumbing: the flags parsed into
    // typed values (config only parses: durations, quantities), logging, the metrics registry.
    &[
        "keys", "names", "duration", "quantity", "console", "logging", "config", "metrics",
    ],
    // The edges: the CSI driver, the API server, the HTTP endpoints.
    &["csi", "kube", "http"],
    // Pure decisions: the request and the PV, the capacity plan.
    &["provision", "capacity"],
    // The reconcilers: read, decide, act.
    &["controller"],
    // Entry points: the sidecar's start-up, the binary, the subcommands, the crate root.
    &["run", "entry", "main", "check", "audit", "lib"],
];

/// Imports that close a file cycle today, each named with why it is still there. Each must
/// still close a cycle (the test says so when one does not), so the list only shrinks.
/// (The claim path's rewrite ended the last one, `claim/create.rs` ↔ `claim/abandon.rs`:
/// backend deletion has one home, `controller/backend.rs`, and the reading of a source one,
/// `claim/gather.rs`.)
const KNOWN_CYCLE_EDGES: &[(&str, &str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/`, as `src/...` paths.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn display(path: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The module path of a file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; the crate
/// roots are the empty path.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("a file under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// The file of the longest prefix of `path` that is a module.
fn file_of(path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base = path[..n].iter().fold(src(), |p, s| p.join(s));
        let flat = base.with_extension("rs");
        let folder = base.join("mod.rs");
        [flat, folder].into_iter().find(|f| f.is_file())
    })
}

/// The character at `i`, or NUL past the end.
fn at(c: &[char], i: usize) -> char {
    c.get(i).copied().unwrap_or('\0')
}

/// Where the (nested) block comment starting at `i` ends.
fn block_comment_end(c: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < c.len() {
        if at(c, i) == '/' && at(c, i + 1) == '*' {
            depth += 1;
            i += 2;
        } else if at(c, i) == '*' && at(c, i + 1) == '/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                break;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Where the literal starting at `i` ends, if one starts there: a string, a raw string
/// (`r#"…"#`, `br"…"`) or a character literal (`'x'`, `'\n'`; a lifetime is none).
fn literal_end(c: &[char], i: usize) -> Option<usize> {
    let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
    let raw_at = match (at(c, i), at(c, i + 1)) {
        ('r', '"' | '#') if !ident_before => Some(i + 1),
        ('b', 'r') if !ident_before && matches!(at(c, i + 2), '"' | '#') => Some(i + 2),
        _ => None,
    };
    if let Some(mut j) = raw_at {
        let hashes = c[j..].iter().take_while(|x| **x == '#').count();
        j += hashes;
        if at(c, j) == '"' {
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| at(c, j + h) == '#')) {
                j += 1;
            }
            return Some(j + 1 + hashes);
        }
    }
    match at(c, i) {
        '"' => {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            Some(j + 1)
        }
        '\'' if at(c, i + 1) == '\\' => {
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            Some(j + 1)
        }
        '\'' if at(c, i + 2) == '\'' => Some(i + 3),
        _ => None,
    }
}

/// The code of a file without comments, string and character literals (each replaced by a
/// space), so that only code is read.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if at(&c, i) == '/' && at(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(&c, i) == '/' && at(&c, i + 1) == '*' {
            i = block_comment_end(&c, i);
            out.push(' ');
        } else if let Some(end) = literal_end(&c, i) {
            i = end;
            out.push(' ');
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Path,
    Punct(char),
}

fn tokens(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_alphanumeric() || c[i] == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(c[start..i].iter().collect()));
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push(Token::Path);
            i += 2;
        } else {
            if !c[i].is_whitespace() {
                out.push(Token::Punct(c[i]));
            }
            i += 1;
        }
    }
    out
}

/// Removes every item under `#[cfg(test)]`: from the attribute to the end of the item (its
/// `;`, or its `{ … }` block).
fn without_tests(tokens: Vec<Token>) -> Vec<Token> {
    let is = |t: &Token, s: &str| matches!(t, Token::Ident(x) if x == s);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let cfg_test = tokens[i] == Token::Punct('#')
            && tokens.get(i + 1) == Some(&Token::Punct('['))
            && tokens.get(i + 2).is_some_and(|t| is(t, "cfg"))
            && tokens.get(i + 3) == Some(&Token::Punct('('))
            && tokens.get(i + 4).is_some_and(|t| is(t, "test"))
            && tokens.get(i + 5) == Some(&Token::Punct(')'))
            && tokens.get(i + 6) == Some(&Token::Punct(']'));
        if !cfg_test {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += 7;
        let mut depth = 0;
        while i < tokens.len() {
            match tokens[i] {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                Token::Punct(';') if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// The paths of a use tree starting at `tokens[*i]` (`a::b::{c, d::e}`), each as segments.
fn use_tree(tokens: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        match tokens.get(*i) {
            Some(Token::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
            }
            Some(Token::Punct('*')) => {
                *i += 1;
                break;
            }
            Some(Token::Punct('{')) => {
                *i += 1;
                loop {
                    match tokens.get(*i) {
                        Some(Token::Punct('}')) | None => {
                            *i += 1;
                            break;
                        }
                        Some(Token::Punct(',')) => *i += 1,
                        _ => use_tree(tokens, i, path.clone(), out),
                    }
                }
                return;
            }
            _ => break,
        }
        if tokens.get(*i) == Some(&Token::Path) {
            *i += 1;
        } else {
            break;
        }
    }
    // `x as y`: the path is `x`.
    if matches!(tokens.get(*i), Some(Token::Ident(a)) if a == "as") {
        *i += 2;
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    out.push(path);
}

/// The absolute module paths a file's product code names, from its `crate::`, `super::` and
/// `self::` paths (and, in the binary, `csi_provisioner::`), and its paths through a module it
/// declares (`mod claim;` … `claim::x`), resolved against the inline module they are written in.
fn named_paths(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    paths_in(file, without_tests(tokens(&code_only(&text))))
}

/// The same, tests included.
fn named_paths_with_tests(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    paths_in(file, tokens(&code_only(&text)))
}

/// The modules a file declares without a body (`mod x;`, `pub mod x;`).
fn declared_modules(tokens: &[Token]) -> BTreeSet<String> {
    tokens
        .windows(3)
        .filter_map(|w| match w {
            [Token::Ident(m), Token::Ident(name), Token::Punct(';')] if m == "mod" => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect()
}

fn paths_in(file: &Path, tokens: Vec<Token>) -> Vec<Vec<String>> {
    let children = declared_modules(&tokens);
    let base = module_of(file);
    let binary = file.file_name().is_some_and(|n| n == "main.rs") && base.is_empty();
    // Inline modules (`mod x { … }`) being read, with the brace depth they opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Token::Ident(m) if m == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                }
            }
            _ => {}
        }
        let starts_path = i == 0 || tokens[i - 1] != Token::Path;
        let head = match &tokens[i] {
            Token::Ident(s) if starts_path && tokens.get(i + 1) == Some(&Token::Path) => s,
            _ => {
                i += 1;
                continue;
            }
        };
        let mut here = base.clone();
        here.extend(inline.iter().map(|(m, _)| m.clone()));
        let mut j = i;
        let prefix = match head.as_str() {
            "crate" => {
                j += 2;
                Vec::new()
            }
            "csi_provisioner" if binary => {
                j += 2;
                Vec::new()
            }
            "self" => {
                j += 2;
                here
            }
            "super" => {
                while matches!(tokens.get(j), Some(Token::Ident(s)) if s == "super")
                    && tokens.get(j + 1) == Some(&Token::Path)
                {
                    here.pop();
                    j += 2;
                }
                here
            }
            // A path through a module this file declares: read from its name on.
            child if children.contains(child) => here,
            _ => {
                i += 1;
                continue;
            }
        };
        use_tree(&tokens, &mut j, prefix, &mut out);
        i = j.max(i + 1);
    }
    out
}

/// The submodules a file declares under `#[cfg(test)]` (`mod tests;`), as module paths.
fn test_only_children(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    let tokens = tokens(&code_only(&text));
    let cfg_test = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    let mut out = Vec::new();
    for (i, window) in tokens.windows(cfg_test.len()).enumerate() {
        if window != cfg_test {
            continue;
        }
        let rest = &tokens[i + cfg_test.len()..];
        if let [Token::Ident(m), Token::Ident(name), Token::Punct(';'), ..] = rest
            && m == "mod"
        {
            let mut path = module_of(file);
            path.push(name.clone());
            out.push(path);
        }
    }
    out
}

/// Every product file and the files it imports. Left out: test-only files, the file itself,
/// and a module's own submodules (a module declares, re-exports and wires its submodules; a
/// submodule that reads its parent's items does import it).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let test_only: Vec<Vec<String>> = files.iter().flat_map(|f| test_only_children(f)).collect();
    files.retain(|f| !test_only.iter().any(|t| module_of(f).starts_with(t)));
    files
        .iter()
        .map(|file| {
            let module = module_of(file);
            let own = |to: &Path| {
                let inner = module_of(to);
                !module.is_empty() && inner.len() > module.len() && inner.starts_with(&module)
            };
            let imports = named_paths(file)
                .iter()
                .filter_map(|path| file_of(path))
                .filter(|to| to != file && !own(to))
                .map(|to| display(&to))
                .collect();
            (display(file), imports)
        })
        .collect()
}

/// The layer of a file: that of its top-level module.
fn layer(file: &str) -> usize {
    let top = file
        .trim_start_matches("src/")
        .split(['/', '.'])
        .next()
        .unwrap_or_default();
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top))
        .unwrap_or_else(|| panic!("{file}: module `{top}` has no layer in LAYERS"))
}

#[test]
fn no_module_imports_a_higher_layer() {
    let graph = graph();
    // Every module has its place (`layer` says which one has none).
    for file in graph.keys() {
        let _ = layer(file);
    }
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, imports)| {
            imports
                .iter()
                .filter(|to| layer(to) > layer(from))
                .map(move |to| {
                    format!(
                        "{from} (layer {}) → {to} (layer {})",
                        layer(from),
                        layer(to)
                    )
                })
        })
        .collect();
    assert!(
        upward.is_empty(),
        "imports of a higher layer (LAYERS, lowest first):\n{}",
        upward.join("\n")
    );
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Whether `to` is reachable from `from`.
fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut next = vec![from];
    while let Some(file) = next.pop() {
        if file == to {
            return true;
        }
        if seen.insert(file) {
            next.extend(graph.get(file).into_iter().flatten().map(String::as_str));
        }
    }
    false
}

#[test]
fn no_file_comes_back_to_itself_through_its_imports() {
    let mut graph = graph();
    let needless: Vec<String> = KNOWN_CYCLE_EDGES
        .iter()
        .filter(|(from, to, _)| {
            let imported = graph
                .get(*from)
                .is_some_and(|imports| imports.contains(*to));
            !imported || !reaches(&graph, to, from)
        })
        .map(|(from, to, _)| format!("{from} → {to}"))
        .collect();
    assert!(
        needless.is_empty(),
        "KNOWN_CYCLE_EDGES names imports that close no cycle any more; take them off: {needless:?}"
    );
    for (from, to, _why) in KNOWN_CYCLE_EDGES {
        graph.get_mut(*from).map(|imports| imports.remove(*to));
    }
    let found = cycles(&graph);
    let described: Vec<String> = found
        .iter()
        .map(|files| {
            let inside: Vec<String> = files
                .iter()
                .flat_map(|f| {
                    graph[f]
                        .iter()
                        .filter(|t| files.contains(t))
                        .map(move |t| format!("  {f} → {t}"))
                })
                .collect();
            inside.join("\n")
        })
        .collect();
    assert!(
        found.is_empty(),
        "file cycles (the imports inside each):\n{}",
        described.join("\n\n")
    );
}

/// Files directly in `src/controller/` that read one controller's state, each with the path
/// it reads and why. Every other one is shared by the controllers and names neither path.
/// Each must still name its path (the test says so when one does not), so the list only shrinks.
const READS_ONE_PATH: &[(&str, &str, &str)] = &[(
    "src/controller/snapshot_sweep.rs",
    "claim",
    "the orphan sweep keeps a snapshot's protection while the claim path's cache and memory \
     show a claim that may still restore from it",
)];

/// Whether `path` (as named) leads into the controller `path_of`.
fn into(path: &[String], path_of: &str) -> bool {
    path.len() >= 2 && path[0] == "controller" && path[1] == path_of
}

/// The paths into controller `path_of` that `file` names, as `a::b::c`.
fn naming(paths: &[Vec<String>], path_of: &str) -> Vec<String> {
    paths
        .iter()
        .filter(|p| into(p, path_of))
        .map(|p| p.join("::"))
        .collect()
}

/// One context per controller: the claim path (`controller/claim/`) never names the volume
/// path's items, nor the volume path (`controller/volume/`) the claim path's, tests included
/// (a rig that has to build the other path's memory fails here); the modules both share
/// (every other file of `controller/`, the test bench `scripted.rs` too) name neither, but
/// for the tasks in `READS_ONE_PATH`.
#[test]
fn each_controller_names_only_its_own_path_and_the_shared_modules() {
    let mut files = Vec::new();
    rust_files(&src().join("controller"), &mut files);
    let mut found = Vec::new();
    let mut unneeded = Vec::new();
    for file in &files {
        let name = display(file);
        let rest = name.trim_start_matches("src/controller/");
        let (paths, forbidden): (_, Vec<&str>) = match rest.split_once('/') {
            Some(("claim", _)) => (named_paths_with_tests(file), vec!["volume"]),
            Some(("volume", _)) => (named_paths_with_tests(file), vec!["claim"]),
            Some((other, _)) => {
                panic!("{name}: a controller folder the test does not know: {other}")
            }
            None => {
                let paths = named_paths(file);
                let reads = READS_ONE_PATH.iter().find(|(f, _, _)| *f == name);
                if let Some((_, path_of, _)) = reads
                    && naming(&paths, path_of).is_empty()
                {
                    unneeded.push(name.clone());
                }
                let forbidden = ["claim", "volume"]
                    .into_iter()
                    .filter(|p| reads.is_none_or(|(_, r, _)| r != p))
                    .collect();
                (paths, forbidden)
            }
        };
        for path_of in forbidden {
            found.extend(
                naming(&paths, path_of)
                    .into_iter()
                    .map(|p| format!("{name} names {p}")),
            );
        }
    }
    assert!(
        unneeded.is_empty(),
        "READS_ONE_PATH names files that no longer read their path; take them off: {unneeded:?}"
    );
    assert!(
        found.is_empty(),
        "a controller's items named outside it (give each its owner: its own context, or the \
         shared one):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_sees_what_the_layers_are_made_of() {
    // The parser finds the imports it is meant to find: a grouped `use crate::{…}`, a
    // `super::` path, an inline path, and none in a comment, a string or a test module.
    let graph = graph();
    assert!(!graph.contains_key("src/controller/claim/tests/mod.rs"));
    assert!(!graph.contains_key("src/controller/claim/tests/rig.rs"));
    assert!(!graph.contains_key("src/provision/migration/tests/mod.rs"));
    assert!(!graph.contains_key("src/provision/migration/tests/rbd.rs"));
    assert!(!graph.contains_key("src/controller/volume/tests/mod.rs"));
    assert!(!graph.contains_key("src/controller/volume/tests/rig.rs"));
    let volume = &graph["src/controller/volume/delete.rs"];
    for want in [
        "src/keys.rs",
        "src/kube/slim.rs",
        "src/controller/volume/mod.rs",
        "src/controller/backend.rs",
        "src/controller/volume/decide.rs",
        "src/controller/volume/error.rs",
        "src/provision/migration/mod.rs",
    ] {
        assert!(volume.contains(want), "{want} not in {volume:?}");
    }
    // A path through a module the file declares (`pub mod intent;` … `use intent::IntentMode;`).
    let claim = named_paths(&src().join("controller/claim/mod.rs"));
    let through_child: Vec<String> = ["controller", "claim", "intent", "IntentMode"]
        .map(String::from)
        .to_vec();
    assert!(claim.contains(&through_child), "{claim:?}");
    let tokens = without_tests(tokens(&code_only(
        "// crate::run\nfn f() { let s = \"crate::run\"; let c = '{'; }\n\
         #[cfg(test)]\nmod tests { use crate::run; }\nuse crate::{keys, kube::slim::Pv};",
    )));
    let crate_at: Vec<usize> = (0..tokens.len())
        .filter(|i| tokens[*i] == Token::Ident("crate".into()))
        .collect();
    let [at] = crate_at[..] else {
        panic!("one `crate` left: {tokens:?}");
    };
    let mut paths = Vec::new();
    use_tree(&tokens, &mut (at + 2), Vec::new(), &mut paths);
    assert_eq!(
        paths,
        vec![
            vec!["keys".to_string()],
            vec!["kube".into(), "slim".into(), "Pv".into()]
        ]
    );
    assert!(!tokens.contains(&Token::Ident("run".into())), "{tokens:?}");
}
