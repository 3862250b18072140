//! Layer-wise submits of a KV plan, on any backend: each submit is an
//! ordinary batch that starts at once; a notification passed with a submit
//! is sent only after that submit and every earlier submit of the same plan
//! to the same session have landed, so the last layer's submit can carry
//! "this request is complete".
//!
//! The ordering lives here, above the backends: the notifying submit goes
//! to the backend without its notification, and a short-lived watcher
//! thread waits for its batch and the earlier unfinished ones (each wait
//! bounded), then sends the notification through the backend's `notify`.
//! The notification is sent only when every one of those batches
//! completed; its outcome is kept for [`notify_outcome`].

use std::collections::{HashMap, VecDeque};
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::kv::KvPlan;
use super::notification::shown;
use super::{Direction, Notification, TaskState, TransferBackend};
use crate::error::{Error, ErrorKind, Result};

/// Most notifications waiting for their layers at once (one watcher
/// thread each), process-wide.
pub(crate) const MAX_PENDING_NOTIFICATIONS: usize = 1024;
/// Most unfinished submits one plan tracks per engine and session.
pub(crate) const MAX_UNFINISHED_SUBMITS: usize = 1 << 16;
/// Sessions one plan tracks before it sweeps those with nothing unfinished.
const STREAMS_BEFORE_SWEEP: usize = 1024;
/// Notification outcomes kept for [`notify_outcome`], the most recent ones.
const KEPT_OUTCOMES: usize = 4096;
/// How long a watcher waits for the layers before giving the notification
/// up (the engine's own deadlines end every batch long before).
const LAYERS_WAIT_LIMIT: Duration = Duration::from_secs(600);
/// One wait of a watcher on one batch.
const WAIT_STEP: Duration = Duration::from_millis(500);

static WATCHERS: AtomicUsize = AtomicUsize::new(0);

/// Where a deferred notification stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyOutcome {
    /// Waiting for the layers to land.
    Pending,
    /// Delivered to the peer.
    Sent,
    /// Not delivered: a layer failed, the wait hit its limit, or the peer
    /// refused it.
    Failed(Error),
}

struct NotifySlot {
    outcome: Mutex<NotifyOutcome>,
    changed: Condvar,
}

/// A deferred notification by (engine key, batch id).
type KeptOutcome = ((u64, u64), Arc<NotifySlot>);

/// Outcomes, oldest first.
static OUTCOMES: Mutex<VecDeque<KeptOutcome>> = parking_lot::const_mutex(VecDeque::new());

fn slot_of(engine_key: u64, batch: u64) -> Option<Arc<NotifySlot>> {
    OUTCOMES.lock().iter().rev().find(|(k, _)| *k == (engine_key, batch)).map(|(_, s)| s.clone())
}

/// The deferred notification of `batch` (a KV submit of the engine
/// `engine_key` that carried one): `None` when there is none (or it is too
/// old to be kept); otherwise its outcome, waiting up to `timeout` while it
/// is pending.
pub fn notify_outcome(engine_key: u64, batch: u64, timeout: Duration) -> Option<NotifyOutcome> {
    let slot = slot_of(engine_key, batch)?;
    let deadline = Instant::now().checked_add(timeout);
    let mut outcome = slot.outcome.lock();
    while *outcome == NotifyOutcome::Pending {
        match deadline {
            Some(d) => {
                if slot.changed.wait_until(&mut outcome, d).timed_out() {
                    break;
                }
            }
            None => slot.changed.wait(&mut outcome),
        }
    }
    Some(outcome.clone())
}

/// The submits of one plan not yet known to have finished, per engine and
/// session, in submit order.
#[derive(Default)]
pub struct LayerStreams {
    unfinished: Mutex<HashMap<(u64, String), Vec<u64>>>,
}

/// A backend a watcher thread can keep alive.
pub trait SharedBackend: Deref<Target = dyn TransferBackend> + Send + Sync + 'static {}
impl<T: Deref<Target = dyn TransferBackend> + Send + Sync + 'static> SharedBackend for T {}

