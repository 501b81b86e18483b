//! Logging set-up: klog-style verbosity (`-v`) mapped onto tracing levels and
//! `--logging-format=text|json`. CSI requests and responses are logged at
//! debug level, which `-v=5` enables, as upstream logs gRPC calls at V(5).

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// The tracing level for a klog verbosity.
pub fn level_for(verbosity: u8) -> &'static str {
    match verbosity {
        0..=4 => "info",
        5..=6 => "debug",
        _ => "trace",
    }
}

pub fn init(verbosity: u8, format: Format) {
    // Our crate follows -v; dependencies stay quieter unless -v is very high.
    let deps = if verbosity >= 8 { "debug" } else { "warn" };
    let filter = EnvFilter::new(format!("{deps},csi_provisioner={}", level_for(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        Format::Text => builder.init(),
        Format::Json => builder.json().flatten_event(true).init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_like_klog() {
        assert_eq!(level_for(0), "info");
        assert_eq!(level_for(4), "info");
        assert_eq!(level_for(5), "debug");
        assert_eq!(level_for(9), "trace");
    }
}
