//! What FUSE over io_uring would save here: the same tiny read-only filesystem served
//! over `/dev/fuse` (`read(2)` a request, `write(2)` its reply, as fuser does) or over
//! the kernel's io_uring transport (a queue per CPU, a thread pinned to each, a request
//! answered and the next fetched in one submission). The filesystem decides nothing, so
//! a workload on it costs what its transport costs: run `request_latency` (or any
//! workload) on a `dev` mount, a `ring` mount, a computerd mount and tmpfs in one run.
//!
//! ```sh
//! cargo run --release -p computer-benches --example fuse_ring_floor -- /tmp/dev --transport dev &
//! cargo run --release -p computer-benches --example fuse_ring_floor -- /tmp/ring --transport ring &
//! # once both are in /proc/mounts:
//! target/release/examples/request_latency /tmp/dev/f0 /tmp/ring/f0 --op open
//! umount /tmp/dev /tmp/ring   # each prints how many requests each transport served
//! ```
//!
//! Root only (it mounts with mount(2) and, for `ring`, turns on
//! `/sys/module/fuse/parameters/enable_uring`, restoring it at exit). The tree is one
//! directory of `--files` files `f0`, `f1`, ... of `--size` bytes each, with hour-long
//! entry and attribute timeouts, `FOPEN_KEEP_CACHE` and `FOPEN_NOFLUSH` as computerd
//! answers; a missing extended attribute is answered ENODATA, every write ENOSYS.
//!
//! This is a measurement, not a transport for computerd: it speaks only the opcodes
//! above, and its wire structures are written here by hand from `linux/fuse.h`
//! (protocol 7.45, the kernel's layout of the ring entry since 6.14).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

#[derive(Parser)]
#[command(about = "A FUSE filesystem that decides nothing, over /dev/fuse or io_uring")]
struct Args {
    /// Where to mount it (an existing directory).
    mountpoint: PathBuf,
    /// How requests reach the daemon.
    #[arg(long, value_enum, default_value_t = Transport::Dev)]
    transport: Transport,
    /// Files in the root directory.
    #[arg(long, default_value_t = 1000)]
    files: u64,
    /// Bytes in each file.
    #[arg(long, default_value_t = 16)]
    size: usize,
    /// Ring entries per CPU queue (ring only).
    #[arg(long, default_value_t = 4)]
    queue_depth: u16,
    /// Open every file by passthrough to this file (its reads and writes then bypass
    /// the daemon, as computerd's do).
    #[arg(long)]
    passthrough: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    /// read(2) and write(2) on /dev/fuse, one thread.
    Dev,
    /// FUSE over io_uring, one queue and thread per CPU.
    Ring,
}

/// The kernel's wire format, from `include/uapi/linux/fuse.h`.
mod wire {
    pub const MAJOR: u32 = 7;
    pub const MINOR: u32 = 45;
    pub const ROOT: u64 = 1;

    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;

    pub const IN_HEADER_BYTES: usize = 40;
    pub const OUT_HEADER_BYTES: usize = 16;
    pub const INIT_OUT_BYTES: usize = 64;

    // INIT flags (the second word's bits are numbered from 32).
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const OVER_IO_URING: u64 = 1 << 41;

    pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
    pub const FOPEN_NOFLUSH: u32 = 1 << 5;
    pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

    /// `struct fuse_backing_map`, the argument of `FUSE_DEV_IOC_BACKING_OPEN`.
    #[repr(C)]
    pub struct BackingMap {
        pub fd: i32,
        pub flags: u32,
        pub padding: u64,
    }
    /// `_IOW(229, 1, struct fuse_backing_map)`: write, 16 bytes, type 229, number 1.
    pub const IOC_BACKING_OPEN: libc::c_ulong = (1 << 30) | (16 << 16) | (229 << 8) | 1;

    /// The largest request payload the daemon accepts: `max_pages` of 4 KiB.
    pub const MAX_PAGES_PER_REQUEST: u16 = 32;
    pub const MAX_PAYLOAD_BYTES: usize = MAX_PAGES_PER_REQUEST as usize * 4096;

