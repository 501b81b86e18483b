//! `--enable-pprof`: Go's `/debug/pprof/` paths, served with what a Rust process has. The CPU
//! profile samples on SIGPROF (rpprof, a fork of pprof-rs, at Go's 100 Hz) and answers pprof's
//! protobuf, which `go tool pprof` reads; the profiles only Go's runtime keeps answer 501 saying
//! why.

use std::time::Duration;

use http_body_util::Full;
use hyper::Response;
use hyper::StatusCode;
use hyper::body::Bytes;
use rpprof::protos::Message;

use super::reply;

/// Where the profiles are served (upstream: `net/http/pprof` on the same mux as the metrics).
pub(super) const PREFIX: &str = "/debug/pprof/";

/// Go's sampling rate (`runtime.SetCPUProfileRate` default), so sample counts compare.
const HZ: i32 = 100;

/// Go's `/debug/pprof/profile` default when `seconds` is absent or not a positive integer.
const DEFAULT_SECONDS: u64 = 30;

/// A path Go serves under [`PREFIX`], in the order the index lists them.
struct Profile {
    name: &'static str,
    about: &'static str,
    /// Why this process cannot serve it; `None` when it can.
    unavailable: Option<&'static str>,
}

const NO_ALLOCATION_SAMPLES: &str = "this process allocates with the C library's allocator, \
     which records no allocation samples (Go's runtime samples every 512 KiB allocated)";

const PROFILES: &[Profile] = &[
    Profile {
        name: "profile",
        about: "CPU profile, pprof protobuf: ?seconds=N (default 30)",
        unavailable: None,
    },
    Profile {
        name: "cmdline",
        about: "the command line, arguments separated by NUL",
        unavailable: None,
    },
    Profile {
        name: "heap",
        about: "live allocations",
        unavailable: Some(NO_ALLOCATION_SAMPLES),
    },
    Profile {
        name: "allocs",
        about: "past allocations",
        unavailable: Some(NO_ALLOCATION_SAMPLES),
    },
    Profile {
        name: "goroutine",
        about: "stacks of the goroutines",
        unavailable: Some("goroutines are Go's; this process runs tokio tasks on one thread"),
    },
    Profile {
        name: "threadcreate",
        about: "stacks that created threads",
        unavailable: Some("Go's runtime records thread creation; Rust's does not"),
    },
    Profile {
        name: "block",
        about: "stacks that blocked on synchronization",
        unavailable: Some("Go's runtime records blocking events; Rust's does not"),
    },
    Profile {
        name: "mutex",
        about: "holders of contended mutexes",
        unavailable: Some("Go's runtime records mutex contention; Rust's does not"),
    },
    Profile {
        name: "trace",
        about: "execution trace",
        unavailable: Some(
            "the trace is Go's execution tracer format, which only Go's runtime writes",
        ),
    },
    Profile {
        name: "symbol",
        about: "program counters to function names",
        unavailable: Some(
            "not needed: the CPU profile is symbolized when taken, its functions carry names",
        ),
    },
];

/// Answers a path under [`PREFIX`] (`name` is what follows it).
pub(super) async fn handle(name: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    match name {
        "" => reply(StatusCode::OK, "text/html; charset=utf-8", index()),
        "cmdline" => {
            let args: Vec<String> = std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            reply(StatusCode::OK, "text/plain; charset=utf-8", args.join("\0"))
        }
        "profile" => cpu(seconds(query)).await,
        _ => match PROFILES.iter().find(|p| p.name == name) {
            Some(Profile {
                unavailable: Some(why),
                ..
            }) => reply(
                StatusCode::NOT_IMPLEMENTED,
                "text/plain; charset=utf-8",
                format!("{name} profile not available: {why}\n"),
            ),
            // Go's answer for a name it does not know.
            _ => reply(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "Unknown profile\n",
            ),
        },
    }
}

/// The `seconds` query parameter as Go reads it: anything but a positive integer is 30.
fn seconds(query: Option<&str>) -> u64 {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(DEFAULT_SECONDS)
}

/// Samples for `seconds`, then answers the profile (uncompressed protobuf: `go tool pprof`
/// reads it as it reads Go's gzipped one).
async fn cpu(seconds: u64) -> Response<Full<Bytes>> {
    let builder = rpprof::ProfilerGuardBuilder::default().frequency(HZ);
    // Unwinding from inside these from a signal handler can deadlock (pprof-rs' advice).
    // rpprof has the list only where it reads the interrupted instruction pointer itself: not
    // on the image's arm, ppc64le and s390x builds.
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    ))]
    let builder = builder.blocklist(&["libc", "libgcc", "pthread", "vdso"]);
    let guard = match builder.build() {
        Ok(guard) => guard,
        // Go's words for a second profile at once.
        Err(rpprof::Error::Running) => return failed("cpu profiling already in use".into()),
        Err(e) => return failed(e.to_string()),
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    // Symbolizing reads the binary's symbol table: blocking work, off the runtime's thread.
    let encoded = tokio::task::spawn_blocking(move || {
        let profile = guard.report().build()?.pprof()?;
        Ok::<_, rpprof::Error>(profile.encode_to_vec())
    })
    .await;
    match encoded {
        Ok(Ok(body)) => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/octet-stream")
            .header("content-disposition", "attachment; filename=\"profile\"")
            .header("x-content-type-options", "nosniff")
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts are valid"),
        Ok(Err(e)) => failed(e.to_string()),
        Err(e) => failed(e.to_string()),
    }
}

/// Go's error answer of `/debug/pprof/profile`.
fn failed(reason: String) -> Response<Full<Bytes>> {
    reply(
        StatusCode::INTERNAL_SERVER_ERROR,
        "text/plain; charset=utf-8",
        format!("Could not enable CPU profiling: {reason}\n"),
    )
}

/// The index page: each of Go's profiles, a link where it is served, the reason where not.
fn index() -> String {
    let rows: String = PROFILES
        .iter()
        .map(|p| match p.unavailable {
            None => format!(
                "<tr><td><a href=\"{name}\">{name}</a></td><td>{about}</td></tr>\n",
                name = p.name,
                about = p.about
            ),
            Some(why) => format!(
                "<tr><td>{}</td><td>{}: not available ({why})</td></tr>\n",
                p.name, p.about
            ),
        })
        .collect();
    format!(
        "<html>\n<head><title>/debug/pprof/</title></head>\n<body>\n/debug/pprof/\n\
         <table>\n{rows}</table>\n\
         <p>go tool pprof http://ADDRESS/debug/pprof/profile?seconds=30</p>\n</body>\n</html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_as_go_reads_them() {
        for (query, want) in [
            (None, 30),
            (Some("seconds=2"), 2),
            (Some("debug=1&seconds=5"), 5),
            (Some("seconds=0"), 30),
            (Some("seconds=-3"), 30),
            (Some("seconds=1.5"), 30),
            (Some("seconds="), 30),
        ] {
            assert_eq!(seconds(query), want, "{query:?}");
        }
    }

    #[test]
    fn the_index_links_what_is_served_and_says_why_the_rest_is_not() {
        let page = index();
        assert!(page.contains("<a href=\"profile\">profile</a>"));
        assert!(page.contains("<a href=\"cmdline\">cmdline</a>"));
        assert!(!page.contains("href=\"heap"));
        assert!(page.contains("heap</td><td>live allocations: not available ("));
    }
}
