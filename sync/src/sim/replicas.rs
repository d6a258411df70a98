//! The replicas: each slot's database, the sync it has in flight (a future polled one
//! step at a time, so its calls interleave with everything else), its pending sync and
//! the ledger in which every pending sync ends: applied, lost with the disk, or given up
//! when its attempts ran out.
//!
//! A sync is [`Replica::pull`] then [`Replica::push`] (what [`Replica::sync`] does),
//! called with a report the attempt keeps even when it fails: whether a failed attempt
//! moved anything is what tells its [`Backoff`] to start counting over.
//!
//! A pending sync lives in the replica process's memory, so a restart of the replica
//! does not end it: the restarted process finds the same unpushed changes and goes on
//! with a fresh backoff (the record continues). A disk loss ends it as lost.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use computer_vfs::{Cursor, PeerState, Workspace};

use super::net::{self, Link, Shared};
use super::{ensure, open_workspace, short_id, Check, Side, Sim, POLLS_PER_SYNC_MAX};
use crate::{Backoff, BatchLimits, Next, Replica, RetryPolicy, ServerInfo, SyncReport, UPSTREAM};

/// What one sync attempt ended with.
pub(crate) struct Outcome {
    /// The server's answer to hello, if it came.
    info: Option<ServerInfo>,
    /// The replica attached by this attempt, if it got that far.
    replica: Option<Replica>,
    /// What moved before the attempt ended, however it ended.
    report: SyncReport,
    result: crate::Result<()>,
}

type SyncFuture = Pin<Box<dyn Future<Output = Outcome>>>;

/// Polls of a sync one step makes, at most: a call is two.
const POLLS_PER_STEP_MAX: u64 = 4;

/// A sync in flight, with what was true when it started (what the audit after a
/// successful sync holds it to).
pub(crate) struct Attempt {
    future: SyncFuture,
    polls: usize,
    /// The step it started at.
    started: u64,
    /// The replica's local-operation count when it started: its log writes made up to
    /// here must be on the server once it succeeds.
    pub(crate) ops_at_start: u64,
    /// The log writes known to be on the server when it started (indices into
    /// `Sim::writes`, ascending): they must be on the replica once it succeeds.
    pub(crate) on_server_at_start: Vec<usize>,
    /// The replica's upstream record when it started: a failed attempt that moved it
    /// made progress.
    record_at_start: Option<PeerState>,
}

/// A pending sync: the replica has something to push, or its last sync failed.
pub(crate) struct Pending {
    /// Its entry in `Sim::ledger`.
    pub(crate) record: usize,
    pub(crate) backoff: Backoff,
    /// When the next attempt is due (virtual time since the start).
    pub(crate) due: Duration,
}

/// How a pending sync ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// A sync succeeded and left nothing to push.
    Applied,
    /// The replica's disk was lost with it.
    Lost,
    /// Its attempts ran out; the changes stay, and a later change or round opens a new one.
    GaveUp,
}

/// One pending sync, from its opening to its end.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) replica: usize,
    pub(crate) generation: u32,
    pub(crate) opened: u64,
    pub(crate) why: &'static str,
    /// Attempts made for it.
    pub(crate) attempts: u32,
    /// How and at which step it ended.
    pub(crate) end: Option<(End, u64)>,
}

/// One replica: its database (a new one after each disk loss) and its sync state.
pub(crate) struct Slot {
    /// The peer name it syncs as, the same for every database it ever has.
    pub(crate) peer: String,
    /// `None` only inside a restart, between closing the database and reopening it.
    workspace: Option<Workspace>,
    /// Counts the databases this slot had: 0 until the first disk loss.
    pub(crate) generation: u32,
    pub(crate) limits: BatchLimits,
    /// Attached by the last hello that came back; gone with the process.
    replica: Option<Replica>,
    pub(crate) attempt: Option<Attempt>,
    pub(crate) pending: Option<Pending>,
    /// Local operations made on this replica, every generation together.
    pub(crate) ops: u64,
    /// The replica's upstream record as last seen, for monotonicity.
    pub(crate) upstream_seen: Option<PeerState>,
}

