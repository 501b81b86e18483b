//! What becomes of each event before it is sent, decided without I/O: the
//! three rules of client-go's event correlator, which upstream's recorder
//! applies to every event it writes.
//!
//! 1. **Similar messages are combined.** Once one source has reported ten
//!    different messages with one reason about one object within ten minutes,
//!    each further new message goes to a single Event whose message is
//!    `(combined from similar events): ` and the latest message.
//! 2. **Repeats are counted.** An event equal to one posted before (same
//!    source, object, reason and message) bumps `count` on that Event.
//! 3. **Spam is dropped.** One source may report 25 events of one type (Normal,
//!    Warning) about one object at once, then one per 5 minutes; the rest are
//!    not sent. They are still counted, so the next Event sent carries the true
//!    count. (client-go keyed this budget on source and object alone before
//!    Kubernetes 1.32; upstream v6.4 is built with the type in the key.)
//!
//! A claim whose provisioning keeps failing gets 25 Warnings and then about
//! one per 5 minutes, not one per retry: the requests go to work instead of
//! reports, as with upstream.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::kube::throttle::TokenBucket;
use crate::names::{EventType, Reason};

/// Events of one type one source may send about one object at once.
const SPAM_BURST: u32 = 25;
/// Then one per this many seconds.
const SPAM_EVERY_SECS: f32 = 300.0;
/// The number of different messages of one reason within [`SIMILAR_WITHIN`]
/// from which they are combined.
const SIMILAR_AFTER: usize = 10;
const SIMILAR_WITHIN: Duration = Duration::from_secs(600);
/// How long a posted Event is reused for repeats.
const REUSE_FOR: Duration = Duration::from_secs(600);
/// Bound on each of the remembered maps (a full map is cleared).
const MAX_REMEMBERED: usize = 4096;
/// The message prefix of a combined Event (client-go's text, which tools match).
pub const COMBINED: &str = "(combined from similar events): ";

/// Who reports on what: an event's source and the object it is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Subject {
    pub component: String,
    pub host: String,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Over the subject's budget: nothing is sent.
    Drop,
    /// Send Event `name` with this message and count: a new Event when
    /// `count` is 1, otherwise an update of the one posted before (created
    /// anew if it is gone).
    Send {
        name: String,
        message: String,
        count: i32,
    },
}

/// One Event in the making: the one posted for a key, and its count so far
/// (0: none yet).
struct Seen {
    name: String,
    count: i32,
    at: Instant,
}

/// The different messages of one reason on one subject in the current window.
struct Similar {
    messages: HashSet<String>,
    /// The group's last event: the window restarts at each (as client-go's).
    last: Instant,
}

/// A counted Event's key; `message` is `None` for the combined Event of a reason.
#[derive(Clone, PartialEq, Eq, Hash)]
struct EventKey {
    subject: Subject,
    reason: Reason,
    message: Option<String>,
}

#[derive(Default)]
pub struct Correlator {
    similar: HashMap<(Subject, Reason), Similar>,
    seen: HashMap<EventKey, Seen>,
    budget: HashMap<(Subject, EventType), TokenBucket>,
}

impl Correlator {
    /// Judges an event at `now`; `new_name` names an Event that is not posted yet.
    pub fn judge(
        &mut self,
        subject: &Subject,
        reason: Reason,
        message: &str,
        now: Instant,
        new_name: impl FnOnce() -> String,
    ) -> Verdict {
        let (key, text) = match self.combine(subject, reason, message, now) {
            false => (Some(message.to_string()), message.to_string()),
            true => (None, format!("{COMBINED}{message}")),
        };
        let key = EventKey {
            subject: subject.clone(),
            reason,
            message: key,
        };
        let seen = bounded_entry(&mut self.seen, key, || Seen {
            name: String::new(),
            count: 0,
            at: now,
        });
        if seen.count == 0 || now.saturating_duration_since(seen.at) >= REUSE_FOR {
            seen.name = new_name();
            seen.count = 0;
        }
        seen.count = seen.count.saturating_add(1);
        seen.at = now;
        let (name, count) = (seen.name.clone(), seen.count);
        let bucket = bounded_entry(
            &mut self.budget,
            (subject.clone(), reason.event_type()),
            || TokenBucket::new(1.0 / SPAM_EVERY_SECS, SPAM_BURST),
        );
        if bucket.take_at(now).is_err() {
            return Verdict::Drop;
        }
        Verdict::Send {
            name,
            message: text,
            count,
        }
    }

    /// Notes `message` among the reason's messages; whether it is to be combined.
    fn combine(&mut self, subject: &Subject, reason: Reason, message: &str, now: Instant) -> bool {
        let group = bounded_entry(&mut self.similar, (subject.clone(), reason), || Similar {
            messages: HashSet::new(),
            last: now,
        });
        if now.saturating_duration_since(group.last) > SIMILAR_WITHIN {
            group.messages.clear();
        }
        group.last = now;
        group.messages.insert(message.to_string());
        if group.messages.len() < SIMILAR_AFTER {
            return false;
        }
        // Keep the set below the threshold, as client-go does (it drops any one
        // message; this one is as good as any and keeps the outcome repeatable).
        group.messages.remove(message);
        true
    }
}

