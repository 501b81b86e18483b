//! Cloning a claim: may this claim be made from that one, and what does
//! `CreateVolume` get as its content source? Pure: the source claim and its
//! PV are read by the caller (live). upstream: pkg/controller/controller.go
//! getPVCSource.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};

use super::{ClaimView, quantity};
use crate::csi::pb;
use crate::names::{ClaimPhase, PvPhase, VolumeMode};

/// The claim a claim is cloned from (same namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneSource {
    pub namespace: String,
    pub name: String,
}

/// Why `source` cannot be cloned into `claim` now, in upstream's words (the
/// caller prefixes "error getting handle for DataSource Type
/// PersistentVolumeClaim by Name"); else what `CreateVolume` clones.
pub fn content_source(
    claim: &PersistentVolumeClaim,
    provisioner: &str,
    source: &PersistentVolumeClaim,
    source_pv: Option<&PersistentVolume>,
) -> Result<pb::VolumeContentSource, String> {
    source_claim_fits(claim, source)?;
    let (spec, csi) = source_volume(provisioner, source, source_pv)?;
    let mode = |m: Option<&str>| match m.and_then(VolumeMode::parse) {
        Some(VolumeMode::Block) => VolumeMode::Block,
        _ => VolumeMode::Filesystem,
    };
    let wanted = mode(claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()));
    let have = mode(spec.volume_mode.as_deref());
    if wanted != have {
        return Err(format!(
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {have}, but new PVC requested {wanted}"
        ));
    }
    Ok(from_volume(csi.volume_handle.clone()))
}

/// The source claim as such: bound, not being deleted, both claims of a
/// class, the new one no smaller, a volume named.
fn source_claim_fits(
    claim: &PersistentVolumeClaim,
    source: &PersistentVolumeClaim,
) -> Result<(), String> {
    let view = ClaimView(claim);
    let src = ClaimView(source);
    let phase = source
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default();
    if ClaimPhase::parse(phase) != Some(ClaimPhase::Bound) {
        return Err(format!(
            "the PVC DataSource {} must have a status of Bound.  Got {{{phase}}}",
            src.name()
        ));
    }
    if src.is_deleting() {
        return Err(format!(
            "the PVC DataSource {} is currently being deleted",
            src.name()
        ));
    }
    let class_of =
        |c: &PersistentVolumeClaim| c.spec.as_ref().and_then(|s| s.storage_class_name.clone());
    if class_of(source).is_none() {
        return Err(format!(
            "the source PVC ({}) storageclass cannot be empty",
            src.name()
        ));
    }
    if class_of(claim).is_none() {
        return Err(format!(
            "the requested PVC ({}) storageclass cannot be empty",
            view.name()
        ));
    }
    let size = |c: ClaimView| {
        c.requested_storage()
            .and_then(quantity::parse_bytes)
            .unwrap_or_default()
    };
    let (requested, source_size) = (size(view), size(src));
    if requested < source_size {
        return Err(format!(
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_size}"
        ));
    }
    let volume_name = source
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default();
    if volume_name.is_empty() {
        return Err(format!("volume name is empty in source PVC {}", src.name()));
    }
    Ok(())
}

/// The source claim's PV (its spec and CSI source), if it is a volume of our
/// driver bound to exactly that claim.
fn source_volume<'a>(
    provisioner: &str,
    source: &PersistentVolumeClaim,
    source_pv: Option<&'a PersistentVolume>,
) -> Result<(&'a PersistentVolumeSpec, &'a CSIPersistentVolumeSource), String> {
    let src = ClaimView(source);
    let pv = source_pv.ok_or_else(invalid)?;
    let spec = pv.spec.as_ref().ok_or_else(invalid)?;
    let csi = spec.csi.as_ref().ok_or_else(invalid)?;
    let claim_ref = spec.claim_ref.as_ref().ok_or_else(invalid)?;
    let pv_phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if csi.driver != provisioner
        || claim_ref.uid.as_deref() != Some(src.uid())
        || claim_ref.namespace.as_deref() != Some(src.namespace())
        || claim_ref.name.as_deref() != Some(src.name())
        || pv_phase.and_then(PvPhase::parse) != Some(PvPhase::Bound)
    {
        return Err(invalid());
    }
    Ok((spec, csi))
}

