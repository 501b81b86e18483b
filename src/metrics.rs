//! Prometheus metrics with upstream's names and labels, so existing dashboards
//! keep working. One registry is built in `main`; components get an
//! `Arc<Metrics>` and record into typed families. The `process_*` metrics that
//! upstream gets from client_golang are read from `/proc` on each scrape.
//! The `workqueue_*` metrics describe kube-runtime's controllers through the
//! reconcile and error-policy functions they call ([`WorkQueueMetrics`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of `csi_sidecar_operations_seconds` (upstream csi-lib-utils).
const CSI_OP_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];
/// Prometheus client default buckets, as upstream's controller histograms use.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets of the work-queue histograms: 1 µs to 1000 s, ×10 each
/// (upstream: component-base metrics/prometheus/workqueue).
const WORKQUEUE_BUCKETS: [f64; 10] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0];

/// Labels of `csi_sidecar_operations_seconds`. `migrated` exists only when
/// the driver is the target of an in-tree plugin's migration (upstream then
/// adds the label to every call: `true` for the create and delete of a
/// migrated volume, `false` for the rest); otherwise it is absent.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct CsiOperationLabels {
    pub driver_name: String,
    pub method_name: String,
    pub grpc_status_code: String,
    pub migrated: Option<bool>,
}

impl EncodeLabelSet for CsiOperationLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut labels = vec![
            ("driver_name", self.driver_name.as_str()),
            ("method_name", self.method_name.as_str()),
            ("grpc_status_code", self.grpc_status_code.as_str()),
        ];
        if let Some(migrated) = self.migrated {
            labels.push(("migrated", if migrated { "true" } else { "false" }));
        }
        labels.encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    pub class: String,
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub name: String,
}

/// A step of a claim's provisioning (`csi_provisioner_provision_stage_seconds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `check`: the authoritative check (the fenced intent write, a
    /// freshness round or a read); `create_volume`; `save_pv`.
    pub stage: String,
}

/// How a claim's freshness check was answered
/// (`csi_provisioner_freshness_checks_total`): `alone` (read on its own:
/// nothing else waited), `caught_up` (the cache caught up with a shared
/// round's version), `timed_out` (it did not, in time: a listing round then
/// answers), `listed` (a listing round answered the claim itself), `failed`
/// (the API server could not be asked: read on its own).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FreshnessLabels {
    pub outcome: String,
}

/// A kind of freshness round (`csi_provisioner_freshness_round_size`):
/// `version` (a list of at most one claim, for the API server's version) or
/// `listing` (the claims pending for us, each answering for itself).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoundLabels {
    pub round: String,
}

/// Why an event was not sent (`csi_provisioner_events_dropped_total`):
/// `queue_full` (recorded while the queue was full), `over_budget` (client-go's
/// spam filter: over the object's 25, or within its 5 minutes), `failed` (the
/// API server refused it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    pub why: String,
}

/// An object kind, for `csi_provisioner_stale_cache_answers_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    /// `claim` or `pv`.
    pub object: String,
}

/// What the claim cache says now, for the gauges read at scrape time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClaimGauges {
    /// Claims of our driver holding the provisioning intent.
    pub holding_intent: u64,
    /// Seconds since the oldest of them was created.
    pub oldest_intent_age: f64,
    /// Claims of our driver waiting for a volume (not bound, not deleted).
    pub waiting: u64,
    /// Seconds since the oldest of them was created.
    pub oldest_waiting_age: f64,
}

/// Where [`ClaimGauges`] come from: set once the claim cache exists.
type ClaimReading = Arc<Mutex<Option<Box<dyn Fn() -> ClaimGauges + Send + Sync>>>>;

