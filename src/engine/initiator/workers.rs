//! Worker threads that run lane jobs for multi-lane and asynchronous
//! batches, with one queue per peer: a peer gets at most `per_peer` workers
//! at a time (it has no more lanes to use), and a job for a peer with none
//! running never waits behind another peer's jobs, because the pool grows by
//! a thread whenever runnable work finds no idle worker. Threads past the
//! base count leave after a few idle seconds, so the pool costs one thread
//! per busy lane, not one per peer ever seen. Jobs queued when the engine
//! stops still run (they see the stop and fail their tasks at once), so no
//! task is left pending.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::super::registry::Registry;

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::workers";

type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long a worker above the base count stays idle before it leaves.
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// A hard bound on worker threads (peers x lanes beyond it queue).
const MAX_THREADS: usize = 1024;

#[derive(Default)]
struct PeerQueue {
    jobs: VecDeque<Job>,
    running: usize,
    /// In `State::runnable`.
    listed: bool,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, PeerQueue>,
    /// Peers with a queued job and a free worker slot, in arrival order.
    runnable: VecDeque<String>,
    threads: usize,
    idle: usize,
    base: usize,
    per_peer: usize,
    closed: bool,
}

impl State {
    fn list_if_runnable(&mut self, key: &str) {
        let per_peer = self.per_peer.max(1);
        if let Some(q) = self.queues.get_mut(key) {
            if !q.listed && !q.jobs.is_empty() && q.running < per_peer {
                q.listed = true;
                self.runnable.push_back(key.to_owned());
            }
        }
    }

    /// Whether runnable work lacks an idle worker and a thread may be added.
    fn wants_thread(&self) -> bool {
        !self.closed && self.runnable.len() > self.idle && self.threads < MAX_THREADS
    }
}

/// The pool's per-peer queues.
#[derive(Default)]
pub struct Workers {
    state: Mutex<State>,
    ready: Condvar,
    registry: OnceLock<Arc<Registry>>,
}

impl Workers {
    /// Start `count` workers (the base that stays), registered for joining;
    /// each peer gets at most `per_peer` at a time.
    pub fn start(self: &Arc<Self>, registry: &Arc<Registry>, count: usize, per_peer: usize) -> std::io::Result<()> {
        let _ = self.registry.set(registry.clone());
        {
            let mut st = self.state.lock();
            st.base = count;
            st.per_peer = per_peer;
        }
        for _ in 0..count {
            self.add_thread()?;
        }
        Ok(())
    }

    fn add_thread(self: &Arc<Self>) -> std::io::Result<()> {
        let Some(registry) = self.registry.get() else { return Ok(()) };
        let n = {
            let mut st = self.state.lock();
            st.threads += 1;
            st.threads
        };
        let me = self.clone();
        let spawned = registry.spawn(format!("pdx-worker-{n}"), move || me.run());
        if spawned.is_err() {
            self.state.lock().threads -= 1;
        }
        spawned
    }

    fn run(&self) {
        loop {
            let (key, job) = {
                let mut st = self.state.lock();
                loop {
                    if let Some(key) = st.runnable.pop_front() {
                        // A listed peer always has a queue; skip it if not.
                        let Some(q) = st.queues.get_mut(&key) else { continue };
                        q.listed = false;
                        if let Some(job) = q.jobs.pop_front() {
                            q.running += 1;
                            st.list_if_runnable(&key);
                            break (key, job);
                        }
                        continue;
                    }
                    if st.closed {
                        st.threads -= 1;
                        return;
                    }
                    st.idle += 1;
                    let timed_out = self.ready.wait_for(&mut st, IDLE_EXIT).timed_out();
                    st.idle -= 1;
                    if timed_out && st.runnable.is_empty() && st.threads > st.base {
                        st.threads -= 1;
                        return;
                    }
                }
            };
            job();
            let mut st = self.state.lock();
            let empty = match st.queues.get_mut(&key) {
                Some(q) => {
                    q.running -= 1;
                    q.running == 0 && q.jobs.is_empty()
                }
                None => false,
            };
            if empty {
                st.queues.remove(&key);
            } else {
                st.list_if_runnable(&key);
                drop(st);
                self.ready.notify_one();
            }
        }
    }

    /// Queue a job for `peer`. After `close`, the job runs on the caller's
    /// thread instead, so it is never lost.
    pub fn submit(self: &Arc<Self>, peer: &str, job: Job) {
        let mut st = self.state.lock();
        if st.closed {
            drop(st);
            job();
            return;
        }
        st.queues.entry(peer.to_owned()).or_default().jobs.push_back(job);
        st.list_if_runnable(peer);
        let grow = st.wants_thread();
        drop(st);
        if grow {
            if let Err(e) = self.add_thread() {
                log::warn!(target: LOG_TARGET, "cannot start another worker thread ({e}); the job waits for a free one");
            }
        }
        self.ready.notify_one();
    }

    /// Worker threads now.
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.state.lock().threads
    }

    /// Let the workers finish the queue and exit.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Instant;

    #[test]
    fn a_blocked_peer_does_not_hold_up_another() {
        let registry = Arc::new(Registry::default());
        let workers = Arc::new(Workers::default());
        workers.start(&registry, 2, 2).unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let started = Arc::new(AtomicUsize::new(0));
        // Ten jobs for a frozen peer: at most two run, the rest queue.
        for _ in 0..10 {
            let (rx, started) = (release_rx.clone(), started.clone());
            workers.submit(
                "frozen",
                Box::new(move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = rx.lock().unwrap().recv();
                }),
            );
        }
        let (done_tx, done_rx) = mpsc::channel();
        let t0 = Instant::now();
        workers.submit("healthy", Box::new(move || done_tx.send(()).unwrap()));
        done_rx.recv_timeout(Duration::from_secs(2)).expect("the healthy peer's job runs at once");
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(started.load(Ordering::SeqCst), 2, "the frozen peer holds at most per_peer workers");
        for _ in 0..10 {
            release_tx.send(()).unwrap();
        }
        workers.close();
        registry.join_all();
        assert_eq!(started.load(Ordering::SeqCst), 10, "every queued job ran");
        assert_eq!(workers.threads(), 0);
    }
}
