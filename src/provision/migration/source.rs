//! A PV's volume as either shape of PV says it (the cache's slim `Pv`, k8s-openapi's
//! `PersistentVolume`), and the CSI driver and handle of that volume: the CSI source's,
//! or a migrated in-tree source's translated by its plugin.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::kube::slim::{Kept, Pv};

/// What a PV says about its volume, borrowed.
#[derive(Clone, Debug, PartialEq)]
pub struct PvSource<'a> {
    pub name: &'a str,
    pub source: Option<Source<'a>>,
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The annotations a cached (trimmed) PV keeps out of its map.
    pub kept: &'a [(&'static str, String)],
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// The namespace of its claimRef.
    pub claim_namespace: Option<&'a str>,
}

/// A PV's volume source, of the kinds whose volumes a CSI driver serves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source<'a> {
    Csi {
        driver: &'a str,
        handle: &'a str,
    },
    AwsEbs {
        volume_id: &'a str,
    },
    GcePd {
        pd_name: &'a str,
    },
    AzureDisk {
        disk_uri: &'a str,
    },
    AzureFile {
        share_name: &'a str,
        secret_name: &'a str,
        secret_namespace: Option<&'a str>,
    },
    Cinder {
        volume_id: &'a str,
    },
    Portworx {
        volume_id: &'a str,
    },
    Vsphere {
        volume_path: &'a str,
    },
    Rbd {
        monitors: &'a [String],
        pool: Option<&'a str>,
        image: &'a str,
    },
}

impl<'a> PvSource<'a> {
    pub fn annotation(&self, key: &str) -> Option<&'a str> {
        Kept::find(self.kept, key).or_else(|| self.annotations?.get(key).map(String::as_str))
    }

    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.labels?.get(key).map(String::as_str)
    }
}

/// The CSI driver and the volume handle of a PV: its CSI source's, or its
/// in-tree source's as the plugin migrated to the driver translates it.
/// `None`: the PV has neither.
pub fn volume_of<'a>(pv: impl Into<PvSource<'a>>) -> Option<(&'a str, Result<String, String>)> {
    let pv = pv.into();
    if let Some(Source::Csi { driver, handle }) = pv.source {
        return Some((driver, Ok(handle.to_string())));
    }
    super::PLUGINS
        .into_iter()
        .find_map(|plugin| (plugin.volume_handle)(&pv).map(|handle| (plugin.driver, handle)))
}

/// The volume handle of a PV, for `DeleteVolume` (see [`volume_of`]).
pub fn volume_handle<'a>(pv: impl Into<PvSource<'a>>) -> Option<Result<String, String>> {
    volume_of(pv).map(|(_, handle)| handle)
}

/// `PvSource` from a shape of PV: both name their fields as the API does. One
/// source per PV (the API allows no more); they are tried in the order the
/// volume path read them before this module read them for it.
macro_rules! from_pv {
    ($pv:ty, $kept:expr) => {
        impl<'a> From<&'a $pv> for PvSource<'a> {
            fn from(pv: &'a $pv) -> Self {
                let spec = pv.spec.as_ref();
                let source = spec.and_then(|s| {
                    (s.csi.as_ref().map(|c| Source::Csi {
                        driver: &c.driver,
                        handle: &c.volume_handle,
                    }))
                    .or_else(|| {
                        s.rbd.as_ref().map(|r| Source::Rbd {
                            monitors: &r.monitors,
                            pool: r.pool.as_deref(),
                            image: &r.image,
                        })
                    })
                    .or_else(|| {
                        s.azure_file.as_ref().map(|f| Source::AzureFile {
                            share_name: &f.share_name,
                            secret_name: &f.secret_name,
                            secret_namespace: f.secret_namespace.as_deref(),
                        })
                    })
                    .or_else(|| {
                        (s.aws_elastic_block_store.as_ref()).map(|a| Source::AwsEbs {
                            volume_id: &a.volume_id,
                        })
                    })
                    .or_else(|| {
                        (s.cinder.as_ref()).map(|c| Source::Cinder {
                            volume_id: &c.volume_id,
                        })
                    })
                    .or_else(|| {
                        (s.portworx_volume.as_ref()).map(|p| Source::Portworx {
                            volume_id: &p.volume_id,
                        })
                    })
                    .or_else(|| {
                        (s.azure_disk.as_ref()).map(|a| Source::AzureDisk {
                            disk_uri: &a.disk_uri,
                        })
                    })
                    .or_else(|| {
                        (s.vsphere_volume.as_ref()).map(|v| Source::Vsphere {
                            volume_path: &v.volume_path,
                        })
                    })
                    .or_else(|| {
                        (s.gce_persistent_disk.as_ref()).map(|g| Source::GcePd {
                            pd_name: &g.pd_name,
                        })
                    })
                });
                PvSource {
                    name: pv.metadata.name.as_deref().unwrap_or_default(),
                    source,
                    annotations: pv.metadata.annotations.as_ref(),
                    kept: $kept(pv),
                    labels: pv.metadata.labels.as_ref(),
                    claim_namespace: spec
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|c| c.namespace.as_deref()),
                }
            }
        }
    };
}

from_pv!(Pv, |pv: &'a Pv| pv.kept.entries());
from_pv!(PersistentVolume, |_| &[]);
