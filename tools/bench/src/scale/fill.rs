//! Fills the scale profile's cluster, size after size: one test driver for the whole
//! profile (its volumes are the pairs' volumes, so `audit` finds them all), the classes and
//! namespaces of `layout`, and the bound pairs, each made as provisioning makes it —
//! `CreateVolume`, the claim naming its PV, the PV, then what the binder writes — many at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use csi_proto::v1 as pb;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::layout::{self, Class};
use crate::driver::Driver;
use crate::runner::{Ctx, create_or_exists};

/// Pairs made at once (each its own sequence of one CSI call and five API requests).
const FILL_CONCURRENCY: usize = 128;
/// Attempts per request of the fill before it gives up.
const TRIES: u32 = 5;

/// The profile's cluster as filled so far.
pub struct Bed {
    pub driver: Arc<Driver>,
    pub driver_name: String,
    /// Bound pairs in the cluster now.
    pub pairs: usize,
    csi: pb::controller_client::ControllerClient<Channel>,
}

/// What growing the cluster to one size took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fill {
    /// Pairs created for this size (those of the smaller sizes were there already).
    pub added: usize,
    /// Wall clock from the first pair created to every claim seen `Bound`.
    pub secs: f64,
}

impl Fill {
    pub fn pairs_per_sec(&self) -> Option<f64> {
        (self.added > 0 && self.secs > 0.0).then(|| self.added as f64 / self.secs)
    }
}

/// Starts the profile's driver and creates the classes and namespaces.
pub async fn start(ctx: &Ctx) -> anyhow::Result<Bed> {
    let driver_name = format!("scale-{}.bench.csi", ctx.run_id);
    let dir = ctx.work_dir.join("scale-driver");
    let _ = std::fs::remove_dir_all(&dir);
    let driver = crate::driver::start(&ctx.bins.driver, &dir, &driver_name).await?;
    let channel = csi_proto::connect(&driver.endpoint.display().to_string())
        .await
        .map_err(|e| anyhow::anyhow!("connecting to the test driver: {e:?}"))?;
    let client = &ctx.cluster.admin;
    for class in Class::ALL {
        create_or_exists(
            &Api::<StorageClass>::all(client.clone()),
            serde_json::from_value(class.object(&driver_name))?,
        )
        .await?;
    }
    for k in 0..layout::NAMESPACES {
        create_or_exists(
            &Api::<Namespace>::all(client.clone()),
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": layout::namespace(k)},
            }))?,
        )
        .await?;
    }
    Ok(Bed {
        driver: Arc::new(driver),
        driver_name,
        pairs: 0,
        csi: pb::controller_client::ControllerClient::new(channel),
    })
}

/// Grows the cluster to `to` bound pairs (and their pending claims); returns once every
/// claim of a pair is seen `Bound`.
pub async fn grow(ctx: &Ctx, bed: &mut Bed, to: usize) -> anyhow::Result<Fill> {
    let from = bed.pairs;
    if to <= from {
        return Ok(Fill::default());
    }
    ctx.say(&format!("scale: creating pairs {from}..{to}"));
    let t0 = Instant::now();
    let client = ctx.cluster.admin.clone();
    let mut made = futures::stream::iter(from..to)
        .map(|i| {
            let (client, csi, driver) = (client.clone(), bed.csi.clone(), bed.driver_name.clone());
            async move { make_pair(&client, csi, &driver, i).await }
        })
        .buffer_unordered(FILL_CONCURRENCY);
    let mut done = 0usize;
    let mut last_print = Instant::now();
    while let Some(outcome) = made.next().await {
        outcome?;
        done += 1;
        if last_print.elapsed() >= Duration::from_secs(5) {
            ctx.say(&format!(
                "scale: {done}/{} pairs, {:.0} pairs/s",
                to - from,
                done as f64 / t0.elapsed().as_secs_f64()
            ));
            last_print = Instant::now();
        }
    }
    bed.pairs = to;
    let bound = wait_bound(ctx, &client, to).await?;
    let fill = Fill {
        added: to - from,
        secs: t0.elapsed().as_secs_f64(),
    };
    ctx.say(&format!(
        "scale: {bound} pairs bound; {} added in {:.0} s ({:.0} pairs/s)",
        fill.added,
        fill.secs,
        fill.pairs_per_sec().unwrap_or(0.0)
    ));
    Ok(fill)
}

