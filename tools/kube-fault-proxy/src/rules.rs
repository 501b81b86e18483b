//! What a request is (verb, resource, object) and which faults apply to it: the rule
//! language of the control protocol, the seeded decisions, and the counters of what was
//! injected.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One fault rule: which requests (or watch events) it matches and what it does to them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Kubernetes verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`). Empty: every verb.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    /// Resources as they appear in the URL (`persistentvolumes`, `leases`, ...); a rule for
    /// `persistentvolumeclaims` also matches its subresources, `persistentvolumeclaims/status`
    /// only that one. Empty: every resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Chance that the fault applies: per request for request faults, per event for watch
    /// event faults, per new object for `hide_new`.
    #[serde(default = "always")]
    pub probability: f64,
    /// Stop injecting after this many times (the rule then stays, inert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Let this many matching requests (or events) pass untouched before the rule may fire:
    /// with `count: 1`, `skip: n` aims at exactly the (n+1)-th match after the rule was added.
    /// Only requests the rule could apply to are counted (not those another rule already
    /// answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<u64>,
    pub fault: Fault,
}

fn always() -> f64 {
    1.0
}

impl Rule {
    pub fn new(fault: Fault) -> Rule {
        Rule {
            verbs: Vec::new(),
            resources: Vec::new(),
            probability: 1.0,
            count: None,
            skip: None,
            fault,
        }
    }

    pub fn verbs(mut self, verbs: &[&str]) -> Rule {
        self.verbs = verbs.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn resources(mut self, resources: &[&str]) -> Rule {
        self.resources = resources.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn probability(mut self, p: f64) -> Rule {
        self.probability = p;
        self
    }

    pub fn count(mut self, n: u64) -> Rule {
        self.count = Some(n);
        self
    }

    pub fn skip(mut self, n: u64) -> Rule {
        self.skip = Some(n);
        self
    }

    /// Whether the rule's verbs and resources cover `info` (whatever its fault).
    pub fn matches(&self, info: &RequestInfo) -> bool {
        (self.verbs.is_empty() || self.verbs.iter().any(|v| v == info.verb.as_str()))
            && (self.resources.is_empty()
                || self.resources.iter().any(|r| info.resource_matches(r)))
    }
}

/// What a rule does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Answer with this HTTP status (409, 410, 429, 500, 503, ...) and a Kubernetes `Status`
    /// body without forwarding: the API server never sees the request. A 410 on a watch is
    /// answered as kube-apiserver does: `200` and one `ERROR` event carrying the 410.
    Status { code: u16 },
    /// Forward the request, then answer this status instead of the real response: the change
    /// happened but the client does not know (a lost response). For a `create`, 409 is the
    /// answer a client's retry of a create that succeeded would get (`AlreadyExists`).
    LostResponse { code: u16 },
    /// Forward the request after this long (a slow API server).
    Delay { ms: u64 },
    /// Watch streams: hold each event this long (per-object order is kept).
    DelayEvents { ms: u64 },
    /// Watch streams: send the event twice, back to back.
    DuplicateEvents,
    /// Watch streams: drop the event. The stream is cut `relist_after_ms` later and the
    /// client's attempt to resume it gets `410 Gone` (as an `ERROR` event), so it relists (what a client that
    /// lost events to a broken connection and a compacted watch cache goes through).
    DropEvents {
        #[serde(default = "default_relist_after")]
        relist_after_ms: u64,
    },
    /// Watch streams: end the stream after this event (events already received are
    /// delivered first). The client resumes from the last resourceVersion it saw.
    CutStream,
    /// Watch streams: an object first seen in an `ADDED` event is hidden from every watch
    /// stream of the resource for this long after that moment: its events are held, then
    /// delivered in order. Lists are not filtered. This is how a cache misses a just-created
    /// PV while another sync of the same claim runs (upstream issue #1469).
    HideNew { ms: u64 },
    /// Hold the request (not a watch) until the control socket decides: before forwarding it
    /// (`after: false`: the API server has not seen it), or once the API server answered
    /// (`after: true`: the change happened, the answer is held). `release` lets it go on
    /// (forwarded, or its answer sent); `drop` ends it without forwarding it or sending the
    /// real answer. A client killed meanwhile never learns either way: a crash at that step.
    Hold {
        #[serde(default)]
        after: bool,
    },
}

/// Where a `hold` rule holds a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldAt {
    /// Before forwarding.
    Before,
    /// After the API server answered, before the answer goes to the client.
    After,
}

fn default_relist_after() -> u64 {
    1000
}

