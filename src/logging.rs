//! Logging. pdx logs through the `log` crate; on the first pdx call one
//! logger is installed (unless the process already has a `log` logger) that
//! sends every record either to the host's callback (`pdx_set_log_callback`)
//! or, when none is set, to stderr through `env_logger`, filtered by
//! `RUST_LOG` (default: warnings and errors).
//!
//! Rules that make the callback safe to call back into pdx:
//! - the callback slot's lock is never held while the callback runs;
//! - pdx code must not log while it holds a lock that a pdx call could take:
//!   log after releasing it, or declare [`defer_callbacks`] before taking
//!   the lock so that records logged meanwhile reach the callback after it
//!   is released;
//! - a record logged on a thread that is already inside the callback
//!   (because the callback called pdx) is dropped, so a callback never
//!   recurses into itself.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};

use log::{Level, LevelFilter, Log, Metadata, Record};
use parking_lot::RwLock;

use crate::error::{Error, ErrorKind, Result};

/// Levels on Python's `logging` scale (higher is more severe).
pub(crate) const LEVEL_TRACE: i32 = 5;
pub(crate) const LEVEL_DEBUG: i32 = 10;
pub(crate) const LEVEL_INFO: i32 = 20;
pub(crate) const LEVEL_WARNING: i32 = 30;
pub(crate) const LEVEL_ERROR: i32 = 40;

/// The host's function: `(userdata, level, module, module_len, message,
/// message_len)`. `module` is the record's target (the module path of the
/// code that logged, unless it names a coarser one); both texts are UTF-8,
/// NUL-terminated as well, and valid only during the call.
pub type Callback = unsafe extern "C" fn(*mut c_void, i32, *const c_char, usize, *const c_char, usize);

/// A `log` level as a number on Python's scale.
pub fn level_number(level: Level) -> i32 {
    match level {
        Level::Error => LEVEL_ERROR,
        Level::Warn => LEVEL_WARNING,
        Level::Info => LEVEL_INFO,
        Level::Debug => LEVEL_DEBUG,
        Level::Trace => LEVEL_TRACE,
    }
}

/// The `log` filter that passes exactly the records whose number is at
/// least `min` (Python's logger-level rule): 25 passes warnings and errors,
/// anything above 40 passes nothing, anything up to 5 passes everything.
pub fn filter_for(min: i32) -> LevelFilter {
    match min {
        i32::MIN..=5 => LevelFilter::Trace,
        6..=10 => LevelFilter::Debug,
        11..=20 => LevelFilter::Info,
        21..=30 => LevelFilter::Warn,
        31..=40 => LevelFilter::Error,
        _ => LevelFilter::Off,
    }
}

/// An installed callback and the number of its calls in progress.
struct Sink {
    callback: Callback,
    userdata: *mut c_void,
    filter: LevelFilter,
    calls: Mutex<usize>,
    idle: Condvar,
}

// SAFETY: `pdx_set_log_callback` requires the callback to be callable from
// any thread with this userdata; pdx never dereferences the pointer.
unsafe impl Send for Sink {}
// SAFETY: as above.
unsafe impl Sync for Sink {}

impl Sink {
    fn enter(&self) {
        *self.calls.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn leave(&self) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls -= 1;
        if *calls == 0 {
            self.idle.notify_all();
        }
    }

    /// Wait until no call of this callback is in progress.
    fn wait_idle(&self) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        while *calls > 0 {
            calls = self.idle.wait(calls).unwrap_or_else(|p| p.into_inner());
        }
    }
}

struct PdxLogger {
    stderr: env_logger::Logger,
    sink: RwLock<Option<Arc<Sink>>>,
}

static LOGGER: OnceLock<PdxLogger> = OnceLock::new();
static INIT: Once = Once::new();

/// A record held back by [`defer_callbacks`].
struct Held {
    level: Level,
    module: String,
    message: String,
}

thread_local! {
    /// True while this thread runs the callback.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
    /// Depth of [`defer_callbacks`] scopes and the records they hold.
    static DEFERRED: RefCell<(usize, Vec<Held>)> = const { RefCell::new((0, Vec::new())) };
}

