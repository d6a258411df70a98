//! Adaptive polling of the FUSE device while requests keep coming.
//!
//! A request the daemon answers from memory still costs a round trip of about 20 µs on
//! these VMs, and most of it is two wake-ups across CPUs: the kernel wakes the daemon's
//! reader, then the caller. A reader that is already awake needs no first wake-up. So
//! while requests arrive close together, the workers' device descriptor (one for all of
//! them) is non-blocking (`O_NONBLOCK`; fuser's loop retries on `EAGAIN`): one worker
//! spins on it and picks each request up as soon as it is queued, the others rest
//! ([`RequestPolling::request_done`]). About 10 µs a round trip, and 10 to 20 % off
//! long runs of small-file work (docs/benchmarks.md).
//!
//! Spinning costs a CPU, and a short command loses by it: between requests its CPU goes
//! idle, and on these VMs a reply that wakes an idle CPU costs more than the daemon and
//! the caller taking turns on one (without polling, the kernel runs the woken reader
//! where the caller just slept). So polling is bounded:
//! - it starts only after [`BUSY_WINDOWS_BEFORE_POLLING`] windows of [`IDLE`] in a row
//!   with at least [`MIN_REQUESTS_PER_WINDOW`] requests each: a command run alone after
//!   a pause (`git status`, `git log`, `cat` of a few files) is over before that, and
//!   polled it took 1.3 to 1.9 times as long; a lone request (one `stat` process after
//!   another) starts nothing either;
//! - it stops after a window of `IDLE` that served fewer than
//!   [`MIN_REQUESTS_PER_WINDOW`] requests: the caller is then mostly computing, on a CPU
//!   the spinning may share;
//! - it stops, and stays off for [`HOLD_OFF`] (doubling while that repeats, see
//!   [`Backoff`]), while threads wait for a CPU (pressure stall information, or
//!   without it the runnable count): the spinning reader would then take time from the
//!   work it serves.
//!
//! Only the mode of the descriptor changes, and where idle workers wait, so polling can
//! never change an answer.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// The polling window: a request this soon after the one before starts polling, and
/// the governor looks this often whether to stop.
pub const IDLE: Duration = Duration::from_millis(1);
/// How long polling stays off after the first stop for contention.
pub const HOLD_OFF: Duration = Duration::from_millis(50);
/// The longest hold-off: each stop for contention doubles it up to this.
const HOLD_OFF_MAX: Duration = Duration::from_secs(2);
/// Windows without contention after which the hold-off is back to [`HOLD_OFF`].
const CALM_WINDOWS: u32 = 10;
/// Fewer requests than this in a polling window stop the polling.
pub const MIN_REQUESTS_PER_WINDOW: u64 = 4;
/// Consecutive windows of at least [`MIN_REQUESTS_PER_WINDOW`] requests each before
/// polling starts: the commands an agent runs one at a time (`git status`, `git log`, a
/// `cat`) are over within about 10 ms, and polled they were slower.
pub const BUSY_WINDOWS_BEFORE_POLLING: u64 = 12;
/// How long a resting worker sleeps before it looks again by itself.
const REST_MAX: Duration = Duration::from_millis(50);

/// Switches one FUSE device descriptor between polling and blocking reads.
///
/// Created before the session (the filesystem holds it) and [`attach`](Self::attach)ed
/// to the session's device once it exists; until then, and after [`stop`](Self::stop),
/// requests are only noted.
pub struct RequestPolling {
    /// A duplicate of the session's descriptor, which every worker reads: they share
    /// its mode.
    device: OnceLock<OwnedFd>,
    governor: OnceLock<Thread>,
    epoch: Instant,
    /// While not polling: when the current window began (its first request, in
    /// nanoseconds since `epoch`), the requests that arrived in it, and how many busy
    /// windows came before it without a break.
    window_start_ns: AtomicU64,
    window_requests: AtomicU64,
    busy_windows: AtomicU64,
    /// Requests since the mount, to see how many each polling window served.
    requests: AtomicU64,
    /// Whether the device is (being switched to) non-blocking. Read without the lock on
    /// every request; changed only under `switch`.
    polling: AtomicBool,
    /// No polling before this (nanoseconds since `epoch`): the machine was busy.
    held_off_until_ns: AtomicU64,
    /// Serialises the switches, so the flag and the descriptor's mode agree.
    switch: Mutex<()>,
    stopped: AtomicBool,
    /// Switches to polling, and stops for contention, since the mount: for the log.
    started: AtomicU64,
    held_off: AtomicU64,
    /// The session's worker threads, which all read the one descriptor.
    workers: usize,
    /// How many of them rest while one polls.
    resting: Mutex<usize>,
    rest_over: Condvar,
    /// Rests begun, for the tests.
    #[cfg(test)]
    rests: AtomicU64,
}