    /// `struct fuse_uring_req_header`: the in/out header, the opcode's own header, then
    /// `struct fuse_uring_ent_in_out` (flags, commit id, payload size).
    pub const RING_OP_IN_OFFSET: usize = 128;
    pub const RING_ENT_OFFSET: usize = 256;
    pub const RING_HEADER_BYTES: usize = 288;
    pub const RING_CMD_REGISTER: u32 = 1;
    pub const RING_CMD_COMMIT_AND_FETCH: u32 = 2;

    /// Bytes of the header an opcode carries before its payload (`fuse_*_in`), for
    /// splitting a `/dev/fuse` request the way the ring delivers it.
    pub fn op_header_bytes(opcode: u32) -> usize {
        match opcode {
            GETATTR => 16,
            OPEN | OPENDIR | GETXATTR | LISTXATTR => 8,
            READ | READDIR => 40,
            RELEASE | RELEASEDIR | FLUSH => 24,
            FORGET => 8,
            BATCH_FORGET => 8,
            INIT => 64,
            INTERRUPT => 8,
            _ => 0,
        }
    }

    pub fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_ne_bytes(bytes[offset..offset + 4].try_into().unwrap())
    }

    pub fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_ne_bytes(bytes[offset..offset + 8].try_into().unwrap())
    }

    /// `struct fuse_in_header`, the fields used here.
    pub struct InHeader {
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
    }

    impl InHeader {
        pub fn parse(bytes: &[u8]) -> Option<InHeader> {
            (bytes.len() >= IN_HEADER_BYTES).then(|| InHeader {
                opcode: u32_at(bytes, 4),
                unique: u64_at(bytes, 8),
                nodeid: u64_at(bytes, 16),
            })
        }
    }

    pub fn out_header(body_bytes: usize, error: i32, unique: u64) -> [u8; OUT_HEADER_BYTES] {
        let mut out = [0u8; OUT_HEADER_BYTES];
        let len = (OUT_HEADER_BYTES + body_bytes) as u32;
        out[0..4].copy_from_slice(&len.to_ne_bytes());
        out[4..8].copy_from_slice(&(-error).to_ne_bytes());
        out[8..16].copy_from_slice(&unique.to_ne_bytes());
        out
    }

    /// Appends `struct fuse_attr`.
    pub fn put_attr(out: &mut Vec<u8>, ino: u64, size: u64, mode: u32, nlink: u32) {
        for word in [ino, size, size.div_ceil(512), 0, 0, 0] {
            out.extend_from_slice(&word.to_ne_bytes());
        }
        // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
        for word in [0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0u32] {
            out.extend_from_slice(&word.to_ne_bytes());
        }
    }
}

const HOUR_SECS: u64 = 3600;

/// The filesystem: a root directory of `files` files of `content`.
struct Floor {
    files: u64,
    content: Vec<u8>,
    device: RawFd,
    /// The file every open passes through to, and its backing id once registered
    /// (which the kernel allows only after INIT).
    passthrough: Option<(File, OnceLock<i32>)>,
}

const FIRST_FILE_INO: u64 = 2;

impl Floor {
    fn file_ino(&self, name: &[u8]) -> Option<u64> {
        let index: u64 = std::str::from_utf8(name.strip_prefix(b"f")?)
            .ok()?
            .parse()
            .ok()?;
        (index < self.files && name == format!("f{index}").as_bytes())
            .then_some(FIRST_FILE_INO + index)
    }

    fn is_file(&self, ino: u64) -> bool {
        (FIRST_FILE_INO..FIRST_FILE_INO + self.files).contains(&ino)
    }

    fn put_attr_of(&self, out: &mut Vec<u8>, ino: u64) {
        if ino == wire::ROOT {
            wire::put_attr(out, ino, 4096, libc::S_IFDIR | 0o755, 2);
        } else {
            wire::put_attr(
                out,
                ino,
                self.content.len() as u64,
                libc::S_IFREG | 0o644,
                1,
            );
        }
    }

