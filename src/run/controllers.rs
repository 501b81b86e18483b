//! The controllers and what they run on: the caches, the part every
//! controller shares and each one's own context, the claim and volume
//! controllers built the one way ([`Runner::controller`]), and the tasks
//! beside them (the snapshot-source sweep, capacity tracking), each a task of
//! its own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::OptionFuture;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, controller, reflector, watcher};
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

use super::FatalError;
use super::clients::{Clients, serves_volume_snapshots};
use super::driver::Driver;
use super::watch::{Cached, cached_stream, drop_managed_fields, source_stream};
use crate::config::{CapacityConfig, MetadataConfig};
use crate::controller::claim::intent::IntentMode;
use crate::controller::claim::{ClaimMemory, IntentReleaser};
use crate::controller::snapshot_sweep::Sweep;
use crate::controller::topology::{self, TopologyCaches};
use crate::controller::volume::{Attachments, VolumeMemory};
use crate::controller::{Shared, capacity, claim, queue, snapshot_sweep, volume};
use crate::kube::clock::WriteClock;
use crate::kube::fresh::{self, Freshness, FreshnessConfig};
use crate::kube::slim::{Claim, Pv};
use crate::kube::throttle::SharedBucket;
use crate::kube::watch::{Metadata, Progress};
use crate::kube::{EventRecorder, LeaderGate, Listed};
use crate::metrics::Metrics;
use crate::provision::topology as topo;
use crate::provision::{DriverInfo, ProvisionOptions};

/// How the controllers are paced: `--worker-threads`, `--retry-interval-*`,
/// `--cloning-protection-threads`, `--snapshot-orphan-sweep-interval`.
pub(super) struct Tuning {
    pub workers: usize,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub cloning_protection_threads: usize,
    pub snapshot_sweep: Option<Duration>,
    /// `--admission-intent`.
    pub admission_intent: bool,
    /// `--freshness-from-writes`.
    pub freshness_from_writes: bool,
}

/// What the reconcilers are built from, once the Lease is held.
pub(super) struct Parts {
    pub driver: Driver,
    pub clients: Clients,
    pub options: ProvisionOptions,
    pub tuning: Tuning,
    pub capacity: Option<Capacity>,
    pub metrics: Arc<Metrics>,
    pub gate: LeaderGate,
    pub host: String,
}

/// The controllers started: the part they share, the StorageClass watch,
/// and the work to run while leading (ends after a graceful stop).
pub(super) struct Started<W> {
    pub shared: Arc<Shared>,
    pub classes: JoinHandle<()>,
    pub work: W,
}