/// A work queue, by upstream's queue name (`claims`, `volumes`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub name: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    pub csi_operations: HistogramFamily<CsiOperationLabels>,
    pub provision_total: Family<ClaimLabels, Counter>,
    pub provision_failed_total: Family<ClaimLabels, Counter>,
    pub provision_duration: HistogramFamily<ClaimLabels>,
    pub delete_total: Family<VolumeLabels, Counter>,
    pub delete_failed_total: Family<VolumeLabels, Counter>,
    pub delete_duration: HistogramFamily<VolumeLabels>,
    pub leader_status: Family<LeaseLabels, Gauge>,
    /// Lease renewals that had to read the Lease first (client-go's slow path).
    pub leader_slowpath: Family<LeaseLabels, Counter>,
    pub queue_adds: Family<QueueLabels, Counter>,
    pub queue_work_duration: HistogramFamily<QueueLabels>,
    pub queue_retries: Family<QueueLabels, Counter>,
    /// Reconciles in flight, per queue: read at scrape time.
    processing: Processing,
    /// Scrapes of the metrics path by HTTP status code (promhttp's handler
    /// metrics; upstream starts the codes 200, 500 and 503 at zero).
    pub scrapes: Family<CodeLabels, Counter>,
    pub scrapes_in_flight: Gauge,
    /// Ours (no upstream counterpart): how long each step of a claim's
    /// provisioning takes, answers that showed our cache stale, and the
    /// claims holding the intent or waiting, read at scrape time.
    pub provision_stage: HistogramFamily<StageLabels>,
    pub stale_cache_answers: Family<ObjectLabels, Counter>,
    /// Ours: how each freshness check (policy mode) was answered, and how
    /// many claims each round served.
    pub freshness_checks: Family<FreshnessLabels, Counter>,
    pub freshness_round_size: HistogramFamily<RoundLabels>,
    /// Ours: events not sent, by why.
    pub events_dropped: Family<DroppedLabels, Counter>,
    claims: ClaimCollector,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: String,
}

fn csi_histogram() -> Histogram {
    Histogram::new(CSI_OP_BUCKETS)
}

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// Claims per round: 1 to 2,048.
fn round_size_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        1.0, 2.0, 12,
    ))
}

fn workqueue_histogram() -> Histogram {
    Histogram::new(WORKQUEUE_BUCKETS)
}

impl Metrics {
    /// The metric families, empty but for the scrape counts upstream starts at zero.
    fn families() -> Metrics {
        let m = Metrics {
            csi_operations: Family::new_with_constructor(csi_histogram),
            provision_total: Family::default(),
            provision_failed_total: Family::default(),
            provision_duration: Family::new_with_constructor(default_histogram),
            delete_total: Family::default(),
            delete_failed_total: Family::default(),
            delete_duration: Family::new_with_constructor(default_histogram),
            leader_status: Family::default(),
            leader_slowpath: Family::default(),
            queue_adds: Family::default(),
            queue_work_duration: Family::new_with_constructor(workqueue_histogram),
            queue_retries: Family::default(),
            processing: Processing::default(),
            scrapes: Family::default(),
            scrapes_in_flight: Gauge::default(),
            provision_stage: Family::new_with_constructor(csi_histogram),
            stale_cache_answers: Family::default(),
            freshness_checks: Family::default(),
            freshness_round_size: Family::new_with_constructor(round_size_histogram),
            events_dropped: Family::default(),
            claims: ClaimCollector::default(),
        };
        for why in ["queue_full", "over_budget", "failed"] {
            m.events_dropped
                .get_or_create(&DroppedLabels { why: why.into() })
                .inc_by(0);
        }
        for object in ["claim", "pv"] {
            m.stale_cache_answers
                .get_or_create(&ObjectLabels {
                    object: object.into(),
                })
                .inc_by(0);
        }
        for code in ["200", "500", "503"] {
            m.scrapes
                .get_or_create(&CodeLabels { code: code.into() })
                .inc_by(0);
        }
        m
    }

