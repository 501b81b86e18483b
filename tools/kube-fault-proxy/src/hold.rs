//! Requests held by a `hold` rule until the control socket releases or drops them, and the
//! journal of the writes that went through the proxy: together they let a test kill its
//! client at one chosen write, before or after the API server acted on it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::rules::{HoldAt, RequestInfo};

/// What becomes of a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go on: forward it (held before) or send its answer (held after).
    Release,
    /// End it: never forwarded (held before), or the real answer discarded (held after).
    Drop,
}

/// A write that went through the proxy (or a held request), as the journal shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// Milliseconds since the Unix epoch when the proxy received it.
    pub at_ms: u64,
    pub verb: String,
    /// `resource[/subresource]`.
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// From the URL, or for a create from the body's `metadata.name` (`generateName` + `*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A patch's or update's body, or a create's, cut to [`BODY_LIMIT`] characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// The API server's status code, in the journal once it answered (none: it did not,
    /// or the request was dropped before it). Whatever the client was then told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// How much of a body the journal keeps.
pub const BODY_LIMIT: usize = 600;

/// Verbs that change something.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl WriteRecord {
    pub fn of(info: &RequestInfo, body: &[u8]) -> WriteRecord {
        let text = String::from_utf8_lossy(body);
        let name = info.name.clone().or_else(|| {
            let value: serde_json::Value = serde_json::from_slice(body).ok()?;
            let meta = value.get("metadata")?;
            match meta.get("name").and_then(|n| n.as_str()) {
                Some(n) => Some(n.to_string()),
                None => Some(format!("{}*", meta.get("generateName")?.as_str()?)),
            }
        });
        WriteRecord {
            at_ms: now_ms(),
            verb: info.verb.clone(),
            resource: info.full_resource(),
            namespace: info.namespace.clone(),
            name,
            body: text.chars().take(BODY_LIMIT).collect(),
            status: None,
        }
    }
}

/// A request a `hold` rule holds now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRequest {
    pub id: u64,
    pub at: HoldAt,
    pub request: WriteRecord,
    /// The API server's status code, for a request held after it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

#[derive(Default)]
struct HoldsInner {
    next: u64,
    held: BTreeMap<u64, (HeldRequest, oneshot::Sender<Decision>)>,
}

/// Every request held now, and the journal of writes (when recording).
#[derive(Default)]
pub struct Holds {
    inner: Mutex<HoldsInner>,
    journal: Mutex<Journal>,
}

/// The writes since the last [`Holds::record`], when recording; `round` tells an entry of
/// this journal from one of a journal since forgotten.
#[derive(Default)]
struct Journal {
    round: u64,
    writes: Option<Vec<WriteRecord>>,
}

/// Where [`Holds::note`] put a write, for [`Holds::answered`].
#[derive(Clone, Copy, Debug)]
pub struct JournalSlot {
    round: u64,
    index: usize,
}