/// Builds the caches and the controllers, and returns once the classes are
/// known (claims are judged by their class) or `stop` fired.
pub(super) async fn start(
    parts: Parts,
    stop: &CancellationToken,
) -> Started<impl Future<Output = ()> + use<>> {
    let Parts {
        driver,
        clients,
        options,
        tuning,
        capacity,
        metrics,
        gate,
        host,
    } = parts;
    let (classes, class_writer) = reflector::store();
    let (claims, claim_writer) = reflector::store();
    let (volumes, volume_writer) = reflector::store();
    let classes_listed = Listed::default();
    // Every watch goes through the priority lane: it (re)starts ahead of queued work.
    let class_watch = class_watch(&clients.priority, class_writer, classes_listed.clone());
    let (attachments, attachment_watch) =
        attachment_cache(&clients.priority, &driver.info, stop).unzip();
    let (namespaces, namespace_watch) =
        namespace_cache(&clients.priority, &options.metadata, stop).unzip();
    // Spawned now: claims wait for its first list as for the classes'.
    let (topology, topology_watch) =
        topology_cache(&clients.priority, &driver, &options, stop).unzip();
    let caches = claim_caches(volumes, claims, namespaces, topology.clone());
    let reporting = Reporting {
        metrics: metrics.clone(),
        gate,
        host,
        capacity: capacity.as_ref().map(|c| c.trigger.clone()),
    };
    let shared = shared(driver, &clients, reporting, classes);
    let claim_ctx = claim_context(&shared, &clients, &tuning, options, caches);
    let volume_ctx = volume_context(&shared, &tuning, attachments);
    export_claim_gauges(&metrics, &claim_ctx);

    let runner = Runner::new(tuning.workers, &metrics, stop);
    let priority = &clients.priority;
    let claims = claim_controller(&runner, &claim_ctx, priority, claim_writer);
    // The PV watch feeds the volume controller and fills the claim path's PV cache.
    let pv_listed = claim_ctx.caches.volumes_listed.clone();
    let volumes = volume_controller(&runner, &volume_ctx, pv_listed, priority, volume_writer);

    let classes = tokio::spawn(class_watch);
    first_lists(&classes_listed, topology.as_ref(), stop).await;
    info!("started");

    // Each controller is a task of its own: kube-runtime polls every
    // reconcile in flight (up to --worker-threads) whenever its task wakes, so
    // sharing one task would make every PV event poll the claim reconciles
    // too, and the other way round. Dropped (a lost Lease), they are aborted.
    let sweep = sweep(&claim_ctx, tuning.snapshot_sweep, &clients.work, stop).await;
    let tracker = capacity.map(|c| own_task(capacity::run(c.tracker(&shared), stop.clone())));
    let watches = futures::future::join3(
        OptionFuture::from(attachment_watch.map(own_task)),
        OptionFuture::from(namespace_watch.map(own_task)),
        OptionFuture::from(topology_watch.map(joined)),
    );
    let work = futures::future::join5(
        own_task(claims),
        own_task(volumes),
        sweep,
        OptionFuture::from(tracker),
        watches,
    )
    .map(|_| ());
    Started {
        shared,
        classes,
        work,
    }
}

/// Returns once the classes (and the topology caches, as upstream waits for
/// its informers) hold their first lists, which claims are judged by, or
/// once `stop` fired.
async fn first_lists(
    classes: &Listed,
    topology: Option<&TopologyCaches>,
    stop: &CancellationToken,
) {
    let listed = async {
        classes.wait().await;
        if let Some(topology) = topology {
            topology.listed().await;
        }
    };
    tokio::select! {
        _ = listed => {}
        _ = stop.cancelled() => {}
    }
}

/// The claim controller, fed by the claim watch: first come, first served
/// (`controller::queue`), twice `--worker-threads` claims at a time, so that
/// the checks of the next claims overlap the creates in flight (which
/// `--worker-threads` bounds, as upstream's workers do: `claim::Context::creates`).
fn claim_controller(
    runner: &Runner,
    ctx: &Arc<claim::Context>,
    watches: &Client,
    writer: reflector::store::Writer<Claim>,
) -> impl Future<Output = ()> + Send + use<> {
    let Watched { stream, store } = claim_watch(ctx, watches, writer);
    let fifo = queue::Runner {
        workers: 2 * runner.workers,
        ctx: ctx.clone(),
        metrics: runner.metrics.work_queue("claims"),
        stop: runner.stop.clone(),
    };
    let run = fifo.run(stream, store.clone(), claim::reconcile, claim::error_policy);
    until_done_or_stopped_unready(run, store, runner.stop.clone())
}

/// The volume controller, fed by the PV watch (which also fills the claim
/// path's PV cache: `listed` says when its first list is in).
fn volume_controller(
    runner: &Runner,
    ctx: &Arc<volume::Context>,
    listed: Listed,
    watches: &Client,
    writer: reflector::store::Writer<Pv>,
) -> impl Future<Output = ()> + Send + use<> {
    runner.controller(
        "volumes",
        volume_watch(ctx, listed, watches, writer),
        volume::reconcile,
        volume::error_policy,
        ctx.clone(),
    )
}

/// The claim gauges, read from the claim cache at scrape time.
fn export_claim_gauges(metrics: &Metrics, ctx: &claim::Context) {
    let (store, driver) = (ctx.caches.claims.clone(), ctx.shared.driver.name.clone());
    metrics.read_claims_from(move || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        claim::gauges(&store.state(), &driver, now)
    });
}

