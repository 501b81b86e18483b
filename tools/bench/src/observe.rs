//! Watches what the contender does, from the benchmark's (admin) side: when
//! each claim was created (by us), when its PV appeared and when the claim
//! became Bound, and which PVs of the run still exist.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimTimes {
    pub created: Option<Instant>,
    pub pv: Option<Instant>,
    pub bound: Option<Instant>,
}

#[derive(Default)]
pub struct State {
    pub claims: HashMap<String, ClaimTimes>,
    /// PVs whose claimRef points into the namespace and that exist now.
    pub pvs_alive: HashSet<String>,
    /// The PV seen for each claim.
    pub pv_of: HashMap<String, String>,
}

impl State {
    /// Whether the PV of `claim` was seen and is gone again.
    pub fn pv_gone(&self, claim: &str) -> bool {
        self.pv_of
            .get(claim)
            .is_some_and(|pv| !self.pvs_alive.contains(pv))
    }
}

impl State {
    pub fn count(&self, f: impl Fn(&ClaimTimes) -> bool) -> usize {
        self.claims.values().filter(|c| f(c)).count()
    }
}

pub struct Observer {
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Observer {
    /// Starts watching PVs (all) and claims (in `namespace`); returns once both
    /// watches have listed.
    pub async fn start(client: &Client, namespace: &str) -> anyhow::Result<Observer> {
        let state = Arc::new(Mutex::new(State::default()));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(2);

        let (st, ready, ns) = (state.clone(), ready_tx.clone(), namespace.to_string());
        let pvs = watcher(
            Api::<PersistentVolume>::all(client.clone()),
            watcher::Config::default(),
        );
        let pv_task = tokio::spawn(async move {
            let mut pvs = std::pin::pin!(pvs);
            while let Some(ev) = pvs.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::Apply(pv) | watcher::Event::InitApply(pv)) => {
                        let Some(claim) = claim_of(&pv, &ns) else {
                            continue;
                        };
                        let mut s = st.lock().expect("poisoned");
                        s.pvs_alive.insert(pv.name_any());
                        s.pv_of.insert(claim.clone(), pv.name_any());
                        s.claims.entry(claim).or_default().pv.get_or_insert(now);
                    }
                    Ok(watcher::Event::Delete(pv)) => {
                        if claim_of(&pv, &ns).is_some() {
                            st.lock()
                                .expect("poisoned")
                                .pvs_alive
                                .remove(&pv.name_any());
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        let _ = ready.send(()).await;
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(e) => {
                        eprintln!("bench: PV watch: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });

        let (st, ready) = (state.clone(), ready_tx);
        let claims = watcher(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace),
            watcher::Config::default(),
        );
        let claim_task = tokio::spawn(async move {
            let mut claims = std::pin::pin!(claims);
            while let Some(ev) = claims.next().await {
                let now = Instant::now();
                match ev {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                            let mut s = st.lock().expect("poisoned");
                            s.claims
                                .entry(c.name_any())
                                .or_default()
                                .bound
                                .get_or_insert(now);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        let _ = ready.send(()).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("bench: claim watch: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        let obs = Observer {
            state,
            tasks: vec![pv_task, claim_task],
        };
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(60), ready_rx.recv())
                .await
                .map_err(|_| anyhow::anyhow!("watches did not list within 60 s"))?;
        }
        Ok(obs)
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("poisoned")
    }

    pub fn created(&self, claim: &str, at: Instant) {
        self.state()
            .claims
            .entry(claim.to_string())
            .or_default()
            .created = Some(at);
    }

    pub fn times(&self, claim: &str) -> ClaimTimes {
        self.state().claims.get(claim).copied().unwrap_or_default()
    }
}

fn claim_of(pv: &PersistentVolume, namespace: &str) -> Option<String> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    (r.namespace.as_deref() == Some(namespace)).then(|| r.name.clone().unwrap_or_default())
}
