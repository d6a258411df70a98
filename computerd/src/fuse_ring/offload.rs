//! Large reads served off the queues' threads. A queue has one thread, pinned to its
//! CPU, and a reader's requests all come to the queue of the reader's CPU: served
//! there, the read-ahead windows of a file read after a fresh mount would wait for
//! each other, each a read of the database from disk, where `/dev/fuse`'s workers
//! serve two at once. So a queue hands a READ of [`OFFLOAD_READ_BYTES`] or more to a
//! worker (as many as the mount's `--threads`, but one CPU fewer than are online:
//! `worker_count`; in the daemon's own group and policy, shared by all queues) and
//! goes on with its other entries; the worker serves it into the entry's buffers and
//! hands the entry back, waking the queue through an eventfd the queue's ring polls,
//! and the queue commits it. Small requests stay on the queue's thread, where a round
//! trip costs least.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::reply::Answer;
use super::serve::Server;
use super::RingEntry;

/// The smallest READ served by a worker: the kernel's read-ahead windows (128 KiB
/// and up) are; a small file's single read is not.
pub const OFFLOAD_READ_BYTES: u32 = 128 << 10;

/// A request handed to a worker: the entry holding it, and where it goes back.
pub struct Job {
    pub queue: usize,
    pub token: u64,
    pub entry: Box<RingEntry>,
}

/// An entry served by a worker, its reply in place, to be committed by its queue.
pub struct Served {
    pub token: u64,
    pub entry: Box<RingEntry>,
    pub commit_id: u64,
}

/// Where a queue's served entries come back, and the eventfd that wakes it.
pub struct Inbox {
    pub served: Receiver<Served>,
    pub wake: Arc<OwnedFd>,
}

/// A queue's way back, held by the workers.
struct Outbox {
    served: mpsc::Sender<Served>,
    wake: Arc<OwnedFd>,
}

/// The workers, and the queues' way to them.
pub struct Workers {
    threads: Vec<JoinHandle<()>>,
    served: Arc<AtomicU64>,
}

/// What a queue holds to hand requests to the workers.
#[derive(Clone)]
pub struct Handoff {
    jobs: SyncSender<Job>,
}

impl Handoff {
    /// Hands `job` to a worker, or returns it if none can take it (the workers are
    /// gone): the queue then serves it itself.
    pub fn give(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|mpsc::SendError(job)| job)
    }
}

impl Workers {
    /// Starts `count` workers for `queues` queues of `entries` entries together; returns
    /// them, the queues' handoff and each queue's inbox.
    pub fn start(
        server: Arc<Server>,
        count: usize,
        queues: usize,
        entries: usize,
    ) -> std::io::Result<(Workers, Handoff, Vec<Inbox>)> {
        let mut inboxes = Vec::with_capacity(queues);
        let mut outboxes = Vec::with_capacity(queues);
        for _ in 0..queues {
            let (served, inbox) = mpsc::channel();
            let wake = Arc::new(super::eventfd(libc::EFD_NONBLOCK)?);
            outboxes.push(Outbox {
                served,
                wake: wake.clone(),
            });
            inboxes.push(Inbox {
                served: inbox,
                wake,
            });
        }
        // A bounded channel with room for every entry of every queue never blocks a
        // queue's thread.
        let (jobs, pending) = mpsc::sync_channel(entries);
        let pending = Arc::new(Mutex::new(pending));
        let outboxes = Arc::new(outboxes);
        let served = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::with_capacity(count);
        for n in 0..count {
            let (server, pending, outboxes) = (server.clone(), pending.clone(), outboxes.clone());
            let counter = served.clone();
            let thread = std::thread::Builder::new()
                .name(format!("fuse-ring-read-{n}"))
                .spawn(move || work(&server, &pending, &outboxes, &counter))?;
            threads.push(thread);
        }
        let workers = Workers { threads, served };
        Ok((workers, Handoff { jobs }, inboxes))
    }

    /// Waits for the workers, which end once every queue has dropped its handoff;
    /// returns how many requests they served.
    pub fn join(self) -> u64 {
        for thread in self.threads {
            let _ = thread.join();
        }
        self.served.load(Ordering::Relaxed)
    }
}

fn work(server: &Server, pending: &Mutex<Receiver<Job>>, outboxes: &[Outbox], served: &AtomicU64) {
    let mut answer = Answer::default();
    loop {
        let job = pending.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(Job {
            queue,
            token,
            mut entry,
        }) = job
        else {
            return; // every queue has ended
        };
        let commit_id = server.answer(&mut entry, &mut answer);
        served.fetch_add(1, Ordering::Relaxed);
        let outbox = &outboxes[queue];
        let served = Served {
            token,
            entry,
            commit_id,
        };
        if outbox.served.send(served).is_ok() {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd the outbox owns.
            unsafe { libc::write(outbox.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }
}
