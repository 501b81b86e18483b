//! Every annotation, label, finalizer and parameter key in `src/keys.rs` that
//! stands for one of upstream's is spelled as upstream's sources spell it.
//! A key that differs by one domain part (`snapshot.storage.k8s.io/…` where
//! upstream reads `snapshot.storage.kubernetes.io/…`) compiles, passes every
//! test written from the same misreading, and makes the sidecar deaf to what
//! operators write; this test reads the real sources instead: the modules the
//! test bed builds upstream's sidecar from (external-provisioner v6.4.0, its
//! controller library v13.1.0, k8s.io/api and csi-translation-lib at the
//! versions of testbed/upstream/go.mod, the release's own), fetched with
//! `go mod download` (from the module cache when the test bed was built on
//! this machine).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Keys of ours, with no upstream counterpart (docs/compatibility.md).
const OURS: &str = "csi-provisioner.rs/";

/// The names of RBD's migration, which csi-translation-lib had until Kubernetes 1.31 dropped
/// the plugin (its plugins/rbd.go), and which ours still translates: not in the sources of
/// the test bed's versions.
const RBD_MIGRATION: [&str; 3] = [
    "kubernetes.io/rbd",
    "rbd.csi.ceph.com",
    "rbd.csi.ceph.com/volume-handle",
];

/// Parameter prefixes of no upstream release: the namespace's are upstream PR #1531's (open;
/// spelled as its commit 9e1bb58 spells them: `namespaceLabelsParameterPrefix`,
/// `namespaceAnnotationsParameterPrefix`), the claim's are ours in the same shape
/// (docs/compatibility.md, "Claim and namespace metadata to the driver").
const NOT_IN_A_RELEASE: [&str; 4] = [
    "csi.storage.k8s.io/namespace/labels/",
    "csi.storage.k8s.io/namespace/annotations/",
    "csi.storage.k8s.io/pvc/labels/",
    "csi.storage.k8s.io/pvc/annotations/",
];

/// The modules whose sources define the keys upstream's sidecar uses, and the version of the
/// release the docs name where it is pinned (the others: what that release builds with).
const MODULES: &[(&str, Option<&str>)] = &[
    (
        "github.com/kubernetes-csi/external-provisioner/v6",
        Some("v6.4.0"),
    ),
    (
        "sigs.k8s.io/sig-storage-lib-external-provisioner/v13",
        Some("v13.1.0"),
    ),
    ("k8s.io/api", None),
    ("k8s.io/csi-translation-lib", None),
];

/// The source directories of [`MODULES`] at the test bed's versions.
fn module_dirs() -> Vec<PathBuf> {
    let out = Command::new("go")
        .current_dir(root().join("testbed/upstream"))
        .env("GOFLAGS", "-mod=readonly")
        .args(["mod", "download", "-json"])
        .args(MODULES.iter().map(|(m, _)| m))
        .output()
        .expect("running `go mod download` (Go is a prerequisite of the test bed)");
    assert!(
        out.status.success(),
        "go mod download failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One JSON object per module, one after the other.
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let dirs: Vec<PathBuf> = serde_json::Deserializer::from_str(&text)
        .into_iter::<serde_json::Value>()
        .zip(MODULES)
        .map(|(v, (module, pinned))| {
            let v = v.expect("go mod download -json");
            if let Some(version) = pinned {
                assert_eq!(v["Version"].as_str(), Some(*version), "{module}: {v}");
            }
            PathBuf::from(v["Dir"].as_str().unwrap_or_else(|| panic!("no Dir in {v}")))
        })
        .collect();
    assert_eq!(dirs.len(), MODULES.len(), "{text}");
    dirs
}

/// The string literals of every non-test Go file under `dir`.
fn go_literals(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "vendor" && name != "testdata" {
                go_literals(&path, out);
            }
        } else if name.ends_with(".go") && !name.ends_with("_test.go") {
            let code = std::fs::read_to_string(&path).unwrap_or_default();
            out.extend(code.split('"').skip(1).step_by(2).map(String::from));
        }
    }
}

/// `(name, value)` of every `pub const NAME: &str = "value";` in keys.rs.
fn our_keys() -> Vec<(String, String)> {
    let code = std::fs::read_to_string(root().join("src/keys.rs")).expect("reading src/keys.rs");
    let mut keys = Vec::new();
    let mut pending: Option<String> = None;
    for line in code.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("pub const ") {
            let name = rest.split(':').next().unwrap_or_default().to_string();
            pending = Some(name);
        }
        if let Some(name) = &pending
            && let Some(value) = line.split('"').nth(1)
        {
            keys.push((name.clone(), value.to_string()));
            pending = None;
        }
    }
    assert!(keys.len() > 20, "keys.rs read as {keys:?}");
    keys
}

/// Whether upstream spells `value` somewhere: as one literal, or (the
/// reserved parameters, which upstream builds as `prefix + "name"`) as the
/// prefix's literal and the rest's.
fn spelled(value: &str, literals: &[String]) -> bool {
    let has = |s: &str| literals.iter().any(|l| l == s);
    has(value)
        || value
            .split_once('/')
            .is_some_and(|(prefix, rest)| has(&format!("{prefix}/")) && has(rest))
}

#[test]
fn every_upstream_key_is_spelled_as_upstream_spells_it() {
    let mut literals = Vec::new();
    for dir in module_dirs() {
        go_literals(&dir, &mut literals);
    }
    literals.sort();
    literals.dedup();
    let wrong: Vec<String> = our_keys()
        .into_iter()
        .filter(|(_, value)| !value.starts_with(OURS))
        .filter(|(_, value)| !RBD_MIGRATION.contains(&value.as_str()))
        .filter(|(_, value)| !NOT_IN_A_RELEASE.contains(&value.as_str()))
        .filter(|(_, value)| !spelled(value, &literals))
        .map(|(name, value)| format!("{name} = {value:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "keys upstream's sources do not have: {wrong:?}"
    );
    // The one this test was written for.
    assert!(spelled(
        "snapshot.storage.kubernetes.io/allow-volume-mode-change",
        &literals
    ));
    assert!(!spelled(
        "snapshot.storage.k8s.io/allow-volume-mode-change",
        &literals
    ));
}