/// Releases a watcher's place in [`WATCHERS`].
struct WatcherPlace;
impl WatcherPlace {
    fn take() -> Result<WatcherPlace> {
        let was = WATCHERS.fetch_add(1, Ordering::AcqRel);
        if was >= MAX_PENDING_NOTIFICATIONS {
            WATCHERS.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{MAX_PENDING_NOTIFICATIONS} KV notifications are already waiting for their layers; retry later"
                ),
            ));
        }
        Ok(WatcherPlace)
    }
}
impl Drop for WatcherPlace {
    fn drop(&mut self) {
        WATCHERS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LayerStreams {
    /// Submit buffers `[first, end)` of `plan` to `session` on `backend`
    /// (known as `engine_key`) and return the batch id at once. With
    /// `notify`, the notification follows once this submit and every
    /// earlier unfinished submit of this plan to this session (on this
    /// engine) have completed; it is not sent if one of them failed. With
    /// `after` (a `CUevent`), the batch's local bytes are read or written
    /// only after that event completed (see `TransferBackend::submit_after`).
    ///
    /// Earlier batches the caller already freed count as finished (a batch
    /// can only be freed once it is).
    ///
    /// # Safety
    /// The local memory of those buffers stays valid until the batch is
    /// finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn submit<B: SharedBackend>(
        &self,
        engine_key: u64,
        backend: B,
        plan: &KvPlan,
        session: &str,
        (first, end): (usize, usize),
        direction: Direction,
        notify: Option<Notification>,
        after: Option<usize>,
    ) -> Result<u64> {
        if direction == Direction::Read {
            plan.check_readable()?;
        }
        if let Some(note) = &notify {
            // Refused now, not after the layers landed.
            backend.check_notification(note)?;
        }
        let reqs = plan.requests(first, end, backend.max_batch_entries())?;
        let place = notify.as_ref().map(|_| WatcherPlace::take()).transpose()?;
        let mut streams = self.unfinished.lock();
        if streams.len() >= STREAMS_BEFORE_SWEEP {
            // Many sessions: forget those of this engine with nothing unfinished.
            streams.retain(|(key, _), ids| {
                *key != engine_key || {
                    drop_finished(&*backend, ids);
                    !ids.is_empty()
                }
            });
        }
        let ids = streams.entry((engine_key, session.to_owned())).or_default();
        drop_finished(&*backend, ids);
        if ids.len() >= MAX_UNFINISHED_SUBMITS {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{} submits of this plan to {session} are unfinished (or failed and not freed); wait for or \
                     free them first",
                    ids.len()
                ),
            ));
        }
        // SAFETY: the caller keeps the local memory valid until the batch finishes.
        let id = unsafe { backend.submit_after(session, direction, reqs, None, after)? };
        ids.push(id);
        if let (Some(note), Some(place)) = (notify, place) {
            let waits = ids.clone();
            drop(streams);
            let slot = Arc::new(NotifySlot { outcome: Mutex::new(NotifyOutcome::Pending), changed: Condvar::new() });
            {
                let mut kept = OUTCOMES.lock();
                if kept.len() >= KEPT_OUTCOMES {
                    kept.pop_front();
                }
                kept.push_back(((engine_key, id), slot.clone()));
            }
            let session = session.to_owned();
            let watcher = move || {
                let _place = place;
                let outcome = match wait_all(&*backend, &waits) {
                    Ok(()) => match backend.notify(&session, &note) {
                        Ok(()) => NotifyOutcome::Sent,
                        Err(e) => NotifyOutcome::Failed(e),
                    },
                    Err(e) => NotifyOutcome::Failed(e),
                };
                if let NotifyOutcome::Failed(e) = &outcome {
                    log::warn!("KV notification {} to {session} not delivered: {e}", shown(&note.name));
                }
                *slot.outcome.lock() = outcome;
                slot.changed.notify_all();
            };
            if let Err(e) = std::thread::Builder::new().name("pdx-kv-notify".into()).spawn(watcher) {
                // The batch runs; only its notification is lost, and said so.
                log::warn!("cannot start the KV notification watcher: {e}");
                if let Some(s) = slot_of(engine_key, id) {
                    *s.outcome.lock() = NotifyOutcome::Failed(Error::io(format!("cannot start a thread: {e}")));
                    s.changed.notify_all();
                }
            }
        }
        Ok(id)
    }
}

