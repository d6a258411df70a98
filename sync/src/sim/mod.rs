//! A deterministic simulation of sync: one authoritative workspace and two or three
//! replicas in one process, on real databases in a temporary directory, with faults at
//! every step. It is the proof that sync recovers: the CI sweep (`tests/sim.rs`) runs it
//! over thousands of seeds, and the `sync_recovery` fuzz target drives it from the
//! fuzzer's bytes.
//!
//! Each step, chosen by the run's [`Choices`], is one of:
//! - a file operation on one side (the server or a replica), over a few paths so that
//!   both sides often change the same one (write, append, edit a range, `mkdir -p`,
//!   `rm -rf`, rename, symlink, chmod; files of up to a few hundred KiB so that blocks
//!   are shared, probed and sent in several calls), or an append-only *log write* (a
//!   file of unique content at a path nothing else touches, whose loss the run detects);
//! - a few polls (one to four) of a replica's sync: syncs run as futures polled by hand
//!   through a faulty network (`net.rs`: lost requests and answers, duplicates, requests
//!   delivered late after newer ones; every call yields twice, request and answer), so
//!   syncs of different replicas, file operations and crashes interleave at call
//!   granularity;
//! - a late delivery of a held-back request, or time passing (a virtual clock: retry
//!   delays and the server's loose-block expiry read it, never the wall clock);
//! - a crash and restart of the server (its database reopened; every session of the
//!   old process dies), of a replica (its database reopened, its sync abandoned
//!   mid-call), or the loss of a replica's disk (its database deleted; it comes back as
//!   a new replica under the same peer name).
//!
//! A replica with something to push (or whose last sync failed) has a *pending sync*,
//! retried with [`crate::Backoff`] in virtual time (a sync that moved either cursor
//! before failing counts as progress and starts the count over); every pending sync
//! ends applied, reported lost (the disk went with it) or reported failed (the attempts
//! ran out; a later change or round opens a new one), never silently. A restart of the
//! replica does not end it: the restarted process finds the same changes unpushed.
//!
//! What must hold (`audit.rs`): after every step, cursors on both sides never move
//! backwards and never claim more than the other side did; regularly and after every
//! crash, every database passes [`computer_vfs::Workspace::check`] (block reference
//! counts match the trees); after every successful sync, the replica's log writes from
//! before it are on the server and the server's known ones are on the replica; at the
//! end, with faults off, every replica syncs until a whole round moves nothing (in a
//! bounded number of rounds), then all trees are identical (every path's replicated
//! state: kind, content, mode, times, link target), every acknowledged log
//! write is there (those of a lost disk only if they had reached the server), nothing
//! waits to be pushed, and every pending sync has ended.
//!
//! Deterministic by construction: one thread, decisions only from the choices, ordered
//! maps only, a manual clock for every timestamp. A failure names its seed (or input),
//! the step, and the step log; the same seed replays it exactly.

mod audit;
mod choices;
mod net;
mod ops;
mod replicas;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use computer_vfs::clock::ManualClock;
use computer_vfs::{ChunkSizes, Options, PeerState, Workspace};

pub use choices::{ByteChoices, Choices, SeedChoices};
pub use net::NetStats;

use crate::{Authority, BatchLimits};
use net::{Shared, World};
use replicas::{Record, Slot};

/// Steps of a seeded run (the fuzzer's runs end when their input does, or here).
pub const STEPS_DEFAULT: u64 = 250;
/// Whole rounds of syncs (every replica once) allowed for the sides to settle.
const SETTLE_ROUNDS_MAX: usize = 8;
/// Polls one sync may take once faults are off; a sync needing more is stuck.
const POLLS_PER_SYNC_MAX: usize = 100_000;
/// A full check of every database every this many steps (and after every crash).
const CHECK_EVERY_STEPS: u64 = 40;
/// Small chunks, so that files of a few hundred KiB have dozens of blocks.
const CHUNK_SIZES: ChunkSizes = ChunkSizes {
    min: 2 << 10,
    avg: 8 << 10,
    max: 32 << 10,
};
/// The manual clock starts here (2023-11-14), so timestamps look like real ones.
const EPOCH_NS: i64 = 1_700_000_000_000_000_000;

/// A failed check: what broke, in a sentence.
type Check = std::result::Result<(), String>;

/// Fails the check with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(format!($($message)+));
        }
    };
}
pub(crate) use ensure;

/// What a run was started from: what replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Seed(u64),
    Bytes(Vec<u8>),
}

