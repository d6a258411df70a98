//! FUSE over io_uring: the kernel queues requests on a ring per CPU instead of
//! `/dev/fuse`, and a thread pinned to that CPU answers each one and fetches the next in
//! one submission. The caller's CPU serves its request, so neither wake-up need cross
//! CPUs: a round trip costs about 13 µs here against about 20 over `/dev/fuse`, for
//! callers of any scheduling group, because the queue threads run where the scheduler
//! leaves the caller on its CPU ([`placement`]; docs/benchmarks.md, "FUSE over
//! io_uring, measured").
//!
//! fuser keeps everything else: the mount, INIT (which asks for the ring), and what
//! the kernel still sends over `/dev/fuse` (forgets, interrupts, any request before
//! every queue has registered), and the notifications the daemon sends. The ring
//! carries every request the daemon implements (see [`wire::Request`]; the rest are
//! answered ENOSYS, as fuser answers them); the handlers are the ones fuser calls
//! ([`WorkspaceFs`]'s `serve_*`), answering through [`RingReply`]. An open that passes
//! a file through names a backing id registered on the session's device, as over
//! `/dev/fuse`.
//!
//! A large READ (a read-ahead window) is served by a read worker instead, so that a
//! file read from disk has several windows in flight ([`offload`]).
//!
//! Each queue registers entries (a header and a payload buffer each): up to
//! [`QUEUE_DEPTH_MAX`] per online CPU within [`RING_BUFFERS_BUDGET_BYTES`] in all, one
//! for a CPU that is not online ([`queue_depths`]); a queue whose registration fails (a kernel without the transport, or one that did
//! not agree in INIT) logs why and ends, and requests keep going through `/dev/fuse`:
//! the kernel uses the ring only once every queue has an entry.

mod offload;
mod placement;
mod reply;
mod serve;
mod wire;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::fuse::{WorkspaceFs, MAX_WRITE};
use offload::{Handoff, Inbox, Job, Workers, OFFLOAD_READ_BYTES};
use placement::RingGroup;
use reply::Answer;
use serve::Server;

/// Ring entries per online CPU at most: requests a CPU can have in flight before the
/// kernel queues more (each blocked caller holds one; so do background RELEASEs and
/// large reads handed to the read workers).
const QUEUE_DEPTH_MAX: u16 = 16;
/// Ring entries per online CPU at least, whatever the budget: one for a caller and one
/// for a read a worker is serving.
const QUEUE_DEPTH_MIN: u16 = 2;
/// What the payload buffers of all queues may take together, unless that leaves an
/// online CPU fewer than [`QUEUE_DEPTH_MIN`] entries: 16 entries per CPU on up to 7
/// CPUs, then fewer, 2 from 64 CPUs on, so that a host of many CPUs does not give each
/// 16 MiB. The pages are touched, and so resident, only as requests fill them.
const RING_BUFFERS_BUDGET_BYTES: usize = 128 << 20;
/// A payload buffer holds the largest request or reply: a WRITE or READ of
/// `MAX_WRITE`, with a page to spare.
const PAYLOAD_BYTES: usize = MAX_WRITE as usize + PAGE_BYTES;
/// The unit the ring's buffers are sized in (`mmap` rounds up to the host's own).
const PAGE_BYTES: usize = 4096;
/// `FUSE_IO_URING_CMD_REGISTER` and `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The completion of the poll on a queue's stop eventfd.
const STOP_TOKEN: u64 = u64::MAX;
/// The completion of the poll on a queue's inbox eventfd ([`offload`]).
const INBOX_TOKEN: u64 = u64::MAX - 1;
/// How long a queue keeps retrying a registration the kernel is not ready for.
const REGISTER_PATIENCE: Duration = Duration::from_secs(5);

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns on the kernel's switch for FUSE over io_uring (off by default; it governs
/// only connections that ask for it in INIT). Must happen before the mount's INIT.
fn enable_in_kernel() -> std::io::Result<()> {
    let now = std::fs::read_to_string(ENABLE_URING).map_err(|err| {
        std::io::Error::new(
            err.kind(),
            format!("not in this kernel ({ENABLE_URING}: {err})"),
        )
    })?;
    if now.trim() != "Y" {
        std::fs::write(ENABLE_URING, "Y").map_err(|err| {
            std::io::Error::new(
                err.kind(),
                format!("cannot turn it on ({ENABLE_URING}: {err})"),
            )
        })?;
        tracing::info!("turned on FUSE over io_uring in the kernel ({ENABLE_URING})");
    }
    Ok(())
}

