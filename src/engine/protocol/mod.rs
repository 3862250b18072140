//! What travels on the wire: the codecs of Mooncake's TCP transport
//! ([`wire`]), the segment descriptor an engine advertises and reads
//! ([`descriptor`]), a notification's body with its bytes ([`notify`]),
//! pdx's own additions: the opening of a data connection
//! ([`hello`]) and peer authentication ([`auth`]).
//!
//! May use: [`net`](super::net) (a hello is exchanged on a connection, by a
//! deadline; a descriptor names rails) and [`samehost`](super::samehost)
//! (what a hello offers and a descriptor says about the host). Neither the
//! initiator nor the server: both speak it.

pub(super) mod auth;
// Public only for the fuzz targets (feature `fuzzing`, re-exported by the engine).
#[cfg(feature = "fuzzing")]
pub mod descriptor;
#[cfg(not(feature = "fuzzing"))]
pub(super) mod descriptor;
pub(super) mod hello;
#[cfg(feature = "fuzzing")]
pub mod notify;
#[cfg(not(feature = "fuzzing"))]
pub(super) mod notify;
#[cfg(feature = "fuzzing")]
pub mod wire;
#[cfg(not(feature = "fuzzing"))]
pub(super) mod wire;

pub(super) use descriptor::Identity;
pub(super) use hello::new_instance;
pub(super) use wire::FrameType;
