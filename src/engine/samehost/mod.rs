//! The same-host link: when two pdx engines share a host, a data
//! connection between them carries only doorbells and statuses, and the
//! target copies each payload itself with one cross-process copy
//! ([`xmem`]) between the initiator's memory and its own registered region.
//! The target still checks every range against its regions exactly as over
//! TCP; only the payload skips the socket.
//!
//! Finding out: each pdx descriptor carries the engine's [`HostIdentity`]
//! (boot id, pid namespace, pid, uid). An initiator whose peer looks like
//! the same host ([`offer_or_why_not`]) offers the link in the pdx hello of
//! a new data connection ([`negotiate`]); the target checks the offer
//! ([`accept`]): the same host, pid namespace and user, the connection
//! really belongs to the process named, and that process itself speaks on
//! it: the target sends a fresh nonce, the initiator writes it into its own
//! memory ([`ProbeSlot`]) and the target reads it there with a
//! cross-process copy. Either answer names its reason; anything short of
//! yes leaves the connection on TCP.
//!
//! Every request, proven: the hello proves who spoke then, not who writes
//! on the socket later (a forked child holds its parent's sockets). So no
//! request travels on the connection: the target reads each one from the
//! pinned process's own memory ([`ring`]), and copies the initiator's bytes
//! only inside the memory the initiator listed there as registered. The
//! initiator's side is [`window`] (host memory) and [`device`] (CUDA IPC);
//! the frames are [`frames`]; the target's serving is the server's.
//!
//! Layering: the initiator and the server use this module; it uses only
//! what lies below them (`protocol`, `net`, `memory`). The wire layers carry
//! what the link says in the hello and the descriptor as JSON they do not
//! interpret.

pub(crate) mod device;
pub(crate) mod frames;
pub(crate) mod kernel;
pub(crate) mod negotiate;
pub(crate) mod ring;
pub(crate) mod window;
pub(crate) mod xmem;

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Name of the path in statistics, logs and `pdx_peer_info`.
pub(crate) const PATH: &str = "same-host";

/// This process's pid, without a system call on every use (a link checks
/// it for every window: it runs only in the process that made it). Cached
/// once a `fork` handler is in place that forgets it in the child (it only
/// stores to an atomic, as a handler there may), so a forked child reads
/// its own. Where the handler cannot be installed, or a child comes from a
/// raw `clone` that runs no handlers, what a link proves still holds: the
/// target reads requests from the process it pinned, never from a child.
pub(crate) fn this_process() -> u32 {
    use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
    /// 0: no handler yet; 1: being installed; 2: installed; 3: failed (never cache).
    static HANDLER: AtomicU8 = AtomicU8::new(0);
    static PID: AtomicU32 = AtomicU32::new(0);
    extern "C" fn forked_child() {
        PID.store(0, Ordering::Release);
    }
    let cached = PID.load(Ordering::Acquire);
    if cached != 0 {
        return cached;
    }
    let pid = std::process::id();
    if HANDLER.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        // SAFETY: registers a child handler that only stores to an atomic
        // (async-signal-safe); no prepare or parent handler.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
        HANDLER.store(if rc == 0 { 2 } else { 3 }, Ordering::Release);
    }
    // Cached only once the handler is in: a fork before that leaves the
    // child nothing cached.
    if HANDLER.load(Ordering::Acquire) == 2 {
        PID.store(pid, Ordering::Release);
    }
    pid
}

/// What identifies this process on this host, as a descriptor carries it
/// (`pdx_host`; Mooncake ignores the field).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostIdentity {
    /// `/proc/sys/kernel/random/boot_id`: the same on one host until it reboots.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid`: pids mean the same only within one namespace.
    pub pid_ns: u64,
    pub pid: u32,
    /// Effective uid: cross-process copies are allowed between one user's processes.
    pub uid: u32,
}

