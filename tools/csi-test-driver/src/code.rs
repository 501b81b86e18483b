//! gRPC status codes as they appear in the control protocol and the ledger: the canonical
//! upper-case names (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, ...), so JSON written by hand or by a
//! shell script reads like the gRPC documentation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A gRPC status code, serialized by its canonical name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GrpcCode {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl GrpcCode {
    const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The canonical name, e.g. `DEADLINE_EXCEEDED`.
    pub fn name(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GrpcCode {
    type Err = String;

    /// Accepts the canonical name in any case, with `-` or `_` (`unavailable`, `Deadline-Exceeded`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_uppercase().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|code| code.name() == wanted)
            .ok_or_else(|| format!("unknown gRPC code {s:?}"))
    }
}

impl From<tonic::Code> for GrpcCode {
    fn from(code: tonic::Code) -> Self {
        match code {
            tonic::Code::Ok => GrpcCode::Ok,
            tonic::Code::Cancelled => GrpcCode::Cancelled,
            tonic::Code::Unknown => GrpcCode::Unknown,
            tonic::Code::InvalidArgument => GrpcCode::InvalidArgument,
            tonic::Code::DeadlineExceeded => GrpcCode::DeadlineExceeded,
            tonic::Code::NotFound => GrpcCode::NotFound,
            tonic::Code::AlreadyExists => GrpcCode::AlreadyExists,
            tonic::Code::PermissionDenied => GrpcCode::PermissionDenied,
            tonic::Code::ResourceExhausted => GrpcCode::ResourceExhausted,
            tonic::Code::FailedPrecondition => GrpcCode::FailedPrecondition,
            tonic::Code::Aborted => GrpcCode::Aborted,
            tonic::Code::OutOfRange => GrpcCode::OutOfRange,
            tonic::Code::Unimplemented => GrpcCode::Unimplemented,
            tonic::Code::Internal => GrpcCode::Internal,
            tonic::Code::Unavailable => GrpcCode::Unavailable,
            tonic::Code::DataLoss => GrpcCode::DataLoss,
            tonic::Code::Unauthenticated => GrpcCode::Unauthenticated,
        }
    }
}

impl From<GrpcCode> for tonic::Code {
    fn from(code: GrpcCode) -> Self {
        match code {
            GrpcCode::Ok => tonic::Code::Ok,
            GrpcCode::Cancelled => tonic::Code::Cancelled,
            GrpcCode::Unknown => tonic::Code::Unknown,
            GrpcCode::InvalidArgument => tonic::Code::InvalidArgument,
            GrpcCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            GrpcCode::NotFound => tonic::Code::NotFound,
            GrpcCode::AlreadyExists => tonic::Code::AlreadyExists,
            GrpcCode::PermissionDenied => tonic::Code::PermissionDenied,
            GrpcCode::ResourceExhausted => tonic::Code::ResourceExhausted,
            GrpcCode::FailedPrecondition => tonic::Code::FailedPrecondition,
            GrpcCode::Aborted => tonic::Code::Aborted,
            GrpcCode::OutOfRange => tonic::Code::OutOfRange,
            GrpcCode::Unimplemented => tonic::Code::Unimplemented,
            GrpcCode::Internal => tonic::Code::Internal,
            GrpcCode::Unavailable => tonic::Code::Unavailable,
            GrpcCode::DataLoss => tonic::Code::DataLoss,
            GrpcCode::Unauthenticated => tonic::Code::Unauthenticated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        for code in GrpcCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.name()));
            assert_eq!(serde_json::from_str::<GrpcCode>(&json).unwrap(), code);
            assert_eq!(code.name().parse::<GrpcCode>().unwrap(), code);
            assert_eq!(GrpcCode::from(tonic::Code::from(code)), code);
        }
        assert_eq!(
            "deadline-exceeded".parse::<GrpcCode>().unwrap(),
            GrpcCode::DeadlineExceeded
        );
        assert!("SLOW".parse::<GrpcCode>().is_err());
    }
}
