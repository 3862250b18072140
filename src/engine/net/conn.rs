//! A TCP connection with the few operations the data path needs: sends that
//! never raise SIGPIPE in the host process, receives through a small buffer
//! (so pipelined small requests cost few syscalls) that switch to receiving
//! straight into the destination for large payloads, and timeouts mapped to
//! `TimedOut`.

use std::any::Any;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::SockRef;

use super::deadline::{Stall, SLICE};
use super::spin::Spin;
use crate::error::{Error, ErrorKind};

mod flow;

pub use flow::{Flow, Pace};

/// Receive buffer size; payloads at least half this size bypass it.
const RECV_BUF: usize = 256 * 1024;

/// Largest single send/recv; keeps each syscall (and each revocation check)
/// bounded.
pub(crate) const MAX_IO_CHUNK: usize = 1 << 20;

/// A connection's receive buffer: a whole one is mapped from the kernel and
/// unmapped when dropped, never on the heap. Connections come and go (a
/// cancel discards the lanes it cut, and their inbound ends close too), and
/// a heap buffer of this size freed in one thread's arena while another
/// thread allocates its next one left arenas holding the difference: 10,000
/// transfers released in flight grew the RSS by 2 to 5 MB with a flat heap.
/// A parked connection that gave its whole buffer away keeps only the bytes
/// it had buffered, on the heap (a few bytes of the next request at most);
/// empty (`Default`) when it had none ([`Conn::take_buffer`]).
pub struct RecvBuf(Backing);

enum Backing {
    /// `len` bytes mapped readable and writable, owned by this value alone.
    Mapped { ptr: std::ptr::NonNull<u8>, len: usize },
    /// Bytes kept while parked.
    Kept(Box<[u8]>),
}

// SAFETY: the mapping is owned by this value alone, like a `Box<[u8]>`.
unsafe impl Send for RecvBuf {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for RecvBuf {}

impl RecvBuf {
    /// A zeroed buffer of [`RECV_BUF`] bytes (its pages are touched only
    /// as bytes arrive). Out of memory aborts, as a heap allocation would.
    fn mapped() -> RecvBuf {
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RECV_BUF,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match std::ptr::NonNull::new(p.cast::<u8>()).filter(|_| p != libc::MAP_FAILED) {
            Some(ptr) => RecvBuf(Backing::Mapped { ptr, len: RECV_BUF }),
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; RECV_BUF]>()),
        }
    }

    /// A copy of `bytes` on the heap.
    fn kept(bytes: &[u8]) -> RecvBuf {
        RecvBuf(Backing::Kept(bytes.into()))
    }

    /// Whether this is a whole buffer a connection can receive into.
    fn is_whole(&self) -> bool {
        matches!(self.0, Backing::Mapped { len: RECV_BUF, .. })
    }
}

impl Default for RecvBuf {
    fn default() -> RecvBuf {
        RecvBuf(Backing::Kept(Box::default()))
    }
}

impl std::ops::Deref for RecvBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            // SAFETY: `len` bytes mapped readable and writable.
            Backing::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
            Backing::Kept(b) => b,
        }
    }
}

impl std::ops::DerefMut for RecvBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            // SAFETY: as above, owned exclusively.
            Backing::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), *len) },
            Backing::Kept(b) => b,
        }
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Backing::Mapped { ptr, len } = self.0 {
            // SAFETY: the mapping made in `mapped`, unmapped once.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
    }
}

