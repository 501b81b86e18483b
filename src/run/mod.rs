//! Start-up and the lifetime of the process: connect to the driver, learn
//! what it is, serve HTTP, win the Lease, then run the claim and volume
//! reconcilers until SIGTERM (or a lost Lease, or a lost driver).
//! upstream: cmd/csi-provisioner/csi-provisioner.go main.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::{Controller, WatchStreamExt, controller, reflector, watcher};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{error, info, warn};

use crate::config::{self, Config, Env, RateLimit};
use crate::controller::claim::{ClaimMemory, IntentReleaser};
use crate::controller::{Caches, Context, VolumeMemory, capacity, claim, volume};
use crate::csi::{CsiClient, DriverCapabilities};
use crate::entry::{self, Command, Signals};
use crate::http::{HttpServer, LeaderHealth};
use crate::kube::lease::{Elector, LeaseConfig, lease_name};
use crate::kube::slim::{Claim, Pv};
use crate::kube::throttle::{Lane, SharedBucket, ThrottleLayer};
use crate::kube::{EventRecorder, LeaderGate, Listed};
use crate::logging;
use crate::metrics::Metrics;
use crate::provision::{DriverInfo, ProvisionOptions};

/// Everything `run` needs, resolved from flags and environment by the caller.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub csi_socket: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub rate_limit: crate::config::RateLimit,
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub worker_threads: usize,
    /// `--cloning-protection-threads` (at least 1).
    pub cloning_protection_threads: usize,
    pub provision: ProvisionOptions,
    /// `VolumeAttributesClass` was not set on the command line: as upstream,
    /// turn it off if the API server does not serve the kind.
    pub discover_volume_attributes_class: bool,
    pub http_endpoint: Option<String>,
    /// Whether `/healthz/leader-election` is served (only with `--http-endpoint`).
    pub leader_health: bool,
    pub metrics_path: String,
    pub leader_election: Option<LeaderElection>,
    /// `--snapshot-orphan-sweep-interval`; `None`: no sweep.
    pub snapshot_orphan_sweep_interval: Option<Duration>,
    /// `--enable-capacity` and its settings; `None`: no capacity tracking.
    pub capacity: Option<crate::config::CapacityConfig>,
    /// `--node-deployment` and its settings; `None`: central deployment.
    pub node_deployment: Option<crate::config::NodeDeploymentConfig>,
}

#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Lease namespace (flag, `POD_NAMESPACE`, service-account namespace, `default`).
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub labels: BTreeMap<String, String>,
}

