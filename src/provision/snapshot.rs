//! Restoring a VolumeSnapshot: may this claim be restored from it, and what
//! does `CreateVolume` get as its content source? Pure: the snapshot and its
//! content are read by the caller (live, as upstream does). upstream:
//! pkg/controller/controller.go getSnapshotSource.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::{ClaimView, quantity};
use crate::csi::pb;
use crate::keys;
use crate::kube::snapshot::{VolumeSnapshot, VolumeSnapshotContent};

/// The snapshot a claim is restored from, as named by its data source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSource {
    pub namespace: String,
    pub name: String,
}

/// Why a snapshot cannot be restored now, in upstream's words (the caller
/// prefixes "error getting handle for DataSource Type VolumeSnapshot by Name").
pub fn content_source(
    claim: &PersistentVolumeClaim,
    provisioner: &str,
    snapshot: &VolumeSnapshot,
    content: Option<&VolumeSnapshotContent>,
    prevent_volume_mode_conversion: bool,
) -> Result<pb::VolumeContentSource, String> {
    let name = snapshot.metadata.name.as_deref().unwrap_or_default();
    let not_bound = || format!("snapshot {name} not bound");
    if snapshot.metadata.deletion_timestamp.is_some()
        && !crate::kube::has_finalizer(snapshot, keys::FINALIZER_SNAPSHOT_SOURCE)
    {
        return Err(format!("snapshot {name} is being deleted"));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    if status.bound_volume_snapshot_content_name.is_none() {
        return Err(not_bound());
    }
    // A content that cannot be read, is bound to another snapshot or belongs
    // to another driver: all "not bound", as upstream says.
    let content = content.ok_or_else(not_bound)?;
    let bound_to = &content.spec.volume_snapshot_ref;
    if Some(bound_to.uid.as_str()) != snapshot.metadata.uid.as_deref()
        || Some(bound_to.namespace.as_str()) != snapshot.metadata.namespace.as_deref()
        || bound_to.name != name
        || content.spec.driver != provisioner
    {
        return Err(not_bound());
    }
    if status.ready_to_use != Some(true) {
        return Err(format!("snapshot {name} is not Ready"));
    }
    let handle = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .ok_or_else(|| format!("snapshot handle {name} is not available"))?;
    let view = ClaimView(claim);
    if status.restore_size.is_some() && view.requested_storage().is_none() {
        return Err(format!(
            "error getting capacity for PVC {} when creating snapshot {name}",
            view.name()
        ));
    }
    if let Some((want, have)) = smaller_than_snapshot(claim, snapshot) {
        return Err(format!(
            "requested volume size {want} is less than the size {have} for the source snapshot {name}"
        ));
    }
    if prevent_volume_mode_conversion {
        let claim_mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
        if let (Some(source), Some(wanted)) =
            (content.spec.source_volume_mode.as_deref(), claim_mode)
            && source != wanted
        {
            mode_change_allowed(view, content)?;
        }
    }
    Ok(from_handle(handle))
}

/// The claim's requested size and the snapshot's `restoreSize` when the claim asks for less:
/// a refusal no retry can lift (an unbound claim's spec cannot change, nor a ready snapshot's
/// size), so no `CreateVolume` restoring this claim from this snapshot was ever sent or ever will
/// be (every create makes this check first).
pub fn smaller_than_snapshot(
    claim: &PersistentVolumeClaim,
    snapshot: &VolumeSnapshot,
) -> Option<(i64, i64)> {
    let restore = snapshot.status.as_ref()?.restore_size.as_ref()?;
    let requested = ClaimView(claim).requested_storage()?;
    // Malformed sizes are refused by the API server; 0 as Go's zero value.
    let want = quantity::parse_bytes(requested).unwrap_or_default();
    let have = quantity::parse_bytes(&restore.0).unwrap_or_default();
    (want < have).then_some((want, have))
}

/// The content source that restores the backend snapshot `handle`.
pub fn from_handle(handle: String) -> pb::VolumeContentSource {
    pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Snapshot(
            pb::volume_content_source::SnapshotSource {
                snapshot_id: handle,
            },
        )),
    }
}

