//! Build hygiene that neither rustc nor clippy checks: every dependency a
//! workspace member declares is used by that member's code and takes its
//! version from `[workspace.dependencies]`, every member takes the workspace's
//! lints, the workspace has one `rust-version` (the one README states), and no
//! function in `src/` outside tests is longer than 80 lines unless
//! docs/architecture.md says why. (`make lint`, which `make test` runs first,
//! covers formatting, clippy, and licences and bans with cargo-deny.)

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The members listed in the root Cargo.toml's `[workspace] members`.
fn members() -> Vec<PathBuf> {
    let manifest = read(&root().join("Cargo.toml"));
    let line = manifest
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("a one-line `members = [...]` in Cargo.toml");
    let list = line
        .split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'));
    list.expect("members = [...]")
        .0
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root().join(m))
        .collect()
}

/// A manifest's lines as (section, line), comments and blank lines left out.
fn sections(manifest: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.split(" #").next().unwrap_or_default().trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        out.push((section.clone(), line.to_string()));
    }
    out
}

/// The key of `name = ...` or `name.workspace = true`.
fn key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    Some(key.trim().split('.').next().unwrap_or_default())
}

#[derive(Debug, PartialEq)]
enum Kind {
    /// `[dependencies]`, `[dev-dependencies]`: used by any source but build.rs.
    Code,
    /// `[build-dependencies]`: used by build.rs.
    Build,
}

/// (name, kind) of every dependency `manifest` declares.
fn dependencies(manifest: &str) -> Vec<(String, Kind)> {
    sections(manifest)
        .into_iter()
        .filter_map(|(section, line)| {
            let kind = match section.as_str() {
                "dependencies" | "dev-dependencies" => Kind::Code,
                "build-dependencies" => Kind::Build,
                _ => return None,
            };
            Some((key(&line)?.to_string(), kind))
        })
        .collect()
}

