//! The calls `csi-provisioner check` makes, and the bookkeeping that makes its
//! cleanup complete: every `CreateVolume` name is recorded before the call is
//! sent, every volume id the driver answers is kept until it is deleted, and a
//! call whose outcome is unknown (timed out, interrupted, `UNAVAILABLE`, ...)
//! is repeated during cleanup to learn the id of what it may have made.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use super::judge::{Answer, CallRecord, spec_code};
use crate::csi::{CsiClient, classify, pb};

/// Every volume this program creates is named with this prefix; it never
/// deletes a volume whose create request did not carry such a name.
pub const NAME_PREFIX: &str = "check-";

/// The run was interrupted (SIGINT/SIGTERM) while a call was in flight.
#[derive(Debug)]
pub struct Interrupted;

/// A volume name of this run: always [`NAME_PREFIX`] + a random part.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CheckName(String);

impl CheckName {
    /// `check-<12 random hex digits>-<suffix>`.
    pub fn new(run: &str, suffix: &str) -> CheckName {
        CheckName(format!("{NAME_PREFIX}{run}-{suffix}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The random part shared by the names of one run.
pub fn run_id() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

pub struct Session {
    client: CsiClient,
    timeout: Duration,
    stop: CancellationToken,
    pub calls: Vec<CallRecord>,
    pub volumes: Tracker,
}

impl Session {
    pub fn new(client: CsiClient, stop: CancellationToken) -> Session {
        Session {
            timeout: client.timeout(),
            client,
            stop,
            calls: Vec::new(),
            volumes: Tracker::default(),
        }
    }

    /// Runs one call (bounded by the client's `--timeout`), records how long
    /// it took, and gives up at once when the run is interrupted.
    async fn call<T>(
        &mut self,
        method: &'static str,
        fut: impl Future<Output = Result<T, Status>>,
    ) -> Result<Answer<T>, Interrupted> {
        let start = Instant::now();
        let result = tokio::select! {
            r = fut => r,
            _ = self.stop.cancelled() => return Err(Interrupted),
        };
        let elapsed = start.elapsed();
        // The client answers DEADLINE_EXCEEDED itself when --timeout passed;
        // a driver saying so sooner is an answer like any other.
        let timed_out = matches!(&result, Err(s) if s.code() == Code::DeadlineExceeded)
            && elapsed >= self.timeout;
        self.calls.push(CallRecord {
            method,
            elapsed,
            timed_out,
        });
        Ok(match result {
            Ok(v) => Answer::Ok(v),
            Err(_) if timed_out => Answer::TimedOut,
            Err(s) => Answer::failed(s.code(), s.message()),
        })
    }

    pub async fn probe(&mut self) -> Result<Answer<pb::ProbeResponse>, Interrupted> {
        let client = self.client.clone();
        self.call("Probe", async move { client.probe().await })
            .await
    }

    pub async fn plugin_info(&mut self) -> Result<Answer<pb::GetPluginInfoResponse>, Interrupted> {
        let client = self.client.clone();
        self.call(
            "GetPluginInfo",
            async move { client.get_plugin_info().await },
        )
        .await
    }

    pub async fn plugin_capabilities(
        &mut self,
    ) -> Result<Answer<pb::GetPluginCapabilitiesResponse>, Interrupted> {
        let client = self.client.clone();
        self.call("GetPluginCapabilities", async move {
            client.get_plugin_capabilities().await
        })
        .await
    }

    pub async fn controller_capabilities(
        &mut self,
    ) -> Result<Answer<pb::ControllerGetCapabilitiesResponse>, Interrupted> {
        let client = self.client.clone();
        self.call("ControllerGetCapabilities", async move {
            client.controller_get_capabilities().await
        })
        .await
    }

    /// `CreateVolume` of `request` (whose name is a [`CheckName`]). The name
    /// is recorded before the call goes out, so an interruption mid-call still
    /// leaves the cleanup something to look for.
    pub async fn create(
        &mut self,
        name: &CheckName,
        mut request: pb::CreateVolumeRequest,
    ) -> Result<Answer<pb::Volume>, Interrupted> {
        // The name sent is always one of ours, whatever the request said.
        request.name = name.as_str().to_string();
        self.volumes.sent(request.clone());
        let client = self.client.clone();
        let sent = request.clone();
        let answer = self
            .call(
                "CreateVolume",
                async move { client.create_volume(sent).await },
            )
            .await;
        let answer = match answer {
            Err(Interrupted) => return Err(Interrupted),
            Ok(Answer::Ok(pb::CreateVolumeResponse { volume: Some(v) })) => Answer::Ok(v),
            Ok(Answer::Ok(pb::CreateVolumeResponse { volume: None })) => {
                Answer::failed(Code::Internal, "CreateVolume answered OK without a volume")
            }
            Ok(Answer::Failed { code, message }) => Answer::Failed { code, message },
            Ok(Answer::TimedOut) => Answer::TimedOut,
        };
        self.volumes.answered(&request, &answer);
        Ok(answer)
    }

    /// `DeleteVolume` of `volume_id` with the driver's own answer (`NOT_FOUND`
    /// is not turned into success here: the checks judge it).
    pub async fn delete(&mut self, volume_id: &str) -> Result<Answer<()>, Interrupted> {
        let client = self.client.clone();
        let id = volume_id.to_string();
        let answer = self
            .call("DeleteVolume", async move {
                client.delete_volume_as_answered(&id, HashMap::new()).await
            })
            .await?;
        if matches!(answer, Answer::Ok(())) {
            self.volumes.deleted(volume_id);
        }
        Ok(answer)
    }

    /// Deletes every volume this run created, and finds (by repeating its
    /// `CreateVolume`) any it may have created without learning its id. Each
    /// call may take what is left of `budget`; retryable answers are retried
    /// until then. `abort` (a second signal) stops at once.
    pub async fn cleanup(&mut self, budget: Duration, abort: &CancellationToken) -> Cleanup {
        let deadline = Instant::now() + budget;
        let mut left: BTreeMap<String, String> = BTreeMap::new();
        let pending = std::mem::take(&mut self.volumes.pending);
        for request in pending {
            match self.resolve(&request, deadline, abort).await {
                Ok(Some(volume)) => self.volumes.found(&request.name, &volume.volume_id),
                Ok(None) => {}
                Err(reason) => {
                    left.insert(request.name.clone(), reason);
                }
            }
        }
        let live: Vec<(String, String)> = self
            .volumes
            .live()
            .map(|(id, name)| (id.to_string(), name.to_string()))
            .collect();
        for (id, name) in live {
            match self.delete_until(&id, deadline, abort).await {
                Ok(()) => self.volumes.deleted_by_cleanup(&id),
                Err(reason) => {
                    left.insert(name, format!("volume {id}: {reason}"));
                }
            }
        }
        Cleanup {
            created: self
                .volumes
                .ids
                .iter()
                .map(|(id, v)| CreatedVolume {
                    name: v.name.clone(),
                    volume_id: id.clone(),
                    deleted: v.deleted,
                })
                .collect(),
            left: left
                .into_iter()
                .map(|(name, reason)| LeftVolume { name, reason })
                .collect(),
        }
    }

    /// Repeats a `CreateVolume` whose outcome is unknown until the driver
    /// says what happened: `Some(volume)` when it exists, `None` when it was
    /// not created.
    async fn resolve(
        &self,
        request: &pb::CreateVolumeRequest,
        deadline: Instant,
        abort: &CancellationToken,
    ) -> Result<Option<pb::Volume>, String> {
        loop {
            let client = self.client.with_timeout(remaining(deadline));
            let result = tokio::select! {
                r = client.create_volume(request.clone()) => r,
                _ = abort.cancelled() => return Err("interrupted again during cleanup".into()),
            };
            match result {
                Ok(r) => return Ok(r.volume),
                // ALREADY_EXISTS: the name exists with another request of this run,
                // whose id is known; any other final answer: nothing was made.
                Err(s) if !classify(s.code(), false).volume_may_exist() => return Ok(None),
                Err(s) => {
                    if pause_or_give_up(deadline, abort).await {
                        return Err(format!(
                            "may exist: CreateVolume to find it still answers {}",
                            spec_code(s.code())
                        ));
                    }
                }
            }
        }
    }

    /// `DeleteVolume` until it succeeds (`NOT_FOUND` counts: it is gone) or
    /// the budget is spent.
    async fn delete_until(
        &self,
        volume_id: &str,
        deadline: Instant,
        abort: &CancellationToken,
    ) -> Result<(), String> {
        loop {
            let client = self.client.with_timeout(remaining(deadline));
            let result = tokio::select! {
                r = client.delete_volume(volume_id, HashMap::new()) => r,
                _ = abort.cancelled() => return Err("interrupted again during cleanup".into()),
            };
            match result {
                Ok(()) => return Ok(()),
                Err(s) => {
                    if pause_or_give_up(deadline, abort).await {
                        return Err(format!(
                            "DeleteVolume still answers {}: {}",
                            spec_code(s.code()),
                            s.message()
                        ));
                    }
                }
            }
        }
    }
}

/// What is left of the cleanup budget, never zero (tokio's timeout of zero
/// would fail a call that is already answered).
fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100))
}

/// Waits a moment before the next attempt; true when it is time to give up.
async fn pause_or_give_up(deadline: Instant, abort: &CancellationToken) -> bool {
    if Instant::now() >= deadline || abort.is_cancelled() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(500)) => Instant::now() >= deadline,
        _ = abort.cancelled() => true,
    }
}