    /// Answers one request: the reply's body into `out`, or an errno. `op_in` is the
    /// opcode's own header, `payload` what follows it (a name, data).
    fn answer(
        &self,
        header: &wire::InHeader,
        op_in: &[u8],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), i32> {
        let ino = header.nodeid;
        if ino != wire::ROOT && !self.is_file(ino) {
            return Err(libc::ENOENT);
        }
        match header.opcode {
            wire::LOOKUP => {
                let name = payload.split(|&b| b == 0).next().unwrap_or_default();
                let child = self.file_ino(name).filter(|_| ino == wire::ROOT);
                let child = child.ok_or(libc::ENOENT)?;
                // nodeid, generation, entry_valid, attr_valid, and their nanoseconds
                for word in [child, 0, HOUR_SECS, HOUR_SECS] {
                    out.extend_from_slice(&word.to_ne_bytes());
                }
                out.extend_from_slice(&[0u8; 8]);
                self.put_attr_of(out, child);
            }
            wire::GETATTR => {
                out.extend_from_slice(&HOUR_SECS.to_ne_bytes());
                out.extend_from_slice(&[0u8; 8]);
                self.put_attr_of(out, ino);
            }
            wire::OPEN | wire::OPENDIR => {
                let mut open_flags = wire::FOPEN_KEEP_CACHE | wire::FOPEN_NOFLUSH;
                let mut backing_id = 0;
                if header.opcode == wire::OPEN && self.passthrough.is_some() {
                    // A cached open would put the inode in caching mode, which
                    // excludes passthrough (the kernel fails the open with EIO).
                    open_flags = wire::FOPEN_NOFLUSH | wire::FOPEN_PASSTHROUGH;
                    backing_id = self.backing_id()?;
                }
                out.extend_from_slice(&0u64.to_ne_bytes());
                out.extend_from_slice(&open_flags.to_ne_bytes());
                out.extend_from_slice(&backing_id.to_ne_bytes());
            }
            wire::READ => {
                let offset = wire::u64_at(op_in, 8) as usize;
                let size = wire::u32_at(op_in, 16) as usize;
                let start = offset.min(self.content.len());
                let end = start.saturating_add(size).min(self.content.len());
                out.extend_from_slice(&self.content[start..end]);
            }
            wire::READDIR => self.list(wire::u64_at(op_in, 8), wire::u32_at(op_in, 16), out),
            wire::RELEASE | wire::RELEASEDIR | wire::FLUSH => {}
            wire::GETXATTR => return Err(libc::ENODATA),
            wire::LISTXATTR => out.extend_from_slice(&[0u8; 8]),
            wire::STATFS => out.extend_from_slice(&[0u8; 80]),
            _ => return Err(libc::ENOSYS),
        }
        Ok(())
    }

    fn backing_id(&self) -> Result<i32, i32> {
        let (file, id) = self.passthrough.as_ref().ok_or(libc::EIO)?;
        if let Some(id) = id.get() {
            return Ok(*id);
        }
        let map = wire::BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: map is a live fuse_backing_map; the device is the mount's.
        let registered = unsafe { libc::ioctl(self.device, wire::IOC_BACKING_OPEN, &map) };
        if registered < 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        Ok(*id.get_or_init(|| registered))
    }

    /// `struct fuse_dirent` entries from `offset` (an entry's index plus one) until
    /// `size` bytes are full.
    fn list(&self, offset: u64, size: u32, out: &mut Vec<u8>) {
        for index in offset..self.files {
            let name = format!("f{index}");
            let entry_bytes = (24 + name.len()).next_multiple_of(8);
            if out.len() + entry_bytes > size as usize {
                break;
            }
            out.extend_from_slice(&(FIRST_FILE_INO + index).to_ne_bytes());
            out.extend_from_slice(&(index + 1).to_ne_bytes());
            out.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            out.extend_from_slice(&u32::from(libc::DT_REG).to_ne_bytes());
            out.extend_from_slice(name.as_bytes());
            out.resize(out.len() + entry_bytes - 24 - name.len(), 0);
        }
    }
}

