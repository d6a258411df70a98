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
//! Each queue registers [`QUEUE_DEPTH`] entries (a header and a payload buffer each);
//! a queue whose registration fails (a kernel without the transport, or one that did
//! not agree in INIT) logs why and ends, and requests keep going through `/dev/fuse`:
//! the kernel uses the ring only once every queue has an entry.

mod placement;
mod wire;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use computer_vfs::{SetAttr, SetTime};
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::fuse::{Sender, WorkspaceFs, MAX_WRITE};
use crate::fuse_reply as answer;
use placement::RingGroup;
use wire::Request;

/// Ring entries per CPU: requests a CPU can have in flight before the kernel queues
/// more (each blocked caller holds one; so do background RELEASEs).
const QUEUE_DEPTH: u16 = 16;
/// A payload buffer holds the largest request or reply: a WRITE or READ of
/// `MAX_WRITE`, with a page to spare.
const PAYLOAD_BYTES: usize = MAX_WRITE as usize + 4096;
/// `FUSE_IO_URING_CMD_REGISTER` and `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The completion of the poll on a queue's stop eventfd.
const STOP_TOKEN: u64 = u64::MAX;
/// How long a queue keeps retrying a registration the kernel is not ready for.
const REGISTER_PATIENCE: Duration = Duration::from_secs(5);

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns on the kernel's switch for FUSE over io_uring (off by default; it governs
/// only connections that ask for it in INIT). Must happen before the mount's INIT.
pub fn enable_in_kernel() -> std::io::Result<()> {
    let now = std::fs::read_to_string(ENABLE_URING)?;
    if now.trim() != "Y" {
        std::fs::write(ENABLE_URING, "Y")?;
        tracing::info!("turned on FUSE over io_uring in the kernel ({ENABLE_URING})");
    }
    Ok(())
}

/// The running queues.
pub struct RingTransport {
    queues: Vec<(JoinHandle<()>, OwnedFd)>,
    served: Arc<Vec<AtomicU64>>,
    /// Where the queue threads run, removed here once they have ended: a thread still
    /// in the group (one dropping the last clone as it exits) could not remove it.
    group: Option<Arc<RingGroup>>,
}

impl RingTransport {
    /// Starts a queue per possible CPU on `device`, the session's `/dev/fuse`
    /// descriptor (a duplicate), once INIT is answered. `owner_only`: the uid allowed
    /// when the mount is not shared with other users (fuser's check, kept here).
    pub fn start(
        fs: WorkspaceFs,
        device: OwnedFd,
        owner_only: Option<u32>,
    ) -> std::io::Result<RingTransport> {
        let cpus = possible_cpus()?;
        let device = Arc::new(device);
        let served: Arc<Vec<AtomicU64>> = Arc::new((0..cpus).map(|_| AtomicU64::new(0)).collect());
        let group = ring_group();
        let mut queues = Vec::with_capacity(cpus);
        for qid in 0..cpus {
            let stop = eventfd()?;
            let queue = Queue {
                qid,
                device: device.clone(),
                fs: fs.clone(),
                owner_only,
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
            served,
            group,
        })
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
        drop(self.group);
        let served: Vec<u64> = self
            .served
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        tracing::info!("FUSE requests served over io_uring, per CPU: {served:?}");
    }
}