impl Slot {
    pub(crate) fn new(index: usize, workspace: Workspace, limits: BatchLimits) -> Slot {
        Slot {
            peer: format!("r{index}"),
            workspace: Some(workspace),
            generation: 0,
            limits,
            replica: None,
            attempt: None,
            pending: None,
            ops: 0,
            upstream_seen: None,
        }
    }

    pub(crate) fn workspace(&self) -> &Workspace {
        self.workspace
            .as_ref()
            .expect("a replica's database is open between steps")
    }

    /// Everything of the replica process goes: its sync in flight, its attached replica,
    /// its database handle. (Its connections are the world's to close.)
    fn process_dies(&mut self) -> bool {
        let had_attempt = self.attempt.take().is_some();
        self.replica = None;
        self.workspace = None;
        had_attempt
    }
}

/// The sync of replica `index`, as a future: hello through the faulty network, attach,
/// pull, push. Holds no borrow of the world across a yield.
fn sync_future(
    world: Shared,
    index: usize,
    peer: String,
    workspace: Workspace,
    limits: BatchLimits,
) -> SyncFuture {
    Box::pin(async move {
        let mut outcome = Outcome {
            info: None,
            replica: None,
            report: SyncReport::default(),
            result: Ok(()),
        };
        let replica_id = workspace.id().to_owned();
        let (connection, info) = match net::hello(&world, index, &peer, &replica_id).await {
            Ok(answer) => answer,
            Err(e) => {
                outcome.result = Err(e);
                return outcome;
            }
        };
        outcome.info = Some(info.clone());
        let replica = match Replica::attach(workspace, &info, limits) {
            Ok(replica) => replica,
            Err(e) => {
                world.borrow_mut().close(connection);
                outcome.result = Err(e);
                return outcome;
            }
        };
        let link = Link {
            world: world.clone(),
            replica: index,
            connection,
        };
        let result = pull_then_push(&replica, &link, &mut outcome.report).await;
        drop(link);
        world.borrow_mut().close(connection);
        outcome.replica = Some(replica);
        outcome.result = result;
        outcome
    })
}

async fn pull_then_push(
    replica: &Replica,
    link: &Link,
    report: &mut SyncReport,
) -> crate::Result<()> {
    replica.pull(link, report).await?;
    replica.push(link, report).await
}

/// Whether `after` is past `before` in either cursor.
fn moved(before: &Option<PeerState>, after: &Option<PeerState>) -> bool {
    match (before, after) {
        (None, None) => false,
        (None, Some(after)) => after.applied != Cursor::START || after.delivered != Cursor::START,
        (Some(_), None) => false,
        (Some(before), Some(after)) => {
            before.applied != after.applied || before.delivered != after.delivered
        }
    }
}

fn describe_report(report: &SyncReport) -> String {
    let conflicts: Vec<String> = report
        .conflicts
        .iter()
        .map(|c| {
            format!(
                "{} kept as {}",
                String::from_utf8_lossy(&c.path),
                String::from_utf8_lossy(&c.kept_as)
            )
        })
        .collect();
    format!(
        "pulled {}, pushed {}, blocks in/out {}/{}, conflicts [{}]",
        report.pulled,
        report.pushed,
        report.blocks_in,
        report.blocks_out,
        conflicts.join(", ")
    )
}

impl Sim {
    /// Whether replica `index` holds changes its upstream lacks: [`Replica::has_unpushed`]
    /// once a hello attached it; before that (a new database, a restarted process), the
    /// same question asked of its record directly.
    pub(super) fn unpushed(&self, index: usize) -> Result<bool, String> {
        let slot = &self.slots[index];
        if let Some(replica) = &slot.replica {
            return replica
                .has_unpushed()
                .map_err(|e| format!("r{index}: has_unpushed: {e}"));
        }
        let ws = slot.workspace();
        let from = match ws.peer(UPSTREAM) {
            Ok(record) => record.map(|r| r.delivered).unwrap_or(Cursor::START),
            Err(e) => return Err(format!("r{index}: reading its upstream record: {e}")),
        };
        let page = ws
            .changes_for(UPSTREAM, &from, 1, 0)
            .map_err(|e| format!("r{index}: reading its changes: {e}"))?;
        Ok(!page.entries.is_empty() || !page.complete)
    }

