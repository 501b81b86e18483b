//! Logging (component-base's flags: `-v`, `--vmodule`, `--logging-format`,
//! `--log-*`): the verbosity, the format and the alpha split stream, with
//! the feature gates that allow them.

use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use super::cli::heading;
use super::values::{VModule, VModuleList, parse_byte_quantity, parse_vmodule};
use super::{ConfigError, FeatureGates};
use crate::duration::parse_go_duration;

/// Logging (component-base's logging flags).
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::LOGGING)]
pub struct LoggingArgs {
    /// Log verbosity: up to 4, what the sidecar does and why it fails; 5 adds
    /// every call to the driver with its request and response; 8 adds the logs
    /// of the libraries underneath.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub v: u8,

    /// Verbosity per source file, PATTERN=N,...: a pattern is a file name without
    /// .rs (claim), a path if it has a /, a module path if it has :: (text format
    /// only; repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_vmodule,
          value_name = "PATTERN=N,...")]
    pub vmodule: Vec<VModuleList>,

    /// Log format.
    #[arg(long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub logging_format: LogFormat,

    /// Accepted and checked; lines are written as they are logged, so there is
    /// nothing to flush.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub log_flush_frequency: Duration,

    /// [Alpha] Text format: errors to stderr, the rest to stdout (needs
    /// --feature-gates=LoggingAlphaOptions=true).
    #[arg(long)]
    pub log_text_split_stream: bool,

    /// [Alpha] Text format with split streams: buffer size of stdout (512, 1k, 2Ki,
    /// 5Mi); accepted and checked, lines are not buffered.
    #[arg(long, default_value = "0", value_parser = parse_byte_quantity,
          value_name = "SIZE")]
    pub log_text_info_buffer_size: u64,

    /// [Alpha] JSON format: errors to stderr, the rest to stdout (needs
    /// --feature-gates=LoggingAlphaOptions=true).
    #[arg(long)]
    pub log_json_split_stream: bool,

    /// [Alpha] JSON format with split streams: buffer size of stdout (512, 1k, 2Ki,
    /// 5Mi); accepted and checked, lines are not buffered.
    #[arg(long, default_value = "0", value_parser = parse_byte_quantity,
          value_name = "SIZE")]
    pub log_json_info_buffer_size: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggingConfig {
    pub verbosity: u8,
    pub vmodule: Vec<VModule>,
    pub format: LogFormat,
    pub flush_frequency: Duration,
    /// Errors to stderr, everything else to stdout (of the selected format).
    pub split_stream: bool,
    /// Bytes of info output buffered when the stream is split; 0: none.
    pub info_buffer_size: u64,
}

/// Upstream: component-base `logsapi.Validate`. Unlike upstream, whose
/// logging validation sees a private gate set that `--feature-gates` never
/// reaches (so the alpha options can never be turned on there), the alpha
/// options here are enabled by `--feature-gates=LoggingAlphaOptions=true`,
/// as their help text says.
pub(super) fn validate(
    args: &LoggingArgs,
    gates: &FeatureGates,
) -> Result<LoggingConfig, ConfigError> {
    let LoggingArgs {
        v,
        vmodule,
        logging_format,
        log_flush_frequency,
        log_text_split_stream,
        log_text_info_buffer_size,
        log_json_split_stream,
        log_json_info_buffer_size,
    } = args;
    if log_flush_frequency.is_zero() {
        return Err(ConfigError::LogFlushFrequency);
    }
    if *logging_format == LogFormat::Json && !gates.logging_beta_options {
        return Err(ConfigError::JsonDisabled);
    }
    let vmodule: Vec<VModule> = vmodule.iter().flat_map(|l| l.0.clone()).collect();
    if !vmodule.is_empty() && *logging_format != LogFormat::Text {
        return Err(ConfigError::VModuleNeedsText);
    }
    if !gates.logging_alpha_options {
        let alpha = [
            ("--log-text-split-stream", *log_text_split_stream),
            (
                "--log-text-info-buffer-size",
                *log_text_info_buffer_size != 0,
            ),
            ("--log-json-split-stream", *log_json_split_stream),
            (
                "--log-json-info-buffer-size",
                *log_json_info_buffer_size != 0,
            ),
        ];
        if let Some((flag, _)) = alpha.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::NeedsLoggingAlphaOptions(flag));
        }
    }
    let (split_stream, info_buffer_size) = match logging_format {
        LogFormat::Text => (*log_text_split_stream, *log_text_info_buffer_size),
        LogFormat::Json => (*log_json_split_stream, *log_json_info_buffer_size),
    };
    Ok(LoggingConfig {
        verbosity: *v,
        vmodule,
        format: *logging_format,
        flush_frequency: *log_flush_frequency,
        split_stream,
        info_buffer_size,
    })
}
