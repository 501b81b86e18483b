//! The proxy against the test bed's real kube-apiserver: it forwards what it should, answers
//! injected faults the way the API server would (clients react to them as to the real
//! thing), hides new objects from watches for the time asked, and a dropped event makes the
//! client relist rather than miss it forever.
//!
//! Needs `CSI_TESTBED_KUBECONFIG` (`make test`, or `testbed/cluster.sh up`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_fault_proxy::{Fault, Proxy, Rule};
use serde_json::json;

struct Bed {
    admin: Client,
    proxied: Client,
    proxy: Proxy,
    ns: String,
}

async fn bed(prefix: &str) -> Bed {
    let path = std::env::var("CSI_TESTBED_KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "CSI_TESTBED_KUBECONFIG is not set: run through `make test`, or start the control \
             plane with `eval \"$(bash testbed/cluster.sh up /tmp/tb-dev)\"`"
        )
    });
    let kc = Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    let admin = Client::try_from(config.clone()).expect("admin client");
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let proxy = Proxy::start(listen, config, 7).await.expect("proxy");
    let mut through = kube::Config::new(proxy.url().parse().unwrap());
    through.default_namespace = "default".into();
    let proxied = Client::try_from(through).expect("proxied client");
    let ns = format!("{prefix}-{:08x}", rand::random::<u32>());
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("namespace");
    Bed {
        admin,
        proxied,
        proxy,
        ns,
    }
}

impl Bed {
    fn maps(&self, client: &Client) -> Api<ConfigMap> {
        Api::namespaced(client.clone(), &self.ns)
    }

    async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.admin.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }
}

fn map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn api_code(e: &kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn forwards_requests_and_answers_injected_faults_like_the_api_server() {
    let bed = bed("kfp-status").await;
    let via = bed.maps(&bed.proxied);
    via.create(&PostParams::default(), &map("a"))
        .await
        .expect("forwarded create");
    assert_eq!(via.get("a").await.unwrap().data.unwrap()["k"], "v");

    bed.proxy.add_rule(
        Rule::new(Fault::Status { code: 500 })
            .verbs(&["get"])
            .resources(&["configmaps"])
            .count(1),
    );
    let e = via.get("a").await.unwrap_err();
    assert_eq!(api_code(&e), (500, "InternalError".into()));
    via.get("a").await.expect("the fault was for one request");

    // kube-rs retries 429/503/504 by itself: one 503 is absorbed, the proxy counted it.
    bed.proxy.add_rule(
        Rule::new(Fault::Status { code: 503 })
            .verbs(&["get"])
            .resources(&["configmaps"])
            .count(1),
    );
    via.get("a").await.expect("retried by the client");

    // A lost response: the create happened, the client is told AlreadyExists.
    bed.proxy.add_rule(
        Rule::new(Fault::LostResponse { code: 409 })
            .verbs(&["create"])
            .resources(&["configmaps"])
            .count(1),
    );
    let e = via
        .create(&PostParams::default(), &map("b"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), (409, "AlreadyExists".into()));
    bed.maps(&bed.admin).get("b").await.expect("b was created");

    // A conflict on a write, before it reaches the API server.
    bed.proxy.add_rule(
        Rule::new(Fault::Status { code: 409 })
            .verbs(&["patch"])
            .resources(&["configmaps"])
            .count(1),
    );
    let patch = Patch::Merge(json!({"data": {"k": "w"}}));
    let e = via
        .patch("a", &PatchParams::default(), &patch)
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), (409, "Conflict".into()));
    assert_eq!(
        bed.maps(&bed.admin).get("a").await.unwrap().data.unwrap()["k"],
        "v"
    );

    let started = Instant::now();
    bed.proxy.add_rule(
        Rule::new(Fault::Delay { ms: 700 })
            .verbs(&["get"])
            .resources(&["configmaps"])
            .count(1),
    );
    via.get("a").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(700));

    let stats = bed.proxy.stats();
    assert_eq!(stats.injected.get("status-500"), Some(&1));
    assert_eq!(stats.injected.get("status-503"), Some(&1));
    assert_eq!(stats.injected.get("lost-response-409"), Some(&1));
    assert_eq!(stats.injected.get("status-409"), Some(&1));
    assert_eq!(stats.injected.get("slow-request"), Some(&1));
    bed.cleanup().await;
}

