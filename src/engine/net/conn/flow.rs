//! Payloads that move only while the peer keeps pace: a server connection
//! served from a readiness loop receives a request's payload, or sends a
//! read's answer, on its thread while the bytes flow, and gives the
//! connection back to the loop where they stall (see
//! `engine::server::data::FLOW_WAIT`), its place in the payload kept by the
//! caller.

use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use socket2::SockRef;

use super::{Conn, MAX_IO_CHUNK, RECV_BUF};

/// The pace a payload moved by [`Conn::recv_flowing`] or
/// [`Conn::send_flowing`] must keep: whenever the socket has nothing to
/// read (or no room to send), `floor` bytes (the rest, if fewer) within
/// `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub wait: Duration,
    pub floor: usize,
}

/// How a payload moved by [`Conn::recv_flowing`] or [`Conn::send_flowing`]
/// ended for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Every byte moved.
    Done,
    /// The peer slowed below the floor (or stopped): what moved is
    /// counted, and the caller gives the connection back to its readiness
    /// loop until the peer goes on.
    Stalled,
}

/// A stretch of `wait` in a [`Pace`]: when it ends, the bytes it must
/// move, and those it moved.
#[derive(Default)]
struct Window {
    ends: Option<Instant>,
    want: usize,
    got: usize,
}

