//! Logging set-up: klog-style verbosity (`-v`) mapped onto tracing levels,
//! `--vmodule` raising it per source file or module, `--logging-format=text|json`
//! and the alpha split stream. CSI requests and responses are logged at debug
//! level, which `-v=5` enables, as upstream logs gRPC calls at V(5).

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, LoggingConfig, VModule};

/// The tracing level for a klog verbosity.
pub fn level_for(verbosity: u32) -> Level {
    match verbosity {
        0..=4 => Level::INFO,
        5..=6 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Installs the process's subscriber as the logging flags say; destructured
/// in full, so a logging flag added and left unused fails to compile.
pub fn init(cfg: &LoggingConfig) {
    let LoggingConfig {
        verbosity,
        vmodule,
        format,
        // Validated, but with nothing to act on: every line is written when
        // it is logged.
        flush_frequency: _,
        info_buffer_size: _,
        // Error events to stderr, everything else to stdout.
        split_stream,
    } = cfg;
    // Our crate follows -v; dependencies stay quieter unless -v is very high.
    let deps = if *verbosity >= 8 { "debug" } else { "warn" };
    let base = EnvFilter::new(format!(
        "{deps},csi_provisioner={}",
        level_for((*verbosity).into())
    ));
    // --vmodule can only raise verbosity, as in klog (which checks -v first).
    let vmodule = vmodule.clone();
    let filter = base.or(filter_fn(move |meta| vmodule_enables(&vmodule, meta)));
    let writer = if *split_stream {
        BoxMakeWriter::new(
            std::io::stderr
                .with_max_level(Level::ERROR)
                .or_else(std::io::stdout),
        )
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    // Colours only for a person at a terminal; log collectors get plain text,
    // as klog writes it.
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    let layer = match format {
        LogFormat::Text => layer.with_filter(filter).boxed(),
        LogFormat::Json => layer.json().flatten_event(true).with_filter(filter).boxed(),
    };
    tracing_subscriber::registry().with(layer).init();
}

/// Whether a `--vmodule` entry enables this event or span: the first entry
/// whose pattern matches its source decides (klog: first match wins).
fn vmodule_enables(vmodule: &[VModule], meta: &Metadata<'_>) -> bool {
    vmodule
        .iter()
        .find(|v| source_matches(&v.pattern, meta.file(), meta.module_path()))
        .is_some_and(|v| *meta.level() <= level_for(v.verbosity))
}

/// klog matches a pattern against the source file name without its
/// extension (`claim` for `src/controller/claim.rs`), or, when the pattern
/// has a `/`, against the whole path without the extension; `*` and `?` glob
/// within one path segment. As a Rust extension a pattern with `::` matches
/// the module path (`csi_provisioner::kube::*`), and a plain pattern also
/// matches the last module segment (so `controller` finds
/// `src/controller/mod.rs`).
fn source_matches(pattern: &str, file: Option<&str>, module: Option<&str>) -> bool {
    if pattern.contains("::") {
        return module.is_some_and(|m| glob(pattern, m, ':'));
    }
    let path = file.map(|f| f.strip_suffix(".rs").unwrap_or(f));
    if pattern.contains('/') {
        return path.is_some_and(|p| glob(pattern, p, '/'));
    }
    let stem = path.map(|p| p.rsplit('/').next().unwrap_or(p));
    let last_module = module.map(|m| m.rsplit("::").next().unwrap_or(m));
    stem.is_some_and(|s| glob(pattern, s, '/'))
        || last_module.is_some_and(|m| glob(pattern, m, ':'))
}

/// Go's `filepath.Match` without character classes: `*` is any run of
/// characters other than `separator`, `?` one such character, anything
/// else itself; the whole of `text` must match.
fn glob(pattern: &str, text: &str, separator: char) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Classic backtracking over the last `*`; a `*` never crosses a separator,
    // so backtracking stops at one.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some('?') if t[ti] != separator => {
                pi += 1;
                ti += 1;
            }
            Some(c) if *c != '*' && *c != '?' && *c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) if t[st] != separator => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                _ => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_like_klog() {
        assert_eq!(level_for(0), Level::INFO);
        assert_eq!(level_for(4), Level::INFO);
        assert_eq!(level_for(5), Level::DEBUG);
        assert_eq!(level_for(9), Level::TRACE);
    }

    #[test]
    fn glob_is_filepath_match_without_classes() {
        for (pattern, text, want) in [
            ("claim", "claim", true),
            ("claim", "claims", false),
            ("cl*", "claim", true),
            ("*im", "claim", true),
            ("c?aim", "claim", true),
            ("c?aim", "caim", false),
            ("*", "", true),
            ("", "", true),
            ("", "x", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("src/*/claim", "src/controller/claim", true),
            ("src/*", "src/controller/claim", false),
            ("*/claim", "src/controller/claim", false),
            ("src/?/x", "src///x", false),
        ] {
            assert_eq!(glob(pattern, text, '/'), want, "{pattern:?} vs {text:?}");
        }
    }

    #[test]
    fn vmodule_patterns_match_files_paths_and_modules() {
        let claim = (
            Some("src/controller/claim.rs"),
            Some("csi_provisioner::controller::claim"),
        );
        let controller_mod = (
            Some("src/controller/mod.rs"),
            Some("csi_provisioner::controller"),
        );
        let dep = (
            Some("/root/.cargo/registry/src/x/kube-client-5.0.0/src/client/mod.rs"),
            Some("kube_client::client"),
        );
        for (pattern, (file, module), want) in [
            ("claim", claim, true),
            ("cla*", claim, true),
            ("volume", claim, false),
            ("controller", claim, false),
            ("controller", controller_mod, true),
            ("mod", controller_mod, true),
            ("src/controller/*", claim, true),
            ("src/*", claim, false),
            ("csi_provisioner::controller::*", claim, true),
            ("csi_provisioner::controller::*", controller_mod, false),
            ("csi_provisioner::*", claim, false),
            ("kube_client::*", dep, true),
            ("client", dep, true),
            ("claim", (None, None), false),
        ] {
            assert_eq!(
                source_matches(pattern, file, module),
                want,
                "{pattern:?} vs {file:?} / {module:?}"
            );
        }
    }

    #[test]
    fn vmodule_raises_the_level_of_the_first_matching_entry_only() {
        use tracing::callsite::Identifier;
        use tracing::field::FieldSet;
        use tracing::metadata::Kind;

        struct Nowhere;
        impl tracing::Callsite for Nowhere {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static NOWHERE: Nowhere = Nowhere;
        let event = |level| {
            Metadata::new(
                "event",
                "csi_provisioner::controller::claim",
                level,
                Some("src/controller/claim.rs"),
                Some(1),
                Some("csi_provisioner::controller::claim"),
                FieldSet::new(&[], Identifier(&NOWHERE)),
                Kind::EVENT,
            )
        };
        let vmodule = |list: &[(&str, u32)]| -> Vec<VModule> {
            list.iter()
                .map(|(p, v)| VModule {
                    pattern: p.to_string(),
                    verbosity: *v,
                })
                .collect()
        };
        let five = vmodule(&[("claim", 5)]);
        assert!(vmodule_enables(&five, &event(Level::DEBUG)));
        assert!(!vmodule_enables(&five, &event(Level::TRACE)));
        let seven = vmodule(&[("claim", 7)]);
        assert!(vmodule_enables(&seven, &event(Level::TRACE)));
        // klog: the first matching pattern decides, even when a later one is higher.
        let first_wins = vmodule(&[("cl*", 2), ("claim", 9)]);
        assert!(vmodule_enables(&first_wins, &event(Level::INFO)));
        assert!(!vmodule_enables(&first_wins, &event(Level::DEBUG)));
        assert!(!vmodule_enables(
            &vmodule(&[("volume", 9)]),
            &event(Level::DEBUG)
        ));
        assert!(!vmodule_enables(&[], &event(Level::INFO)));
    }
}