/// What the shared part takes besides the driver, the clients and the class
/// cache: how the controllers report, and whether they may act.
struct Reporting {
    metrics: Arc<Metrics>,
    gate: LeaderGate,
    host: String,
    /// Capacity tracking's poke.
    capacity: Option<Arc<Notify>>,
}

/// The part every controller shares.
fn shared(
    driver: Driver,
    clients: &Clients,
    reporting: Reporting,
    classes: reflector::Store<StorageClass>,
) -> Arc<Shared> {
    let Driver { csi, info, place } = driver;
    // Upstream's event source: `<driver>_<hostname>_<uuid>`, no host.
    let component = format!("{}_{}_{}", info.name, reporting.host, random_uuid());
    info!(%component, "recording events");
    Arc::new(Shared {
        client: clients.work.clone(),
        csi,
        recorder: EventRecorder::new(
            clients.background.clone(),
            &component,
            "",
            clients.activity.clone(),
            reporting.metrics.events_dropped.clone(),
        ),
        driver: info,
        place,
        metrics: reporting.metrics,
        leader: reporting.gate,
        classes,
        capacity: reporting.capacity,
    })
}

/// The claim path's caches: claims and PVs, and the namespace and topology
/// caches when there are any.
fn claim_caches(
    volumes: reflector::Store<Pv>,
    claims: reflector::Store<Claim>,
    namespaces: Option<reflector::Store<PartialObjectMeta<Namespace>>>,
    topology: Option<TopologyCaches>,
) -> claim::Caches {
    claim::Caches {
        volumes,
        volumes_listed: Listed::default(),
        claims,
        claims_listed: Listed::default(),
        claims_progress: Progress::default(),
        namespaces,
        topology,
    }
}

/// The volume reconciler's context: the shared part, what the volume path
/// remembers, and the VolumeAttachment cache when there is one.
fn volume_context(
    shared: &Arc<Shared>,
    tuning: &Tuning,
    attachments: Option<Attachments>,
) -> Arc<volume::Context> {
    Arc::new(volume::Context {
        shared: shared.clone(),
        memory: VolumeMemory::new(tuning.retry_start, tuning.retry_max),
        attachments,
    })
}

/// The claim reconciler's context: the shared part, and the claim path's
/// options, caches, memory, intent and bounds.
fn claim_context(
    shared: &Arc<Shared>,
    clients: &Clients,
    tuning: &Tuning,
    options: ProvisionOptions,
    caches: claim::Caches,
) -> Arc<claim::Context> {
    let intent = if tuning.admission_intent {
        IntentMode::Admission(Freshness::start(FreshnessConfig {
            client: clients.priority.clone(),
            progress: caches.claims_progress.clone(),
            bucket: clients.bucket.clone(),
            metrics: shared.metrics.clone(),
            driver: shared.driver.name.clone(),
            catch_up: fresh::catch_up_for(clients.bucket.as_ref().map(SharedBucket::qps)),
            min_round: 2,
            clock: WriteClock::new(tuning.freshness_from_writes),
        }))
    } else {
        IntentMode::Write
    };
    let memory = Arc::new(ClaimMemory::new(tuning.retry_start, tuning.retry_max));
    let intents = IntentReleaser::start(
        clients.background.clone(),
        memory.clone(),
        caches.claims.clone(),
    );
    Arc::new(claim::Context {
        shared: shared.clone(),
        options,
        caches,
        memory,
        intents,
        intent,
        clone_releases: tokio::sync::Semaphore::new(tuning.cloning_protection_threads.max(1)),
        creates: tokio::sync::Semaphore::new(tuning.workers.max(1)),
    })
}

/// StorageClasses, whole but for their managedFields: the cache is all
/// there is of them (no controller), `listed` once the first list is in.
fn class_watch(
    client: &Client,
    writer: reflector::store::Writer<StorageClass>,
    listed: Listed,
) -> impl Future<Output = ()> + Send + use<> {
    cached_stream::<StorageClass, _>(
        client,
        writer,
        listed,
        Progress::default(),
        drop_managed_fields,
        |_| true,
        |_| {},
    )
    .for_each(|_| async {})
}