/// The entry of `key`, made by `new` if absent, in a map of at most
/// [`MAX_REMEMBERED`] keys (a full map is emptied first).
fn bounded_entry<K: Eq + Hash, V>(
    map: &mut HashMap<K, V>,
    key: K,
    new: impl FnOnce() -> V,
) -> &mut V {
    if map.len() >= MAX_REMEMBERED && !map.contains_key(&key) {
        map.clear();
    }
    map.entry(key).or_insert_with(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(name: &str, component: &str) -> Subject {
        Subject {
            component: component.into(),
            host: String::new(),
            api_version: "v1".into(),
            kind: "PersistentVolumeClaim".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    /// Judges with names `e1`, `e2`, … for new Events.
    struct Run {
        c: Correlator,
        names: u32,
        t0: Instant,
    }

    impl Run {
        fn new() -> Run {
            Run {
                c: Correlator::default(),
                names: 0,
                t0: Instant::now(),
            }
        }

        fn at(&mut self, secs: u64, s: &Subject, reason: Reason, message: &str) -> Verdict {
            let names = &mut self.names;
            self.c.judge(
                s,
                reason,
                message,
                self.t0 + Duration::from_secs(secs),
                || {
                    *names += 1;
                    format!("e{names}")
                },
            )
        }
    }

    fn send(name: &str, message: &str, count: i32) -> Verdict {
        Verdict::Send {
            name: name.into(),
            message: message.into(),
            count,
        }
    }

    #[test]
    fn repeats_are_counted_on_one_event_until_the_budget_is_spent() {
        let mut r = Run::new();
        let c = subject("c", "p");
        for n in 1..=25 {
            assert_eq!(
                r.at(n, &c, Reason::ProvisioningFailed, "boom"),
                send("e1", "boom", n as i32)
            );
        }
        // The 26th and 27th within the window are dropped, but counted.
        assert_eq!(
            r.at(26, &c, Reason::ProvisioningFailed, "boom"),
            Verdict::Drop
        );
        assert_eq!(
            r.at(27, &c, Reason::ProvisioningFailed, "boom"),
            Verdict::Drop
        );
        // One more token 5 minutes after the budget ran out: the count is the true one.
        assert_eq!(
            r.at(25 + 300, &c, Reason::ProvisioningFailed, "boom"),
            send("e1", "boom", 28)
        );
        assert_eq!(
            r.at(25 + 301, &c, Reason::ProvisioningFailed, "boom"),
            Verdict::Drop
        );
    }

    #[test]
    fn the_budget_is_per_source_object_and_type_across_reasons() {
        let mut r = Run::new();
        let (c, d) = (subject("c", "p"), subject("d", "p"));
        for n in 0..25 {
            let reason = if n % 2 == 0 {
                Reason::ProvisioningFailed
            } else {
                Reason::ProvisioningCleanupFailed
            };
            assert!(matches!(r.at(1, &c, reason, "x"), Verdict::Send { .. }));
        }
        assert_eq!(r.at(1, &c, Reason::ProvisioningFailed, "y"), Verdict::Drop);
        // Normal events about the same object have a budget of their own, as have another
        // object and the same object from another source.
        assert!(matches!(
            r.at(1, &c, Reason::Provisioning, "x"),
            Verdict::Send { .. }
        ));
        assert!(matches!(
            r.at(1, &d, Reason::ProvisioningFailed, "x"),
            Verdict::Send { .. }
        ));
        let other_source = subject("c", "external-provisioner");
        assert!(matches!(
            r.at(1, &other_source, Reason::ProvisioningFailed, "x"),
            Verdict::Send { .. }
        ));
    }

    #[test]
    fn the_tenth_different_message_of_a_reason_is_combined() {
        let mut r = Run::new();
        let c = subject("c", "p");
        for n in 1..=9 {
            let m = format!("error {n}");
            assert_eq!(
                r.at(n, &c, Reason::ProvisioningFailed, &m),
                send(&format!("e{n}"), &m, 1)
            );
        }
        let combined = |m: &str| format!("{COMBINED}{m}");
        assert_eq!(
            r.at(10, &c, Reason::ProvisioningFailed, "error 10"),
            send("e10", &combined("error 10"), 1)
        );
        // Further new messages update the one combined Event.
        assert_eq!(
            r.at(11, &c, Reason::ProvisioningFailed, "error 11"),
            send("e10", &combined("error 11"), 2)
        );
        // A repeat of an earlier message is still counted on its own Event.
        assert_eq!(
            r.at(12, &c, Reason::ProvisioningFailed, "error 3"),
            send("e3", "error 3", 2)
        );
        // Another reason is a group of its own.
        assert_eq!(
            r.at(13, &c, Reason::Provisioning, "error 12"),
            send("e11", "error 12", 1)
        );
    }

    #[test]
    fn similar_messages_and_repeats_are_forgotten_after_ten_quiet_minutes() {
        let mut r = Run::new();
        let c = subject("c", "p");
        for n in 1..=10 {
            r.at(n, &c, Reason::ProvisioningFailed, &format!("error {n}"));
        }
        // 601 s after the group's last event: a new message starts a new group.
        assert_eq!(
            r.at(611, &c, Reason::ProvisioningFailed, "error 11"),
            send("e11", "error 11", 1)
        );
        // 601 s after "error 1" was last seen: a new Event, count 1.
        assert_eq!(
            r.at(611, &c, Reason::ProvisioningFailed, "error 1"),
            send("e12", "error 1", 1)
        );
    }

    #[test]
    fn the_remembered_maps_are_bounded() {
        let mut r = Run::new();
        for n in 0..(MAX_REMEMBERED + 10) {
            r.at(
                1,
                &subject(&format!("c{n}"), "p"),
                Reason::ProvisioningFailed,
                "x",
            );
        }
        assert!(r.c.seen.len() <= MAX_REMEMBERED);
        assert!(r.c.similar.len() <= MAX_REMEMBERED);
        assert!(r.c.budget.len() <= MAX_REMEMBERED);
    }
}