impl RequestPolling {
    /// For a session whose `workers` threads all read one device descriptor.
    pub fn new(workers: usize) -> Arc<RequestPolling> {
        Arc::new(RequestPolling {
            device: OnceLock::new(),
            governor: OnceLock::new(),
            epoch: Instant::now(),
            window_start_ns: AtomicU64::new(0),
            window_requests: AtomicU64::new(0),
            busy_windows: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            held_off_until_ns: AtomicU64::new(0),
            switch: Mutex::new(()),
            stopped: AtomicBool::new(false),
            started: AtomicU64::new(0),
            held_off: AtomicU64::new(0),
            workers,
            resting: Mutex::new(0),
            rest_over: Condvar::new(),
            #[cfg(test)]
            rests: AtomicU64::new(0),
        })
    }

    /// Starts governing `device`, a duplicate of the session's descriptor.
    pub fn attach(self: &Arc<Self>, device: OwnedFd) -> std::io::Result<()> {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            // A spinning reader on the only CPU would only delay the caller.
            tracing::info!("one CPU: FUSE requests are read blocking");
            return Ok(());
        }
        if self.device.set(device).is_err() {
            return Ok(());
        }
        let polling = Arc::downgrade(self);
        let handle = thread::Builder::new()
            .name("fuse-poll".into())
            .spawn(move || govern(&polling, cpus))?;
        let _ = self.governor.set(handle.thread().clone());
        Ok(())
    }

    /// Notes a request; switches to polling if it is off, requests have been coming
    /// long enough ([`RequestPolling::burst`]), and polling is allowed. Called at the
    /// start of every request, so the common case is a few atomic operations.
    pub fn request_arrived(&self) {
        let now = self.now_ns();
        self.requests.fetch_add(1, Ordering::Relaxed);
        if self.polling.load(Ordering::Relaxed)
            || now < self.held_off_until_ns.load(Ordering::Relaxed)
            || !self.burst(now)
        {
            return;
        }
        let Some(device) = self.device.get() else {
            return;
        };
        let switch = self.lock();
        if self.polling.load(Ordering::Relaxed) || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        if set_nonblocking(device, true) {
            self.polling.store(true, Ordering::Relaxed);
            self.started.fetch_add(1, Ordering::Relaxed);
            if let Some(governor) = self.governor.get() {
                governor.unpark();
            }
        }
        drop(switch);
    }

    /// Notes the end of a request, after its reply. While the device is polled, every
    /// worker but one rests here instead of reading it: all of them would spin, and
    /// any that waits on the device is woken by the kernel for every request, even one
    /// another worker takes, which cost about 5 µs of each round trip
    /// (`request_latency`: 13.6 to 15.8 µs with two workers, 7.8 to 9.0 with one). They
    /// go back when polling stops, which is also within about [`IDLE`] of the active
    /// worker getting stuck in a slow request (an `fsync`, a large read): it then takes
    /// no new requests, so none arrives.
    pub fn request_done(&self) {
        // One worker never rests: no lock on each of its requests.
        if self.workers < 2 || !self.polling.load(Ordering::Relaxed) {
            return;
        }
        let mut resting = self.resting.lock().unwrap_or_else(|e| e.into_inner());
        if *resting + 1 >= self.workers {
            return; // the one that polls
        }
        *resting += 1;
        #[cfg(test)]
        self.rests.fetch_add(1, Ordering::Relaxed);
        while self.polling.load(Ordering::Relaxed) && !self.stopped.load(Ordering::Relaxed) {
            // Woken by `end_rest`; the timeout only guards against a missed wake-up.
            resting = match self.rest_over.wait_timeout(resting, REST_MAX) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        *resting -= 1;
    }

    /// Counts a request arriving at `now` while not polling; whether it follows
    /// [`BUSY_WINDOWS_BEFORE_POLLING`] busy windows in a row. A request more than
    /// [`IDLE`] after the window's first begins the next window, and a window that
    /// ended more than `IDLE` before it breaks the row. Racing workers may lose a count
    /// or begin a window twice: the rule needs the rate only roughly.
    fn burst(&self, now: u64) -> bool {
        let window_ns = IDLE.as_nanos() as u64;
        let elapsed = now.saturating_sub(self.window_start_ns.load(Ordering::Relaxed));
        if elapsed < window_ns {
            self.window_requests.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let busy = self.window_requests.load(Ordering::Relaxed) >= MIN_REQUESTS_PER_WINDOW;
        let in_a_row = if busy && elapsed < 2 * window_ns {
            self.busy_windows.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.busy_windows.store(0, Ordering::Relaxed);
            0
        };
        self.window_start_ns.store(now, Ordering::Relaxed);
        self.window_requests.store(1, Ordering::Relaxed);
        in_a_row >= BUSY_WINDOWS_BEFORE_POLLING
    }

    /// Sends the resting workers back to the device.
    fn end_rest(&self) {
        let _resting = self.resting.lock().unwrap_or_else(|e| e.into_inner());
        self.rest_over.notify_all();
    }

    /// Back to blocking reads for good; the governor thread ends.
    pub fn stop(&self) {
        if !self.stopped.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "FUSE device polled {} times, stopped {} times for threads waiting for a CPU",
                self.started.load(Ordering::Relaxed),
                self.held_off.load(Ordering::Relaxed)
            );
        }
        self.stop_polling();
        if let Some(governor) = self.governor.get() {
            governor.unpark();
        }
    }

    /// Back to blocking reads, and the resting workers back to the device.
    fn stop_polling(&self) {
        if let Some(device) = self.device.get() {
            let _switch = self.lock();
            set_nonblocking(device, false);
            self.polling.store(false, Ordering::Relaxed);
        }
        self.end_rest();
    }

    /// The flag and whether the device is non-blocking, read together.
    #[cfg(test)]
    fn mode(&self) -> (bool, bool) {
        let _switch = self.lock();
        let device = self.device.get().expect("attached");
        let flags = fcntl(device, FcntlArg::F_GETFL).unwrap();
        (
            self.polling.load(Ordering::Relaxed),
            OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK),
        )
    }

    /// One look while polling, at the end of a window: back to blocking reads if the
    /// window served too few requests for the spinning to pay (the caller spends its
    /// time computing, on a CPU the spinning may share: `npm ci` was slower polled), or
    /// threads wait for a CPU.
    fn check(&self, watch: &mut Watch) {
        let requests = self.requests.load(Ordering::Relaxed);
        let served = requests.saturating_sub(std::mem::replace(&mut watch.requests_seen, requests));
        let sparse = served < MIN_REQUESTS_PER_WINDOW;
        let busy = watch.contention.busy();
        if busy {
            self.held_off.fetch_add(1, Ordering::Relaxed);
            let until = self.now_ns() + watch.backoff.contended().as_nanos() as u64;
            self.held_off_until_ns.store(until, Ordering::Relaxed);
        } else {
            watch.backoff.calm();
        }
        if sparse || busy {
            self.stop_polling();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.switch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// The governor: while polling, looks every [`IDLE`] whether to stop. Holds only a weak
/// reference, so it ends within a second of the last owner going away.
fn govern(weak: &Weak<RequestPolling>, cpus: usize) {
    let mut watch = Watch {
        contention: Contention::open(cpus),
        backoff: Backoff::default(),
        requests_seen: 0,
    };
    let mut watching = false;
    loop {
        let Some(polling) = weak.upgrade() else {
            return;
        };
        if polling.stopped.load(Ordering::Relaxed) {
            return;
        }
        if !polling.polling.load(Ordering::Relaxed) {
            watching = false;
            drop(polling);
            thread::park_timeout(Duration::from_secs(1));
            continue;
        }
        if !watching {
            // A new episode: its first window counts from here.
            watch.requests_seen = polling.requests.load(Ordering::Relaxed);
            watch.contention.reset();
            watching = true;
        }
        drop(polling);
        thread::sleep(IDLE);
        if let Some(polling) = weak.upgrade() {
            polling.check(&mut watch);
        }
    }
}

/// What the governor remembers between its looks.
struct Watch {
    contention: Contention,
    backoff: Backoff,
    /// The request count at the last look.
    requests_seen: u64,
}

/// How long polling stays off after contention. A workload that keeps the CPUs busy
/// (an `npm ci`: node and its thread pool, with requests in bursts) meets contention
/// again each time polling resumes; every such stop doubles the hold-off, and only
/// [`CALM_WINDOWS`] windows of polling without contention bring it back.
struct Backoff {
    hold_off: Duration,
    calm_windows: u32,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            hold_off: HOLD_OFF,
            calm_windows: 0,
        }
    }
}

