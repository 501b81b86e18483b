//! The container image as `make image` builds it (scripts/image.sh: static musl binaries,
//! one per architecture, copied by the root Dockerfile onto a base, `FROM scratch` here since
//! no registry is reachable, and one manifest list): each architecture's binary is static,
//! prints its version and provisions a claim against the test driver, the foreign ones under
//! user-mode emulation (qemu-user-static); the SBOM lists the dependencies Cargo.lock pins.
//! The image's configuration is upstream's (entrypoint `/csi-provisioner`, root user), it
//! carries its labels, the manifest list names every architecture, and the amd64 binary taken
//! out of its filesystem provisions a claim. Containers cannot run on the project's machines
//! (the runtime refuses the sandbox's cgroups), so binaries run from the unpacked images
//! instead. scripts/image.sh installs podman where it can (Debian's package, as root); the image
//! test is skipped, saying why, only where it could not.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{Rig, unique_name};

/// Upstream's architectures, the ones `ARCHES=all` names.
const ALL_ARCHES: &str = "amd64 arm64 arm ppc64le s390x";

/// The architectures scripts/image.sh builds: its `ARCHES`, by default amd64 and arm64, `all`
/// for upstream's five (scripts/image.sh says how arm, ppc64le and s390x are built, and why
/// not by default).
fn arches() -> Vec<String> {
    let arches = std::env::var("ARCHES").unwrap_or_else(|_| "amd64 arm64".into());
    let arches = if arches.trim() == "all" {
        ALL_ARCHES
    } else {
        &arches
    };
    arches.split_whitespace().map(str::to_string).collect()
}

/// A tag of our own, so concurrent runs and `make image`'s `csi-provisioner:dev` never meet;
/// removed when the test ends, however it ends.
struct Image {
    tag: String,
}

impl Drop for Image {
    fn drop(&mut self) {
        // A manifest list is removed by `manifest rm`, an image by `rmi`.
        let _ = Command::new("podman")
            .args(["manifest", "rm", &self.tag])
            .output();
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.tag])
            .output();
    }
}

fn podman_is_installed() -> bool {
    Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether podman is here, after scripts/image.sh has installed it if it could: `make test`
/// ran the script before the tests, `cargo test --test image` alone may not have yet.
fn podman_is_available() -> bool {
    if podman_is_installed() {
        return true;
    }
    // --binaries-only installs the image's tools, podman with them, and goes on without podman
    // where it cannot be installed.
    binaries();
    podman_is_installed()
}

fn succeeded(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(path: &Path) -> Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Builds the image with the script `make image` runs.
fn build(tag: &str) -> Image {
    let image = Image {
        tag: tag.to_string(),
    };
    let mut script = image_script();
    script.env("IMAGE", tag).env("BASE", "scratch");
    succeeded("scripts/image.sh", script.output());
    image
}

/// Each architecture's static binary, as `scripts/image.sh --binaries-only` builds them.
fn binaries() -> Vec<(String, PathBuf)> {
    let mut script = image_script();
    script.arg("--binaries-only");
    let out = succeeded("scripts/image.sh --binaries-only", script.output());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let (arch, path) = line.split_once(' ').expect("`ARCH PATH`");
            (arch.to_string(), PathBuf::from(path))
        })
        .collect()
}

/// scripts/image.sh, run from the workspace.
fn image_script() -> Command {
    let mut script = Command::new("bash");
    script
        .arg("scripts/image.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // What cargo sets for running this test is not the user's: ring's build script
    // fingerprints CARGO_MANIFEST_DIR, so the build inside would otherwise not match
    // `make image`'s and each would rebuild the release binary after the other.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            script.env_remove(name.as_ref());
        }
    }
    script
}