/// Requests served, per route.
#[derive(Default)]
struct Served {
    dev: AtomicU64,
    ring: Vec<AtomicU64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let passthrough = match &args.passthrough {
        Some(path) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            Some((file, OnceLock::new()))
        }
        None => None,
    };
    let queues = if args.transport == Transport::Ring {
        std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .context("reading the possible CPUs")
            .and_then(|list| possible_cpus(&list))?
    } else {
        0
    };
    let uring_was = (queues > 0).then(enable_uring).transpose()?;
    let device = mount(&args.mountpoint)?;
    let floor = Arc::new(Floor {
        files: args.files,
        content: vec![b'x'; args.size],
        device: device.as_raw_fd(),
        passthrough,
    });
    let served = Arc::new(Served {
        dev: AtomicU64::new(0),
        ring: (0..queues).map(|_| AtomicU64::new(0)).collect(),
    });
    // The ring threads may register only once the INIT reply is written.
    let initialised = Arc::new(Barrier::new(queues + 1));
    let mut threads = Vec::new();
    for qid in 0..queues {
        let (floor, served, initialised) = (floor.clone(), served.clone(), initialised.clone());
        let fd = device.as_raw_fd();
        let depth = args.queue_depth;
        threads.push(thread::spawn(move || {
            let served = &served.ring[qid];
            let result = serve_ring(qid, fd, depth, &floor, served, &initialised);
            if let Err(err) = &result {
                // Said at once: requests keep flowing over /dev/fuse meanwhile.
                eprintln!("ring queue {qid} stopped: {err:#}");
            }
            result
        }));
    }
    let dev_result = serve_dev(&device, &floor, &served.dev, &initialised, queues > 0);
    for thread in threads {
        thread.join().expect("a ring thread panicked")?;
    }
    if let Some(was) = uring_was {
        std::fs::write(ENABLE_URING, was).context("restoring enable_uring")?;
    }
    let per_queue: Vec<u64> = served
        .ring
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    eprintln!(
        "served {} requests over /dev/fuse, {:?} over the ring queues",
        served.dev.load(Ordering::Relaxed),
        per_queue
    );
    dev_result
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns the kernel's FUSE-over-io_uring switch on; returns what it was.
fn enable_uring() -> anyhow::Result<String> {
    let was = std::fs::read_to_string(ENABLE_URING)
        .with_context(|| format!("{ENABLE_URING}: is the kernel built with FUSE_IO_URING?"))?;
    std::fs::write(ENABLE_URING, "Y").with_context(|| format!("writing {ENABLE_URING}"))?;
    Ok(was.trim().to_string())
}

/// The number of possible CPUs in a list such as `0-1` or `0,2-3`: the kernel makes
/// one queue for each and uses the ring once every one has an entry.
fn possible_cpus(list: &str) -> anyhow::Result<usize> {
    let mut highest = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let last: usize = last.parse().with_context(|| format!("CPU list {list:?}"))?;
        highest = highest.max(Some(last));
    }
    highest
        .map(|h| h + 1)
        .context("no CPU in the possible list")
}

