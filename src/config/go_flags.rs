//! Go's flag syntax on clap: single-dash long flags (`-csi-address=/x`,
//! `-leader-election`) rewritten to `--` form, with `-v` in all its pflag
//! forms (`-v 5`, `-v=5`, `-v5`) left as they are.

/// Rewrites Go's single-dash long flags (`-csi-address=/x`,
/// `-leader-election`, `-timeout 10s`) to `--` form so clap understands them.
/// Left alone: `-v` in all its forms (`-v 5`, `-v=5`, `-v5`), `-h`, values
/// following a flag that takes one (`-kubeconfig -weird-name`), anything that
/// is not a flag (`-1`) and everything after `--`. Which flags take a value
/// is read from `command`, the command line being parsed.
pub fn normalize_args(
    command: &clap::Command,
    argv: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let takes_separate_value = separate_value_flags(command);
    let mut out = Vec::new();
    let mut argv = argv.into_iter();
    // The program name is never a flag.
    out.extend(argv.next());
    let mut value_next = false;
    let mut passthrough = false;
    for arg in argv {
        if passthrough || value_next {
            value_next = false;
            out.push(arg);
            continue;
        }
        if arg == "--" {
            passthrough = true;
            out.push(arg);
            continue;
        }
        let (dashes, body) = if let Some(body) = arg.strip_prefix("--") {
            (2, body)
        } else if let Some(body) = arg.strip_prefix('-') {
            (1, body)
        } else {
            out.push(arg);
            continue;
        };
        let (name, has_value) = match body.split_once('=') {
            Some((name, _)) => (name, true),
            None => (body, false),
        };
        if dashes == 1 && !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            // `-1`, `-`: a value, not a flag.
            out.push(arg);
            continue;
        }
        // `-v5` carries its value (not in the list); `-v`, `--timeout` take
        // the next argument.
        if !has_value && takes_separate_value.iter().any(|f| f == name) {
            value_next = true;
        }
        let is_short = name == "h" || is_short_verbosity(name);
        if dashes == 1 && !is_short {
            out.push(format!("-{arg}"));
        } else {
            out.push(arg);
        }
    }
    out
}

/// `v`, or `v` followed by its value (`-v5`), as pflag's shorthand allows.
fn is_short_verbosity(name: &str) -> bool {
    name.strip_prefix('v')
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit()))
}

/// Long names (and `v`) of the flags whose value may be the next argument.
fn separate_value_flags(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_require_equals_set())
        .flat_map(|a| {
            let long = a.get_long().map(str::to_string);
            let short = a.get_short().map(String::from);
            long.into_iter().chain(short)
        })
        .collect()
}