/// Why the process stops with a non-zero code. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum FatalError {
    #[error(transparent)]
    Connect(#[from] crate::csi::ConnectError),
    #[error("CSI driver probe failed: {0}")]
    Probe(tonic::Status),
    #[error(transparent)]
    Identify(#[from] crate::csi::IdentifyError),
    #[error(transparent)]
    KubeConfig(#[from] crate::kube::client::ClientError),
    #[error("failed to serve HTTP on {addr}: {source}")]
    Http {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    LeaseLost(#[from] crate::kube::lease::LeaseError),
    #[error(transparent)]
    Capacity(#[from] crate::controller::capacity::StartError),
    #[error("failed to get node info from the CSI driver: {0}")]
    NodeInfo(tonic::Status),
}

/// The sidecar as a command of [`crate::entry`]: its flags, its logging,
/// and a stop that never hangs.
pub struct Sidecar;

impl Command for Sidecar {
    type Config = Config;

    // Never hang on shutdown: stuck calls get a short grace period.
    const GRACE: Duration = Duration::from_secs(5);

    fn start(argv: Vec<String>) -> Result<Config, ExitCode> {
        let args = entry::flags(config::parse_from(argv.clone()))?;
        if args.version {
            let program = argv.first().map_or("csi-provisioner", String::as_str);
            let version = format!("{program} {}\n", env!("CARGO_PKG_VERSION"));
            return Err(entry::print(&version, ExitCode::SUCCESS));
        }
        let cfg = Config::from_args(&args, &Env::from_process()).map_err(|e| entry::fail(&e, 1))?;
        logging::init(&cfg.logging);
        Ok(cfg)
    }

    async fn run(cfg: Config) -> ExitCode {
        let signals = Signals::watch();
        tokio::spawn(hard_deadline(signals.clone()));
        match run(run_config(&cfg), signals.stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("{e}");
                entry::fail(&e, 1)
            }
        }
    }
}

/// After the first signal, a second one or 30 s end the process: in-flight
/// calls are bounded by --timeout, so a stop that takes longer is stuck.
async fn hard_deadline(signals: Signals) {
    signals.stop.cancelled().await;
    tokio::select! {
        _ = signals.again.cancelled() => {},
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            error!("shutdown did not finish within 30s; exiting");
            crate::console::err("shutdown did not finish within 30s; exiting\n");
        }
    }
    std::process::exit(1);
}

fn run_config(cfg: &Config) -> RunConfig {
    let p = &cfg.provisioning;
    RunConfig {
        csi_socket: cfg.csi_socket.clone(),
        kubeconfig: cfg.client.kubeconfig.clone(),
        master: cfg.client.master.clone(),
        rate_limit: cfg.client.rate_limit,
        timeout: cfg.timeout,
        retry_start: p.retry_interval_start,
        retry_max: p.retry_interval_max,
        worker_threads: p.worker_threads,
        cloning_protection_threads: p.cloning_protection_threads,
        provision: ProvisionOptions {
            volume_name_prefix: p.volume_name_prefix.clone(),
            volume_name_uuid_length: p.volume_name_uuid_length,
            extra_create_metadata: p.extra_create_metadata,
            default_fstype: p.default_fstype.clone(),
            controller_publish_readonly: p.controller_publish_readonly,
            strict_topology: p.strict_topology,
            immediate_topology: p.immediate_topology,
            topology_gate: cfg.feature_gates.topology,
            volume_attributes_class: cfg.feature_gates.volume_attributes_class.unwrap_or(true),
            prevent_volume_mode_conversion: p.prevent_volume_mode_conversion,
            cross_namespace_data_source: cfg.feature_gates.cross_namespace_volume_data_source,
        },
        discover_volume_attributes_class: cfg.feature_gates.volume_attributes_class.is_none(),
        snapshot_orphan_sweep_interval: p.snapshot_orphan_sweep_interval,
        capacity: cfg.capacity.clone(),
        node_deployment: cfg.node_deployment.clone(),
        http_endpoint: cfg.http.as_ref().map(|h| h.address.clone()),
        leader_health: cfg.http.as_ref().is_some_and(|h| h.leader_election_health),
        metrics_path: cfg
            .http
            .as_ref()
            .map(|h| h.metrics_path.clone())
            .unwrap_or_else(|| "/metrics".into()),
        leader_election: cfg.leader_election.as_ref().map(|le| LeaderElection {
            namespace: le.namespace.clone(),
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
            labels: le.labels.clone(),
        }),
    }
}

pub async fn run(cfg: RunConfig, stop: CancellationToken) -> Result<(), FatalError> {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));

    // 1. The driver: connect (30 s, as upstream), probe, name, capabilities.
    // A stop during start-up ends it at once (upstream dies on the signal).
    let (csi, info, capabilities) = tokio::select! {
        r = connect_driver(&cfg, metrics.clone()) => r?,
        _ = stop.cancelled() => return Ok(()),
    };
    let host = hostname();
    let mut identity = format!(
        "{}-{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
        rand::random_range(0..10000),
        info.name
    );
    // One sidecar per node: what the driver says about this node, fatal on
    // error as upstream; the identity names the node too.
    let node = match &cfg.node_deployment {
        None => None,
        Some(nd) => {
            let info = csi.node_get_info().await.map_err(FatalError::NodeInfo)?;
            let topology = info
                .accessible_topology
                .map(|t| t.segments.into_iter().collect());
            info!(node = %nd.node_name, node_id = %info.node_id, ?topology, "node deployment");
            identity.push('-');
            identity.push_str(&nd.node_name);
            Some(crate::controller::node::NodeMode {
                name: nd.node_name.clone(),
                topology,
                immediate_binding: nd.immediate_binding,
                base_delay: nd.base_delay,
                max_delay: nd.max_delay,
            })
        }
    };
    info!(driver = %info.name, version = %info.vendor_version, ?capabilities, "connected to CSI driver");
    let driver = DriverInfo {
        name: info.name.clone(),
        identity,
        capabilities,
    };

    // 2. Kubernetes clients: two lanes of one rate limit (work, and events and
    // tidying in the background), and one for the Lease.
    let bucket = match cfg.rate_limit {
        RateLimit::Unlimited => None,
        RateLimit::TokenBucket { qps, burst } => Some(SharedBucket::new(qps, burst)),
    };
    let client = kube_client(&cfg, bucket.as_ref().map(|b| b.layer(Lane::Work))).await?;
    let background = kube_client(&cfg, bucket.as_ref().map(|b| b.layer(Lane::Background))).await?;

    // Capacity tracking has a client of its own (upstream: `--kube-api-capacity-qps/-burst`),
    // and finds the owner of its objects before anything else, fatal on errors as upstream.
    let capacity = match &cfg.capacity {
        None => None,
        Some(cap) => {
            let layer = match cap.rate_limit {
                RateLimit::Unlimited => None,
                RateLimit::TokenBucket { qps, burst } => {
                    Some(SharedBucket::new(qps, burst).layer(Lane::Work))
                }
            };
            let cap_client = kube_client(&cfg, layer).await?;
            capacity::probe(&cap_client, &cap.namespace).await?;
            let owner = match &cap.owner {
                None => None,
                Some(o) => Some(capacity::owner(&cap_client, &cap.namespace, o).await?),
            };
            if !driver.capabilities.get_capacity {
                warn!(
                    "--enable-capacity: the driver does not report the GET_CAPACITY capability; GetCapacity calls will fail"
                );
            }
            Some((
                cap.clone(),
                cap_client,
                owner,
                Arc::new(tokio::sync::Notify::new()),
            ))
        }
    };
    let capacity_gauges = capacity
        .as_ref()
        .map(|_| capacity::Gauges::register(&mut registry));

    let mut options = cfg.provision.clone();
    if cfg.discover_volume_attributes_class && !serves_volume_attributes_class(&client).await {
        info!(
            "the API server does not serve storage.k8s.io/v1 VolumeAttributesClass: feature gate VolumeAttributesClass off"
        );
        options.volume_attributes_class = false;
    }

    // 3. Leader election gate and HTTP.
    let (gate, elector) = match &cfg.leader_election {
        None => (LeaderGate::always(), None),
        Some(le) => {
            // The Lease has its own client, never throttled by provisioning work.
            let le_client = kube_client(&cfg, None).await?;
            let elector = Elector::new(
                le_client,
                LeaseConfig {
                    name: lease_name(&driver.name),
                    namespace: le.namespace.clone(),
                    identity: format!("{}_{:08x}", sanitize(&host), rand::random::<u32>()),
                    lease_duration: le.lease_duration,
                    renew_deadline: le.renew_deadline,
                    retry_period: le.retry_period,
                    labels: le.labels.clone(),
                },
            )
            .with_metrics(&metrics);
            (elector.gate(), Some(elector))
        }
    };
    let registry = Arc::new(registry);
    if let Some(addr) = &cfg.http_endpoint {
        let leader: Option<Arc<dyn LeaderHealth>> = (cfg.leader_health && elector.is_some())
            .then(|| Arc::new(GateHealth(gate.clone())) as Arc<dyn LeaderHealth>);
        let server = HttpServer {
            registry: registry.clone(),
            metrics: metrics.clone(),
            metrics_path: cfg.metrics_path.clone(),
            leader,
        };
        let local = server
            .serve(addr, stop.clone())
            .await
            .map_err(|source| FatalError::Http {
                addr: addr.clone(),
                source,
            })?;
        info!(address = %local, "serving metrics");
    }

    let mut elector = elector;
    if let Some(el) = elector.as_mut() {
        if !el.acquire(&stop).await {
            return Ok(());
        }
        metrics
            .leader_status
            .get_or_create(&crate::metrics::LeaseLabels {
                name: lease_name(&driver.name),
            })
            .set(1);
    }

    // 4. Caches and reconcilers.
    let (classes, class_writer) = reflector::store();
    let classes_listed = Listed::default();
    let class_stream = cached_stream::<StorageClass>(
        &client,
        class_writer,
        classes_listed.clone(),
        drop_managed_fields,
        |_| true,
        |_| {},
    )
    .for_each(|_| async {});

    let (claim_store, claim_writer) = reflector::store();
    let (volume_store, volume_writer) = reflector::store();
    let volumes_listed = Listed::default();
    let claim_memory = Arc::new(ClaimMemory::new(cfg.retry_start, cfg.retry_max));
    // Upstream's event source: `<driver>_<hostname>_<uuid>`, no host.
    let component = format!("{}_{}_{}", driver.name, host, random_uuid());
    info!(%component, "recording events");
    let ctx = Arc::new(Context {
        client: client.clone(),
        csi,
        recorder: EventRecorder::new(background.clone(), &component, ""),
        driver,
        options,
        metrics: metrics.clone(),
        leader: gate.clone(),
        caches: Caches {
            classes: classes.clone(),
            volumes: volume_store.clone(),
            volumes_listed: volumes_listed.clone(),
            claims: claim_store.clone(),
        },
        claims: claim_memory.clone(),
        intents: IntentReleaser::start(background, claim_memory.clone()),
        volumes: VolumeMemory::new(cfg.retry_start, cfg.retry_max),
        capacity: capacity.as_ref().map(|c| c.3.clone()),
        clone_releases: tokio::sync::Semaphore::new(cfg.cloning_protection_threads.max(1)),
        node,
    });

    let workers = controller::Config::default().concurrency(cfg.worker_threads as u16);
    // Upstream's work-queue names, as the workqueue_* metrics label them.
    let claim_queue = metrics.work_queue("claims");
    let volume_queue = metrics.work_queue("volumes");
    let shutdown = stop.clone();
    let claims = Controller::for_stream(
        cached_stream::<Claim>(
            &client,
            claim_writer,
            Listed::default(),
            claim::trim,
            claim::cached,
            move |event| claim::forget_deleted(&claim_memory, event),
        ),
        claim_store.clone(),
    )
    .with_config(workers.clone())
    .graceful_shutdown_on(async move { shutdown.cancelled().await })
    .run(
        claim_queue.reconciler(claim::reconcile),
        claim_queue.error_policy(claim::error_policy),
        ctx.clone(),
    )
    .for_each(|_| async {});
    let claims = until_done_or_stopped_unready(claims, claim_store, stop.clone());
    let shutdown = stop.clone();
    let volumes = Controller::for_stream(
        cached_stream::<Pv>(
            &client,
            volume_writer,
            volumes_listed.clone(),
            Pv::trim,
            |_| true,
            {
                let ctx = ctx.clone();
                move |event| volume::forget_deleted(&ctx.volumes, event)
            },
        ),
        volume_store.clone(),
    )
    .with_config(workers)
    .graceful_shutdown_on(async move { shutdown.cancelled().await })
    .run(
        volume_queue.reconciler(volume::reconcile),
        volume_queue.error_policy(volume::error_policy),
        ctx.clone(),
    )
    .for_each(|_| async {});
    let volumes = until_done_or_stopped_unready(volumes, volume_store, stop.clone());

    // Classes must be known before claims are judged; wait for the first list.
    let class_task = tokio::spawn(class_stream);
    tokio::select! {
        _ = classes_listed.wait() => {}
        _ = stop.cancelled() => {}
    }
    info!("started");

    // Each controller is a task of its own: kube-runtime polls every
    // reconcile in flight (up to --worker-threads) whenever its task wakes, so
    // sharing one task would make every PV event poll the claim reconciles
    // too, and the other way round. Dropped (a lost Lease), they are aborted.
    // The orphan sweep of snapshot source protection, as upstream only when
    // the driver restores snapshots and the API server serves them.
    let sweep = match cfg.snapshot_orphan_sweep_interval {
        Some(every)
            if ctx.driver.capabilities.create_delete_snapshot
                && serves_volume_snapshots(&client).await =>
        {
            info!(?every, "sweeping orphaned snapshot source protection");
            futures::future::Either::Left(own_task(crate::controller::snapshot_sweep::run(
                ctx.clone(),
                every,
                stop.clone(),
            )))
        }
        _ => futures::future::Either::Right(std::future::ready(())),
    };
    let tracker = match (capacity, capacity_gauges) {
        (Some((config, client, owner, trigger)), Some(gauges)) => {
            futures::future::Either::Left(own_task(capacity::run(
                capacity::Tracker {
                    ctx: ctx.clone(),
                    client,
                    config,
                    owner,
                    gauges,
                    trigger,
                    managed_by: crate::capacity::managed_by(
                        ctx.node.as_ref().map(|n| n.name.as_str()),
                    ),
                },
                stop.clone(),
            )))
        }
        _ => futures::future::Either::Right(std::future::ready(())),
    };
    let workers = futures::future::join4(own_task(claims), own_task(volumes), sweep, tracker);
    // Stop (SIGTERM) lets in-flight reconciles finish, then gives the Lease
    // up so a standby takes over at once; a lost Lease stops everything now.
    tokio::pin!(workers);
    let result = match elector.as_mut() {
        None => {
            workers.await;
            Ok(())
        }
        Some(el) => tokio::select! {
            _ = &mut workers => Ok(()),
            r = el.renew(&stop) => match r {
                Ok(()) => {
                    workers.await;
                    Ok(())
                }
                Err(lost) => Err(FatalError::from(lost)),
            },
        },
    };
    // Events of the last reconciles go out before the process does.
    ctx.recorder.flush(Duration::from_secs(2)).await;
    if let Some(el) = elector.as_mut() {
        metrics
            .leader_status
            .get_or_create(&crate::metrics::LeaseLabels {
                name: lease_name(&ctx.driver.name),
            })
            .set(0);
        if result.is_ok()
            && tokio::time::timeout(Duration::from_secs(5), el.release())
                .await
                .is_err()
        {
            warn!("releasing the lease timed out");
        }
    }
    class_task.abort();
    if let Err(e) = &result {
        error!(error = %e, "stopping");
    }
    result
}

/// Whether discovery of `snapshot.storage.k8s.io/v1` lists VolumeSnapshot
/// (the CRDs are installed); a failed discovery counts as no.
async fn serves_volume_snapshots(client: &Client) -> bool {
    match client
        .list_api_group_resources("snapshot.storage.k8s.io/v1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.kind == "VolumeSnapshot"),
        Err(e) => {
            info!(error = %e, "snapshot.storage.k8s.io/v1 is not served: no snapshot sweep");
            false
        }
    }
}

/// Whether discovery of `storage.k8s.io/v1` lists VolumeAttributesClass. A
/// failed discovery leaves the gate on (upstream turns it off only when
/// discovery succeeds without the kind).
async fn serves_volume_attributes_class(client: &Client) -> bool {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.kind == "VolumeAttributesClass"),
        Err(e) => {
            warn!(error = %e, "discovery of storage.k8s.io/v1 failed; keeping VolumeAttributesClass on");
            true
        }
    }
}