/// A run that broke an invariant (or hit an error it should not have).
#[derive(Clone, Debug)]
pub struct Failure {
    pub origin: Origin,
    /// The step at which it was detected (steps past the last one are the settling).
    pub step: u64,
    pub message: String,
    /// Every step and network fault of the run, in order.
    pub log: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.origin {
            Origin::Seed(seed) => {
                writeln!(f, "sync simulation failed: seed {seed}, step {}", self.step)?;
                writeln!(f, "  {}", self.message)?;
                writeln!(
                    f,
                    "replay: SIM_SEED={seed} cargo test --release -p computer-sync --test sim \
                     replay_seed -- --nocapture"
                )?;
            }
            Origin::Bytes(bytes) => {
                writeln!(f, "sync simulation failed: fuzz input, step {}", self.step)?;
                writeln!(f, "  {}", self.message)?;
                writeln!(
                    f,
                    "replay: replay_bytes(\"{}\") in sync/tests/sim.rs \
                     (computer_sync::sim::run_bytes of sim::from_hex of it)",
                    hex(bytes)
                )?;
            }
        }
        writeln!(f, "step log:")?;
        for line in &self.log {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// Lowercase hex of `bytes` (how a fuzz input is printed for a regression test).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of `text`, hex as [`hex`] prints it (whitespace ignored, so a long input
/// can be split over lines).
pub fn from_hex(text: &str) -> std::result::Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits: {}", digits.len()));
    }
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).map_err(|_| "not hex".to_owned())?;
            u8::from_str_radix(pair, 16).map_err(|_| format!("not hex: {pair:?}"))
        })
        .collect()
}

/// What a run did, for the sweep's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub steps: u64,
    pub replicas: usize,
    pub local_ops: u64,
    pub log_writes: u64,
    pub syncs_ok: u64,
    pub syncs_failed: u64,
    pub conflicts: u64,
    pub server_restarts: u64,
    pub replica_restarts: u64,
    pub disk_losses: u64,
    pub pending_applied: u64,
    pub pending_lost: u64,
    pub pending_gave_up: u64,
    pub settle_rounds: u64,
    pub net: NetStats,
}

impl Summary {
    /// Adds another run's counts to these.
    pub fn add(&mut self, other: &Summary) {
        self.steps += other.steps;
        self.replicas += other.replicas;
        self.local_ops += other.local_ops;
        self.log_writes += other.log_writes;
        self.syncs_ok += other.syncs_ok;
        self.syncs_failed += other.syncs_failed;
        self.conflicts += other.conflicts;
        self.server_restarts += other.server_restarts;
        self.replica_restarts += other.replica_restarts;
        self.disk_losses += other.disk_losses;
        self.pending_applied += other.pending_applied;
        self.pending_lost += other.pending_lost;
        self.pending_gave_up += other.pending_gave_up;
        self.settle_rounds += other.settle_rounds;
        let (a, b) = (&mut self.net, &other.net);
        a.calls += b.calls;
        a.dropped_requests += b.dropped_requests;
        a.dropped_answers += b.dropped_answers;
        a.duplicated += b.duplicated;
        a.delayed += b.delayed;
        a.delivered_late += b.delivered_late;
    }
}

/// Runs the simulation for `steps` steps from `seed`.
pub fn run_seed(seed: u64, steps: u64) -> Result<Summary, Failure> {
    run(Box::new(SeedChoices::new(seed)), Origin::Seed(seed), steps)
}

/// Runs the simulation from fuzz input: steps until the bytes run out (at most
/// [`STEPS_DEFAULT`]).
pub fn run_bytes(bytes: &[u8]) -> Result<Summary, Failure> {
    run(
        Box::new(ByteChoices::new(bytes)),
        Origin::Bytes(bytes.to_vec()),
        STEPS_DEFAULT,
    )
}

/// Runs the simulation from any source of choices.
pub fn run(choices: Box<dyn Choices>, origin: Origin, steps: u64) -> Result<Summary, Failure> {
    let world: Shared = Rc::new(RefCell::new(World::new(choices)));
    let fail = |step: u64, message: String| Failure {
        origin: origin.clone(),
        step,
        message,
        log: std::mem::take(&mut world.borrow_mut().log),
    };
    let mut sim = match Sim::new(world.clone()) {
        Ok(sim) => sim,
        Err(message) => return Err(fail(0, message)),
    };
    match sim.run(steps) {
        Ok(()) => {
            sim.summary.net = world.borrow().stats.clone();
            Ok(sim.summary.clone())
        }
        Err(message) => {
            let step = sim.step;
            // The databases close before the log is taken: nothing outlives the run.
            drop(sim);
            Err(fail(step, message))
        }
    }
}