fn mount(mountpoint: &PathBuf) -> anyhow::Result<File> {
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("opening /dev/fuse")?;
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        device.as_raw_fd()
    );
    nix::mount::mount(
        Some("fuse_ring_floor"),
        mountpoint,
        Some("fuse.fuse_ring_floor"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .with_context(|| format!("mounting on {}", mountpoint.display()))?;
    Ok(device)
}

/// The classic loop: one request per `read(2)`, one reply per `write(2)`. Answers INIT
/// (asking for the ring when `ring` is set), then every request that does not travel
/// over the ring: all of them before the ring is ready, forgets and interrupts after.
fn serve_dev(
    device: &File,
    floor: &Floor,
    served: &AtomicU64,
    initialised: &Barrier,
    ring: bool,
) -> anyhow::Result<()> {
    let mut request = vec![0u8; wire::MAX_PAYLOAD_BYTES + 4096];
    let mut body = Vec::with_capacity(wire::MAX_PAYLOAD_BYTES);
    loop {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe {
            libc::read(
                device.as_raw_fd(),
                request.as_mut_ptr().cast(),
                request.len(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ENODEV) => return Ok(()),
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                _ => return Err(err).context("reading /dev/fuse"),
            }
        }
        let request = &request[..n as usize];
        let Some(header) = wire::InHeader::parse(request) else {
            bail!("a request of {n} bytes, shorter than its header");
        };
        served.fetch_add(1, Ordering::Relaxed);
        let body_in = &request[wire::IN_HEADER_BYTES..];
        body.clear();
        let result = match header.opcode {
            wire::FORGET | wire::BATCH_FORGET | wire::INTERRUPT => continue,
            wire::INIT => init_reply(body_in, ring, floor.passthrough.is_some(), &mut body),
            wire::DESTROY => Ok(()),
            opcode => {
                let split = wire::op_header_bytes(opcode).min(body_in.len());
                let (op_in, payload) = body_in.split_at(split);
                floor.answer(&header, op_in, payload, &mut body)
            }
        };
        write_dev_reply(device, &header, result, &body)?;
        if header.opcode == wire::INIT && ring {
            initialised.wait();
        }
    }
}

fn write_dev_reply(
    device: &File,
    header: &wire::InHeader,
    result: Result<(), i32>,
    body: &[u8],
) -> anyhow::Result<()> {
    let (error, body) = match result {
        Ok(()) => (0, body),
        Err(errno) => (errno, &[][..]),
    };
    let out = wire::out_header(body.len(), error, header.unique);
    let iov = [
        libc::iovec {
            iov_base: out.as_ptr() as *mut _,
            iov_len: out.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut _,
            iov_len: body.len(),
        },
    ];
    // SAFETY: both iovecs point into live buffers of their lengths.
    let n = unsafe { libc::writev(device.as_raw_fd(), iov.as_ptr(), 2) };
    if n < 0 {
        let err = io::Error::last_os_error();
        // ENOENT: the request was interrupted and is gone.
        if err.raw_os_error() != Some(libc::ENOENT) {
            return Err(err).context("writing a reply to /dev/fuse");
        }
    }
    Ok(())
}

/// `struct fuse_init_out` for the kernel's `struct fuse_init_in`.
fn init_reply(init_in: &[u8], ring: bool, passthrough: bool, out: &mut Vec<u8>) -> Result<(), i32> {
    if init_in.len() < 16 || wire::u32_at(init_in, 0) != wire::MAJOR {
        return Err(libc::EPROTO);
    }
    let minor = wire::u32_at(init_in, 4).min(wire::MINOR);
    let mut flags = wire::BIG_WRITES | wire::PARALLEL_DIROPS | wire::MAX_PAGES | wire::INIT_EXT;
    if ring {
        flags |= wire::OVER_IO_URING;
    }
    if passthrough {
        flags |= wire::PASSTHROUGH;
    }
    let max_write = wire::MAX_PAYLOAD_BYTES as u32;
    for word in [wire::MAJOR, minor, 128 * 1024, flags as u32] {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    out.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&max_write.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.extend_from_slice(&wire::MAX_PAGES_PER_REQUEST.to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    out.extend_from_slice(&((flags >> 32) as u32).to_ne_bytes());
    out.extend_from_slice(&u32::from(passthrough).to_ne_bytes()); // max_stack_depth
    out.resize(wire::INIT_OUT_BYTES, 0);
    Ok(())
}

/// A page-aligned buffer the kernel reads and writes between submissions.
struct Pages {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Pages {
    fn new(bytes: usize) -> Pages {
        let layout = std::alloc::Layout::from_size_align(bytes.next_multiple_of(4096), 4096)
            .expect("a page-aligned layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a ring buffer");
        Pages { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// One ring entry: a header buffer, a payload buffer and the iovecs naming them.
struct Entry {
    header: Pages,
    payload: Pages,
    iov: [libc::iovec; 2],
}

/// Serves queue `qid` on its own CPU until the connection ends.
fn serve_ring(
    qid: usize,
    device: RawFd,
    depth: u16,
    floor: &Floor,
    served: &AtomicU64,
    initialised: &Barrier,
) -> anyhow::Result<()> {
    pin_to_cpu(qid)?;
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .build(u32::from(depth).next_power_of_two())
        .context("creating an io_uring with 128-byte entries")?;
    let mut entries: Vec<Box<Entry>> = (0..depth).map(|_| new_entry()).collect();
    initialised.wait();
    for (index, entry) in entries.iter_mut().enumerate() {
        let sqe = ring_command(device, qid, wire::RING_CMD_REGISTER, 0, Some(&entry.iov));
        push(&mut ring, sqe.user_data(index as u64))?;
    }
    let mut body = Vec::with_capacity(wire::MAX_PAYLOAD_BYTES);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
            Err(err) => return Err(err).context("io_uring_enter"),
        }
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (index, result) in completions {
            if result == -libc::ENOTCONN || result == -libc::ENODEV {
                return Ok(()); // unmounted
            }
            if result < 0 {
                let err = io::Error::from_raw_os_error(-result);
                return Err(err).with_context(|| format!("ring queue {qid}"));
            }
            let entry = &mut entries[index as usize];
            let commit_id = answer_ring_entry(floor, entry, &mut body)?;
            served.fetch_add(1, Ordering::Relaxed);
            let sqe = ring_command(
                device,
                qid,
                wire::RING_CMD_COMMIT_AND_FETCH,
                commit_id,
                None,
            );
            push(&mut ring, sqe.user_data(index))?;
        }
    }
}

fn new_entry() -> Box<Entry> {
    let mut header = Pages::new(wire::RING_HEADER_BYTES);
    let mut payload = Pages::new(wire::MAX_PAYLOAD_BYTES);
    let iov = [
        libc::iovec {
            iov_base: header.bytes().as_mut_ptr().cast(),
            iov_len: wire::RING_HEADER_BYTES,
        },
        libc::iovec {
            iov_base: payload.bytes().as_mut_ptr().cast(),
            iov_len: wire::MAX_PAYLOAD_BYTES,
        },
    ];
    Box::new(Entry {
        header,
        payload,
        iov,
    })
}

/// Answers the request the kernel put in `entry`, leaving the reply in its place;
/// returns the commit id that hands it back.
fn answer_ring_entry(floor: &Floor, entry: &mut Entry, body: &mut Vec<u8>) -> anyhow::Result<u64> {
    let header_bytes = entry.header.bytes();
    let ent = wire::RING_ENT_OFFSET;
    let commit_id = wire::u64_at(header_bytes, ent + 8);
    let payload_bytes = wire::u32_at(header_bytes, ent + 16) as usize;
    let Some(header) = wire::InHeader::parse(header_bytes) else {
        bail!("a ring entry without a request header");
    };
    let op_in_end = wire::RING_OP_IN_OFFSET + wire::op_header_bytes(header.opcode);
    let op_in = header_bytes[wire::RING_OP_IN_OFFSET..op_in_end].to_vec();
    let payload = &entry.payload.bytes()[..payload_bytes.min(wire::MAX_PAYLOAD_BYTES)];
    body.clear();
    let (error, reply_bytes) = match floor.answer(&header, &op_in, payload, body) {
        Ok(()) => (0, body.len()),
        Err(errno) => (errno, 0),
    };
    entry.payload.bytes()[..reply_bytes].copy_from_slice(&body[..reply_bytes]);
    let header_bytes = entry.header.bytes();
    let out = wire::out_header(reply_bytes, error, header.unique);
    header_bytes[..wire::OUT_HEADER_BYTES].copy_from_slice(&out);
    header_bytes[ent + 16..ent + 20].copy_from_slice(&(reply_bytes as u32).to_ne_bytes());
    Ok(commit_id)
}

/// An `IORING_OP_URING_CMD` for the FUSE device: `struct fuse_uring_cmd_req` in the
/// command area, and for a registration the two iovecs in `addr` and `len`.
fn ring_command(
    device: RawFd,
    qid: usize,
    command: u32,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&(qid as u16).to_ne_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(device), command).cmd(cmd);
    if let Some(iov) = iov {
        op = op.addr(Some(iov.as_ptr() as u64));
    }
    let entry = op.build();
    match iov {
        Some(iov) => with_sqe_len(entry, iov.len() as u32),
        None => entry,
    }
}

/// Sets the `len` field of a submission entry, which io-uring's `UringCmd80` builder
/// does not expose; FUSE reads the number of iovecs of a registration from it.
fn with_sqe_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    /// `struct io_uring_sqe`: opcode, flags, ioprio, fd, off, addr, then len.
    const SQE_LEN_OFFSET: usize = 24;
    // SAFETY: Entry128 is #[repr(C)] over the kernel's 128-byte submission entry, every
    // bit pattern of which is a valid value.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute(bytes) }
}

fn push(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    sqe: squeue::Entry128,
) -> anyhow::Result<()> {
    // SAFETY: the buffers an entry names live in `entries`, which outlives the ring's use.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| anyhow::anyhow!("submission queue full"))
}

fn pin_to_cpu(cpu: usize) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).context("CPU number")?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .with_context(|| format!("pinning ring queue {cpu} to its CPU"))
}
