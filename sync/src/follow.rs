//! Following an upstream: the loop that keeps a replica in sync for as long as it runs
//! (`computerd mount --remote`).
//!
//! The loop connects, passes the gate as the replica's peer, asks the server to tell it
//! when its revision moves, and runs a sync (pull, then push) whenever either side
//! changed: the server's listener fired, or the local revision moved or files were
//! written and closed (polled every [`FollowOptions::poll_interval`], without SQL).
//!
//! A sync that fails is *pending*: the loop retries it with [`Backoff`] (bounded
//! exponential delays, a bounded number of attempts; progress resets the count), and
//! after the attempts run out keeps trying every [`RetryPolicy::max_delay`], so a
//! replica that lost its server catches up when the server returns. The changes a
//! pending sync covers are never held in memory: they are the replica's database after
//! its cursor, so the intent to retry survives a restart of either side (a restarted
//! daemon finds them unpushed and syncs).
//!
//! Callers wait for a sync with [`Follower::sync`] (the next attempt's outcome) or
//! [`Follower::wait`] (until an [`Intent`] is complete). They get
//! [`SyncOutcome::Pending`] when the attempt fails, never a silent success, and
//! [`SyncOutcome::Lost`] for an intent of another replica (one whose database was lost
//! and created anew): a fresh replica has nothing of the old one's, so completing the
//! old intent from it would be a lie.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use computer_vfs::{Revision, Workspace};
use tokio::sync::mpsc;

use crate::replica::AppliedObserver;
use crate::rpc::{self, Address, ConnectOptions, RemoteUpstream};
use crate::{Backoff, BatchLimits, ClientInfo, Error, Next, Replica, RetryPolicy, SyncReport};

/// How a follower connects and retries.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    pub address: Address,
    pub token: Vec<u8>,
    /// The name the server keeps this replica's cursors under; stable across restarts.
    pub peer: String,
    pub limits: BatchLimits,
    pub retry: RetryPolicy,
    pub connect: ConnectOptions,
    /// How often local changes are looked for.
    pub poll_interval: Duration,
    /// How long [`Follower::stop`] may spend pushing what is left.
    pub final_sync_timeout: Duration,
    /// How far local writers may run ahead of the sync before they are held back.
    pub backlog: BacklogLimits,
}

/// The bound on what a replica holds unsynced. The follower measures its backlog (at
/// most every 200 ms, and at every wakeup while writers wait) and gives the
/// workspace's write gate the room left under `nodes`, none once `bytes` is reached:
/// operations that add to the tree wait for room, and fail with ENOSPC after
/// `wait_max` if the sync does not make any (its link is down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BacklogLimits {
    /// Changed paths (nodes) not yet pushed.
    pub nodes: u64,
    /// Content of the changed files not yet pushed.
    pub bytes: u64,
    /// How long a held-back writer waits before its operation fails.
    pub wait_max: Duration,
}

impl Default for BacklogLimits {
    fn default() -> BacklogLimits {
        BacklogLimits {
            nodes: 100_000,
            bytes: 1 << 30,
            wait_max: Duration::from_secs(60),
        }
    }
}

impl FollowOptions {
    pub fn new(address: Address, token: Vec<u8>, peer: String) -> FollowOptions {
        FollowOptions {
            address,
            token,
            peer,
            limits: BatchLimits::default(),
            retry: RetryPolicy::default(),
            connect: ConnectOptions::default(),
            poll_interval: Duration::from_millis(50),
            final_sync_timeout: Duration::from_secs(10),
            backlog: BacklogLimits::default(),
        }
    }
}

/// Changes of one replica up to one of its revisions: what a caller waits to see on the
/// server. Written `REPLICA_ID@REVISION`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub replica_id: String,
    pub revision: Revision,
}

impl std::fmt::Display for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.replica_id, self.revision.0)
    }
}

impl std::str::FromStr for Intent {
    type Err = String;

