//! `csi-provisioner audit`: a read-only comparison of what a CSI driver holds
//! with what Kubernetes thinks it holds. It reads (collect.rs), decides what
//! is wrong (findings.rs, pure) and writes a report (render.rs); it never
//! creates, changes or deletes anything, on either side.

pub mod args;
pub mod collect;
pub mod findings;
pub mod prometheus;
pub mod render;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use self::args::{AuditConfig, OutputFormat};
use self::collect::{AuditError, Sources};
use self::findings::{Report, Rules};
use crate::config::Env;
use crate::entry::{self, Command};

/// Exit status: nothing found.
pub const EXIT_CLEAN: u8 = 0;
/// Exit status: the audit could not be made.
pub const EXIT_ERROR: u8 = 1;
/// Exit status: a flag is wrong.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the report has findings.
pub const EXIT_FINDINGS: u8 = 3;

/// `csi-provisioner audit`, run by [`crate::entry`]. It takes no signals:
/// it only reads, so SIGINT or SIGTERM may simply end it.
pub struct Audit;

impl Command for Audit {
    type Config = AuditConfig;

    const GRACE: Duration = Duration::from_secs(1);

    /// `argv` starts with the program's name, followed by `audit`.
    fn start(argv: Vec<String>) -> Result<AuditConfig, ExitCode> {
        let program = argv.first().map_or("csi-provisioner", String::as_str);
        let name = format!("{program} audit");
        let args = entry::flags(args::parse_from(
            std::iter::once(name).chain(argv.into_iter().skip(2)),
        ))?;
        AuditConfig::from_args(&args, &Env::from_process()).map_err(|e| entry::fail(&e, EXIT_USAGE))
    }

    async fn run(cfg: AuditConfig) -> ExitCode {
        let outcome = run(&cfg).await;
        let now = Timestamp::now();
        let (text, code) = match &outcome {
            Ok(report) => (
                Some(render(report, cfg.output, now)),
                exit_code(report, cfg.output),
            ),
            // A failed run is a series too: an alert on `success` needs it.
            Err(_) if cfg.output == OutputFormat::Prometheus => {
                (Some(prometheus::failure(now)), EXIT_ERROR)
            }
            Err(_) => (None, EXIT_ERROR),
        };
        let written = match (text, &cfg.output_file) {
            (Some(text), Some(path)) => {
                write_replacing(path, &text).map_err(|e| format!("writing {}: {e}", path.display()))
            }
            (Some(text), None) => return print_then(outcome.err(), &text, code),
            (None, _) => Ok(()),
        };
        match (outcome, written) {
            (Err(e), _) => entry::fail(&format!("audit failed: {e}"), EXIT_ERROR),
            (Ok(_), Err(e)) => entry::fail(&e, EXIT_ERROR),
            (Ok(_), Ok(())) => ExitCode::from(code),
        }
    }
}

fn render(report: &Report, output: OutputFormat, now: Timestamp) -> String {
    match output {
        OutputFormat::Table => render::table(report),
        OutputFormat::Json => render::json(report),
        OutputFormat::Prometheus => prometheus::exposition(report, now),
    }
}

/// 3 for findings, except where the findings are in the output's series.
fn exit_code(report: &Report, output: OutputFormat) -> u8 {
    if report.findings.is_empty() || output == OutputFormat::Prometheus {
        EXIT_CLEAN
    } else {
        EXIT_FINDINGS
    }
}

/// Prints `text` to stdout, and the reason of a failed audit to stderr.
fn print_then(failed: Option<AuditError>, text: &str, code: u8) -> ExitCode {
    let printed = entry::print(text, ExitCode::from(code));
    match failed {
        Some(e) => entry::fail(&format!("audit failed: {e}"), EXIT_ERROR),
        None => printed,
    }
}

/// Writes `text` beside `path` and renames it over `path`, so a reader (node-exporter's
/// textfile collector) sees the old file or the new one, never half of one. The temporary
/// name does not end in `.prom`, which the collector would read.
fn write_replacing(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "audit".into(), |n| n.to_string_lossy().into_owned());
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// Connects, looks, and when the first look finds something, looks again
/// after `--recheck-after` and keeps what both looks found.
pub async fn run(cfg: &AuditConfig) -> Result<Report, AuditError> {
    let rules = Rules {
        volume_name_prefix: cfg.volume_name_prefix.clone(),
        volume_name_uuid_length: cfg.volume_name_uuid_length,
        intent_older_than: cfg.intent_older_than,
    };
    let sources = Sources::connect(cfg).await?;
    let first = findings::audit(&sources.inventory().await?, &rules, Timestamp::now());
    if first.findings.is_empty() || cfg.recheck_after.is_zero() {
        return Ok(first);
    }
    tokio::time::sleep(cfg.recheck_after).await;
    let second = findings::audit(&sources.inventory().await?, &rules, Timestamp::now());
    Ok(second.confirming(&first, cfg.recheck_after))
}