/// One side's workspace, as a step names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Server,
    Replica(usize),
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Side::Server => f.write_str("server"),
            Side::Replica(i) => write!(f, "r{i}"),
        }
    }
}

/// A write to `/log/<writer>/<n>`: unique content at a path no other operation touches,
/// so whether it survived can be told exactly.
#[derive(Clone, Debug)]
struct LogWrite {
    side: Side,
    /// The replica's database generation it was made in (0 for the server).
    generation: u32,
    /// The side's local-operation count once it was made.
    ops_at: u64,
    path: String,
    content: Vec<u8>,
    /// Known to be on the server (always, for the server's own).
    on_server: bool,
    /// Made on a replica whose disk was lost before it reached the server.
    lost: bool,
}

/// The simulation's state. Replicas are in `slots`; the server lives in the world (its
/// sessions must die with it).
struct Sim {
    clock: Arc<ManualClock>,
    world: Shared,
    slots: Vec<Slot>,
    /// Virtual time since the start.
    now: Duration,
    step: u64,
    /// Every pending sync ever opened, in order.
    ledger: Vec<Record>,
    writes: Vec<LogWrite>,
    /// The server's record of each peer as last seen, for monotonicity.
    server_seen: Vec<Option<PeerState>>,
    log_counters: std::collections::BTreeMap<String, u64>,
    server_ops: u64,
    summary: Summary,
    /// Last, so it is removed after everything in it closed.
    dir: TempDir,
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Close every database before the directory goes: the replicas' here, the
        // server's (and its sessions') in the world, which the caller still holds.
        self.slots.clear();
        self.world.borrow_mut().server_died();
    }
}

impl Sim {
    fn new(world: Shared) -> Result<Sim, String> {
        let dir = TempDir::new().map_err(|e| format!("creating a temporary directory: {e}"))?;
        let clock = Arc::new(ManualClock::new(EPOCH_NS));
        let server = open_workspace(&dir.path().join("server.db"), &clock)?;
        world.borrow_mut().authority = Some(Authority::new(server, net::TOKEN));
        let replicas = 2 + world.borrow_mut().choices.below(2) as usize;
        let mut sim = Sim {
            clock,
            world,
            slots: Vec::new(),
            now: Duration::ZERO,
            step: 0,
            ledger: Vec::new(),
            writes: Vec::new(),
            server_seen: vec![None; replicas],
            log_counters: Default::default(),
            server_ops: 0,
            summary: Summary {
                replicas,
                ..Summary::default()
            },
            dir,
        };
        for index in 0..replicas {
            let limits = sim.choose_limits();
            let path = sim.replica_path(index, 0);
            let ws = open_workspace(&path, &sim.clock)?;
            sim.note(format!(
                "r{index}: replica {} (limits {limits:?})",
                short_id(ws.id())
            ));
            sim.slots.push(Slot::new(index, ws, limits));
        }
        Ok(sim)
    }

    fn run(&mut self, steps: u64) -> Check {
        while self.step < steps && !self.world.borrow().choices.exhausted() {
            self.step += 1;
            self.one_step()?;
            self.check_cursors()?;
            if self.step.is_multiple_of(CHECK_EVERY_STEPS) {
                self.check_stores()?;
            }
        }
        self.summary.steps = self.step;
        self.settle()?;
        self.final_checks()
    }

    fn one_step(&mut self) -> Check {
        let tick = Duration::from_millis(self.choose(200));
        self.advance(tick);
        let has_late = !self.world.borrow().delayed.is_empty();
        // Crashes rare enough that most syncs, which take a few dozen polls, can end.
        let weights = [90, 60, 14, if has_late { 10 } else { 0 }, 2, 4, 1];
        // Not in the match's scrutinee: its borrow would last through the arms.
        let kind = self.world.borrow_mut().choices.weighted(&weights);
        match kind {
            0 => {
                let index = self.choose(self.slots.len() as u64) as usize;
                self.poll_replica(index)
            }
            1 => self.local_op(),
            2 => {
                self.time_passes();
                Ok(())
            }
            3 => {
                let late = self.world.borrow().delayed.len() as u64;
                let index = self.choose(late) as usize;
                let line = net::deliver_late(&self.world, index);
                self.note(line);
                Ok(())
            }
            4 => self.restart_server(),
            5 => {
                let index = self.choose(self.slots.len() as u64) as usize;
                self.restart_replica(index)
            }
            _ => {
                let index = self.choose(self.slots.len() as u64) as usize;
                self.lose_disk(index)
            }
        }
    }