    /// The reference policy (1 s doubling, 5 attempts), with or without jitter.
    fn new_backoff(&self) -> Backoff {
        let policy = RetryPolicy {
            jitter: if self.chance(50) { 0.0 } else { 0.5 },
            ..RetryPolicy::default()
        };
        Backoff::new(policy, self.choose(u64::from(u32::MAX)))
    }

    /// Opens a pending sync for replica `index`, due now.
    pub(super) fn open_pending(&mut self, index: usize, why: &'static str) {
        debug_assert!(self.slots[index].pending.is_none());
        let backoff = self.new_backoff();
        let record = self.ledger.len();
        self.ledger.push(Record {
            replica: index,
            generation: self.slots[index].generation,
            opened: self.step,
            why,
            attempts: 0,
            end: None,
        });
        self.slots[index].pending = Some(Pending {
            record,
            backoff,
            due: self.now,
        });
        self.note(format!("r{index}: pending sync #{record} opens ({why})"));
    }

    /// Ends the pending sync of replica `index`.
    fn end_pending(&mut self, index: usize, end: End) {
        let Some(pending) = self.slots[index].pending.take() else {
            return;
        };
        let record = &mut self.ledger[pending.record];
        debug_assert!(record.end.is_none());
        record.end = Some((end, self.step));
        let attempts = record.attempts;
        match end {
            End::Applied => self.summary.pending_applied += 1,
            End::Lost => self.summary.pending_lost += 1,
            End::GaveUp => self.summary.pending_gave_up += 1,
        }
        self.note(format!(
            "r{index}: pending sync #{} ends {end:?} after {attempts} attempt(s)",
            pending.record
        ));
    }

    /// Opens a pending sync if replica `index` has something to push and none is open.
    pub(super) fn pending_if_unpushed(&mut self, index: usize, why: &'static str) -> Check {
        if self.slots[index].pending.is_none() && self.unpushed(index)? {
            self.open_pending(index, why);
        }
        Ok(())
    }

    /// Starts a sync of replica `index`: a retry of its pending sync, or a round.
    fn start_attempt(&mut self, index: usize) -> Check {
        self.pending_if_unpushed(index, "a round found changes")?;
        let on_server_at_start = (0..self.writes.len())
            .filter(|&i| self.writes[i].on_server)
            .collect();
        let slot = &self.slots[index];
        let record_at_start = slot
            .workspace()
            .peer(UPSTREAM)
            .map_err(|e| format!("r{index}: reading its upstream record: {e}"))?;
        let future = sync_future(
            self.world.clone(),
            index,
            slot.peer.clone(),
            slot.workspace().clone(),
            slot.limits,
        );
        let attempt = Attempt {
            future,
            polls: 0,
            started: self.step,
            ops_at_start: slot.ops,
            on_server_at_start,
            record_at_start,
        };
        let what = match &slot.pending {
            Some(pending) => {
                let record = &mut self.ledger[pending.record];
                record.attempts += 1;
                format!(
                    "pending sync #{}, attempt {}",
                    pending.record, record.attempts
                )
            }
            None => "a round".to_owned(),
        };
        self.slots[index].attempt = Some(attempt);
        self.note(format!("r{index}: sync starts ({what})"));
        Ok(())
    }

    /// Polls the sync of replica `index` once; returns it with its outcome once it ends.
    fn poll_attempt(&mut self, index: usize) -> Option<(Attempt, Outcome)> {
        let attempt = self.slots[index]
            .attempt
            .as_mut()
            .expect("polled a sync in flight");
        attempt.polls += 1;
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match attempt.future.as_mut().poll(&mut cx) {
            Poll::Ready(outcome) => {
                let attempt = self.slots[index].attempt.take().expect("just polled");
                Some((attempt, outcome))
            }
            Poll::Pending => None,
        }
    }