/// What the ring needs before the mount's INIT asks for it: the kernel's switch on, and
/// the cpu cgroup its queues will run in ([`placement`]).
pub struct RingPlan {
    group: Option<Arc<RingGroup>>,
}

impl RingPlan {
    /// Turns on the kernel's switch and makes the queues' group. An error says why the
    /// mount should not ask for the ring: a kernel without it, a switch this process may
    /// not turn on, or, with `placed_only`, no cpu cgroup for the queues made the
    /// measured way (without one, a caller outside the daemon's scheduling group
    /// changes CPUs on each request and pays more than over `/dev/fuse`).
    pub fn prepare(placed_only: bool) -> std::io::Result<RingPlan> {
        enable_in_kernel()?;
        match RingGroup::create(!placed_only) {
            Ok(group) => Ok(RingPlan {
                group: Some(Arc::new(group)),
            }),
            Err(err) if placed_only => Err(std::io::Error::new(
                err.kind(),
                format!("has no cpu cgroup for its queues here ({err})"),
            )),
            Err(err) => {
                tracing::warn!(
                    "FUSE over io_uring without a cpu cgroup of its own ({err}): callers \
                     outside the daemon's scheduling group change CPUs on each request"
                );
                Ok(RingPlan { group: None })
            }
        }
    }
}

/// The running queues.
pub struct RingTransport {
    queues: Vec<(JoinHandle<()>, OwnedFd)>,
    workers: Workers,
    served: Arc<Vec<AtomicU64>>,
    /// Where the queue threads run, removed here once they have ended: a thread still
    /// in the group (one dropping the last clone as it exits) could not remove it.
    group: Option<Arc<RingGroup>>,
}

impl RingTransport {
    /// Starts a queue per possible CPU on `device`, the session's `/dev/fuse`
    /// descriptor (a duplicate), once INIT is answered, in the group `plan` made, and
    /// `read_workers` workers for large reads ([`offload`]; as many as `/dev/fuse` would
    /// have, within [`worker_count`]'s bound). `owner_only`: the uid allowed when the
    /// mount is not shared with other users (fuser's check, kept here).
    pub fn start(
        plan: RingPlan,
        fs: WorkspaceFs,
        device: OwnedFd,
        owner_only: Option<u32>,
        read_workers: usize,
    ) -> std::io::Result<RingTransport> {
        let cpus = possible_cpus()?;
        let online = online_cpus(cpus);
        let depths = queue_depths(cpus, &online);
        let device = Arc::new(device);
        let served: Arc<Vec<AtomicU64>> = Arc::new((0..cpus).map(|_| AtomicU64::new(0)).collect());
        let server = Arc::new(Server { fs, owner_only });
        let entries = depths.iter().map(|&depth| usize::from(depth)).sum();
        let (workers, handoff, inboxes) = Workers::start(
            server.clone(),
            worker_count(read_workers, &online),
            cpus,
            entries,
        )?;
        let group = plan.group;
        let mut queues = Vec::with_capacity(cpus);
        for ((qid, inbox), depth) in inboxes.into_iter().enumerate().zip(depths) {
            let stop = eventfd(0)?;
            let queue = Queue {
                qid,
                depth,
                device: device.clone(),
                server: server.clone(),
                handoff: handoff.clone(),
                inbox,
                stop: stop.as_raw_fd(),
                served: served.clone(),
                group: group.clone(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || queue.run())?;
            queues.push((thread, stop));
        }
        Ok(RingTransport {
            queues,
            workers,
            served,
            group,
        })
    }

    /// The name of a mount's transport, as `computerd status` shows it: this one
    /// where it runs, else `/dev/fuse`.
    pub fn name(ring: Option<&RingTransport>) -> &'static str {
        match ring {
            Some(_) => "io_uring",
            None => "/dev/fuse",
        }
    }

