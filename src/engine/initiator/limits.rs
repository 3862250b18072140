//! Up-front limits on what one call may ask for, checked before anything
//! proportional to the request is allocated: entries per batch, bytes per
//! request (a fixed maximum and the largest region the peer advertised) and
//! pieces per batch. A request past them can only fail at the target, so
//! refusing it here costs the caller nothing and keeps a bogus length
//! (`1 << 62`) from planning billions of pieces.

use super::super::protocol::descriptor::PeerDescriptor;
use super::super::settings::Settings;
use super::plan::PIECE_BYTES;
use crate::error::{Error, Result};
use crate::transfer::Request;

/// A batch may be cut into at most this many pieces per allowed entry.
const PIECES_PER_ENTRY: usize = 4;

pub use crate::transfer::backend::check_entry_count;

/// The checks that need no peer: entry count, request length, piece count.
pub fn check_requests(settings: &Settings, reqs: &[Request]) -> Result<()> {
    check_entry_count(reqs.len(), settings.max_batch_entries)?;
    let mut pieces = 0usize;
    for (i, r) in reqs.iter().enumerate() {
        if r.len as u64 > settings.max_request_bytes {
            return Err(Error::invalid_argument(format!(
                "request {i}: {} bytes is over the limit of {} bytes (PDX_MAX_REQUEST_BYTES)",
                r.len, settings.max_request_bytes
            )));
        }
        pieces = pieces.saturating_add(r.len.div_ceil(PIECE_BYTES));
    }
    let max_pieces = settings.max_batch_entries.saturating_mul(PIECES_PER_ENTRY);
    if pieces > max_pieces {
        return Err(Error::invalid_argument(format!(
            "the batch moves {pieces} pieces of up to {PIECE_BYTES} bytes, over the limit of {max_pieces}; split it"
        )));
    }
    Ok(())
}

/// The largest region `desc` advertises, or `None` when it advertises none
/// (then the peer itself decides).
pub fn largest_advertised(desc: &PeerDescriptor) -> Option<u64> {
    desc.buffers.iter().map(|b| b.length).max()
}

/// The error for a request longer than every region of `session`.
pub fn over_peer_region_error(session: &str, len: usize, largest: u64) -> Error {
    Error::invalid_argument(format!(
        "a request of {len} bytes is longer than the largest region {session} registered ({largest} bytes)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;
    use crate::error::ErrorKind;

    #[test]
    fn huge_lengths_and_long_batches_are_invalid_arguments() {
        let s = Settings::from(&MapEnv::from_pairs(&[("PDX_MAX_BATCH_ENTRIES", "4")]));
        let r = |len| Request { local: 0x1000, remote: 0x2000, len };
        assert!(check_requests(&s, &[r(1), r(PIECE_BYTES * 3)]).is_ok());
        let huge = check_requests(&s, &[r(1 << 62)]).unwrap_err();
        assert_eq!(huge.kind(), ErrorKind::InvalidArgument);
        assert!(huge.message().contains("PDX_MAX_REQUEST_BYTES"), "{huge}");
        assert_eq!(check_requests(&s, &[r(1); 5]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        // 4 entries x 5 pieces each is over 4 x 4 pieces.
        assert_eq!(check_requests(&s, &[r(PIECE_BYTES * 5); 4]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert!(check_entry_count(4, 4).is_ok() && check_entry_count(5, 4).is_err());
    }
}
