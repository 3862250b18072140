//! etcd through its v3 JSON gateway (`POST /v3/kv/range|txn`,
//! `/v3/lease/grant|keepalive|timetolive|revoke`; keys and values base64):
//! the same keys and values Mooncake's etcd client reads, but this engine's
//! keys live under a lease it keeps alive, so a killed engine's keys are
//! gone within the lease's time to live, and every write of a name is an
//! etcd transaction (created only if absent, replaced only if unchanged,
//! re-put only while still under this engine's lease). Speaking the gateway
//! over the HTTP client keeps the build free of protoc and gRPC.
//!
//! A cluster's members are tried in turn, the last that answered first; an
//! answer that is the normal state of a cluster (an election under way, a
//! member overloaded, restarting or cut off) is tried again with a short
//! pause, on the other members too, until the operation's bound
//! (`PDX_METADATA_TIMEOUT_MS`) is spent, as etcd's own clients do.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{store_text, Entry, Guard, Limits, Store};
use crate::error::{Error, ErrorKind, Result};

/// Largest gateway reply read (a value is base64 inside JSON).
fn reply_limit(max_value: usize) -> u64 {
    (max_value as u64) * 4 / 3 + 64 * 1024
}

/// Longest pause between two rounds of the members.
const MOST_PAUSE: Duration = Duration::from_millis(400);
/// Shortest bound on one request to one member of several.
const LEAST_ATTEMPT: Duration = Duration::from_millis(250);

/// What one request to one member came to.
enum Attempt {
    Answer(Value),
    /// A final answer (a malformed reply, a refusal that retrying cannot change).
    Refused(Error),
    /// Worth trying again, here or on another member; what it said.
    Transient(String),
}

/// Whether etcd's answer is a passing state of the cluster (an election,
/// a member overloaded or cut off from its leader), as etcd's clients treat it.
fn is_transient(status: u16, why: &str) -> bool {
    const PASSING: [&str; 9] = [
        "leader changed",
        "no leader",
        "too many requests",
        "timed out",
        "timeout",
        "not capable",
        "server stopped",
        "unhealthy cluster",
        "temporarily unavailable",
    ];
    let why = why.to_ascii_lowercase();
    matches!(status, 408 | 429 | 502 | 503 | 504) || PASSING.iter().any(|p| why.contains(p))
}

/// A gateway path in the user's words.
fn what(path: &str) -> &'static str {
    match path {
        "/v3/kv/range" => "a read",
        "/v3/kv/txn" => "a write",
        "/v3/lease/grant" => "a lease grant",
        "/v3/lease/keepalive" => "a lease renewal",
        "/v3/lease/timetolive" => "a lease lookup",
        "/v3/lease/revoke" => "a lease revocation",
        _ => "a request",
    }
}

pub struct EtcdStore {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    limits: Limits,
    /// The member to try first: the one that answered last.
    current: Mutex<usize>,
    /// This engine's lease, granted with its first put.
    lease: Mutex<Option<i64>>,
}

impl EtcdStore {
    pub fn new(endpoints: &[String], limits: Limits) -> Result<EtcdStore> {
        if endpoints.is_empty() {
            return Err(Error::invalid_argument("etcd metadata server: no endpoint"));
        }
        Ok(EtcdStore {
            endpoints: endpoints.to_vec(),
            agent: super::http::agent(limits.timeout),
            limits,
            current: Mutex::new(0),
            lease: Mutex::new(None),
        })
    }