/// Events of the namespace's config maps as (name, `k` value) with arrival times.
fn watch_maps(
    api: Api<ConfigMap>,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, String, Instant)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            if let Ok(cm) = item {
                let name = cm.metadata.name.clone().unwrap_or_default();
                let k = cm
                    .data
                    .and_then(|d| d.get("k").cloned())
                    .unwrap_or_default();
                if tx.send((name, k, Instant::now())).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

async fn next_for(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String, Instant)>,
    name: &str,
    value: &str,
) -> Instant {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (n, v, at) = rx.recv().await.expect("watch ended");
            if n == name && v == value {
                return at;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event for {name}={value}"))
}

#[tokio::test]
async fn a_new_object_is_hidden_from_watches_while_others_flow() {
    let bed = bed("kfp-hide").await;
    let admin = bed.maps(&bed.admin);
    admin
        .create(&PostParams::default(), &map("old"))
        .await
        .unwrap();
    let mut events = watch_maps(bed.maps(&bed.proxied));
    next_for(&mut events, "old", "v").await;

    bed.proxy.add_rule(
        Rule::new(Fault::HideNew { ms: 2000 })
            .verbs(&["watch"])
            .resources(&["configmaps"]),
    );
    let created = Instant::now();
    admin
        .create(&PostParams::default(), &map("new"))
        .await
        .unwrap();
    admin
        .patch(
            "new",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    admin
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    let old_seen = next_for(&mut events, "old", "v2").await;
    let new_seen = next_for(&mut events, "new", "v2").await;
    assert!(
        old_seen.duration_since(created) < Duration::from_millis(1500),
        "the old object's change is not held"
    );
    assert!(
        new_seen.duration_since(created) >= Duration::from_millis(1900),
        "the new object was hidden for 2 s, seen after {:?}",
        new_seen.duration_since(created)
    );
    assert_eq!(bed.proxy.stats().injected.get("watch-hide"), Some(&1));
    bed.cleanup().await;
}

#[tokio::test]
async fn a_dropped_event_is_recovered_by_a_relist() {
    let bed = bed("kfp-drop").await;
    let admin = bed.maps(&bed.admin);
    admin
        .create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    let mut events = watch_maps(bed.maps(&bed.proxied));
    next_for(&mut events, "a", "v").await;

    bed.proxy.add_rule(
        Rule::new(Fault::DropEvents {
            relist_after_ms: 300,
        })
        .verbs(&["watch"])
        .resources(&["configmaps"])
        .count(1),
    );
    admin
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "dropped"}})),
        )
        .await
        .unwrap();
    // The watch never carries that change; the relist after the 410 does.
    next_for(&mut events, "a", "dropped").await;
    let stats = bed.proxy.stats();
    assert_eq!(stats.injected.get("watch-drop"), Some(&1));
    assert_eq!(stats.injected.get("watch-gone"), Some(&1));
    bed.cleanup().await;
}