/// Removes its request from [`Holds`] when the handler ends, decided or not (a client that
/// goes away may take the handler with it).
pub struct HoldGuard<'a> {
    holds: &'a Holds,
    id: u64,
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        self.holds.lock().held.remove(&self.id);
    }
}

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HoldsInner> {
        self.inner.lock().expect("holds poisoned")
    }

    /// Holds a request; the receiver gets the decision.
    pub fn hold(
        &self,
        at: HoldAt,
        request: WriteRecord,
        status: Option<u16>,
    ) -> (HoldGuard<'_>, oneshot::Receiver<Decision>) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        let held = HeldRequest {
            id,
            at,
            request,
            status,
        };
        tracing::info!(id, ?at, verb = %held.request.verb, resource = %held.request.resource, "request held");
        inner.held.insert(id, (held, tx));
        (HoldGuard { holds: self, id }, rx)
    }

    /// The requests held now, oldest first.
    pub fn held(&self) -> Vec<HeldRequest> {
        self.lock().held.values().map(|(h, _)| h.clone()).collect()
    }

    /// Decides every held request; returns how many there were.
    pub fn decide(&self, decision: Decision) -> usize {
        let held = std::mem::take(&mut self.lock().held);
        let n = held.len();
        for (_, (h, tx)) in held {
            tracing::info!(id = h.id, ?decision, "held request decided");
            let _ = tx.send(decision);
        }
        n
    }

    /// Starts a fresh journal of writes (forgetting any earlier one).
    pub fn record(&self) {
        let mut j = self.journal.lock().expect("journal poisoned");
        j.round += 1;
        j.writes = Some(Vec::new());
    }

    /// The writes recorded since [`Holds::record`] (empty when not recording).
    pub fn journal(&self) -> Vec<WriteRecord> {
        self.journal
            .lock()
            .expect("journal poisoned")
            .writes
            .clone()
            .unwrap_or_default()
    }

    /// Adds a write to the journal, when recording; returns where, for its answer.
    pub fn note(&self, record: &WriteRecord) -> Option<JournalSlot> {
        let mut j = self.journal.lock().expect("journal poisoned");
        let round = j.round;
        let writes = j.writes.as_mut()?;
        writes.push(record.clone());
        Some(JournalSlot {
            round,
            index: writes.len() - 1,
        })
    }

    /// Notes the API server's answer to a write in the journal (if it is still the same one).
    pub fn answered(&self, slot: Option<JournalSlot>, status: u16) {
        let Some(slot) = slot else { return };
        let mut j = self.journal.lock().expect("journal poisoned");
        if j.round != slot.round {
            return;
        }
        if let Some(w) = j.writes.as_mut().and_then(|w| w.get_mut(slot.index)) {
            w.status = Some(status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn a_create_is_named_from_its_body_and_long_bodies_are_cut() {
        let info = RequestInfo::parse(&Method::POST, "/api/v1/namespaces/n/events", None);
        let body = format!(
            r#"{{"metadata":{{"generateName":"c-1."}},"message":"{}"}}"#,
            "x".repeat(2000)
        );
        let record = WriteRecord::of(&info, body.as_bytes());
        assert_eq!(record.name.as_deref(), Some("c-1.*"));
        assert_eq!(record.body.chars().count(), BODY_LIMIT);
        let info = RequestInfo::parse(&Method::DELETE, "/api/v1/persistentvolumes/pv-1", None);
        assert_eq!(WriteRecord::of(&info, b"").name.as_deref(), Some("pv-1"));
    }

    #[tokio::test]
    async fn held_requests_wait_for_a_decision_and_leave_when_their_handler_ends() {
        let holds = Holds::default();
        let info = RequestInfo::parse(&Method::POST, "/api/v1/persistentvolumes", None);
        let (guard, rx) = holds.hold(HoldAt::Before, WriteRecord::of(&info, b"{}"), None);
        assert_eq!(holds.held().len(), 1);
        assert_eq!(holds.decide(Decision::Drop), 1);
        assert_eq!(rx.await.ok(), Some(Decision::Drop));
        drop(guard);
        let (guard, _rx) = holds.hold(HoldAt::After, WriteRecord::of(&info, b"{}"), Some(201));
        drop(guard);
        assert!(holds.held().is_empty(), "a handler that went away");
        assert!(holds.journal().is_empty(), "not recording");
        assert!(holds.note(&WriteRecord::of(&info, b"{}")).is_none());
        holds.record();
        let slot = holds.note(&WriteRecord::of(&info, b"{}"));
        assert_eq!(holds.journal().len(), 1);
        assert_eq!(holds.journal()[0].status, None, "not answered yet");
        holds.answered(slot, 409);
        assert_eq!(holds.journal()[0].status, Some(409));
        // An answer that comes after a new journal started is not written into it.
        holds.record();
        let _ = holds.note(&WriteRecord::of(&info, b"{}"));
        holds.answered(slot, 200);
        assert_eq!(holds.journal()[0].status, None);
    }
}
