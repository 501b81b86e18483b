//! `csi-provisioner audit`: a read-only comparison of what a CSI driver holds
//! with what Kubernetes thinks it holds. It reads (collect.rs), decides what
//! is wrong (findings.rs, pure) and writes a report (render.rs); it never
//! creates, changes or deletes anything, on either side.

pub mod args;
pub mod collect;
pub mod findings;
pub mod render;

use std::process::ExitCode;

use k8s_openapi::jiff::Timestamp;

use self::args::{AuditConfig, OutputFormat};
use self::collect::{AuditError, Sources};
use self::findings::{Report, Rules};
use crate::config::{Env, error_line};
use crate::console;

/// Exit status: nothing found.
pub const EXIT_CLEAN: u8 = 0;
/// Exit status: the audit could not be made.
pub const EXIT_ERROR: u8 = 1;
/// Exit status: a flag is wrong.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the report has findings.
pub const EXIT_FINDINGS: u8 = 3;

/// Runs `csi-provisioner audit`; `argv` starts with the program's name,
/// followed by `audit`.
pub fn main(argv: Vec<String>) -> ExitCode {
    let program = argv.first().map_or("csi-provisioner", String::as_str);
    let name = format!("{program} audit");
    let args = match args::parse_from(std::iter::once(name).chain(argv.into_iter().skip(2))) {
        Ok(a) => a,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            return print(&e.render().to_string(), EXIT_CLEAN);
        }
        Err(e) => {
            console::err(&format!("{}\n", error_line(&e)));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let cfg = match AuditConfig::from_args(&args, &Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            console::err(&format!("{e}\n"));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let Some(runtime) = crate::run::runtime() else {
        return ExitCode::from(EXIT_ERROR);
    };
    let report = runtime.block_on(run(&cfg));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            console::err(&format!("audit failed: {e}\n"));
            return ExitCode::from(EXIT_ERROR);
        }
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
    print(&text, code)
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

/// Writes `text` to stdout and exits with `code`; a reader that went away
/// early is no error, any other failure to write is.
fn print(text: &str, code: u8) -> ExitCode {
    match console::out(text) {
        Ok(()) => ExitCode::from(code),
        Err(e) => {
            console::err(&format!("failed to write to stdout: {e}\n"));
            ExitCode::from(EXIT_ERROR)
        }
    }
}
