//! Build hygiene that neither rustc nor clippy checks: every dependency a
//! workspace member declares is used by that member's code, and the
//! workspace has one `rust-version`, the one README states. (`make lint`,
//! which `make test` runs first, covers formatting and clippy.)

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
