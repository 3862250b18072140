//! Mooncake's HTTP metadata server: `GET|PUT|DELETE <url>?key=<escaped key>`,
//! JSON bodies, 200 the only success, 404 a missing key. It has no leases
//! and no transactions; a descriptor whose engine no longer answers is read
//! again by the peer cache (never trusted forever), and a dead holder's keys
//! are replaced when its name is taken over (see
//! [`super::StoreDirectory::claim`]). What it does guarantee is used: the
//! wheel's server refuses to overwrite an `rpc_meta` key, so of several
//! engines creating one name at once exactly one succeeds; every other
//! guard is a read before the write (see docs/metadata.md for what that
//! cannot exclude).

use std::time::Duration;

use super::{store_text, Entry, Guard, Limits, Store};
use crate::error::{Error, ErrorKind, Result};

/// Check an `http://host[:port][/path]` URL (the only form served).
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let rest = url.get("http://".len()..).ok_or("not an http:// URL")?;
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("no host in the URL".to_owned());
    }
    if url.contains(['?', '#']) {
        return Err("the URL may not have a query or fragment (pdx adds ?key=…)".to_owned());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the URL has whitespace".to_owned());
    }
    let port_ok = match crate::transfer::host::parse_session(authority, 80) {
        Ok(a) => a.port != 0,
        Err(_) => false,
    };
    if !port_ok {
        return Err(format!("{authority:?} is not host[:port] with a valid port"));
    }
    Ok(())
}

/// What a request that got no answer met, in the user's words.
pub(super) fn say(e: &ureq::Error, bound: Duration) -> String {
    use std::io::ErrorKind as Io;
    let no_answer = || format!("no answer within {} ms", bound.as_millis());
    match e {
        ureq::Error::Timeout(_) => no_answer(),
        ureq::Error::Io(io) => match io.kind() {
            Io::TimedOut | Io::WouldBlock => no_answer(),
            Io::ConnectionRefused => "connection refused".to_owned(),
            Io::ConnectionReset | Io::ConnectionAborted => "connection reset".to_owned(),
            Io::UnexpectedEof => "connection closed before the answer".to_owned(),
            _ => store_text(&io.to_string()),
        },
        ureq::Error::HostNotFound => "host name not found".to_owned(),
        ureq::Error::ConnectionFailed => "cannot connect".to_owned(),
        other => store_text(&other.to_string()),
    }
}

/// A blocking HTTP/1.1 agent with every request bounded by `timeout` and no
/// proxy, redirects or TLS: one agent per engine, shared by its threads.
pub(super) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .build()
        .into()
}

/// The store behind Mooncake's HTTP metadata server.
pub struct HttpStore {
    url: String,
    agent: ureq::Agent,
    limits: Limits,
}

impl HttpStore {
    pub fn new(url: &str, limits: Limits) -> Result<HttpStore> {
        check_url(url).map_err(|why| Error::invalid_argument(format!("metadata server {url:?}: {why}")))?;
        Ok(HttpStore { url: url.to_owned(), agent: agent(limits.timeout), limits })
    }

    fn key_url(&self, key: &str) -> String {
        format!("{}?key={}", self.url, escape(key))
    }

    /// The error of a request that got no answer.
    fn unreachable(&self, what: &str, key: &str, e: &ureq::Error) -> Error {
        let kind = match e {
            ureq::Error::Timeout(_) => ErrorKind::Timeout,
            _ => ErrorKind::PeerUnreachable,
        };
        let why = say(e, self.limits.timeout);
        Error::new(
            kind,
            format!(
                "metadata server {} did not answer {what} {key} (PDX_METADATA_TIMEOUT_MS {} ms): {why}",
                self.url,
                self.limits.timeout.as_millis()
            ),
        )
    }

    fn refused(&self, what: &str, key: &str, status: u16, body: &[u8]) -> Error {
        let text = store_text(&String::from_utf8_lossy(&body[..body.len().min(1024)]));
        Error::new(
            ErrorKind::PeerUnreachable,
            format!("metadata server {} answered {what} {key} with HTTP {status}: {text}", self.url),
        )
    }

    fn get(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>> {
        let reply = self.agent.get(&self.key_url(key)).call().map_err(|e| self.unreachable("GET", key, &e))?;
        let status = reply.status().as_u16();
        // One byte over the limit tells an oversized value from one at it.
        let body = reply.into_body().with_config().limit(max as u64 + 1).read_to_vec();
        let body = match body {
            Ok(b) if b.len() <= max => b,
            Ok(_) | Err(ureq::Error::BodyExceedsLimit(_)) => {
                return Err(Error::protocol(format!(
                    "value of {key} in {} is larger than {max} bytes; refused",
                    self.url
                )))
            }
            Err(e) => return Err(self.unreachable("GET", key, &e)),
        };
        match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            other => Err(self.refused("GET", key, other, &body)),
        }
    }

