//! The CSI services (Identity, Controller, Node) over an in-memory model of a storage backend
//! whose every change is appended to the ledger's journal before the call returns.
//!
//! Every RPC goes through [`Driver::serve`]: count the call, apply the armed faults, then run
//! the method in its own task. The task is not cancelled when the caller gives up (a deadline or
//! a dropped connection), just like a real backend keeps working on a request it accepted; that
//! is what makes "the volume may exist after a timeout" reproducible.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCapability;
use csi_proto::v1::volume_capability::access_mode::Mode as AccessMode;
use tonic::{Request, Response, Status};

use crate::book::Book;
use crate::faults::{Decision, FaultTable, Verdict};
use crate::ledger::{
    ContentSource, Journal, Ledger, OperationRecord, SnapshotRecord, VolumeRecord, now_ms,
};

/// Size given to a volume whose request has no capacity range.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// Prefix of ListVolumes page tokens; anything else is a token we never issued (ABORTED).
const TOKEN_PREFIX: &str = "after:";

/// Static behaviour of the driver, from its flags.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub name: String,
    pub vendor_version: String,
    pub node_id: String,
    pub capacity_bytes: i64,
    pub topology: Option<(String, String)>,
    pub capabilities: Vec<ControllerCapability>,
    /// Mutable parameter keys accepted (`--mutable-parameters`).
    pub mutable_keys: Vec<String>,
    pub state_dir: PathBuf,
    /// At most one CreateVolume per name and one DeleteVolume per id at a time (ABORTED otherwise).
    pub serialize_by_name: bool,
    /// Volume IDs embed the `CreateVolume` name (`vol-000001-<name>`), as many drivers' IDs do.
    pub volume_id_with_name: bool,
}

/// The driver's state, shared by the gRPC services and the control socket.
#[derive(Debug)]
pub struct Driver {
    config: DriverConfig,
    /// The ledger with its indexes. Call counters are journaled lazily (`flush_counts`); volume
    /// and snapshot changes before the call returns.
    ledger: Mutex<Book>,
    /// Taken only while `ledger` is held, so lines are in the order of the changes.
    journal: Mutex<Journal>,
    faults: FaultTable,
    ready: AtomicBool,
    /// Keys (volume names / ids) with a call in progress.
    in_flight: Mutex<std::collections::HashSet<String>>,
}

/// Holds a key of `Driver::in_flight` until dropped.
struct InFlight {
    driver: Arc<Driver>,
    key: String,
}

