//! Replays of dead letters started from the admin API: each runs `kafka-delay replay`'s loop
//! in a task of its own, and its counts are kept (the last 50 replays) for the console to show.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::replay::{self, Replay, Summary};

/// Replays kept.
const KEPT: usize = 50;

/// How a replay is doing.
#[derive(Debug, Clone, Serialize)]
pub struct Job {
    /// Its number, from 1.
    pub id: u64,
    /// Dead-letter topic read.
    pub from: String,
    /// Topic the records go to.
    pub to: String,
    /// Records per second, if limited.
    pub rate: Option<f64>,
    /// The filters, as given.
    pub filters: Vec<String>,
    /// `running`, `done` or `failed`.
    pub state: &'static str,
    /// Records in the topic when it started.
    pub total: u64,
    /// Records read so far.
    pub read: u64,
    /// Records moved so far.
    pub moved: u64,
    /// Records the filters left.
    pub skipped: u64,
    /// Records the cluster refused.
    pub failed: u64,
    /// Why it stopped, when it failed.
    pub error: Option<String>,
}

impl Job {
    fn count(&mut self, s: &Summary) {
        (self.total, self.read, self.moved, self.skipped, self.failed) =
            (s.total, s.read, s.moved, s.skipped, s.failed);
    }
}

/// The replays started here, newest last.
#[derive(Debug, Clone, Default)]
pub struct Replays(Arc<Mutex<(u64, VecDeque<Job>)>>);

impl Replays {
    fn update(&self, id: u64, f: impl FnOnce(&mut Job)) {
        let mut jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = jobs.1.iter_mut().find(|j| j.id == id) {
            f(job);
        }
    }

    /// Starts `replay` in a task of its own and returns its job as it starts.
    pub fn start(&self, replay: Replay, filters: Vec<String>) -> Job {
        let job = {
            let mut jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
            jobs.0 += 1;
            let job = Job {
                id: jobs.0,
                from: replay.from.clone(),
                to: replay.to.clone(),
                rate: replay.rate,
                filters,
                state: "running",
                total: 0,
                read: 0,
                moved: 0,
                skipped: 0,
                failed: 0,
                error: None,
            };
            if jobs.1.len() == KEPT {
                jobs.1.pop_front();
            }
            jobs.1.push_back(job.clone());
            job
        };
        let (me, id) = (self.clone(), job.id);
        // A thread and runtime of its own: the replay asks the cluster for metadata and
        // watermarks with blocking calls, which must not hold up the broker's runtime.
        let spawned = std::thread::Builder::new()
            .name(format!("replay-{id}"))
            .spawn(move || {
                let progress = me.clone();
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(replay::ReplayError::Runtime)
                    .and_then(|rt| {
                        rt.block_on(replay::run(&replay, |s| {
                            progress.update(id, |j| j.count(s))
                        }))
                    });
                me.update(id, |j| match result {
                    Ok(s) => {
                        j.count(&s);
                        j.state = "done";
                    }
                    Err(e) => {
                        j.state = "failed";
                        j.error = Some(e.to_string());
                    }
                });
            });
        if let Err(e) = spawned {
            self.update(id, |j| {
                j.state = "failed";
                j.error = Some(format!("cannot start the replay: {e}"));
            });
        }
        job
    }

    /// Every replay kept, newest first.
    pub fn list(&self) -> Vec<Job> {
        let jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        jobs.1.iter().rev().cloned().collect()
    }
}