impl HostIdentity {
    /// This process's identity, read once (`None` where `/proc` cannot say).
    /// Read again in a forked child (another pid, and perhaps another pid
    /// namespace or user since).
    pub fn current() -> Option<HostIdentity> {
        static OWN: Mutex<Option<(u32, Option<HostIdentity>)>> = Mutex::new(None);
        let pid = this_process();
        let mut own = OWN.lock();
        match &*own {
            Some((p, id)) if *p == pid => id.clone(),
            _ => {
                let id = Self::read(pid);
                *own = Some((pid, id.clone()));
                id
            }
        }
    }

    /// A peer's identity, as its descriptor carries it (`pdx_host`); `None`
    /// where it has none or a malformed one (then no link).
    pub fn of_descriptor(field: Option<&serde_json::Value>) -> Option<HostIdentity> {
        serde_json::from_value(field?.clone()).ok()
    }

    /// This process's identity as a descriptor carries it.
    pub fn for_descriptor() -> Option<serde_json::Value> {
        serde_json::to_value(HostIdentity::current()?).ok()
    }

    fn read(pid: u32) -> Option<HostIdentity> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().to_owned();
        let pid_ns = std::fs::metadata("/proc/self/ns/pid").ok()?.ino();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        (!boot_id.is_empty()).then_some(HostIdentity { boot_id, pid_ns, pid, uid })
    }

    /// Why `other` cannot be reached with a cross-process copy from here,
    /// from this process's point of view; `None` if nothing rules it out.
    fn differs(&self, other: &HostIdentity, other_name: &str) -> Option<String> {
        if self.boot_id != other.boot_id {
            return Some(format!("{other_name} is on another host (its boot id differs)"));
        }
        if self.pid_ns != other.pid_ns {
            return Some(format!(
                "{other_name} runs in another pid namespace (pid:[{}], this engine pid:[{}]); a cross-process copy \
                 needs both in one",
                other.pid_ns, self.pid_ns
            ));
        }
        if self.uid != other.uid {
            return Some(format!(
                "{other_name} runs as another user (uid {}, this engine uid {}): no permission for cross-process \
                 copies (ptrace access)",
                other.uid, self.uid
            ));
        }
        None
    }
}

/// The initiator's offer in the pdx hello: who it is and where in its
/// memory it answers the target's challenge.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    pub host: HostIdentity,
    /// Address in the initiator of [`PROBE_LEN`] bytes ([`ProbeSlot`]) whose
    /// value is `probe` until the initiator writes the target's nonce there.
    pub probe_addr: u64,
    /// Those bytes, hex (what an older target copies and compares).
    pub probe: String,
    /// The initiator answers a challenge ([`Challenge`]): it writes the
    /// target's fresh nonce at `probe_addr` before the answer. Absent
    /// (false) from an older pdx, whose offers are declined: holding the
    /// connection and naming a process proves nothing on its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nonce_proof: bool,
    /// The initiator can export its device memory through CUDA IPC
    /// ([`device`]); absent (false) from an older pdx.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_ipc: bool,
    /// The initiator holds a peer secret and waits for the answer after its
    /// proof: a target with a secret checks nothing of an offer before the
    /// peer has proven it (absent (false) from an older pdx, whose offers
    /// such a target then declines unchecked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answer_after_proof: bool,
    /// Address in the initiator of its ring ([`ring`]), `ring_len` bytes:
    /// where the target reads every request of the link. Absent (0) from an
    /// older pdx, whose offers are declined: it sends its requests on the
    /// connection, where any process that holds its socket could send them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ring_addr: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ring_len: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The target's answer: accepted, or why not.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub accepted: bool,
    pub reason: String,
    /// The target imports the initiator's device memory through CUDA IPC
    /// (asked for, and the link accepted); absent (false) from an older pdx.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_ipc: bool,
    /// Why device memory does or does not use CUDA IPC (empty when the
    /// offer did not ask).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device_reason: String,
    /// The target reads every request from the initiator's ring; absent
    /// (false) from an older pdx, which takes them from the connection (the
    /// initiator then stays on TCP).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ring: bool,
}

