//! Benchmark support.
//!
//! [`fsbench`] holds the pieces of the whole-workload harness (`src/bin/fsbench.rs`) that
//! compares a FUSE mount against ext4 and tmpfs in the same run. [`syncbench`] measures
//! the bytes on the wire and the time of syncing a replica over the real RPC transport
//! (`src/bin/syncbench.rs`).

pub mod fsbench;
pub mod syncbench;