/// VolumeAttachments, for a driver that publishes volumes (upstream watches
/// them then, and only then): the volume path waits while one names a PV.
/// Kept without managedFields and status; the watch ends with `stop`.
fn attachment_cache(
    client: &Client,
    driver: &DriverInfo,
    stop: &CancellationToken,
) -> Option<(Attachments, impl Future<Output = ()> + Send + use<>)> {
    if !driver.capabilities.publish_unpublish_volume {
        return None;
    }
    info!("the driver publishes volumes: watching VolumeAttachments");
    let (store, writer) = reflector::store();
    let listed = Listed::default();
    let stop = stop.clone();
    let watch = cached_stream::<VolumeAttachment, _>(
        client,
        writer,
        listed.clone(),
        Progress::default(),
        |va| {
            drop_managed_fields(va);
            va.status = None;
        },
        |_| true,
        |_| {},
    )
    .take_until(async move { stop.cancelled().await })
    .for_each(|_| async {});
    Some((Attachments { store, listed }, watch))
}

/// Namespaces, when requests carry their labels or annotations
/// (`--extra-create-metadata-namespace-*`): their metadata alone (the API
/// server sends nothing else), kept with only the listed keys. The claim
/// path reads a namespace the cache does not have yet; the watch ends with
/// `stop`.
fn namespace_cache(
    client: &Client,
    keys: &MetadataConfig,
    stop: &CancellationToken,
) -> Option<(
    reflector::Store<PartialObjectMeta<Namespace>>,
    impl Future<Output = ()> + Send + use<>,
)> {
    if !keys.needs_namespace() {
        return None;
    }
    info!("requests carry namespace metadata: watching namespaces (metadata only)");
    let (store, writer) = reflector::store();
    let (labels, annotations) = (
        keys.namespace_labels.clone(),
        keys.namespace_annotations.clone(),
    );
    let trim = move |ns: &mut PartialObjectMeta<Namespace>| {
        let meta = std::mem::take(&mut ns.metadata);
        ns.metadata = ObjectMeta {
            name: meta.name,
            uid: meta.uid,
            resource_version: meta.resource_version,
            labels: only(meta.labels, &labels),
            annotations: only(meta.annotations, &annotations),
            ..Default::default()
        };
    };
    let stop = stop.clone();
    let watch = source_stream(
        Metadata(Api::<Namespace>::all(client.clone())),
        writer,
        Listed::default(),
        Progress::default(),
        trim,
        |_| true,
        |_| {},
    )
    .take_until(async move { stop.cancelled().await })
    .for_each(|_| async {});
    Some((store, watch))
}

