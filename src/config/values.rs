//! The syntax of flag values that are not plain numbers, strings or Go
//! durations (those are `crate::duration`'s): Go's booleans, label lists,
//! `--vmodule` lists and Kubernetes byte quantities.

/// Go's `strconv.ParseBool`.
pub(super) fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (use true or false)")),
    }
}

/// One `--leader-election-labels` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels(pub Vec<(String, String)>);

/// `k1:v1,k2:v2`; every item needs exactly one `:` (upstream: csi-lib-utils
/// `standardflags.stringMap`, which trims nothing).
pub(super) fn parse_labels(s: &str) -> Result<Labels, String> {
    s.split(',')
        .map(|item| match item.split(':').collect::<Vec<_>>()[..] {
            [key, value] => Ok((key.to_string(), value.to_string())),
            _ => Err(format!(
                "malformed item in list of labels: {item:?} (want key:value)"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Labels)
}

/// One `--vmodule` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VModuleList(pub Vec<VModule>);

/// Verbosity for the files matching `pattern`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VModule {
    pub pattern: String,
    pub verbosity: u32,
}

/// `pattern=N,...` (upstream: component-base `VModuleConfigurationPflag`).
pub(super) fn parse_vmodule(s: &str) -> Result<VModuleList, String> {
    let mut list = Vec::new();
    for item in s.split(',').filter(|item| !item.is_empty()) {
        let [pattern, level] = item.split('=').collect::<Vec<_>>()[..] else {
            return Err(format!("{item:?} does not have the pattern=N format"));
        };
        if pattern.is_empty() || level.is_empty() {
            return Err(format!("{item:?} does not have the pattern=N format"));
        }
        let verbosity = level
            .parse::<u32>()
            .ok()
            .filter(|v| *v <= i32::MAX as u32)
            .ok_or_else(|| format!("invalid verbosity in {item:?}"))?;
        list.push(VModule {
            pattern: pattern.to_string(),
            verbosity,
        });
    }
    Ok(VModuleList(list))
}

/// A Kubernetes resource quantity as a whole number of bytes, rounded up as
/// `Quantity.Value()` does: `512`, `1k` (1000), `2Ki` (1024), `5M`, `6Gi`,
/// `1.5Mi`, `1e3`. Negative sizes are rejected. (Upstream's help text says
/// `1K`, but a Kubernetes quantity only knows lower-case `k`; so here.)
pub fn parse_byte_quantity(input: &str) -> Result<u64, String> {
    use crate::quantity::{QuantityError, parse};
    parse(input).map_err(|e| match e {
        QuantityError::Malformed => {
            format!("invalid quantity {input:?} (examples: 512, 1k, 2Ki, 5Mi)")
        }
        QuantityError::Negative => format!("quantity {input:?} must not be negative"),
        QuantityError::TooLarge => format!("quantity {input:?} is too large"),
    })
}

pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
