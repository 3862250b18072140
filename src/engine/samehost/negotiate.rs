//! The link's part in a data connection's hello, which carries it as JSON
//! without interpreting it: the initiator's offer and its answer to the
//! target's challenge ([`Dial`]), the target's answer ([`answer`]), and what
//! the initiator makes of that answer ([`Dial::settle`]).

use std::net::SocketAddr;

use serde_json::Value;

use super::super::protocol::hello::Offering;
use super::ring::{InitiatorLink, Ring, TargetLink, RING_LEN};
use super::{accept, device, Answer, Challenge, Offer, ProbeSlot, PROBE_LEN};

/// The initiator's side of one hello's offer: the offer, the probe slot
/// where it answers the challenge, and the ring the link will read
/// requests from (alive until the answer is read; the ring then belongs to
/// the link).
pub(crate) struct Dial {
    offer: Offer,
    slot: ProbeSlot,
    ring: Ring,
    /// The target's nonce once the challenge was met: the link's key.
    key: Option<[u8; PROBE_LEN]>,
}

/// What an initiator's hello settled about the link.
pub(crate) struct Settled {
    /// The link, if accepted.
    pub link: Option<InitiatorLink>,
    /// Device memory moves through CUDA IPC.
    pub device_ipc: bool,
    /// Why (the path's reason).
    pub reason: String,
}

impl Settled {
    fn tcp(reason: String) -> Settled {
        Settled { link: None, device_ipc: false, reason }
    }
}

impl Dial {
    /// The offer `offer` (as [`super::offer_or_why_not`] made it, with its
    /// device flag), answered from a slot and a ring of its own; why not
    /// where the ring cannot be mapped.
    pub fn new(offer: Offer) -> Result<Dial, String> {
        let ring = Ring::new().map_err(|e| format!("this process cannot map the same-host link's ring: {e}"))?;
        Ok(Dial { offer, slot: ProbeSlot::new(), ring, key: None })
    }

    /// What the target's `answer` (`None`: it gave none) makes of the link.
    /// `export`: whether this process offered device memory through CUDA
    /// IPC (`Err`: why not; empty when it has no driver, and nothing to say).
    pub fn settle(self, answer: Option<Value>, export: Result<(), String>) -> Settled {
        let Some(answer) = answer else {
            return Settled::tcp("the peer did not answer the same-host offer (an older pdx)".to_owned());
        };
        let Ok(a) = serde_json::from_value::<Answer>(answer) else {
            return Settled::tcp("the peer's answer to the same-host offer is malformed".to_owned());
        };
        if !a.accepted {
            return Settled::tcp(a.reason);
        }
        if !a.ring {
            return Settled::tcp(
                "the peer's pdx is older: it takes same-host requests from the connection, where any process that \
                 holds this process's socket could send them; TCP until it reads them from this process's memory"
                    .to_owned(),
            );
        }
        let Some(key) = self.key else {
            return Settled::tcp("the peer accepted the same-host offer without a challenge".to_owned());
        };
        let device_ipc = a.device_ipc && export.is_ok();
        // A process without device memory has nothing to say about it.
        let device = match (export, a.device_ipc) {
            (Err(why), _) if why.is_empty() => String::new(),
            (Err(why), _) => format!("; device memory staged: {why}"),
            (Ok(()), true) => format!("; device memory: {}", device::ACCEPTED),
            (Ok(()), false) if a.device_reason.is_empty() => {
                "; device memory staged: the peer did not answer the CUDA IPC offer (an older pdx)".to_owned()
            }
            (Ok(()), false) => format!("; device memory staged: {}", a.device_reason),
        };
        Settled { link: Some(InitiatorLink::new(self.ring, key)), device_ipc, reason: format!("{}{device}", a.reason) }
    }
}

impl Offering for Dial {
    fn offer(&mut self, answer_after_proof: bool) -> Value {
        let offer = Offer {
            answer_after_proof,
            ring_addr: self.ring.addr(),
            ring_len: RING_LEN as u64,
            ..self.slot.offer(self.offer.clone())
        };
        serde_json::to_value(offer).unwrap_or_default()
    }

    fn meet(&mut self, challenge: &str) -> bool {
        self.key = self.slot.answer(challenge);
        self.key.is_some()
    }
}

