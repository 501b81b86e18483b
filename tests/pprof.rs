//! `--enable-pprof` as an operator uses it: the sidecar serving `/debug/pprof/` on its HTTP
//! endpoint, a CPU profile taken while it provisions claims, read back as a pprof protobuf
//! (samples and named functions) and by `go tool pprof` itself; the index, the command line, and
//! the Go-only profiles answering 501. Without the flag, nothing is served there.

mod support;

use std::process::Command;

use support::{Rig, Sidecar, free_address, get, wait_serving};

/// The few fields of pprof's `perftools.profiles.Profile` the test reads (field numbers of
/// github.com/google/pprof's profile.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
}

#[tokio::test]
async fn a_cpu_profile_taken_while_provisioning_reads_as_pprof() {
    let address = free_address();
    let rig = Rig::builder("pprof")
        .sidecar_args(&[&format!("--http-endpoint={address}"), "--enable-pprof"])
        .start()
        .await;
    wait_serving(&rig, &address, "/metrics").await;

    // Work for the profiler to see: claims provisioned and metrics scraped while it samples
    // (bounded: 8 claims, 300 scrapes).
    let profile = {
        let address = address.clone();
        tokio::spawn(async move { get(&address, "/debug/pprof/profile?seconds=2", None).await })
    };
    for i in 0..8 {
        rig.create_claim(rig.claim(&format!("data-{i}"))).await;
    }
    for i in 0..8 {
        rig.wait_bound(&format!("data-{i}")).await;
    }
    for _ in 0..300 {
        if profile.is_finished() {
            break;
        }
        get(&address, "/metrics", None)
            .await
            .expect("scraping /metrics");
    }
    let reply = profile.await.unwrap().expect("GET /debug/pprof/profile");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.content_type, "application/octet-stream");

    let decoded: Profile = prost::Message::decode(reply.bytes.as_slice()).expect("pprof protobuf");
    let name = |i: i64| decoded.string_table[i as usize].as_str();
    let kinds: Vec<(&str, &str)> = decoded
        .sample_type
        .iter()
        .map(|t| (name(t.r#type), name(t.unit)))
        .collect();
    assert_eq!(
        kinds,
        [("samples", "count"), ("cpu", "nanoseconds")],
        "Go's CPU profile sample types"
    );
    assert!(
        !decoded.sample.is_empty(),
        "no sample in 2 s of provisioning"
    );
    let functions: Vec<&str> = decoded.function.iter().map(|f| name(f.name)).collect();
    assert!(
        functions.iter().any(|f| f.contains("csi_provisioner")),
        "no function of ours among {} named: {:?}",
        functions.len(),
        &functions[..functions.len().min(20)]
    );

    go_tool_pprof_reads(&reply.bytes);
    rig.cleanup().await;
}

/// `go tool pprof -top`: the format's real reader (Go is a prerequisite of the test bed).
fn go_tool_pprof_reads(profile: &[u8]) {
    let (stdout, stderr) = go_tool_pprof("-top", profile);
    eprintln!("go tool pprof -top, first lines:\n{}", head(&stdout, 12));
    assert!(stdout.contains("Type: cpu"), "{stdout}\n{stderr}");
    assert!(stdout.contains("flat%"), "{stdout}\n{stderr}");
    assert!(stdout.contains("csi_provisioner"), "{stdout}\n{stderr}");
}

/// `go tool pprof <output> <profile>`: its stdout and stderr, after it succeeded.
fn go_tool_pprof(output: &str, profile: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpu.pb");
    std::fs::write(&path, profile).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", output])
        .arg(&path)
        .output()
        .expect("running go tool pprof (Go is a prerequisite of the test bed)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "go tool pprof {output}: {stderr}");
    (stdout, stderr)
}

fn head(text: &str, lines: usize) -> String {
    text.lines().take(lines).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn the_index_cmdline_and_go_only_profiles() {
    let address = free_address();
    let rig = Rig::builder("pprof-index")
        .sidecar_args(&[&format!("--http-endpoint={address}"), "-enable-pprof=true"])
        .start()
        .await;
    let index = wait_serving(&rig, &address, "/debug/pprof/").await;
    assert!(index.content_type.starts_with("text/html"));
    assert!(index.body.contains("<a href=\"profile\">profile</a>"));
    assert!(index.body.contains("heap"), "{}", index.body);

    let cmdline = get(&address, "/debug/pprof/cmdline", None).await.unwrap();
    assert_eq!(cmdline.status, 200);
    let args: Vec<&str> = cmdline.body.split('\0').collect();
    assert!(args[0].ends_with("csi-provisioner"), "{args:?}");
    assert!(args.contains(&"-enable-pprof=true"), "{args:?}");

    for name in [
        "heap",
        "allocs",
        "goroutine",
        "block",
        "mutex",
        "threadcreate",
        "trace",
    ] {
        let reply = get(&address, &format!("/debug/pprof/{name}"), None)
            .await
            .unwrap();
        assert_eq!(reply.status, 501, "{name}: {}", reply.body);
        assert!(
            reply.body.contains("not available"),
            "{name}: {}",
            reply.body
        );
    }
    let unknown = get(&address, "/debug/pprof/nonsense", None).await.unwrap();
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (404, "Unknown profile\n")
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn without_the_flag_nothing_is_served_under_debug_pprof() {
    let address = free_address();
    let rig = Rig::builder("pprof-off")
        .sidecar_args(&[&format!("--http-endpoint={address}")])
        .start()
        .await;
    wait_serving(&rig, &address, "/metrics").await;
    for path in ["/debug/pprof/", "/debug/pprof/profile?seconds=1"] {
        let reply = get(&address, path, None).await.unwrap();
        assert_eq!(reply.status, 404, "{path}: {}", reply.body);
    }
    rig.cleanup().await;
}

/// What a profile is, as `go tool pprof -raw` prints it: its period type, period and sample
/// types (the samples themselves differ by nature).
fn profile_shape(profile: &[u8]) -> Vec<String> {
    let (raw, _) = go_tool_pprof("-raw", profile);
    let mut lines = raw.lines();
    let mut shape: Vec<String> = Vec::new();
    while let Some(line) = lines.next() {
        if line.starts_with("PeriodType:") || line.starts_with("Period:") {
            shape.push(line.trim().to_string());
        }
        if line.starts_with("Samples:") {
            shape.push(lines.next().unwrap_or_default().trim().to_string());
        }
    }
    shape
}

/// What an operator's tools see of `--enable-pprof`, from upstream v6.4 and from ours on the
/// same flags: the CPU profile's path, type and shape as `go tool pprof` reads it, the command
/// line, an unknown profile's answer. The one difference (docs/compatibility.md): Go's heap
/// profile, which upstream serves and ours answers 501.
#[tokio::test]
async fn upstream_and_ours_serve_the_same_profile_paths() {
    let mut seen = Vec::new();
    for who in [Sidecar::Upstream, Sidecar::Ours] {
        let address = free_address();
        let mut rig = Rig::builder("pprof-sbs").start_for(who).await;
        let endpoint = format!("--http-endpoint={address}");
        let _upstream = rig.start_as(who, &[&endpoint, "--enable-pprof"]);
        wait_serving(&rig, &address, "/metrics").await;
        let index = get(&address, "/debug/pprof/", None).await.unwrap();
        let profile = get(&address, "/debug/pprof/profile?seconds=1", None)
            .await
            .unwrap();
        assert_eq!(profile.status, 200, "{who:?}: {}", profile.body);
        let cmdline = get(&address, "/debug/pprof/cmdline", None).await.unwrap();
        let args: Vec<&str> = cmdline.body.split('\0').collect();
        let unknown = get(&address, "/debug/pprof/nonsense", None).await.unwrap();
        let heap = get(&address, "/debug/pprof/heap", None).await.unwrap();
        seen.push((
            who,
            (
                index.status,
                index.content_type.starts_with("text/html"),
                profile.content_type.clone(),
                profile_shape(&profile.bytes),
                cmdline.status,
                args.contains(&"--enable-pprof"),
                unknown.status,
                unknown.body.clone(),
            ),
            heap.status,
        ));
        rig.cleanup().await;
    }
    eprintln!("side by side: {seen:#?}");
    let (upstream, ours) = (&seen[0], &seen[1]);
    assert_eq!(ours.1, upstream.1, "ours (left) and upstream v6.4 (right)");
    assert!(
        upstream.1.3.iter().any(|l| l.contains("cpu")),
        "a CPU profile: {:?}",
        upstream.1.3
    );
    assert_eq!(
        (upstream.2, ours.2),
        (200, 501),
        "heap: upstream serves it, ours cannot"
    );
}
