//! One checker run: breadth first (so a counterexample is a shortest path),
//! its state counts and time, and any property broken with its trace.

use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::config::Config;
use crate::model::Protocol;
use crate::trace;

/// What a run found.
pub struct Outcome {
    pub config: String,
    pub states: usize,
    pub unique: usize,
    pub depth: usize,
    pub took: Duration,
    /// Each broken property (an `always` with a counterexample), with its
    /// shortest path in a readable form.
    pub broken: Vec<(&'static str, String)>,
    /// `sometimes` properties never reached (the model would be vacuous).
    pub unreached: Vec<&'static str>,
}

impl Outcome {
    pub fn report(&self) -> String {
        let mut out = format!(
            "{}: {} states ({} unique), depth {}, {:.1} s",
            self.config,
            self.states,
            self.unique,
            self.depth,
            self.took.as_secs_f64()
        );
        for name in &self.unreached {
            out += &format!("\n  never reached: {name}");
        }
        for (name, path) in &self.broken {
            out += &format!("\n  COUNTEREXAMPLE: {name}\n{path}");
        }
        out
    }
}

/// Checks `cfg` to completion on `threads` threads.
pub fn check(cfg: Config, threads: usize) -> Outcome {
    check_until(cfg, threads, HasDiscoveries::All)
}

/// Checks `cfg` on `threads` threads until `done` (a wrong variant stops at
/// the counterexamples it must give).
pub fn check_until(cfg: Config, threads: usize, done: HasDiscoveries) -> Outcome {
    let name = cfg.name.to_string();
    let started = Instant::now();
    let mut builder = Protocol::new(cfg)
        .checker()
        .threads(threads)
        .finish_when(done);
    // For probing a configuration's size: stop after this many seconds.
    if let Some(secs) = std::env::var("MODEL_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        builder = builder.timeout(Duration::from_secs(secs));
    }
    let checker = builder.spawn_bfs().join();
    let took = started.elapsed();
    let model = checker.model();
    let mut broken = Vec::new();
    let mut unreached = Vec::new();
    for property in model.properties() {
        let found = checker.discovery(property.name);
        match (property.expectation, found) {
            (Expectation::Sometimes, None) => unreached.push(property.name),
            (Expectation::Sometimes, Some(_)) | (_, None) => {}
            (_, Some(path)) => {
                let mut text = trace::path(model, &path);
                if property.name == crate::properties::NO_LEAK
                    || property.name == crate::properties::LIVE
                {
                    text += &trace::completion(model, &path);
                }
                broken.push((property.name, text));
            }
        }
    }
    Outcome {
        config: name,
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        took,
        broken,
        unreached,
    }
}