impl Answer {
    /// A refusal, for `reason`.
    pub fn refused(reason: String) -> Answer {
        Answer { accepted: false, reason, device_ipc: false, device_reason: String::new(), ring: false }
    }
}

/// Length of the probe and of the target's nonce (the link's key).
pub(crate) const PROBE_LEN: usize = ring::KEY_LEN;

/// The initiator's side of the challenge: [`PROBE_LEN`] bytes of its own
/// memory, one slot per hello, where it writes the target's nonce. Only the
/// process that owns this memory can put the nonce there, so a target that
/// reads it back through the kernel knows the process it names is the one
/// speaking on the connection (not a forked child or another process that
/// was handed the socket).
pub(crate) struct ProbeSlot(Box<[u8; PROBE_LEN]>);

impl ProbeSlot {
    /// A slot holding random bytes (what an older target reads as the probe).
    pub fn new() -> ProbeSlot {
        let mut b = Box::new([0u8; PROBE_LEN]);
        b.iter_mut().for_each(|x| *x = fastrand::u8(..));
        ProbeSlot(b)
    }

    /// `offer`, answered from this slot.
    pub fn offer(&self, offer: Offer) -> Offer {
        Offer { probe_addr: self.0.as_ptr() as u64, probe: hex(&self.0[..]), nonce_proof: true, ..offer }
    }

    /// Write the target's nonce (`PROBE_LEN` bytes, hex) into the slot:
    /// the nonce, or `None` if it is not one.
    pub fn answer(&mut self, nonce: &str) -> Option<[u8; PROBE_LEN]> {
        let bytes: [u8; PROBE_LEN] = unhex(nonce)?.try_into().ok()?;
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: `i < PROBE_LEN`, inside the boxed array we own. Volatile:
            // the only reader is another process (through the kernel).
            unsafe { std::ptr::write_volatile(self.0.as_mut_ptr().add(i), b) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Some(bytes)
    }
}

/// The target's side of the challenge: sends the nonce (hex) to the
/// initiator on the connection and waits until it says it wrote it; `Err`
/// says why not.
pub(crate) type Challenge<'a> = &'a mut dyn FnMut(&str) -> Result<(), String>;

/// A fresh nonce from the kernel's generator (never a guessable one: an
/// attacker must not find it already in the named process's memory).
fn fresh_nonce() -> Result<[u8; PROBE_LEN], String> {
    let mut bytes = [0u8; PROBE_LEN];
    // SAFETY: `bytes` is writable for its length; getrandom writes at most that.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == PROBE_LEN as isize {
        Ok(bytes)
    } else {
        Err(format!("the peer cannot draw a nonce (getrandom: {})", std::io::Error::last_os_error()))
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The Yama LSM's `ptrace_scope`, if the LSM is there.
fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?.trim().parse().ok()
}

/// Under Yama scope 1 a process may name one other process that can read
/// its memory: (this process's pid, the pid it named); a forked child has
/// named nobody.
static PTRACER: Mutex<Option<(u32, u32)>> = Mutex::new(None);

/// Let `pid` (and only it) copy from and to this process where Yama
/// requires it.
fn grant(pid: u32) -> Result<(), String> {
    match yama_scope() {
        None | Some(0) => Ok(()),
        Some(1) => {
            let mut state = PTRACER.lock();
            let me = std::process::id();
            let granted = state.filter(|&(by, _)| by == me).map(|(_, p)| p);
            // A pid named before whose process is gone makes room.
            let gone = |p: u32| {
                // SAFETY: kill with signal 0 only checks that the process exists.
                let rc = unsafe { libc::kill(p as libc::pid_t, 0) };
                rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            };
            match granted {
                Some(p) if p == pid => Ok(()),
                Some(p) if !gone(p) => Err(format!(
                    "Yama ptrace_scope is 1 and lets a process name one peer that may copy its memory; this process \
                     named pid {p} (another same-host peer)"
                )),
                _ => {
                    // SAFETY: prctl with PR_SET_PTRACER takes a pid and touches no memory of ours.
                    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::c_ulong::from(pid), 0, 0, 0) };
                    if rc != 0 {
                        return Err(format!("PR_SET_PTRACER for pid {pid}: {}", std::io::Error::last_os_error()));
                    }
                    *state = Some((me, pid));
                    Ok(())
                }
            }
        }
        Some(n) => Err(format!("Yama ptrace_scope is {n}: only privileged processes may copy another's memory")),
    }
}

