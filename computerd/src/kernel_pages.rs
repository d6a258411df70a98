//! What the kernel's page cache holds of each file, as far as the daemon can tell, and
//! the per-file lock that orders filling that cache against every change to the file.
//!
//! A cached open may come with the file's whole content (FUSE_NOTIFY_STORE) when the
//! file is small and nothing else has it open: the reads that follow find their pages
//! and send no READ. Besides the round trip this saves, a READ the daemon serves makes
//! the kernel treat the file's attributes as stale (it expects the access time to
//! have moved), so that the next `stat` of the file asks the daemon again: the second
//! `grep -r` over a tree paid a GETATTR per file for the first one's READs.
//!
//! Storing pages is the one thing the daemon does to the page cache that the kernel
//! does not order by itself, so what could race with it takes the file's stripe of
//! [`KernelPages::lock`]: every OPEN holds it until its reply (a second open cannot
//! read or write the pages until the store is done), a SETATTR that changes the size
//! too (the kernel cuts its pages after the reply), and an invalidation on behalf of
//! another route waits for it before telling the kernel ([`KernelPages::await_fills`]:
//! a store of content read before the change must not outlive the invalidation).
//!
//! Telling the kernel either thing can wait for pages in flight. The store waits for
//! the lock of each page it fills, and a page stays locked while a READ or WRITE of it
//! is in flight, which may sit in the very queue whose thread is storing: so only a
//! file no other handle has open is filled, and no read, fault or write of it can be
//! in flight. An invalidation waits for the same page locks, so it is sent without
//! holding the file's lock, which a queue thread may be waiting for.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Independent locks; files share one when their inode numbers agree modulo this.
const LOCK_STRIPES: usize = 64;

/// What is known of each file's pages takes two bits, in chunks of this many files by
/// inode number (64 bytes a chunk, held in the map's slot). The store numbers inodes
/// from a counter, so the files a workload creates or reads fill chunks densely: a
/// million take 3,907 chunks, under 1 MiB with the map's spare slots, where a map entry
/// per file took 34 MiB. Files touched 256 or more apart cost a slot of 73 bytes each
/// against the entry's 17.
const FILES_PER_CHUNK: u64 = 256;
const BITS_PER_FILE: u64 = 2;
const FILES_PER_WORD: u64 = u64::BITS as u64 / BITS_PER_FILE;
const WORDS_PER_CHUNK: usize = (FILES_PER_CHUNK / FILES_PER_WORD) as usize;
/// One file's bits, at the bottom of a word.
const STATE_MASK: u64 = (1 << BITS_PER_FILE) - 1;

/// The largest file whose content comes with its open: about what the kernel's first
/// read-ahead of a file asks for anyway (128 KiB), so that a reader of the start of a
/// large file does not pay for the rest of it.
pub const FILL_BYTES_MAX: u64 = 128 * 1024;

/// What the daemon knows of one file's pages in the kernel. A file it has no entry for
/// may have pages, all current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Created through this mount and never opened through the page cache since: the
    /// kernel has no page of it, so its passthrough opens leave nothing stale behind.
    Never,
    /// Its whole current content was stored at an open.
    Whole,
    /// Opened through passthrough after a cached open: pages cached before may be
    /// stale, and the next cached open drops them.
    Stale,
}

impl Held {
    /// Two bits, 0 for a file the daemon knows nothing of.
    const fn code(held: Option<Held>) -> u64 {
        match held {
            None => 0,
            Some(Held::Never) => 1,
            Some(Held::Whole) => 2,
            Some(Held::Stale) => 3,
        }
    }

    fn from_code(code: u64) -> Option<Held> {
        match code {
            0 => None,
            1 => Some(Held::Never),
            2 => Some(Held::Whole),
            3 => Some(Held::Stale),
            _ => unreachable!("a state is a file's two bits"),
        }
    }
}

// A chunk is whole words, and the largest state fits in a file's bits.
const _: () = assert!(
    FILES_PER_CHUNK.is_multiple_of(FILES_PER_WORD) && Held::code(Some(Held::Stale)) <= STATE_MASK
);

/// [`Held`] by inode number, two bits a file in chunks of [`FILES_PER_CHUNK`]; a chunk
/// that holds nothing any more is let go.
#[derive(Default)]
struct HeldMap {
    chunks: HashMap<u64, [u64; WORDS_PER_CHUNK]>,
}