fn invalid() -> String {
    "claim in dataSource not bound or invalid".to_string()
}

/// The content source that clones the backend volume `handle`.
pub fn from_volume(handle: String) -> pb::VolumeContentSource {
    pb::VolumeContentSource {
        r#type: Some(pb::volume_content_source::Type::Volume(
            pb::volume_content_source::VolumeSource { volume_id: handle },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeClaimStatus, PersistentVolumeStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const DRIVER: &str = "test.csi.example.com";

    fn source() -> PersistentVolumeClaim {
        let mut c = super::super::fixtures::claim();
        c.metadata.name = Some("src".into());
        c.metadata.uid = Some("src-uid".into());
        c.spec.as_mut().unwrap().volume_name = Some("pv-src".into());
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        c
    }

    fn pv() -> PersistentVolume {
        PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: "vol-1".into(),
                    ..Default::default()
                }),
                claim_ref: Some(ObjectReference {
                    name: Some("src".into()),
                    namespace: Some("team-a".into()),
                    uid: Some("src-uid".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Bound".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn check(
        claim: &PersistentVolumeClaim,
        s: &PersistentVolumeClaim,
        p: Option<&PersistentVolume>,
    ) -> Result<String, String> {
        content_source(claim, DRIVER, s, p).map(|c| match c.r#type {
            Some(pb::volume_content_source::Type::Volume(v)) => v.volume_id,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn a_bound_source_of_our_driver_gives_its_volume() {
        let claim = super::super::fixtures::claim();
        assert_eq!(check(&claim, &source(), Some(&pv())), Ok("vol-1".into()));
    }

    #[test]
    fn every_reason_to_refuse_in_upstreams_words() {
        let claim = super::super::fixtures::claim();
        let edit_source = |f: &dyn Fn(&mut PersistentVolumeClaim)| {
            let mut s = source();
            f(&mut s);
            s
        };
        let edit_pv = |f: &dyn Fn(&mut PersistentVolume)| {
            let mut p = pv();
            f(&mut p);
            p
        };
        let pending = edit_source(&|s| s.status.as_mut().unwrap().phase = Some("Pending".into()));
        let deleting = edit_source(&|s| {
            s.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()))
        });
        let no_class = edit_source(&|s| s.spec.as_mut().unwrap().storage_class_name = None);
        let bigger = edit_source(&|s| {
            s.spec
                .as_mut()
                .unwrap()
                .resources
                .as_mut()
                .unwrap()
                .requests = Some(
                [(
                    "storage".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("4Gi".into()),
                )]
                .into(),
            )
        });
        let no_volume = edit_source(&|s| s.spec.as_mut().unwrap().volume_name = None);
        let other_driver =
            edit_pv(&|p| p.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "x".into());
        let other_claim = edit_pv(&|p| {
            p.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("other".into())
        });
        let released = edit_pv(&|p| p.status.as_mut().unwrap().phase = Some("Released".into()));
        let block = edit_pv(&|p| p.spec.as_mut().unwrap().volume_mode = Some("Block".into()));
        let requested = super::super::fixtures::claim();
        let want_size = crate::provision::ClaimView(&requested)
            .requested_storage()
            .and_then(quantity::parse_bytes)
            .unwrap();
        let invalid = "claim in dataSource not bound or invalid";
        let rows: Vec<(PersistentVolumeClaim, Option<PersistentVolume>, String)> = vec![
            (pending, Some(pv()), "the PVC DataSource src must have a status of Bound.  Got {Pending}".into()),
            (deleting, Some(pv()), "the PVC DataSource src is currently being deleted".into()),
            (no_class, Some(pv()), "the source PVC (src) storageclass cannot be empty".into()),
            (
                bigger,
                Some(pv()),
                format!("error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {want_size} but source is 4294967296"),
            ),
            (no_volume, Some(pv()), "volume name is empty in source PVC src".into()),
            (source(), None, invalid.into()),
            (source(), Some(other_driver), invalid.into()),
            (source(), Some(other_claim), invalid.into()),
            (source(), Some(released), invalid.into()),
            (
                source(),
                Some(block),
                "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem".into(),
            ),
        ];
        for (s, p, want) in rows {
            assert_eq!(check(&claim, &s, p.as_ref()), Err(want));
        }
    }
}