/// The CSINodes and Nodes, when claims get their topology from the cluster
/// (`topo::served`, a central replica; one per node has its topology from
/// `NodeGetInfo`, as upstream): CSINodes cut to our driver's keys, Nodes as
/// metadata alone cut to name and labels. Spawned at once; the watches end
/// with `stop`.
fn topology_cache(
    client: &Client,
    driver: &Driver,
    options: &ProvisionOptions,
    stop: &CancellationToken,
) -> Option<(TopologyCaches, AbortOnDropHandle<()>)> {
    if !topo::served(&driver.info, options) || !driver.place.reads_cluster_topology() {
        return None;
    }
    info!("the driver reports topology: watching CSINodes and Nodes (metadata only)");
    let (csinodes, csinode_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let caches = TopologyCaches {
        driver: driver.info.name.clone(),
        csinodes,
        csinodes_listed: Listed::default(),
        nodes,
        nodes_listed: Listed::default(),
    };
    let name = caches.driver.clone();
    let csinode_watch = source_stream(
        Api::<CSINode>::all(client.clone()),
        csinode_writer,
        caches.csinodes_listed.clone(),
        Progress::default(),
        move |c: &mut CSINode| topology::trim_csinode(c, &name),
        |_| true,
        |_| {},
    )
    .for_each(|_| async {});
    let node_watch = source_stream(
        Metadata(Api::<Node>::all(client.clone())),
        node_writer,
        caches.nodes_listed.clone(),
        Progress::default(),
        topology::trim_node,
        |_| true,
        |_| {},
    )
    .for_each(|_| async {});
    let stop = stop.clone();
    let watch = async move {
        tokio::select! {
            _ = futures::future::join(csinode_watch, node_watch) => {}
            _ = stop.cancelled() => {}
        }
    };
    Some((caches, AbortOnDropHandle::new(tokio::spawn(watch))))
}

/// The entries of `map` whose keys are listed.
fn only(
    map: Option<std::collections::BTreeMap<String, String>>,
    keys: &[String],
) -> Option<std::collections::BTreeMap<String, String>> {
    let kept: std::collections::BTreeMap<_, _> =
        map?.into_iter().filter(|(k, _)| keys.contains(k)).collect();
    (!kept.is_empty()).then_some(kept)
}

/// Claims, in the claim cache: only those with work left, trimmed; a
/// deleted claim is forgotten.
fn claim_watch(
    ctx: &Arc<claim::Context>,
    client: &Client,
    writer: reflector::store::Writer<Claim>,
) -> Watched<impl Stream<Item = Result<Claim, watcher::Error>> + Send + use<>, Claim> {
    let memory = ctx.memory.clone();
    let store = writer.as_reader();
    let stream = cached_stream::<Claim, _>(
        client,
        writer,
        ctx.caches.claims_listed.clone(),
        ctx.caches.claims_progress.clone(),
        claim::trim,
        claim::cached,
        move |event| claim::forget_deleted(&memory, event),
    );
    Watched { stream, store }
}

/// PVs, in their slim shape, `listed` once the first list is in; a deleted
/// PV is forgotten.
fn volume_watch(
    ctx: &Arc<volume::Context>,
    listed: Listed,
    client: &Client,
    writer: reflector::store::Writer<Pv>,
) -> Watched<impl Stream<Item = Result<Pv, watcher::Error>> + Send + use<>, Pv> {
    let store = writer.as_reader();
    let forget = ctx.clone();
    // Of another driver's PV only its name and claim reference are kept: the
    // claim path must see a PV under a claim's name bound to another claim, and
    // nothing else of it is read (the volume path leaves it alone).
    let driver = ctx.shared.driver.name.clone();
    let trim = move |pv: &mut Pv| {
        pv.trim();
        if !volume::decide::is_ours(pv, &driver) {
            pv.keep_claim_ref_only();
        }
    };
    let stream = source_stream(
        Api::<Pv>::all(client.clone()),
        writer,
        listed,
        Progress::default(),
        trim,
        |_| true,
        move |event| volume::forget_deleted(&forget.memory, event),
    );
    // Only PVs with something to do are queued (`volume::queues`).
    let queues = ctx.clone();
    let stream = stream.try_filter(move |pv| std::future::ready(volume::queues(&queues, pv)));
    Watched { stream, store }
}

/// A cached watch: what triggers the reconciles, and the store they read.
pub(super) struct Watched<S, K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    stream: S,
    store: reflector::Store<K>,
}