/// The volumes of this run: what was asked, what the driver answered.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Volume id → its name and whether it was deleted.
    ids: BTreeMap<String, Tracked>,
    /// Create requests whose outcome is unknown.
    pending: Vec<pb::CreateVolumeRequest>,
}

#[derive(Debug)]
struct Tracked {
    name: String,
    deleted: bool,
}

impl Tracker {
    fn sent(&mut self, request: pb::CreateVolumeRequest) {
        assert!(
            request.name.starts_with(NAME_PREFIX),
            "check creates only volumes named {NAME_PREFIX}*"
        );
        if !self.pending.contains(&request) {
            self.pending.push(request);
        }
    }

    /// Records an answer: an id to delete, or nothing made, or (a call that
    /// may still have made a volume) the request stays pending.
    fn answered(&mut self, request: &pb::CreateVolumeRequest, answer: &Answer<pb::Volume>) {
        let settled = match answer {
            Answer::Ok(v) => {
                self.found(&request.name, &v.volume_id);
                true
            }
            Answer::Failed { code, .. } => !classify(*code, false).volume_may_exist(),
            Answer::TimedOut => false,
        };
        if settled {
            self.pending.retain(|r| r != request);
        }
    }

    fn found(&mut self, name: &str, volume_id: &str) {
        if volume_id.is_empty() {
            return;
        }
        self.ids.entry(volume_id.to_string()).or_insert(Tracked {
            name: name.to_string(),
            deleted: false,
        });
    }