/// The initiator's side: an offer for a peer whose descriptor says
/// `peer`, or why the link is not offered. `enabled` is this engine's
/// `PDX_SAME_HOST`.
pub(crate) fn offer_or_why_not(enabled: bool, peer: Option<&HostIdentity>) -> Result<Offer, String> {
    if !enabled {
        return Err("PDX_SAME_HOST=off on this engine".to_owned());
    }
    let Some(peer) = peer else {
        return Err("the peer's descriptor has no host identity (a Mooncake engine, or an older pdx)".to_owned());
    };
    let own = HostIdentity::current().ok_or("this process cannot read its host identity from /proc")?;
    if let Some(why) = own.differs(peer, "the peer") {
        return Err(why);
    }
    grant(peer.pid)?;
    // The probe slot and the ring are the hello's own (`negotiate::Dial`).
    Ok(Offer {
        host: own.clone(),
        probe_addr: 0,
        probe: String::new(),
        nonce_proof: false,
        device_ipc: false,
        answer_after_proof: false,
        ring_addr: 0,
        ring_len: 0,
    })
}

/// The target's side: whether to serve the connection from `from` (to
/// `local`) with the same-host link as `offer` asks, and the link granted
/// (the process pinned, its ring, the key). `enabled` is this engine's
/// `PDX_SAME_HOST`. The reason is worded for the initiator.
///
/// The decision rests on the kernel's word only ([`kernel`]): who owns the
/// connection's socket, which process holds it, and that process's uids
/// and pid namespace; the offer's claims are checked against them. Then
/// `challenge` sends a fresh nonce to the initiator, and the nonce must be
/// found in the named process's memory at the offered address (only that
/// process can have written it: a process that merely holds the same
/// socket cannot). The named process is pinned ([`xmem::PeerProcess`])
/// before any of it is read and must still run once all is read, so every
/// fact is about one process. The nonce becomes the link's key: every
/// request of the link is then read from that process's ring ([`ring`]).
pub(crate) fn accept(
    enabled: bool,
    offer: &Offer,
    from: SocketAddr,
    local: SocketAddr,
    challenge: Challenge<'_>,
) -> (Answer, Option<ring::TargetLink>) {
    let refused = |reason: String| (Answer::refused(reason), None);
    if !enabled {
        return refused("the peer has PDX_SAME_HOST=off".to_owned());
    }
    #[cfg(test)]
    EVALUATED.lock().push(offer.probe_addr);
    let Some(own) = HostIdentity::current() else {
        return refused("the peer cannot read its host identity from /proc".to_owned());
    };
    if let Some(why) = own.differs(&offer.host, "this engine") {
        return refused(format!("the peer finds that {why}"));
    }
    // Only a process of this host connecting to us, and only the one the
    // offer names, may have us copy its memory.
    if !(from.ip() == local.ip() || from.ip().is_loopback()) {
        return refused(format!("the connection comes from {from}, not from an address of the peer's host"));
    }
    if !offer.nonce_proof {
        return refused(
            "the initiator's pdx is older and cannot prove it is the process it names (by writing the peer's nonce \
             into its own memory); holding the connection proves nothing on its own"
                .to_owned(),
        );
    }
    if offer.ring_addr == 0 {
        return refused(
            "the initiator's pdx is older and sends same-host requests on the connection, where any process that \
             holds its socket could send them too; the peer serves only requests it reads from the initiator's own \
             memory"
                .to_owned(),
        );
    }
    if !(ring::HEAD_LEN as u64..=ring::MAX_RING_LEN).contains(&offer.ring_len) {
        return refused(format!(
            "the offered ring is {} bytes; the peer reads rings of {} B to {} KiB",
            offer.ring_len,
            ring::HEAD_LEN,
            ring::MAX_RING_LEN >> 10
        ));
    }
    match check_with_kernel(&own, offer, from, local, challenge) {
        Ok((peer, key)) => {
            let mut yes =
                Answer { accepted: true, reason: ACCEPTED.to_owned(), ring: true, ..Answer::refused(String::new()) };
            if offer.device_ipc {
                (yes.device_ipc, yes.device_reason) = match device::can_import(&own, &offer.host) {
                    Ok(()) => (true, device::ACCEPTED.to_owned()),
                    Err(why) => (false, why),
                };
            }
            (yes, Some(ring::TargetLink::new(peer, offer.ring_addr, offer.ring_len, key)))
        }
        Err(why) => refused(why),
    }
}