    /// Creates the metric families and registers them in `registry` under
    /// upstream's names, all in this one place.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::families();
        registry.register(
            "csi_sidecar_operations_seconds",
            "Duration of CSI calls, by driver, gRPC method and status code",
            m.csi_operations.clone(),
        );
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Claims provisioned successfully",
            m.provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Failed provisioning attempts",
            m.provision_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Seconds from the first provisioning attempt of a claim to its saved PV",
            m.provision_duration.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Volumes deleted successfully",
            m.delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Failed volume deletion attempts",
            m.delete_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Seconds taken to delete a volume and its PV",
            m.delete_duration.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the lease, else 0",
            m.leader_status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Lease renewals that had to read the Lease before updating it, by lease name",
            m.leader_slowpath.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Items taken up by a controller (each becomes one reconcile), by queue name",
            m.queue_adds.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds one reconcile of an item takes",
            m.queue_work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Failed reconciles requeued with per-item backoff",
            m.queue_retries.clone(),
        );
        registry.register(
            "promhttp_metric_handler_requests",
            "Total number of scrapes by HTTP status code.",
            m.scrapes.clone(),
        );
        registry.register(
            "promhttp_metric_handler_requests_in_flight",
            "Current number of scrapes being served.",
            m.scrapes_in_flight.clone(),
        );
        m.register_ours(registry);
        registry.register_collector(Box::new(m.processing.clone()));
        registry.register_collector(Box::new(ProcessCollector));
        m
    }

    /// The metrics of the work queue `name` (upstream's queue names), its
    /// series present (at zero) from now on, as client-go creates them with
    /// the queue.
    pub fn work_queue(&self, name: &str) -> WorkQueueMetrics {
        let labels = QueueLabels { name: name.into() };
        self.processing
            .0
            .lock()
            .expect("poisoned")
            .entry(name.into())
            .or_default();
        WorkQueueMetrics {
            name: name.into(),
            adds: self.queue_adds.get_or_create(&labels).clone(),
            work_duration: self.queue_work_duration.get_or_create(&labels).clone(),
            retries: self.queue_retries.get_or_create(&labels).clone(),
            processing: self.processing.clone(),
        }
    }

    /// Our own metrics (no upstream counterpart), under `csi_provisioner_`.
    fn register_ours(&self, registry: &mut Registry) {
        registry.register(
            "csi_provisioner_provision_stage_seconds",
            "Seconds one step of a claim's provisioning took: the authoritative check (stage=check), CreateVolume, saving the PV",
            self.provision_stage.clone(),
        );
        registry.register(
            "csi_provisioner_stale_cache_answers",
            "Authoritative checks that found the cached copy stale (a fenced write refused, a round or read showing a newer object), by object",
            self.stale_cache_answers.clone(),
        );
        registry.register(
            "csi_provisioner_freshness_checks",
            "Freshness checks of policy mode by how they were answered: alone (read on its own), caught_up (the cache caught up with a shared round), timed_out (it did not in time), listed (a listing round answered the claim itself), failed",
            self.freshness_checks.clone(),
        );
        registry.register(
            "csi_provisioner_freshness_round_size",
            "Claims one freshness round answered, by round: version (the API server's version of claims) or listing (the claims pending for us)",
            self.freshness_round_size.clone(),
        );
        registry.register(
            "csi_provisioner_events_dropped",
            "Events not sent, by why: queue_full (recorded while the queue was full), over_budget (client-go's spam filter), failed (the API server refused it)",
            self.events_dropped.clone(),
        );
        registry.register_collector(Box::new(self.claims.clone()));
    }

    /// Counts one freshness check answered so (`FreshnessLabels`).
    pub fn freshness(&self, outcome: &str) {
        self.freshness_checks
            .get_or_create(&FreshnessLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Records the members of one freshness round of kind `round`.
    pub fn round(&self, round: &str, members: usize) {
        self.freshness_round_size
            .get_or_create(&RoundLabels {
                round: round.into(),
            })
            .observe(members as f64);
    }

    /// Where the claim gauges are read from at scrape time (the claim cache,
    /// once it exists; until then they are not exported).
    pub fn read_claims_from(&self, reading: impl Fn() -> ClaimGauges + Send + Sync + 'static) {
        *self.claims.0.lock().expect("poisoned") = Some(Box::new(reading));
    }

    /// Runs `step`, timed as the provisioning stage `stage` (whatever it answers).
    pub async fn stage<T>(&self, stage: &str, step: impl std::future::Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let answer = step.await;
        self.provision_stage
            .get_or_create(&StageLabels {
                stage: stage.into(),
            })
            .observe(started.elapsed().as_secs_f64());
        answer
    }

    /// Counts an answer that showed the cache's copy of `object` stale.
    pub fn stale(&self, object: &str) {
        self.stale_cache_answers
            .get_or_create(&ObjectLabels {
                object: object.into(),
            })
            .inc();
    }

    /// A registry-less instance for unit tests and tools.
    pub fn unregistered() -> Metrics {
        Metrics::register(&mut Registry::default())
    }
}

/// The claim gauges, read at scrape time from what [`Metrics::read_claims_from`] set.
#[derive(Clone, Default)]
struct ClaimCollector(ClaimReading);

impl std::fmt::Debug for ClaimCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimCollector")
    }
}