impl HeldMap {
    /// The chunk, the word within it, and the shift within the word of `ino`'s bits.
    fn place(ino: u64) -> (u64, usize, u64) {
        let chunk = ino / FILES_PER_CHUNK;
        let within = ino % FILES_PER_CHUNK;
        let word = (within / FILES_PER_WORD) as usize;
        (chunk, word, (within % FILES_PER_WORD) * BITS_PER_FILE)
    }

    fn get(&self, ino: u64) -> Option<Held> {
        let (chunk, word, shift) = Self::place(ino);
        let words = self.chunks.get(&chunk)?;
        Held::from_code((words[word] >> shift) & STATE_MASK)
    }

    fn set(&mut self, ino: u64, held: Option<Held>) {
        let (chunk, word, shift) = Self::place(ino);
        let code = Held::code(held);
        if code == 0 && !self.chunks.contains_key(&chunk) {
            return;
        }
        let words = self.chunks.entry(chunk).or_insert([0; WORDS_PER_CHUNK]);
        words[word] = (words[word] & !(STATE_MASK << shift)) | (code << shift);
        if code == 0 && words.iter().all(|&bits| bits == 0) {
            self.chunks.remove(&chunk);
        }
    }
}

/// How a cached open treats the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedOpen {
    /// Tell the kernel to keep the pages it has (`FOPEN_KEEP_CACHE`).
    pub keep: bool,
    /// The whole content may be stored with the open (if small and not open elsewhere).
    pub fill: bool,
}

impl CachedOpen {
    const KEEP_AND_FILL: CachedOpen = CachedOpen {
        keep: true,
        fill: true,
    };
    const KEEP: CachedOpen = CachedOpen {
        keep: true,
        fill: false,
    };
    const DROP: CachedOpen = CachedOpen {
        keep: false,
        fill: false,
    };
}

pub struct KernelPages {
    stripes: Vec<Mutex<()>>,
    files: Mutex<HeldMap>,
}

impl Default for KernelPages {
    fn default() -> KernelPages {
        KernelPages {
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            files: Mutex::default(),
        }
    }
}

impl KernelPages {
    /// The lock that orders storing `ino`'s pages against opens and changes of it.
    pub fn lock(&self, ino: u64) -> MutexGuard<'_, ()> {
        let stripe = &self.stripes[(ino % LOCK_STRIPES as u64) as usize];
        stripe.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn files(&self) -> MutexGuard<'_, HeldMap> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no open of `ino` that began before is still in flight: one may be
    /// filling the kernel's pages with content it read before a change that just
    /// committed, and the kernel must be told to forget its pages after that. Returns
    /// at once without holding the lock: dropping the pages waits for reads of them in
    /// flight, which a thread waiting for the lock may be the one to serve.
    pub fn await_fills(&self, ino: u64) {
        drop(self.lock(ino));
    }

    /// `ino` was just created: the kernel holds no page of it.
    pub fn created(&self, ino: u64) {
        self.files().set(ino, Some(Held::Never));
    }

    /// `ino` is opened through passthrough: pages cached before may go stale.
    pub fn passthrough_open(&self, ino: u64) {
        let mut files = self.files();
        if files.get(ino) != Some(Held::Never) {
            files.set(ino, Some(Held::Stale));
        }
    }

    /// `ino` is opened through the page cache: whether its pages may be kept, and
    /// whether its content may come with the open.
    pub fn cached_open(&self, ino: u64) -> CachedOpen {
        let mut files = self.files();
        match files.get(ino) {
            Some(Held::Stale) => {
                files.set(ino, None);
                CachedOpen::DROP
            }
            Some(Held::Whole) => CachedOpen::KEEP,
            Some(Held::Never) => {
                files.set(ino, None);
                CachedOpen::KEEP_AND_FILL
            }
            None => CachedOpen::KEEP_AND_FILL,
        }
    }

    /// `ino`'s whole content was stored in the kernel.
    pub fn filled(&self, ino: u64) {
        self.files().set(ino, Some(Held::Whole));
    }

