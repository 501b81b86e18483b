//! The caches' watches: every object of a kind, trimmed before it is cached,
//! only what finds work kept, and each object triggered for its controller
//! once it is in the store (after a relist too).

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::{reflector, watcher};
use kube::{Api, Client};
use tracing::warn;

use crate::kube::Listed;
use crate::kube::watch::{self, Progress};

/// A kind the caches hold: a cluster-wide Kubernetes object the watcher
/// parses, shared with the reconcilers across tasks.
pub(super) trait Cached:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Cached for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A watch of every `K` feeding `writer` (`crate::kube::watch`: streamed and
/// never-older lists, as client-go watches), each object passed through
/// `trim` before caching, only those passing `keep` kept, and the store's
/// progress published to `progress`. `managedFields` are often most of an
/// object's bytes and never read: the slim cache types skip them while
/// parsing, other types drop them in `trim` ([`drop_managed_fields`]).
pub(super) fn cached_stream<K, O>(
    client: &Client,
    writer: reflector::store::Writer<K>,
    listed: Listed,
    progress: Progress,
    trim: fn(&mut K),
    keep: fn(&K) -> bool,
    observe: O,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K, O>
where
    K: Cached,
    O: FnMut(&watcher::Event<K>) + Send + 'static,
{
    let source = Api::<K>::all(client.clone());
    source_stream(source, writer, listed, progress, trim, keep, observe)
}

/// [`cached_stream`] from any source, e.g. the metadata alone of a kind
/// ([`watch::Metadata`]), trimmed by any function.
pub(super) fn source_stream<S, T, O>(
    source: S,
    writer: reflector::store::Writer<S::Object>,
    listed: Listed,
    progress: Progress,
    trim: T,
    keep: fn(&S::Object) -> bool,
    mut observe: O,
) -> impl futures::Stream<Item = Result<S::Object, watcher::Error>> + Send + use<S, T, O>
where
    S: watch::Source,
    S::Object: Cached,
    T: Fn(&mut S::Object) + Send + 'static,
    O: FnMut(&watcher::Event<S::Object>) + Send + 'static,
{
    let reader = writer.as_reader();
    let events = watch::cache(source, writer, trim, keep, progress)
        .inspect_ok(move |event| observe(event))
        // The controllers drop these; an operator must see a watch that cannot
        // list or watch (RBAC, an API outage). The watch retries with backoff.
        .inspect_err(|e| warn!(kind = %<S::Object as kube::Resource>::kind(&()), error = %e, "watch failed; retrying"));
    triggers(reader, listed, events)
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

pub(super) fn drop_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

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
        let events = futures::stream::iter(
            events
                .into_iter()
                .filter_map(|e| watch::kept(e, keep))
                .map(Ok),
        );
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
}