    /// One step of replica `index`'s sync: one to four polls of the one in flight (or
    /// of a new one, if none is and no pending sync waits for its delay).
    pub(super) fn poll_replica(&mut self, index: usize) -> Check {
        let polls = 1 + self.choose(POLLS_PER_STEP_MAX);
        if self.slots[index].attempt.is_none() {
            if let Some(pending) = &self.slots[index].pending {
                if pending.due > self.now {
                    let wait = pending.due - self.now;
                    self.note(format!(
                        "r{index}: pending sync #{} waits {}ms more",
                        pending.record,
                        wait.as_millis()
                    ));
                    return Ok(());
                }
            }
            self.start_attempt(index)?;
        } else {
            self.note(format!("r{index}: sync goes on"));
        }
        for _ in 0..polls {
            if let Some((attempt, outcome)) = self.poll_attempt(index) {
                return self.attempt_ended(index, attempt, outcome);
            }
        }
        Ok(())
    }

    /// What an ended attempt means: the audit of a successful sync, the pending sync
    /// applied or retried with backoff.
    fn attempt_ended(&mut self, index: usize, attempt: Attempt, outcome: Outcome) -> Check {
        let Outcome {
            info,
            replica,
            report,
            result,
        } = outcome;
        self.summary.conflicts += report.conflicts.len() as u64;
        if let Some(info) = &info {
            if info.replaced {
                ensure!(
                    self.slots[index].generation > 0,
                    "the server reported r{index}'s first database as a replacement"
                );
                self.note(format!(
                    "r{index}: the server reports that {} replaced an older replica",
                    short_id(self.slots[index].workspace().id())
                ));
            }
        }
        if let Some(replica) = replica {
            self.slots[index].replica = Some(replica);
        }
        match result {
            Ok(()) => {
                self.summary.syncs_ok += 1;
                self.note(format!(
                    "r{index}: sync ok after {} polls (started at step {}): {}",
                    attempt.polls,
                    attempt.started,
                    describe_report(&report)
                ));
                self.check_synced(index, &attempt)?;
                if self.slots[index].pending.is_some() {
                    if self.unpushed(index)? {
                        // Changed again while it ran: the same pending sync goes on.
                        let now = self.now;
                        let pending = self.slots[index].pending.as_mut().expect("checked");
                        pending.backoff.progress();
                        pending.due = now;
                        self.note(format!("r{index}: changed during the sync, goes on"));
                    } else {
                        self.end_pending(index, End::Applied);
                    }
                } else {
                    self.pending_if_unpushed(index, "changed during a round")?;
                }
                Ok(())
            }
            Err(e) if e.is_transient() => {
                self.summary.syncs_failed += 1;
                self.note(format!(
                    "r{index}: sync failed after {} polls: {e} ({})",
                    attempt.polls,
                    describe_report(&report)
                ));
                if self.slots[index].pending.is_none() {
                    self.open_pending(index, "a sync failed");
                    let record = self.slots[index].pending.as_ref().expect("opened").record;
                    self.ledger[record].attempts += 1;
                }
                let after = self.slots[index]
                    .workspace()
                    .peer(UPSTREAM)
                    .map_err(|e| format!("r{index}: reading its upstream record: {e}"))?;
                let progress = report.moved() || moved(&attempt.record_at_start, &after);
                let now = self.now;
                let pending = self.slots[index].pending.as_mut().expect("opened");
                if progress {
                    pending.backoff.progress();
                }
                match pending.backoff.failed() {
                    Next::RetryAfter(delay) => {
                        pending.due = now + delay;
                        let record = pending.record;
                        self.note(format!(
                            "r{index}: pending sync #{record} retries in {}ms{}",
                            delay.as_millis(),
                            if progress { " (it made progress)" } else { "" }
                        ));
                    }
                    Next::GiveUp => self.end_pending(index, End::GaveUp),
                }
                Ok(())
            }
            Err(e) => Err(format!("r{index}: sync failed for good: {e}")),
        }
    }

    /// Polls replica `index`'s sync in flight to its end (faults are off).
    pub(super) fn finish_in_flight(&mut self, index: usize) -> Check {
        self.note(format!("r{index}: the sync in flight finishes"));
        for _ in 0..POLLS_PER_SYNC_MAX {
            if let Some((attempt, outcome)) = self.poll_attempt(index) {
                return self.attempt_ended(index, attempt, outcome);
            }
        }
        Err(format!(
            "r{index}'s sync in flight did not end within {POLLS_PER_SYNC_MAX} polls"
        ))
    }

