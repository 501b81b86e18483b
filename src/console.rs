//! Text for the person at the terminal (help, version, reports, the reason
//! the program stopped), written so that a reader who goes away early
//! (`csi-provisioner --help | head -1`) ends the program quietly. `print!`
//! and `eprintln!` panic when the pipe is closed: Rust ignores SIGPIPE, so
//! the write fails with `BrokenPipe` instead of ending the process.

use std::io::{self, Write};

/// Writes `text` to stdout and flushes it. A reader that has gone away is
/// not an error (nobody is left to tell); any other failure is returned.
pub fn out(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    quiet_on_closed_pipe(
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush()),
    )
}

/// Writes `text` to stderr. Failures are dropped: stderr is where a failure
/// would have been reported.
pub fn err(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// `Ok` for a closed pipe, the result otherwise.
pub fn quiet_on_closed_pipe(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_quiet_and_other_failures_are_not() {
        let broken = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(quiet_on_closed_pipe(Err(broken)).is_ok());
        let full = io::Error::from(io::ErrorKind::StorageFull);
        assert_eq!(
            quiet_on_closed_pipe(Err(full)).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert!(quiet_on_closed_pipe(Ok(())).is_ok());
    }
}