impl Fault {
    fn is_watch_event_fault(&self) -> bool {
        matches!(
            self,
            Fault::DelayEvents { .. }
                | Fault::DuplicateEvents
                | Fault::DropEvents { .. }
                | Fault::CutStream
                | Fault::HideNew { .. }
        )
    }

    /// The counter a fault is recorded under in [`Stats`].
    pub fn counter(&self) -> String {
        match self {
            Fault::Status { code } => format!("status-{code}"),
            Fault::LostResponse { code } => format!("lost-response-{code}"),
            Fault::Delay { .. } => "slow-request".into(),
            Fault::DelayEvents { .. } => "watch-delay".into(),
            Fault::DuplicateEvents => "watch-duplicate".into(),
            Fault::DropEvents { .. } => "watch-drop".into(),
            Fault::CutStream => "watch-cut".into(),
            Fault::HideNew { .. } => "watch-hide".into(),
            Fault::Hold { after: false } => "hold-before".into(),
            Fault::Hold { after: true } => "hold-after".into(),
        }
    }
}

/// A request as the API server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub verb: String,
    /// Plural resource name (`persistentvolumes`); empty for non-resource URLs (`/version`).
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The `resourceVersion` query parameter, if any.
    pub resource_version: Option<String>,
}

impl RequestInfo {
    /// Parses a request line the way the API server's request-info resolver does, for the
    /// URL shapes clients use (`/api/v1/...`, `/apis/<group>/<version>/...`, the legacy
    /// `/watch/` prefix).
    pub fn parse(method: &http::Method, path: &str, query: Option<&str>) -> RequestInfo {
        let params: HashMap<&str, &str> = query
            .unwrap_or("")
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .collect();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: &[&str] = match segments.as_slice() {
            ["api", _version, rest @ ..] => rest,
            ["apis", _group, _version, rest @ ..] => rest,
            _ => &[],
        };
        let (legacy_watch, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            _ => (false, rest),
        };
        let (namespace, rest): (Option<&str>, &[&str]) = match rest {
            ["namespaces", ns, more @ ..] if !more.is_empty() => (Some(*ns), more),
            ["namespaces", ns] => (None, &["namespaces", ns][..]),
            other => (None, other),
        };
        let (resource, name, subresource) = match rest {
            [] => ("", None, None),
            [r] => (*r, None, None),
            [r, n] => (*r, Some(*n), None),
            [r, n, s, ..] => (*r, Some(*n), Some(*s)),
        };
        let watch = legacy_watch || matches!(params.get("watch"), Some(&"true") | Some(&"1"));
        let verb = match *method {
            http::Method::GET | http::Method::HEAD if watch => "watch",
            http::Method::GET | http::Method::HEAD if name.is_some() => "get",
            http::Method::GET | http::Method::HEAD => "list",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE if name.is_some() => "delete",
            http::Method::DELETE => "deletecollection",
            _ => "unknown",
        };
        RequestInfo {
            verb: verb.to_string(),
            resource: resource.to_string(),
            subresource: subresource.map(str::to_string),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            resource_version: params
                .get("resourceVersion")
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string()),
        }
    }

    fn resource_matches(&self, pattern: &str) -> bool {
        match pattern.split_once('/') {
            Some((r, s)) => r == self.resource && self.subresource.as_deref() == Some(s),
            None => pattern == self.resource,
        }
    }

    /// `resource[/subresource]`, for logs.
    pub fn full_resource(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// What happens to one request before (and instead of) plain forwarding.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RequestPlan {
    pub delay: Option<Duration>,
    /// Answer this without forwarding.
    pub status: Option<u16>,
    /// Forward, then answer this.
    pub lost_response: Option<u16>,
    /// Hold the request here until the control socket decides.
    pub hold: Option<HoldAt>,
}

/// What happens to one watch event.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct EventPlan {
    pub drop: bool,
    /// When dropping: cut the stream this much later, and expire its resume point.
    pub relist_after: Option<Duration>,
    pub duplicate: bool,
    pub cut_after: bool,
    pub delay: Duration,
    /// The object is hidden until then.
    pub hidden_until: Option<Instant>,
}

/// Counters of injected faults, by [`Fault::counter`] name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub injected: BTreeMap<String, u64>,
    /// Requests forwarded to the API server (watch requests included).
    pub forwarded: u64,
    /// Watch streams opened (and passed through the event filter).
    pub watches: u64,
    /// Bytes of response bodies sent to clients, watch streams included: what the clients
    /// read (uncompressed: the proxy asks the API server for plain bodies).
    #[serde(default)]
    pub bytes_sent: u64,
}

