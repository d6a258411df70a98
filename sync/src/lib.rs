//! `computer-sync`: the replication protocol between an authoritative workspace and its
//! replicas and clients, over Cap'n Proto RPC.
//!
//! The schema is `schema/sync.capnp`; the Rust code generated from it is committed in
//! `src/generated/` (plain builds never need the `capnp` compiler; `scripts/check-capnp.sh`
//! checks that it is fresh, `sync/README.md` tells how to regenerate it).
//!
//! [`wire`] is the only module that touches Cap'n Proto types: it converts between the
//! schema's structs and the domain types ([`computer_vfs::ChangeEntry`] and friends,
//! [`computer_vfs::Conflict`], and [`ClientInfo`] and [`ServerInfo`] here), and checks
//! every bound of the protocol when it decodes, so a hostile peer gets an [`Error`], never
//! a panic or an unbounded allocation.

pub mod authority;
mod error;
pub mod files;
pub mod follow;
pub mod replica;
pub mod retry;
pub mod rpc;
pub mod sim;
mod types;
pub mod wire;

// The code generated from schema/sync.capnp (see sync/README.md). Not formatted, not
// linted: it is regenerated, never edited.
#[rustfmt::skip]
#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    unused_imports,
    unused_parens,
    unreachable_pub,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
#[path = "generated/sync_capnp.rs"]
pub(crate) mod sync_capnp;

/// The exec part of the schema (`Session.runner`): a server's runner is implemented
/// above this crate (computerd, over the runtimes crate); sync only hands it out.
pub mod exec_capnp {
    pub use crate::sync_capnp::{
        audit_item, backend_info, env_var, exec, exec_event, exec_outcome, exec_request, runner,
    };
}

pub use authority::{Authority, PeerSession};
pub use error::{Error, Result};
pub use follow::{
    BacklogLimits, FollowOptions, FollowStatus, Follower, Intent, SyncClient, SyncOutcome,
};
pub use replica::{AppliedObserver, BatchLimits, Replica, SyncReport, Upstream, UPSTREAM};
pub use retry::{Backoff, Next, RetryPolicy};
pub use rpc::{Address, RemoteUpstream};
pub use types::{Bounded, ClientInfo, DirItem, DirPage, NodeInfo, ServerInfo, WorkspaceStats};
pub use wire::{Frame, Wire, PROTOCOL_VERSION};
