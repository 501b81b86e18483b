//! Storage capacity tracking (`--enable-capacity`): keeps one
//! CSIStorageCapacity object per topology segment and StorageClass of our
//! driver in `NAMESPACE`, saying what the driver's `GetCapacity` answers, so
//! that kube-scheduler places late-binding claims where there is room.
//!
//! One pass does everything (`capacity::plan`): the segments from the CSINode
//! and Node caches, the classes from the class cache, `GetCapacity` per item,
//! the objects that exist (listed live, so that a stale cache can never make a
//! second object for an item), then the creates, updates and deletes. A pass
//! runs every `--capacity-poll-interval`, after a volume was provisioned or
//! deleted, and when a node, a CSINode, a class or one of our objects changes
//! (an object deleted by someone else is re-created). Triggers that arrive
//! during a pass make one more pass, never a queue of them. The API requests
//! go through a client of their own (`--kube-api-capacity-qps/-burst`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::node::Placement;
use crate::capacity::{self, Answer, Change, Item};
use crate::config::{CapacityConfig, CapacityOwner};
use crate::csi::CsiClient;
use crate::kube::{api_message, is_not_found};

/// Upstream's gauges (ALPHA), registered only with `--enable-capacity`.
#[derive(Clone, Default)]
pub struct Gauges {
    goal: Gauge,
    current: Gauge,
    obsolete: Gauge,
}

impl Gauges {
    pub fn register(registry: &mut Registry) -> Gauges {
        let g = Gauges::default();
        registry.register(
            "csistoragecapacities_desired_goal",
            "Number of CSIStorageCapacity objects that are supposed to be managed automatically",
            g.goal.clone(),
        );
        registry.register(
            "csistoragecapacities_desired_current",
            "Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically",
            g.current.clone(),
        );
        registry.register(
            "csistoragecapacities_obsolete",
            "Number of CSIStorageCapacity objects that exist and will be deleted automatically",
            g.obsolete.clone(),
        );
        g
    }
}

/// Why capacity tracking cannot start (fatal, as upstream).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "--enable-capacity: the API server does not serve storage.k8s.io/v1 CSIStorageCapacity (Kubernetes before 1.24; v1beta1 is not supported by this csi-provisioner)"
    )]
    NotServed,
    #[error(
        "--enable-capacity: asking whether storage.k8s.io/v1 CSIStorageCapacity is served (for {namespace}): {message}"
    )]
    Probe { namespace: String, message: String },
    #[error("look up owner(s) of pod {namespace}/{pod}: {message}")]
    Owner {
        namespace: String,
        pod: String,
        message: String,
    },
}

/// Whether the API server serves `storage.k8s.io/v1` CSIStorageCapacity, from its discovery
/// document: nothing is created (upstream v6.3 asked by creating an object of an invalid name;
/// v6.4 uses v1 without asking, and finds out from its first list).
pub async fn probe(client: &Client, namespace: &str) -> Result<(), StartError> {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list)
            if list
                .resources
                .iter()
                .any(|r| r.kind == "CSIStorageCapacity") =>
        {
            Ok(())
        }
        Ok(_) => Err(StartError::NotServed),
        Err(e) if is_not_found(&e) => Err(StartError::NotServed),
        Err(e) => Err(StartError::Probe {
            namespace: namespace.to_string(),
            message: api_message(&e),
        }),
    }
}

/// The owner the objects get (`--capacity-ownerref-level`, `POD_NAME`): the
/// pod itself at level 0, else the controller `levels` steps up from it.
pub async fn owner(
    client: &Client,
    namespace: &str,
    owner: &CapacityOwner,
) -> Result<OwnerReference, StartError> {
    let fail = |message: String| StartError::Owner {
        namespace: namespace.to_string(),
        pod: owner.pod_name.clone(),
        message,
    };
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(&owner.pod_name)
        .await
        .map_err(|e| fail(api_message(&e)))?;
    let mut current = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        controller: Some(true),
        ..Default::default()
    };
    let mut refs = pod.metadata.owner_references.unwrap_or_default();
    for level in 0..owner.levels {
        let next = refs
            .iter()
            .find(|r| r.controller == Some(true))
            .cloned()
            .ok_or_else(|| {
                fail(format!(
                    "{} {} has no controller",
                    current.kind, current.name
                ))
            })?;
        current = next;
        if level + 1 < owner.levels {
            let (group, version) = match current.api_version.split_once('/') {
                Some((g, v)) => (g, v),
                None => ("", current.api_version.as_str()),
            };
            let resource =
                ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &current.kind));
            let object =
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
                    .get(&current.name)
                    .await
                    .map_err(|e| fail(api_message(&e)))?;
            refs = object.metadata.owner_references.unwrap_or_default();
        }
    }
    current.controller = Some(true);
    current.block_owner_deletion = None;
    Ok(current)
}