/// Install the logger once; cheap after the first call.
pub fn init() {
    INIT.call_once(|| {
        use crate::config::env::{read, vars, ProcessEnv};
        let filter: String = read(&ProcessEnv, &vars::RUST_LOG).unwrap_or_else(|| "warn".to_owned());
        let stderr = env_logger::Builder::new().parse_filters(&filter).format_timestamp_micros().build();
        let filter = stderr.filter();
        let logger = LOGGER.get_or_init(|| PdxLogger { stderr, sink: RwLock::new(None) });
        // An error means another logger is installed: keep it.
        if log::set_logger(logger).is_ok() {
            log::set_max_level(filter);
        }
    });
}

/// pdx's logger, if it is the process's `log` logger.
fn installed() -> Option<&'static PdxLogger> {
    let ours = LOGGER.get()?;
    std::ptr::addr_eq(log::logger() as *const dyn Log, ours as *const PdxLogger).then_some(ours)
}

/// Install `callback` (replacing any previous one) with `min_level` on
/// Python's scale, or remove it with `None` (records go to stderr again).
/// Unless called from inside a callback, returns only when no call of the
/// previous callback is still running on any thread, so its userdata may
/// be released afterwards.
pub fn set_callback(callback: Option<Callback>, userdata: *mut c_void, min_level: i32) -> Result<()> {
    init();
    let logger = installed().ok_or_else(|| {
        Error::new(
            ErrorKind::RuntimeError,
            "another `log` logger was installed in this process before pdx's; pdx cannot route its records",
        )
    })?;
    let sink = callback.map(|callback| {
        Arc::new(Sink { callback, userdata, filter: filter_for(min_level), calls: Mutex::new(0), idle: Condvar::new() })
    });
    let old = {
        let mut slot = logger.sink.write();
        log::set_max_level(sink.as_ref().map_or(logger.stderr.filter(), |s| s.filter));
        std::mem::replace(&mut *slot, sink)
    };
    // From inside a callback, waiting could wait for ourselves (or for a
    // second thread waiting for us); the caller knows its own call is running.
    if let Some(old) = old {
        if !INSIDE.try_with(Cell::get).unwrap_or(true) {
            old.wait_idle();
        }
    }
    Ok(())
}

/// Hold back callback deliveries on this thread until the returned guard is
/// dropped. Declare it before taking a lock that a pdx call could take; it
/// is dropped after the lock guard, and the held records are delivered then.
#[must_use = "records are delivered when the guard is dropped"]
pub fn defer_callbacks() -> DeferGuard {
    let _ = DEFERRED.try_with(|d| d.borrow_mut().0 += 1);
    DeferGuard { _not_send: std::marker::PhantomData }
}

/// See [`defer_callbacks`].
pub struct DeferGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for DeferGuard {
    fn drop(&mut self) {
        let held = DEFERRED
            .try_with(|d| {
                let mut d = d.borrow_mut();
                d.0 -= 1;
                if d.0 == 0 {
                    std::mem::take(&mut d.1)
                } else {
                    Vec::new()
                }
            })
            .unwrap_or_default();
        let Some(logger) = LOGGER.get() else { return };
        for h in held {
            logger.deliver(h.level, &h.module, &h.message);
        }
    }
}

impl PdxLogger {
    fn current(&self) -> Option<Arc<Sink>> {
        self.sink.read().clone()
    }

    /// Call the current callback with one record.
    fn deliver(&self, level: Level, module: &str, message: &str) {
        // Taken and entered under the slot's read lock: once a replacement
        // has swapped the slot, no new call of the old callback can begin.
        let sink = {
            let slot = self.sink.read();
            match slot.as_ref() {
                Some(s) if level <= s.filter => {
                    s.enter();
                    s.clone()
                }
                _ => return,
            }
        };
        let module = format!("{module}\0");
        let message = format!("{message}\0");
        let _calling = Calling::begin(&sink);
        // SAFETY: the host's callback, called as `pdx_set_log_callback`
        // documents; both texts outlive the call.
        unsafe {
            (sink.callback)(
                sink.userdata,
                level_number(level),
                module.as_ptr().cast(),
                module.len() - 1,
                message.as_ptr().cast(),
                message.len() - 1,
            )
        };
    }
}

/// One call of the callback in progress on this thread: marks the thread
/// and counts the call until dropped.
struct Calling<'a>(&'a Sink);