/// `[package.metadata.cargo-machete] ignored = [...]`: dependencies only
/// generated code uses (the same list cargo-machete reads).
fn ignored(manifest: &str) -> Vec<String> {
    sections(manifest)
        .into_iter()
        .filter(|(section, line)| {
            section == "package.metadata.cargo-machete" && key(line) == Some("ignored")
        })
        .flat_map(|(_, line)| {
            let list = line
                .split_once('[')
                .map_or("", |(_, l)| l.trim_end_matches(']'));
            list.split(',')
                .map(|d| d.trim().trim_matches('"').to_string())
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The Rust sources of the member at `dir`: everything under it except the
/// other members, build output and the Go test bed.
fn sources(dir: &Path, other_members: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                let skip = name.starts_with('.')
                    || name == "target"
                    || name == "testbed"
                    || other_members.contains(&path);
                if !skip {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out
}

/// Whether `code` names the crate `ident` as a path (`ident::`), in a `use`,
/// or as a macro (`ident!`), not as part of a longer name.
fn names_crate(code: &str, ident: &str) -> bool {
    code.match_indices(ident).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = &code[at + ident.len()..];
        let starts_name = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        starts_name
            && (after.starts_with("::")
                || after.starts_with('!')
                || (code[..at].ends_with("use ") && after.starts_with([';', ' ', ':'])))
    })
}

#[test]
fn every_dependency_of_every_member_is_used() {
    let members = members();
    assert!(members.len() >= 2, "{members:?}");
    let mut unused = Vec::new();
    for member in &members {
        let manifest = read(&member.join("Cargo.toml"));
        let others: Vec<PathBuf> = members.iter().filter(|m| *m != member).cloned().collect();
        let build_rs = member.join("build.rs");
        let (mut code, mut build) = (String::new(), String::new());
        for file in sources(member, &others) {
            if file == build_rs {
                build.push_str(&read(&file));
            } else {
                code.push_str(&read(&file));
            }
        }
        let ignored = ignored(&manifest);
        for (dependency, kind) in dependencies(&manifest) {
            let ident = dependency.replace('-', "_");
            let text = if kind == Kind::Build { &build } else { &code };
            if !names_crate(text, &ident) && !ignored.contains(&dependency) {
                let name = member.strip_prefix(root()).unwrap_or(member).display();
                unused.push(format!("./{name}: {dependency} ({kind:?})"));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "declared and not used (remove it, or list it in [package.metadata.cargo-machete] \
         ignored with the reason):\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_check_tells_a_crate_path_from_a_longer_name() {
    assert!(names_crate("use tokio::sync;", "tokio"));
    assert!(names_crate("let x = serde_json::json!({});", "serde_json"));
    assert!(names_crate("tracing::info!(\"x\")", "tracing"));
    assert!(names_crate("info!(); use futures;", "futures"));
    assert!(!names_crate("use tokio_util::sync;", "tokio"));
    assert!(!names_crate("my_prost::Message", "prost"));
    assert!(!names_crate("// backon is not used", "backon"));
}

#[test]
fn one_rust_version_for_the_workspace_and_the_readme_states_it() {
    let manifest = read(&root().join("Cargo.toml"));
    let versions: Vec<String> = sections(&manifest)
        .into_iter()
        .filter(|(section, line)| {
            section == "workspace.package" && key(line) == Some("rust-version")
        })
        .map(|(_, line)| line.split('"').nth(1).unwrap_or_default().to_string())
        .collect();
    let [version] = &versions[..] else {
        panic!("one rust-version under [workspace.package], found {versions:?}");
    };
    for member in members() {
        let manifest = read(&member.join("Cargo.toml"));
        let declared: Vec<String> = sections(&manifest)
            .into_iter()
            .filter(|(section, line)| section == "package" && key(line) == Some("rust-version"))
            .map(|(_, line)| line)
            .collect();
        assert_eq!(
            declared,
            ["rust-version.workspace = true"],
            "{}: the package inherits the workspace's rust-version",
            member.display()
        );
    }
    let readme = read(&root().join("README.md"));
    assert!(
        readme.contains(&format!("Rust {version} or newer")),
        "README states the minimum Rust as `Rust {version} or newer`"
    );
}

/// `[dependencies]`, `[dev-dependencies]`, `[build-dependencies]` and their
/// target-specific forms.
fn is_dependency_section(section: &str) -> bool {
    let last = section.rsplit('.').next().unwrap_or_default();
    matches!(
        last,
        "dependencies" | "dev-dependencies" | "build-dependencies"
    ) && !section.starts_with("workspace")
}

#[test]
fn every_member_takes_each_dependency_from_the_workspace() {
    let mut own = Vec::new();
    let mut used = std::collections::BTreeSet::new();
    for member in members() {
        let manifest = read(&member.join("Cargo.toml"));
        for (section, line) in sections(&manifest) {
            if !is_dependency_section(&section) {
                continue;
            }
            // Features may be added; what the workspace pins may not be said again.
            let inherited = line.contains("workspace = true")
                && !["version", "path", "git", "package", "default-features"]
                    .iter()
                    .any(|k| line.contains(&format!("{k} =")));
            if !inherited {
                let name = member.strip_prefix(root()).unwrap_or(&member).display();
                own.push(format!("./{name} [{section}]: {line}"));
            }
            used.insert(key(&line).unwrap_or_default().to_string());
        }
    }
    assert!(
        own.is_empty(),
        "declare the version (and the default features) once in the root Cargo.toml's \
         [workspace.dependencies], and `name.workspace = true` (or `{{ workspace = true, \
         features = [...] }}`) in the member:\n{}",
        own.join("\n")
    );
    let declared: Vec<String> = sections(&read(&root().join("Cargo.toml")))
        .into_iter()
        .filter(|(section, _)| section == "workspace.dependencies")
        .filter_map(|(_, line)| key(&line).map(str::to_string))
        .collect();
    let unused: Vec<&String> = declared.iter().filter(|d| !used.contains(*d)).collect();
    assert!(
        unused.is_empty(),
        "in [workspace.dependencies] and used by no member: {unused:?}"
    );
}

#[test]
fn every_member_takes_the_workspace_lints() {
    for member in members() {
        let manifest = read(&member.join("Cargo.toml"));
        let lints: Vec<(String, String)> = sections(&manifest)
            .into_iter()
            .filter(|(section, _)| section == "lints" || section.starts_with("lints."))
            .collect();
        assert_eq!(
            lints,
            [("lints".to_string(), "workspace = true".to_string())],
            "{}: `[lints] workspace = true` and no lints of its own (they go in the root's \
             [workspace.lints])",
            member.display()
        );
    }
    let root_manifest = read(&root().join("Cargo.toml"));
    assert!(
        sections(&root_manifest).iter().any(|(section, line)| {
            section == "workspace.lints.rust" && line == "unsafe_code = \"forbid\""
        }),
        "the workspace forbids unsafe code"
    );
}

/// No function in `src/` outside tests is longer than this, counted from its
/// `fn` line to its closing brace: beyond it, a function is split into named
/// steps (or says in docs/architecture.md why it is clearer whole).
const MAX_FUNCTION_LINES: usize = 80;

/// The functions in `src/` allowed to be longer, as (file, name), each with its
/// reason in docs/architecture.md ("Long functions"). Each must still be longer
/// (the test says when one no longer is), so the list only shrinks.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// 1-based line of its `fn`.
    line: usize,
    lines: usize,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The name of the function a (trimmed) line starts, after its qualifiers.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line;
    loop {
        let before = rest;
        for qualifier in ["pub ", "async ", "const ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(qualifier).unwrap_or(rest);
        }
        if let Some((_, after)) = rest.strip_prefix("pub(").and_then(|r| r.split_once(") ")) {
            rest = after;
        }
        if rest == before {
            break;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some(&rest[..end]).filter(|name| !name.is_empty())
}

/// The line that closes the item opened at `start` (indented `at`): the item's
/// own line for a one-line item, else the next line at that indent starting
/// with `}`. `None` for a declaration (`;` before any body).
fn closing(lines: &[&str], start: usize, at: usize) -> Option<usize> {
    let mut opened = false;
    for (i, line) in lines.iter().enumerate().skip(start) {
        let line = line.trim_end();
        if i == start && line.ends_with('}') {
            return Some(i);
        }
        if !opened && line.ends_with(';') {
            return None;
        }
        if !opened && line.ends_with('{') {
            opened = true;
            continue;
        }
        if opened && indent(line) == at && line.trim_start().starts_with('}') {
            return Some(i);
        }
    }
    None
}

/// The functions of a file laid out by rustfmt, outside the items marked
/// `#[cfg(test)]`; a function nested in another counts as lines of the outer.
fn functions(code: &str) -> Vec<Function> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line == "#[cfg(test)]" {
            let mut item = i + 1;
            while lines.get(item).is_some_and(|l| l.trim().starts_with("#[")) {
                item += 1;
            }
            i = closing(&lines, item, indent(lines[i])).unwrap_or(item) + 1;
            continue;
        }
        if let Some(name) = fn_name(line)
            && let Some(end) = closing(&lines, i, indent(lines[i]))
        {
            out.push(Function {
                name: name.to_string(),
                line: i + 1,
                lines: end - i + 1,
            });
            i = end + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// The files of the modules a file declares `#[cfg(test)] mod name;`: `name.rs`
/// and `name/` beside it (in its own directory for `mod.rs`, `lib.rs`, `main.rs`).
fn test_modules(file: &Path, code: &str) -> Vec<PathBuf> {
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    let parent = file.parent().expect("a file in a directory");
    let dir = match stem.as_ref() {
        "mod" | "lib" | "main" => parent.to_path_buf(),
        _ => parent.join(stem.as_ref()),
    };
    let lines: Vec<&str> = code.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|pair| pair[0] == "#[cfg(test)]")
        .filter_map(|pair| {
            let name = pair[1]
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .strip_prefix("mod ")?
                .strip_suffix(';')?;
            Some([dir.join(format!("{name}.rs")), dir.join(name)])
        })
        .flatten()
        .collect()
}

/// (file relative to the root, its code) for every file of `src/` outside test modules,
/// each cut where its own inline `#[cfg(test)] mod tests` begins.
fn product_files() -> Vec<(String, String)> {
    let files = sources(&root().join("src"), &[]);
    let test_only: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| test_modules(f, &read(f)))
        .collect();
    files
        .into_iter()
        .filter(|f| !test_only.iter().any(|t| f.starts_with(t)))
        .map(|f| {
            let code = read(&f);
            let product = code
                .split("#[cfg(test)]\nmod tests {")
                .next()
                .unwrap_or_default()
                .to_string();
            let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            (name, product)
        })
        .collect()
}

/// `Placement` answers every question that depends on where a replica runs
/// (centrally or one per node): which claims and PVs are its, its topology inputs,
/// its capacity segments, what "no room" does, its identity and `managed-by`. No
/// other product file looks at which it is; `run/driver.rs` makes it, once.
#[test]
fn only_placement_asks_where_a_replica_runs() {
    let asking: Vec<String> = product_files()
        .into_iter()
        .filter(|(name, _)| name != "src/controller/node.rs" && name != "src/run/driver.rs")
        .filter(|(_, code)| {
            code.contains("Placement::Central")
                || code.contains("Placement::Node")
                || code.contains(".place.node()")
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        asking.is_empty(),
        "these files ask whether a replica is a node; ask `Placement` instead: {asking:?}"
    );
    assert!(
        product_files()
            .iter()
            .all(|(name, _)| !name.contains("claim/tests/") && !name.contains("volume/tests/")),
        "test modules are left out"
    );
}

/// (file relative to the root, function) for every function of `src/` outside tests.
fn product_functions() -> Vec<(String, Function)> {
    let files = sources(&root().join("src"), &[]);
    let test_only: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| test_modules(f, &read(f)))
        .collect();
    let mut out = Vec::new();
    for file in files {
        if test_only.iter().any(|t| file.starts_with(t)) {
            continue;
        }
        let name = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        out.extend(
            functions(&read(&file))
                .into_iter()
                .map(|f| (name.clone(), f)),
        );
    }
    out.sort_by(|a, b| (&a.0, a.1.line).cmp(&(&b.0, b.1.line)));
    out
}

#[test]
fn no_function_in_src_is_longer_than_80_lines() {
    let all = product_functions();
    assert!(
        all.len() > 500,
        "the reader found only {} functions",
        all.len()
    );
    let long: Vec<&(String, Function)> = all
        .iter()
        .filter(|(_, f)| f.lines > MAX_FUNCTION_LINES)
        .collect();
    let allowed = |file: &str, name: &str| LONG_FUNCTIONS.contains(&(file, name));
    let unexplained: Vec<String> = long
        .iter()
        .filter(|(file, f)| !allowed(file, &f.name))
        .map(|(file, f)| format!("{file}:{} `{}`: {} lines", f.line, f.name, f.lines))
        .collect();
    assert!(
        unexplained.is_empty(),
        "longer than {MAX_FUNCTION_LINES} lines: split into named steps, or say in \
         docs/architecture.md (\"Long functions\") why it is clearer whole and list it in \
         LONG_FUNCTIONS:\n{}",
        unexplained.join("\n")
    );
    let docs = read(&root().join("docs/architecture.md"));
    for (file, name) in LONG_FUNCTIONS {
        assert!(
            long.iter().any(|(f, fun)| f == file && fun.name == *name),
            "{file} `{name}` is no longer longer than {MAX_FUNCTION_LINES} lines: \
             take it off LONG_FUNCTIONS and docs/architecture.md"
        );
        assert!(
            docs.contains(&format!("`{name}`")) && docs.contains(file),
            "docs/architecture.md says why {file} `{name}` is long"
        );
    }
}

#[test]
fn the_function_reader_finds_functions_as_rustfmt_lays_them_out() {
    let code = r#"
pub(crate) async fn first(a: u8) -> u8 {
    fn nested() {}
    a
}

trait T {
    fn declared(
        &self,
    ) -> u8;
    fn with_default(&self) -> u8 {
        1
    }
}

fn generic<K>(k: K)
where
    K: Clone,
{
    let _ = k.clone();
}

const fn one_line() -> u8 { 1 }

#[cfg(test)]
mod tests {
    fn helper() {
        let _ = 1;
    }
}

#[cfg(test)]
#[allow(dead_code)]
fn only_in_tests() {
    let _ = 2;
}

impl S {
    pub(super) fn last(&self) {
        let s = "} not the end";
    }
}
"#;
    let found: Vec<(String, usize, usize)> = functions(code)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    let want = [
        ("first", 2, 4),
        ("with_default", 11, 3),
        ("generic", 16, 6),
        ("one_line", 23, 1),
        ("last", 39, 3),
    ];
    let want: Vec<(String, usize, usize)> = want
        .iter()
        .map(|(n, l, c)| (n.to_string(), *l, *c))
        .collect();
    assert_eq!(found, want);
    let dir = Path::new("/r/src/config");
    assert_eq!(
        test_modules(&dir.join("mod.rs"), "#[cfg(test)]\nmod tests;\n"),
        [dir.join("tests.rs"), dir.join("tests")]
    );
}