/// Drop finished submits from the front of `ids` (they finish mostly in
/// order); a failed one stays until the caller frees it.
fn drop_finished(backend: &dyn TransferBackend, ids: &mut Vec<u64>) {
    let done = ids
        .iter()
        .take_while(|&&id| match backend.batch_summary(id) {
            Ok(s) => s.state == TaskState::Completed,
            Err(e) => e.kind() == ErrorKind::InvalidHandle,
        })
        .count();
    ids.drain(..done);
}

/// The error of the failed (or cancelled) batch `id` of `total` tasks: its
/// first failed task's own error (so its kind, e.g. `RemoteRejected`,
/// decides the status the caller sees), naming the batch and how many of
/// its requests failed; a cancelled task's `Canceled` where none failed.
fn batch_failure(backend: &dyn TransferBackend, id: u64, total: usize) -> Error {
    let ended = |state| {
        (0..total).filter_map(move |task| match backend.task_summary(id, task) {
            Ok(t) if t.state == state => Some(t.error),
            _ => None,
        })
    };
    let failures = ended(TaskState::Failed).chain(ended(TaskState::Canceled));
    match super::state::outcome(total, failures) {
        Err(e) => e.context(format!("batch {id:#x} of this plan failed")),
        // Freed by the caller in the meantime: what its tasks failed with is gone.
        Ok(()) => Error::new(
            ErrorKind::ConnectionLost,
            format!("batch {id:#x} of this plan failed (freed before its errors were read)"),
        ),
    }
}