    fn deleted(&mut self, volume_id: &str) {
        if let Some(t) = self.ids.get_mut(volume_id) {
            t.deleted = true;
        }
    }

    fn deleted_by_cleanup(&mut self, volume_id: &str) {
        self.deleted(volume_id);
    }

    /// Volumes created and not deleted yet: (id, name).
    fn live(&self) -> impl Iterator<Item = (&str, &str)> {
        self.ids
            .iter()
            .filter(|(_, t)| !t.deleted)
            .map(|(id, t)| (id.as_str(), t.name.as_str()))
    }
}

/// What the cleanup did, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cleanup {
    /// Every volume this run created, and whether it is deleted now.
    pub created: Vec<CreatedVolume>,
    /// Volumes of this run that may still exist, with the reason.
    pub left: Vec<LeftVolume>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CreatedVolume {
    pub name: String,
    pub volume_id: String,
    pub deleted: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct LeftVolume {
    pub name: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, param: &str) -> pb::CreateVolumeRequest {
        pb::CreateVolumeRequest {
            name: name.into(),
            parameters: [("p".to_string(), param.to_string())].into(),
            ..Default::default()
        }
    }

    fn volume(id: &str) -> Answer<pb::Volume> {
        Answer::Ok(pb::Volume {
            volume_id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn an_unknown_outcome_stays_pending_until_answered() {
        let mut t = Tracker::default();
        let a = request("check-1-a", "x");
        t.sent(a.clone());
        t.answered(&a, &Answer::TimedOut);
        assert_eq!(t.pending, vec![a.clone()]);
        t.answered(&a, &Answer::failed(Code::Unavailable, ""));
        assert_eq!(t.pending.len(), 1);
        t.sent(a.clone());
        assert_eq!(t.pending.len(), 1, "one entry per request");
        t.answered(&a, &volume("v1"));
        assert!(t.pending.is_empty());
        assert_eq!(t.live().collect::<Vec<_>>(), vec![("v1", "check-1-a")]);

        // A final answer means nothing was made.
        let b = request("check-1-a", "y");
        t.sent(b.clone());
        t.answered(&b, &Answer::failed(Code::AlreadyExists, ""));
        assert!(t.pending.is_empty());

        t.deleted("v1");
        assert_eq!(t.live().count(), 0);
    }

    #[test]
    #[should_panic(expected = "check creates only volumes named check-*")]
    fn a_name_without_the_prefix_is_never_sent() {
        Tracker::default().sent(request("pvc-1", "x"));
    }

    #[test]
    fn names_carry_the_prefix() {
        let run = run_id();
        assert_eq!(run.len(), 12);
        let name = CheckName::new(&run, "a");
        assert!(name.as_str().starts_with("check-"));
        assert!(name.as_str().ends_with("-a"));
    }
}
