//! The backend-neutral transfer layer: the vocabulary every transfer backend
//! and the C ABI share, so that no backend imports another and the ABI maps
//! one set of types whatever runs underneath.
//!
//! - [`request`]: what a transfer asks for ([`Request`], [`Direction`]).
//! - [`state`]: task and batch states and their summaries, with the
//!   messages every backend reports.
//! - [`regions`]: registered-memory bookkeeping and the overlap check.
//! - [`location`]: where a region lives (`cpu:N`, `cuda:N`, `*`).
//! - [`host`]: engine hostnames and peer session names.
//! - [`backend`]: the [`TransferBackend`] trait the ABI drives.
//! - [`kv`]: KV-cache page plans (runs, head slices) turned into requests.
//! - [`kv_stream`]: layer-wise submits of a plan and their deferred notification.
//! - [`notification`]: a notification's name and message, as bytes.
//! - [`stats`], [`peer_stats`], [`metrics`]: counters, per-peer figures and
//!   their Prometheus exposition; [`counter_index`]: the slots of their
//!   per-direction and per-failure-kind arrays.

pub mod backend;
pub mod counter_index;
pub mod host;
pub mod kv;
pub mod kv_stream;
pub mod location;
pub mod metrics;
pub mod notification;
pub mod peer_stats;
pub mod regions;
pub mod request;
pub mod state;
pub mod stats;

pub use backend::TransferBackend;
pub use notification::Notification;
pub use request::{Direction, Request};
pub use state::{BatchSummary, TaskState, TaskSummary};