impl Conn {
    /// `SO_RCVLOWAT`: readiness (and a blocking receive) waits for `bytes`
    /// queued, or the end of the stream. A system call only when it changes.
    ///
    /// Never more than a quarter of the socket's receive buffer: Linux
    /// grows the buffer to hold a low-water mark past it and clamps the
    /// connection's TCP window to that mark, for good (a 64 KiB mark
    /// halved a 64 MiB write's speed on every later request of the
    /// connection). A mark this size can still be reached without that.
    pub fn set_rcvlowat(&mut self, bytes: usize) -> io::Result<()> {
        let mut bytes = bytes.max(1);
        if bytes > 1 {
            let buffer = SockRef::from(&self.stream).recv_buffer_size()?;
            bytes = bytes.min(buffer / 4).max(1);
        }
        if bytes == self.rcvlowat {
            return Ok(());
        }
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: the descriptor is our open socket; the option value is one
        // int read for the call.
        let rc = unsafe {
            libc::setsockopt(
                self.raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                size,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.rcvlowat = bytes;
        Ok(())
    }

    /// The receive timeout: `short`, or (`None`) the one given to
    /// [`Conn::new`] again. A system call only when it changes.
    fn set_short_recv_timeout(&mut self, short: Option<Duration>) -> io::Result<()> {
        if self.short_recv_timeout == short {
            return Ok(());
        }
        self.stream.set_read_timeout(Some(short.unwrap_or(self.recv_timeout).max(Duration::from_millis(1))))?;
        self.short_recv_timeout = short;
        Ok(())
    }

    /// Receive `len` bytes into `ptr`, from `*done` on, while they keep
    /// coming at `pace`: once nothing is queued, each `wait` must bring the
    /// next `floor` bytes (the rest, if fewer). [`Flow::Done`] once all are
    /// in; [`Flow::Stalled`] when they did not: `*done` counts what landed,
    /// and `SO_RCVLOWAT` is left at the next `floor` bytes (or the rest), so
    /// that the socket turns readable when the payload flows again (the
    /// bytes of a trickle wait in the kernel meanwhile). A large rest goes
    /// straight into the destination, a whole chunk per receive (bounded by
    /// `wait` through the socket's receive timeout); a small one is polled
    /// for the spin window, then waited for with `poll` (no socket option
    /// changes per request). `stop` is checked between receives and aborts
    /// when it returns true.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be writable for the duration of the call.
    pub unsafe fn recv_flowing(
        &mut self,
        ptr: *mut u8,
        len: usize,
        done: &mut usize,
        stop: &dyn Fn() -> bool,
        pace: Pace,
    ) -> io::Result<Flow> {
        // SAFETY: forwarded from the caller.
        let flow = unsafe { self.recv_flowing_inner(ptr, len, done, stop, pace) };
        let restored = self.set_short_recv_timeout(None);
        let lowat = match flow {
            Ok(Flow::Stalled) => (len - *done).min(pace.floor),
            _ => 1,
        };
        let flow = flow?;
        restored?;
        self.set_rcvlowat(lowat)?;
        Ok(flow)
    }

    /// [`Conn::recv_flowing`] but for restoring the socket's settings.
    ///
    /// # Safety
    /// As [`Conn::recv_flowing`].
    unsafe fn recv_flowing_inner(
        &mut self,
        ptr: *mut u8,
        len: usize,
        done: &mut usize,
        stop: &dyn Fn() -> bool,
        pace: Pace,
    ) -> io::Result<Flow> {
        let Pace { wait, floor } = pace;
        // A small rest is waited for in windows of `wait`, each of which
        // must bring the next `floor` bytes (or the rest).
        let mut window = Window::default();
        let mut stalled = false;
        loop {
            let n = self.buffered().min(len - *done);
            if n > 0 {
                // SAFETY: from our buffer into the caller's writable range.
                unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.start), ptr.add(*done), n) };
                self.start += n;
                *done += n;
            }
            if *done >= len {
                return Ok(Flow::Done);
            }
            if stalled {
                return Ok(Flow::Stalled);
            }
            if stop() {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "destination region was unregistered"));
            }
            // What the kernel has already, without waiting.
            // SAFETY: forwarded from the caller.
            match unsafe { self.take_payload(ptr, len, done, libc::MSG_DONTWAIT) } {
                Ok(0) => return Err(Self::eof()),
                Ok(n) => {
                    window.got += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
            let rest = len - *done;
            let want = rest.min(floor);
            if rest >= RECV_BUF / 2 {
                // A large rest: one receive of a whole chunk, for `wait` at
                // most (the receive timeout), must bring the next `floor`
                // bytes. No low-water mark: the receive waits for the whole
                // chunk anyway, and a mark this size would clamp the TCP
                // window (see `set_rcvlowat`).
                self.set_rcvlowat(1)?;
                self.set_short_recv_timeout(Some(wait))?;
                // SAFETY: forwarded from the caller.
                match unsafe { self.take_payload(ptr, len, done, libc::MSG_WAITALL) } {
                    Ok(0) => return Err(Self::eof()),
                    Ok(n) => stalled = n < want,
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => stalled = true,
                    Err(e) => return Err(e),
                }
                continue;
            }
            // A small rest: polled for the spin window (as a receive of the
            // next request is), then waited for within the window.
            // SAFETY: forwarded from the caller.
            match unsafe { self.spin_payload(ptr, len, done) } {
                Ok(0) => {}
                Ok(n) => {
                    window.got += n;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if window.ends.is_none_or(|end| now >= end) {
                if window.ends.is_some() && window.got < window.want {
                    stalled = true;
                    continue;
                }
                window = Window { ends: Some(now + wait), want, got: 0 };
            }
            // Readable at the first byte (a low-water mark left by a large
            // rest or a park may be past what is left to come).
            self.set_rcvlowat(1)?;
            stalled = !self.ready_by(libc::POLLIN, window.ends.unwrap_or(now))?;
        }
    }

    /// Take what arrives within the spin window (only while another thread
    /// is free, see [`Conn::set_spin_while`]): the bytes taken, 0 if none.
    ///
    /// # Safety
    /// As [`Conn::recv_flowing`].
    unsafe fn spin_payload(&mut self, ptr: *mut u8, len: usize, done: &mut usize) -> io::Result<usize> {
        let mut window = self.spin.window();
        if self.spin_while.as_ref().is_some_and(|free| free.load(std::sync::atomic::Ordering::Relaxed) == 0) {
            window = Duration::ZERO;
        }
        if window.is_zero() {
            return Ok(0);
        }
        let started = Instant::now();
        loop {
            // SAFETY: forwarded from the caller.
            match unsafe { self.take_payload(ptr, len, done, libc::MSG_DONTWAIT) } {
                Ok(0) => return Err(Self::eof()),
                Ok(n) => {
                    self.spin.hit();
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
            if started.elapsed() >= window {
                self.spin.miss();
                return Ok(0);
            }
            std::hint::spin_loop();
        }
    }

    /// Wait until the socket is ready for `events` (`POLLIN`, `POLLOUT`;
    /// an end of stream or an error counts) or `by` passes; true if ready.
    fn ready_by(&self, events: libc::c_short, by: Instant) -> io::Result<bool> {
        loop {
            let left = by.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let mut fds = libc::pollfd { fd: self.raw_fd(), events, revents: 0 };
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

    /// One receive of payload bytes (nothing buffered): straight into
    /// `ptr` from `*done` on (counted there) when at least half a buffer is
    /// left, else into the receive buffer (with any pipelined request
    /// behind the payload). `Ok(0)` at the end of the stream.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be writable for the duration of the call.
    unsafe fn take_payload(&mut self, ptr: *mut u8, len: usize, done: &mut usize, flags: i32) -> io::Result<usize> {
        let rest = len - *done;
        if rest >= RECV_BUF / 2 || self.buf.is_empty() {
            // SAFETY: inside the caller's writable range.
            let n = unsafe { self.recv_once(ptr.add(*done), rest, flags)? };
            *done += n;
            return Ok(n);
        }
        (self.start, self.end) = (0, 0);
        // Our own buffer is writable for its length.
        let (tail, free) = (self.buf.as_mut_ptr(), self.buf.len());
        // SAFETY: as above.
        let n = unsafe { self.recv_once(tail, free, flags)? };
        self.end = n;
        Ok(n)
    }

    /// Send `prefix`, then `len` bytes from `ptr`, from byte `*sent` of the
    /// two on, while the peer keeps taking them at `pace`: sends never
    /// block; once the socket has no room, each `wait` (waited for with
    /// `poll`) must take the next `floor` bytes (the rest, if fewer).
    /// [`Flow::Done`] once all are sent; [`Flow::Stalled`] when they did
    /// not (`*sent` counts what went): the caller waits for the socket to
    /// turn writable. `stop` is checked between sends and aborts when it
    /// returns true.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for the duration of the call.
    pub unsafe fn send_flowing(
        &mut self,
        prefix: &[u8],
        ptr: *const u8,
        len: usize,
        sent: &mut usize,
        stop: &dyn Fn() -> bool,
        pace: Pace,
    ) -> io::Result<Flow> {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_flowing_inner(prefix, ptr, len, sent, stop, pace) }
    }

    /// [`Conn::send_flowing`] but for restoring the socket's settings.
    ///
    /// # Safety
    /// As [`Conn::send_flowing`].
    unsafe fn send_flowing_inner(
        &mut self,
        prefix: &[u8],
        ptr: *const u8,
        len: usize,
        sent: &mut usize,
        stop: &dyn Fn() -> bool,
        pace: Pace,
    ) -> io::Result<Flow> {
        let Pace { wait, floor } = pace;
        let total = prefix.len() + len;
        // Once the socket has no room: windows of `wait`, each of which must
        // take the next `floor` bytes (or the rest).
        let mut window = Window::default();
        while *sent < total {
            if stop() {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "source region was unregistered"));
            }
            let from = sent.saturating_sub(prefix.len());
            let chunk = (len - from).min(MAX_IO_CHUNK);
            let payload: &[u8] = if chunk == 0 {
                &[]
            } else {
                // SAFETY: inside the caller's readable range.
                unsafe { std::slice::from_raw_parts(ptr.add(from), chunk) }
            };
            let head = prefix.get(*sent..).unwrap_or_default();
            let pieces = [IoSlice::new(head), IoSlice::new(payload)];
            let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
            match SockRef::from(&self.stream).send_vectored_with_flags(&pieces, flags) {
                Ok(n) => {
                    *sent += n;
                    window.got += n;
                    if n > 0 {
                        self.progressed();
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if window.ends.is_none_or(|end| now >= end) {
                if window.ends.is_some() && window.got < window.want {
                    return Ok(Flow::Stalled);
                }
                window = Window { ends: Some(now + wait), want: (total - *sent).min(floor), got: 0 };
            }
            if !self.ready_by(libc::POLLOUT, window.ends.unwrap_or(now))? {
                return Ok(Flow::Stalled);
            }
        }
        Ok(Flow::Done)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    use super::*;

    const PACE: Pace = Pace { wait: Duration::from_millis(20), floor: 64 << 10 };

    /// A client socket and the server's side of it as a `Conn` (timeouts 5 s).
    fn pair() -> (TcpStream, Conn) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let t = Duration::from_secs(5);
        (client, Conn::new(server, t, t).unwrap())
    }

    /// Whether the server's socket polls readable within `ms`.
    fn readable(conn: &Conn, ms: i32) -> bool {
        let mut p = libc::pollfd { fd: conn.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the call; the socket is open.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    /// A payload that pauses stalls where it stopped (what arrived kept),
    /// the socket then turns readable only for the next `floor` bytes, and
    /// the rest completes it byte for byte; the socket's settings are as
    /// before afterwards.
    #[test]
    fn a_paused_payload_stalls_where_it_stopped_and_completes_when_it_goes_on() {
        const LEN: usize = 1 << 20;
        let (mut client, mut conn) = pair();
        let payload: Vec<u8> = (0..LEN).map(|i| (i % 249) as u8).collect();
        let mut dst = vec![0u8; LEN];
        client.write_all(&payload[..300_000]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut done = 0;
        // SAFETY: `dst` is writable for its length.
        let flow = unsafe { conn.recv_flowing(dst.as_mut_ptr(), LEN, &mut done, &|| false, PACE) }.unwrap();
        assert_eq!((flow, done), (Flow::Stalled, 300_000));
        assert_eq!(conn.rcvlowat, PACE.floor, "parked, it waits for the next floor of bytes");
        client.write_all(&payload[done..done + 1000]).unwrap();
        assert!(!readable(&conn, 50), "1,000 bytes do not wake it");
        client.write_all(&payload[done + 1000..done + PACE.floor]).unwrap();
        assert!(readable(&conn, 5000), "the floor does");
        client.write_all(&payload[done + PACE.floor..]).unwrap();
        // SAFETY: as above.
        let flow = unsafe { conn.recv_flowing(dst.as_mut_ptr(), LEN, &mut done, &|| false, PACE) }.unwrap();
        assert_eq!((flow, done), (Flow::Done, LEN));
        assert!(dst == payload, "landed byte for byte");
        assert_eq!(conn.rcvlowat, 1);
        assert_eq!(conn.stream.read_timeout().unwrap(), Some(Duration::from_secs(5)), "the timeout is restored");
    }

    /// The small rest after a large one is waited for byte by byte: the
    /// large rest's low-water mark (the next `floor` bytes) does not make
    /// the last few KiB wait for bytes that will never come.
    #[test]
    fn the_tail_after_a_large_rest_is_not_held_to_the_floor() {
        const LEN: usize = 300 << 10;
        let pace = Pace { wait: Duration::from_millis(500), floor: 64 << 10 };
        let (client, mut conn) = pair();
        let payload: Vec<u8> = (0..LEN).map(|i| (i % 239) as u8).collect();
        let sent = payload.clone();
        let sender = std::thread::spawn(move || {
            let mut client = client;
            client.write_all(&sent[..100 << 10]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            // The large rest's receive returns with these at its wait's end...
            client.write_all(&sent[100 << 10..LEN - (30 << 10)]).unwrap();
            std::thread::sleep(Duration::from_millis(600));
            // ... and the last 30 KiB (under the floor) come within the next.
            client.write_all(&sent[LEN - (30 << 10)..]).unwrap();
            client
        });
        let mut dst = vec![0u8; LEN];
        let mut done = 0;
        // SAFETY: `dst` is writable for its length.
        let flow = unsafe { conn.recv_flowing(dst.as_mut_ptr(), LEN, &mut done, &|| false, pace) }.unwrap();
        assert_eq!((flow, done), (Flow::Done, LEN));
        assert!(dst == payload);
        drop(sender.join().unwrap());
    }

    /// A trickle below the floor stalls within a few waits, not when the
    /// payload ends; a stop ends it.
    #[test]
    fn a_trickle_stalls_at_once_and_a_stop_ends_it() {
        let (client, mut conn) = pair();
        let trickler = std::thread::spawn(move || {
            let mut client = client;
            for _ in 0..40 {
                if client.write_all(&[7]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            client
        });
        let mut dst = vec![0u8; 4096];
        let mut done = 0;
        let t0 = Instant::now();
        // SAFETY: `dst` is writable for its length.
        let flow = unsafe { conn.recv_flowing(dst.as_mut_ptr(), dst.len(), &mut done, &|| false, PACE) }.unwrap();
        assert_eq!(flow, Flow::Stalled);
        // Not held until the payload ends (or the 5 s timeout passes).
        assert!(t0.elapsed() < Duration::from_secs(2), "stalled after {:?}", t0.elapsed());
        // SAFETY: as above.
        let e = unsafe { conn.recv_flowing(dst.as_mut_ptr(), dst.len(), &mut done, &|| true, PACE) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        drop(trickler.join().unwrap());
    }

    /// A send the peer does not take stalls with what went counted; once
    /// the peer reads, it goes on from there, prefix first, in order.
    #[test]
    fn a_send_the_peer_does_not_take_stalls_and_goes_on_when_it_reads() {
        const LEN: usize = 16 << 20;
        let (mut client, mut conn) = pair();
        let data: Vec<u8> = (0..LEN).map(|i| (i % 241) as u8).collect();
        let prefix = [1u8, 2, 3, 4];
        let mut sent = 0;
        // SAFETY: `data` is readable for its length.
        let flow = unsafe { conn.send_flowing(&prefix, data.as_ptr(), LEN, &mut sent, &|| false, PACE) }.unwrap();
        assert_eq!(flow, Flow::Stalled);
        assert!(sent > 0 && sent < LEN, "{sent} bytes went before it stalled");
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; prefix.len() + LEN];
            client.read_exact(&mut got).unwrap();
            got
        });
        while flow_again(&mut conn, &prefix, &data, &mut sent) == Flow::Stalled {}
        let got = reader.join().unwrap();
        assert_eq!(got[..4], prefix);
        assert!(got[4..] == data[..], "sent whole and in order");
    }

    fn flow_again(conn: &mut Conn, prefix: &[u8], data: &[u8], sent: &mut usize) -> Flow {
        // SAFETY: `data` is readable for its length.
        unsafe { conn.send_flowing(prefix, data.as_ptr(), data.len(), sent, &|| false, PACE) }.unwrap()
    }
}