    /// `ino`'s content or size changed other than through a write the kernel made
    /// itself, or the kernel was told to drop its pages, or forgot the inode: the next
    /// open stores the content again. A stale mark stays until a cached open drops the
    /// pages (an inode the kernel forgot may be back by the time it says so).
    pub fn changed(&self, ino: u64) {
        let mut files = self.files();
        if files.get(ino) != Some(Held::Stale) {
            files.set(ino, None);
        }
    }

    #[cfg(test)]
    fn held(&self, ino: u64) -> Option<Held> {
        self.files().get(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP_AND_FILL: CachedOpen = CachedOpen::KEEP_AND_FILL;

    #[test]
    fn a_file_is_filled_once_until_it_changes() {
        let pages = KernelPages::default();
        assert_eq!(pages.cached_open(7), KEEP_AND_FILL);
        pages.filled(7);
        assert_eq!(pages.cached_open(7), CachedOpen::KEEP);
        pages.changed(7);
        assert_eq!(pages.cached_open(7), KEEP_AND_FILL);
    }

    #[test]
    fn passthrough_after_a_cached_open_drops_the_pages_at_the_next() {
        let pages = KernelPages::default();
        pages.cached_open(7);
        pages.filled(7);
        pages.passthrough_open(7);
        assert_eq!(pages.cached_open(7), CachedOpen::DROP);
        assert_eq!(pages.cached_open(7), KEEP_AND_FILL);
    }

    #[test]
    fn a_file_created_here_and_written_through_passthrough_keeps_its_empty_cache() {
        let pages = KernelPages::default();
        pages.created(7);
        pages.passthrough_open(7);
        assert_eq!(pages.held(7), Some(Held::Never));
        assert_eq!(pages.cached_open(7), KEEP_AND_FILL);
        // Cached once: from now on a passthrough open may leave stale pages.
        pages.passthrough_open(7);
        assert_eq!(pages.held(7), Some(Held::Stale));
    }

    #[test]
    fn a_stale_mark_outlives_a_change_and_a_forget() {
        let pages = KernelPages::default();
        pages.passthrough_open(7);
        pages.changed(7);
        assert_eq!(pages.held(7), Some(Held::Stale));
    }

    fn any_state() -> impl proptest::strategy::Strategy<Value = Option<Held>> {
        proptest::sample::select(vec![
            None,
            Some(Held::Never),
            Some(Held::Whole),
            Some(Held::Stale),
        ])
    }

    proptest::proptest! {
        /// The two-bit map answers as a map of each file to its state would, across
        /// word and chunk edges and at the ends of the inode numbers, and lets go of
        /// every chunk once it holds nothing.
        #[test]
        fn the_map_keeps_each_files_state_as_a_hash_map_would(
            sets in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        0u64..3 * FILES_PER_CHUNK,
                        u64::MAX - FILES_PER_CHUNK..=u64::MAX,
                    ],
                    any_state(),
                ),
                0..400,
            ),
        ) {
            let mut map = HeldMap::default();
            let mut model = HashMap::new();
            for &(ino, held) in &sets {
                map.set(ino, held);
                match held {
                    Some(held) => model.insert(ino, held),
                    None => model.remove(&ino),
                };
                proptest::prop_assert_eq!(map.get(ino), held);
            }
            for &(ino, _) in &sets {
                proptest::prop_assert_eq!(map.get(ino), model.get(&ino).copied());
            }
            for &(ino, _) in &sets {
                map.set(ino, None);
            }
            proptest::prop_assert!(map.chunks.is_empty());
        }
    }

    #[test]
    fn a_million_files_created_and_filled_take_a_chunk_per_256() {
        let pages = KernelPages::default();
        let (first, last) = (1_000, 1_000_999);
        for ino in first..=last {
            pages.created(ino);
            assert_eq!(pages.cached_open(ino), KEEP_AND_FILL);
            pages.filled(ino);
        }
        let chunks_spanned = last / FILES_PER_CHUNK - first / FILES_PER_CHUNK + 1;
        assert_eq!(pages.files().chunks.len() as u64, chunks_spanned);
        assert_eq!(pages.held(500_000), Some(Held::Whole));
    }

    #[test]
    fn files_share_a_lock_only_modulo_the_stripes() {
        let pages = KernelPages::default();
        let _seven = pages.lock(7);
        drop(pages.lock(8));
        assert!(pages.stripes[7].try_lock().is_err());
    }
}
