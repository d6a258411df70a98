//! Where the simulation's decisions come from: a seeded generator (the CI sweep) or the
//! fuzzer's input bytes (`fuzz/fuzz_targets/sync_recovery.rs`). Both answer the same
//! question, "a number below n", so one simulation serves both, and a run is a pure
//! function of its seed or its bytes.
//!
//! The answer 0 is always the uneventful one (no fault, the first kind of step): input
//! that runs dry reads as zeros, so the tail of a fuzz input cannot inject anything.

/// A source of decisions.
pub trait Choices {
    /// A number in `0..n`; `n` must be at least 1.
    fn below(&mut self, n: u64) -> u64;
    /// Whether the source has run dry (fuzz input consumed): the run then stops making
    /// new steps and settles.
    fn exhausted(&self) -> bool;
}

impl dyn Choices + '_ {
    /// True `percent` times in a hundred; false when the answer is 0.
    pub fn chance(&mut self, percent: u64) -> bool {
        debug_assert!(percent <= 100);
        self.below(100) + percent >= 100
    }

    /// An index into `weights`, each chosen in proportion to its weight. Index 0 is the
    /// answer for 0, so put the uneventful choice first.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        assert!(total > 0, "weights must not all be zero");
        let mut pick = self.below(total);
        for (index, &weight) in weights.iter().enumerate() {
            if pick < weight {
                return index;
            }
            pick -= weight;
        }
        unreachable!("pick below the total falls in some weight")
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        low + self.below(high - low + 1)
    }
}

/// SplitMix64 from a seed: tiny, fast, and the same on every platform and release (a
/// library generator could change its stream between versions and break replays).
#[derive(Clone, Debug)]
pub struct SeedChoices {
    state: u64,
}

impl SeedChoices {
    pub fn new(seed: u64) -> SeedChoices {
        SeedChoices { state: seed }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Choices for SeedChoices {
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // The modulo bias is irrelevant to a simulation; determinism is what matters.
        self.next() % n
    }

    fn exhausted(&self) -> bool {
        false
    }
}

/// Decisions read from bytes: one byte for a choice among at most 256, two for at most
/// 65536, four beyond. Small choices cost one byte, so the fuzzer's mutations map to
/// small changes of the run.
#[derive(Clone, Debug)]
pub struct ByteChoices {
    bytes: Vec<u8>,
    at: usize,
}

impl ByteChoices {
    pub fn new(bytes: &[u8]) -> ByteChoices {
        ByteChoices {
            bytes: bytes.to_vec(),
            at: 0,
        }
    }

    fn take(&mut self, n: usize) -> u64 {
        let mut value = 0u64;
        for _ in 0..n {
            let byte = self.bytes.get(self.at).copied().unwrap_or(0);
            self.at = (self.at + 1).min(self.bytes.len());
            value = (value << 8) | u64::from(byte);
        }
        value
    }
}

impl Choices for ByteChoices {
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let width = match n {
            0..=256 => 1,
            257..=65536 => 2,
            _ => 4,
        };
        self.take(width) % n
    }

    fn exhausted(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

/// A xorshift stream for file content: the bytes of a big file come from one choice (its
/// seed), not from one choice per byte.
pub fn content_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_replay_and_differ() {
        let draw = |seed| {
            let mut c = SeedChoices::new(seed);
            (0..8).map(|_| c.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn bytes_run_dry_into_zeros() {
        let mut c = ByteChoices::new(&[5, 1, 2]);
        assert_eq!(c.below(10), 5);
        assert!(!c.exhausted());
        assert_eq!(c.below(1000), 258);
        assert!(c.exhausted());
        assert_eq!(c.below(10), 0);
        let source: &mut dyn Choices = &mut c;
        assert!(!source.chance(99), "a dry source must not inject a fault");
        assert_eq!(source.weighted(&[3, 5]), 0);
    }
}