/// Connects to the driver (30 s, as upstream), waits for `Probe`, and reads
/// its name and capabilities.
async fn connect_driver(
    cfg: &RunConfig,
    metrics: Arc<Metrics>,
) -> Result<
    (
        CsiClient,
        crate::csi::pb::GetPluginInfoResponse,
        DriverCapabilities,
    ),
    FatalError,
> {
    let mut csi = CsiClient::connect(
        &cfg.csi_socket,
        cfg.timeout,
        Duration::from_secs(30),
        metrics,
    )
    .await?;
    csi.probe_until_ready().await.map_err(FatalError::Probe)?;
    let (info, capabilities) = csi.identify().await?;
    if !capabilities.supports_provisioning() {
        warn!(driver = %info.name, "driver does not support dynamic provisioning; every claim will fail");
    }
    Ok((csi, info, capabilities))
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

/// Runs `work` as a task of its own, aborted when the returned future is
/// dropped; a panic in it is a panic of the caller, as if it ran inline.
async fn own_task(work: impl std::future::Future<Output = ()> + Send + 'static) {
    match AbortOnDropHandle::new(tokio::spawn(work)).await {
        Ok(()) => {}
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: only by a runtime shutting down (an abort drops this future first).
        Err(_) => {}
    }
}

/// Runs a controller until it finishes its graceful shutdown, or until `stop`
/// fires while its cache has not finished the first list. kube-runtime holds
/// every reconcile until the cache is ready, and its graceful shutdown cuts
/// the watch stream that would make it ready, so a controller stopped that
/// early never ends on its own. Nothing ran in it, so dropping it is safe.
async fn until_done_or_stopped_unready<K>(
    controller: impl std::future::Future<Output = ()>,
    store: reflector::Store<K>,
    stop: CancellationToken,
) where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let stopped_unready = async {
        stop.cancelled().await;
        if !matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = controller => {}
        _ = stopped_unready => info!("stopped before the first list finished"),
    }
}

