//! A fixed pool of worker threads that run lane jobs for multi-lane and
//! asynchronous batches. Jobs queued when the engine stops still run (they
//! see the stop and fail their tasks at once), so no task is left pending.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::registry::Registry;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// The pool's shared queue.
#[derive(Default)]
pub struct Workers {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Workers {
    /// Start `count` workers, registered for joining.
    pub fn start(self: &Arc<Self>, registry: &Registry, count: usize) -> std::io::Result<()> {
        for i in 0..count {
            let me = self.clone();
            registry.spawn(format!("pdx-worker-{i}"), move || me.run())?;
        }
        Ok(())
    }

    fn run(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(job) = q.jobs.pop_front() {
                        break job;
                    }
                    if q.closed {
                        return;
                    }
                    self.ready.wait(&mut q);
                }
            };
            job();
        }
    }

    /// Queue a job. After `close`, the job runs on the caller's thread
    /// instead, so it is never lost.
    pub fn submit(&self, job: Job) {
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            job();
            return;
        }
        q.jobs.push_back(job);
        drop(q);
        self.ready.notify_one();
    }

    /// Let the workers finish the queue and exit.
    pub fn close(&self) {
        self.queue.lock().closed = true;
        self.ready.notify_all();
    }
}