/// Wait for every batch of `ids` to complete (in submit order); the
/// earliest one's failure otherwise.
fn wait_all(backend: &dyn TransferBackend, ids: &[u64]) -> Result<()> {
    let deadline = Instant::now() + LAYERS_WAIT_LIMIT;
    for &id in ids {
        loop {
            match backend.batch_wait(id, WAIT_STEP) {
                Ok(s) if s.state == TaskState::Completed => break,
                Ok(s) => return Err(batch_failure(backend, id, s.total)),
                // Freed by the caller, which it can only do once it finished.
                Err(e) if e.kind() == ErrorKind::InvalidHandle => break,
                Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() < deadline => {}
                Err(e) => return Err(e.context(format!("waiting for batch {id:#x}"))),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::kv::KvBuffer;
    use crate::transfer::location::Requested;
    use crate::transfer::{BatchSummary, Request, TaskSummary};
    use parking_lot::Condvar;

    /// A backend whose batches finish when the test says so.
    #[derive(Default)]
    struct Scripted {
        batches: Mutex<HashMap<u64, TaskState>>,
        /// The error of a failed batch's single task (else `ConnectionLost`).
        errors: Mutex<HashMap<u64, Error>>,
        changed: Condvar,
        next: Mutex<u64>,
        sent: Mutex<Vec<(String, Notification)>>,
    }

    impl Scripted {
        fn finish(&self, id: u64, state: TaskState) {
            self.batches.lock().insert(id, state);
            self.changed.notify_all();
        }
        fn summary(state: TaskState) -> BatchSummary {
            let failed = usize::from(state == TaskState::Failed);
            let completed = usize::from(state == TaskState::Completed);
            let canceled = usize::from(state == TaskState::Canceled);
            BatchSummary { state, total: 1, completed, failed, canceled, bytes: 0 }
        }
    }

    fn gone(id: u64) -> Error {
        Error::new(ErrorKind::InvalidHandle, format!("batch {id:#x} is not live"))
    }

    impl TransferBackend for Scripted {
        fn session_id(&self) -> &str {
            "scripted:1"
        }
        fn rpc_port(&self) -> u16 {
            1
        }
        fn protocol(&self) -> &str {
            "scripted"
        }
        fn register_batch(&self, _: &[(u64, u64)]) -> Result<()> {
            Ok(())
        }
        fn register_batch_at(&self, _: &[(u64, u64)], _: Requested) -> Result<()> {
            Ok(())
        }
        fn unregister_batch(&self, _: &[u64]) -> Result<()> {
            Ok(())
        }
        unsafe fn transfer_sync(&self, _: &str, _: Direction, _: Vec<Request>) -> Result<()> {
            Ok(())
        }
        unsafe fn submit(&self, _: &str, _: Direction, _: Vec<Request>, notify: Option<Notification>) -> Result<u64> {
            assert!(notify.is_none(), "the KV layer sends notifications itself");
            let mut next = self.next.lock();
            *next += 1;
            self.batches.lock().insert(*next, TaskState::Pending);
            Ok(*next)
        }
        fn batch_summary(&self, id: u64) -> Result<BatchSummary> {
            self.batches.lock().get(&id).map(|&s| Self::summary(s)).ok_or_else(|| gone(id))
        }
        fn task_summary(&self, id: u64, task: usize) -> Result<TaskSummary> {
            let state = *self.batches.lock().get(&id).ok_or_else(|| gone(id))?;
            if task != 0 {
                return Err(Error::new(ErrorKind::IndexOutOfRange, format!("task {task}")));
            }
            let error = match state {
                TaskState::Failed => Some(
                    self.errors
                        .lock()
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| Error::new(ErrorKind::ConnectionLost, "lost")),
                ),
                TaskState::Canceled => Some(crate::transfer::state::canceled()),
                _ => None,
            };
            Ok(TaskSummary { state, bytes: 0, error })
        }
        fn batch_wait(&self, id: u64, timeout: Duration) -> Result<BatchSummary> {
            let deadline = Instant::now() + timeout;
            let mut batches = self.batches.lock();
            loop {
                match batches.get(&id).copied() {
                    None => return Err(gone(id)),
                    Some(s) if s.is_terminal() => return Ok(Self::summary(s)),
                    Some(_) if self.changed.wait_until(&mut batches, deadline).timed_out() => {
                        return Err(Error::timeout("pending"))
                    }
                    Some(_) => {}
                }
            }
        }
        fn batch_free(&self, id: u64) -> Result<()> {
            self.batches.lock().remove(&id).map(|_| ()).ok_or_else(|| gone(id))
        }
        fn probe(&self, _: &str) -> Result<()> {
            Ok(())
        }
        fn notify(&self, session: &str, note: &Notification) -> Result<()> {
            self.sent.lock().push((session.into(), note.clone()));
            Ok(())
        }
        fn drain_notifications(&self) -> Vec<Notification> {
            Vec::new()
        }
        fn stats(&self) -> crate::transfer::stats::StatsSnapshot {
            crate::transfer::stats::Stats::default().snapshot(Default::default())
        }
        fn stop(&self) {}
    }

    fn plan(layers: usize) -> KvPlan {
        let bufs: Vec<KvBuffer> =
            (0..layers as u64).map(|i| KvBuffer { base: 0x1000 + i * 0x1000, page_bytes: 64, pages: 8 }).collect();
        KvPlan::new(&bufs, &bufs, &[0, 1], &[2, 3], None).unwrap()
    }

    fn submit(streams: &LayerStreams, key: u64, b: &Arc<Scripted>, p: &KvPlan, layer: usize, notify: bool) -> u64 {
        let notify = notify.then(|| Notification::new("kv_done", format!("room-{key}")));
        let backend: Arc<dyn TransferBackend> = b.clone();
        // SAFETY: the scripted backend touches no memory.
        unsafe {
            streams.submit(key, backend, p, "peer:2", (layer, layer + 1), Direction::Write, notify, None).unwrap()
        }
    }

    #[test]
    fn the_notification_waits_for_every_earlier_layer_and_comes_once() {
        let (b, p, streams) = (Arc::new(Scripted::default()), plan(3), LayerStreams::default());
        let ids: Vec<u64> = (0..3).map(|l| submit(&streams, 7, &b, &p, l, l == 2)).collect();
        b.finish(ids[2], TaskState::Completed);
        b.finish(ids[1], TaskState::Completed);
        assert_eq!(notify_outcome(7, ids[2], Duration::from_millis(100)), Some(NotifyOutcome::Pending));
        assert!(b.sent.lock().is_empty(), "layer 0 has not landed");
        b.finish(ids[0], TaskState::Completed);
        assert_eq!(notify_outcome(7, ids[2], Duration::from_secs(30)), Some(NotifyOutcome::Sent));
        assert_eq!(*b.sent.lock(), vec![("peer:2".to_owned(), Notification::new("kv_done", "room-7"))]);
        assert_eq!(notify_outcome(7, ids[1], Duration::ZERO), None, "layers without a notification have none");
        // The next request through the same plan waits only for what is unfinished.
        let next = submit(&streams, 7, &b, &p, 0, true);
        assert_eq!(streams.unfinished.lock()[&(7, "peer:2".to_owned())], vec![next], "finished submits are dropped");
        b.finish(next, TaskState::Completed);
        assert_eq!(notify_outcome(7, next, Duration::from_secs(30)), Some(NotifyOutcome::Sent));
        assert_eq!(b.sent.lock().len(), 2);
    }

    #[test]
    fn many_sessions_are_swept_once_finished() {
        let (b, p, streams) = (Arc::new(Scripted::default()), plan(1), LayerStreams::default());
        for i in 0..STREAMS_BEFORE_SWEEP + 10 {
            let backend: Arc<dyn TransferBackend> = b.clone();
            // SAFETY: the scripted backend touches no memory.
            let id =
                unsafe { streams.submit(9, backend, &p, &format!("peer:{i}"), (0, 1), Direction::Write, None, None) };
            b.finish(id.unwrap(), TaskState::Completed);
        }
        let left = streams.unfinished.lock().len();
        assert!(left < 20, "{left} sessions kept");
    }

    #[test]
    fn a_failed_layer_holds_the_notification_back_and_freed_ones_count_as_landed() {
        let (b, p, streams) = (Arc::new(Scripted::default()), plan(3), LayerStreams::default());
        let first = submit(&streams, 8, &b, &p, 0, false);
        b.finish(first, TaskState::Failed);
        let last = submit(&streams, 8, &b, &p, 1, true);
        b.finish(last, TaskState::Completed);
        match notify_outcome(8, last, Duration::from_secs(30)) {
            Some(NotifyOutcome::Failed(e)) => assert!(e.message().contains("failed"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(b.sent.lock().is_empty());
        // Once the caller frees the failed batch, later requests go through.
        b.batch_free(first).unwrap();
        let again = submit(&streams, 8, &b, &p, 2, true);
        b.finish(again, TaskState::Completed);
        assert_eq!(notify_outcome(8, again, Duration::from_secs(30)), Some(NotifyOutcome::Sent));
        assert_eq!(b.sent.lock().len(), 1);
    }

    #[test]
    fn a_cancelled_layer_holds_the_notification_back_and_says_so() {
        let (b, p, streams) = (Arc::new(Scripted::default()), plan(2), LayerStreams::default());
        let first = submit(&streams, 12, &b, &p, 0, false);
        b.finish(first, TaskState::Canceled);
        let last = submit(&streams, 12, &b, &p, 1, true);
        b.finish(last, TaskState::Completed);
        match notify_outcome(12, last, Duration::from_secs(30)) {
            Some(NotifyOutcome::Failed(e)) => assert_eq!(e.kind(), ErrorKind::Canceled, "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(b.sent.lock().is_empty());
    }

    #[test]
    fn a_held_back_notification_reports_the_earliest_failed_layers_own_error() {
        let (b, p, streams) = (Arc::new(Scripted::default()), plan(3), LayerStreams::default());
        let layer0 = submit(&streams, 11, &b, &p, 0, false);
        let layer1 = submit(&streams, 11, &b, &p, 1, false);
        let rejected = "peer refused: remote range 0x2000+64 is not registered";
        b.errors.lock().insert(layer1, Error::new(ErrorKind::RemoteRejected, rejected));
        b.errors.lock().insert(layer0, Error::timeout("no progress for 30 s"));
        b.finish(layer1, TaskState::Failed);
        let last = submit(&streams, 11, &b, &p, 2, true);
        b.finish(last, TaskState::Completed);
        // Layer 0 is still in flight: the outcome waits for it, and it lands.
        assert_eq!(notify_outcome(11, last, Duration::from_millis(50)), Some(NotifyOutcome::Pending));
        b.finish(layer0, TaskState::Completed);
        match notify_outcome(11, last, Duration::from_secs(30)) {
            Some(NotifyOutcome::Failed(e)) => {
                assert_eq!(e.kind(), ErrorKind::RemoteRejected, "{e}");
                assert_eq!(e.message(), format!("batch {layer1:#x} of this plan failed: {rejected}"));
            }
            other => panic!("{other:?}"),
        }
        assert!(b.sent.lock().is_empty());
    }
}