/// The image's filesystem, unpacked from `podman save` (which, unlike `podman run`, needs no
/// container runtime): the OCI layout's index → manifest → layers, applied in order.
fn unpack(image: &str, dir: &Path) -> PathBuf {
    let layout = dir.join("oci");
    succeeded(
        "podman save",
        Command::new("podman")
            .args(["save", "--format", "oci-dir", "-o"])
            .arg(&layout)
            .arg(image)
            .output(),
    );
    let blob = |digest: &Value| {
        let digest = digest.as_str().expect("a digest");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        layout.join("blobs/sha256").join(hex)
    };
    let index = json(&layout.join("index.json"));
    let manifest = json(&blob(&index["manifests"][0]["digest"]));
    let rootfs = dir.join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let layers = manifest["layers"].as_array().expect("layers");
    assert!(!layers.is_empty(), "{manifest}");
    for layer in layers {
        // GNU tar recognises the gzip of a `tar+gzip` layer by itself.
        succeeded(
            "unpacking a layer",
            Command::new("tar")
                .arg("-xf")
                .arg(blob(&layer["digest"]))
                .arg("-C")
                .arg(&rootfs)
                .output(),
        );
    }
    rootfs
}

/// The ELF machine (`e_machine`) each architecture's binary is built for, and the Debian
/// user-mode emulator that runs it on another machine.
fn elf_machine(arch: &str) -> (usize, &'static str) {
    match arch {
        "amd64" => (62, "x86_64"),
        "arm64" => (183, "aarch64"),
        "arm" => (40, "arm"),
        "ppc64le" => (21, "ppc64le"),
        "s390x" => (22, "s390x"),
        other => panic!("no ELF machine known for {other}"),
    }
}

/// The command that runs a binary of `arch` here: itself, or Debian's user-mode emulator.
fn runner(arch: &str) -> Option<String> {
    let (_, qemu) = elf_machine(arch);
    let native = std::env::consts::ARCH;
    let same = native == qemu || (native == "powerpc64" && qemu == "ppc64le");
    (!same).then(|| format!("qemu-{qemu}-static"))
}

/// Checks an architecture's binary: built for it, static, and it prints our version (under
/// emulation where it is foreign). Returns the command line that runs it.
fn check_binary(arch: &str, binary: &Path, dir: &Path) -> PathBuf {
    let bytes = std::fs::read(binary).unwrap();
    let elf = Elf::parse(&bytes);
    assert_eq!(
        elf.machine(),
        elf_machine(arch).0,
        "{arch}: {}",
        binary.display()
    );
    assert!(
        !asks_for_an_interpreter(&elf),
        "{arch}: the binary is dynamically linked: it needs a libc the base does not have"
    );
    assert!(
        has_a_symbol_table(&elf),
        "{arch}: the binary has no symbol table: `--enable-pprof`'s profiles would name no \
         function (scripts/zig-link.sh)"
    );
    // A one-line wrapper, so the rig starts an emulated sidecar as it starts a native one.
    let launcher = match runner(arch) {
        None => binary.to_path_buf(),
        Some(emulator) => {
            let path = dir.join(format!("csi-provisioner-{arch}"));
            let script = format!("#!/bin/sh\nexec {emulator} {} \"$@\"\n", binary.display());
            std::fs::write(&path, script).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        }
    };
    let version = succeeded(
        &format!("{arch}: csi-provisioner --version"),
        Command::new(&launcher).arg("--version").output(),
    );
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.trim_end().ends_with(env!("CARGO_PKG_VERSION")),
        "{arch}: {version:?}"
    );
    launcher
}

/// Start-up against the test driver, then the job itself: one claim, bound.
async fn provisions_a_claim(arch: &str, launcher: PathBuf) {
    let rig = Rig::builder(&format!("image-{arch}"))
        .sidecar_binary(launcher)
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let log = rig.sidecar_log();
    assert!(log.contains("connected to CSI driver"), "{arch}: {log}");
    assert!(log.contains(&rig.driver_name), "{arch}: {log}");
    let ledger = rig.ledger().await;
    assert!(
        ledger
            .volume_by_name(pv.metadata.name.as_deref().unwrap())
            .is_some(),
        "{arch}: {ledger:?}"
    );
    rig.cleanup().await;
}

/// The versions Cargo.lock pins for `name` (a crate may be there in several).
fn locked_versions(name: &str) -> Vec<String> {
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap();
    let mut versions = Vec::new();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == format!("name = \"{name}\"") {
            let version = lines.next().unwrap_or_default();
            versions.push(
                version
                    .trim_start_matches("version = ")
                    .trim_matches('"')
                    .to_string(),
            );
        }
    }
    versions
}