    /// POST `body` to `path`, trying the members in turn and again after a
    /// short pause while their answers are transient, until the bound is
    /// spent; the reply's JSON. The error names every member tried and its
    /// last answer.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let deadline = Instant::now() + self.limits.timeout;
        let n = self.endpoints.len();
        let body = body.to_string();
        let mut last: Vec<Option<String>> = vec![None; n];
        let mut pause = Duration::from_millis(25);
        loop {
            let first = *self.current.lock();
            for k in 0..n {
                let index = (first + k) % n;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                // With several members, a frozen one may not hold the whole bound.
                let bound = match n {
                    1 => left,
                    _ => left.min((self.limits.timeout / 2).max(LEAST_ATTEMPT)),
                };
                match self.attempt(index, path, &body, bound) {
                    Attempt::Answer(v) => {
                        *self.current.lock() = index;
                        return Ok(v);
                    }
                    Attempt::Refused(e) => {
                        *self.current.lock() = index;
                        return Err(e);
                    }
                    Attempt::Transient(why) => {
                        log::debug!("etcd at {}: {path}: {why}", self.endpoints[index]);
                        last[index] = Some(why);
                        let mut current = self.current.lock();
                        if *current == index {
                            *current = (index + 1) % n;
                        }
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let nap = Duration::from_millis(fastrand::u64(pause.as_millis() as u64 / 2..=pause.as_millis() as u64));
            std::thread::sleep(nap.min(left));
            pause = (pause * 2).min(MOST_PAUSE);
        }
        let tried: Vec<String> = self
            .endpoints
            .iter()
            .zip(&last)
            .filter_map(|(ep, why)| why.as_ref().map(|why| format!("{ep}: {why}")))
            .collect();
        Err(Error::new(
            ErrorKind::PeerUnreachable,
            format!(
                "etcd metadata server {} did not answer {} ({path}) within {} ms (PDX_METADATA_TIMEOUT_MS); last \
                 answers: {}",
                self.describe(),
                what(path),
                self.limits.timeout.as_millis(),
                tried.join("; ")
            ),
        ))
    }

    /// One request to member `index`, bounded by `bound`.
    fn attempt(&self, index: usize, path: &str, body: &str, bound: Duration) -> Attempt {
        let ep = &self.endpoints[index];
        let url = format!("http://{ep}{path}");
        let request = self.agent.post(&url).config().timeout_global(Some(bound)).build();
        let reply = match request.content_type("application/json").send(body) {
            Ok(r) => r,
            Err(e) => return Attempt::Transient(super::http::say(&e, bound)),
        };
        let status = reply.status().as_u16();
        let limit = reply_limit(self.limits.max_value);
        let bytes = match reply.into_body().with_config().limit(limit).read_to_vec() {
            Ok(b) => b,
            Err(ureq::Error::BodyExceedsLimit(_)) => {
                return Attempt::Refused(Error::protocol(format!(
                    "etcd at {ep}: reply to {path} larger than {limit} bytes"
                )))
            }
            Err(e) => return Attempt::Transient(super::http::say(&e, bound)),
        };
        if status == 200 {
            return match serde_json::from_slice(&bytes) {
                Ok(v) => Attempt::Answer(v),
                Err(e) => Attempt::Refused(Error::protocol(format!("etcd at {ep}: malformed reply to {path}: {e}"))),
            };
        }
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        let message = parsed.as_ref().and_then(|v| v.get("message").or_else(|| v.get("error"))).and_then(Value::as_str);
        let why = match message {
            Some(m) => store_text(m),
            None => store_text(&String::from_utf8_lossy(&bytes[..bytes.len().min(1024)])),
        };
        let said = format!("HTTP {status}: {why}");
        if is_transient(status, &why) {
            return Attempt::Transient(said);
        }
        Attempt::Refused(Error::new(ErrorKind::PeerUnreachable, format!("etcd at {ep} refused {path} ({said})")))
    }

    fn grant(&self) -> Result<i64> {
        let ttl = self.limits.lease_ttl.as_secs().max(1);
        let reply = self.call("/v3/lease/grant", &json!({ "TTL": ttl }))?;
        let id = int64(reply.get("ID")).filter(|&id| id != 0).ok_or_else(|| {
            Error::protocol(format!("etcd granted a lease without an ID: {}", store_text(&reply.to_string())))
        })?;
        log::debug!("etcd lease {id:x} granted ({ttl} s)");
        Ok(id)
    }

    /// This engine's lease, granted now if there is none yet.
    fn lease(&self) -> Result<i64> {
        let mut lease = self.lease.lock();
        if let Some(id) = *lease {
            return Ok(id);
        }
        let id = self.grant()?;
        *lease = Some(id);
        Ok(id)
    }

    /// Forget `id` (it expired): the next put grants a new lease.
    fn forget_lease(&self, id: i64) {
        let mut lease = self.lease.lock();
        if *lease == Some(id) {
            *lease = None;
        }
    }

    /// One transaction: `pairs` put under `lease` if `guard` holds on the first key.
    fn txn(&self, guard: Guard<'_>, pairs: &[(&str, &[u8])], lease: i64) -> Result<bool> {
        let key = B64.encode(pairs[0].0);
        let compare = match guard {
            Guard::Absent => json!({ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }),
            Guard::Unchanged(e) => {
                json!({ "key": key, "target": "MOD", "result": "EQUAL", "mod_revision": e.revision.to_string() })
            }
            Guard::Own => json!({ "key": key, "target": "LEASE", "result": "EQUAL", "lease": lease.to_string() }),
        };
        let puts: Vec<Value> = pairs
            .iter()
            .map(|(k, v)| {
                json!({ "request_put": { "key": B64.encode(k), "value": B64.encode(v), "lease": lease.to_string() } })
            })
            .collect();
        let reply = self.call("/v3/kv/txn", &json!({ "compare": [compare], "success": puts }))?;
        // proto3 JSON leaves a false `succeeded` out.
        Ok(reply.get("succeeded").and_then(Value::as_bool).unwrap_or(false))
    }
}

/// An int64 as the gateway writes it: a decimal string (or a number).
fn int64(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }

    fn read(&self, key: &str, max: usize) -> Result<Option<Entry>> {
        let reply = self.call("/v3/kv/range", &json!({ "key": B64.encode(key) })).map_err(|e| e.context(key))?;
        let Some(kv) = reply.get("kvs").and_then(Value::as_array).and_then(|kvs| kvs.first()) else {
            return Ok(None);
        };
        let bad = |why: &str| Error::protocol(format!("malformed value of {key} in {}: {why}", self.describe()));
        let encoded = match kv.get("value") {
            None => "", // an empty value is left out by the gateway
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(bad("not base64 text")),
        };
        if encoded.len() / 4 * 3 > max + 3 {
            return Err(bad(&format!("larger than {max} bytes; refused")));
        }
        let value = B64.decode(encoded).map_err(|e| bad(&format!("not base64 ({e})")))?;
        if value.len() > max {
            return Err(bad(&format!("larger than {max} bytes; refused")));
        }
        let revision = int64(kv.get("mod_revision")).unwrap_or(0);
        let lease = int64(kv.get("lease")).unwrap_or(0);
        Ok(Some(Entry { value, revision, lease }))
    }

    fn put_if(&self, guard: Guard<'_>, pairs: &[(&str, &[u8])]) -> Result<bool> {
        let Some(&(key, _)) = pairs.first() else { return Ok(true) };
        let lease = self.lease().map_err(|e| e.context(key))?;
        match self.txn(guard, pairs, lease) {
            Err(e) if e.message().contains("lease not found") => {
                // Expired while this engine was stalled: its keys went with
                // it (so they are not its own any more); a new lease.
                self.forget_lease(lease);
                if matches!(guard, Guard::Own) {
                    return Ok(false);
                }
                let lease = self.lease()?;
                self.txn(guard, pairs, lease)
            }
            other => other,
        }
        .map_err(|e| e.context(key))
    }

    fn is_own(&self, entry: &Entry, _: &[u8]) -> bool {
        entry.lease != 0 && *self.lease.lock() == Some(entry.lease)
    }

    fn lease_left(&self, lease: i64) -> Result<Option<Duration>> {
        match self.call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() })) {
            Ok(reply) => Ok(int64(reply.get("TTL")).filter(|&t| t > 0).map(|t| Duration::from_secs(t as u64))),
            Err(e) if e.message().contains("lease not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn remove_own(&self, _: &[&str], _: &[u8]) -> Result<()> {
        // Revoking the lease ([`Store::release`]) removes exactly the keys
        // under it, which are this engine's and no other's.
        Ok(())
    }

    fn renew(&self) -> Result<bool> {
        let Some(id) = *self.lease.lock() else {
            return Ok(true); // nothing put yet
        };
        let reply = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }));
        let alive = match &reply {
            Ok(r) => int64(r.get("result").and_then(|r| r.get("TTL"))).is_some_and(|ttl| ttl > 0),
            Err(e) if e.message().contains("lease not found") => false,
            Err(_) => return reply.map(|_| true),
        };
        if alive {
            return Ok(true);
        }
        self.forget_lease(id);
        self.lease()?;
        Ok(false)
    }

    fn renew_every(&self) -> Option<Duration> {
        // A third of the time to live: two renewals may fail before it ends.
        Some((self.limits.lease_ttl / 3).max(Duration::from_millis(300)))
    }

    fn release(&self) {
        if let Some(id) = self.lease.lock().take() {
            if let Err(e) = self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() })) {
                log::warn!("could not revoke etcd lease {id:x}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int64s_read_as_the_gateway_writes_them() {
        assert_eq!(int64(Some(&json!("7587869182400411146"))), Some(7587869182400411146));
        assert_eq!(int64(Some(&json!(10))), Some(10));
        assert_eq!(int64(Some(&json!("x"))), None);
        assert_eq!(int64(None), None);
    }

    fn limits(ms: u64) -> Limits {
        Limits { timeout: Duration::from_millis(ms), max_value: 1 << 20, lease_ttl: Duration::from_secs(5) }
    }

    /// A port nothing listens on (bound then closed).
    fn dead_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A gateway that answers the `n`th request (from 0) with `answer(n)`
    /// (status, body), one request per connection; counts the requests.
    fn gateway(
        answer: impl Fn(usize) -> (u16, String) + Send + 'static,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ep = listener.local_addr().unwrap().to_string();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (status, text) = answer(n);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: \
                     close\r\n\r\n{text}",
                    text.len()
                );
                let _ = stream.write_all(reply.as_bytes());
            }
        });
        (ep, count)
    }

    #[test]
    fn an_unreachable_etcd_fails_within_the_bound_naming_it() {
        let port = dead_port();
        let store = EtcdStore::new(&[format!("127.0.0.1:{port}")], limits(1000)).unwrap();
        let t0 = std::time::Instant::now();
        let e = store.read("mooncake/ram/x", 1024).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert!(e.message().contains(&format!("etcd://127.0.0.1:{port}")), "{e}");
        assert!(e.message().contains(&format!("127.0.0.1:{port}: connection refused")), "{e}");
        assert!(e.message().contains("did not answer a read"), "{e}");
    }

    #[test]
    fn an_election_is_waited_out_on_every_member() {
        let leader_changed =
            r#"{"error":"etcdserver: leader changed","code":14,"message":"etcdserver: leader changed"}"#;
        let (ep, count) = gateway(move |n| match n {
            0 | 1 => (503, leader_changed.to_owned()),
            _ => (200, r#"{"header":{},"kvs":[{"key":"","value":"eA==","mod_revision":"7","lease":"9"}]}"#.to_owned()),
        });
        // The first member refuses connections (killed); the second is electing.
        let store = EtcdStore::new(&[format!("127.0.0.1:{}", dead_port()), ep], limits(3000)).unwrap();
        let got = store.read("k", 1024).unwrap().unwrap();
        assert_eq!(got, Entry { value: b"x".to_vec(), revision: 7, lease: 9 });
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[test]
    fn a_permanent_answer_is_not_retried_and_a_store_text_is_bounded() {
        let huge = format!(r#"{{"message":"etcdserver: bad\r\nX{}"}}"#, "a".repeat(500_000));
        let (ep, count) = gateway(move |_| (400, huge.clone()));
        let store = EtcdStore::new(&[ep], limits(3000)).unwrap();
        let e = store.read("k", 1024).unwrap_err();
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(e.message().len() < 400, "{} bytes", e.message().len());
        assert!(e.message().contains("bad\\r\\nX"), "{e}");
    }

    #[test]
    fn when_every_member_stays_transient_the_error_names_each_and_its_last_answer() {
        let (a, _) = gateway(|_| (503, r#"{"message":"etcdserver: no leader"}"#.to_owned()));
        let (b, _) = gateway(|_| (500, r#"{"message":"etcdserver: request timed out"}"#.to_owned()));
        let store = EtcdStore::new(&[a.clone(), b.clone()], limits(600)).unwrap();
        let t0 = std::time::Instant::now();
        let e = store.read("k", 1024).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert!(e.message().contains(&format!("{a}: HTTP 503: etcdserver: no leader")), "{e}");
        assert!(e.message().contains(&format!("{b}: HTTP 500: etcdserver: request timed out")), "{e}");
        assert!(e.message().contains("within 600 ms"), "{e}");
    }

    #[test]
    fn transient_and_permanent_answers_are_told_apart() {
        assert!(is_transient(503, "etcdserver: leader changed"));
        assert!(is_transient(500, "etcdserver: request timed out"));
        assert!(is_transient(429, ""));
        assert!(!is_transient(400, "etcdserver: requested lease not found"));
        assert!(!is_transient(404, "Not Found"));
    }
}