impl Collector for ClaimCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(g) = self.0.lock().expect("poisoned").as_ref().map(|read| read()) else {
            return Ok(());
        };
        let gauges = [
            (
                "csi_provisioner_claims_holding_intent",
                "Claims of the driver holding the provisioning intent now",
                g.holding_intent as f64,
            ),
            (
                "csi_provisioner_oldest_intent_claim_age_seconds",
                "Seconds since the oldest claim holding the intent was created (0: none)",
                g.oldest_intent_age,
            ),
            (
                "csi_provisioner_claims_waiting",
                "Claims of the driver waiting for a volume now (not bound, not deleted)",
                g.waiting as f64,
            ),
            (
                "csi_provisioner_oldest_waiting_claim_age_seconds",
                "Seconds since the oldest claim waiting for a volume was created (0: none)",
                g.oldest_waiting_age,
            ),
        ];
        for (name, help, value) in gauges {
            let family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            ConstGauge::new(value).encode(family)?;
        }
        Ok(())
    }
}

/// Start times of the reconciles in flight, by queue name, then by a
/// per-reconcile id (kube-runtime never runs one object twice at once, but
/// an id needs no such promise).
#[derive(Clone, Debug, Default)]
struct Processing(Arc<Mutex<BTreeMap<String, InFlight>>>);

#[derive(Debug, Default)]
struct InFlight {
    next_id: u64,
    started: HashMap<u64, Instant>,
}

impl InFlight {
    /// (sum of the ages, oldest age) in seconds, as client-go's
    /// `updateUnfinishedWork` computes them.
    fn ages(&self, now: Instant) -> (f64, f64) {
        self.started.values().fold((0.0, 0.0), |(sum, oldest), t| {
            let age = now.saturating_duration_since(*t).as_secs_f64();
            (sum + age, f64::max(oldest, age))
        })
    }
}

/// `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds`, computed at scrape time
/// (client-go recomputes them every 500 ms; a scrape never sees them stale).
impl Collector for Processing {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let (mut unfinished, mut longest) = (Vec::new(), Vec::new());
        for (name, q) in self.0.lock().expect("poisoned").iter() {
            let (sum, oldest) = q.ages(now);
            let labels = QueueLabels { name: name.clone() };
            unfinished.push((labels.clone(), sum));
            longest.push((labels, oldest));
        }
        let gauges = [
            (
                "workqueue_unfinished_work_seconds",
                "Seconds of work in progress not yet observed by work_duration; \
                 its rate of increase is the number of stuck reconciles",
                unfinished,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "Seconds the longest-running reconcile of the queue has been running",
                longest,
            ),
        ];
        for (name, help, values) in gauges {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (labels, seconds) in &values {
                ConstGauge::new(*seconds).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// One controller's queue as client-go's work-queue metrics describe it.
/// kube-runtime keeps its queue to itself, so what is measured is what a
/// controller does with it: each reconcile is one item added and taken
/// (`workqueue_adds_total`), its duration is the work duration, and every
/// call of the error policy (a failed reconcile requeued with backoff, as
/// upstream's `AddRateLimited`) is a retry. See docs/compatibility.md.
#[derive(Clone)]
pub struct WorkQueueMetrics {
    name: String,
    adds: Counter,
    work_duration: Histogram,
    retries: Counter,
    processing: Processing,
}

impl WorkQueueMetrics {
    /// Wraps a reconcile function (`Controller::run`'s first argument).
    pub fn reconciler<A, B, Fut, R>(
        &self,
        mut reconcile: R,
    ) -> impl FnMut(A, B) -> BoxFuture<'static, Fut::Output> + use<A, B, Fut, R>
    where
        R: FnMut(A, B) -> Fut,
        Fut: Future + Send + 'static,
    {
        let queue = self.clone();
        move |object, ctx| {
            let work = queue.start();
            let reconciled = reconcile(object, ctx);
            async move {
                let out = reconciled.await;
                work.done();
                out
            }
            .boxed()
        }
    }

    /// Wraps an error policy (`Controller::run`'s second argument).
    pub fn error_policy<A, E, C, R, P>(
        &self,
        policy: P,
    ) -> impl Fn(A, &E, C) -> R + use<A, E, C, R, P>
    where
        P: Fn(A, &E, C) -> R,
    {
        let retries = self.retries.clone();
        move |object, error: &E, ctx| {
            retries.inc();
            policy(object, error, ctx)
        }
    }

    /// One item taken up by a queue of ours (`controller::queue`), as [`Self::reconciler`]
    /// counts one: in flight until [`Work::done`] (or dropped).
    pub fn begin(&self) -> Work {
        self.start()
    }

    /// One failed run, as [`Self::error_policy`] counts one.
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// One item taken up: counted, and in flight until the guard is dropped.
    fn start(&self) -> Work {
        self.adds.inc();
        let started = Instant::now();
        let mut queues = self.processing.0.lock().expect("poisoned");
        let q = queues.entry(self.name.clone()).or_default();
        let id = q.next_id;
        q.next_id += 1;
        q.started.insert(id, started);
        Work {
            queue: self.clone(),
            id,
            started,
        }
    }
}

/// A reconcile in flight. Dropped unfinished (its task cancelled at a
/// forced shutdown), it leaves the in-flight set without a duration.
pub struct Work {
    queue: WorkQueueMetrics,
    id: u64,
    started: Instant,
}

impl Work {
    pub fn done(self) {
        self.queue
            .work_duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if let Some(q) = self
            .queue
            .processing
            .0
            .lock()
            .expect("poisoned")
            .get_mut(&self.queue.name)
        {
            q.started.remove(&self.id);
        }
    }
}

/// Linux reports CPU times in /proc in units of USER_HZ, which the kernel ABI
/// fixes at 100 on every architecture (client_golang's procfs assumes the same).
const USER_HZ: f64 = 100.0;

/// The `process_*` metrics of client_golang's process collector, read from
/// `/proc/self` at scrape time. Nothing is exported where `/proc` is missing.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<f64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Some(p.virtual_bytes),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                p.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let gauge = ConstGauge::new(v);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    virtual_bytes: f64,
    resident_bytes: Option<f64>,
    start_time_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
}

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let stat = parse_stat(&read("/proc/self/stat")?)?;
        let boot_time = read("/proc/stat").and_then(|s| parse_boot_time(&s));
        Some(ProcessStats {
            cpu_seconds: (stat.utime + stat.stime) as f64 / USER_HZ,
            virtual_bytes: stat.vsize as f64,
            resident_bytes: read("/proc/self/status").and_then(|s| parse_rss_bytes(&s)),
            start_time_seconds: boot_time.map(|b| b as f64 + stat.start_ticks as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as f64),
            max_fds: read("/proc/self/limits").and_then(|s| parse_max_fds(&s)),
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
    vsize: u64,
}

/// `/proc/self/stat`: fields are space-separated, but the second (the command
/// name, in parentheses) may itself hold spaces and parentheses, so counting
/// starts after its last `)`. The first field after it is field 3 (`state`).
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
    })
}