impl InFlight {
    fn take(driver: &Arc<Driver>, key: String) -> Option<InFlight> {
        let mut set = driver.in_flight.lock().expect("in-flight set poisoned");
        set.insert(key.clone()).then(|| InFlight {
            driver: driver.clone(),
            key,
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.driver
            .in_flight
            .lock()
            .expect("in-flight set poisoned")
            .remove(&self.key);
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// Records a call answered by an injected fault (CreateVolume/DeleteVolume keep these).
type OnInjected = Box<dyn FnOnce(&Driver, &Status) + Send>;

impl Driver {
    /// A driver over `ledger` (loaded from the state directory by the caller), journaling its
    /// changes to `journal`.
    pub fn new(config: DriverConfig, ledger: Ledger, journal: Journal, seed: u64) -> Self {
        Driver {
            config,
            ledger: Mutex::new(Book::new(ledger)),
            journal: Mutex::new(journal),
            faults: FaultTable::new(seed),
            ready: AtomicBool::new(true),
            in_flight: Mutex::new(std::collections::HashSet::new()),
        }
    }

    pub fn faults(&self) -> &FaultTable {
        &self.faults
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// A copy of the ledger as it is now.
    pub fn ledger_snapshot(&self) -> Ledger {
        Ledger::clone(&self.ledger())
    }

    /// Calls per method and the number of volumes held, without copying the ledger.
    pub fn counts(&self) -> (BTreeMap<String, u64>, usize) {
        let ledger = self.ledger();
        (ledger.calls.clone(), ledger.volumes.len())
    }

    /// Forgets a volume without a `DeleteVolume`, as when the storage system loses it or an
    /// administrator deletes it there: it leaves the ledger's volumes and no operation records
    /// it.
    pub fn lose_volume(&self, volume_id: &str) -> Result<(), String> {
        let mut ledger = self.ledger();
        if ledger.remove_volume(volume_id).is_none() {
            return Err(format!("volume {volume_id:?} not found"));
        }
        self.persist(&mut ledger)
            .map_err(|s| s.message().to_string())
    }

    /// Journals the call counters if they changed since the last line.
    pub fn flush_counts(&self) -> std::io::Result<()> {
        let mut ledger = self.ledger();
        if ledger.counts_dirty() {
            self.journal_line(&mut ledger)?;
        }
        Ok(())
    }

    fn ledger(&self) -> MutexGuard<'_, Book> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends what changed in `ledger` since the last line (one line, O(1) in the ledger's
    /// size). A line that cannot be written stays pending for the next one.
    fn journal_line(&self, ledger: &mut Book) -> std::io::Result<()> {
        let delta = ledger.take_delta();
        if delta.is_empty() {
            return Ok(());
        }
        let mut journal = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        journal.append(delta.clone()).inspect_err(|_| {
            ledger.restore_delta(delta);
        })
    }

    /// Persists a mutation before the call returns. Failing to persist is reported to the
    /// caller as INTERNAL: a ledger that silently diverges from what callers were told would
    /// make every invariant check meaningless.
    fn persist(&self, ledger: &mut Book) -> Result<(), Status> {
        self.journal_line(ledger).map_err(|err| {
            tracing::error!(%err, "cannot write the ledger");
            Status::internal(format!("test driver cannot write its ledger: {err}"))
        })
    }

    fn has(&self, capability: ControllerCapability) -> bool {
        self.config.capabilities.contains(&capability)
    }

    /// Mutable parameters need MODIFY_VOLUME, and only known keys are taken.
    fn check_mutable_parameters(&self, params: &HashMap<String, String>) -> Result<(), Status> {
        if params.is_empty() {
            return Ok(());
        }
        self.require(ControllerCapability::ModifyVolume)?;
        match params
            .keys()
            .find(|k| !self.config.mutable_keys.contains(k))
        {
            Some(key) => Err(Status::invalid_argument(format!(
                "mutable parameter {key:?} is not supported (supported: {})",
                self.config.mutable_keys.join(", ")
            ))),
            None => Ok(()),
        }
    }

    fn require(&self, capability: ControllerCapability) -> Result<(), Status> {
        if self.has(capability) {
            Ok(())
        } else {
            Err(Status::unimplemented(format!(
                "capability {} is not enabled (see --capabilities)",
                capability.as_str_name()
            )))
        }
    }

    /// Runs one RPC: count it, apply faults, run `op` in a task of its own.
    ///
    /// `on_injected` lets CreateVolume/DeleteVolume record injected failures in the ledger.
    async fn serve<Req, Resp>(
        self: &Arc<Self>,
        method: &'static str,
        request: Request<Req>,
        op: fn(&Driver, Req) -> Result<Resp, Status>,
        on_injected: Option<OnInjected>,
    ) -> Reply<Resp>
    where
        Req: std::fmt::Debug + Send + 'static,
        Resp: Send + 'static,
    {
        self.serve_keyed(method, None, request, op, on_injected)
            .await
    }

    /// Like `serve`, but at most one call per `key` (a volume name or id) is in
    /// progress at a time: a second one gets `ABORTED` ("operation pending"),
    /// as the CSI spec allows and as production drivers do with per-volume
    /// locks. The key stays taken until the call's work is done, even when the
    /// caller has given up waiting (a backend keeps working after a timeout).
    async fn serve_keyed<Req, Resp>(
        self: &Arc<Self>,
        method: &'static str,
        key: Option<String>,
        request: Request<Req>,
        op: fn(&Driver, Req) -> Result<Resp, Status>,
        on_injected: Option<OnInjected>,
    ) -> Reply<Resp>
    where
        Req: std::fmt::Debug + Send + 'static,
        Resp: Send + 'static,
    {
        let guard = match key {
            Some(k) if self.config.serialize_by_name => match InFlight::take(self, k) {
                Some(g) => Some(g),
                None => {
                    self.ledger().count_call(method);
                    return Err(Status::aborted(format!(
                        "{method}: an operation on this volume is already in progress"
                    )));
                }
            },
            _ => None,
        };
        let driver = self.clone();
        let request = request.into_inner();
        let task = tokio::spawn(async move {
            let _guard = guard;
            driver.ledger().count_call(method);
            // Debug of CSI requests redacts secrets (csi-proto), so this is safe to log.
            tracing::debug!(method, request = ?request, "call");
            let result = match driver.faults.before_call(method).await {
                Verdict::Proceed => op(&driver, request),
                Verdict::ProceedThenHold => {
                    let result = op(&driver, request);
                    match driver.faults.hold_answer(method).await {
                        Decision::Release => result,
                        Decision::Drop => Err(Status::unavailable(format!(
                            "{method}: answer dropped by the test driver (the call ran)"
                        ))),
                    }
                }
                Verdict::Dropped => Err(Status::unavailable(format!(
                    "{method}: dropped by the test driver before it ran"
                ))),
                Verdict::Fail(status) => {
                    if let Some(record) = on_injected {
                        record(&driver, &status);
                    }
                    Err(status)
                }
            };
            match &result {
                Ok(_) => tracing::debug!(method, "ok"),
                Err(status) => {
                    tracing::info!(method, code = ?status.code(), message = status.message(), "failed")
                }
            }
            result
        });
        match task.await {
            Ok(result) => result.map(Response::new),
            Err(err) => Err(Status::internal(format!("{method} task failed: {err}"))),
        }
    }

    // ---- Identity --------------------------------------------------------------------------

    fn get_plugin_info(
        &self,
        _: v1::GetPluginInfoRequest,
    ) -> Result<v1::GetPluginInfoResponse, Status> {
        Ok(v1::GetPluginInfoResponse {
            name: self.config.name.clone(),
            vendor_version: self.config.vendor_version.clone(),
            manifest: HashMap::from([("purpose".to_string(), "test driver".to_string())]),
        })
    }

    fn get_plugin_capabilities(
        &self,
        _: v1::GetPluginCapabilitiesRequest,
    ) -> Result<v1::GetPluginCapabilitiesResponse, Status> {
        use v1::plugin_capability::service::Type as ServiceType;
        let mut services = vec![ServiceType::ControllerService];
        if self.config.topology.is_some() {
            services.push(ServiceType::VolumeAccessibilityConstraints);
        }
        Ok(v1::GetPluginCapabilitiesResponse {
            capabilities: services
                .into_iter()
                .map(|t| v1::PluginCapability {
                    r#type: Some(v1::plugin_capability::Type::Service(
                        v1::plugin_capability::Service { r#type: t as i32 },
                    )),
                })
                .collect(),
        })
    }

    fn probe(&self, _: v1::ProbeRequest) -> Result<v1::ProbeResponse, Status> {
        Ok(v1::ProbeResponse {
            ready: Some(self.ready()),
        })
    }

    // ---- Controller: volumes ---------------------------------------------------------------

    fn create_volume(
        &self,
        req: v1::CreateVolumeRequest,
    ) -> Result<v1::CreateVolumeResponse, Status> {
        self.require(ControllerCapability::CreateDeleteVolume)?;
        let mut ledger = self.ledger();
        let outcome = self.create_or_find(&mut ledger, &req);
        let mut record = OperationRecord::new("CreateVolume", Some(req.name.clone()), None);
        record.content_source = content_source_of(req.volume_content_source.as_ref())
            .ok()
            .flatten();
        if let Some(requirements) = &req.accessibility_requirements {
            record.requisite = segments_of(&requirements.requisite);
            record.preferred = segments_of(&requirements.preferred);
        }
        let result = match outcome {
            Ok((volume, created)) => {
                record.volume_id = Some(volume.volume_id.clone());
                record.created = created;
                if self.faults.take_deadline_after_create() {
                    record.injected = true;
                    Err(Status::deadline_exceeded(format!(
                        "injected fault: volume {} exists, answering DEADLINE_EXCEEDED",
                        volume.volume_id
                    )))
                } else {
                    let mut message = self.volume_message(&volume);
                    if let Some(bytes) = self.faults.take_reported_capacity() {
                        record.message = format!(
                            "injected fault: reported capacity {bytes} instead of {}",
                            volume.capacity_bytes
                        );
                        record.injected = true;
                        message.capacity_bytes = bytes;
                    }
                    Ok(v1::CreateVolumeResponse {
                        volume: Some(message),
                    })
                }
            }
            Err(status) => Err(status),
        };
        if let Err(status) = &result {
            record.code = status.code().into();
            record.message = status.message().to_string();
        }
        tracing::info!(
            name = %req.name,
            volume_id = record.volume_id.as_deref().unwrap_or(""),
            code = %record.code,
            created = record.created,
            "CreateVolume"
        );
        ledger.push_operation(record);
        self.persist(&mut ledger)?;
        result
    }

    /// The CreateVolume decision: validate, then find the volume of that name or make it.
    /// Returns the volume and whether it was created by this call.
    fn create_or_find(
        &self,
        ledger: &mut Book,
        req: &v1::CreateVolumeRequest,
    ) -> Result<(VolumeRecord, bool), Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        for capability in &req.volume_capabilities {
            self.check_volume_capability(capability)?;
        }
        let (required, limit) = req
            .capacity_range
            .as_ref()
            .map(|r| (r.required_bytes, r.limit_bytes))
            .unwrap_or((0, 0));
        if required < 0 || limit < 0 {
            return Err(Status::invalid_argument(
                "capacity_range must not be negative",
            ));
        }
        if limit > 0 && required > limit {
            return Err(Status::out_of_range(format!(
                "required_bytes {required} exceeds limit_bytes {limit}"
            )));
        }
        self.check_mutable_parameters(&req.mutable_parameters)?;
        let parameters: BTreeMap<String, String> = sorted(&req.parameters);
        let content_source = content_source_of(req.volume_content_source.as_ref())?;

        let misbehaviour = self.faults.misbehaviour();
        if let Some(existing) = ledger.volume_by_name(&req.name) {
            let size_fits = (required == 0 || existing.capacity_bytes >= required)
                && (limit == 0 || existing.capacity_bytes <= limit);
            if !size_fits {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists with {} bytes, incompatible with required {required} / limit {limit}",
                    req.name, existing.capacity_bytes
                )));
            }
            if existing.parameters != parameters && !misbehaviour.create_ignores_parameters {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists with different parameters",
                    req.name
                )));
            }
            if existing.content_source != content_source {
                return Err(Status::already_exists(format!(
                    "volume {:?} exists with a different content source",
                    req.name
                )));
            }
            if !misbehaviour.create_not_idempotent {
                return Ok((existing.clone(), false));
            }
        }

        let mut size = if required > 0 {
            required
        } else if limit > 0 {
            limit.min(DEFAULT_VOLUME_SIZE)
        } else {
            DEFAULT_VOLUME_SIZE
        };
        match &content_source {
            Some(ContentSource::Snapshot { snapshot_id }) => {
                if !self.has(ControllerCapability::CreateDeleteSnapshot) {
                    return Err(Status::invalid_argument(
                        "restoring a snapshot needs the CREATE_DELETE_SNAPSHOT capability",
                    ));
                }
                let source = ledger.snapshots.get(snapshot_id).ok_or_else(|| {
                    Status::not_found(format!("snapshot {snapshot_id:?} not found"))
                })?;
                size = size.max(source.size_bytes);
                if limit > 0 && size > limit {
                    return Err(Status::out_of_range(format!(
                        "snapshot has {} bytes, more than limit_bytes {limit}",
                        source.size_bytes
                    )));
                }
            }
            Some(ContentSource::Volume { volume_id }) => {
                if !self.has(ControllerCapability::CloneVolume) {
                    return Err(Status::invalid_argument(
                        "cloning needs the CLONE_VOLUME capability",
                    ));
                }
                let source = ledger.volumes.get(volume_id).ok_or_else(|| {
                    Status::not_found(format!("source volume {volume_id:?} not found"))
                })?;
                size = size.max(source.capacity_bytes);
                if limit > 0 && size > limit {
                    return Err(Status::out_of_range(format!(
                        "source volume has {} bytes, more than limit_bytes {limit}",
                        source.capacity_bytes
                    )));
                }
            }
            None => {}
        }

        let accessible_topology = match &self.config.topology {
            Some((key, value)) => {
                if let Some(requirement) = &req.accessibility_requirements {
                    let reachable = requirement.requisite.is_empty()
                        || requirement
                            .requisite
                            .iter()
                            .any(|t| t.segments.get(key) == Some(value));
                    if !reachable {
                        return Err(Status::resource_exhausted(format!(
                            "no requisite topology contains {key}={value}"
                        )));
                    }
                }
                vec![BTreeMap::from([(key.clone(), value.clone())])]
            }
            None => Vec::new(),
        };

        let free = self.config.capacity_bytes - ledger.used_bytes();
        if size > free {
            return Err(Status::resource_exhausted(format!(
                "{size} bytes requested, {free} bytes free"
            )));
        }

        let seq = ledger.take_volume_seq();
        let volume = VolumeRecord {
            volume_id: if self.config.volume_id_with_name {
                format!("vol-{seq:06}-{}", req.name)
            } else {
                format!("vol-{seq:06}-{:08x}", rand::random::<u32>())
            },
            name: req.name.clone(),
            capacity_bytes: size,
            volume_context: parameters.clone(),
            parameters,
            mutable_parameters: sorted(&req.mutable_parameters),
            secret_keys: secret_keys(&req.secrets),
            content_source,
            accessible_topology,
            published_nodes: BTreeMap::new(),
            created_at_ms: now_ms(),
        };
        ledger.insert_volume(volume.clone());
        Ok((volume, true))
    }

    fn check_volume_capability(&self, capability: &v1::VolumeCapability) -> Result<(), Status> {
        if capability.access_type.is_none() {
            return Err(Status::invalid_argument(
                "volume capability needs an access type (block or mount)",
            ));
        }
        let mode = capability
            .access_mode
            .as_ref()
            .map(|m| AccessMode::try_from(m.mode).unwrap_or(AccessMode::Unknown))
            .unwrap_or(AccessMode::Unknown);
        match mode {
            AccessMode::Unknown => Err(Status::invalid_argument(
                "volume capability needs a known access mode",
            )),
            AccessMode::SingleNodeSingleWriter | AccessMode::SingleNodeMultiWriter
                if !self.has(ControllerCapability::SingleNodeMultiWriter) =>
            {
                Err(Status::invalid_argument(format!(
                    "access mode {} needs the SINGLE_NODE_MULTI_WRITER capability",
                    mode.as_str_name()
                )))
            }
            _ => Ok(()),
        }
    }

    fn delete_volume(
        &self,
        req: v1::DeleteVolumeRequest,
    ) -> Result<v1::DeleteVolumeResponse, Status> {
        self.require(ControllerCapability::CreateDeleteVolume)?;
        let mut ledger = self.ledger();
        let mut record = OperationRecord::new("DeleteVolume", None, Some(req.volume_id.clone()));
        record.secret_keys = secret_keys(&req.secrets);
        let result = if req.volume_id.is_empty() {
            Err(Status::invalid_argument("volume_id is required"))
        } else {
            match ledger.volumes.get(&req.volume_id) {
                Some(volume) if !volume.published_nodes.is_empty() => {
                    Err(Status::failed_precondition(format!(
                        "volume {} is still published to {:?}",
                        req.volume_id,
                        volume.published_nodes.keys().collect::<Vec<_>>()
                    )))
                }
                Some(volume) => {
                    record.name = Some(volume.name.clone());
                    ledger.remove_volume(&req.volume_id);
                    record.deleted = true;
                    Ok(v1::DeleteVolumeResponse {})
                }
                // Deleting what does not exist is success: DeleteVolume is idempotent.
                // Unless a fault makes this driver break that rule.
                None => {
                    let misbehaviour = self.faults.misbehaviour();
                    let deleted_before = ledger.was_deleted(&req.volume_id);
                    let not_found = if deleted_before {
                        misbehaviour.delete_again_not_found
                    } else {
                        misbehaviour.delete_unknown_not_found
                    };
                    if not_found {
                        record.injected = true;
                        Err(Status::not_found(format!(
                            "injected fault: volume {} not found",
                            req.volume_id
                        )))
                    } else {
                        Ok(v1::DeleteVolumeResponse {})
                    }
                }
            }
        };
        if let Err(status) = &result {
            record.code = status.code().into();
            record.message = status.message().to_string();
        }
        tracing::info!(
            volume_id = %req.volume_id,
            code = %record.code,
            deleted = record.deleted,
            "DeleteVolume"
        );
        ledger.push_operation(record);
        self.persist(&mut ledger)?;
        result
    }

    /// Records a create or delete call (of a volume or a snapshot) that an injected fault
    /// answered.
    fn record_injected(
        &self,
        method: &str,
        name: Option<String>,
        volume_id: Option<String>,
        status: &Status,
    ) {
        let mut ledger = self.ledger();
        let mut record = OperationRecord::new(method, name, volume_id);
        record.code = status.code().into();
        record.message = status.message().to_string();
        record.injected = true;
        ledger.push_operation(record);
        if let Err(err) = self.persist(&mut ledger) {
            tracing::error!(%err, "cannot record an injected fault");
        }
    }

    fn controller_publish_volume(
        &self,
        req: v1::ControllerPublishVolumeRequest,
    ) -> Result<v1::ControllerPublishVolumeResponse, Status> {
        self.require(ControllerCapability::PublishUnpublishVolume)?;
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is required"));
        }
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        self.check_volume_capability(capability)?;
        if req.readonly && !self.has(ControllerCapability::PublishReadonly) {
            return Err(Status::invalid_argument(
                "readonly publishing needs the PUBLISH_READONLY capability",
            ));
        }
        let mut ledger = self.ledger();
        let volume = ledger
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {:?} not found", req.volume_id)))?;
        if req.node_id != self.config.node_id {
            return Err(Status::not_found(format!(
                "node {:?} not found",
                req.node_id
            )));
        }
        match volume.published_nodes.get(&req.node_id) {
            Some(readonly) if *readonly != req.readonly => {
                return Err(Status::already_exists(format!(
                    "volume {} is published to {} with readonly={readonly}",
                    req.volume_id, req.node_id
                )));
            }
            Some(_) => {}
            None => {
                ledger.update_volume(&req.volume_id, |v| {
                    v.published_nodes.insert(req.node_id.clone(), req.readonly)
                });
                self.persist(&mut ledger)?;
            }
        }
        Ok(v1::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("node".to_string(), req.node_id.clone())]),
        })
    }

    fn controller_unpublish_volume(
        &self,
        req: v1::ControllerUnpublishVolumeRequest,
    ) -> Result<v1::ControllerUnpublishVolumeResponse, Status> {
        self.require(ControllerCapability::PublishUnpublishVolume)?;
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let mut ledger = self.ledger();
        let changed = match ledger.volumes.get(&req.volume_id) {
            Some(volume) if req.node_id.is_empty() => !volume.published_nodes.is_empty(),
            Some(volume) => volume.published_nodes.contains_key(&req.node_id),
            // Unknown volume: it is certainly not published anywhere.
            None => false,
        };
        if changed {
            ledger.update_volume(&req.volume_id, |volume| {
                if req.node_id.is_empty() {
                    volume.published_nodes.clear();
                } else {
                    volume.published_nodes.remove(&req.node_id);
                }
            });
            self.persist(&mut ledger)?;
        }
        Ok(v1::ControllerUnpublishVolumeResponse {})
    }

    fn validate_volume_capabilities(
        &self,
        req: v1::ValidateVolumeCapabilitiesRequest,
    ) -> Result<v1::ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let ledger = self.ledger();
        let volume = ledger
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {:?} not found", req.volume_id)))?;
        for capability in &req.volume_capabilities {
            if let Err(status) = self.check_volume_capability(capability) {
                return Ok(v1::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: status.message().to_string(),
                });
            }
        }
        Ok(v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(v1::validate_volume_capabilities_response::Confirmed {
                volume_context: volume.volume_context.clone().into_iter().collect(),
                volume_capabilities: req.volume_capabilities.clone(),
                parameters: req.parameters.clone(),
                mutable_parameters: req.mutable_parameters.clone(),
            }),
            message: String::new(),
        })
    }

    fn list_volumes(&self, req: v1::ListVolumesRequest) -> Result<v1::ListVolumesResponse, Status> {
        self.require(ControllerCapability::ListVolumes)?;
        let after = starting_after(req.max_entries, &req.starting_token)?;
        let ledger = self.ledger();
        // Tokens name the last volume returned, so deleting volumes between pages never
        // invalidates a token or repeats an entry.
        let remaining = ledger.volumes.values().filter(|v| {
            after
                .as_ref()
                .is_none_or(|after| v.volume_id.as_str() > after.as_str())
        });
        let (page, next_token) = paginate(remaining, req.max_entries, |v| &v.volume_id);
        let published_nodes = self.has(ControllerCapability::ListVolumesPublishedNodes);
        Ok(v1::ListVolumesResponse {
            entries: page
                .into_iter()
                .map(|volume| v1::list_volumes_response::Entry {
                    volume: Some(self.volume_message(volume)),
                    status: published_nodes.then(|| v1::list_volumes_response::VolumeStatus {
                        published_node_ids: volume.published_nodes.keys().cloned().collect(),
                    }),
                })
                .collect(),
            next_token,
        })
    }

    fn get_capacity(&self, req: v1::GetCapacityRequest) -> Result<v1::GetCapacityResponse, Status> {
        self.require(ControllerCapability::GetCapacity)?;
        for capability in &req.volume_capabilities {
            self.check_volume_capability(capability)?;
        }
        let elsewhere = match (&self.config.topology, &req.accessible_topology) {
            (Some((key, value)), Some(topology)) => topology
                .segments
                .get(key)
                .is_some_and(|requested| requested != value),
            _ => false,
        };
        let available = if elsewhere {
            0
        } else {
            (self.config.capacity_bytes - self.ledger().used_bytes()).max(0)
        };
        Ok(v1::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: None,
            minimum_volume_size: None,
        })
    }

    fn controller_get_capabilities(
        &self,
        _: v1::ControllerGetCapabilitiesRequest,
    ) -> Result<v1::ControllerGetCapabilitiesResponse, Status> {
        Ok(v1::ControllerGetCapabilitiesResponse {
            capabilities: self
                .config
                .capabilities
                .iter()
                .map(|c| v1::ControllerServiceCapability {
                    r#type: Some(v1::controller_service_capability::Type::Rpc(
                        v1::controller_service_capability::Rpc { r#type: *c as i32 },
                    )),
                })
                .collect(),
        })
    }

    fn controller_get_volume(
        &self,
        req: v1::ControllerGetVolumeRequest,
    ) -> Result<v1::ControllerGetVolumeResponse, Status> {
        self.require(ControllerCapability::GetVolume)?;
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let ledger = self.ledger();
        let volume = ledger
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {:?} not found", req.volume_id)))?;
        Ok(v1::ControllerGetVolumeResponse {
            volume: Some(self.volume_message(volume)),
            status: Some(v1::controller_get_volume_response::VolumeStatus {
                published_node_ids: volume.published_nodes.keys().cloned().collect(),
            }),
        })
    }

    /// Sets the named mutable parameters of a volume (what a VolumeAttributesClass carries).
    fn controller_modify_volume(
        &self,
        req: v1::ControllerModifyVolumeRequest,
    ) -> Result<v1::ControllerModifyVolumeResponse, Status> {
        self.require(ControllerCapability::ModifyVolume)?;
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        self.check_mutable_parameters(&req.mutable_parameters)?;
        let mut ledger = self.ledger();
        // Keys not named keep their values.
        ledger
            .update_volume(&req.volume_id, |volume| {
                volume
                    .mutable_parameters
                    .extend(sorted(&req.mutable_parameters))
            })
            .ok_or_else(|| Status::not_found(format!("volume {:?} not found", req.volume_id)))?;
        self.persist(&mut ledger)?;
        Ok(v1::ControllerModifyVolumeResponse {})
    }

    // ---- Node ------------------------------------------------------------------------------

    fn node_get_info(&self, _: v1::NodeGetInfoRequest) -> Result<v1::NodeGetInfoResponse, Status> {
        Ok(v1::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: self
                .config
                .topology
                .as_ref()
                .map(|(key, value)| v1::Topology {
                    segments: HashMap::from([(key.clone(), value.clone())]),
                }),
        })
    }

    fn node_get_capabilities(
        &self,
        _: v1::NodeGetCapabilitiesRequest,
    ) -> Result<v1::NodeGetCapabilitiesResponse, Status> {
        // No node capabilities: nothing is ever staged.
        Ok(v1::NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        })
    }

    fn node_unpublish_volume(
        &self,
        req: v1::NodeUnpublishVolumeRequest,
    ) -> Result<v1::NodeUnpublishVolumeResponse, Status> {
        // Nothing is ever node-published here, so unpublishing a known volume is a no-op. It
        // is implemented (not UNIMPLEMENTED) because callers such as csi-sanity clean up with it.
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        if !self.ledger().volumes.contains_key(&req.volume_id) {
            return Err(Status::not_found(format!(
                "volume {:?} not found",
                req.volume_id
            )));
        }
        Ok(v1::NodeUnpublishVolumeResponse {})
    }

    // ---- Controller: snapshots -------------------------------------------------------------

    fn create_snapshot(
        &self,
        req: v1::CreateSnapshotRequest,
    ) -> Result<v1::CreateSnapshotResponse, Status> {
        self.require(ControllerCapability::CreateDeleteSnapshot)?;
        let mut ledger = self.ledger();
        let outcome = Self::create_or_find_snapshot(&mut ledger, &req);
        let mut record = OperationRecord::new("CreateSnapshot", Some(req.name.clone()), None);
        let result = match outcome {
            Ok((snapshot, created)) => {
                record.volume_id = Some(snapshot.snapshot_id.clone());
                record.created = created;
                Ok(v1::CreateSnapshotResponse {
                    snapshot: Some(snapshot_message(&snapshot)),
                })
            }
            Err(status) => {
                record.code = status.code().into();
                record.message = status.message().to_string();
                Err(status)
            }
        };
        tracing::info!(
            name = %req.name,
            snapshot_id = record.volume_id.as_deref().unwrap_or(""),
            code = %record.code,
            created = record.created,
            "CreateSnapshot"
        );
        ledger.push_operation(record);
        self.persist(&mut ledger)?;
        result
    }

    /// The CreateSnapshot decision: the snapshot of that name, or a new one of the source
    /// volume as it is now. Returns the snapshot and whether this call took it.
    fn create_or_find_snapshot(
        ledger: &mut Book,
        req: &v1::CreateSnapshotRequest,
    ) -> Result<(SnapshotRecord, bool), Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is required"));
        }
        if let Some(existing) = ledger.snapshot_by_name(&req.name) {
            if existing.source_volume_id != req.source_volume_id {
                return Err(Status::already_exists(format!(
                    "snapshot {:?} exists for volume {}, not {}",
                    req.name, existing.source_volume_id, req.source_volume_id
                )));
            }
            return Ok((existing.clone(), false));
        }
        let size_bytes = ledger
            .volumes
            .get(&req.source_volume_id)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "source volume {:?} not found",
                    req.source_volume_id
                ))
            })?
            .capacity_bytes;
        let seq = ledger.take_snapshot_seq();
        let snapshot = SnapshotRecord {
            snapshot_id: format!("snap-{seq:06}-{:08x}", rand::random::<u32>()),
            name: req.name.clone(),
            source_volume_id: req.source_volume_id.clone(),
            size_bytes,
            parameters: sorted(&req.parameters),
            secret_keys: secret_keys(&req.secrets),
            created_at_ms: now_ms(),
        };
        ledger.insert_snapshot(snapshot.clone());
        Ok((snapshot, true))
    }

    fn delete_snapshot(
        &self,
        req: v1::DeleteSnapshotRequest,
    ) -> Result<v1::DeleteSnapshotResponse, Status> {
        self.require(ControllerCapability::CreateDeleteSnapshot)?;
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let mut ledger = self.ledger();
        let mut record =
            OperationRecord::new("DeleteSnapshot", None, Some(req.snapshot_id.clone()));
        record.secret_keys = secret_keys(&req.secrets);
        // Deleting what does not exist is success: DeleteSnapshot is idempotent.
        if let Some(snapshot) = ledger.remove_snapshot(&req.snapshot_id) {
            record.name = Some(snapshot.name);
            record.deleted = true;
        }
        tracing::info!(snapshot_id = %req.snapshot_id, deleted = record.deleted, "DeleteSnapshot");
        ledger.push_operation(record);
        self.persist(&mut ledger)?;
        Ok(v1::DeleteSnapshotResponse {})
    }

    fn list_snapshots(
        &self,
        req: v1::ListSnapshotsRequest,
    ) -> Result<v1::ListSnapshotsResponse, Status> {
        self.require(ControllerCapability::ListSnapshots)?;
        let after = starting_after(req.max_entries, &req.starting_token)?;
        let ledger = self.ledger();
        // Tokens name the last snapshot returned, as for ListVolumes. A filter that matches
        // nothing is an empty list, not an error (the spec says so for an unknown id).
        let matching = ledger.snapshots.values().filter(|s| {
            (req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
                && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
                && after
                    .as_ref()
                    .is_none_or(|after| s.snapshot_id.as_str() > after.as_str())
        });
        let (page, next_token) = paginate(matching, req.max_entries, |s| &s.snapshot_id);
        Ok(v1::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|s| v1::list_snapshots_response::Entry {
                    snapshot: Some(snapshot_message(s)),
                })
                .collect(),
            next_token,
        })
    }

    // ---- helpers ---------------------------------------------------------------------------

    fn volume_message(&self, volume: &VolumeRecord) -> v1::Volume {
        v1::Volume {
            capacity_bytes: volume.capacity_bytes,
            volume_id: volume.volume_id.clone(),
            volume_context: volume.volume_context.clone().into_iter().collect(),
            content_source: volume
                .content_source
                .as_ref()
                .map(|source| v1::VolumeContentSource {
                    r#type: Some(match source {
                        ContentSource::Snapshot { snapshot_id } => {
                            v1::volume_content_source::Type::Snapshot(
                                v1::volume_content_source::SnapshotSource {
                                    snapshot_id: snapshot_id.clone(),
                                },
                            )
                        }
                        ContentSource::Volume { volume_id } => {
                            v1::volume_content_source::Type::Volume(
                                v1::volume_content_source::VolumeSource {
                                    volume_id: volume_id.clone(),
                                },
                            )
                        }
                    }),
                }),
            accessible_topology: volume
                .accessible_topology
                .iter()
                .map(|segments| v1::Topology {
                    segments: segments.clone().into_iter().collect(),
                })
                .collect(),
        }
    }
}

