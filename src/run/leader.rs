//! Leader election wiring: the Lease (upstream's name, its own unthrottled
//! client, a holder identity of the host and a random suffix), the gate every
//! irreversible act asks, the `/healthz/leader-election` check, the
//! leader-status metric, and the Lease given up after a clean stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::FatalError;
use super::clients::Clients;
use crate::config::LeaderElectionConfig;
use crate::http::LeaderHealth;
use crate::kube::LeaderGate;
use crate::kube::lease::{Elector, LeaseConfig, lease_name};
use crate::metrics::{LeaseLabels, Metrics};

/// This replica's part in leader election; without `--leader-election` a
/// gate that is always open.
pub(super) struct Leadership {
    pub gate: LeaderGate,
    elector: Option<Elector>,
    /// The series of `leader_election_master_status` for this Lease.
    status: LeaseLabels,
    metrics: Arc<Metrics>,
}

impl Leadership {
    pub(super) async fn new(
        cfg: Option<LeaderElectionConfig>,
        clients: &Clients,
        driver: &str,
        host: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Leadership, FatalError> {
        let elector = match cfg {
            None => None,
            Some(cfg) => Some(elector(cfg, clients, driver, host, &metrics).await?),
        };
        Ok(Leadership {
            gate: elector
                .as_ref()
                .map_or_else(LeaderGate::always, Elector::gate),
            elector,
            status: LeaseLabels {
                name: lease_name(driver),
            },
            metrics,
        })
    }

    /// The check of `/healthz/leader-election`; `None` without an election.
    pub(super) fn health(&self) -> Option<Arc<dyn LeaderHealth>> {
        self.elector
            .as_ref()
            .map(|_| Arc::new(GateHealth(self.gate.clone())) as Arc<dyn LeaderHealth>)
    }

    /// Waits for the Lease; `false` when stopped first.
    pub(super) async fn acquire(&mut self, stop: &CancellationToken) -> bool {
        let Some(elector) = self.elector.as_mut() else {
            return true;
        };
        if !elector.acquire(stop).await {
            return false;
        }
        self.metrics
            .leader_status
            .get_or_create(&self.status)
            .set(1);
        true
    }

    /// Runs `work` while leading. A stop (SIGTERM) lets it finish; a lost
    /// Lease drops it at once and is the error.
    pub(super) async fn lead(
        &mut self,
        work: impl Future<Output = ()>,
        stop: &CancellationToken,
    ) -> Result<(), FatalError> {
        tokio::pin!(work);
        let Some(elector) = self.elector.as_mut() else {
            work.await;
            return Ok(());
        };
        tokio::select! {
            _ = &mut work => Ok(()),
            r = elector.renew(stop) => match r {
                Ok(()) => {
                    work.await;
                    Ok(())
                }
                Err(lost) => Err(FatalError::from(lost)),
            },
        }
    }

    /// After the work: no longer leading, and after a clean stop the Lease
    /// given up, so that a standby takes over at once.
    pub(super) async fn step_down(&mut self, clean: bool) {
        let Some(elector) = self.elector.as_mut() else {
            return;
        };
        self.metrics
            .leader_status
            .get_or_create(&self.status)
            .set(0);
        if clean
            && tokio::time::timeout(Duration::from_secs(5), elector.release())
                .await
                .is_err()
        {
            warn!("releasing the lease timed out");
        }
    }
}

/// The Lease has its own client, never throttled by provisioning work.
async fn elector(
    cfg: LeaderElectionConfig,
    clients: &Clients,
    driver: &str,
    host: &str,
    metrics: &Metrics,
) -> Result<Elector, FatalError> {
    let LeaderElectionConfig {
        namespace,
        lease_duration,
        renew_deadline,
        retry_period,
        labels,
    } = cfg;
    // The holder: the host, spelt as a Lease name is, and a random suffix.
    let identity = format!("{}_{:08x}", lease_name(host), rand::random::<u32>());
    let config = LeaseConfig {
        name: lease_name(driver),
        namespace,
        identity,
        lease_duration,
        renew_deadline,
        retry_period,
        labels,
    };
    Ok(Elector::new(clients.unthrottled().await?, config).with_metrics(metrics))
}

struct GateHealth(LeaderGate);

impl LeaderHealth for GateHealth {
    fn check(&self) -> Result<(), String> {
        // A standby is healthy; only a leader that stopped renewing is not
        // (upstream: HealthzAdaptor with a 20 s grace).
        match self.0.overdue_by() {
            Some(late) if late > Duration::from_secs(20) => Err(format!(
                "failed election to renew leadership on lease: {}s overdue",
                late.as_secs()
            )),
            _ => Ok(()),
        }
    }
}