impl Backoff {
    /// A window of polling without contention.
    fn calm(&mut self) {
        self.calm_windows += 1;
        if self.calm_windows >= CALM_WINDOWS {
            self.hold_off = HOLD_OFF;
        }
    }

    /// Contention: the hold-off to apply now.
    fn contended(&mut self) -> Duration {
        let hold_off = self.hold_off;
        self.hold_off = (self.hold_off * 2).min(HOLD_OFF_MAX);
        self.calm_windows = 0;
        hold_off
    }
}

/// Whether threads are waiting for a CPU: the signal to stop spinning.
enum Contention {
    /// Pressure stall information: the time in which some thread waited for a CPU.
    Pressure {
        file: File,
        last: Option<(Instant, u64)>,
    },
    /// Without PSI (Debian kernels boot with it off): the runnable count of
    /// `/proc/loadavg`, a snapshot, so only a count that stays high counts.
    Runnable {
        file: File,
        cpus: usize,
        strikes: u32,
    },
    Unknown,
}

/// Above this share of the last window with some thread waiting for a CPU, stop.
const PRESSURE_MAX: f64 = 0.1;
/// Consecutive windows with too many runnable threads before stopping.
const RUNNABLE_STRIKES: u32 = 3;

impl Contention {
    fn open(cpus: usize) -> Contention {
        if let Ok(file) = File::open("/proc/pressure/cpu") {
            if stalled_us(&file).is_some() {
                return Contention::Pressure { file, last: None };
            }
        }
        match File::open("/proc/loadavg") {
            Ok(file) => Contention::Runnable {
                file,
                cpus,
                strikes: 0,
            },
            Err(_) => Contention::Unknown,
        }
    }