    fn from_str(text: &str) -> Result<Intent, String> {
        let (id, revision) = text
            .rsplit_once('@')
            .ok_or_else(|| format!("{text:?}: an intent is REPLICA_ID@REVISION"))?;
        let revision = revision
            .parse::<u64>()
            .map_err(|_| format!("{text:?}: the revision is not a number"))?;
        if id.is_empty() {
            return Err(format!("{text:?}: no replica id"));
        }
        // A replica id is a word (hex digits, as the store makes them): an intent
        // travels in one-line requests, where a space or a newline would end it.
        let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if !id.chars().all(word) {
            return Err(format!("{text:?}: a replica id is one word"));
        }
        Ok(Intent {
            replica_id: id.to_owned(),
            revision: Revision(revision),
        })
    }
}

/// How a sync a caller waited for ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The intent's changes are on the server (and the server's, as of the sync, here).
    Complete { intent: Intent, report: SyncReport },
    /// The sync failed for now; the follower retries it. `retry_in` is `None` once the
    /// attempts ran out (it then tries again every maximum delay).
    Pending {
        intent: Intent,
        reason: String,
        failures: u32,
        retry_in: Option<Duration>,
        /// The attempt pulled everything the server had: this replica is up to date
        /// with it, and only its own changes wait (say, for room to store them).
        pulled: bool,
    },
    /// The changes can never reach the server: the replica that held them is gone, or
    /// the server gave this replica's peer name to another.
    Lost { intent: Intent, reason: String },
    /// Retrying cannot help until someone acts: the server refused us (token, protocol
    /// version, another workspace).
    Refused { intent: Intent, reason: String },
}

impl SyncOutcome {
    pub fn intent(&self) -> &Intent {
        match self {
            SyncOutcome::Complete { intent, .. }
            | SyncOutcome::Pending { intent, .. }
            | SyncOutcome::Lost { intent, .. }
            | SyncOutcome::Refused { intent, .. } => intent,
        }
    }
}

/// Where the follower stands, for status displays and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowStatus {
    pub connected: bool,
    /// Why the last attempt failed, while failures go on.
    pub last_error: Option<String>,
    /// Failed attempts since the last progress.
    pub failures: u32,
    /// Syncs that completed since the start.
    pub syncs: u64,
    /// The server gave our peer name to another replica: nothing here syncs any more.
    pub replaced: bool,
    /// What waits to be pushed, as last measured.
    pub backlog: computer_vfs::Backlog,
    /// Whether writers are held back (the backlog passed its bound).
    pub held_back: bool,
}

/// A request to the loop.
enum Request {
    Sync(Waiter),
    Stop(std::sync::mpsc::SyncSender<()>),
}

/// A caller waiting for an outcome.
struct Waiter {
    intent: Intent,
    /// Answer with the next attempt's outcome, success or not; else only once complete
    /// (or lost, or past the deadline).
    first_attempt: bool,
    deadline: Instant,
    answer: std::sync::mpsc::SyncSender<SyncOutcome>,
}

/// The handle of a running follower. Dropping it stops the loop (without the final
/// push of [`Follower::stop`]).
pub struct Follower {
    client: SyncClient,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Asks a running follower for syncs; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct SyncClient {
    requests: mpsc::UnboundedSender<Request>,
    status: Arc<Mutex<FollowStatus>>,
    workspace: Workspace,
}

impl Follower {
    /// Starts following on a thread of its own. `observer` hears the paths of every
    /// page pulled (after it committed).
    pub fn start(
        workspace: Workspace,
        options: FollowOptions,
        observer: Option<AppliedObserver>,
    ) -> std::io::Result<Follower> {
        if let Err(why) = options.retry.validate() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
        }
        let (requests, inbox) = mpsc::unbounded_channel();
        let status = Arc::new(Mutex::new(FollowStatus::default()));
        let follower = Follow {
            seed: seed_of(workspace.id()),
            workspace: workspace.clone(),
            options,
            observer,
            status: status.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("sync".into())
            .spawn(move || {
                if let Err(err) = rpc::run_local(follower.run(inbox)) {
                    tracing::error!("the sync loop could not start: {err}");
                }
            })?;
        Ok(Follower {
            client: SyncClient {
                requests,
                status,
                workspace,
            },
            thread: Some(thread),
        })
    }