/// A watch of every `K` feeding `writer`, each object passed through `trim`
/// before caching. `managedFields` are often most of an object's bytes and
/// never read: the slim cache types skip them while parsing, other types drop
/// them in `trim` ([`drop_managed_fields`]).
/// The initial list may be served from the API server's watch cache
/// (`resourceVersion=0`): a cache is only for finding work, every decision is
/// re-read from the API server (DESIGN §2.2).
fn cached_stream<K>(
    client: &Client,
    writer: reflector::store::Writer<K>,
    listed: Listed,
    trim: fn(&mut K),
    keep: fn(&K) -> bool,
    mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let stream = watcher(
        Api::<K>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .modify(trim)
    .try_filter_map(move |event| futures::future::ready(Ok(kept(event, keep))))
    .inspect_ok(move |event| observe(event))
    // The controllers drop these; an operator must see a watch that cannot
    // list or watch (RBAC, an API outage). The watcher retries with backoff.
    .inspect_err(|e| warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying"));
    let reader = writer.as_reader();
    triggers(reader, listed, reflector(writer, stream))
}

/// A watch event as the cache takes it when only objects that pass `keep` are
/// cached: a listed object that does not is not listed, and a change that
/// makes one not pass is a deletion, so no copy of it stays behind.
fn kept<K>(event: watcher::Event<K>, keep: fn(&K) -> bool) -> Option<watcher::Event<K>> {
    match event {
        watcher::Event::InitApply(obj) if !keep(&obj) => None,
        watcher::Event::Apply(obj) if !keep(&obj) => Some(watcher::Event::Delete(obj)),
        event => Some(event),
    }
}

/// The objects to reconcile, from a reflector's events: each applied object,
/// and after a (re)list every object of the store once the list is complete.
///
/// kube-runtime's reconciler reads the object from the store when it runs, and
/// a reflector swaps a relist into its store only at its end (`InitDone`). An
/// object triggered by its `InitApply` could be reconciled from the copy of
/// before the relist, or skipped as unknown, and nothing would trigger it once
/// the store held the listed copy: the change that the relist caught up with
/// (a PV Released while the watch was gone, a claim created then) would never
/// be acted on. So listed objects are triggered from the store after the swap.
/// The store's objects are cloned one by one as the controller takes them.
/// `listed` is marked once the first list is in the store.
fn triggers<K, S>(
    reader: reflector::Store<K>,
    listed: Listed,
    events: S,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    events.flat_map(move |event| {
        let objects: Vec<Arc<K>> = match &event {
            Ok(watcher::Event::InitDone) => {
                listed.mark();
                reader.state()
            }
            _ => Vec::new(),
        };
        let first = match event {
            Ok(watcher::Event::Apply(obj)) => Some(Ok(obj)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        };
        futures::stream::iter(
            first
                .into_iter()
                .chain(objects.into_iter().map(|obj| Ok(K::clone(&obj)))),
        )
    })
}

fn drop_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

async fn kube_client(
    cfg: &RunConfig,
    throttle: Option<ThrottleLayer>,
) -> Result<Client, FatalError> {
    let client =
        crate::kube::client::build(cfg.kubeconfig.as_deref(), cfg.master.as_deref(), throttle)
            .await?;
    Ok(client)
}

/// A random (version 4) UUID in its usual text form.
fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn sanitize(s: &str) -> String {
    lease_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[tokio::test]
    async fn a_controller_task_dropped_is_aborted() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = own_task(async move {
            let _keep = tx;
            std::future::pending::<()>().await
        });
        // Polled once, so the task is spawned; then dropped, as a lost Lease does.
        assert!(futures::poll!(Box::pin(task)).is_pending());
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("the task must be aborted when its owner is dropped")
            .expect_err("aborted, so its sender is dropped without sending");
    }

    #[tokio::test]
    async fn a_panic_in_a_controller_task_is_the_callers() {
        let caught = tokio::spawn(own_task(async { panic!("boom") })).await;
        let payload = caught
            .expect_err("the panic must reach the caller")
            .into_panic();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    }

    fn config_map(name: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), data.to_string())].into()),
            ..Default::default()
        }
    }

    /// For each trigger, the name and what the store holds for it as the
    /// trigger is taken (what the reconciler would read).
    async fn seen_by_reconciler(events: Vec<watcher::Event<ConfigMap>>) -> Vec<(String, String)> {
        let (store, writer) = reflector::store::<ConfigMap>();
        let stream = triggers(
            store.clone(),
            Listed::default(),
            reflector(writer, futures::stream::iter(events.into_iter().map(Ok))),
        );
        futures::pin_mut!(stream);
        let mut seen = Vec::new();
        while let Some(obj) = stream.next().await {
            let obj = obj.expect("no errors fed");
            let held = store
                .get(&reflector::ObjectRef::from_obj(&obj))
                .map(|o| o.data.as_ref().unwrap()["v"].clone())
                .unwrap_or_else(|| "(not in the store)".into());
            seen.push((obj.metadata.name.clone().unwrap(), held));
        }
        seen
    }

    #[tokio::test]
    async fn objects_not_kept_never_stay_in_the_store_nor_reach_the_reconciler() {
        use watcher::Event::*;
        fn keep(cm: &ConfigMap) -> bool {
            cm.data.as_ref().unwrap()["v"].starts_with("work")
        }
        let events = vec![
            Init,
            InitApply(config_map("a", "work")),
            InitApply(config_map("b", "done")),
            InitDone,
            // `a` is done: the cache must not keep its copy with work.
            Apply(config_map("a", "done")),
            // `b` has work again.
            Apply(config_map("b", "work again")),
        ];
        let (store, writer) = reflector::store::<ConfigMap>();
        let events =
            futures::stream::iter(events.into_iter().filter_map(|e| kept(e, keep)).map(Ok));
        let stream = triggers(store.clone(), Listed::default(), reflector(writer, events));
        let reconciled: Vec<String> = stream
            .map(|o| o.unwrap().metadata.name.unwrap())
            .collect()
            .await;
        assert_eq!(reconciled, ["a", "b"], "a from the list, b from its change");
        let mut held: Vec<_> = store
            .state()
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.data.as_ref().unwrap()["v"].clone(),
                )
            })
            .collect();
        held.sort();
        assert_eq!(held, [("b".to_string(), "work again".to_string())]);
    }

    #[tokio::test]
    async fn listed_is_marked_once_the_first_list_is_in_the_store() {
        use watcher::Event::*;
        let (store, writer) = reflector::store::<ConfigMap>();
        let listed = Listed::default();
        let events = vec![Init, InitApply(config_map("a", "Bound")), InitDone];
        let stream = triggers(
            store.clone(),
            listed.clone(),
            reflector(writer, futures::stream::iter(events.into_iter().map(Ok))),
        );
        futures::pin_mut!(stream);
        assert!(!listed.is_listed());
        let first = stream.next().await.expect("the listed object").unwrap();
        assert_eq!(first.metadata.name.as_deref(), Some("a"));
        assert!(listed.is_listed());
        assert_eq!(
            store.state().len(),
            1,
            "marked only with the list swapped in"
        );
    }

    #[tokio::test]
    async fn a_relisted_object_is_reconciled_from_the_listed_copy() {
        use watcher::Event::*;
        let seen = seen_by_reconciler(vec![
            Init,
            InitApply(config_map("a", "Bound")),
            InitDone,
            Apply(config_map("a", "Bound, with our finalizer")),
            // The watch lost events (410 Gone): a relist finds `a` Released and a new `b`.
            Init,
            InitApply(config_map("a", "Released")),
            InitApply(config_map("b", "new")),
            InitDone,
        ])
        .await;
        let (before, after) = seen.split_at(2);
        assert_eq!(
            before,
            [
                ("a".to_string(), "Bound".to_string()),
                ("a".into(), "Bound, with our finalizer".into()),
            ]
        );
        // After the relist, every listed object once, in the store's (any) order.
        let mut after = after.to_vec();
        after.sort();
        assert_eq!(
            after,
            vec![("a".into(), "Released".into()), ("b".into(), "new".into())]
        );
    }

    #[tokio::test]
    async fn a_controller_stopped_before_its_first_list_ends_at_once() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let stop = CancellationToken::new();
        stop.cancel();
        // The controller itself would never end (kube-runtime holds it until
        // the cache is ready, which cannot happen any more).
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            until_done_or_stopped_unready(std::future::pending(), store, stop),
        )
        .await;
        assert!(
            ended.is_ok(),
            "a stop before the first list must end the run"
        );
    }

    #[tokio::test]
    async fn a_ready_controller_is_left_to_finish_its_graceful_shutdown() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let stop = CancellationToken::new();
        stop.cancel();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(until_done_or_stopped_unready(
            async {
                let _ = finished.await;
            },
            store,
            stop,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!run.is_finished(), "in-flight work must not be cut off");
        finish.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("ends once the controller does")
            .unwrap();
    }
}