/// The cpu cgroup that keeps callers on their CPU, or `None` (logged) where the host
/// offers none.
fn ring_group() -> Option<Arc<RingGroup>> {
    match RingGroup::create() {
        Ok(group) => Some(Arc::new(group)),
        Err(err) => {
            tracing::warn!(
                "FUSE over io_uring without a cpu cgroup of its own ({err}): callers \
                 outside the daemon's scheduling group change CPUs on each request"
            );
            None
        }
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

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One CPU's queue and what its thread serves with.
struct Queue {
    qid: usize,
    device: Arc<OwnedFd>,
    fs: WorkspaceFs,
    owner_only: Option<u32>,
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
        self.keep_callers_cpu();
        let depth = u32::from(QUEUE_DEPTH) + 1; // and the stop poll
        let mut ring: Ring = IoUring::builder().build(depth.next_power_of_two())?;
        let mut entries: Vec<RingEntry> = (0..QUEUE_DEPTH).map(|_| RingEntry::new()).collect();
        for (index, entry) in entries.iter().enumerate() {
            push(&mut ring, self.register(entry, index))?;
        }
        let stop = opcode::PollAdd::new(types::Fd(self.stop), libc::POLLIN as u32)
            .build()
            .user_data(STOP_TOKEN);
        push(&mut ring, stop.into())?;
        let started = Instant::now();
        let mut answer = Answer::default();
        let mut live = entries.len();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(entries.len() + 1);
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
                Err(err) => return Err(err),
            }
            completions.clear();
            completions.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
            for &(token, result) in &completions {
                if token == STOP_TOKEN {
                    return Ok(());
                }
                let entry = &mut entries[token as usize];
                match self.after(entry, token, result, &mut answer, started) {
                    Next::Submit(sqe) => push(&mut ring, sqe.user_data(token))?,
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
    /// to answer, a retry, or the end.
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
                let commit_id = self.answer(entry, answer);
                entry.committing = Some(commit_id);
                self.served[self.qid].fetch_add(1, Ordering::Relaxed);
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

    /// The registration of an entry's two buffers; its completion carries a request.
    fn register(&self, entry: &RingEntry, index: usize) -> squeue::Entry128 {
        let sqe = command(self.device.as_raw_fd(), self.qid, CMD_REGISTER, 0);
        with_iovecs(sqe, &entry.iov).user_data(index as u64)
    }

    /// Serves the request in `entry` and leaves the reply in its place; returns the
    /// commit id that hands it back.
    fn answer(&self, entry: &mut RingEntry, answer: &mut Answer) -> u64 {
        let parsed = wire::entry(entry.header.bytes()).expect("a header buffer of a page");
        answer.clear();
        let payload_bytes = parsed.payload_bytes.min(PAYLOAD_BYTES);
        let payload = &entry.payload.bytes()[..payload_bytes];
        let header = entry.header.bytes();
        match wire::decode(parsed.header.opcode, wire::op_in(header), payload) {
            Ok(request) => {
                let reply = RingReply {
                    answer: &mut *answer,
                };
                self.dispatch(&parsed.header, request, reply)
            }
            Err(errno) => answer.errno = errno.code(),
        }
        let body = if answer.errno == 0 {
            &answer.body[..]
        } else {
            &[]
        };
        let (errno, body) = match entry.payload.bytes().get_mut(..body.len()) {
            Some(room) => {
                room.copy_from_slice(body);
                (answer.errno, body.len())
            }
            None => (libc::EIO, 0), // larger than any request allows
        };
        wire::put_reply_header(entry.header.bytes(), parsed.header.unique, errno, body);
        parsed.commit_id
    }

    fn dispatch(&self, header: &wire::InHeader, request: Request<'_>, reply: RingReply<'_>) {
        let sender = Sender {
            uid: header.uid,
            gid: header.gid,
            pid: header.pid,
        };
        if let Some(owner) = self.owner_only {
            if header.uid != owner && !request.exempt_from_owner_check() {
                return answer::Fallible::fail(reply, Errno::EACCES);
            }
        }
        let (fs, inode) = (&self.fs, INodeNo(header.nodeid));
        match request {
            Request::Lookup { name } => fs.serve_lookup(&sender, inode, name, reply),
            Request::Getattr => fs.serve_getattr(inode, reply),
            Request::Readlink => fs.serve_readlink(inode, reply),
            Request::Open { flags } => fs.serve_open(&sender, inode, flags, reply),
            Request::Read { fh, offset, size } => {
                fs.serve_read(&sender, inode, FileHandle(fh), offset, size, reply)
            }
            Request::Flush { fh } => fs.serve_flush(FileHandle(fh), reply),
            Request::Release { fh } => fs.serve_release(inode, FileHandle(fh), reply),
            Request::Fsync { fh, datasync } => fs.serve_fsync(FileHandle(fh), datasync, reply),
            Request::Opendir => fs.serve_opendir(&sender, inode, reply),
            Request::Readdir { offset, size } => {
                fs.serve_readdir(&sender, inode, offset, reply.limited(size))
            }
            Request::Readdirplus { offset, size } => {
                fs.serve_readdirplus(&sender, inode, offset, reply.limited(size))
            }
            // Nothing to release: directories are opened without a handle.
            Request::Releasedir => answer::Empty::ok(reply),
            Request::Fsyncdir => fs.serve_fsyncdir(reply),
            Request::Statfs => fs.serve_statfs(reply),
            Request::Getxattr { name, size } => {
                fs.serve_getxattr(&sender, inode, name, size, reply)
            }
            Request::Listxattr { size } => fs.serve_listxattr(inode, size, reply),
            Request::Access { mask } => fs.serve_access(&sender, inode, mask, reply),
            Request::Lseek { offset, whence } => fs.serve_lseek(inode, offset, whence, reply),
            Request::Unsupported { .. } => answer::Fallible::fail(reply, Errno::ENOSYS),
            change => self.dispatch_change(&sender, inode, change, reply),
        }
    }

    /// The requests that change the tree.
    fn dispatch_change(
        &self,
        sender: &Sender,
        inode: INodeNo,
        request: Request<'_>,
        reply: RingReply<'_>,
    ) {
        let fs = &self.fs;
        match request {
            Request::Setattr(changes) => fs.serve_setattr(sender, inode, set_attr(&changes), reply),
            Request::Mknod { name, mode, rdev } => {
                fs.serve_mknod(sender, inode, name, mode, rdev, reply)
            }
            Request::Mkdir { name, mode } => fs.serve_mkdir(sender, inode, name, mode, reply),
            Request::Unlink { name } => fs.serve_unlink(sender, inode, name, reply),
            Request::Rmdir { name } => fs.serve_rmdir(sender, inode, name, reply),
            Request::Symlink { name, target } => {
                fs.serve_symlink(sender, inode, name, target, reply)
            }
            Request::Rename {
                name,
                newdir,
                newname,
                flags,
            } => {
                let (from, to) = ((inode, name), (INodeNo(newdir), newname));
                fs.serve_rename(sender, from, to, flags, reply)
            }
            Request::Link { oldnodeid, newname } => {
                fs.serve_link(sender, INodeNo(oldnodeid), inode, newname, reply)
            }
            Request::Create { name, flags, mode } => {
                fs.serve_create(sender, inode, name, mode, flags, reply)
            }
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            } => {
                let at = (FileHandle(fh), offset);
                fs.serve_write(sender, inode, at, data, write_flags, reply)
            }
            Request::Setxattr { name, value, flags } => {
                fs.serve_setxattr(sender, inode, name, value, flags, reply)
            }
            Request::Removexattr { name } => fs.serve_removexattr(sender, inode, name, reply),
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => fs.serve_fallocate(FileHandle(fh), offset, length, mode, reply),
            Request::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
            } => {
                let (from, to) = ((FileHandle(fh_in), off_in), (FileHandle(fh_out), off_out));
                fs.serve_copy_file_range(from, to, len, reply)
            }
            other => {
                debug_assert!(false, "{other:?} is dispatched by `dispatch`");
                answer::Fallible::fail(reply, Errno::ENOSYS)
            }
        }
    }
}

/// The store's attribute change from the kernel's SETATTR.
fn set_attr(changes: &wire::SetattrIn) -> SetAttr {
    use wire::fattr;
    let valid = |bit: u32| changes.valid & bit != 0;
    let time = |set: u32, now: u32, (secs, nanos): (i64, u32)| {
        valid(set).then(|| match valid(now) {
            true => SetTime::Now,
            false => SetTime::At(nanoseconds(secs, nanos)),
        })
    };
    SetAttr {
        perm: valid(fattr::MODE).then_some(changes.mode & 0o7777),
        uid: valid(fattr::UID).then_some(changes.uid),
        gid: valid(fattr::GID).then_some(changes.gid),
        size: valid(fattr::SIZE).then_some(changes.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, changes.atime),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, changes.mtime),
        ctime: valid(fattr::CTIME).then(|| nanoseconds(changes.ctime.0, changes.ctime.1)),
        through_handle: valid(fattr::FH),
    }
}