    /// Stops every queue and waits for it (they end by themselves at unmount).
    pub fn stop(self) {
        for (_, stop) in &self.queues {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd this owns.
            unsafe { libc::write(stop.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
        for (thread, _) in self.queues {
            let _ = thread.join();
        }
        // The queues dropped their handoffs as they ended: the workers end too.
        let large_reads = self.workers.join();
        drop(self.group);
        let served: Vec<u64> = self
            .served
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        tracing::info!(
            "FUSE requests served over io_uring, per CPU: {served:?}; large reads served \
             by the read workers: {large_reads}"
        );
    }
}

/// The number of queues the kernel makes: one per possible CPU (it uses the ring once
/// each has an entry), from a list such as `0-1` or `0,2-3`.
fn possible_cpus() -> std::io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(&list).ok_or_else(|| {
        std::io::Error::other(format!("cannot read the possible CPUs from {list:?}"))
    })
}

fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut highest = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next()?.parse::<usize>().ok()?;
        highest = highest.max(Some(last));
    }
    highest.map(|h| h + 1)
}

/// How many read workers to start: as many as asked for, but one CPU fewer than are
/// online, and at least one. A read a worker serves is committed by its queue's
/// thread, which runs under `SCHED_IDLE` (`placement.rs`): with a busy worker on every
/// CPU the commits wait behind them. On two CPUs, `cat` of a 256 MiB file after a mount
/// took 309 ms with two workers, 205 with one, the database in the page cache
/// (docs/benchmarks.md, "One worker fewer than CPUs, reads in place").
fn worker_count(asked: usize, online: &[bool]) -> usize {
    let online = online.iter().filter(|&&up| up).count();
    asked.min(online.saturating_sub(1)).max(1)
}

/// Which of the `possible` CPUs are online; all of them where the list cannot be read.
fn online_cpus(possible: usize) -> Vec<bool> {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| parse_cpu_set(&list, possible));
    listed.unwrap_or_else(|| vec![true; possible])
}

/// The CPUs of a list such as `0,2-3` among `possible`, or `None` if it is malformed.
fn parse_cpu_set(list: &str, possible: usize) -> Option<Vec<bool>> {
    let mut set = vec![false; possible];
    for part in list.trim().split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last) = (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?);
        let listed = set.get_mut(first..=last.min(possible.checked_sub(1)?));
        listed.unwrap_or_default().fill(true);
    }
    Some(set)
}

/// The entries of each queue: the same number for every online CPU, as many as the
/// budget allows within [`QUEUE_DEPTH_MIN`]..=[`QUEUE_DEPTH_MAX`], and one for a CPU
/// that is not online (the kernel wants a queue for every possible CPU before it uses
/// the ring, and gives a queue only the requests of callers on its CPU; a CPU brought
/// online later is served one request at a time).
fn queue_depths(possible: usize, online: &[bool]) -> Vec<u16> {
    let online_count = online.iter().filter(|&&on| on).count().max(1);
    let affordable = RING_BUFFERS_BUDGET_BYTES / (online_count * PAYLOAD_BYTES);
    let depth = u16::try_from(affordable)
        .unwrap_or(u16::MAX)
        .clamp(QUEUE_DEPTH_MIN, QUEUE_DEPTH_MAX);
    (0..possible)
        .map(|cpu| {
            if online.get(cpu) == Some(&true) {
                depth
            } else {
                1
            }
        })
        .collect()
}

