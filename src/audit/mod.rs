//! `csi-provisioner audit`: a read-only comparison of what a CSI driver holds
//! with what Kubernetes thinks it holds. It reads (collect.rs), decides what
//! is wrong (findings.rs, pure) and writes a report (render.rs); it never
//! creates, changes or deletes anything, on either side.

pub mod args;
pub mod collect;
pub mod findings;
pub mod render;

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
        let report = match run(&cfg).await {
            Ok(r) => r,
            Err(e) => return entry::fail(&format!("audit failed: {e}"), EXIT_ERROR),
        };
        let text = match cfg.output {
            OutputFormat::Table => render::table(&report),
            OutputFormat::Json => render::json(&report),
        };
        let code = if report.findings.is_empty() {
            EXIT_CLEAN
        } else {
            EXIT_FINDINGS
        };
        entry::print(&text, ExitCode::from(code))
    }
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