/// How every controller runs: `--worker-threads` reconciles at once, counted
/// as upstream's work queues, stopped gracefully by `stop`.
struct Runner {
    config: controller::Config,
    workers: usize,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Runner {
    fn new(workers: usize, metrics: &Arc<Metrics>, stop: &CancellationToken) -> Runner {
        Runner {
            config: controller::Config::default().concurrency(workers as u16),
            workers,
            metrics: metrics.clone(),
            stop: stop.clone(),
        }
    }

    /// The controller of `watched`: `reconcile` for each object it triggers,
    /// `error_policy` after each failure, measured as the work queue `queue`
    /// (upstream's name, as the workqueue_* metrics label it). Runs until its
    /// graceful shutdown ends, or until stopped before its first list.
    fn controller<K, S, C, R, F, E, P>(
        &self,
        queue: &str,
        watched: Watched<S, K>,
        reconcile: R,
        error_policy: P,
        ctx: Arc<C>,
    ) -> impl Future<Output = ()> + Send + 'static + use<K, S, C, R, F, E, P>
    where
        K: Cached,
        S: Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        C: Send + Sync + 'static,
        R: FnMut(Arc<K>, Arc<C>) -> F + Send + 'static,
        F: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<C>) -> Action + Send + Sync + 'static,
    {
        let queue = self.metrics.work_queue(queue);
        let shutdown = self.stop.clone();
        let Watched { stream, store } = watched;
        let controller = Controller::for_stream(stream, store.clone())
            .with_config(self.config.clone())
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(
                queue.reconciler(reconcile),
                queue.error_policy(error_policy),
                ctx,
            )
            .for_each(|_| async {});
        until_done_or_stopped_unready(controller, store, self.stop.clone())
    }
}

/// Capacity tracking, set up before anything else runs: its own client, the
/// owner of its objects, its gauges, and the poke the reconcilers give it.
pub(super) struct Capacity {
    config: CapacityConfig,
    client: Client,
    owner: Option<OwnerReference>,
    gauges: capacity::Gauges,
    trigger: Arc<Notify>,
}

impl Capacity {
    /// Capacity tracking has a client of its own (upstream:
    /// `--kube-api-capacity-qps/-burst`), and finds the owner of its objects
    /// before anything else, fatal on errors as upstream.
    pub(super) async fn prepare(
        config: CapacityConfig,
        clients: &Clients,
        driver: &DriverInfo,
        registry: &mut Registry,
    ) -> Result<Capacity, FatalError> {
        let client = clients.limited(config.rate_limit).await?;
        capacity::probe(&client, &config.namespace).await?;
        let owner = match &config.owner {
            None => None,
            Some(o) => Some(capacity::owner(&client, &config.namespace, o).await?),
        };
        if !driver.capabilities.get_capacity {
            warn!(
                "--enable-capacity: the driver does not report the GET_CAPACITY capability; GetCapacity calls will fail"
            );
        }
        Ok(Capacity {
            config,
            client,
            owner,
            gauges: capacity::Gauges::register(registry),
            trigger: Arc::new(Notify::new()),
        })
    }

    /// The tracker, reading the driver, the placement and the class cache
    /// of `shared`.
    fn tracker(self, shared: &Shared) -> capacity::Tracker {
        capacity::Tracker {
            csi: shared.csi.clone(),
            driver: shared.driver.name.clone(),
            place: shared.place.clone(),
            classes: shared.classes.clone(),
            client: self.client,
            config: self.config,
            owner: self.owner,
            gauges: self.gauges,
            trigger: self.trigger,
            managed_by: shared.place.managed_by(),
        }
    }
}

/// The orphan sweep of snapshot source protection, as upstream only when the
/// driver restores snapshots and the API server serves them.
async fn sweep(
    ctx: &claim::Context,
    every: Option<Duration>,
    client: &Client,
    stop: &CancellationToken,
) -> OptionFuture<impl Future<Output = ()> + use<>> {
    let every = match every {
        Some(every)
            if ctx.shared.driver.capabilities.create_delete_snapshot
                && serves_volume_snapshots(client).await =>
        {
            every
        }
        _ => return None.into(),
    };
    info!(?every, "sweeping orphaned snapshot source protection");
    Some(own_task(snapshot_sweep::run(
        Sweep::of(ctx),
        every,
        stop.clone(),
    )))
    .into()
}

/// Runs `work` as a task of its own, aborted when the returned future is
/// dropped; a panic in it is a panic of the caller, as if it ran inline.
async fn own_task(work: impl Future<Output = ()> + Send + 'static) {
    joined(AbortOnDropHandle::new(tokio::spawn(work))).await
}

/// A task spawned already, as [`own_task`] runs it: aborted when the
/// returned future is dropped, its panic the caller's.
async fn joined(task: AbortOnDropHandle<()>) {
    match task.await {
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
    controller: impl Future<Output = ()>,
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