/// The reason of an accepted offer.
pub(crate) const ACCEPTED: &str = "same host, pid namespace and user (the kernel's account of the connection's \
                                   process); the process named wrote the peer's nonce into its own memory";

/// The kernel's facts about the process `offer` names and the connection
/// (see [`accept`]), then the challenge: the process, pinned, and the nonce
/// it wrote, or why the link is refused.
fn check_with_kernel(
    own: &HostIdentity,
    offer: &Offer,
    from: SocketAddr,
    local: SocketAddr,
    challenge: Challenge<'_>,
) -> Result<(xmem::PeerProcess, [u8; PROBE_LEN]), String> {
    let pid = offer.host.pid;
    // Without CAP_SYS_PTRACE the kernel itself keeps this thread's copies
    // to processes of this engine's user.
    xmem::shed_ptrace_capability().map_err(|e| format!("the peer cannot drop CAP_SYS_PTRACE for its copies: {e}"))?;
    let (ruid, euid) = kernel::own_uids();
    if ruid != euid {
        return Err(format!(
            "the peer runs with real uid {ruid} and effective uid {euid}; the link needs one user on both sides"
        ));
    }
    let peer = xmem::PeerProcess::open(pid).map_err(|e| format!("no process {pid} here to check: {e}"))?;
    let socket = kernel::socket_of(from, local)?;
    if socket.uid != euid {
        return Err(format!(
            "the connection's socket belongs to uid {} by the kernel's account (the peer runs as uid {euid}): the \
             link is only for processes of the peer's own user",
            socket.uid
        ));
    }
    if offer.host.uid != socket.uid {
        return Err(format!(
            "the offer claims uid {}, but the kernel says the connection's socket belongs to uid {}",
            offer.host.uid, socket.uid
        ));
    }
    let process = kernel::process(pid)?;
    if process.uids.iter().any(|&u| u != euid) {
        let [r, e, s, f] = process.uids;
        return Err(format!(
            "pid {pid} runs as uid {r}/{e}/{s}/{f} (real/effective/saved/fs, the kernel's account); the link is only \
             for a process running wholly as the peer's user (uid {euid})"
        ));
    }
    // Its namespace and open files: readable to a root engine only with
    // CAP_SYS_PTRACE (its uids were checked above; the copies run without).
    let read = xmem::with_ptrace_capability(|| {
        let pid_ns = kernel::pid_namespace(pid)?;
        if pid_ns != own.pid_ns || offer.host.pid_ns != pid_ns {
            return Err(format!(
                "pid {pid} runs in pid namespace pid:[{pid_ns}] by the kernel's account (the offer claims pid:[{}], \
                 the peer runs in pid:[{}])",
                offer.host.pid_ns, own.pid_ns
            ));
        }
        kernel::holds_socket(pid, socket.inode)
    });
    read.map_err(|e| format!("the peer cannot raise CAP_SYS_PTRACE to read /proc/{pid}: {e}"))??;
    // The process named must itself be the one speaking: it writes a nonce
    // it can only learn from this connection into its own memory.
    let nonce = fresh_nonce()?;
    challenge(&hex(&nonce)).map_err(|e| format!("the initiator did not answer the same-host challenge: {e}"))?;
    let mut got = [0u8; PROBE_LEN];
    // SAFETY: `got` is PROBE_LEN writable bytes.
    if let Err(e) = unsafe { peer.read_from(offer.probe_addr, got.as_mut_ptr(), PROBE_LEN) } {
        return Err(format!("the peer's copy of the challenge from pid {pid} failed: {}", xmem::explain(&e)));
    }
    if got != nonce {
        return Err(format!(
            "pid {pid} did not write the peer's nonce at the offered address: the offer came from another process \
             than the one it names (one that holds the same connection)"
        ));
    }
    // Still running: every fact above was about this one process.
    if !peer.running() {
        return Err(format!("pid {pid} exited while its offer was checked"));
    }
    Ok((peer, nonce))
}