    pub fn client(&self) -> SyncClient {
        self.client.clone()
    }

    /// Pushes what is left (within the final sync timeout) and stops the loop.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let (done, stopped) = std::sync::mpsc::sync_channel(1);
        if self.client.requests.send(Request::Stop(done)).is_ok() {
            let _ = stopped.recv();
        }
        let _ = thread.join();
    }
}

impl std::ops::Deref for Follower {
    type Target = SyncClient;

    fn deref(&self) -> &SyncClient {
        &self.client
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl SyncClient {
    /// This replica's changes so far, as an intent.
    pub fn intent(&self) -> Result<Intent, Error> {
        Ok(Intent {
            replica_id: self.workspace.id().to_owned(),
            revision: self.workspace.revision()?,
        })
    }

    /// Syncs now and waits for that attempt (at most `timeout`): complete, or pending
    /// with why.
    pub fn sync(&self, timeout: Duration) -> SyncOutcome {
        match self.intent() {
            Ok(intent) => self.ask(intent, true, timeout),
            Err(err) => SyncOutcome::Pending {
                intent: Intent {
                    replica_id: self.workspace.id().to_owned(),
                    revision: Revision(0),
                },
                reason: format!("reading the local revision: {err}"),
                failures: 0,
                retry_in: None,
                pulled: false,
            },
        }
    }

    /// Waits until `intent` is complete (through retries), lost, or `timeout` passes
    /// (then pending).
    pub fn wait(&self, intent: Intent, timeout: Duration) -> SyncOutcome {
        self.ask(intent, false, timeout)
    }

    fn ask(&self, intent: Intent, first_attempt: bool, timeout: Duration) -> SyncOutcome {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let waiter = Waiter {
            intent: intent.clone(),
            first_attempt,
            deadline: Instant::now() + timeout,
            answer,
        };
        let pending = |reason: &str| SyncOutcome::Pending {
            intent: intent.clone(),
            reason: reason.to_owned(),
            failures: 0,
            retry_in: None,
            pulled: false,
        };
        if self.requests.send(Request::Sync(waiter)).is_err() {
            return pending("the sync loop has stopped");
        }
        // The loop answers by the deadline, or once the attempt it is in the middle of
        // ends (a large transfer); a little slack for its own timer.
        match answered.recv_timeout(timeout + Duration::from_secs(5)) {
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                pending("not complete in time: a sync is still running")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                pending("the sync loop has stopped")
            }
        }
    }

    pub fn status(&self) -> FollowStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// How often the backlog is measured at most (it costs a scan of what waits).
const BACKLOG_MEASURE_INTERVAL: Duration = Duration::from_millis(200);

fn seed_of(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A live connection: the session and the replica bound to it.
struct Connected {
    upstream: RemoteUpstream,
    replica: Replica,
    server_revisions: tokio::sync::watch::Receiver<Revision>,
}

/// The loop's own state.
struct Follow {
    workspace: Workspace,
    options: FollowOptions,
    observer: Option<AppliedObserver>,
    status: Arc<Mutex<FollowStatus>>,
    seed: u64,
}

/// What ended an attempt.
enum Failure {
    /// May pass: retry with backoff.
    Transient(String),
    /// Our peer name belongs to another replica now.
    Replaced(String),
    /// Refused: retry slowly, someone must act.
    Refused(String),
}

/// An attempt that failed, and how far it got.
struct AttemptFailed {
    failure: Failure,
    /// The cursors moved before it failed.
    progressed: bool,
    /// The pull was complete: only the push failed.
    pulled: bool,
}

impl Failure {
    fn of(error: Error) -> Failure {
        match error {
            Error::Replaced { .. } => Failure::Replaced(error.to_string()),
            Error::Refused(_) => Failure::Refused(error.to_string()),
            // A store error here is ours (disk full, busy): transient or not, the loop
            // can only try again later.
            _ => Failure::Transient(error.to_string()),
        }
    }
}

impl Follow {
    fn set_status(&self, update: impl FnOnce(&mut FollowStatus)) {
        update(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }

    async fn run(self, mut inbox: mpsc::UnboundedReceiver<Request>) {
        let mut backoff = Backoff::new(self.options.retry, self.seed);
        let mut waiters: Vec<Waiter> = Vec::new();
        let mut connection: Option<Connected> = None;
        // When the next attempt may start (now, or after a failure's delay).
        let mut not_before = Instant::now();
        let mut due = true;
        let mut replaced: Option<String> = None;
        let mut last_seen = self.local_mark();
        let mut poll = tokio::time::interval(self.options.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.workspace
            .write_gate()
            .set_wait_max(self.options.backlog.wait_max);
        let mut last_measure = Instant::now();
        self.regulate();
        loop {
            if replaced.is_none() && due && Instant::now() >= not_before {
                let mark = self.local_mark();
                let attempt = self.attempt(&mut connection).await;
                // What the attempt delivered is room for writers.
                last_measure = Instant::now();
                self.regulate();
                match attempt {
                    Ok((report, progressed)) => {
                        due = false;
                        last_seen = mark;
                        backoff.progress();
                        self.set_status(|s| {
                            s.connected = true;
                            s.last_error = None;
                            s.failures = 0;
                            s.syncs += 1;
                        });
                        if progressed || report.moved() {
                            tracing::debug!(
                                pulled = report.pulled,
                                pushed = report.pushed,
                                "synced"
                            );
                        }
                        for conflict in &report.conflicts {
                            tracing::warn!(
                                path = %String::from_utf8_lossy(&conflict.path),
                                kept_as = %String::from_utf8_lossy(&conflict.kept_as),
                                "conflict: both sides changed the path; the other version was kept"
                            );
                        }
                        self.answer_done(&mut waiters, &report);
                    }
                    Err(AttemptFailed {
                        failure,
                        progressed,
                        pulled,
                    }) => {
                        connection = None;
                        if progressed {
                            backoff.progress();
                        }
                        match failure {
                            Failure::Replaced(reason) => {
                                tracing::error!(
                                    "{reason}: this replica's changes can no longer sync; \
                                     mount a new cache to go on"
                                );
                                self.set_status(|s| {
                                    s.connected = false;
                                    s.replaced = true;
                                    s.last_error = Some(reason.clone());
                                });
                                replaced = Some(reason);
                            }
                            Failure::Refused(reason) => {
                                tracing::error!("the server refused this replica: {reason}");
                                not_before = Instant::now() + self.options.retry.max_delay;
                                self.set_status(|s| {
                                    s.connected = false;
                                    s.last_error = Some(reason.clone());
                                });
                                answer_all(&mut waiters, |intent| SyncOutcome::Refused {
                                    intent,
                                    reason: reason.clone(),
                                });
                            }
                            Failure::Transient(reason) => {
                                let delay =
                                    self.pending(&reason, pulled, &mut backoff, &mut waiters);
                                not_before = Instant::now() + delay;
                            }
                        }
                    }
                }
            }
            // Writers waiting for room: measure at every wakeup, not only now and then.
            let waiting = self.workspace.write_gate().waiting() > 0;
            if waiting || last_measure.elapsed() >= BACKLOG_MEASURE_INTERVAL {
                last_measure = Instant::now();
                self.regulate();
            }
            if let Some(reason) = &replaced {
                answer_all(&mut waiters, |intent| SyncOutcome::Lost {
                    intent,
                    reason: reason.clone(),
                });
            }
            self.answer_overdue(&mut waiters, &backoff);

            // Wait for something to do.
            let retry_at = (due && replaced.is_none()).then_some(not_before);
            let deadline = waiters.iter().map(|w| w.deadline).min();
            let wake_at = [retry_at, deadline].into_iter().flatten().min();
            tokio::select! {
                request = inbox.recv() => match request {
                    Some(Request::Sync(waiter)) => {
                        if let Some(outcome) = self.settled(&waiter, replaced.as_deref()) {
                            let _ = waiter.answer.try_send(outcome);
                        } else {
                            // Asked for: try now, whatever the backoff said.
                            due = true;
                            not_before = Instant::now();
                            waiters.push(waiter);
                        }
                    }
                    Some(Request::Stop(done)) => {
                        self.final_sync(&mut connection, replaced.is_some()).await;
                        // Nobody drains the backlog any more: writers must not wait for it.
                        self.workspace.write_gate().open();
                        answer_all(&mut waiters, |intent| SyncOutcome::Pending {
                            intent,
                            reason: "the replica is stopping".into(),
                            failures: 0,
                            retry_in: None,
                            pulled: false,
                        });
                        let _ = done.try_send(());
                        return;
                    }
                    None => return,
                },
                moved = server_moved(&mut connection) => {
                    if moved {
                        due = true;
                    } else {
                        // The listener went with the connection.
                        connection = None;
                        due = true;
                        self.set_status(|s| s.connected = false);
                    }
                }
                _ = poll.tick() => {
                    let mark = self.local_mark();
                    if mark != last_seen {
                        due = true;
                    }
                }
                _ = sleep_until(wake_at) => {}
            }
        }
    }

    /// Measures what waits to be pushed and gives the write gate the room left under
    /// the bound: writers wait once it is used up, until the sync makes more.
    fn regulate(&self) {
        // A cache that never synced has delivered nothing.
        let delivered = self
            .cursors()
            .map_or(Revision(0), |(_, delivered)| delivered.revision);
        let Ok(backlog) = self.workspace.backlog(delivered) else {
            return;
        };
        let limits = self.options.backlog;
        let gate = self.workspace.write_gate();
        let room = if backlog.bytes >= limits.bytes {
            0
        } else {
            limits.nodes.saturating_sub(backlog.nodes)
        };
        let was_held_back = self.status().held_back;
        gate.set_room(
            room,
            "the replica's unsynced backlog is full (the sync is behind)",
        );
        if room == 0 && !was_held_back {
            tracing::warn!(
                nodes = backlog.nodes,
                bytes = backlog.bytes,
                "the unsynced backlog reached its bound: holding writers back until the sync \
                 catches up"
            );
        } else if room > 0 && was_held_back {
            tracing::info!(
                nodes = backlog.nodes,
                bytes = backlog.bytes,
                "writers go on"
            );
        }
        self.set_status(|s| {
            s.backlog = backlog;
            s.held_back = room == 0;
        });
    }

    /// What tells local changes apart: the revision, and files closed but not ingested.
    fn local_mark(&self) -> (Option<Revision>, usize) {
        (
            self.workspace.revision().ok(),
            self.workspace.staged_waiting(),
        )
    }

    /// Connects if needed and syncs once: pulls, then pushes. Reports whether the
    /// cursors moved, even on failure (progress resets the backoff), and on failure
    /// whether the pull was complete.
    async fn attempt(
        &self,
        connection: &mut Option<Connected>,
    ) -> Result<(SyncReport, bool), AttemptFailed> {
        let before = self.cursors();
        let mut report = SyncReport::default();
        let mut pulled = false;
        let outcome = async {
            if connection.is_none() {
                *connection = Some(self.connect().await?);
                self.set_status(|s| s.connected = true);
            }
            let Some(connected) = connection.as_ref() else {
                unreachable!("connected just above");
            };
            let (replica, upstream) = (&connected.replica, &connected.upstream);
            replica.pull(upstream, &mut report).await?;
            pulled = true;
            replica.push(upstream, &mut report).await
        }
        .await;
        let progressed = self.cursors() != before;
        match outcome {
            Ok(()) => Ok((report, progressed)),
            Err(error) => Err(AttemptFailed {
                failure: Failure::of(error),
                progressed,
                pulled,
            }),
        }
    }

    fn cursors(&self) -> Option<(computer_vfs::Cursor, computer_vfs::Cursor)> {
        let record = self.workspace.peer(crate::UPSTREAM).ok()??;
        Some((record.applied, record.delivered))
    }

    async fn connect(&self) -> Result<Connected, Error> {
        let client = ClientInfo {
            replica_id: self.workspace.id().to_owned(),
            peer: self.options.peer.clone(),
        };
        let (upstream, info) = rpc::connect_with(
            &self.options.address,
            &self.options.token,
            client,
            self.options.connect,
        )
        .await?;
        if info.replaced {
            tracing::warn!(
                peer = %self.options.peer,
                "the server knew this peer as another replica: that replica's unsynced changes \
                 are lost to the workspace"
            );
        }
        let mut replica = Replica::attach(self.workspace.clone(), &info, self.options.limits)?;
        if let Some(observer) = &self.observer {
            replica = replica.with_observer(observer.clone());
        }
        let server_revisions = upstream.watch().await?;
        tracing::info!(server = %self.options.address, "connected");
        Ok(Connected {
            upstream,
            replica,
            server_revisions,
        })
    }

    /// The outcome a waiter can have without an attempt: lost (another replica's
    /// intent, or we were replaced), or complete (nothing of it is left to push).
    fn settled(&self, waiter: &Waiter, replaced: Option<&str>) -> Option<SyncOutcome> {
        let intent = waiter.intent.clone();
        if intent.replica_id != self.workspace.id() {
            return Some(SyncOutcome::Lost {
                reason: format!(
                    "the changes were made on replica {}, which is gone: this is replica {} \
                     (its database was created anew)",
                    intent.replica_id,
                    self.workspace.id()
                ),
                intent,
            });
        }
        if let Some(reason) = replaced {
            return Some(SyncOutcome::Lost {
                intent,
                reason: reason.to_owned(),
            });
        }
        if !waiter.first_attempt && self.covered(&intent) {
            return Some(SyncOutcome::Complete {
                intent,
                report: SyncReport::default(),
            });
        }
        None
    }

    /// Whether nothing this replica changed up to the intent's revision waits to be
    /// pushed.
    fn covered(&self, intent: &Intent) -> bool {
        let Ok(Some(record)) = self.workspace.peer(crate::UPSTREAM) else {
            return false;
        };
        match self
            .workspace
            .changes_for(crate::UPSTREAM, &record.delivered, 1, 0)
        {
            Ok(page) => page
                .entries
                .first()
                .is_none_or(|e| e.revision > intent.revision),
            Err(_) => false,
        }
    }

    fn answer_done(&self, waiters: &mut Vec<Waiter>, report: &SyncReport) {
        waiters.retain(|w| {
            if !self.covered(&w.intent) {
                return true;
            }
            let _ = w.answer.try_send(SyncOutcome::Complete {
                intent: w.intent.clone(),
                report: report.clone(),
            });
            false
        });
    }

    /// After a transient failure: counts it, tells the waiters for this attempt that
    /// their sync is pending, and returns how long to wait before the next.
    fn pending(
        &self,
        reason: &str,
        pulled: bool,
        backoff: &mut Backoff,
        waiters: &mut Vec<Waiter>,
    ) -> Duration {
        let next = backoff.failed();
        let failures = backoff.failures();
        let (retry_in, delay) = match next {
            Next::RetryAfter(delay) => (Some(delay), delay),
            Next::GiveUp => {
                tracing::warn!(
                    "sync failed {failures} times: the pending sync is given up (its changes \
                     stay here; trying again every {:?}): {reason}",
                    self.options.retry.max_delay
                );
                // The count starts over for the next pending sync.
                backoff.progress();
                (None, self.options.retry.max_delay)
            }
        };
        tracing::info!("sync pending, retry in {delay:?}: {reason}");
        self.set_status(|s| {
            s.connected = false;
            s.last_error = Some(reason.to_owned());
            s.failures = failures;
        });
        self.answer_pending(waiters, reason, failures, retry_in, pulled);
        delay
    }

    fn answer_pending(
        &self,
        waiters: &mut Vec<Waiter>,
        reason: &str,
        failures: u32,
        retry_in: Option<Duration>,
        pulled: bool,
    ) {
        waiters.retain(|w| {
            if !w.first_attempt {
                return true;
            }
            let _ = w.answer.try_send(SyncOutcome::Pending {
                intent: w.intent.clone(),
                reason: reason.to_owned(),
                failures,
                retry_in,
                pulled,
            });
            false
        });
    }

    fn answer_overdue(&self, waiters: &mut Vec<Waiter>, backoff: &Backoff) {
        let now = Instant::now();
        let last_error = self.status().last_error;
        waiters.retain(|w| {
            if w.deadline > now {
                return true;
            }
            let _ = w.answer.try_send(SyncOutcome::Pending {
                intent: w.intent.clone(),
                reason: match &last_error {
                    Some(error) => {
                        format!("not complete in time; the last attempt failed: {error}")
                    }
                    None => "not complete in time".into(),
                },
                failures: backoff.failures(),
                retry_in: None,
                pulled: false,
            });
            false
        });
    }

    fn status(&self) -> FollowStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// At a stop: one last push of what is left, bounded in time. What does not make
    /// it stays in the database for the next start.
    async fn final_sync(&self, connection: &mut Option<Connected>, replaced: bool) {
        if replaced {
            return;
        }
        let has_unpushed = match connection.as_ref() {
            Some(c) => c.replica.has_unpushed().unwrap_or(true),
            None => true,
        };
        if !has_unpushed {
            return;
        }
        match tokio::time::timeout(self.options.final_sync_timeout, self.attempt(connection)).await
        {
            Ok(Ok(_)) => tracing::info!("pushed the last changes before stopping"),
            Ok(Err(AttemptFailed {
                failure: Failure::Transient(why) | Failure::Refused(why) | Failure::Replaced(why),
                ..
            })) => {
                tracing::warn!("could not push the last changes before stopping (they stay in the cache and sync at the next start): {why}")
            }
            Err(_) => tracing::warn!(
                "the last push did not finish within {:?}; the rest syncs at the next start",
                self.options.final_sync_timeout
            ),
        }
    }
}

fn answer_all(waiters: &mut Vec<Waiter>, outcome: impl Fn(Intent) -> SyncOutcome) {
    for waiter in waiters.drain(..) {
        let _ = waiter.answer.try_send(outcome(waiter.intent.clone()));
    }
}

/// Resolves when the server's revision moves (true) or its listener is gone (false);
/// never without a connection.
async fn server_moved(connection: &mut Option<Connected>) -> bool {
    match connection {
        Some(c) => c.server_revisions.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_read_and_print_back() {
        let intent: Intent = "abc-123@42".parse().unwrap();
        assert_eq!(intent.replica_id, "abc-123");
        assert_eq!(intent.revision, Revision(42));
        assert_eq!(intent.to_string(), "abc-123@42");
        for bad in ["", "abc", "@1", "abc@", "abc@x", "a b@1", "a\nb@1"] {
            assert!(bad.parse::<Intent>().is_err(), "{bad:?}");
        }
    }
}