/// A new eventfd; `flags` beside `EFD_CLOEXEC`.
fn eventfd(flags: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One CPU's queue and what its thread serves with.
struct Queue {
    qid: usize,
    /// How many entries it registers ([`queue_depths`]).
    depth: u16,
    device: Arc<OwnedFd>,
    server: Arc<Server>,
    /// Where large reads go ([`offload`]), and where they come back.
    handoff: Handoff,
    inbox: Inbox,
    stop: RawFd,
    served: Arc<Vec<AtomicU64>>,
    group: Option<Arc<RingGroup>>,
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

impl Queue {
    /// Moves this thread into the ring's group under `SCHED_IDLE` ([`placement`]).
    fn keep_callers_cpu(&self) {
        let Some(group) = &self.group else { return };
        if let Err(err) = group.enter() {
            tracing::warn!(
                "FUSE over io_uring, queue {} keeps the normal policy: {err}",
                self.qid
            );
        }
    }

    fn run(self) {
        let Err(err) = self.serve() else {
            return;
        };
        if self.served[self.qid].load(Ordering::Relaxed) == 0 {
            tracing::warn!(
                "FUSE over io_uring unavailable (queue {}: {err}); requests go through /dev/fuse",
                self.qid
            );
        } else {
            // The kernel keeps queueing this CPU's requests here: they wait until unmount.
            tracing::error!("FUSE over io_uring, queue {} stopped: {err}", self.qid);
        }
    }

    fn serve(&self) -> std::io::Result<()> {
        pin_to_cpu(self.qid);
        // Boxed: an entry handed to a worker moves, its buffers and iovecs do not.
        // Declared before the ring, so dropped after it: the kernel may write into an
        // entry registered with the ring until the ring is gone.
        let mut entries = (0..self.depth)
            .map(|_| Ok(Some(Box::new(RingEntry::new()?))))
            .collect::<std::io::Result<Vec<Option<Box<RingEntry>>>>>()?;
        let slots = u32::from(self.depth) + 2; // and the two polls
        let mut ring: Ring = IoUring::builder().build(slots.next_power_of_two())?;
        for (index, entry) in entries.iter().flatten().enumerate() {
            push(&mut ring, self.register(entry, index))?;
        }
        push(&mut ring, poll(self.stop, STOP_TOKEN))?;
        push(&mut ring, poll(self.inbox.wake.as_raw_fd(), INBOX_TOKEN))?;
        // Registered under the normal policy: until every queue has registered, the
        // kernel holds every request of the mount, and a queue thread already under
        // `SCHED_IDLE` on a busy CPU took tens of milliseconds to get there.
        ring.submit()?;
        self.keep_callers_cpu();
        let started = Instant::now();
        let mut answer = Answer::default();
        let mut live = entries.len();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(entries.len() + 2);
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
                Err(err) => return Err(err),
            }
            completions.clear();
            completions.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
            for &(token, result) in &completions {
                match token {
                    STOP_TOKEN => return Ok(()),
                    INBOX_TOKEN => {
                        self.take_back(&mut ring, &mut entries)?;
                        push(&mut ring, poll(self.inbox.wake.as_raw_fd(), INBOX_TOKEN))?;
                        continue;
                    }
                    _ => {}
                }
                let slot = &mut entries[token as usize];
                let entry = slot
                    .as_deref_mut()
                    .expect("a completion of an entry in hand");
                match self.after(entry, token, result, &mut answer, started) {
                    Next::Submit(sqe) => push(&mut ring, sqe.user_data(token))?,
                    Next::Offload => {
                        if let Some(sqe) = self.offload(slot, token, &mut answer) {
                            push(&mut ring, sqe.user_data(token))?;
                        }
                    }
                    Next::Retire => live -= 1,
                    Next::End => return Ok(()),
                }
                if live == 0 {
                    return Err(std::io::Error::other("every entry of the queue failed"));
                }
            }
        }
    }

    /// What follows the completion of `entry`'s last command with `result`: a request
    /// to answer (here, or by a worker), a retry, or the end.
    fn after(
        &self,
        entry: &mut RingEntry,
        token: u64,
        result: i32,
        answer: &mut Answer,
        started: Instant,
    ) -> Next {
        let device = self.device.as_raw_fd();
        match result {
            0.. => {
                self.served[self.qid].fetch_add(1, Ordering::Relaxed);
                if is_large_read(entry) {
                    return Next::Offload;
                }
                let commit_id = self.server.answer(entry, answer);
                entry.committing = Some(commit_id);
                Next::Submit(command(device, self.qid, CMD_COMMIT_AND_FETCH, commit_id))
            }
            err if err == -libc::EINTR || err == -libc::EAGAIN => match entry.committing {
                Some(commit_id) => {
                    Next::Submit(command(device, self.qid, CMD_COMMIT_AND_FETCH, commit_id))
                }
                // The connection is not initialised yet: register again shortly.
                None if started.elapsed() < REGISTER_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(1));
                    Next::Submit(self.register(entry, token as usize))
                }
                None => Next::Retire,
            },
            err if CONNECTION_GONE.contains(&-err) => Next::End,
            err => {
                let err = std::io::Error::from_raw_os_error(-err);
                tracing::error!(
                    "FUSE over io_uring, queue {}: an entry failed: {err}",
                    self.qid
                );
                Next::Retire
            }
        }
    }

    /// Hands the entry in `slot` to a worker; if none can take it, serves it here and
    /// returns its commit.
    fn offload(
        &self,
        slot: &mut Option<Box<RingEntry>>,
        token: u64,
        answer: &mut Answer,
    ) -> Option<squeue::Entry128> {
        let entry = slot.take().expect("the entry to hand over");
        let job = Job {
            queue: self.qid,
            token,
            entry,
        };
        let Job { mut entry, .. } = self.handoff.give(job).err()?;
        let commit_id = self.server.answer(&mut entry, answer);
        entry.committing = Some(commit_id);
        *slot = Some(entry);
        let device = self.device.as_raw_fd();
        Some(command(device, self.qid, CMD_COMMIT_AND_FETCH, commit_id))
    }

    /// Takes back the entries the workers served and commits them.
    fn take_back(
        &self,
        ring: &mut Ring,
        entries: &mut [Option<Box<RingEntry>>],
    ) -> std::io::Result<()> {
        let mut count = [0u8; 8];
        // SAFETY: reads 8 bytes into a live buffer from the queue's own eventfd (non-
        // blocking: nothing to read is EAGAIN, and harmless).
        unsafe { libc::read(self.inbox.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        let device = self.device.as_raw_fd();
        while let Ok(served) = self.inbox.served.try_recv() {
            let mut entry = served.entry;
            entry.committing = Some(served.commit_id);
            let slot = &mut entries[served.token as usize];
            debug_assert!(slot.is_none(), "an entry comes back to an empty slot");
            *slot = Some(entry);
            let commit = command(device, self.qid, CMD_COMMIT_AND_FETCH, served.commit_id);
            push(ring, commit.user_data(served.token))?;
        }
        Ok(())
    }

    /// The registration of an entry's two buffers; its completion carries a request.
    fn register(&self, entry: &RingEntry, index: usize) -> squeue::Entry128 {
        let sqe = command(self.device.as_raw_fd(), self.qid, CMD_REGISTER, 0);
        with_iovecs(sqe, &entry.iov).user_data(index as u64)
    }
}

/// Errors that say the connection is gone: unmounted or aborted.
const CONNECTION_GONE: [i32; 4] = [
    libc::ENOTCONN,
    libc::ECONNABORTED,
    libc::ENODEV,
    libc::ECANCELED,
];

/// What a queue does after a completion.
enum Next {
    /// Submit this for the entry.
    Submit(squeue::Entry128),
    /// Hand the entry's request to a worker ([`offload`]).
    Offload,
    /// Take the entry out of service (its error is logged).
    Retire,
    /// The connection is gone: the queue ends.
    End,
}

/// Runs the queue's thread on its CPU, where the kernel queues that CPU's requests. A
/// CPU that is not online cannot be pinned to: its queue runs anywhere.
fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let pinned = set
        .set(cpu)
        .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(err) = pinned {
        tracing::debug!("FUSE over io_uring, queue {cpu} not pinned: {err}");
    }
}