    /// Forgets the last reading: the next window starts fresh.
    fn reset(&mut self) {
        match self {
            Contention::Pressure { last, .. } => *last = None,
            Contention::Runnable { strikes, .. } => *strikes = 0,
            Contention::Unknown => {}
        }
    }

    fn busy(&mut self) -> bool {
        match self {
            Contention::Pressure { file, last } => {
                let Some(total) = stalled_us(file) else {
                    return false;
                };
                let now = Instant::now();
                let busy = last.is_some_and(|(at, before)| {
                    let window_us = now.duration_since(at).as_micros().max(1) as f64;
                    total.saturating_sub(before) as f64 > PRESSURE_MAX * window_us
                });
                *last = Some((now, total));
                busy
            }
            Contention::Runnable {
                file,
                cpus,
                strikes,
            } => {
                // This thread is running while it reads the count, and so is the
                // spinning reader: with the caller, `cpus + 1` on a machine with a CPU
                // for each.
                let crowded = runnable_threads(file).is_some_and(|n| n > *cpus + 1);
                *strikes = if crowded { *strikes + 1 } else { 0 };
                *strikes >= RUNNABLE_STRIKES
            }
            Contention::Unknown => false,
        }
    }
}

/// Microseconds in which some thread waited for a CPU since boot: `total=` of the
/// `some` line of `/proc/pressure/cpu`. None where PSI is off (reads fail).
fn stalled_us(pressure: &File) -> Option<u64> {
    let mut buf = [0u8; 256];
    let n = pressure.read_at(&mut buf, 0).ok()?;
    parse_stalled(std::str::from_utf8(&buf[..n]).ok()?)
}