fn sorted(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The id after which a List call continues: `None` for the first page. A token is
/// `after:<last id returned>`; anything else is ABORTED, as the spec asks.
fn starting_after(max_entries: i32, token: &str) -> Result<Option<String>, Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument("max_entries must not be negative"));
    }
    if token.is_empty() {
        return Ok(None);
    }
    token
        .strip_prefix(TOKEN_PREFIX)
        .map(|id| Some(id.to_string()))
        .ok_or_else(|| Status::aborted(format!("invalid starting_token {token:?}")))
}

/// One page of `items` (already in id order, after the token) of at most `max_entries`
/// (0: all), and the token of the next page (empty when this is the last).
fn paginate<'a, T>(
    items: impl Iterator<Item = &'a T>,
    max_entries: i32,
    id: impl Fn(&T) -> &String,
) -> (Vec<&'a T>, String) {
    let limit = if max_entries <= 0 {
        usize::MAX
    } else {
        max_entries as usize
    };
    let mut items = items.peekable();
    let mut page = Vec::new();
    while page.len() < limit {
        match items.next() {
            Some(item) => page.push(item),
            None => break,
        }
    }
    let next_token = match (items.peek(), page.last()) {
        (Some(_), Some(last)) => format!("{TOKEN_PREFIX}{}", id(last)),
        _ => String::new(),
    };
    (page, next_token)
}

