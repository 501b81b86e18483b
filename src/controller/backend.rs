//! The one home of deleting a backend volume, for every path that does: the
//! volume path (a Released PV of ours), the cleanup of a claim deleted
//! mid-flight, and a volume the driver made smaller than asked. Each goes
//! through the same three rules: only the leader calls the driver (checked
//! right before the call), the provisioner secret is sent if it can be read
//! and the deletion goes on without it if not (upstream), and `NotFound` is
//! what we wanted.

use std::collections::HashMap;

use tonic::Status;
use tracing::warn;

use super::Shared;
use crate::provision::SecretRef;

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("not the leader: not acting")]
    NotLeader,
    #[error("rpc error: code = {} desc = {}", crate::csi::code_name(.0.code()), .0.message())]
    DeleteVolume(Status),
}

/// `DeleteVolume` of `handle`, with the data of `secret` when it can be read.
/// `migrated`: the volume is an in-tree PV's, translated (labelled so in the
/// driver-call metrics, as upstream).
pub async fn delete_volume(
    shared: &Shared,
    handle: &str,
    secret: Option<&SecretRef>,
    migrated: bool,
) -> Result<(), DeleteError> {
    let secrets = secret_data_or_none(shared, secret).await;
    if !shared.leader.is_leader() {
        return Err(DeleteError::NotLeader);
    }
    shared
        .csi
        .for_migrated(migrated)
        .delete_volume(handle, secrets)
        .await
        .map_err(DeleteError::DeleteVolume)
}

/// The data of `secret`, or none if there is none or it cannot be read (said
/// in the log; whatever goes on without it is best effort).
pub async fn secret_data_or_none(
    shared: &Shared,
    secret: Option<&SecretRef>,
) -> HashMap<String, String> {
    let Some(r) = secret else {
        return HashMap::new();
    };
    shared.secret_data(r).await.unwrap_or_else(|e| {
        let secret = format!("{}/{}", r.namespace, r.name);
        warn!(%secret, error = %e, "going on without the provisioner secret");
        HashMap::new()
    })
}