/// A restore into another volume mode needs the content's consent.
fn mode_change_allowed(claim: ClaimView, content: &VolumeSnapshotContent) -> Result<(), String> {
    let refused = format!(
        "requested volume {}/{} modifies the mode of the source volume but does not have permission to do so. ",
        claim.namespace(),
        claim.name()
    );
    let key = keys::ANN_ALLOW_VOLUME_MODE_CHANGE;
    let content_name = content.metadata.name.as_deref().unwrap_or_default();
    let Some(value) = content
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
    else {
        return Err(format!(
            "{refused}{key} annotation is not present on snapshotcontent {content_name}"
        ));
    };
    match parse_go_bool(value) {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "{refused}{key} is set to false on snapshotcontent {content_name}"
        )),
        None => Err(format!(
            "{refused}failed to convert {key} annotation value to boolean with error: strconv.ParseBool: parsing {value:?}: invalid syntax"
        )),
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::snapshot::{
        SnapshotRef, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const DRIVER: &str = "test.csi.example.com";

    fn snapshot() -> VolumeSnapshot {
        VolumeSnapshot {
            metadata: ObjectMeta {
                name: Some("snap".into()),
                namespace: Some("team-a".into()),
                uid: Some("s-uid".into()),
                ..Default::default()
            },
            status: Some(VolumeSnapshotStatus {
                bound_volume_snapshot_content_name: Some("content".into()),
                ready_to_use: Some(true),
                restore_size: Some(Quantity("1Gi".into())),
            }),
            ..Default::default()
        }
    }

    fn content() -> VolumeSnapshotContent {
        VolumeSnapshotContent {
            metadata: ObjectMeta {
                name: Some("content".into()),
                ..Default::default()
            },
            spec: VolumeSnapshotContentSpec {
                driver: DRIVER.into(),
                volume_snapshot_ref: SnapshotRef {
                    name: "snap".into(),
                    namespace: "team-a".into(),
                    uid: "s-uid".into(),
                },
                source_volume_mode: Some("Filesystem".into()),
            },
            status: Some(VolumeSnapshotContentStatus {
                snapshot_handle: Some("snap-000001".into()),
            }),
        }
    }

    fn check(s: &VolumeSnapshot, c: Option<&VolumeSnapshotContent>) -> Result<String, String> {
        check_claim(&super::super::fixtures::claim(), s, c)
    }

    fn check_claim(
        claim: &PersistentVolumeClaim,
        s: &VolumeSnapshot,
        c: Option<&VolumeSnapshotContent>,
    ) -> Result<String, String> {
        content_source(claim, DRIVER, s, c, true).map(|source| match source.r#type {
            Some(pb::volume_content_source::Type::Snapshot(s)) => s.snapshot_id,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn a_ready_bound_snapshot_of_our_driver_gives_its_handle() {
        assert_eq!(
            check(&snapshot(), Some(&content())),
            Ok("snap-000001".into())
        );
    }

    #[test]
    fn every_reason_to_refuse_in_upstreams_words() {
        let deleting = {
            let mut s = snapshot();
            s.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            s
        };
        let deleting_protected = {
            let mut s = deleting.clone();
            s.metadata.finalizers = Some(vec![keys::FINALIZER_SNAPSHOT_SOURCE.into()]);
            s
        };
        let unbound = {
            let mut s = snapshot();
            s.status
                .as_mut()
                .unwrap()
                .bound_volume_snapshot_content_name = None;
            s
        };
        let not_ready = {
            let mut s = snapshot();
            s.status.as_mut().unwrap().ready_to_use = Some(false);
            s
        };
        let bigger = {
            let mut s = snapshot();
            s.status.as_mut().unwrap().restore_size = Some(Quantity("2Gi".into()));
            s
        };
        let other_snapshot = {
            let mut c = content();
            c.spec.volume_snapshot_ref.uid = "another".into();
            c
        };
        let other_driver = {
            let mut c = content();
            c.spec.driver = "other.csi".into();
            c
        };
        let no_handle = {
            let mut c = content();
            c.status = None;
            c
        };
        let rows: Vec<(
            VolumeSnapshot,
            Option<VolumeSnapshotContent>,
            Result<&str, &str>,
        )> = vec![
            (
                deleting,
                Some(content()),
                Err("snapshot snap is being deleted"),
            ),
            (deleting_protected, Some(content()), Ok("snap-000001")),
            (unbound, Some(content()), Err("snapshot snap not bound")),
            (snapshot(), None, Err("snapshot snap not bound")),
            (
                snapshot(),
                Some(other_snapshot),
                Err("snapshot snap not bound"),
            ),
            (
                snapshot(),
                Some(other_driver),
                Err("snapshot snap not bound"),
            ),
            (
                not_ready,
                Some(content()),
                Err("snapshot snap is not Ready"),
            ),
            (
                snapshot(),
                Some(no_handle),
                Err("snapshot handle snap is not available"),
            ),
            (
                bigger,
                Some(content()),
                Err(
                    "requested volume size 1073741824 is less than the size 2147483648 for the source snapshot snap",
                ),
            ),
        ];
        for (s, c, want) in rows {
            let got = check(&s, c.as_ref());
            assert_eq!(got.as_deref().map_err(String::as_str), want, "{s:?} {c:?}");
        }
    }

    #[test]
    fn a_mode_change_needs_the_contents_consent() {
        let mut block = super::super::fixtures::claim();
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let with = |value: Option<&str>| {
            let mut c = content();
            c.metadata.annotations = value.map(|v| {
                [(
                    keys::ANN_ALLOW_VOLUME_MODE_CHANGE.to_string(),
                    v.to_string(),
                )]
                .into()
            });
            c
        };
        let refused = "requested volume team-a/data modifies the mode of the source volume but does not have permission to do so. ";
        assert_eq!(
            check_claim(&block, &snapshot(), Some(&with(None))),
            Err(format!(
                "{refused}snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content"
            ))
        );
        assert_eq!(
            check_claim(&block, &snapshot(), Some(&with(Some("false")))),
            Err(format!(
                "{refused}snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content"
            ))
        );
        assert!(
            check_claim(&block, &snapshot(), Some(&with(Some("yes"))))
                .unwrap_err()
                .contains("failed to convert")
        );
        assert!(check_claim(&block, &snapshot(), Some(&with(Some("true")))).is_ok());
        // Without --prevent-volume-mode-conversion nothing is asked.
        assert!(content_source(&block, DRIVER, &snapshot(), Some(&with(None)), false).is_ok());
    }
}
