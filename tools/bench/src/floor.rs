//! The floor: the thinnest client that does the provisioner's job on this
//! control plane. For each claim naming our driver: `CreateVolume`, then
//! create the PV with a `claimRef` (kube-controller-manager binds it). For
//! each Released PV of our driver: `DeleteVolume`, then delete the PV. No
//! events, no finalizers, no authoritative re-reads, no retries beyond
//! "try again in a second": the minimum API writes and CSI calls per volume,
//! with the same client rate limit and worker count as the sidecars.
//! Not a provisioner anyone should run: it has none of the safety the
//! sidecars pay for.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use csi_proto::v1 as pb;
use csi_proto::v1::controller_client::ControllerClient;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// The same flags the sidecars get (the ones that matter to the floor).
#[derive(Debug, clap::Args)]
pub struct FloorArgs {
    #[arg(long)]
    pub csi_address: String,
    #[arg(long)]
    pub kubeconfig: PathBuf,
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f64,
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
    #[arg(long, default_value_t = 100)]
    pub worker_threads: usize,
    /// Accepted for flag parity with the sidecars; the floor never elects.
    #[arg(long, default_value = "false")]
    pub leader_election: String,
    /// Accepted for flag parity with the sidecars; the floor serves no metrics.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,
}

/// Client-side token bucket (`qps`, `burst`), taken before every API request.
struct Bucket {
    qps: f64,
    burst: f64,
    state: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            qps: qps.max(0.001),
            burst,
            state: tokio::sync::Mutex::new((burst, tokio::time::Instant::now())),
        }
    }

    async fn take(&self) {
        let mut s = self.state.lock().await;
        loop {
            let now = tokio::time::Instant::now();
            s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
            s.1 = now;
            if s.0 >= 1.0 {
                s.0 -= 1.0;
                return;
            }
            // Holding the lock while waiting keeps the requests in order.
            tokio::time::sleep(Duration::from_secs_f64((1.0 - s.0) / self.qps)).await;
        }
    }
}

enum Job {
    Provision(Box<PersistentVolumeClaim>),
    Delete(Box<PersistentVolume>),
}

struct Floor {
    client: Client,
    csi: ControllerClient<Channel>,
    driver: String,
    bucket: Bucket,
    /// Claims (by UID) and PVs (by name) queued or done, so a replayed event does nothing.
    seen: Mutex<HashSet<String>>,
    retry: mpsc::UnboundedSender<Job>,
}