    /// One whole sync of replica `index` with faults off (after the pending sync's delay,
    /// if it waits for one). It must succeed: nothing is left to fail it.
    pub(super) fn sync_until_done(&mut self, index: usize) -> Result<SyncReport, String> {
        debug_assert!(self.slots[index].attempt.is_none());
        if let Some(pending) = &self.slots[index].pending {
            if pending.due > self.now {
                let wait = pending.due - self.now;
                self.note(format!(
                    "time passes: {}ms, the delay of r{index}'s pending sync",
                    wait.as_millis()
                ));
                self.advance(wait);
            }
        }
        self.start_attempt(index)?;
        for _ in 0..POLLS_PER_SYNC_MAX {
            let Some((attempt, outcome)) = self.poll_attempt(index) else {
                continue;
            };
            if let Err(e) = &outcome.result {
                return Err(format!("r{index}'s sync failed with faults off: {e}"));
            }
            let report = outcome.report.clone();
            self.attempt_ended(index, attempt, outcome)?;
            return Ok(report);
        }
        Err(format!(
            "r{index}'s sync did not end within {POLLS_PER_SYNC_MAX} polls with faults off"
        ))
    }

    /// The replica process crashes and restarts: its sync in flight is abandoned
    /// mid-call, its connections die, its database is reopened.
    pub(super) fn restart_replica(&mut self, index: usize) -> Check {
        self.note(format!("r{index}: crashes and restarts"));
        self.world.borrow_mut().close_all_of(index);
        let abandoned = self.slots[index].process_dies();
        if abandoned {
            self.summary.syncs_failed += 1;
            self.note(format!("r{index}: its sync in flight is abandoned"));
        }
        let path = self.replica_path(index, self.slots[index].generation);
        let ws = open_workspace(&path, &self.clock)?;
        self.slots[index].workspace = Some(ws);
        if self.slots[index].pending.is_some() {
            // The restarted process finds the changes and syncs at once, counting anew.
            let backoff = self.new_backoff();
            let now = self.now;
            let pending = self.slots[index].pending.as_mut().expect("checked");
            pending.backoff = backoff;
            pending.due = now;
        }
        self.summary.replica_restarts += 1;
        self.check_stores()
    }

    /// Replica `index`'s disk is lost: its database is deleted and a new, empty one
    /// takes its place under the same peer name. What it held that never reached the
    /// server is lost, and known to be.
    pub(super) fn lose_disk(&mut self, index: usize) -> Check {
        let generation = self.slots[index].generation;
        self.note(format!(
            "r{index}: loses its disk (generation {generation})"
        ));
        self.world.borrow_mut().close_all_of(index);
        let abandoned = self.slots[index].process_dies();
        if abandoned {
            self.summary.syncs_failed += 1;
        }
        if self.slots[index].pending.is_some() {
            self.end_pending(index, End::Lost);
        }
        // Its log writes that reached the server (a push whose answer was lost counts)
        // survive it; the others are lost.
        let server = self.server();
        let side = Side::Replica(index);
        let mut lost = 0;
        for write in self
            .writes
            .iter_mut()
            .filter(|w| w.side == side && w.generation == generation && !w.on_server)
        {
            match server.fs().read_file(&write.path) {
                Ok(content) if content == write.content => write.on_server = true,
                _ => {
                    write.lost = true;
                    lost += 1;
                }
            }
        }
        let old = self
            .replica_path(index, generation)
            .parent()
            .map(|p| p.to_path_buf());
        if let Some(old) = old {
            std::fs::remove_dir_all(&old).map_err(|e| format!("deleting {old:?}: {e}"))?;
        }
        let generation = generation + 1;
        let ws = open_workspace(&self.replica_path(index, generation), &self.clock)?;
        self.note(format!(
            "r{index}: comes back as replica {} (generation {generation}); {lost} log \
             write(s) lost with the disk",
            short_id(ws.id())
        ));
        let slot = &mut self.slots[index];
        slot.workspace = Some(ws);
        slot.generation = generation;
        slot.upstream_seen = None;
        self.summary.disk_losses += 1;
        self.check_stores()
    }
}