#[tokio::test]
async fn an_expiring_cut_makes_the_client_list_again() {
    let bed = bed("kfp-expire").await;
    let admin = bed.maps(&bed.admin);
    admin
        .create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    let mut events = watch_maps(bed.maps(&bed.proxied));
    next_for(&mut events, "a", "v").await;
    // "a" came from the list; the watch that follows must be open to be cut.
    let until = Instant::now() + Duration::from_secs(20);
    while bed.proxy.stats().watches == 0 {
        assert!(Instant::now() < until, "the client never watched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = bed.proxy.stats().bytes_sent;
    assert!(read > 0, "the list was read through the proxy");

    bed.proxy.expire_watches(&["configmaps"]);
    // Nothing changed, yet "a" comes again: the resume was answered 410 and the client listed.
    next_for(&mut events, "a", "v").await;
    let stats = bed.proxy.stats();
    assert_eq!(stats.injected.get("watch-gone"), Some(&1));
    assert!(stats.bytes_sent > read, "the relist was read: {stats:?}");
    bed.cleanup().await;
}

#[tokio::test]
async fn cut_streams_resume_without_losing_events() {
    let bed = bed("kfp-cut").await;
    let admin = bed.maps(&bed.admin);
    let mut events = watch_maps(bed.maps(&bed.proxied));
    for i in 0..5 {
        admin
            .create(&PostParams::default(), &map(&format!("m{i}")))
            .await
            .unwrap();
        bed.proxy.cut_watches(&["configmaps"]);
    }
    bed.proxy.add_rule(
        Rule::new(Fault::CutStream)
            .verbs(&["watch"])
            .resources(&["configmaps"])
            .probability(0.5),
    );
    for i in 5..10 {
        admin
            .create(&PostParams::default(), &map(&format!("m{i}")))
            .await
            .unwrap();
    }
    for i in 0..10 {
        next_for(&mut events, &format!("m{i}"), "v").await;
    }
    bed.cleanup().await;
}

/// Waits until the proxy holds `n` requests.
async fn until_held(proxy: &Proxy, n: usize) -> Vec<kube_fault_proxy::HeldRequest> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let held = proxy.held();
        if held.len() >= n {
            return held;
        }
        assert!(
            Instant::now() < until,
            "{} of {n} requests held",
            held.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_held_write_is_dropped_before_or_after_the_api_server_acted() {
    let bed = bed("kfp-hold").await;
    let via = bed.maps(&bed.proxied);
    let direct = bed.maps(&bed.admin);
    bed.proxy.record_writes();
    // The second create is held before it is forwarded, then dropped: it never happened.
    bed.proxy.add_rule(
        Rule::new(Fault::Hold { after: false })
            .verbs(&["create"])
            .resources(&["configmaps"])
            .skip(1)
            .count(1),
    );
    via.create(&PostParams::default(), &map("first"))
        .await
        .expect("not the one held");
    let call = tokio::spawn({
        let via = via.clone();
        async move { via.create(&PostParams::default(), &map("second")).await }
    });
    let held = until_held(&bed.proxy, 1).await;
    assert_eq!(held[0].request.name.as_deref(), Some("second"));
    assert_eq!(held[0].at, kube_fault_proxy::HoldAt::Before);
    assert!(direct.get_opt("second").await.unwrap().is_none(), "held");
    assert_eq!(bed.proxy.drop_held(), 1);
    assert!(
        call.await.unwrap().is_err(),
        "the client is told nothing good"
    );
    assert!(direct.get_opt("second").await.unwrap().is_none(), "dropped");

    // Held after: the API server deleted it, the answer is dropped.
    bed.proxy.add_rule(
        Rule::new(Fault::Hold { after: true })
            .verbs(&["delete"])
            .resources(&["configmaps"])
            .count(1),
    );
    let call = tokio::spawn({
        let via = via.clone();
        async move { via.delete("first", &DeleteParams::default()).await }
    });
    let held = until_held(&bed.proxy, 1).await;
    assert_eq!(held[0].status, Some(200));
    assert!(direct.get_opt("first").await.unwrap().is_none(), "acted on");
    bed.proxy.drop_held();
    assert!(call.await.unwrap().is_err());

    // Released after: the client gets the real answer.
    bed.proxy.add_rule(
        Rule::new(Fault::Hold { after: true })
            .verbs(&["create"])
            .resources(&["configmaps"])
            .count(1),
    );
    let call = tokio::spawn({
        let via = via.clone();
        async move { via.create(&PostParams::default(), &map("third")).await }
    });
    until_held(&bed.proxy, 1).await;
    assert_eq!(bed.proxy.release_held(), 1);
    let made = call.await.unwrap().expect("the real answer");
    assert_eq!(made.metadata.name.as_deref(), Some("third"));

    let journal: Vec<(String, Option<String>)> = bed
        .proxy
        .journal()
        .into_iter()
        .map(|w| (w.verb, w.name))
        .collect();
    let expected = [
        ("create", "first"),
        ("create", "second"),
        ("delete", "first"),
        ("create", "third"),
    ];
    assert_eq!(
        journal,
        expected
            .iter()
            .map(|(v, n)| (v.to_string(), Some(n.to_string())))
            .collect::<Vec<_>>()
    );
    let stats = bed.proxy.stats();
    assert_eq!(stats.injected.get("hold-before"), Some(&1));
    assert_eq!(stats.injected.get("hold-after"), Some(&2));
    bed.cleanup().await;
}
