//! Threads and sockets an engine owns, so that stopping it can wake every
//! blocked thread (by shutting its socket down) and join every thread: no
//! thread outlives `Engine::stop`. Sockets are listed by descriptor, not by
//! a duplicate (one fd per connection); a guard must drop before its
//! socket closes, so a listed descriptor is always open.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// Registries get process-unique ids (never 0), so a thread can say whose it is.
static NEXT_REGISTRY: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The id of the registry that spawned this thread (0: none).
    static OWNER: Cell<u64> = const { Cell::new(0) };
}

/// Live sockets (for shutdown) and spawned threads (for join).
pub struct Registry {
    id: u64,
    stopping: AtomicBool,
    next_id: AtomicU64,
    sockets: Mutex<HashMap<u64, RawFd>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Removes its socket from the registry when dropped.
pub struct SocketGuard<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for SocketGuard<'_> {
    fn drop(&mut self) {
        self.registry.sockets.lock().remove(&self.id);
    }
}

/// An owned [`SocketGuard`].
pub struct OwnedSocketGuard {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for OwnedSocketGuard {
    fn drop(&mut self) {
        self.registry.sockets.lock().remove(&self.id);
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            id: NEXT_REGISTRY.fetch_add(1, Ordering::Relaxed),
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            sockets: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        }
    }
}

impl Registry {
    /// True when the calling thread is one this registry spawned (it cannot
    /// join itself: stopping from it must not wait for it).
    pub fn is_own_thread(&self) -> bool {
        OWNER.try_with(Cell::get).is_ok_and(|owner| owner == self.id)
    }

    /// True once `stop` began.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Track a socket until the guard drops. Returns `None` when stopping (the
    /// caller must not start work).
    /// The guard must drop before `stream` closes (declare it after the
    /// stream, or store it in a field declared before the stream's).
    pub fn track(&self, stream: &TcpStream) -> Option<SocketGuard<'_>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut sockets = self.sockets.lock();
        if self.stopping() {
            return None;
        }
        sockets.insert(id, stream.as_raw_fd());
        Some(SocketGuard { registry: self, id })
    }

    /// Like [`track`](Self::track), for a socket stored beyond the current
    /// scope (a pooled lane).
    pub fn track_owned(self: &Arc<Self>, stream: &TcpStream) -> Option<OwnedSocketGuard> {
        let guard = self.track(stream)?;
        let id = guard.id;
        std::mem::forget(guard);
        Some(OwnedSocketGuard { registry: self.clone(), id })
    }

    /// Sockets listed now.
    #[cfg(test)]
    pub fn socket_count(&self) -> usize {
        self.sockets.lock().len()
    }

    /// Threads spawned here and still running.
    #[cfg(test)]
    pub fn live_threads(&self) -> usize {
        self.threads.lock().iter().filter(|h| !h.is_finished()).count()
    }

    /// Threads spawned here under `name` and still running.
    #[cfg(test)]
    pub fn live_threads_named(&self, name: &str) -> usize {
        self.threads.lock().iter().filter(|h| !h.is_finished() && h.thread().name() == Some(name)).count()
    }

    /// Spawn a named thread that `stop` will join. Finished threads are
    /// reaped here so the list stays short.
    pub fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let id = self.id;
        // Marked before its body runs: the thread may log (and a log callback
        // may stop the engine) before its handle is listed below.
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            let _ = OWNER.try_with(|owner| owner.set(id));
            body();
        })?;
        let mut threads = self.threads.lock();
        let mut i = 0;
        while i < threads.len() {
            if threads[i].is_finished() {
                let _ = threads.swap_remove(i).join();
            } else {
                i += 1;
            }
        }
        threads.push(handle);
        Ok(())
    }

    /// Mark stopping and shut every tracked socket down.
    pub fn begin_stop(&self) {
        let sockets = self.sockets.lock();
        self.stopping.store(true, Ordering::Release);
        for &fd in sockets.values() {
            // SAFETY: a listed descriptor is open (its guard drops, under
            // this lock, before the socket closes); shutdown only changes
            // the socket's state, its owner still closes it.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }

    /// Join every thread spawned through `spawn` (including ones spawned
    /// while joining). Called from one of them, that thread's own handle is
    /// dropped instead (a thread cannot join itself): it ends on its own.
    pub fn join_all(&self) {
        let me = std::thread::current().id();
        loop {
            let batch: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
            if batch.is_empty() {
                return;
            }
            for h in batch {
                if h.thread().id() != me {
                    let _ = h.join();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread of the registry knows it is one, and joining every thread
    /// from it skips itself instead of failing to join itself.
    #[test]
    fn join_all_from_an_own_thread_skips_it() {
        let (registry, other) = (Arc::new(Registry::default()), Arc::new(Registry::default()));
        assert!(!registry.is_own_thread());
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = registry.clone();
        registry
            .spawn("pdx-test-sibling".to_owned(), || std::thread::sleep(std::time::Duration::from_millis(50)))
            .unwrap();
        registry
            .spawn("pdx-test-self".to_owned(), move || {
                let own = (r2.is_own_thread(), other.is_own_thread());
                r2.join_all();
                tx.send(own).unwrap();
            })
            .unwrap();
        let own = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("join_all returned");
        assert_eq!(own, (true, false));
        registry.join_all();
        assert!(registry.threads.lock().is_empty());
    }
}
