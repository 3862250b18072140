//! Threads and sockets an engine owns, so that stopping it can wake every
//! blocked thread (by shutting its socket down) and join every thread: no
//! thread outlives `Engine::stop`. Sockets are listed by descriptor, not by
//! a duplicate (one fd per connection); a guard must drop before its
//! socket closes, so a listed descriptor is always open.

use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// Live sockets (for shutdown) and spawned threads (for join).
#[derive(Default)]
pub struct Registry {
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

impl Registry {
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

    /// Spawn a named thread that `stop` will join. Finished threads are
    /// reaped here so the list stays short.
    pub fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name).spawn(body)?;
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
    /// while joining). Must not be called from one of those threads.
    pub fn join_all(&self) {
        loop {
            let batch: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
            if batch.is_empty() {
                return;
            }
            for h in batch {
                let _ = h.join();
            }
        }
    }
}