/// The CSI message for a snapshot; this driver's snapshots are ready as soon as taken.
fn snapshot_message(snapshot: &SnapshotRecord) -> v1::Snapshot {
    let millis = snapshot.created_at_ms as i64;
    v1::Snapshot {
        size_bytes: snapshot.size_bytes,
        snapshot_id: snapshot.snapshot_id.clone(),
        source_volume_id: snapshot.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: millis / 1000,
            nanos: ((millis % 1000) * 1_000_000) as i32,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
        // Usable everywhere: the driver does not advertise SNAPSHOT_ACCESSIBILITY_CONSTRAINTS.
        accessible_topology: Vec::new(),
    }
}

/// Each topology of a requirement as its segments, in the request's order.
fn segments_of(topologies: &[v1::Topology]) -> Vec<BTreeMap<String, String>> {
    topologies
        .iter()
        .map(|t| t.segments.clone().into_iter().collect())
        .collect()
}

fn content_source_of(
    source: Option<&v1::VolumeContentSource>,
) -> Result<Option<ContentSource>, Status> {
    use v1::volume_content_source::Type;
    match source {
        None => Ok(None),
        Some(v1::VolumeContentSource { r#type: None }) => Err(Status::invalid_argument(
            "volume_content_source needs a snapshot or a volume",
        )),
        Some(v1::VolumeContentSource {
            r#type: Some(Type::Snapshot(s)),
        }) => Ok(Some(ContentSource::Snapshot {
            snapshot_id: s.snapshot_id.clone(),
        })),
        Some(v1::VolumeContentSource {
            r#type: Some(Type::Volume(v)),
        }) => Ok(Some(ContentSource::Volume {
            volume_id: v.volume_id.clone(),
        })),
    }
}

