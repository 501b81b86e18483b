//! A fault-injecting CSI driver for tests (not part of the product).
//!
//! It serves Identity, Controller and Node on a unix socket, keeps a durable ledger of every
//! volume it holds (`<state-dir>/ledger.json` and its journal `ledger.log`), and takes orders on a second unix socket: inject
//! latency or errors, hang calls until released, answer `DEADLINE_EXCEEDED` after creating,
//! crash. Tests drive it through [`control::Client`] and start it with [`process`].
//! See `docs/test-driver.md`.

pub mod args;
pub mod book;
pub mod code;
pub mod control;
pub mod driver;
pub mod faults;
pub mod ledger;
pub mod process;
pub mod server;

pub use args::Args;
pub use code::GrpcCode;
pub use server::run;
