//! Payloads that move only while the peer keeps pace: a server connection
//! served from a readiness loop receives a request's payload, or sends a
//! read's answer, on its thread while the bytes flow, and gives the
//! connection back to the loop where they stall (see
//! `engine::server::data::FLOW_WAIT`), its place in the payload kept by the
//! caller.

use std::io::{self, IoSlice};
use std::time::Duration;

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

impl Conn {
    /// `SO_RCVLOWAT`: readiness (and a blocking receive) waits for `bytes`
    /// queued, or the end of the stream. A system call only when it changes.
    pub fn set_rcvlowat(&mut self, bytes: usize) -> io::Result<()> {
        let bytes = bytes.max(1);
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

    /// The receive (`receiving`) or send timeout: `short`, or (`None`) the
    /// one given to [`Conn::new`] again. A system call only when it changes.
    fn set_short_timeout(&mut self, receiving: bool, short: Option<Duration>) -> io::Result<()> {
        let (now, configured) = if receiving {
            (&mut self.short_timeouts.0, self.timeouts.0)
        } else {
            (&mut self.short_timeouts.1, self.timeouts.1)
        };
        if *now == short {
            return Ok(());
        }
        let t = Some(short.unwrap_or(configured).max(Duration::from_millis(1)));
        if receiving {
            self.stream.set_read_timeout(t)?;
        } else {
            self.stream.set_write_timeout(t)?;
        }
        *now = short;
        Ok(())
    }

    /// Receive `len` bytes into `ptr`, from `*done` on, while they keep
    /// coming at `pace`: whenever nothing is queued, the next `floor` bytes
    /// (the rest, if fewer) must arrive within `wait`. [`Flow::Done`] once
    /// all are in; [`Flow::Stalled`] when they did not: `*done` counts what
    /// landed, and `SO_RCVLOWAT` is left at the next `floor` bytes (or the rest), so that
    /// the socket turns readable when the payload flows again (the bytes of
    /// a trickle wait in the kernel meanwhile). Large remainders go straight
    /// into the destination, a whole chunk per receive; `stop` is checked
    /// between receives and aborts when it returns true.
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
        let restored = self.set_short_timeout(true, None);
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
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
            // Nothing queued: the next `floor` bytes within `wait`, or stalled.
            let want = (len - *done).min(floor);
            self.set_rcvlowat(want)?;
            self.set_short_timeout(true, Some(wait))?;
            let flags = if len - *done >= RECV_BUF / 2 { libc::MSG_WAITALL } else { 0 };
            // SAFETY: forwarded from the caller.
            match unsafe { self.take_payload(ptr, len, done, flags) } {
                Ok(0) => return Err(Self::eof()),
                Ok(n) => stalled = n < want,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => stalled = true,
                Err(e) => return Err(e),
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
    /// two on, while the peer keeps taking them at `pace`: once the socket
    /// has no room, each `floor` bytes (the rest, if fewer) must go within
    /// `wait`.
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
        let flow = unsafe { self.send_flowing_inner(prefix, ptr, len, sent, stop, pace) };
        let restored = self.set_short_timeout(false, None);
        let flow = flow?;
        restored?;
        Ok(flow)
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
        // Past the first send that found no room, sends block (for `wait` at most).
        let mut blocking = false;
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
            let flags = if blocking { libc::MSG_NOSIGNAL } else { libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT };
            let want = (total - *sent).min(floor);
            match SockRef::from(&self.stream).send_vectored_with_flags(&pieces, flags) {
                Ok(n) => {
                    *sent += n;
                    if n > 0 {
                        self.progressed();
                    }
                    if blocking && n < want {
                        return Ok(Flow::Stalled);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if blocking {
                        return Ok(Flow::Stalled);
                    }
                    self.set_short_timeout(false, Some(wait))?;
                    blocking = true;
                }
                Err(e) => return Err(e),
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
        assert_eq!(conn.stream.write_timeout().unwrap(), Some(Duration::from_secs(5)), "the timeout is restored");
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