impl Stats {
    pub fn total_injected(&self) -> u64 {
        self.injected.values().sum()
    }
}

struct Entry {
    id: u64,
    rule: Rule,
    injected: u64,
    /// Matches seen so far (for `skip`).
    matched: u64,
}

/// The rules and everything decided from them; behind one lock in the proxy.
pub struct RuleSet {
    entries: Vec<Entry>,
    next_id: u64,
    rng: StdRng,
    stats: Stats,
    /// `resource/namespace/name` → hidden until.
    hidden: HashMap<String, Instant>,
    /// (resource, resourceVersion) resume points answered with 410 Gone.
    expired: HashSet<(String, String)>,
}

impl RuleSet {
    pub fn new(seed: u64) -> RuleSet {
        RuleSet {
            entries: Vec::new(),
            next_id: 1,
            rng: StdRng::seed_from_u64(seed),
            stats: Stats::default(),
            hidden: HashMap::new(),
            expired: HashSet::new(),
        }
    }

    pub fn add(&mut self, rule: Rule) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            rule,
            injected: 0,
            matched: 0,
        });
        id
    }

    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.id != id);
        self.entries.len() != before
    }

    /// Removes every rule and forgets hidden objects (held events are released at once by
    /// their streams as soon as they look again).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.hidden.clear();
    }

    pub fn rules(&self) -> Vec<(u64, Rule)> {
        self.entries
            .iter()
            .map(|e| (e.id, e.rule.clone()))
            .collect()
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    pub fn record_forwarded(&mut self, watch: bool) {
        self.stats.forwarded += 1;
        if watch {
            self.stats.watches += 1;
        }
    }

    fn record(&mut self, counter: String) {
        *self.stats.injected.entry(counter).or_default() += 1;
    }

    /// Draws for one rule: whether it fires now (skipped matches, probability, remaining
    /// count).
    fn fire(&mut self, index: usize) -> bool {
        let entry = &mut self.entries[index];
        entry.matched += 1;
        if entry.rule.skip.is_some_and(|n| entry.matched <= n)
            || entry.rule.count.is_some_and(|n| entry.injected >= n)
        {
            return false;
        }
        let p = entry.rule.probability;
        let hit = p >= 1.0 || (p > 0.0 && self.rng.random_bool(p.clamp(0.0, 1.0)));
        if hit {
            self.entries[index].injected += 1;
        }
        hit
    }

    /// Decides the request-level faults for one request.
    pub fn plan_request(&mut self, info: &RequestInfo) -> RequestPlan {
        let mut plan = RequestPlan::default();
        if info.verb == "watch"
            && let Some(rv) = &info.resource_version
            && self.expired.remove(&(info.resource.clone(), rv.clone()))
        {
            plan.status = Some(410);
            self.record("watch-gone".into());
            return plan;
        }
        for i in 0..self.entries.len() {
            let rule = &self.entries[i].rule;
            if rule.fault.is_watch_event_fault() || !rule.matches(info) {
                continue;
            }
            let fault = rule.fault.clone();
            let answered = plan.status.is_some() || plan.lost_response.is_some();
            let applies = match fault {
                Fault::Delay { .. } => plan.delay.is_none(),
                Fault::Status { .. } | Fault::LostResponse { .. } => {
                    !answered && plan.hold.is_none()
                }
                Fault::Hold { .. } => !answered && plan.hold.is_none() && info.verb != "watch",
                _ => false,
            };
            if !applies || !self.fire(i) {
                continue;
            }
            self.record(fault.counter());
            match fault {
                Fault::Delay { ms } => plan.delay = Some(Duration::from_millis(ms)),
                Fault::Status { code } => plan.status = Some(code),
                Fault::LostResponse { code } => plan.lost_response = Some(code),
                Fault::Hold { after } => {
                    plan.hold = Some(if after { HoldAt::After } else { HoldAt::Before })
                }
                _ => {}
            }
        }
        plan
    }

    /// Decides what happens to one watch event of `info`'s stream.
    pub fn plan_event(&mut self, info: &RequestInfo, kind: &str, object_key: &str) -> EventPlan {
        let now = Instant::now();
        let mut plan = EventPlan::default();
        self.hidden.retain(|_, until| *until > now);
        for i in 0..self.entries.len() {
            let rule = &self.entries[i].rule;
            if !rule.fault.is_watch_event_fault() || !rule.matches(info) {
                continue;
            }
            let fault = rule.fault.clone();
            match fault {
                Fault::HideNew { ms } => {
                    if kind != "ADDED" || self.hidden.contains_key(object_key) || !self.fire(i) {
                        continue;
                    }
                    self.hidden
                        .insert(object_key.to_string(), now + Duration::from_millis(ms));
                    self.record(fault.counter());
                }
                Fault::DropEvents { relist_after_ms } => {
                    if kind == "BOOKMARK" || plan.drop || !self.fire(i) {
                        continue;
                    }
                    plan.drop = true;
                    plan.relist_after = Some(Duration::from_millis(relist_after_ms));
                    self.record(fault.counter());
                }
                Fault::DuplicateEvents => {
                    if kind == "BOOKMARK" || plan.duplicate || !self.fire(i) {
                        continue;
                    }
                    plan.duplicate = true;
                    self.record(fault.counter());
                }
                Fault::CutStream => {
                    if plan.cut_after || !self.fire(i) {
                        continue;
                    }
                    plan.cut_after = true;
                    self.record(fault.counter());
                }
                Fault::DelayEvents { ms } => {
                    if !self.fire(i) {
                        continue;
                    }
                    plan.delay = plan.delay.max(Duration::from_millis(ms));
                    self.record(fault.counter());
                }
                _ => {}
            }
        }
        plan.hidden_until = self.hidden.get(object_key).copied();
        plan
    }

    /// The next attempt to resume a watch of `resource` from `resource_version` gets 410.
    pub fn expire(&mut self, resource: &str, resource_version: &str) {
        self.expired
            .insert((resource.to_string(), resource_version.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    /// method, path, query → verb, resource, name, namespace.
    type Case = (
        Method,
        &'static str,
        Option<&'static str>,
        &'static str,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    );

    #[test]
    fn parses_request_lines_like_the_api_server() {
        let cases: Vec<Case> = vec![
            (
                Method::GET,
                "/api/v1/persistentvolumes",
                Some("watch=true&resourceVersion=12"),
                "watch",
                "persistentvolumes",
                None,
                None,
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumes",
                Some("limit=500"),
                "list",
                "persistentvolumes",
                None,
                None,
            ),
            (
                Method::GET,
                "/api/v1/persistentvolumes/pvc-1",
                None,
                "get",
                "persistentvolumes",
                Some("pvc-1"),
                None,
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/persistentvolumeclaims/c1",
                None,
                "patch",
                "persistentvolumeclaims",
                Some("c1"),
                Some("ns"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/persistentvolumeclaims/c1/status",
                None,
                "update",
                "persistentvolumeclaims",
                Some("c1"),
                Some("ns"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                None,
                "update",
                "leases",
                Some("l"),
                Some("ns"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/events",
                None,
                "create",
                "events",
                None,
                Some("ns"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns",
                None,
                "delete",
                "namespaces",
                Some("ns"),
                None,
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/ns/persistentvolumeclaims",
                None,
                "watch",
                "persistentvolumeclaims",
                None,
                Some("ns"),
            ),
            (Method::GET, "/version", None, "list", "", None, None),
        ];
        for (method, path, query, verb, resource, name, ns) in cases {
            let info = RequestInfo::parse(&method, path, query);
            assert_eq!(info.verb, verb, "{path}");
            assert_eq!(info.resource, resource, "{path}");
            assert_eq!(info.name.as_deref(), name, "{path}");
            assert_eq!(info.namespace.as_deref(), ns, "{path}");
        }
        let status = RequestInfo::parse(
            &Method::PUT,
            "/api/v1/namespaces/ns/persistentvolumeclaims/c1/status",
            None,
        );
        assert!(status.resource_matches("persistentvolumeclaims"));
        assert!(status.resource_matches("persistentvolumeclaims/status"));
        assert!(!status.resource_matches("persistentvolumes"));
        let watch = RequestInfo::parse(
            &Method::GET,
            "/api/v1/persistentvolumes",
            Some("watch=1&resourceVersion=77"),
        );
        assert_eq!(watch.resource_version.as_deref(), Some("77"));
    }

    #[test]
    fn request_rules_match_verb_and_resource_and_respect_count() {
        let mut rules = RuleSet::new(7);
        rules.add(
            Rule::new(Fault::Status { code: 503 })
                .verbs(&["create"])
                .resources(&["persistentvolumes"])
                .count(2),
        );
        let create = RequestInfo::parse(&Method::POST, "/api/v1/persistentvolumes", None);
        let get = RequestInfo::parse(&Method::GET, "/api/v1/persistentvolumes/x", None);
        assert_eq!(rules.plan_request(&get), RequestPlan::default());
        assert_eq!(rules.plan_request(&create).status, Some(503));
        assert_eq!(rules.plan_request(&create).status, Some(503));
        assert_eq!(rules.plan_request(&create).status, None, "count exhausted");
        assert_eq!(rules.stats().injected.get("status-503"), Some(&2));
    }

    #[test]
    fn skip_and_count_aim_a_hold_at_exactly_one_request() {
        let mut rules = RuleSet::new(7);
        rules.add(
            Rule::new(Fault::Hold { after: false })
                .verbs(&["patch"])
                .resources(&["persistentvolumeclaims"])
                .skip(2)
                .count(1),
        );
        let patch = RequestInfo::parse(
            &Method::PATCH,
            "/api/v1/namespaces/n/persistentvolumeclaims/c",
            None,
        );
        let other = RequestInfo::parse(&Method::PATCH, "/api/v1/persistentvolumes/p", None);
        let holds: Vec<_> = (0..5)
            .map(|i| {
                assert_eq!(rules.plan_request(&other).hold, None);
                (i, rules.plan_request(&patch).hold)
            })
            .collect();
        assert_eq!(
            holds,
            vec![
                (0, None),
                (1, None),
                (2, Some(HoldAt::Before)),
                (3, None),
                (4, None)
            ]
        );
        assert_eq!(rules.stats().injected.get("hold-before"), Some(&1));
        // A watch is never held.
        let mut rules = RuleSet::new(7);
        rules.add(Rule::new(Fault::Hold { after: true }));
        let watch = RequestInfo::parse(&Method::GET, "/api/v1/pods", Some("watch=1"));
        assert_eq!(rules.plan_request(&watch).hold, None);
    }

    #[test]
    fn probability_is_seeded() {
        let draw = |seed| {
            let mut rules = RuleSet::new(seed);
            rules.add(Rule::new(Fault::Status { code: 500 }).probability(0.5));
            let info = RequestInfo::parse(&Method::GET, "/api/v1/persistentvolumes/x", None);
            (0..64)
                .map(|_| rules.plan_request(&info).status.is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        let hits = draw(3).iter().filter(|h| **h).count();
        assert!((10..54).contains(&hits), "{hits} of 64");
    }

    #[test]
    fn hide_new_hides_an_added_object_and_its_later_events() {
        let mut rules = RuleSet::new(1);
        rules.add(
            Rule::new(Fault::HideNew { ms: 60_000 })
                .verbs(&["watch"])
                .resources(&["persistentvolumes"]),
        );
        let watch = RequestInfo::parse(
            &Method::GET,
            "/api/v1/persistentvolumes",
            Some("watch=true"),
        );
        assert!(
            rules
                .plan_event(&watch, "MODIFIED", "pv/a")
                .hidden_until
                .is_none(),
            "only new objects"
        );
        let added = rules.plan_event(&watch, "ADDED", "pv/b");
        assert!(added.hidden_until.is_some());
        let later = rules.plan_event(&watch, "MODIFIED", "pv/b");
        assert_eq!(later.hidden_until, added.hidden_until, "same deadline");
        assert_eq!(rules.stats().injected.get("watch-hide"), Some(&1));
        rules.clear();
        assert!(
            rules
                .plan_event(&watch, "MODIFIED", "pv/b")
                .hidden_until
                .is_none()
        );
    }

    #[test]
    fn an_expired_resume_point_is_answered_gone_once() {
        let mut rules = RuleSet::new(1);
        rules.expire("persistentvolumes", "42");
        let resume = RequestInfo::parse(
            &Method::GET,
            "/api/v1/persistentvolumes",
            Some("watch=true&resourceVersion=42"),
        );
        assert_eq!(rules.plan_request(&resume).status, Some(410));
        assert_eq!(rules.plan_request(&resume).status, None);
    }

    #[test]
    fn rules_round_trip_through_json() {
        let rule: Rule = serde_json::from_str(
            r#"{"verbs":["watch"],"resources":["persistentvolumes"],"fault":{"kind":"hide_new","ms":5000}}"#,
        )
        .unwrap();
        assert_eq!(rule.probability, 1.0);
        assert_eq!(rule.fault, Fault::HideNew { ms: 5000 });
        let drop: Fault = serde_json::from_str(r#"{"kind":"drop_events"}"#).unwrap();
        assert_eq!(
            drop,
            Fault::DropEvents {
                relist_after_ms: 1000
            }
        );
    }
}