/// The SBOM is CycloneDX, names the sidecar, and lists its dependencies at the versions
/// Cargo.lock pins.
fn check_sbom(sbom: &Value) {
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(
        sbom["metadata"]["component"]["name"], "csi-provisioner",
        "{}",
        sbom["metadata"]
    );
    let components = sbom["components"].as_array().expect("components");
    for name in ["kube", "tonic", "tokio", "prost", "rpprof", "rustls"] {
        let listed: Vec<&str> = components
            .iter()
            .filter(|c| c["name"] == name)
            .filter_map(|c| c["version"].as_str())
            .collect();
        let locked = locked_versions(name);
        assert!(!listed.is_empty(), "the SBOM does not list {name}");
        for version in listed {
            assert!(
                locked.iter().any(|v| v == version),
                "{name} {version}: Cargo.lock has {locked:?}"
            );
        }
    }
    // Test-only programs are not in the product, nor another system's crates.
    for name in [
        "csi-test-driver",
        "schannel",
        "security-framework",
        "windows-sys",
    ] {
        assert!(
            !components.iter().any(|c| c["name"] == name),
            "the SBOM lists {name}"
        );
    }
}

/// Where scripts/image.sh leaves an architecture's SBOM, beside the binaries.
fn sbom_beside(arch: &str) -> Value {
    json(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/image/sbom-{arch}.cdx.json")))
}

#[tokio::test]
async fn each_architectures_binary_runs_under_emulation_and_provisions_a_claim() {
    let built = binaries();
    let built_arches: Vec<String> = built.iter().map(|(a, _)| a.clone()).collect();
    assert_eq!(built_arches, arches());
    let dir = tempfile::tempdir().unwrap();
    for (arch, binary) in &built {
        let launcher = check_binary(arch, binary, dir.path());
        provisions_a_claim(arch, launcher).await;
        check_sbom(&sbom_beside(arch));
    }
}

/// Enough of an ELF file to check a binary of any of upstream's architectures: either class
/// (arm is 32-bit) and either byte order (s390x is big-endian).
struct Elf<'a> {
    bytes: &'a [u8],
    wide: bool,
    big: bool,
}

impl<'a> Elf<'a> {
    fn parse(bytes: &'a [u8]) -> Self {
        assert_eq!(&bytes[..4], b"\x7fELF", "an ELF file");
        Elf {
            bytes,
            wide: bytes[4] == 2,
            big: bytes[5] == 2,
        }
    }

    /// The unsigned number of `size` bytes at `at`, in the file's byte order.
    fn uint(&self, at: usize, size: usize) -> usize {
        let bytes = &self.bytes[at..at + size];
        let fold = |n: usize, b: &u8| (n << 8) | usize::from(*b);
        if self.big {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        }
    }

    fn machine(&self) -> usize {
        self.uint(18, 2)
    }

    /// Each program header's type (`p_type`).
    fn program_header_types(&self) -> Vec<usize> {
        let (at, size, count) = if self.wide {
            (self.uint(32, 8), self.uint(54, 2), self.uint(56, 2))
        } else {
            (self.uint(28, 4), self.uint(42, 2), self.uint(44, 2))
        };
        (0..count).map(|i| self.uint(at + i * size, 4)).collect()
    }

    /// Each section's type (`sh_type`).
    fn section_types(&self) -> Vec<usize> {
        let (at, size, count) = if self.wide {
            (self.uint(40, 8), self.uint(58, 2), self.uint(60, 2))
        } else {
            (self.uint(32, 4), self.uint(46, 2), self.uint(48, 2))
        };
        (0..count)
            .map(|i| self.uint(at + i * size + 4, 4))
            .collect()
    }
}

/// Whether an ELF executable asks for a program interpreter (`PT_INTERP`): a dynamically
/// linked binary does, and would not start in a base that has no libc.
fn asks_for_an_interpreter(elf: &Elf) -> bool {
    const PT_INTERP: usize = 3;
    elf.program_header_types().contains(&PT_INTERP)
}

/// Whether an ELF executable kept its symbol table (a `SHT_SYMTAB` section), which the release
/// profile's `strip = "debuginfo"` keeps for `--enable-pprof`.
fn has_a_symbol_table(elf: &Elf) -> bool {
    const SHT_SYMTAB: usize = 2;
    elf.section_types().contains(&SHT_SYMTAB)
}