/// `btime` of `/proc/stat`: boot time in seconds since the epoch.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS:` of `/proc/self/status`, in kB (no page-size assumption needed).
fn parse_rss_bytes(text: &str) -> Option<f64> {
    let line = text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024.0)
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn parse_max_fds(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_after_the_command_name_even_with_spaces_and_parentheses() {
        let line = "4242 (csi (prov) x) S 1 4242 4242 0 -1 4194560 1200 0 3 0 \
                    250 75 0 0 20 0 9 0 123456 98765432 4321 18446744073709551615 \
                    1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                start_ticks: 123456,
                vsize: 98765432,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn status_limits_and_boot_time() {
        let status = "Name:\tcsi-provisioner\nVmPeak:\t  9000 kB\nVmRSS:\t    2048 kB\n";
        assert_eq!(parse_rss_bytes(status), Some(2048.0 * 1024.0));
        assert_eq!(parse_rss_bytes("Name: x\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024.0));
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    /// The value of the series `series` (name and labels as exported).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    }

    #[test]
    fn the_migrated_label_is_there_only_for_a_migration_target() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        for (driver, migrated) in [("d", None), ("ebs.csi.aws.com", Some(true))] {
            m.csi_operations
                .get_or_create(&CsiOperationLabels {
                    driver_name: driver.into(),
                    method_name: "/csi.v1.Controller/CreateVolume".into(),
                    grpc_status_code: "OK".into(),
                    migrated,
                })
                .observe(0.2);
        }
        let text = scrape(&registry);
        for series in [
            "csi_sidecar_operations_seconds_count{driver_name=\"d\",method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"OK\"}",
            "csi_sidecar_operations_seconds_count{driver_name=\"ebs.csi.aws.com\",method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"OK\",migrated=\"true\"}",
        ] {
            assert_eq!(sample(&text, series), Some(1.0), "{series} in:\n{text}");
        }
    }

    #[test]
    fn work_queue_series_exist_at_zero_once_the_queue_is_named() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let _claims = m.work_queue("claims");
        let text = scrape(&registry);
        for series in [
            "workqueue_adds_total{name=\"claims\"}",
            "workqueue_retries_total{name=\"claims\"}",
            "workqueue_work_duration_seconds_count{name=\"claims\"}",
            "workqueue_unfinished_work_seconds{name=\"claims\"}",
            "workqueue_longest_running_processor_seconds{name=\"claims\"}",
        ] {
            assert_eq!(sample(&text, series), Some(0.0), "{series} in:\n{text}");
        }
        // client-go's buckets: 1 µs to 1000 s, ×10 each.
        let bounds: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix("workqueue_work_duration_seconds_bucket{le=\""))
            .map(|l| l.split('"').next().unwrap().parse().unwrap())
            .collect();
        let mut want: Vec<f64> = WORKQUEUE_BUCKETS.to_vec();
        want.push(f64::INFINITY);
        assert_eq!(bounds, want);
        assert!(!text.contains("name=\"volumes\""), "{text}");
    }

    #[tokio::test]
    async fn a_reconcile_is_in_flight_until_it_ends_and_then_counts_its_duration() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let queue = m.work_queue("volumes");
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let finished = Mutex::new(Some(finished));
        let mut reconcile = queue.reconciler(|n: u32, _ctx: ()| {
            let wait = finished.lock().unwrap().take();
            async move {
                if let Some(w) = wait {
                    let _ = w.await;
                }
                Ok::<u32, String>(n)
            }
        });
        let running = tokio::spawn(reconcile(7, ()));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let text = scrape(&registry);
        let unfinished =
            sample(&text, "workqueue_unfinished_work_seconds{name=\"volumes\"}").unwrap();
        let longest = sample(
            &text,
            "workqueue_longest_running_processor_seconds{name=\"volumes\"}",
        )
        .unwrap();
        assert!(unfinished >= 0.04 && longest >= 0.04, "{text}");
        assert_eq!(
            sample(&text, "workqueue_adds_total{name=\"volumes\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "workqueue_work_duration_seconds_count{name=\"volumes\"}"
            ),
            Some(0.0),
            "not observed while running"
        );

        finish.send(()).unwrap();
        assert_eq!(running.await.unwrap(), Ok(7));
        let quick = reconcile(8, ()).await;
        assert_eq!(quick, Ok(8));
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, "workqueue_adds_total{name=\"volumes\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "workqueue_work_duration_seconds_count{name=\"volumes\"}"
            ),
            Some(2.0)
        );
        assert!(
            sample(
                &text,
                "workqueue_work_duration_seconds_sum{name=\"volumes\"}"
            )
            .unwrap()
                >= 0.04
        );
        assert_eq!(
            sample(&text, "workqueue_unfinished_work_seconds{name=\"volumes\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "workqueue_longest_running_processor_seconds{name=\"volumes\"}"
            ),
            Some(0.0)
        );
    }

    #[tokio::test]
    async fn a_cancelled_reconcile_leaves_the_in_flight_set_without_a_duration() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let queue = m.work_queue("claims");
        let mut reconcile =
            queue.reconciler(|_: (), _: ()| std::future::pending::<Result<(), ()>>());
        let pending = reconcile((), ());
        assert!(scrape(&registry).contains("workqueue_adds_total{name=\"claims\"} 1"));
        drop(pending);
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, "workqueue_unfinished_work_seconds{name=\"claims\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                "workqueue_work_duration_seconds_count{name=\"claims\"}"
            ),
            Some(0.0)
        );
    }

    #[test]
    fn every_error_policy_call_is_a_retry() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let queue = m.work_queue("claims");
        let policy = queue.error_policy(|n: u32, e: &String, _: ()| n + e.len() as u32);
        assert_eq!(policy(1, &"ab".to_string(), ()), 3);
        assert_eq!(policy(1, &String::new(), ()), 1);
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, "workqueue_retries_total{name=\"claims\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "workqueue_adds_total{name=\"claims\"}"),
            Some(0.0)
        );
    }

    #[test]
    fn process_metrics_are_exported_with_client_golang_names() {
        let mut registry = Registry::default();
        let _m = Metrics::register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} missing from:\n{text}"
            );
        }
        let start: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started at most a day ago (this test process), never in the future.
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
    }
}
