//! Helpers shared by the store's integration tests.

/// Set to 1 to let the tests that need root skip (each says so) where they run without
/// it. Unset, such a test fails instead: a suite that should run as root (CI does) must
/// not pass without checking anything.
pub const WITHOUT_ROOT_ENV: &str = "COMPUTER_TESTS_WITHOUT_ROOT";

/// Whether the test `what` (which needs root for `why`) runs: true as root; without
/// root it panics, or with [`WITHOUT_ROOT_ENV`] set says it is skipped and returns false.
#[allow(dead_code)] // Not every test binary that shares this module needs root.
pub fn has_root(what: &str, why: &str) -> bool {
    // SAFETY: no arguments, no memory.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os(WITHOUT_ROOT_ENV).is_some_and(|v| v == "1") {
        eprintln!("{what}: skipped: needs root ({why})");
        return false;
    }
    panic!("{what} needs root ({why}): run as root, or set {WITHOUT_ROOT_ENV}=1 to skip it");
}

/// `n` bytes no block store can shrink or share (xorshift64), different for each
/// `seed`: the one source of random content for these tests.
#[allow(dead_code)] // Not every test binary that shares this module writes content.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(n);
    out
}