/// What a pass needs.
pub struct Tracker {
    pub csi: CsiClient,
    /// Our driver's name.
    pub driver: String,
    /// Where this replica runs: which segments it reports.
    pub place: Placement,
    /// The StorageClass cache (`Shared::classes`).
    pub classes: Store<StorageClass>,
    /// The client of `--kube-api-capacity-qps/-burst`.
    pub client: Client,
    pub config: CapacityConfig,
    pub owner: Option<OwnerReference>,
    pub gauges: Gauges,
    /// Poked after provisioning and deletion (`Shared::capacity`).
    pub trigger: Arc<Notify>,
    /// The `managed-by` label of our objects ([`capacity::managed_by`]).
    pub managed_by: String,
}

pub async fn run(tracker: Tracker, stop: CancellationToken) {
    let (csinodes, csinode_writer) = reflector::store::<CSINode>();
    let (nodes, node_writer) = reflector::store();
    // With `--node-deployment` the segment is this node's: no CSINode or
    // Node is watched (as upstream).
    let central = tracker.place.reads_cluster_topology();
    tokio::select! {
        _ = watches(&tracker, csinode_writer, node_writer, central) => {}
        _ = passes(&tracker, &csinodes, &nodes, central, &stop) => {}
    }
}

/// The watches of what the segments and items come from (the topology only
/// if `central`), and of our objects; every change that matters pokes a pass.
async fn watches(
    tracker: &Tracker,
    csinode_writer: Writer<CSINode>,
    node_writer: Writer<PartialObjectMeta<Node>>,
    central: bool,
) {
    let client = &tracker.client;
    let changed = &tracker.trigger;
    let topology = async {
        if !central {
            return;
        }
        let csinodes = watcher(Api::<CSINode>::all(client.clone()), Default::default());
        let nodes = watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            Default::default(),
        );
        tokio::join!(
            reflector(csinode_writer, csinodes.default_backoff())
                .applied_objects()
                .for_each(poke(changed)),
            reflector(node_writer, nodes.default_backoff())
                .touched_objects()
                .for_each(poke(changed)),
        );
    };
    let classes = watcher(Api::<StorageClass>::all(client.clone()), Default::default())
        .default_backoff()
        .for_each(poke(changed));
    let poke_deleted = poke(changed);
    let objects = watcher(
        Api::<CSIStorageCapacity>::namespaced(client.clone(), &tracker.config.namespace),
        watcher::Config::default().labels(&selector(&tracker.driver, &tracker.managed_by)),
    )
    .default_backoff()
    .filter(|event| {
        // Our own writes come back too; only a deletion needs a pass (an
        // object someone else removed is re-created).
        std::future::ready(matches!(event, Ok(watcher::Event::Delete(_))))
    })
    .for_each(poke_deleted);
    tokio::join!(topology, classes, objects);
}

