//! csi-provisioner: the sidecar, or one of the operator commands (`check`,
//! `audit`), each run through the one entry of `csi_provisioner::entry`.

use std::process::ExitCode;

use csi_provisioner::audit::Audit;
use csi_provisioner::check::Check;
use csi_provisioner::entry;
use csi_provisioner::run::Sidecar;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // The operator commands; everything else is the sidecar's command line.
    match argv.get(1).map(String::as_str) {
        Some("check") => entry::main::<Check>(argv),
        Some("audit") => entry::main::<Audit>(argv),
        _ => entry::main::<Sidecar>(argv),
    }
}
