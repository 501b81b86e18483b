//! The one way in of every command of this program (the sidecar, `check`,
//! `audit`): flags to a typed config or an exit code, help and version
//! printing, the one-thread runtime, and the signals that stop the work.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::console;

/// A command of this program, as [`main`] runs it.
pub trait Command {
    /// What the work needs, validated.
    type Config;

    /// How long tasks still running get once the work is done: the process
    /// never hangs on its way out.
    const GRACE: Duration;

    /// The command line (program name first) to a config, or the exit code
    /// once what was asked for (help, version) or why not has been printed.
    fn start(argv: Vec<String>) -> Result<Self::Config, ExitCode>;

    /// The work, on the runtime; what it prints and its exit status.
    fn run(cfg: Self::Config) -> impl Future<Output = ExitCode>;
}

/// Runs `C` with `argv`: start, the work on [`runtime`], then the grace.
pub fn main<C: Command>(argv: Vec<String>) -> ExitCode {
    let cfg = match C::start(argv) {
        Ok(cfg) => cfg,
        Err(code) => return code,
    };
    let Some(runtime) = runtime() else {
        return ExitCode::from(1);
    };
    let code = runtime.block_on(C::run(cfg));
    runtime.shutdown_timeout(C::GRACE);
    code
}

/// clap's answer as every command takes it: `--help` printed (exit 0), or a
/// flag that cannot be parsed said in one line (clap's exit code, 2).
pub fn flags<A>(parsed: Result<A, clap::Error>) -> Result<A, ExitCode> {
    parsed.map_err(|e| {
        if e.kind() == clap::error::ErrorKind::DisplayHelp {
            return print(&e.render().to_string(), ExitCode::SUCCESS);
        }
        fail(&crate::config::error_line(&e), e.exit_code() as u8)
    })
}

/// Writes what the user asked for (help, version, a report) to stdout and
/// exits with `code`, also when the reader stopped reading; 1 when stdout
/// cannot be written.
pub fn print(text: &str, code: ExitCode) -> ExitCode {
    match console::out(text) {
        Ok(()) => code,
        Err(e) => {
            console::err(&format!("failed to write to stdout: {e}\n"));
            ExitCode::from(1)
        }
    }
}

/// Says why on stderr, in one line, and exits with `code`.
pub fn fail(why: &dyn std::fmt::Display, code: u8) -> ExitCode {
    console::err(&format!("{why}\n"));
    ExitCode::from(code)
}

/// The runtime every command of this program runs on: one thread. The
/// sidecar waits on the network almost all the time, and a single-threaded
/// runtime spends no CPU on cross-thread wake-ups and keeps one allocator
/// arena (the benchmark measured about a quarter less CPU per volume than
/// with the multi-threaded runtime). `None` after saying why it could not be
/// made.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            console::err(&format!("failed to start the async runtime: {e}\n"));
            None
        }
    }
}

/// What SIGTERM and SIGINT ask for: the first signal cancels `stop`, the
/// next one `again` (each command says what a second signal means).
#[derive(Clone, Default)]
pub struct Signals {
    pub stop: CancellationToken,
    pub again: CancellationToken,
}

impl Signals {
    /// Starts listening, on the current runtime. When the handlers cannot
    /// be installed nothing is ever cancelled, and the signals keep their
    /// default effect.
    pub fn watch() -> Signals {
        let signals = Signals::default();
        tokio::spawn(listen(signals.clone()));
        signals
    }
}

async fn listen(signals: Signals) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("shutting down");
    signals.stop.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    signals.again.cancel();
}
