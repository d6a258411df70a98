//! Whole-workload file system benchmark: the same shell workloads on several targets
//! (tmpfs, ext4, pre-mounted directories, a `computerd` FUSE mount), interleaved in one
//! run so that a noisy machine affects every target alike.

pub mod exec;
pub mod fixtures;
pub mod report;
pub mod scenario;
pub mod stats;
pub mod target;