/// A pass once the topology caches hold their first list, then one every
/// poll interval or after a change, until `stop`.
async fn passes(
    tracker: &Tracker,
    csinodes: &Store<CSINode>,
    nodes: &Store<PartialObjectMeta<Node>>,
    central: bool,
    stop: &CancellationToken,
) {
    tokio::select! {
        _ = async {
            if central {
                let _ = tokio::join!(csinodes.wait_until_ready(), nodes.wait_until_ready());
            }
        } => {}
        _ = stop.cancelled() => return,
    }
    info!(namespace = %tracker.config.namespace, every = ?tracker.config.poll_interval, "tracking storage capacity");
    loop {
        pass(tracker, csinodes, nodes).await;
        tokio::select! {
            _ = tokio::time::sleep(tracker.config.poll_interval) => {}
            _ = tracker.trigger.notified() => {
                // Let a burst of changes (a provisioning wave, a watch's
                // first list) settle into one pass.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = stop.cancelled() => return,
        }
    }
}

/// What a watch does with each of its events: asks for a pass.
fn poke<T>(changed: &Arc<Notify>) -> impl FnMut(T) -> std::future::Ready<()> + use<T> {
    let changed = changed.clone();
    move |_| {
        changed.notify_one();
        std::future::ready(())
    }
}

fn selector(driver: &str, managed_by: &str) -> String {
    format!(
        "{}={driver},{}={managed_by}",
        capacity::LABEL_DRIVER,
        capacity::LABEL_MANAGED_BY,
    )
}

/// One reconciliation of every object with what the driver says now.
async fn pass(
    tracker: &Tracker,
    csinodes: &Store<CSINode>,
    nodes: &Store<PartialObjectMeta<Node>>,
) {
    let driver = &tracker.driver;
    let csinodes: Vec<CSINode> = csinodes.state().iter().map(|c| (**c).clone()).collect();
    let labels: BTreeMap<String, BTreeMap<String, String>> = nodes
        .state()
        .iter()
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect();
    // One sidecar per node: its one segment, from `NodeGetInfo` (upstream's
    // fixed node topology); no CSINode or Node is read.
    let segments = tracker
        .place
        .capacity_segments(|| capacity::segments(driver, &csinodes, &labels));
    let classes: Vec<StorageClass> = tracker
        .classes
        .state()
        .iter()
        .map(|c| (**c).clone())
        .collect();
    let items = capacity::items(
        &segments,
        &classes,
        driver,
        tracker.config.for_immediate_binding,
    );
    let answers = ask_driver(&tracker.csi, items, &classes).await;
    let api =
        Api::<CSIStorageCapacity>::namespaced(tracker.client.clone(), &tracker.config.namespace);
    let existing = match api
        .list(&ListParams::default().labels(&selector(driver, &tracker.managed_by)))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            warn!(error = %e, "listing CSIStorageCapacity objects failed; next pass retries");
            return;
        }
    };
    let (changes, counts) = capacity::plan(&answers, &existing, tracker.owner.as_ref());
    tracker.gauges.goal.set(counts.goal as i64);
    tracker.gauges.current.set(counts.current as i64);
    tracker.gauges.obsolete.set(counts.obsolete as i64);
    for change in changes {
        if let Err(e) = apply(tracker, &api, &change).await {
            let what = match &change {
                Change::Create(item, _) => format!("create for {} {:?}", item.class, item.segment),
                Change::Update(o, _) => format!("update of {}", o.name_any()),
                Change::Delete(name) => format!("delete of {name}"),
            };
            warn!(change = %what, error = %e, "CSIStorageCapacity change failed; the next pass retries");
        }
    }
}

/// `GetCapacity` for each item, with its class's parameters and its segment;
/// `None` where the call failed (that item's object is then left as it is).
async fn ask_driver(
    csi: &CsiClient,
    items: Vec<Item>,
    classes: &[StorageClass],
) -> Vec<(Item, Option<Answer>)> {
    let mut answers = Vec::with_capacity(items.len());
    for item in items {
        let parameters: HashMap<String, String> = classes
            .iter()
            .find(|c| c.name_any() == item.class)
            .and_then(|c| c.parameters.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let segment = (!item.segment.is_empty())
            .then(|| item.segment.clone().into_iter().collect::<HashMap<_, _>>());
        let answer = match csi.get_capacity(parameters, segment).await {
            Ok(r) => Some(Answer {
                available: r.available_capacity,
                maximum_volume_size: r.maximum_volume_size,
            }),
            Err(status) => {
                warn!(class = %item.class, segment = ?item.segment, code = ?status.code(), message = status.message(), "GetCapacity failed; the object is left as it is");
                None
            }
        };
        answers.push((item, answer));
    }
    answers
}

/// One change of the plan, made through `api`.
async fn apply(
    tracker: &Tracker,
    api: &Api<CSIStorageCapacity>,
    change: &Change,
) -> Result<(), kube::Error> {
    let owner = tracker.owner.as_ref();
    match change {
        Change::Create(item, answer) => {
            let object = capacity::object(
                item,
                *answer,
                &tracker.driver,
                &tracker.managed_by,
                &tracker.config.namespace,
                owner,
            );
            api.create(&PostParams::default(), &object).await.map(|created| {
                debug!(name = %created.name_any(), class = %item.class, segment = ?item.segment, capacity = answer.available, "created CSIStorageCapacity");
            })
        }
        Change::Update(object, answer) => {
            let mut object = (**object).clone();
            capacity::say(&mut object, *answer, owner);
            // Fenced on the resourceVersion read: a conflict is retried by
            // the next pass.
            api.replace(&object.name_any(), &PostParams::default(), &object)
                .await
                .map(|_| debug!(name = %object.name_any(), capacity = answer.available, "updated CSIStorageCapacity"))
        }
        Change::Delete(name) => match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                debug!(%name, "deleted obsolete CSIStorageCapacity");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        },
    }
}