fn parse_stalled(pressure: &str) -> Option<u64> {
    let some = pressure.lines().find(|line| line.starts_with("some "))?;
    some.split_ascii_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Sets or clears `O_NONBLOCK`; false (and logged) if the kernel refuses.
fn set_nonblocking(device: &OwnedFd, on: bool) -> bool {
    let result = fcntl(device, FcntlArg::F_GETFL).and_then(|flags| {
        let mut flags = OFlag::from_bits_truncate(flags);
        flags.set(OFlag::O_NONBLOCK, on);
        fcntl(device, FcntlArg::F_SETFL(flags))
    });
    match result {
        Ok(_) => true,
        Err(err) => {
            tracing::warn!("cannot switch the FUSE device's reads (O_NONBLOCK = {on}): {err}");
            false
        }
    }
}

/// The number of runnable threads on the machine: the fourth field of `/proc/loadavg`,
/// `running/total`.
fn runnable_threads(load: &File) -> Option<usize> {
    let mut buf = [0u8; 128];
    let n = load.read_at(&mut buf, 0).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

fn parse_runnable(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_doubles_the_hold_off_and_calm_resets_it() {
        let mut backoff = Backoff::default();
        assert_eq!(backoff.contended(), HOLD_OFF);
        assert_eq!(backoff.contended(), HOLD_OFF * 2);
        for _ in 0..CALM_WINDOWS - 1 {
            backoff.calm();
        }
        assert_eq!(backoff.contended(), HOLD_OFF * 4, "calm too short to reset");
        for _ in 0..10 {
            backoff.contended();
        }
        assert_eq!(backoff.contended(), HOLD_OFF_MAX);
        for _ in 0..CALM_WINDOWS {
            backoff.calm();
        }
        assert_eq!(backoff.contended(), HOLD_OFF);
    }

    #[test]
    fn parses_the_cpu_stall_total_of_psi() {
        let psi = "some avg10=1.49 avg60=3.03 avg300=2.16 total=4317298389\n\
                   full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_stalled(psi), Some(4_317_298_389));
        assert_eq!(parse_stalled("full avg10=0.00 total=7\n"), None);
        assert_eq!(parse_stalled("some avg10=0.00\n"), None);
    }

    #[test]
    fn parses_the_runnable_count_of_loadavg() {
        assert_eq!(parse_runnable("0.52 0.58 0.59 3/345 12345\n"), Some(3));
        assert_eq!(parse_runnable("0.52 0.58 0.59\n"), None);
        assert_eq!(parse_runnable("0.52 0.58 0.59 x/345 1\n"), None);
        let here = File::open("/proc/loadavg").unwrap();
        assert!(
            runnable_threads(&here).unwrap() >= 1,
            "this thread is running"
        );
    }

    /// A poller for `workers` attached to a pipe, which stands in for the device (only
    /// its mode is watched; keep the writer alive); None on one CPU, where it never
    /// polls.
    fn attached(workers: usize) -> Option<(Arc<RequestPolling>, OwnedFd)> {
        if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return None;
        }
        let (reader, writer) = nix::unistd::pipe().unwrap();
        let polling = RequestPolling::new(workers);
        polling.request_arrived(); // before attach: nothing to switch
        polling.attach(reader).unwrap();
        Some((polling, writer))
    }

    /// Requests every 100 µs for `span`, by the clock.
    fn requests_for(polling: &RequestPolling, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            polling.request_arrived();
            thread::sleep(Duration::from_micros(100));
        }
    }

    #[test]
    fn a_short_run_of_requests_starts_nothing() {
        let Some((polling, _writer)) = attached(1) else {
            return;
        };
        // A command's worth of requests, twice, with a pause between that breaks the
        // row: however the threads are scheduled, no row gets long enough.
        let command = Duration::from_millis(5);
        assert!(command.as_nanos() / IDLE.as_nanos() + 1 < BUSY_WINDOWS_BEFORE_POLLING as u128);
        requests_for(&polling, command);
        assert_eq!(
            polling.mode(),
            (false, false),
            "a short run started polling"
        );
        thread::sleep(IDLE * 3);
        requests_for(&polling, command);
        assert_eq!(
            polling.mode(),
            (false, false),
            "the pause did not break the row"
        );
        polling.stop();
    }

    #[test]
    fn polls_while_requests_come_and_blocks_when_they_stop() {
        let Some((polling, _writer)) = attached(1) else {
            return;
        };
        assert_eq!(polling.mode(), (false, false));
        // Requests coming: polling starts (after a hold-off, if this machine is busy).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            polling.request_arrived();
            let mode = polling.mode();
            assert_eq!(mode.0, mode.1, "flag and descriptor disagree");
            if mode.0 {
                break;
            }
            assert!(Instant::now() < deadline, "never polled");
            thread::sleep(Duration::from_micros(100));
        }
        // No more requests: the governor switches back within a few idle windows.
        let deadline = Instant::now() + Duration::from_secs(10);
        while polling.mode().0 {
            assert!(Instant::now() < deadline, "still polling with no requests");
            thread::sleep(IDLE);
        }
        assert_eq!(polling.mode(), (false, false));
        // Lone requests, each more than a window after the last, start nothing.
        for _ in 0..5 {
            thread::sleep(IDLE * 2);
            polling.request_arrived();
            assert_eq!(
                polling.mode(),
                (false, false),
                "a lone request started polling"
            );
        }
        polling.stop();
        polling.request_arrived();
        assert_eq!(polling.mode(), (false, false), "polling after stop");
    }

    #[test]
    fn all_workers_but_one_rest_while_polling() {
        let Some((polling, _writer)) = attached(2) else {
            return;
        };
        // Two workers serve requests back to back until one of them has rested (or for
        // 10 s, on a machine too busy to poll); the other goes on meanwhile, so polling
        // goes on, and the rest ends once both stop and polling stops.
        let worker = |polling: Arc<RequestPolling>| {
            move || {
                let end = Instant::now() + Duration::from_secs(10);
                while Instant::now() < end && polling.rests.load(Ordering::Relaxed) == 0 {
                    polling.request_arrived();
                    polling.request_done();
                    let resting = *polling.resting.lock().unwrap();
                    assert!(resting <= 1, "{resting} of 2 workers rest");
                    thread::sleep(Duration::from_micros(50));
                }
            }
        };
        let workers: Vec<_> = (0..2)
            .map(|_| thread::spawn(worker(Arc::clone(&polling))))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !workers.iter().all(|w| w.is_finished()) {
            assert!(Instant::now() < deadline, "a worker rested for good");
            thread::sleep(IDLE);
        }
        for w in workers {
            w.join().unwrap();
        }
        assert!(
            polling.rests.load(Ordering::Relaxed) > 0,
            "no worker rested while polling"
        );
        assert_eq!(*polling.resting.lock().unwrap(), 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while polling.mode().0 {
            assert!(Instant::now() < deadline, "still polling with no requests");
            thread::sleep(IDLE);
        }
        polling.stop();
    }
}
