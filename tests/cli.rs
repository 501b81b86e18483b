//! The command line as an operator meets it: our binary, run as a process.
//! Upstream's flag conventions (Go's single-dash long flags, `-v=5`, exit 2
//! for an unknown flag with its name, exit 1 for conflicting flags) and one-line
//! reasons when the sidecar cannot start. None of these needs a cluster.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{ChildProcess, DEADLINE, workspace_bin};

fn run(args: &[&str]) -> Output {
    Command::new(workspace_bin("csi-provisioner"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("running csi-provisioner")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A usage error is one line on stderr, naming what was wrong.
fn assert_one_line(out: &Output, needle: &str) {
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got:\n{err}");
    assert!(
        lines[0].contains(needle),
        "{needle:?} not in {:?}",
        lines[0]
    );
}

#[test]
fn unknown_flag_exits_2_naming_the_flag() {
    for flag in ["--no-such-flag", "-no-such-flag", "--no-such-flag=1"] {
        let out = run(&[flag]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        assert_one_line(&out, "no-such-flag");
    }
}

#[test]
fn version_prints_the_version_and_exits_0() {
    for flag in ["--version", "-version"] {
        let out = run(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(env!("CARGO_PKG_VERSION")),
            "{flag}: {stdout:?}"
        );
    }
}

#[test]
fn metrics_address_and_http_endpoint_together_exit_1() {
    let out = run(&[
        "--csi-address=/nonexistent.sock",
        "--metrics-address=:8080",
        "--http-endpoint=:8081",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_one_line(&out, "--metrics-address");
    assert!(stderr(&out).contains("--http-endpoint"), "{}", stderr(&out));
}

#[test]
fn go_style_single_dash_flags_and_verbosity_are_accepted() {
    // As upstream manifests write them. `-version` stops right after parsing,
    // so a flag the parser did not accept would show as exit 2 here.
    let out = run(&[
        "-csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
        "-v=5",
        "--v=5",
        "-timeout=15s",
        "-leader-election",
        "-leader-election-lease-duration=1m30s",
        "-http-endpoint=:8080",
        "-kube-api-qps=20",
        "-version",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The same value mistyped is still refused, naming the flag.
    let out = run(&["-timeout=15 seconds", "-version"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_one_line(&out, "timeout");
}

#[test]
fn node_deployment_without_node_name_stops_the_process_with_one_reason() {
    let out = Command::new(workspace_bin("csi-provisioner"))
        .args(["--csi-address=/nonexistent.sock", "--node-deployment"])
        .env_remove("NODE_NAME")
        .output()
        .expect("running csi-provisioner");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_one_line(
        &out,
        "--node-deployment requires the NODE_NAME environment variable",
    );
}

#[tokio::test]
async fn a_driver_socket_that_never_appears_stops_the_process_with_one_reason() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("never.sock");
    let kubeconfig = dir.path().join("kubeconfig");
    // The driver is connected to first (as upstream does): the kubeconfig is never read.
    std::fs::write(&kubeconfig, "not: [a kubeconfig").unwrap();
    let started = Instant::now();
    let mut sidecar = ChildProcess::spawn(Command::new(workspace_bin("csi-provisioner")).args([
        format!("-csi-address={}", socket.display()),
        format!("-kubeconfig={}", kubeconfig.display()),
    ]));
    let status = sidecar.wait_exit(DEADLINE).await;
    let waited = started.elapsed();
    let log = sidecar.log_contents();
    assert_eq!(status.code(), Some(1), "{log}");
    // Upstream waits 30 s for the socket before giving up; so do we.
    assert!(
        waited >= Duration::from_secs(29),
        "gave up after {waited:?}:\n{log}"
    );
    let last = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        last.contains("connect") && last.contains(&socket.display().to_string()),
        "the last line says why: {last:?}\n{log}"
    );
}

/// A driver socket that refuses our UID (created by root with mode 0755, the sidecar run as
/// another user) is reported at once, in one line naming our UID, the socket's owner and
/// what to change, instead of a bare "transport error" after 30 s.
#[tokio::test]
async fn a_socket_that_refuses_our_uid_says_who_we_are_and_what_to_change() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    use csi_provisioner::csi::socket_access::ProcessIdentity;

    let dir = tempfile::tempdir().unwrap();
    // Searchable by anyone: the refusal must come from the socket itself.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("csi.sock");
    let _listener = UnixListener::bind(&socket).unwrap();
    let us = ProcessIdentity::current().expect("/proc/self/status");
    let (mut command, uid) = if us.uid == 0 {
        // Root ignores permission bits; nobody (65534) does not. setpriv drops root's
        // capabilities with the UID change. The binary is copied where nobody may run it.
        let setpriv_works = Command::new("setpriv").arg("--version").output();
        if !setpriv_works.is_ok_and(|o| o.status.success()) {
            // Straight to stderr: the harness would swallow an `eprintln!` of a passing test.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"SKIPPED a_socket_that_refuses_our_uid_says_who_we_are_and_what_to_change: \
                  running as root and setpriv (util-linux) is not installed\n",
            );
            return;
        }
        let binary = dir.path().join("csi-provisioner");
        std::fs::copy(workspace_bin("csi-provisioner"), &binary).unwrap();
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(binary);
        (command, 65534)
    } else {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o000)).unwrap();
        (Command::new(workspace_bin("csi-provisioner")), us.uid)
    };
    command.arg(format!("--csi-address={}", socket.display()));
    let mut sidecar = ChildProcess::spawn(&mut command);
    sidecar.wait_for_log("permission denied", DEADLINE).await;
    let log = sidecar.log_contents();
    let line = log
        .lines()
        .find(|l| l.contains("permission denied"))
        .unwrap();
    for needle in [
        format!("cannot connect to CSI socket {}", socket.display()),
        format!("for uid {uid}"),
        "the socket belongs to uid ".to_string(),
        "securityContext.runAsUser".to_string(),
        "\"Running as non-root\" in the README".to_string(),
    ] {
        assert!(line.contains(&needle), "{needle:?} not in {line:?}");
    }
    assert!(
        sidecar.is_running(),
        "still retrying: the driver may fix the mode"
    );
}

#[tokio::test]
async fn sigterm_while_waiting_for_the_driver_exits_0_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("never.sock");
    let mut sidecar = ChildProcess::spawn(
        Command::new(workspace_bin("csi-provisioner"))
            .arg(format!("--csi-address={}", socket.display())),
    );
    sidecar.wait_for_log("still connecting", DEADLINE).await;
    sidecar.terminate();
    let status = sidecar.wait_exit(Duration::from_secs(20)).await;
    // Not the 30 s hard deadline's exit 1: start-up gives way to a stop.
    assert_eq!(status.code(), Some(0), "{}", sidecar.log_contents());
}

/// `--vmodule` raises the verbosity of the matching sources only: the CSI
/// client's debug line "CSI connect failed; retrying" (src/csi/client.rs,
/// logged every 200 ms while the socket is missing) shows with a pattern for
/// that file or module, and not with `-v=0` alone or a pattern for another file.
#[tokio::test]
async fn vmodule_raises_verbosity_for_matching_files_and_modules_only() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("never.sock");
    let start = |extra: &[&str]| {
        ChildProcess::spawn(
            Command::new(workspace_bin("csi-provisioner"))
                .arg(format!("--csi-address={}", socket.display()))
                .args(extra),
        )
    };
    let mut runs = vec![
        (start(&["--vmodule=client=5"]), true),
        (start(&["-vmodule=cli*=5,volume=7"]), true),
        (start(&["--vmodule=csi_provisioner::csi::*=5"]), true),
        (start(&["--vmodule=volume=9"]), false),
        (start(&["--vmodule=client=4"]), false),
        (start(&[]), false),
    ];
    // The line is logged every 200 ms from start-up; a second is plenty.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (sidecar, shown) in &mut runs {
        assert!(sidecar.is_running(), "{}", sidecar.log_contents());
        sidecar.kill();
        let log = sidecar.log_contents();
        assert_eq!(
            log.contains("CSI connect failed; retrying"),
            *shown,
            "{:?}:\n{log}",
            sidecar.log_path()
        );
    }
}

/// With the alpha split stream, info and debug lines go to stdout and only
/// errors to stderr (upstream: `--log-text-split-stream`).
#[test]
fn split_stream_sends_non_errors_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(workspace_bin("csi-provisioner"))
        .args([
            &format!("--csi-address={}", dir.path().join("never.sock").display()),
            "-v=5",
            "--feature-gates=LoggingAlphaOptions=true",
            "--log-text-split-stream",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("running csi-provisioner");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = child.kill();
    child.wait().unwrap();
    let (out, err) = (
        std::fs::read_to_string(&stdout).unwrap(),
        std::fs::read_to_string(&stderr).unwrap(),
    );
    assert!(
        out.contains("CSI connect failed; retrying"),
        "stdout: {out}"
    );
    assert!(err.is_empty(), "stderr: {err}");
}

/// Runs the binary with stdout (or stderr) connected to a pipe whose reading
/// end is already closed, as in `csi-provisioner --help | head -1` once `head`
/// has gone: every write fails with EPIPE.
fn run_with_closed(stream: &str, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("creating a pipe");
    drop(reader);
    let mut cmd = Command::new(workspace_bin("csi-provisioner"));
    cmd.args(args).env_remove("KUBECONFIG").stdin(Stdio::null());
    match stream {
        "stdout" => cmd.stdout(writer).stderr(Stdio::piped()),
        "stderr" => cmd.stdout(Stdio::piped()).stderr(writer),
        _ => unreachable!("{stream}"),
    };
    cmd.output().expect("running csi-provisioner")
}

#[test]
fn help_and_version_exit_0_quietly_when_the_reader_has_gone() {
    for args in [&["--help"][..], &["-h"], &["--version"], &["-version"]] {
        let out = run_with_closed("stdout", args);
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}:\n{err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}:\n{err}");
        assert!(err.is_empty(), "{args:?}: nothing to say on stderr:\n{err}");
    }
}

#[test]
fn a_usage_error_keeps_its_exit_code_when_stderr_is_gone() {
    let out = run_with_closed("stderr", &["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "not a panic (101): {out:?}");
    let out = run_with_closed(
        "stderr",
        &["--csi-address=/nonexistent.sock", "--enable-capacity"],
    );
    assert_eq!(out.status.code(), Some(1), "not a panic (101): {out:?}");
}

/// The headings of `--help`, in order: the flags grouped by what they configure.
const HEADINGS: [&str; 11] = [
    "Options:",
    "CSI driver connection:",
    "Kubernetes API client:",
    "Leader election:",
    "Provisioning:",
    "Data sources (clones and snapshots):",
    "Claim and namespace metadata:",
    "Storage capacity:",
    "Node deployment:",
    "Metrics and HTTP:",
    "Feature gates and logging:",
];

#[test]
fn help_says_what_the_program_is_then_groups_the_flags() {
    for flag in ["--help", "-h"] {
        let out = run(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        let first = help.lines().next().unwrap_or_default();
        assert!(
            first.contains("external-provisioner") && first.contains("PersistentVolumes"),
            "{flag}: the first line says what the program is: {first:?}"
        );
        // Notes for readers of the code (rustdoc links, clap internals) stay in the code.
        for note in ["[`", "parse_from", "clap"] {
            assert!(!help.contains(note), "{flag}: {note:?} in:\n{help}");
        }
        let flags = help.split("\nEnvironment:").next().unwrap_or_default();
        let headings: Vec<&str> = flags
            .lines()
            .filter(|l| !l.starts_with(' ') && l.ends_with(':'))
            .collect();
        assert_eq!(headings, HEADINGS, "{flag}:\n{help}");
        // Each group holds its flags: a flag is listed under the heading before it.
        let under = |flag_name: &str| {
            let at = help
                .find(&format!("--{flag_name}"))
                .unwrap_or_else(|| panic!("--{flag_name} missing:\n{help}"));
            HEADINGS.iter().rfind(|h| help[..at].contains(*h)).copied()
        };
        for (flag_name, heading) in [
            ("csi-address", "CSI driver connection:"),
            ("kube-api-burst", "Kubernetes API client:"),
            ("leader-election-labels", "Leader election:"),
            ("worker-threads", "Provisioning:"),
            (
                "prevent-volume-mode-conversion",
                "Data sources (clones and snapshots):",
            ),
            ("copy-pvc-labels", "Claim and namespace metadata:"),
            ("capacity-ownerref-level", "Storage capacity:"),
            ("node-deployment-max-delay", "Node deployment:"),
            ("metrics-path", "Metrics and HTTP:"),
            ("feature-gates", "Feature gates and logging:"),
            ("log-json-info-buffer-size", "Feature gates and logging:"),
        ] {
            assert_eq!(under(flag_name), Some(heading), "--{flag_name} ({flag})");
        }
    }
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    // The long form says more: where it runs, the environment, the exit codes.
    for needed in [
        "sidecar",
        "KUBECONFIG",
        "POD_NAMESPACE",
        "Exit status",
        "csi-provisioner check",
        "csi-provisioner audit",
    ] {
        assert!(help.contains(needed), "{needed:?} missing:\n{help}");
    }
    // A default is shown where it says something, as Go's flag package does.
    assert!(help.contains("[default: 10s]"), "{help}");
    assert!(!help.contains("[default: false]"), "{help}");
    assert!(!help.contains("[default: \"\"]"), "{help}");
}

#[test]
fn help_says_what_enable_pprof_serves() {
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    let at = help.find("--enable-pprof[").expect("--enable-pprof");
    let entry: String = help[at..].lines().take(6).collect::<Vec<_>>().join("\n");
    for needed in ["/debug/pprof/", "seconds=N", "501", "--http-endpoint"] {
        assert!(entry.contains(needed), "{needed:?} missing:\n{entry}");
    }
    assert!(!help.contains("not built yet"), "{help}");
}