fn unimplemented<Req, Resp>(_: &Driver, _: Req) -> Result<Resp, Status> {
    Err(Status::unimplemented("not implemented by the test driver"))
}

/// The gRPC face of a [`Driver`]: one value serves Identity, Controller and Node.
#[derive(Debug, Clone)]
pub struct CsiService(pub Arc<Driver>);

#[tonic::async_trait]
impl v1::identity_server::Identity for CsiService {
    async fn get_plugin_info(
        &self,
        r: Request<v1::GetPluginInfoRequest>,
    ) -> Reply<v1::GetPluginInfoResponse> {
        self.0
            .serve("GetPluginInfo", r, Driver::get_plugin_info, None)
            .await
    }
    async fn get_plugin_capabilities(
        &self,
        r: Request<v1::GetPluginCapabilitiesRequest>,
    ) -> Reply<v1::GetPluginCapabilitiesResponse> {
        self.0
            .serve(
                "GetPluginCapabilities",
                r,
                Driver::get_plugin_capabilities,
                None,
            )
            .await
    }
    async fn probe(&self, r: Request<v1::ProbeRequest>) -> Reply<v1::ProbeResponse> {
        self.0.serve("Probe", r, Driver::probe, None).await
    }
}

#[tonic::async_trait]
impl v1::controller_server::Controller for CsiService {
    async fn create_volume(
        &self,
        r: Request<v1::CreateVolumeRequest>,
    ) -> Reply<v1::CreateVolumeResponse> {
        let name = r.get_ref().name.clone();
        let on_injected: OnInjected = Box::new(move |driver, status| {
            driver.record_injected("CreateVolume", Some(name), None, status)
        });
        self.0
            .serve_keyed(
                "CreateVolume",
                Some(format!("name/{}", r.get_ref().name)),
                r,
                Driver::create_volume,
                Some(on_injected),
            )
            .await
    }
    async fn delete_volume(
        &self,
        r: Request<v1::DeleteVolumeRequest>,
    ) -> Reply<v1::DeleteVolumeResponse> {
        let volume_id = r.get_ref().volume_id.clone();
        let on_injected: OnInjected = Box::new(move |driver, status| {
            driver.record_injected("DeleteVolume", None, Some(volume_id), status)
        });
        self.0
            .serve_keyed(
                "DeleteVolume",
                Some(format!("id/{}", r.get_ref().volume_id)),
                r,
                Driver::delete_volume,
                Some(on_injected),
            )
            .await
    }
    async fn controller_publish_volume(
        &self,
        r: Request<v1::ControllerPublishVolumeRequest>,
    ) -> Reply<v1::ControllerPublishVolumeResponse> {
        self.0
            .serve(
                "ControllerPublishVolume",
                r,
                Driver::controller_publish_volume,
                None,
            )
            .await
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<v1::ControllerUnpublishVolumeRequest>,
    ) -> Reply<v1::ControllerUnpublishVolumeResponse> {
        self.0
            .serve(
                "ControllerUnpublishVolume",
                r,
                Driver::controller_unpublish_volume,
                None,
            )
            .await
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<v1::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<v1::ValidateVolumeCapabilitiesResponse> {
        self.0
            .serve(
                "ValidateVolumeCapabilities",
                r,
                Driver::validate_volume_capabilities,
                None,
            )
            .await
    }
    async fn list_volumes(
        &self,
        r: Request<v1::ListVolumesRequest>,
    ) -> Reply<v1::ListVolumesResponse> {
        self.0
            .serve("ListVolumes", r, Driver::list_volumes, None)
            .await
    }
    async fn controller_list_volume_health(
        &self,
        r: Request<v1::ControllerListVolumeHealthRequest>,
    ) -> Reply<v1::ControllerListVolumeHealthResponse> {
        self.0
            .serve("ControllerListVolumeHealth", r, unimplemented, None)
            .await
    }
    async fn controller_get_volume_health(
        &self,
        r: Request<v1::ControllerGetVolumeHealthRequest>,
    ) -> Reply<v1::ControllerGetVolumeHealthResponse> {
        self.0
            .serve("ControllerGetVolumeHealth", r, unimplemented, None)
            .await
    }
    async fn get_capacity(
        &self,
        r: Request<v1::GetCapacityRequest>,
    ) -> Reply<v1::GetCapacityResponse> {
        self.0
            .serve("GetCapacity", r, Driver::get_capacity, None)
            .await
    }
    async fn controller_get_capabilities(
        &self,
        r: Request<v1::ControllerGetCapabilitiesRequest>,
    ) -> Reply<v1::ControllerGetCapabilitiesResponse> {
        self.0
            .serve(
                "ControllerGetCapabilities",
                r,
                Driver::controller_get_capabilities,
                None,
            )
            .await
    }
    async fn create_snapshot(
        &self,
        r: Request<v1::CreateSnapshotRequest>,
    ) -> Reply<v1::CreateSnapshotResponse> {
        let name = r.get_ref().name.clone();
        let on_injected: OnInjected = Box::new(move |driver, status| {
            driver.record_injected("CreateSnapshot", Some(name), None, status)
        });
        self.0
            .serve(
                "CreateSnapshot",
                r,
                Driver::create_snapshot,
                Some(on_injected),
            )
            .await
    }
    async fn delete_snapshot(
        &self,
        r: Request<v1::DeleteSnapshotRequest>,
    ) -> Reply<v1::DeleteSnapshotResponse> {
        let snapshot_id = r.get_ref().snapshot_id.clone();
        let on_injected: OnInjected = Box::new(move |driver, status| {
            driver.record_injected("DeleteSnapshot", None, Some(snapshot_id), status)
        });
        self.0
            .serve(
                "DeleteSnapshot",
                r,
                Driver::delete_snapshot,
                Some(on_injected),
            )
            .await
    }
    async fn list_snapshots(
        &self,
        r: Request<v1::ListSnapshotsRequest>,
    ) -> Reply<v1::ListSnapshotsResponse> {
        self.0
            .serve("ListSnapshots", r, Driver::list_snapshots, None)
            .await
    }
    async fn get_snapshot(
        &self,
        r: Request<v1::GetSnapshotRequest>,
    ) -> Reply<v1::GetSnapshotResponse> {
        self.0.serve("GetSnapshot", r, unimplemented, None).await
    }
    async fn controller_expand_volume(
        &self,
        r: Request<v1::ControllerExpandVolumeRequest>,
    ) -> Reply<v1::ControllerExpandVolumeResponse> {
        self.0
            .serve("ControllerExpandVolume", r, unimplemented, None)
            .await
    }
    async fn controller_get_volume(
        &self,
        r: Request<v1::ControllerGetVolumeRequest>,
    ) -> Reply<v1::ControllerGetVolumeResponse> {
        self.0
            .serve(
                "ControllerGetVolume",
                r,
                Driver::controller_get_volume,
                None,
            )
            .await
    }
    async fn controller_modify_volume(
        &self,
        r: Request<v1::ControllerModifyVolumeRequest>,
    ) -> Reply<v1::ControllerModifyVolumeResponse> {
        self.0
            .serve(
                "ControllerModifyVolume",
                r,
                Driver::controller_modify_volume,
                None,
            )
            .await
    }
    async fn controller_get_node_info(
        &self,
        r: Request<v1::ControllerGetNodeInfoRequest>,
    ) -> Reply<v1::ControllerGetNodeInfoResponse> {
        self.0
            .serve("ControllerGetNodeInfo", r, unimplemented, None)
            .await
    }
}

#[tonic::async_trait]
impl v1::node_server::Node for CsiService {
    async fn node_stage_volume(
        &self,
        r: Request<v1::NodeStageVolumeRequest>,
    ) -> Reply<v1::NodeStageVolumeResponse> {
        self.0
            .serve("NodeStageVolume", r, unimplemented, None)
            .await
    }
    async fn node_unstage_volume(
        &self,
        r: Request<v1::NodeUnstageVolumeRequest>,
    ) -> Reply<v1::NodeUnstageVolumeResponse> {
        self.0
            .serve("NodeUnstageVolume", r, unimplemented, None)
            .await
    }
    async fn node_publish_volume(
        &self,
        r: Request<v1::NodePublishVolumeRequest>,
    ) -> Reply<v1::NodePublishVolumeResponse> {
        self.0
            .serve("NodePublishVolume", r, unimplemented, None)
            .await
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<v1::NodeUnpublishVolumeRequest>,
    ) -> Reply<v1::NodeUnpublishVolumeResponse> {
        self.0
            .serve(
                "NodeUnpublishVolume",
                r,
                Driver::node_unpublish_volume,
                None,
            )
            .await
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<v1::NodeGetVolumeStatsRequest>,
    ) -> Reply<v1::NodeGetVolumeStatsResponse> {
        self.0
            .serve("NodeGetVolumeStats", r, unimplemented, None)
            .await
    }
    async fn node_get_volume_health(
        &self,
        r: Request<v1::NodeGetVolumeHealthRequest>,
    ) -> Reply<v1::NodeGetVolumeHealthResponse> {
        self.0
            .serve("NodeGetVolumeHealth", r, unimplemented, None)
            .await
    }
    async fn node_get_storage_health(
        &self,
        r: Request<v1::NodeGetStorageHealthRequest>,
    ) -> Reply<v1::NodeGetStorageHealthResponse> {
        self.0
            .serve("NodeGetStorageHealth", r, unimplemented, None)
            .await
    }
    async fn node_expand_volume(
        &self,
        r: Request<v1::NodeExpandVolumeRequest>,
    ) -> Reply<v1::NodeExpandVolumeResponse> {
        self.0
            .serve("NodeExpandVolume", r, unimplemented, None)
            .await
    }
    async fn node_get_capabilities(
        &self,
        r: Request<v1::NodeGetCapabilitiesRequest>,
    ) -> Reply<v1::NodeGetCapabilitiesResponse> {
        self.0
            .serve(
                "NodeGetCapabilities",
                r,
                Driver::node_get_capabilities,
                None,
            )
            .await
    }
    async fn node_get_info(
        &self,
        r: Request<v1::NodeGetInfoRequest>,
    ) -> Reply<v1::NodeGetInfoResponse> {
        self.0
            .serve("NodeGetInfo", r, Driver::node_get_info, None)
            .await
    }
}

/// The names of the secrets a call carried, sorted; never their values.
fn secret_keys(secrets: &std::collections::HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = secrets.keys().cloned().collect();
    keys.sort();
    keys
}