/// Tests: the probe address of every offer this process began to check.
#[cfg(test)]
pub(crate) static EVALUATED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// The path to one peer and why: what its last data connection
/// negotiated, and whether the link failed (then TCP until the peer is
/// forgotten and met again).
pub(crate) struct PathChoice {
    /// (same-host?, reason).
    now: Mutex<(bool, String)>,
    failed: Mutex<Option<String>>,
    /// Why CUDA IPC failed for this peer's device memory, if it did (then
    /// device memory is staged until the peer is forgotten).
    ipc_failed: Mutex<Option<String>>,
    /// A window of memory this engine did not register rode TCP (said once).
    unregistered_noted: std::sync::atomic::AtomicBool,
}

impl Default for PathChoice {
    fn default() -> Self {
        PathChoice {
            now: Mutex::new((false, "no data connection opened yet".to_owned())),
            failed: Mutex::new(None),
            ipc_failed: Mutex::new(None),
            unregistered_noted: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl PathChoice {
    /// The path (`"same-host"` or `"tcp"`) and its reason.
    pub fn get(&self) -> (&'static str, String) {
        let now = self.now.lock();
        (if now.0 { PATH } else { "tcp" }, now.1.clone())
    }

    /// Why the link failed for this peer, if it did.
    pub fn failed(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// Whether the link failed for this peer (no copy of the reason).
    pub fn has_failed(&self) -> bool {
        self.failed.lock().is_some()
    }

    /// A data connection to `session` was opened on this path; logged at
    /// info when path or reason changed.
    pub fn decided(&self, session: &str, same_host: bool, reason: String) {
        let mut now = self.now.lock();
        if now.0 != same_host || now.1 != reason {
            let path = if same_host { PATH } else { "tcp" };
            log::info!("{session}: data path {path} ({reason})");
            *now = (same_host, reason);
        }
    }

    /// Why CUDA IPC failed for this peer, if it did.
    pub fn ipc_failed(&self) -> Option<String> {
        self.ipc_failed.lock().clone()
    }

    /// Whether CUDA IPC failed for this peer (no copy of the reason).
    pub fn ipc_has_failed(&self) -> bool {
        self.ipc_failed.lock().is_some()
    }

    /// CUDA IPC failed mid-transfer: device memory is staged over the link
    /// from now on (the reason says so, and is logged once).
    pub fn ipc_fall_back(&self, session: &str, why: String) {
        {
            let mut failed = self.ipc_failed.lock();
            if failed.is_some() {
                return;
            }
            *failed = Some(why.clone());
        }
        let (same_host, reason) = self.now.lock().clone();
        let base = reason.split("; device memory").next().unwrap_or_default().to_owned();
        self.decided(session, same_host, format!("{base}; device memory staged: {why}"));
    }

    /// A window whose local memory this engine did not (all) register rode
    /// TCP on the link's connection: logged once per peer.
    pub fn note_unregistered(&self, session: &str) {
        if !self.unregistered_noted.swap(true, std::sync::atomic::Ordering::Relaxed) {
            log::info!(
                "{session}: a transfer's local memory is not registered with this engine: it rides TCP on the \
                 same-host link's connection (the peer copies only memory this engine registered; register it to \
                 use the link)"
            );
        }
    }

    /// The link failed mid-transfer: TCP from now on.
    pub fn fall_back(&self, session: &str, reason: String) {
        self.failed.lock().get_or_insert_with(|| reason.clone());
        self.decided(session, false, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The initiator's answer to a challenge: the nonce written into `slot`.
    fn writes_into(slot: &mut ProbeSlot) -> impl FnMut(&str) -> Result<(), String> + '_ {
        move |nonce| if slot.answer(nonce).is_some() { Ok(()) } else { Err("not a nonce".to_owned()) }
    }

    /// This process's offer, answered from `slot`, naming a ring (`accept`
    /// only records where it is).
    fn own_offer(slot: &ProbeSlot) -> Offer {
        let offer = slot.offer(offer_or_why_not(true, HostIdentity::current().as_ref()).unwrap());
        Offer { ring_addr: 0x1000, ring_len: ring::RING_LEN as u64, ..offer }
    }

    fn other(f: impl FnOnce(&mut HostIdentity)) -> HostIdentity {
        let mut h = HostIdentity::current().expect("/proc");
        f(&mut h);
        h
    }

    /// The cached pid is this process's, and a forked child's own.
    #[test]
    fn this_process_is_the_callers_after_fork_too() {
        assert_eq!(this_process(), std::process::id());
        assert_eq!(this_process(), std::process::id(), "cached");
        // SAFETY: the child makes only atomic loads and system calls, then _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(if this_process() == libc::getpid() as u32 { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child saw its parent's pid");
        assert_eq!(this_process(), std::process::id());
    }

    #[test]
    fn reasons_name_the_difference() {
        let off = offer_or_why_not(false, HostIdentity::current().as_ref()).unwrap_err();
        assert!(off.contains("PDX_SAME_HOST=off"), "{off}");
        assert!(offer_or_why_not(true, None).unwrap_err().contains("Mooncake"));
        let boot = offer_or_why_not(true, Some(&other(|h| h.boot_id = "x".into()))).unwrap_err();
        assert!(boot.contains("another host"), "{boot}");
        let ns = offer_or_why_not(true, Some(&other(|h| h.pid_ns += 1))).unwrap_err();
        assert!(ns.contains("pid namespace"), "{ns}");
        let uid = offer_or_why_not(true, Some(&other(|h| h.uid += 1))).unwrap_err();
        assert!(uid.contains("uid") && uid.contains("ptrace"), "{uid}");
    }

    #[test]
    fn device_ipc_fields_are_optional_both_ways() {
        let mut slot = ProbeSlot::new();
        let offer = own_offer(&slot);
        // An older pdx's offer and answer (no device fields) parse as "no".
        let old_offer = serde_json::to_string(&offer).unwrap();
        assert!(!old_offer.contains("device_ipc"), "{old_offer}");
        assert!(!serde_json::from_str::<Offer>(&old_offer).unwrap().device_ipc);
        let old_answer: Answer = serde_json::from_str(r#"{"accepted":true,"reason":"r"}"#).unwrap();
        assert!(!old_answer.device_ipc && old_answer.device_reason.is_empty());
        // Fields an engine does not know are ignored (an older pdx reading ours).
        let newer: Offer =
            serde_json::from_str(&old_offer.replacen('{', r#"{"device_ipc":true,"later":1,"#, 1)).unwrap();
        assert!(newer.device_ipc);
        // This process's own offer asks for IPC; the answer refuses it with the reason.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, from) = listener.accept().unwrap();
        let asked = Offer { device_ipc: true, ..offer };
        let (answer, _) = accept(true, &asked, from, server.local_addr().unwrap(), &mut writes_into(&mut slot));
        assert!(answer.accepted && !answer.device_ipc && answer.device_reason.contains("one process"), "{answer:?}");
    }

    #[test]
    fn an_offer_from_this_process_is_accepted_only_on_its_own_connection() {
        let mut slot = ProbeSlot::new();
        let offer = own_offer(&slot);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, from) = listener.accept().unwrap();
        let local = server.local_addr().unwrap();
        let mut answered = writes_into(&mut slot);
        let (yes, pinned) = accept(true, &offer, from, local, &mut answered);
        assert!(yes.accepted, "{yes:?}");
        assert!(yes.reason.contains("kernel") && yes.reason.contains("nonce"), "{yes:?}");
        assert_eq!(pinned.map(|p| p.peer().pid()), Some(std::process::id()));
        let (no, pinned) = accept(false, &offer, from, local, &mut answered);
        assert!(pinned.is_none());
        assert!(!no.accepted && no.reason.contains("PDX_SAME_HOST=off"), "{no:?}");
        // A connection this process does not hold (a made-up port).
        let stranger = SocketAddr::new(from.ip(), 1);
        let (no, _) = accept(true, &offer, stranger, local, &mut answered);
        assert!(!no.accepted, "{no:?}");
        // A claimed uid the kernel does not confirm.
        let claims_other =
            Offer { host: HostIdentity { uid: offer.host.uid + 1, ..offer.host.clone() }, ..offer.clone() };
        let (no, _) = accept(true, &claims_other, from, local, &mut answered);
        assert!(!no.accepted && no.reason.contains("uid"), "{no:?}");
        // A claimed pid namespace the kernel does not confirm is caught by
        // the comparison with this engine's own first; a pid that is no process.
        let nobody = Offer { host: HostIdentity { pid: i32::MAX as u32, ..offer.host.clone() }, ..offer.clone() };
        let (no, _) = accept(true, &nobody, from, local, &mut answered);
        assert!(!no.accepted && no.reason.contains("no process"), "{no:?}");
        drop(answered);
        // A challenge answered without writing the nonce (what a process
        // that holds another's connection can do at best): refused, even
        // though the slot still holds the offered probe bytes.
        let (no, pinned) = accept(true, &offer, from, local, &mut |_| Ok(()));
        assert!(!no.accepted && pinned.is_none() && no.reason.contains("did not write the peer's nonce"), "{no:?}");
        // A challenge not answered at all.
        let (no, _) = accept(true, &offer, from, local, &mut |_| Err("it left".to_owned()));
        assert!(!no.accepted && no.reason.contains("did not answer the same-host challenge: it left"), "{no:?}");
        // An offer of an older pdx (no challenge): declined unchecked.
        let before = EVALUATED.lock().len();
        let old = Offer { nonce_proof: false, ..offer.clone() };
        let (no, _) = accept(true, &old, from, local, &mut |_| panic!("an older offer is not challenged"));
        assert!(!no.accepted && no.reason.contains("older"), "{no:?}");
        assert!(EVALUATED.lock().len() > before);
        // An offer without a ring (a pdx that sends its requests on the
        // connection, where any holder of its socket could): declined
        // unchecked; so is a ring the target would not read.
        for (ring_addr, ring_len, why) in
            [(0, 0, "on the connection"), (0x1000, 8, "32 B"), (0x1000, 2 << 20, "256 KiB")]
        {
            let no_ring = Offer { ring_addr, ring_len, ..offer.clone() };
            let (no, pinned) = accept(true, &no_ring, from, local, &mut |_| panic!("not challenged"));
            assert!(!no.accepted && pinned.is_none() && no.reason.contains(why), "{no:?}");
        }
        drop(client);
    }

    #[test]
    fn a_slot_takes_only_a_nonce() {
        let mut slot = ProbeSlot::new();
        let offer = slot.offer(offer_or_why_not(true, HostIdentity::current().as_ref()).unwrap());
        assert!(offer.nonce_proof && offer.probe.len() == 2 * PROBE_LEN && offer.probe_addr != 0);
        for bad in ["", "00", "zz".repeat(PROBE_LEN).as_str(), "00".repeat(PROBE_LEN + 1).as_str(), "\u{e9}a"] {
            assert!(slot.answer(bad).is_none(), "{bad:?}");
        }
        assert_eq!(slot.answer(&"a5".repeat(PROBE_LEN)), Some([0xa5; PROBE_LEN]));
        assert_eq!(*slot.0, [0xa5; PROBE_LEN]);
    }
}