/// A connected data or handshake socket.
pub struct Conn {
    stream: TcpStream,
    buf: RecvBuf,
    start: usize,
    end: usize,
    /// How long a receive polls before it blocks (see [`Conn::set_spin`]).
    spin: Spin,
    /// The window [`Conn::set_spin`] was last given.
    spin_max: Option<Duration>,
    /// Poll only while this is non-zero (a pool's free threads: a thread
    /// polling one connection while every other is busy would keep ready
    /// connections waiting).
    spin_while: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
    /// A task's stall clock (lanes): socket timeouts are then short slices
    /// and a blocked call gives up only once the clock says so.
    stall: Option<Paced>,
    /// The rail a lane rides, with its own clock (see `super::rails`).
    rail: Option<super::rails::RailClock>,
    /// How long [`Conn::recv_header_idle`] waits for the first byte of a
    /// request before it reports the connection idle (`None`: forever).
    idle: Option<Duration>,
    /// Served from a readiness loop: instead of blocking for the next
    /// request, [`Conn::recv_header_idle`] gives the connection back (see
    /// [`Conn::set_park_when_idle`]).
    park_when_idle: bool,
    /// It gave the connection back with nothing buffered.
    parked: bool,
    /// It has been parked after a request (its first request is behind it).
    resumed: bool,
    /// A request header was read from it.
    seen_header: bool,
    /// What the server's hello added to this connection (the same-host
    /// link to the initiator's process), kept while it is parked between
    /// requests; this layer only keeps it.
    extension: Option<Arc<dyn Any + Send + Sync>>,
    /// State a server keeps with the connection, kept while it is parked
    /// (the same-host link's opened device memory handles).
    attachment: Option<Arc<dyn Any + Send + Sync>>,
    /// Parked and not read since: the readiness loop hands it back when
    /// bytes are there, so the first receive takes them without polling
    /// (and without counting as a poll that caught them).
    woken: bool,
    /// The socket's `SO_RCVLOWAT` as last set here.
    rcvlowat: usize,
    /// The receive timeout given to [`Conn::new`], and the shorter one
    /// [`Conn::recv_flowing`] has in place while it waits.
    recv_timeout: Duration,
    short_recv_timeout: Option<Duration>,
}

/// The stall clock of the task a lane currently serves, with its limits.
struct Paced {
    stall: Stall,
    send_limit: Duration,
    recv_limit: Duration,
    /// Bytes in our send queue at the last look (`SIOCOUTQ`).
    outq: std::cell::Cell<i64>,
}

/// Map an I/O error on a data connection to a core error.
pub fn io_error(e: io::Error) -> Error {
    let kind = match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ErrorKind::Timeout,
        _ => ErrorKind::ConnectionLost,
    };
    Error::new(kind, format!("data connection: {e}"))
}

/// A socket timeout (`EAGAIN`) as `TimedOut`: the syscall's deadline passed.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "no progress before the deadline")
    } else {
        e
    }
}