    /// Faults stop; held-back requests arrive; syncs in flight finish; then every
    /// replica syncs in turn until a whole round moves nothing.
    fn settle(&mut self) -> Check {
        self.world.borrow_mut().faults = false;
        self.step += 1;
        self.note("settling: faults off".into());
        while !self.world.borrow().delayed.is_empty() {
            let line = net::deliver_late(&self.world, 0);
            self.note(line);
        }
        for index in 0..self.slots.len() {
            if self.slots[index].attempt.is_some() {
                self.finish_in_flight(index)?;
            }
        }
        for round in 1..=SETTLE_ROUNDS_MAX as u64 {
            self.summary.settle_rounds = round;
            let mut moved = false;
            for index in 0..self.slots.len() {
                moved |= self.sync_until_done(index)?.moved();
            }
            if !moved {
                self.note(format!("settled after {round} round(s)"));
                return Ok(());
            }
        }
        Err(format!(
            "the sides did not settle: every one of {SETTLE_ROUNDS_MAX} rounds of syncs moved \
             something"
        ))
    }

    fn time_passes(&mut self) {
        let next_due = self
            .slots
            .iter()
            .filter_map(|s| s.pending.as_ref().map(|p| p.due))
            .filter(|&due| due > self.now)
            .min();
        let kind = self.world.borrow_mut().choices.weighted(&[6, 3, 1]);
        let delta = match (kind, next_due) {
            (0, Some(due)) => due - self.now,
            (0 | 1, _) => Duration::from_secs(self.choose(120) + 1),
            // Long enough for the server's loose blocks to expire.
            _ => Duration::from_secs(60 * (30 + self.choose(60))),
        };
        self.note(format!("time passes: {}s", delta.as_secs()));
        self.advance(delta);
    }

    fn advance(&mut self, delta: Duration) {
        self.now += delta;
        self.clock
            .advance(i64::try_from(delta.as_nanos()).unwrap_or(i64::MAX));
    }

    fn restart_server(&mut self) -> Check {
        self.note("server crashes and restarts".into());
        self.world.borrow_mut().server_died();
        let server = open_workspace(&self.dir.path().join("server.db"), &self.clock)?;
        self.world.borrow_mut().authority = Some(Authority::new(server, net::TOKEN));
        self.summary.server_restarts += 1;
        self.check_stores()
    }

    fn server(&self) -> Workspace {
        let world = self.world.borrow();
        let authority = world
            .authority
            .as_ref()
            .expect("the server runs between steps");
        authority.workspace().clone()
    }

    fn replica_path(&self, index: usize, generation: u32) -> PathBuf {
        self.dir
            .path()
            .join(format!("r{index}.g{generation}"))
            .join("replica.db")
    }

    fn choose(&self, n: u64) -> u64 {
        self.world.borrow_mut().choices.below(n.max(1))
    }

    fn chance(&self, percent: u64) -> bool {
        self.world.borrow_mut().choices.chance(percent)
    }

    fn choose_limits(&self) -> BatchLimits {
        BatchLimits {
            entries: 1 + self.choose(8) as u32,
            bytes: 16 << (10 + self.choose(7)),
            block_bytes: 16 << (10 + self.choose(4)),
        }
    }

    fn note(&self, line: String) {
        let step = self.step;
        self.world.borrow_mut().note(format!("{step:>4} {line}"));
    }
}

fn open_workspace(path: &Path, clock: &Arc<ManualClock>) -> Result<Workspace, String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {parent:?}: {e}"))?;
    }
    let options = Options {
        chunk_sizes: CHUNK_SIZES,
        reader_pool_max: 2,
        block_cache_bytes: 4 << 20,
        clock: clock.clone(),
        ..Options::default()
    };
    Workspace::open(path, options).map_err(|e| format!("opening {path:?}: {e}"))
}

fn short_id(id: &str) -> &str {
    &id[..id.len().min(8)]
}

/// A directory removed when the run ends, in `/dev/shm` when there is one: the run
/// writes and fsyncs databases at every step, and memory makes that cheap. (Not the
/// `tempfile` crate: this module is part of the library, which does not depend on it.)
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("computer-sim-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