/// The target's answer to `offer` (the hello's JSON) on the connection
/// between `addrs` (the initiator's, ours), and the link granted. Without
/// `challenge` the offer is declined unchecked: it came from an initiator
/// with a peer secret that does not wait for its proof (an older pdx), and
/// nothing of an offer is examined before that proof.
pub(crate) fn answer(
    enabled: bool,
    offer: &Value,
    addrs: Result<(SocketAddr, SocketAddr), String>,
    challenge: Option<Challenge<'_>>,
) -> (Value, Option<TargetLink>) {
    let (answer, link) = match (challenge, serde_json::from_value::<Offer>(offer.clone()), addrs) {
        (None, _, _) => (
            Answer::refused(
                "the peer holds a peer secret and checks a same-host offer only after the initiator's proof, which \
                 this engine's (older) pdx does not wait for"
                    .to_owned(),
            ),
            None,
        ),
        (Some(_), Err(e), _) => (Answer::refused(format!("the peer cannot read the same-host offer: {e}")), None),
        (Some(_), _, Err(e)) => {
            (Answer::refused(format!("the peer cannot read the connection's addresses: {e}")), None)
        }
        (Some(challenge), Ok(offer), Ok((from, local))) => {
            let (answer, link) = accept(enabled, &offer, from, local, challenge);
            log::debug!(
                "data connection: same-host link for pid {}: {} ({})",
                offer.host.pid,
                answer.accepted,
                answer.reason
            );
            (answer, link)
        }
    };
    (serde_json::to_value(answer).unwrap_or_default(), link)
}

#[cfg(test)]
mod tests {
    use super::super::{offer_or_why_not, HostIdentity};
    use super::*;

    fn dial() -> Dial {
        Dial::new(offer_or_why_not(true, HostIdentity::current().as_ref()).unwrap()).unwrap()
    }

    /// An initiator takes the link only from a target that reads its ring,
    /// after a challenge; anything else leaves it on TCP with the reason.
    #[test]
    fn only_an_answer_that_reads_the_ring_after_a_challenge_links() {
        let yes = |ring: bool| serde_json::json!({"accepted": true, "reason": "r", "ring": ring});
        let older = dial().settle(Some(yes(false)), Err(String::new()));
        assert!(older.link.is_none() && older.reason.contains("takes same-host requests from the connection"));
        let unchallenged = dial().settle(Some(yes(true)), Err(String::new()));
        assert!(unchallenged.link.is_none() && unchallenged.reason.contains("without a challenge"));
        let none = dial().settle(None, Err(String::new()));
        assert!(none.link.is_none() && none.reason.contains("did not answer"));
        let garbled = dial().settle(Some(serde_json::json!({"accepted": "yes"})), Err(String::new()));
        assert!(garbled.link.is_none() && garbled.reason.contains("malformed"));
        let refused = dial().settle(Some(serde_json::json!({"accepted": false, "reason": "no"})), Ok(()));
        assert!(refused.link.is_none() && refused.reason == "no");
        let mut met = dial();
        let offer = met.offer(false);
        assert_eq!(offer["ring_len"], RING_LEN as u64);
        assert!(offer["ring_addr"].as_u64().is_some_and(|a| a != 0) && offer["nonce_proof"] == true);
        assert!(!met.meet("not hex") && met.meet(&"a5".repeat(PROBE_LEN)));
        let linked = met.settle(Some(yes(true)), Ok(()));
        assert!(linked.link.is_some() && linked.reason.starts_with('r'), "{}", linked.reason);
        assert!(linked.reason.contains("device memory staged: the peer did not answer the CUDA IPC offer"));
    }

    /// Without a challenge (an initiator with a peer secret that does not
    /// wait for its proof) an offer is declined unchecked; a malformed one
    /// is declined with the reason.
    #[test]
    fn the_target_declines_what_it_does_not_check() {
        let offer = dial().offer(false);
        let addrs = || Ok(("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()));
        let (said, link) = answer(true, &offer, addrs(), None);
        assert!(link.is_none() && said["accepted"] == false, "{said}");
        assert!(said["reason"].as_str().unwrap().contains("only after the initiator's proof"));
        let (said, link) = answer(true, &serde_json::json!({"host": 1}), addrs(), Some(&mut |_| Ok(())));
        assert!(link.is_none() && said["reason"].as_str().unwrap().contains("cannot read the same-host offer"));
        let (said, link) = answer(true, &offer, Err("gone".to_owned()), Some(&mut |_| Ok(())));
        assert!(link.is_none() && said["reason"].as_str().unwrap().contains("gone"));
    }
}
