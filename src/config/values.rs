//! The syntax of flag values that are not plain numbers, strings or Go
//! durations (those are `crate::duration`'s): Go's booleans, label lists,
//! lists of label or annotation keys, `--vmodule` lists and Kubernetes byte
//! quantities.

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

/// One value of a list-of-keys flag (`--copy-pvc-labels` and friends).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys(pub Vec<String>);

/// `key1,key2`: label or annotation keys, each a Kubernetes qualified name
/// (`[prefix/]name`), as pflag's string slice takes them; an empty value is
/// an empty list.
pub(super) fn parse_keys(s: &str) -> Result<Keys, String> {
    if s.is_empty() {
        return Ok(Keys(Vec::new()));
    }
    s.split(',')
        .map(|key| {
            qualified_name(key)
                .map(|()| key.to_string())
                .map_err(|why| format!("{key:?} is not a label or annotation key: {why}"))
        })
        .collect::<Result<_, _>>()
        .map(Keys)
}

/// apimachinery's `IsQualifiedName`: an optional DNS-subdomain prefix and
/// `/`, then a name of 1 to 63 alphanumerics, `-`, `_` or `.`, starting and
/// ending with an alphanumeric.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => return Err("more than one '/'".into()),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err(
                "the prefix must be a DNS subdomain (lower-case alphanumerics, '-' and '.')".into(),
            );
        }
    }
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    let bytes = name.as_bytes();
    if name.is_empty() || name.len() > 63 {
        return Err("the name must be 1 to 63 characters".into());
    }
    if !edge(bytes.first())
        || !edge(bytes.last())
        || !bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("the name must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric".into());
    }
    Ok(())
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