impl Conn {
    /// Wrap a connected stream: `TCP_NODELAY` on, send and receive timeouts
    /// set (each bounds one syscall, i.e. a sliding progress deadline).
    pub fn new(stream: TcpStream, send_timeout: Duration, recv_timeout: Duration) -> io::Result<Conn> {
        let recv_timeout = recv_timeout.max(Duration::from_millis(1));
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(send_timeout.max(Duration::from_millis(1))))?;
        stream.set_read_timeout(Some(recv_timeout))?;
        Ok(Conn {
            stream,
            buf: RecvBuf::mapped(),
            start: 0,
            end: 0,
            spin: Spin::new(Duration::ZERO),
            spin_max: None,
            spin_while: None,
            stall: None,
            rail: None,
            idle: None,
            park_when_idle: false,
            parked: false,
            resumed: false,
            seen_header: false,
            extension: None,
            attachment: None,
            woken: false,
            rcvlowat: 1,
            recv_timeout,
            short_recv_timeout: None,
        })
    }

    /// Wrap a connected lane: socket timeouts are [`SLICE`]s and every
    /// blocked call runs until `stall` has seen no progress for
    /// `send_limit` (sending) or `recv_limit` (receiving).
    pub fn paced(stream: TcpStream, stall: Stall, send_limit: Duration, recv_limit: Duration) -> io::Result<Conn> {
        let mut conn = Conn::new(stream, SLICE.min(send_limit), SLICE.min(recv_limit))?;
        conn.stall = Some(Paced { stall, send_limit, recv_limit, outq: std::cell::Cell::new(-1) });
        Ok(conn)
    }

    /// Charge this connection's waits to another task's clock.
    pub fn set_stall(&mut self, stall: Stall) {
        if let Some(p) = &mut self.stall {
            p.stall = stall;
        }
    }

    /// Ride `rail`: its clock is marked as bytes move, and a blocked call
    /// gives up when it says the rail is silent.
    pub fn set_rail(&mut self, rail: super::rails::RailClock) {
        self.rail = Some(rail);
    }

    /// Bytes moved: the task's peer made progress.
    fn progressed(&self) {
        if let Some(p) = &self.stall {
            p.stall.mark();
        }
        if let Some(r) = &self.rail {
            r.mark();
        }
    }

    /// A blocking call's slice ran out: keep waiting unless the clock has
    /// expired (a connection without one fails at once, as before).
    fn keep_waiting(&self, sending: bool) -> bool {
        let Some(p) = &self.stall else { return false };
        // Our send queue shrinking means the peer is taking bytes (a slow
        // reader, not a frozen one), even though no call of ours completed.
        let queued = self.send_queue();
        if queued >= 0 && queued < p.outq.get() {
            self.progressed();
        }
        p.outq.set(queued);
        if self.rail.as_ref().is_some_and(super::rails::RailClock::silent) {
            return false;
        }
        !p.stall.expired(if sending { p.send_limit } else { p.recv_limit })
    }

    /// Bytes sent but not yet taken by the peer (`SIOCOUTQ`), or -1.
    fn send_queue(&self) -> i64 {
        use std::os::fd::AsRawFd;
        let mut n: libc::c_int = 0;
        // SAFETY: the fd is our open socket; SIOCOUTQ writes one int.
        let rc = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        if rc == 0 {
            i64::from(n)
        } else {
            -1
        }
    }

    /// Poll for up to `spin` before a receive blocks. A reply that comes
    /// within the window is taken without a sleep and a wake-up, which on a
    /// virtual machine cost tens of microseconds per round trip.
    /// The window adapts (see [`super::spin`]).
    /// Setting the same window again keeps what it learned (a parked
    /// connection resumes with the window it had).
    pub fn set_spin(&mut self, spin: Duration) {
        if self.spin_max != Some(spin) {
            self.spin = Spin::new(spin);
            self.spin_max = Some(spin);
        }
    }

    /// Close this (server) connection once no request has begun for
    /// `idle` (see [`Conn::recv_header_idle`]).
    pub fn set_idle_timeout(&mut self, idle: Duration) {
        self.idle = Some(idle);
    }

    /// Poll for the next bytes only while `free` is non-zero (see
    /// [`Conn::set_spin`]).
    pub fn set_spin_while(&mut self, free: std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        self.spin_while = Some(free);
    }

    /// Serve from a readiness loop: when no request is buffered or arrives
    /// within the spin window, [`Conn::recv_header_idle`] returns `Ok(None)`
    /// with [`Conn::parked`] true instead of blocking.
    pub fn set_park_when_idle(&mut self, park: bool) {
        self.park_when_idle = park;
    }

    /// True if the last [`Conn::recv_header_idle`] gave the connection back
    /// idle (nothing buffered) rather than at its end.
    pub fn parked(&self) -> bool {
        self.parked
    }

    /// True once the connection was parked after a request: what is read
    /// next is not its first request.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// The extension of type `T` the hello added to this connection, if any.
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.extension.clone().and_then(|e| e.downcast::<T>().ok())
    }

    /// What the hello added to this connection (or nothing).
    pub fn set_extension(&mut self, extension: Option<Arc<dyn Any + Send + Sync>>) {
        self.extension = extension;
    }

    /// The state of type `T` kept with this connection, made by `make` on
    /// first use (it replaces state of another type).
    pub fn attachment<T: Any + Send + Sync>(&mut self, make: impl FnOnce() -> T) -> Arc<T> {
        if let Some(kept) = self.attachment.clone().and_then(|a| a.downcast::<T>().ok()) {
            return kept;
        }
        let made = Arc::new(make());
        self.attachment = Some(made.clone());
        made
    }

    /// Give up the receive buffer, keeping only the bytes buffered, if any
    /// (a parked connection holds no more than those); `None` if it has no
    /// whole buffer to give.
    pub fn take_buffer(&mut self) -> Option<RecvBuf> {
        if !self.buf.is_whole() {
            return None;
        }
        let whole = std::mem::take(&mut self.buf);
        if self.buffered() > 0 {
            self.buf = RecvBuf::kept(&whole[self.start..self.end]);
        }
        (self.start, self.end) = (0, self.buf.len());
        Some(whole)
    }

    /// Give the connection a whole receive buffer again: `buf`, or a new
    /// one (with the bytes it kept, see [`Conn::take_buffer`]).
    pub fn lend_buffer(&mut self, buf: Option<RecvBuf>) {
        if !self.buf.is_whole() {
            let mut whole = buf.filter(RecvBuf::is_whole).unwrap_or_else(RecvBuf::mapped);
            let kept = self.buffered();
            whole[..kept].copy_from_slice(&self.buf[self.start..self.end]);
            self.buf = whole;
            (self.start, self.end) = (0, kept);
        }
    }

    /// Whether it is served from a readiness loop (see
    /// [`Conn::set_park_when_idle`]).
    pub fn parks_when_idle(&self) -> bool {
        self.park_when_idle
    }

    /// Wait until the socket has something to read (bytes, end of stream or
    /// an error) or `by` passes; true if readable. Interrupted waits resume.
    fn readable_by(&self, by: Instant) -> io::Result<bool> {
        loop {
            let left = by.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let mut fds = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd for the call.
            match unsafe { libc::poll(&mut fds, 1, ms) } {
                n if n > 0 => return Ok(true),
                0 => {}
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The socket's descriptor (to shut it down from another thread).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.as_raw_fd()
    }

    /// The underlying stream (to clone a handle for shutdown).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Shut both directions down (wakes any thread blocked on the socket).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Send `len` bytes starting at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for the duration of the call.
    pub unsafe fn send_raw(&self, ptr: *const u8, len: usize) -> io::Result<()> {
        let sock = SockRef::from(&self.stream);
        let mut done = 0usize;
        while done < len {
            let chunk = (len - done).min(MAX_IO_CHUNK);
            // SAFETY: inside the caller's readable range.
            let piece = unsafe { std::slice::from_raw_parts(ptr.add(done), chunk) };
            match sock.send_with_flags(piece, libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    done += n;
                    self.progressed();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.keep_waiting(true) => {}
                Err(e) => return Err(timed_out(e)),
            }
        }
        Ok(())
    }

    /// Send a byte slice.
    pub fn send_all(&self, data: &[u8]) -> io::Result<()> {
        // SAFETY: the slice is readable for the call.
        unsafe { self.send_raw(data.as_ptr(), data.len()) }
    }

    /// Send several raw pieces with as few syscalls as possible (gathered
    /// `sendmsg`, up to 512 pieces a call).
    ///
    /// # Safety
    /// Every `(ptr, len)` must be readable for the duration of the call.
    pub unsafe fn send_vectored(&self, pieces: &[(*const u8, usize)]) -> io::Result<()> {
        const MAX_IOV: usize = 512;
        let sock = SockRef::from(&self.stream);
        for group in pieces.chunks(MAX_IOV) {
            let mut slices: Vec<IoSlice<'_>> = group
                .iter()
                .filter(|(_, l)| *l > 0)
                // SAFETY: the caller guarantees each piece is readable.
                .map(|&(p, l)| IoSlice::new(unsafe { std::slice::from_raw_parts(p, l) }))
                .collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                match sock.send_vectored_with_flags(rest, libc::MSG_NOSIGNAL) {
                    Ok(n) => {
                        IoSlice::advance_slices(&mut rest, n);
                        self.progressed();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.keep_waiting(true) => {}
                    Err(e) => return Err(timed_out(e)),
                }
            }
        }
        Ok(())
    }

    /// One `recv` into `ptr..ptr+len`; `Ok(0)` is end of stream.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be writable for the duration of the call.
    unsafe fn recv_once(&self, ptr: *mut u8, len: usize, flags: i32) -> io::Result<usize> {
        // SAFETY: writable per the caller; recv only writes into it.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), len.min(MAX_IO_CHUNK)) };
        loop {
            match SockRef::from(&self.stream).recv_with_flags(buf, flags) {
                Ok(n) => {
                    if n > 0 {
                        self.progressed();
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && flags & libc::MSG_DONTWAIT == 0
                        && self.keep_waiting(false) => {}
                Err(e) => return Err(timed_out(e)),
            }
        }
    }

    fn eof() -> io::Error {
        io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection")
    }

    /// Bytes already received and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The next `N` bytes if they are already buffered, without consuming
    /// them (to look at the next pipelined request header).
    pub fn peek_buffered<const N: usize>(&self) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.buf.get(self.start..self.start + N).filter(|_| self.buffered() >= N)?);
        Some(out)
    }

    /// Refill the buffer with one blocking `recv`; `Ok(0)` at end of stream.
    /// `want` is how many bytes would complete what the caller waits for
    /// (a shorter delivery turns polling off for the next receive).
    fn fill(&mut self, want: usize) -> io::Result<usize> {
        self.fill_by(want, None, false)
    }

    /// [`Conn::fill`], but when nothing is readable by `idle_by` (checked
    /// only before blocking), `TimedOut` without a receive; with `park`,
    /// `WouldBlock` instead of blocking at all.
    fn fill_by(&mut self, want: usize, idle_by: Option<Instant>, park: bool) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let free = self.buf.len() - self.end;
        // SAFETY: the tail of our own buffer is writable.
        let tail = unsafe { self.buf.as_mut_ptr().add(self.end) };
        if std::mem::take(&mut self.woken) {
            // SAFETY: as above.
            match unsafe { self.recv_once(tail, free, libc::MSG_DONTWAIT) } {
                Ok(n) => {
                    self.end += n;
                    self.spin.delivered(n, want.min(free), true);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {} // woken for nothing: as usual
                Err(e) => return Err(e),
            }
        }
        let mut window = self.spin.window();
        if self.spin_while.as_ref().is_some_and(|free| free.load(std::sync::atomic::Ordering::Relaxed) == 0) {
            window = Duration::ZERO;
        }
        if !window.is_zero() {
            let started = std::time::Instant::now();
            loop {
                // SAFETY: as above.
                match unsafe { self.recv_once(tail, free, libc::MSG_DONTWAIT) } {
                    Ok(n) => {
                        self.end += n;
                        self.spin.hit();
                        self.spin.delivered(n, want.min(free), false);
                        return Ok(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) => return Err(e),
                }
                if started.elapsed() >= window {
                    break;
                }
                std::hint::spin_loop();
            }
            self.spin.miss();
        }
        if park {
            // SAFETY: as above.
            return match unsafe { self.recv_once(tail, free, libc::MSG_DONTWAIT) } {
                Ok(n) => {
                    self.end += n;
                    Ok(n)
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    Err(io::Error::new(io::ErrorKind::WouldBlock, "no request: park"))
                }
                Err(e) => Err(e),
            };
        }
        if let Some(by) = idle_by {
            if !self.readable_by(by)? {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "idle"));
            }
        }
        // SAFETY: as above.
        let n = unsafe { self.recv_once(tail, free, 0)? };
        self.end += n;
        self.spin.delivered(n, want.min(free), true);
        Ok(n)
    }

    /// Take whatever the kernel already has, without blocking.
    pub fn fill_nonblocking(&mut self) -> io::Result<usize> {
        if self.buffered() == 0 {
            self.start = 0;
            self.end = 0;
        }
        let free = self.buf.len() - self.end;
        if free == 0 {
            return Ok(0);
        }
        // SAFETY: the tail of our own buffer is writable.
        let tail = unsafe { self.buf.as_mut_ptr().add(self.end) };
        // SAFETY: `tail` is writable for `free` bytes of our buffer.
        match unsafe { self.recv_once(tail, free, libc::MSG_DONTWAIT) } {
            Ok(0) => Err(Self::eof()),
            Ok(n) => {
                self.end += n;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Receive exactly `out.len()` bytes.
    pub fn recv_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        // SAFETY: the slice is writable.
        unsafe { self.recv_raw(out.as_mut_ptr(), out.len(), &|| false) }
    }

    /// Receive exactly `out.len()` bytes by `by`, waiting through the
    /// socket's receive slices: a slice that ends with part of `out` read
    /// keeps what it read (the next wait goes on from there), so bytes that
    /// arrive in pieces with pauses between them are not lost. `TimedOut`
    /// once `by` passes with `out` not full.
    pub fn recv_exact_by(&mut self, out: &mut [u8], by: Instant) -> io::Result<()> {
        let mut done = 0usize;
        while done < out.len() {
            let n = self.buffered().min(out.len() - done);
            if n > 0 {
                out[done..done + n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                done += n;
                continue;
            }
            match self.fill(out.len() - done) {
                Ok(0) => return Err(Self::eof()),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if Instant::now() >= by {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("{done} of {} bytes before the deadline", out.len()),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Receive exactly `len` bytes into `ptr`. Large remainders go straight
    /// into the destination; `stop` is checked between chunks and aborts the
    /// receive when it returns true.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be writable for the duration of the call.
    pub unsafe fn recv_raw(&mut self, ptr: *mut u8, len: usize, stop: &dyn Fn() -> bool) -> io::Result<()> {
        let mut done = 0usize;
        while done < len {
            if self.buffered() > 0 {
                let n = self.buffered().min(len - done);
                std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), ptr.add(done), n);
                self.start += n;
                done += n;
                continue;
            }
            if stop() {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "destination region was unregistered"));
            }
            if len - done >= RECV_BUF / 2 {
                // A whole chunk per call: the kernel copies segments as they
                // land instead of returning to be called again at each wake-up
                // (about 15% less CPU per GB on a 4 Gbit/s link). A partial
                // chunk still returns at the socket timeout's slice, and
                // unregistering shuts the socket down, which ends the call.
                let n = self.recv_once(ptr.add(done), len - done, libc::MSG_WAITALL)?;
                if n == 0 {
                    return Err(Self::eof());
                }
                done += n;
            } else if self.fill(len - done)? == 0 {
                return Err(Self::eof());
            }
        }
        Ok(())
    }

    /// Wait for the next request header on an idle server connection.
    /// Returns `Ok(None)` on a clean end of stream before any byte, once no
    /// byte of the header has arrived within the idle timeout (when one is
    /// set, see [`Conn::set_idle_timeout`]), or when `stop()`; keeps waiting
    /// through receive timeouts while no byte of the header has arrived.
    pub fn recv_header_idle<const N: usize>(&mut self, stop: &dyn Fn() -> bool) -> io::Result<Option<[u8; N]>> {
        let idle_by = self.idle.map(|d| Instant::now() + d);
        self.parked = false;
        while self.buffered() < N {
            if stop() {
                return Ok(None);
            }
            let had = self.buffered();
            match self.fill_by(N - had, idle_by.filter(|_| had == 0), self.park_when_idle && had == 0) {
                Ok(0) if had == 0 => return Ok(None),
                Ok(0) => return Err(Self::eof()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && had == 0 => {
                    (self.parked, self.resumed, self.woken) = (true, self.seen_header, true);
                    return Ok(None);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut && had == 0 => {
                    if idle_by.is_some_and(|by| Instant::now() >= by) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.start..self.start + N]);
        self.start += N;
        self.seen_header = true;
        Ok(Some(out))
    }

    /// True if an idle pooled connection still looks usable: nothing to
    /// read and no end of stream or error pending.
    pub fn idle_and_alive(&self) -> bool {
        if self.buffered() > 0 {
            return false;
        }
        let mut byte = 0u8;
        // SAFETY: one writable byte.
        match unsafe { self.recv_once(&mut byte, 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) } {
            Err(e) => e.kind() == io::ErrorKind::TimedOut,
            Ok(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (Conn, Conn) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let t = Duration::from_secs(5);
        (Conn::new(a, t, t).unwrap(), Conn::new(b, t, t).unwrap())
    }

    #[test]
    fn vectored_send_and_buffered_receive_agree() {
        let (a, mut b) = pair();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let expected = big.clone();
        let receiver = std::thread::spawn(move || {
            let mut head = [0u8; 5];
            b.recv_exact(&mut head).unwrap();
            assert_eq!(&head, b"hello");
            let mut got = vec![0u8; expected.len()];
            // SAFETY: `got` is writable for its length.
            unsafe { b.recv_raw(got.as_mut_ptr(), got.len(), &|| false).unwrap() };
            assert!(got == expected);
            b
        });
        let small = b"hello";
        // SAFETY: every piece points into a live buffer of that length.
        unsafe { a.send_vectored(&[(small.as_ptr(), small.len()), (big.as_ptr(), big.len()), (small.as_ptr(), 0)]) }
            .unwrap();
        let mut b = receiver.join().unwrap();
        assert!(b.idle_and_alive());
        drop(a);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!b.idle_and_alive());
        assert!(b.recv_header_idle::<4>(&|| false).unwrap().is_none());
    }

    #[test]
    fn an_idle_timeout_ends_the_wait_for_a_request_but_not_one_begun() {
        let (a, mut b) = pair();
        b.set_spin(Duration::from_micros(50));
        b.set_idle_timeout(Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(b.recv_header_idle::<4>(&|| false).unwrap().is_none(), "idle: no request");
        assert!(t0.elapsed() >= Duration::from_millis(100));
        a.send_all(&[1, 2, 3, 4]).unwrap();
        assert_eq!(b.recv_header_idle::<4>(&|| false).unwrap(), Some([1, 2, 3, 4]));
        // A header begun before the idle timeout is waited for as before.
        a.send_all(&[5]).unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            a.send_all(&[6, 7, 8]).unwrap();
            a
        });
        assert_eq!(b.recv_header_idle::<4>(&|| false).unwrap(), Some([5, 6, 7, 8]));
        drop(sender.join().unwrap());
    }

    /// Bytes in pieces with pauses longer than the socket's receive slice
    /// between them: every byte arrives, in order (a retry of
    /// `recv_exact` after a slice ended mid-message lost the bytes it had
    /// read), and the deadline still holds.
    #[test]
    fn a_message_in_pieces_across_receive_slices_loses_nothing() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let slice = Duration::from_millis(30);
        let (a, mut b) = (Conn::new(a, slice, slice).unwrap(), Conn::new(b, slice, slice).unwrap());
        let message: Vec<u8> = (0..40u8).collect();
        let sent = message.clone();
        let sender = std::thread::spawn(move || {
            for piece in sent.chunks(7) {
                a.send_all(piece).unwrap();
                std::thread::sleep(slice * 3);
            }
            a
        });
        let mut got = [0u8; 40];
        b.recv_exact_by(&mut got, Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(&got[..], &message[..]);
        let a = sender.join().unwrap();
        let t0 = Instant::now();
        let mut more = [0u8; 4];
        a.send_all(&[1]).unwrap();
        let e = b.recv_exact_by(&mut more, t0 + Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        drop(a);
        assert_eq!(
            b.recv_exact_by(&mut more, Instant::now() + Duration::from_secs(5)).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn truncated_header_is_an_error_not_a_hang() {
        let (a, mut b) = pair();
        a.send_all(&[1, 2]).unwrap();
        drop(a);
        assert_eq!(b.recv_header_idle::<24>(&|| false).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