/// One pair, as provisioning makes it: the volume, the claim naming its PV, the PV, then
/// the binder's annotations and both statuses (written here, many at once, rather than by
/// the binder's one worker per kind). Safe to run again for the same index.
async fn make_pair(
    client: &Client,
    csi: pb::controller_client::ControllerClient<Channel>,
    driver: &str,
    i: usize,
) -> anyhow::Result<()> {
    let p = layout::pair(i);
    let pv_name = layout::pv_name(i);
    let handle = if p.class.ours() {
        let request = create_volume(&pv_name);
        let volume = retry(&format!("CreateVolume {pv_name}"), || {
            let (mut csi, request) = (csi.clone(), request.clone());
            async move { csi.create_volume(request).await }
        })
        .await?;
        volume.into_inner().volume.unwrap_or_default().volume_id
    } else {
        format!("other-{i:06}")
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &p.namespace);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claim: PersistentVolumeClaim = serde_json::from_value(layout::bound_claim(&p, driver))?;
    let created = retry(&format!("creating claim {}", p.claim), || {
        let (claims, claim) = (claims.clone(), claim.clone());
        async move {
            match claims.create(&PostParams::default(), &claim).await {
                Err(kube::Error::Api(s)) if s.code == 409 => claims.get(&claim.name_any()).await,
                other => other,
            }
        }
    })
    .await?;
    let uid = created.uid().context("the created claim has a UID")?;
    let pv: PersistentVolume = serde_json::from_value(layout::pv(&p, driver, &uid, &handle))?;
    retry(&format!("creating PV {pv_name}"), || {
        let (pvs, pv) = (pvs.clone(), pv.clone());
        async move {
            match pvs.create(&PostParams::default(), &pv).await {
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(pv),
                other => other,
            }
        }
    })
    .await?;
    let pp = PatchParams::default();
    let (marks, pv_bound, claim_bound) = (
        Patch::Merge(layout::bind_marks()),
        Patch::Merge(layout::pv_status()),
        Patch::Merge(layout::claim_status()),
    );
    retry(&format!("annotating claim {}", p.claim), || {
        claims.patch(&p.claim, &pp, &marks)
    })
    .await?;
    retry(&format!("PV {pv_name} Bound"), || {
        pvs.patch_status(&pv_name, &pp, &pv_bound)
    })
    .await?;
    retry(&format!("claim {} Bound", p.claim), || {
        claims.patch_status(&p.claim, &pp, &claim_bound)
    })
    .await?;
    if layout::brings_pending(i) {
        let waiting: PersistentVolumeClaim = serde_json::from_value(layout::pending_claim(i))?;
        let ns = waiting.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        retry(&format!("creating {}", waiting.name_any()), || {
            create_or_exists(&api, waiting.clone())
        })
        .await?;
    }
    Ok(())
}

fn create_volume(name: &str) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![pb::VolumeCapability {
            access_type: Some(pb::volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(pb::volume_capability::AccessMode {
                mode: pb::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        ..Default::default()
    }
}

/// `op` until it succeeds, [`TRIES`] times at most (a loaded API server may time out or
/// answer 429 now and then).
async fn retry<T, E, F, Fut>(what: &str, mut op: F) -> anyhow::Result<T>
where
    E: std::fmt::Display + Send + Sync + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if tries + 1 < TRIES => {
                tries += 1;
                eprintln!("bench: {what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200 << tries)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("{what}: {e}")),
        }
    }
}

/// Waits until `pairs` claims of pairs are `Bound` (the binder may have written `Pending`
/// over a claim whose PV it had not seen yet; it binds it again once it has). Returns the count.
async fn wait_bound(ctx: &Ctx, client: &Client, pairs: usize) -> anyhow::Result<usize> {
    let t0 = Instant::now();
    loop {
        let bound = count_bound(client).await?;
        if bound >= pairs {
            return Ok(bound);
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "only {bound}/{pairs} pairs bound after 300 s"
        );
        ctx.say(&format!("scale: {bound}/{pairs} claims bound"));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Claims of pairs that are `Bound`, in pages (a list of 50,000 claims at once is large).
async fn count_bound(client: &Client) -> anyhow::Result<usize> {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let lp = ListParams::default()
        .labels(&format!("{}=pair", layout::FILL_LABEL))
        .limit(5000);
    let pages = futures::stream::try_unfold(Some(lp), |lp| {
        let claims = claims.clone();
        async move {
            let Some(lp) = lp else {
                return Ok::<_, kube::Error>(None);
            };
            let page = claims.list(&lp).await?;
            let bound = page
                .items
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .count();
            let next = page
                .metadata
                .continue_
                .filter(|c| !c.is_empty())
                .map(|c| lp.clone().continue_token(&c));
            Ok(Some((bound, next)))
        }
    });
    Ok(pages.try_collect::<Vec<usize>>().await?.into_iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_rate_needs_pairs_and_time() {
        let f = Fill {
            added: 1000,
            secs: 20.0,
        };
        assert_eq!(f.pairs_per_sec(), Some(50.0));
        assert_eq!(Fill::default().pairs_per_sec(), None);
    }

    #[test]
    fn the_volume_is_named_as_its_pv() {
        let r = create_volume("pvc-x");
        assert_eq!(r.name, "pvc-x");
        assert_eq!(r.capacity_range.unwrap().required_bytes, 1 << 30);
    }
}
