//! What the benchmark's end-to-end tests share: the benchmark run on a control plane of its
//! own with the workspace's binaries, its report and its results, one run per contender.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One finished run of the benchmark: its report (stdout) and its results, per contender.
pub struct Run {
    pub stdout: String,
    pub results: Vec<Value>,
    work: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// Runs `bench run <args>` (`tag` names its directories), asserts it succeeded and that each
/// contender ran once, and reads `<work>/<profile>/results.json`.
///
/// Needs what `make test` builds first: the test bed (testbed/build.sh) and the workspace's
/// binaries (`cargo build --workspace --bins`), taken from the directory of this package's
/// own binary.
pub fn run(tag: &str, profile: &str, args: &[&str]) -> Run {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_bench"));
    let bin_dir = bench.parent().expect("the binary is in a directory");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ours = bin_dir.join("csi-provisioner");
    let driver = bin_dir.join("csi-test-driver");
    for b in [&ours, &driver] {
        assert!(
            b.is_file(),
            "{} is missing: build the workspace's binaries first (make test does)",
            b.display()
        );
    }
    let pid = std::process::id();
    let work = std::env::temp_dir().join(format!("bench-{tag}-{pid}"));
    let out = Command::new(&bench)
        .current_dir(&repo)
        .args(["run", "--profile", profile, "--no-doc"])
        .args(args)
        .arg(format!("--cluster-dir=/tmp/tb-bench-{tag}-{pid}"))
        .arg(format!("--work-dir={}", work.display()))
        .arg(format!("--ours={}", ours.display()))
        .arg(format!("--driver={}", driver.display()))
        .output()
        .expect("running the benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let results: Vec<Value> = serde_json::from_slice(
        &std::fs::read(work.join(profile).join("results.json")).expect("results.json written"),
    )
    .expect("results.json is JSON");
    let mut seen: Vec<&str> = results
        .iter()
        .map(|r| r["who"].as_str().unwrap_or("?"))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        ["floor", "ours", "ours+policies", "upstream"],
        "one run per contender: {results:?}"
    );
    Run {
        stdout,
        results,
        work,
    }
}
