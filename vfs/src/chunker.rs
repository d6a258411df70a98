//! Content-defined chunking: where file content is cut into blocks.
//!
//! Cut points come from FastCDC (the 2020 variant, normalization level 1): they depend
//! on the bytes near them, not on offsets, so inserting bytes at the head of a file moves
//! the cut points with the content and every later block keeps its hash. Fixed-size
//! blocks would change every block after the insertion. docs/STORAGE.md gives the
//! measurements behind the sizes.

use fastcdc::v2020;

/// Sizes for the chunker. All workspaces that exchange blocks must use the same ones,
/// so they are recorded in the database when it is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    pub min: usize,
    pub avg: usize,
    pub max: usize,
}

impl ChunkSizes {
    /// The default: 16 KiB minimum, 64 KiB average, 256 KiB maximum.
    pub const DEFAULT: ChunkSizes = ChunkSizes {
        min: 16 << 10,
        avg: 64 << 10,
        max: 256 << 10,
    };

    /// Whether FastCDC accepts these sizes.
    pub fn is_valid(&self) -> bool {
        let even =
            self.min.is_multiple_of(2) && self.avg.is_multiple_of(2) && self.max.is_multiple_of(2);
        even && (v2020::MINIMUM_MIN..=v2020::MINIMUM_MAX).contains(&self.min)
            && (v2020::AVERAGE_MIN..=v2020::AVERAGE_MAX).contains(&self.avg)
            && (v2020::MAXIMUM_MIN..=v2020::MAXIMUM_MAX).contains(&self.max)
            && self.min < self.avg
            && self.avg < self.max
    }
}

/// Finds cut points with fixed sizes.
#[derive(Clone, Debug)]
pub struct Chunker {
    sizes: ChunkSizes,
    mask_s: u64,
    mask_l: u64,
}

impl Chunker {
    pub fn new(sizes: ChunkSizes) -> Chunker {
        assert!(sizes.is_valid(), "invalid chunk sizes {sizes:?}");
        let (mask_s, mask_l) = v2020::select_masks(sizes.avg, v2020::Normalization::Level1);
        Chunker {
            sizes,
            mask_s,
            mask_l,
        }
    }

    pub fn sizes(&self) -> ChunkSizes {
        self.sizes
    }

    /// The length of the chunk that starts at `window[0]`, or `None` if the window is too
    /// short to decide: a cut needs `max` bytes of lookahead unless the data ends with the
    /// window (`at_end`).
    pub fn next_cut(&self, window: &[u8], at_end: bool) -> Option<usize> {
        if window.is_empty() {
            return None;
        }
        if window.len() < self.sizes.max && !at_end {
            return None;
        }
        let (_, length) = v2020::cut(
            window,
            self.sizes.min,
            self.sizes.avg,
            self.sizes.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        debug_assert!(length > 0 && length <= self.sizes.max.min(window.len()));
        Some(length)
    }

    /// Cuts a whole buffer (a convenience for tests and tools).
    pub fn chunks<'a>(&self, data: &'a [u8]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut rest = data;
        while let Some(length) = self.next_cut(rest, true) {
            let (chunk, tail) = rest.split_at(length);
            out.push(chunk);
            rest = tail;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn chunks_cover_input_within_bounds() {
        let chunker = Chunker::new(ChunkSizes::DEFAULT);
        let data = pseudo_random(3 << 20, 42);
        let chunks = chunker.chunks(&data);
        assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), data.len());
        for chunk in &chunks[..chunks.len() - 1] {
            assert!(
                chunk.len() >= ChunkSizes::DEFAULT.min && chunk.len() <= ChunkSizes::DEFAULT.max
            );
        }
        // The average is in the right range for random data.
        let avg = data.len() / chunks.len();
        assert!((32 << 10..=128 << 10).contains(&avg), "average chunk {avg}");
    }

    #[test]
    fn head_insertion_keeps_later_chunks() {
        let chunker = Chunker::new(ChunkSizes::DEFAULT);
        let data = pseudo_random(4 << 20, 7);
        let mut shifted =
            b"100 bytes of new header text, inserted at the very start of the file....".to_vec();
        shifted.extend_from_slice(&data);
        let before: std::collections::HashSet<&[u8]> = chunker.chunks(&data).into_iter().collect();
        let after = chunker.chunks(&shifted);
        let new = after.iter().filter(|c| !before.contains(*c)).count();
        assert!(new <= 2, "{new} of {} chunks changed", after.len());
    }

    #[test]
    fn short_window_waits_for_more_data() {
        let chunker = Chunker::new(ChunkSizes::DEFAULT);
        let data = pseudo_random(1000, 1);
        assert_eq!(chunker.next_cut(&data, false), None);
        assert_eq!(chunker.next_cut(&data, true), Some(1000));
        assert_eq!(chunker.next_cut(&[], true), None);
    }
}