/// An `IORING_OP_URING_CMD` on the FUSE device: `struct fuse_uring_cmd_req` (flags,
/// commit id, queue) in the command area.
fn command(device: RawFd, qid: usize, cmd: u32, commit_id: u64) -> squeue::Entry128 {
    let mut area = [0u8; 80];
    area[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    area[16..18].copy_from_slice(&(qid as u16).to_ne_bytes());
    opcode::UringCmd80::new(types::Fd(device), cmd)
        .cmd(area)
        .build()
}

/// Points a registration at an entry's two iovecs: `addr` and `len` of the submission,
/// the latter of which io-uring's `UringCmd80` builder does not expose.
fn with_iovecs(sqe: squeue::Entry128, iov: &[libc::iovec; 2]) -> squeue::Entry128 {
    /// `struct io_uring_sqe`: opcode, flags, ioprio, fd, off, then addr and len.
    const ADDR_OFFSET: usize = 16;
    const LEN_OFFSET: usize = 24;
    // SAFETY: Entry128 is #[repr(C)] over the kernel's 128-byte submission entry, and
    // any bytes are a valid value of it.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[ADDR_OFFSET..ADDR_OFFSET + 8].copy_from_slice(&(iov.as_ptr() as u64).to_ne_bytes());
    bytes[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&(iov.len() as u32).to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// A poll for `fd` to become readable, completing with `token`.
fn poll(fd: RawFd, token: u64) -> squeue::Entry128 {
    let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
    sqe.user_data(token).into()
}

/// Whether `entry` holds a READ large enough for a worker ([`offload`]).
fn is_large_read(entry: &mut RingEntry) -> bool {
    let header = entry.header.bytes();
    let Ok(parsed) = wire::entry(header) else {
        return false;
    };
    wire::read_args(parsed.header.opcode, wire::op_in(header))
        .is_some_and(|read| read.size >= OFFLOAD_READ_BYTES)
}

fn push(ring: &mut Ring, sqe: squeue::Entry128) -> std::io::Result<()> {
    // SAFETY: every buffer a submission names (an entry's iovecs and buffers) lives in
    // the queue's `entries`, which outlive the ring (an entry a worker holds has no
    // submission: the kernel writes to it only after the queue commits it again); the
    // queue holds no more submissions than entries plus its two polls, so the
    // submission queue has room.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| std::io::Error::other("the ring's submission queue is full"))
}

/// A page-aligned buffer the kernel reads and writes between submissions: a private
/// anonymous mapping, so that a page costs memory only once something is written to
/// it. A payload buffer is sized for the largest request, and most requests use a page
/// of it or none: every entry of every queue allocated up front would otherwise be
/// resident from the mount on (33 MiB on two CPUs, up to the buffer budget on a
/// large host).
struct Pages {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned memory, touched by one thread at a time.
unsafe impl Send for Pages {}

impl Pages {
    /// A buffer of `bytes` rounded up to whole pages; fails as `mmap` does (ENOMEM):
    /// the queue then ends with the error, and since the kernel uses the ring only once
    /// every queue registered, requests stay on `/dev/fuse`.
    fn new(bytes: usize) -> std::io::Result<Pages> {
        let len = bytes.next_multiple_of(PAGE_BYTES);
        assert!(len > 0, "a buffer of at least a page");
        // SAFETY: a new private anonymous mapping; no address or descriptor is passed.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // Pages, not huge pages: one write would make 2 MiB resident where THP is on
        // for every mapping. Advice only: a host without THP refuses it.
        // SAFETY: advice on the mapping just made.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        let ptr = std::ptr::NonNull::new(ptr.cast()).expect("mmap returns no null mapping");
        Ok(Pages { ptr, len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr maps len bytes, readable and writable (zeros until written),
        // owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of this length, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One ring entry: the buffers the kernel fills with a request and reads the reply
/// from, and the iovecs that name them at registration.
struct RingEntry {
    header: Pages,
    payload: Pages,
    iov: [libc::iovec; 2],
    /// The commit id of the reply last handed back, once the entry served a request.
    committing: Option<u64>,
}

// SAFETY: the iovecs point into the entry's own buffers, which move with it; only the
// thread holding the entry touches them.
unsafe impl Send for RingEntry {}

impl RingEntry {
    fn new() -> std::io::Result<RingEntry> {
        let mut header = Pages::new(wire::HEADER_BYTES)?;
        let mut payload = Pages::new(PAYLOAD_BYTES)?;
        let iov = [
            libc::iovec {
                iov_base: header.bytes().as_mut_ptr().cast(),
                iov_len: wire::HEADER_BYTES,
            },
            libc::iovec {
                iov_base: payload.bytes().as_mut_ptr().cast(),
                iov_len: PAYLOAD_BYTES,
            },
        ];
        Ok(RingEntry {
            header,
            payload,
            iov,
            committing: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_number_of_queues() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-3"), Some(4));
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list(""), None);
    }

    #[test]
    fn cpu_sets_mark_the_listed_cpus() {
        assert_eq!(parse_cpu_set("0-1\n", 2), Some(vec![true, true]));
        assert_eq!(
            parse_cpu_set("0,2-3", 5),
            Some(vec![true, false, true, true, false])
        );
        // A CPU beyond the possible ones has no queue to mark.
        assert_eq!(parse_cpu_set("0-7", 2), Some(vec![true, true]));
        assert_eq!(parse_cpu_set("0-x", 2), None);
        assert_eq!(parse_cpu_set("", 2), None);
    }

    #[test]
    fn queue_depths_keep_the_buffers_within_the_budget() {
        // Few CPUs: the full depth each.
        assert_eq!(queue_depths(2, &[true, true]), vec![QUEUE_DEPTH_MAX; 2]);
        // A CPU that is not online gets one entry.
        assert_eq!(queue_depths(3, &[true, false, true]), vec![16, 1, 16]);
        for online in [1, 8, 9, 16, 64, 65, 512] {
            let depths = queue_depths(online + 3, &vec![true; online]);
            let entries: usize = depths.iter().map(|&d| usize::from(d)).sum();
            let online_depth = usize::from(depths[0]);
            assert!(
                (2..=16).contains(&online_depth),
                "{online} CPUs: {online_depth}"
            );
            assert_eq!(entries, online * online_depth + 3);
            let bytes = online * online_depth * PAYLOAD_BYTES;
            assert!(
                bytes <= RING_BUFFERS_BUDGET_BYTES || online_depth == 2,
                "{online} CPUs: {bytes} bytes"
            );
            // The budget is used: one more entry per CPU would exceed it.
            assert!(
                online_depth == 16
                    || online * (online_depth + 1) * PAYLOAD_BYTES > RING_BUFFERS_BUDGET_BYTES
            );
        }
    }

    #[test]
    fn read_workers_leave_a_cpu_to_the_queues() {
        assert_eq!(worker_count(2, &[true, true]), 1);
        assert_eq!(worker_count(8, &[true; 4]), 3);
        assert_eq!(worker_count(2, &[true; 4]), 2);
        // One CPU, or none known online: still a worker.
        assert_eq!(worker_count(2, &[true]), 1);
        assert_eq!(worker_count(2, &[false, false]), 1);
        assert_eq!(worker_count(0, &[true; 4]), 1);
        // A CPU that is not online runs nothing.
        assert_eq!(worker_count(4, &[true, false, true, false]), 1);
    }

    #[test]
    fn a_buffer_is_resident_only_where_written() {
        let mut pages = Pages::new(PAYLOAD_BYTES).unwrap();
        assert_eq!(resident_pages(&mut pages), 0, "a new buffer");
        pages.bytes()[PAGE_BYTES * 3] = 1;
        assert_eq!(resident_pages(&mut pages), 1, "after a write to one page");
        // The rest reads as zeros (mapping the zero page, which mincore counts).
        let zeros = pages.bytes().iter().filter(|&&b| b == 0).count();
        assert_eq!(zeros, PAYLOAD_BYTES - 1);
    }

    /// How many of a buffer's pages are in memory (`mincore`).
    fn resident_pages(pages: &mut Pages) -> usize {
        let bytes = pages.bytes();
        let mut flags = vec![0u8; bytes.len().div_ceil(PAGE_BYTES)];
        // SAFETY: a mapping of bytes.len() bytes, and a vector of one byte per page.
        let rc =
            unsafe { libc::mincore(bytes.as_mut_ptr().cast(), bytes.len(), flags.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        flags.iter().filter(|&&f| f & 1 == 1).count()
    }

    #[test]
    fn a_registration_names_both_buffers() {
        let entry = RingEntry::new().unwrap();
        let sqe = with_iovecs(command(3, 1, CMD_REGISTER, 0), &entry.iov);
        // SAFETY: as in `with_iovecs`.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        let addr = u64::from_ne_bytes(bytes[16..24].try_into().unwrap());
        let len = u32::from_ne_bytes(bytes[24..28].try_into().unwrap());
        assert_eq!(addr, entry.iov.as_ptr() as u64);
        assert_eq!(len, 2);
        assert_eq!(bytes[0], io_uring::opcode::UringCmd80::CODE);
        // The queue id, in the command area at byte 48 of the entry plus 16.
        assert_eq!(u16::from_ne_bytes(bytes[64..66].try_into().unwrap()), 1);
    }
}
