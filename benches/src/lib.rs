//! Benchmark support.
//!
//! [`fsbench`] holds the pieces of the whole-workload harness (`src/bin/fsbench.rs`) that
//! compares a FUSE mount against ext4 and tmpfs in the same run.

pub mod fsbench;