/// A time the kernel sends as whole seconds (negative before the epoch) and the
/// nanoseconds after them, in nanoseconds since the epoch (saturating).
fn nanoseconds(secs: i64, nanos: u32) -> i64 {
    secs.saturating_mul(1_000_000_000)
        .saturating_add(i64::from(nanos))
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

fn push(ring: &mut Ring, sqe: squeue::Entry128) -> std::io::Result<()> {
    // SAFETY: every buffer a submission names (an entry's iovecs and buffers) lives in
    // the queue's `entries`, which outlive the ring; the queue holds no more submissions
    // than entries plus the stop poll, so the queue has room.
    unsafe { ring.submission().push(&sqe) }
        .map_err(|_| std::io::Error::other("the ring's submission queue is full"))
}

/// A page-aligned buffer the kernel reads and writes between submissions.
struct Pages {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned memory, touched by one thread at a time.
unsafe impl Send for Pages {}

impl Pages {
    fn new(bytes: usize) -> Pages {
        let layout = std::alloc::Layout::from_size_align(bytes.next_multiple_of(4096), 4096)
            .expect("a page-aligned layout of a few pages");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Pages { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
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

// SAFETY: the iovecs point into the entry's own buffers.
unsafe impl Send for RingEntry {}

impl RingEntry {
    fn new() -> RingEntry {
        let mut header = Pages::new(wire::HEADER_BYTES);
        let mut payload = Pages::new(PAYLOAD_BYTES);
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
        RingEntry {
            header,
            payload,
            iov,
            committing: None,
        }
    }
}

/// A reply being built: its errno, or its body. Reused by a queue for every request.
#[derive(Default)]
struct Answer {
    errno: i32,
    body: Vec<u8>,
}

impl Answer {
    fn clear(&mut self) {
        self.errno = 0;
        self.body.clear();
    }
}

/// The ring's reply to one request, for the handlers ([`answer`]'s traits).
struct RingReply<'a> {
    answer: &'a mut Answer,
}

/// A page of a listing: entries up to the size the kernel asked for.
struct ListingReply<'a> {
    answer: &'a mut Answer,
    limit: usize,
}

impl<'a> RingReply<'a> {
    fn limited(self, size: u32) -> ListingReply<'a> {
        ListingReply {
            answer: self.answer,
            limit: (size as usize).min(PAYLOAD_BYTES),
        }
    }
}

impl answer::Fallible for RingReply<'_> {
    fn fail(self, err: Errno) {
        self.answer.errno = err.code();
    }
}

impl answer::Fallible for ListingReply<'_> {
    fn fail(self, err: Errno) {
        self.answer.errno = err.code();
    }
}