    /// PUT `key`: `Ok(false)` when the server refuses it as a duplicate
    /// (its answer to a second `rpc_meta` of one name).
    fn put(&self, key: &str, value: &[u8]) -> Result<bool> {
        let reply = self
            .agent
            .put(&self.key_url(key))
            .content_type("application/json")
            .send(value)
            .map_err(|e| self.unreachable("PUT", key, &e))?;
        let status = reply.status().as_u16();
        if status == 200 {
            return Ok(true);
        }
        let body = reply.into_body().with_config().limit(4096).read_to_vec().unwrap_or_default();
        if status == 400 && String::from_utf8_lossy(&body).to_ascii_lowercase().contains("duplicate") {
            return Ok(false);
        }
        Err(self.refused("PUT", key, status, &body))
    }

    fn delete(&self, key: &str) -> Result<()> {
        let reply = self.agent.delete(&self.key_url(key)).call().map_err(|e| self.unreachable("DELETE", key, &e))?;
        match reply.status().as_u16() {
            200 | 404 => Ok(()),
            status => {
                let body = reply.into_body().with_config().limit(4096).read_to_vec().unwrap_or_default();
                Err(self.refused("DELETE", key, status, &body))
            }
        }
    }
}

/// Percent-escape everything but unreserved characters, as Mooncake's
/// client does (`/` and `:` included).
pub fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len() * 3);
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Store for HttpStore {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn read(&self, key: &str, max: usize) -> Result<Option<Entry>> {
        Ok(self.get(key, max)?.map(|value| Entry { value, revision: 0, lease: 0 }))
    }

    /// The guard is a read before the writes (the server has no compare);
    /// the `rpc_meta` key is written first, where the server's refusal of
    /// a duplicate settles a race to create it.
    fn put_if(&self, guard: Guard<'_>, pairs: &[(&str, &[u8])]) -> Result<bool> {
        let Some(&(key, value)) = pairs.first() else { return Ok(true) };
        let now = self.get(key, value.len().max(4096))?;
        let put_first = match (guard, &now) {
            (Guard::Absent, None) => true,
            (Guard::Absent, Some(_)) => return Ok(false),
            (Guard::Unchanged(e), Some(v)) if *v == e.value => {
                // Removed first: the server refuses to overwrite an rpc_meta key.
                self.delete(key)?;
                true
            }
            (Guard::Unchanged(_), None) => true,
            (Guard::Unchanged(_), Some(_)) => return Ok(false),
            (Guard::Own, Some(v)) if v.as_slice() == value => false,
            (Guard::Own, None) => true,
            (Guard::Own, Some(_)) => return Ok(false),
        };
        if put_first && !self.put(key, value)? {
            return Ok(false);
        }
        for &(k, v) in &pairs[1..] {
            if !self.put(k, v)? {
                return Err(self.refused("PUT", k, 400, b"duplicate key"));
            }
        }
        Ok(true)
    }

    fn is_own(&self, entry: &Entry, own: &[u8]) -> bool {
        entry.value == own
    }

    fn lease_left(&self, _: i64) -> Result<Option<Duration>> {
        Ok(None)
    }

    /// Removed only while the `rpc_meta` key still holds this engine's
    /// address (read just before; the server has no compare).
    fn remove_own(&self, keys: &[&str], own: &[u8]) -> Result<()> {
        let Some(&first) = keys.first() else { return Ok(()) };
        match self.get(first, own.len().max(4096))? {
            Some(v) if v == own => {}
            _ => return Ok(()),
        }
        for key in keys.iter().rev() {
            self.delete(key)?;
        }
        Ok(())
    }

    fn renew(&self) -> Result<bool> {
        Ok(true)
    }

    fn renew_every(&self) -> Option<Duration> {
        None
    }

    fn release(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_escaped_as_mooncake_escapes_them() {
        // As captured from Mooncake's client: GET …?key=mooncake%2Fram%2F127.0.0.1%3A17777
        assert_eq!(escape("mooncake/ram/127.0.0.1:17777"), "mooncake%2Fram%2F127.0.0.1%3A17777");
        assert_eq!(escape("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("http://127.0.0.1:8080/metadata").is_ok());
        assert!(check_url("http://meta/metadata").is_ok());
        assert!(check_url("http://[::1]:8080/metadata").is_ok());
        for bad in ["http://", "http:///m", "http://h:0/m", "http://h:x/m", "http://h/m?key=1", "http://h /m"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}