impl<'a> Calling<'a> {
    /// `sink` has already been entered.
    fn begin(sink: &'a Sink) -> Self {
        let _ = INSIDE.try_with(|inside| inside.set(true));
        Calling(sink)
    }
}

impl Drop for Calling<'_> {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
        self.0.leave();
    }
}

impl Log for PdxLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        match self.current() {
            Some(sink) => metadata.level() <= sink.filter,
            None => self.stderr.enabled(metadata),
        }
    }

    fn log(&self, record: &Record) {
        if self.current().is_none() {
            if self.stderr.matches(record) {
                self.stderr.log(record);
            }
            return;
        }
        // A thread inside the callback (or one being torn down) drops it.
        if INSIDE.try_with(Cell::get).unwrap_or(true) {
            return;
        }
        let module = record.target();
        let message = record.args().to_string();
        let deferred = DEFERRED
            .try_with(|d| {
                let mut d = d.borrow_mut();
                if d.0 == 0 {
                    return false;
                }
                d.1.push(Held { level: record.level(), module: module.to_owned(), message: message.clone() });
                true
            })
            .unwrap_or(false);
        if !deferred {
            self.deliver(record.level(), module, &message);
        }
    }

    fn flush(&self) {
        self.stderr.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static SEEN: Mutex<Vec<(i32, String, String)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn remember(
        _: *mut c_void,
        level: i32,
        m: *const c_char,
        ml: usize,
        t: *const c_char,
        tl: usize,
    ) {
        let text =
            |p: *const c_char, n: usize| String::from_utf8_lossy(std::slice::from_raw_parts(p.cast(), n)).into_owned();
        let (module, message) = (text(m, ml), text(t, tl));
        // Other tests of this binary log concurrently; keep only ours.
        if message.starts_with("logging-test") {
            SEEN.lock().unwrap().push((level, module, message));
        }
    }

    fn seen() -> Vec<String> {
        SEEN.lock().unwrap().iter().map(|(_, _, m)| m.clone()).collect()
    }

    #[test]
    fn callback_filters_defers_and_is_removed() {
        set_callback(Some(remember), std::ptr::null_mut(), LEVEL_INFO).unwrap();
        log::debug!("logging-test debug (filtered)");
        log::warn!("logging-test warn");
        {
            let _held = defer_callbacks();
            log::info!("logging-test deferred");
            assert_eq!(seen(), ["logging-test warn"]);
        }
        assert_eq!(seen(), ["logging-test warn", "logging-test deferred"]);
        let (level, module, _) = SEEN.lock().unwrap()[0].clone();
        assert_eq!((level, module.as_str()), (LEVEL_WARNING, "pdx::logging::tests"));
        set_callback(None, std::ptr::null_mut(), 0).unwrap();
        // Back on stderr's filter (warn by default): not delivered, not shown.
        log::debug!("logging-test after removal");
        assert_eq!(seen().len(), 2);
    }

    #[test]
    fn levels_follow_python_scale() {
        assert_eq!(level_number(Level::Error), 40);
        assert_eq!(level_number(Level::Warn), 30);
        assert_eq!(level_number(Level::Info), 20);
        assert_eq!(level_number(Level::Debug), 10);
        assert_eq!(level_number(Level::Trace), 5);
        assert_eq!(filter_for(0), LevelFilter::Trace);
        assert_eq!(filter_for(-7), LevelFilter::Trace);
        assert_eq!(filter_for(5), LevelFilter::Trace);
        assert_eq!(filter_for(6), LevelFilter::Debug);
        assert_eq!(filter_for(10), LevelFilter::Debug);
        assert_eq!(filter_for(20), LevelFilter::Info);
        assert_eq!(filter_for(25), LevelFilter::Warn);
        assert_eq!(filter_for(30), LevelFilter::Warn);
        assert_eq!(filter_for(40), LevelFilter::Error);
        assert_eq!(filter_for(41), LevelFilter::Off);
        assert_eq!(filter_for(i32::MAX), LevelFilter::Off);
        // Every level passes its own filter and none more verbose.
        for level in [Level::Error, Level::Warn, Level::Info, Level::Debug, Level::Trace] {
            assert!(level <= filter_for(level_number(level)));
            assert!(level > filter_for(level_number(level) + 1));
        }
    }
}
