//! etcd through its v3 JSON gateway (`POST /v3/kv/range|put|deleterange`,
//! `/v3/lease/grant|keepalive|revoke`; keys and values base64): the same
//! keys and values Mooncake's etcd client reads, but this engine's keys live
//! under a lease it keeps alive, so a killed engine's keys are gone within
//! the lease's time to live. Speaking the gateway over the HTTP client keeps
//! the build free of protoc and gRPC.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{Limits, Store};
use crate::error::{Error, ErrorKind, Result};

/// Largest gateway reply read (a value is base64 inside JSON).
fn reply_limit(max_value: usize) -> u64 {
    (max_value as u64) * 4 / 3 + 64 * 1024
}

pub struct EtcdStore {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    limits: Limits,
    /// The endpoint that answered last (tried first).
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

    /// POST `body` to `path` on the first endpoint that answers; the
    /// reply's JSON. An endpoint that does not answer is passed over; an
    /// error etcd answers with is returned as is.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let start = *self.current.lock();
        let mut failures = Vec::new();
        let limit = reply_limit(self.limits.max_value);
        for k in 0..self.endpoints.len() {
            let index = (start + k) % self.endpoints.len();
            let ep = &self.endpoints[index];
            let url = format!("http://{ep}{path}");
            let reply = match self.agent.post(&url).content_type("application/json").send(body.to_string()) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{ep}: {e}"));
                    continue;
                }
            };
            *self.current.lock() = index;
            let status = reply.status().as_u16();
            let text = match reply.into_body().with_config().limit(limit).read_to_vec() {
                Ok(t) => t,
                Err(ureq::Error::BodyExceedsLimit(_)) => {
                    return Err(Error::protocol(format!("etcd at {ep}: reply to {path} larger than {limit} bytes")))
                }
                Err(e) => {
                    failures.push(format!("{ep}: {e}"));
                    continue;
                }
            };
            let value: Value = serde_json::from_slice(&text)
                .map_err(|e| Error::protocol(format!("etcd at {ep}: malformed reply to {path}: {e}")))?;
            if status != 200 {
                let why = value.get("message").or_else(|| value.get("error")).and_then(Value::as_str).unwrap_or("");
                return Err(Error::new(
                    ErrorKind::PeerUnreachable,
                    format!("etcd at {ep} refused {path} (HTTP {status}): {why}"),
                ));
            }
            return Ok(value);
        }
        Err(Error::new(
            ErrorKind::PeerUnreachable,
            format!(
                "etcd metadata server {} did not answer {path} within {:?}: {}",
                self.describe(),
                self.limits.timeout,
                failures.join("; ")
            ),
        ))
    }

    fn grant(&self) -> Result<i64> {
        let ttl = self.limits.lease_ttl.as_secs().max(1);
        let reply = self.call("/v3/lease/grant", &json!({ "TTL": ttl }))?;
        let id = int64(reply.get("ID"))
            .filter(|&id| id != 0)
            .ok_or_else(|| Error::protocol(format!("etcd granted a lease without an ID: {reply}")))?;
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

    fn get(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>> {
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
        Ok(Some(value))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let lease = self.lease()?;
        let body = json!({ "key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string() });
        match self.call("/v3/kv/put", &body) {
            Err(e) if e.message().contains("lease not found") => {
                // Expired while this engine was stalled: a new lease.
                *self.lease.lock() = None;
                let lease = self.lease()?;
                let body = json!({ "key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string() });
                self.call("/v3/kv/put", &body).map(drop)
            }
            other => other.map(drop),
        }
        .map_err(|e| e.context(key))
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.call("/v3/kv/deleterange", &json!({ "key": B64.encode(key) })).map(drop).map_err(|e| e.context(key))
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
        let fresh = self.grant()?;
        *self.lease.lock() = Some(fresh);
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

    #[test]
    fn an_unreachable_etcd_fails_within_the_bound_naming_it() {
        // A port nothing listens on (bound then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let limits = Limits { timeout: Duration::from_secs(1), max_value: 1 << 20, lease_ttl: Duration::from_secs(5) };
        let store = EtcdStore::new(&[format!("127.0.0.1:{port}")], limits).unwrap();
        let t0 = std::time::Instant::now();
        let e = store.get("mooncake/ram/x", 1024).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert!(e.message().contains(&format!("etcd://127.0.0.1:{port}")), "{e}");
    }
}