pub async fn run(args: FloorArgs) -> anyhow::Result<()> {
    let channel = csi_proto::connect(&args.csi_address)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let info = pb::identity_client::IdentityClient::new(channel.clone())
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .context("GetPluginInfo")?
        .into_inner();
    let kc = kube::config::Kubeconfig::read_from(&args.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = Client::try_from(config)?;
    let (tx, rx) = mpsc::unbounded_channel::<Job>();
    let floor = Arc::new(Floor {
        client: client.clone(),
        csi: ControllerClient::new(channel),
        driver: info.name,
        bucket: Bucket::new(args.kube_api_qps, args.kube_api_burst),
        seen: Mutex::new(HashSet::new()),
        retry: tx.clone(),
    });
    eprintln!(
        "floor: driver {}, {} workers",
        floor.driver, args.worker_threads
    );

    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    for _ in 0..args.worker_threads.max(1) {
        let (floor, rx) = (floor.clone(), rx.clone());
        tokio::spawn(async move {
            loop {
                let job = rx.lock().await.recv().await;
                match job {
                    Some(job) => floor.clone().work(job).await,
                    None => return,
                }
            }
        });
    }

    let claims = {
        let (floor, tx) = (floor.clone(), tx.clone());
        watcher(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))
                    if floor.wants(&c) && floor.first_time(c.uid().unwrap_or_default()) =>
                {
                    let _ = tx.send(Job::Provision(Box::new(c)));
                }
                Err(e) => eprintln!("floor: claim watch: {e}"),
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let volumes = {
        let floor = floor.clone();
        watcher(
            Api::<PersistentVolume>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(pv) | watcher::Event::InitApply(pv))
                    if floor.released(&pv) && floor.first_time(format!("pv/{}", pv.name_any())) =>
                {
                    let _ = tx.send(Job::Delete(Box::new(pv)));
                }
                Err(e) => eprintln!("floor: PV watch: {e}"),
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = futures::future::join(claims, volumes) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

impl Floor {
    fn first_time(&self, key: String) -> bool {
        self.seen.lock().expect("poisoned").insert(key)
    }

    fn wants(&self, c: &PersistentVolumeClaim) -> bool {
        let ann = c.annotations();
        ann.get("volume.kubernetes.io/storage-provisioner") == Some(&self.driver)
            && c.metadata.deletion_timestamp.is_none()
            && c.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or("")
                .is_empty()
    }

    fn released(&self, pv: &PersistentVolume) -> bool {
        let spec = pv.spec.as_ref();
        spec.and_then(|s| s.csi.as_ref()).map(|c| c.driver.as_str()) == Some(self.driver.as_str())
            && spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete")
            && pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    }

    async fn work(self: Arc<Self>, job: Job) {
        let result = match &job {
            Job::Provision(c) => self.provision(c).await,
            Job::Delete(pv) => self.delete(pv).await,
        };
        if let Err(e) = result {
            eprintln!("floor: {e:#}; retrying in 1s");
            let retry = self.retry.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let _ = retry.send(job);
            });
        }
    }

    async fn provision(&self, claim: &PersistentVolumeClaim) -> anyhow::Result<()> {
        let uid = claim.uid().unwrap_or_default();
        let spec = claim.spec.clone().unwrap_or_default();
        let request = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned()
            .unwrap_or_else(|| Quantity("1Gi".into()));
        let bytes = quantity_bytes(&request.0).context("claim size")?;
        let name = format!("pvc-{uid}");
        let volume = self
            .csi
            .clone()
            .create_volume(pb::CreateVolumeRequest {
                name: name.clone(),
                capacity_range: Some(pb::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![pb::VolumeCapability {
                    access_type: Some(pb::volume_capability::AccessType::Mount(Default::default())),
                    access_mode: Some(pb::volume_capability::AccessMode {
                        mode: pb::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                    }),
                }],
                ..Default::default()
            })
            .await
            .context("CreateVolume")?
            .into_inner()
            .volume
            .unwrap_or_default();
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some(BTreeMap::from([(
                    "pv.kubernetes.io/provisioned-by".to_string(),
                    self.driver.clone(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: spec.access_modes.clone(),
                capacity: Some(BTreeMap::from([("storage".to_string(), request)])),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: claim.namespace(),
                    name: Some(claim.name_any()),
                    uid: Some(uid),
                    ..Default::default()
                }),
                csi: Some(CSIPersistentVolumeSource {
                    driver: self.driver.clone(),
                    volume_handle: volume.volume_id,
                    volume_attributes: Some(volume.volume_context.into_iter().collect()),
                    ..Default::default()
                }),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                storage_class_name: spec.storage_class_name.clone(),
                volume_mode: spec.volume_mode.clone(),
                ..Default::default()
            }),
            status: None,
        };
        self.bucket.take().await;
        match Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &pv)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e).context("creating the PV"),
        }
    }

    async fn delete(&self, pv: &PersistentVolume) -> anyhow::Result<()> {
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        self.csi
            .clone()
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: handle,
                secrets: Default::default(),
            })
            .await
            .context("DeleteVolume")?;
        self.bucket.take().await;
        match Api::<PersistentVolume>::all(self.client.clone())
            .delete(&pv.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e).context("deleting the PV"),
        }
    }
}

/// Bytes of a storage quantity with a binary or decimal suffix (`1Gi`, `500M`, `1024`).
pub fn quantity_bytes(q: &str) -> Option<i64> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: i64 = num.parse().ok()?;
    let mult: i64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1024"), Some(1024));
        assert_eq!(quantity_bytes("1.5Gi"), None);
        assert_eq!(quantity_bytes("x"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_paces_after_the_burst() {
        let b = Bucket::new(10.0, 2);
        let t0 = tokio::time::Instant::now();
        for _ in 0..4 {
            b.take().await;
        }
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(199) && waited < Duration::from_millis(250),
            "{waited:?}"
        );
    }
}