impl answer::Entry for RingReply<'_> {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        wire::put_entry(&mut self.answer.body, ttl, attr, generation.0);
    }
}

impl answer::Attr for RingReply<'_> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        wire::put_attr_out(&mut self.answer.body, ttl, attr);
    }
}

impl answer::Data for RingReply<'_> {
    fn data(self, data: &[u8]) {
        self.answer.body.extend_from_slice(data);
    }
}

impl answer::Empty for RingReply<'_> {
    fn ok(self) {}
}

impl answer::Open for RingReply<'_> {
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        wire::put_open(&mut self.answer.body, fh.0, flags.bits(), 0);
    }

    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, backing_id: u32) {
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        wire::put_open(&mut self.answer.body, fh.0, flags.bits(), backing_id);
    }
}

/// `struct fuse_create_out`: the entry, then the open file.
impl answer::Create for RingReply<'_> {
    fn created(self, entry: &answer::NewEntry<'_>, fh: FileHandle, flags: FopenFlags) {
        let body = &mut self.answer.body;
        wire::put_entry(body, entry.ttl, entry.attr, entry.generation.0);
        wire::put_open(body, fh.0, flags.bits(), 0);
    }

    fn created_passthrough(
        self,
        entry: &answer::NewEntry<'_>,
        fh: FileHandle,
        flags: FopenFlags,
        backing_id: u32,
    ) {
        let body = &mut self.answer.body;
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        wire::put_entry(body, entry.ttl, entry.attr, entry.generation.0);
        wire::put_open(body, fh.0, flags.bits(), backing_id);
    }
}

impl answer::Write for RingReply<'_> {
    fn written(self, size: u32) {
        wire::put_written(&mut self.answer.body, size);
    }
}

impl answer::Directory for ListingReply<'_> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &std::ffi::OsStr) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let body = &mut self.answer.body;
        !wire::put_dirent(body, self.limit, None, ino.0, offset, kind, name.as_bytes())
    }

    fn ok(self) {}
}

impl answer::DirectoryPlus for ListingReply<'_> {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &std::ffi::OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let body = &mut self.answer.body;
        let plus = Some((ttl, attr, generation.0));
        !wire::put_dirent(
            body,
            self.limit,
            plus,
            ino.0,
            offset,
            attr.kind,
            name.as_bytes(),
        )
    }

    fn ok(self) {}
}

impl answer::Statfs for RingReply<'_> {
    fn statfs(self, c: &answer::FsCounts) {
        let counts = [c.blocks, c.bfree, c.bavail, c.files, c.ffree];
        wire::put_statfs(
            &mut self.answer.body,
            counts,
            [c.bsize, c.namelen, c.frsize],
        );
    }
}

impl answer::Xattr for RingReply<'_> {
    /// `struct fuse_getxattr_out`: the size alone, for a caller that asked for it.
    fn size(self, size: u32) {
        self.answer.body.extend_from_slice(&size.to_ne_bytes());
        self.answer.body.extend_from_slice(&0u32.to_ne_bytes());
    }

    fn data(self, data: &[u8]) {
        self.answer.body.extend_from_slice(data);
    }
}

impl answer::Lseek for RingReply<'_> {
    fn offset(self, offset: i64) {
        self.answer.body.extend_from_slice(&offset.to_ne_bytes());
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
    fn a_registration_names_both_buffers() {
        let entry = RingEntry::new();
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
