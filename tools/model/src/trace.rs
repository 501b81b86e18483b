//! Counterexamples in a readable form: each step, then the world after it.

use std::fmt::Write;

use stateright::Model;
use stateright::Path;

use crate::model::{Action, Protocol};
use crate::state::{State, Task, User, VolTask};

/// One line of what matters in a state: the API server's objects, the
/// backend, the Lease, each replica's caches and work, the calls in flight.
pub fn summary(s: &State) -> String {
    let mut out = format!("t={} rv={}", s.now, s.rv);
    for i in 0..s.claims.len() {
        let claim = match s.claims[i] {
            None => "-".to_string(),
            Some(c) => {
                let mut flags = format!("u{} rv{}", c.uid, c.rv);
                for (on, name) in [
                    (c.handed, "handed"),
                    (c.intent, "intent"),
                    (c.bound, "bound"),
                    (c.deleting, "deleting"),
                    (c.handle, "handle"),
                    (c.protected, "protected"),
                    (c.clones.is_some(), "clone"),
                ] {
                    if on {
                        flags += "+";
                        flags += name;
                    }
                }
                flags
            }
        };
        let _ = write!(out, " | claim {i}: {claim}");
    }
    for u in 0..s.pvs.len() {
        let vol = &s.volumes[u];
        if s.user[u] == User::NotYet && vol.made == 0 {
            continue;
        }
        let pv = match s.pvs[u] {
            None => "-".to_string(),
            Some(p) if p.deleting => format!("{:?}+deleting", p.phase),
            Some(p) => format!("{:?}", p.phase),
        };
        let vol = match (vol.exists, vol.made) {
            (_, 0) => "-".to_string(),
            (true, n) => format!("exists (made {n})"),
            (false, n) => format!("deleted (made {n})"),
        };
        let _ = write!(out, " | u{u}: PV {pv}, volume {vol}");
    }
    if let Some((holder, until)) = s.lease {
        let _ = write!(out, " | lease r{holder} to t={until}");
    }
    for (r, rep) in s.replicas.iter().enumerate() {
        let _ = write!(
            out,
            " | r{r}{}: cache claims@{} PVs@{}",
            if s.gate_open(r) { " (leader)" } else { "" },
            rep.claims_seen,
            rep.pvs_seen
        );
        for (u, task) in rep.tasks.iter().enumerate() {
            if *task != Task::Idle {
                let _ = write!(out, ", claim u{u}: {}", task_name(task));
            }
        }
        for (u, vol) in rep.vols.iter().enumerate() {
            if *vol != VolTask::Idle {
                let _ = write!(out, ", PV u{u}: {}", vol_name(vol));
            }
        }
    }
    if !s.calls.is_empty() {
        let calls: Vec<String> = s
            .calls
            .iter()
            .map(|c| match c.replica {
                crate::world::NOBODY => format!("(orphaned) {:?} u{}", c.kind, c.uid),
                r => format!("r{r} {:?} u{}", c.kind, c.uid),
            })
            .collect();
        let _ = write!(out, " | calls in flight: {}", calls.join(", "));
    }
    out
}

/// What a replica's step did: the task it left and the one it is at now.
fn step_taken(before: &State, after: &State, action: Action) -> String {
    match action {
        Action::Step(r, i) => {
            let (r, i) = (usize::from(r), usize::from(i));
            format!(
                " [{} -> {}]",
                task_name(&before.replicas[r].tasks[i]),
                task_name(&after.replicas[r].tasks[i])
            )
        }
        Action::VolStep(r, i) => {
            let (r, i) = (usize::from(r), usize::from(i));
            format!(
                " [{} -> {}]",
                vol_name(&before.replicas[r].vols[i]),
                vol_name(&after.replicas[r].vols[i])
            )
        }
        Action::Run(k) => {
            let call = before.calls[usize::from(k)];
            format!(
                " [{:?} for claim u{} from r{}]",
                call.kind, call.uid, call.replica
            )
        }
        _ => String::new(),
    }
}

fn task_name(task: &Task) -> String {
    match task {
        Task::Confirm { copy, .. } => format!("Confirm(copy rv{})", copy.rv),
        Task::CatchUp { copy, version, .. } => {
            format!("CatchUp(copy rv{}, to rv{version})", copy.rv)
        }
        Task::Clock { copy, since, .. } => format!("Clock(copy rv{}, after rv{since})", copy.rv),
        Task::Listing { copy, .. } => format!("Listing(copy rv{})", copy.rv),
        other => format!("{other:?}"),
    }
}

fn vol_name(task: &VolTask) -> String {
    match task {
        VolTask::Confirm { copy } => format!(
            "Confirm(copy rv{}{})",
            copy.rv,
            if copy.deleting { ", deleting" } else { "" }
        ),
        other => format!("{other:?}"),
    }
}

/// A path, one numbered step a line, each with the world after it.
pub fn path(model: &Protocol, path: &Path<State, Action>) -> String {
    let mut out = String::new();
    let steps = path.clone().into_vec();
    let _ = writeln!(out, "   0. start: {}", summary(&steps[0].0));
    for (n, (state, action)) in steps.iter().enumerate() {
        if let Some(action) = action
            && let Some(next) = model.next_state(state, *action)
        {
            let _ = writeln!(
                out,
                "  {:2}. {action}{}\n        {}",
                n + 1,
                step_taken(state, &next, *action),
                summary(&next)
            );
        }
    }
    out
}

/// The fair completion from the end of `path`, for the properties about the
/// end: where it ends up, and its last steps.
pub fn completion(model: &Protocol, path: &Path<State, Action>) -> String {
    let (steps, end) = model.complete(path.last_state());
    let mut out = format!(
        "  then the fair completion ({} steps) ends at:\n        {}\n",
        steps.len(),
        summary(&end)
    );
    let shown: Vec<String> = steps
        .iter()
        .filter(|(_, a)| !matches!(a, Action::ClaimEvent(_) | Action::PvEvent(_)))
        .map(|(_, a)| a.to_string())
        .collect();
    let tail = shown.len().saturating_sub(12);
    let _ = writeln!(
        out,
        "  its acts (last {}): {}",
        shown.len() - tail,
        shown[tail..].join("; ")
    );
    out
}