#[tokio::test]
async fn the_image_is_upstreams_shape_and_its_binary_provisions_a_claim() {
    if !podman_is_available() {
        // Straight to stderr: the test harness would swallow an `eprintln!` of a passing test.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED the_image_is_upstreams_shape_and_its_binary_provisions_a_claim: podman, \
             which builds the image, is not installed and scripts/image.sh could not install it \
             here (it runs `apt-get install podman` as root, on Debian or Ubuntu): the binaries \
             were checked, the image itself was not"
        );
        return;
    }
    let tag = format!("localhost/csi-provisioner:{}", unique_name("test"));
    let _image = build(&tag);
    // Each architecture's image too, however the test ends.
    let arches = arches();
    let _arch_images: Vec<Image> = arches
        .iter()
        .map(|arch| Image {
            tag: format!("{tag}-{arch}"),
        })
        .collect();

    // One manifest list, naming an image for each architecture.
    let list = succeeded(
        "podman manifest inspect",
        Command::new("podman")
            .args(["manifest", "inspect", &tag])
            .output(),
    );
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let platforms: Vec<(&str, &str)> = list["manifests"]
        .as_array()
        .expect("a manifest list")
        .iter()
        .map(|m| {
            let p = &m["platform"];
            (
                p["os"].as_str().unwrap(),
                p["architecture"].as_str().unwrap(),
            )
        })
        .collect();
    let want: Vec<(&str, &str)> = arches.iter().map(|a| ("linux", a.as_str())).collect();
    assert_eq!(platforms, want, "{list}");

    let dir = tempfile::tempdir().unwrap();
    let mut launchers = Vec::new();
    for arch in arches.iter().map(String::as_str) {
        let image = format!("{tag}-{arch}");
        check_config(&image, arch);
        // The filesystem: FROM scratch, the binary and its SBOM are all there is.
        let unpacked = dir.path().join(arch);
        std::fs::create_dir(&unpacked).unwrap();
        let rootfs = unpack(&image, &unpacked);
        let mut entries: Vec<String> = std::fs::read_dir(&rootfs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        assert_eq!(entries, ["csi-provisioner", "sbom.cdx.json"], "{arch}");
        let binary = rootfs.join("csi-provisioner");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&binary).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{arch}: mode {mode:o}");
        // The components, not the whole file: the other test may have made the SBOM beside
        // anew meanwhile, with a serial number and a time of its own.
        let inside = json(&rootfs.join("sbom.cdx.json"));
        check_sbom(&inside);
        assert_eq!(
            inside["components"],
            sbom_beside(arch)["components"],
            "{arch}"
        );
        launchers.push((arch, check_binary(arch, &binary, &unpacked)));
    }
    // The binaries built beside the image were run by the other test; here one taken out of
    // the image: amd64's (native) when ARCHES lists it, else the first listed (emulated).
    let amd64 = launchers.iter().position(|(arch, _)| *arch == "amd64");
    let (arch, launcher) = launchers.swap_remove(amd64.unwrap_or(0));
    provisions_a_claim(arch, launcher).await;
}

/// The configuration a Pod spec relies on: upstream's entrypoint, and upstream's user (none
/// set, so root: a driver socket created by root accepts us); the architecture and labels.
fn check_config(image: &str, arch: &str) {
    let inspect = succeeded(
        "podman image inspect",
        Command::new("podman")
            .args(["image", "inspect", image])
            .output(),
    );
    let inspect: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(inspect[0]["Architecture"], arch, "{image}");
    let config = &inspect[0]["Config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/csi-provisioner"])
    );
    let user = config["User"].as_str().unwrap_or_default();
    assert!(
        ["", "0", "root", "0:0"].contains(&user),
        "runs as root like upstream's image, not {user:?}"
    );
    let label = |key: &str| {
        config["Labels"][key]
            .as_str()
            .unwrap_or_else(|| panic!("label {key} missing: {config}"))
            .to_string()
    };
    assert_eq!(label("org.opencontainers.image.title"), "csi-provisioner");
    assert_eq!(
        label("org.opencontainers.image.version"),
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(label("org.opencontainers.image.base.name"), "scratch");
    assert_eq!(label("org.opencontainers.image.licenses"), "Apache-2.0");
    assert!(!label("org.opencontainers.image.description").is_empty());
    assert_ne!(label("org.opencontainers.image.revision"), "unknown");
}
