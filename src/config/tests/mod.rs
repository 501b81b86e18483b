//! The flags and their validation (`parse_from`, `Config::from_args`), as
//! one file each: defaults, syntax, validation, feature gates.

use super::*;

// What the tests name that is private to a section (they were one file).
use super::client::rate_limit;
use super::values::parse_go_bool;
use crate::duration::format_go_duration;
use std::collections::{BTreeMap, HashMap};

mod defaults;
mod gates;
mod metadata;
mod syntax;
mod validation;

fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("csi-provisioner")
        .chain(args.iter().copied())
        .map(String::from)
        .collect()
}

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    parse_from(argv(args))
}

fn parsed(args: &[&str]) -> Args {
    parse(args).unwrap_or_else(|e| panic!("{args:?}: {}", error_line(&e)))
}

fn env(vars: &[(&str, &str)]) -> Env {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Env::from_lookup(|name| vars.get(name).cloned())
}

fn config(args: &[&str], env: &Env) -> Result<Config, ConfigError> {
    Config::from_args(&parsed(args), env)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
