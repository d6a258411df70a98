//! The exec entry point: a registry of backends and the execs they run.
//!
//! `exec` picks a backend, connects it if needed, runs the bracket's first half (the
//! backend's view brought up to date), starts the command and returns a handle at once.
//! A driver thread per exec then moves output into the exec's bounded log, enforces the
//! timeout, waits for the end, runs the bracket's second half (the command's writes sent
//! to the authoritative side) and records the result. Readers follow the log by
//! sequence number, so a caller can detach and attach again.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::audit::{Asked, AuditEntry, AuditSink, KIND_ESCALATED, KIND_EXEC, KIND_REFUSED};
use crate::backend::{Backend, Connection, Description, Process, SpawnRequest, Spawned};
use crate::error::{Error, Result};
use crate::exec::{Event, ExecOptions, ExecResult, ExecStatus, Stream, SyncOutcome};
use crate::log::{OutputLog, EXEC_LOG_BYTES_MAX};

/// Between SIGTERM (timeout or kill) and SIGKILL of a process tree that did not end.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// Largest output chunk one event carries, bytes.
pub const CHUNK_BYTES_MAX: usize = 64 << 10;
/// Execs running at once, over all backends.
pub const RUNNING_MAX: usize = 64;
/// Finished execs kept for attaching (the oldest go first), and for how long.
pub const FINISHED_KEPT_MAX: usize = 32;
pub const FINISHED_KEPT_FOR: Duration = Duration::from_secs(300);
/// After the command ended, how long its output pipes may stay open (held by a process
/// it left behind) before the exec ends without the rest of their output.
const DRAIN_MAX: Duration = Duration::from_secs(1);
/// How often `close` looks whether the execs it killed have finished.
const CLOSE_POLL: Duration = Duration::from_millis(5);

struct Registered {
    backend: Arc<dyn Backend>,
    connection: Mutex<Option<Arc<dyn Connection>>>,
}

/// The backend id that routes each script to the cheapest backend able to run it
/// ([`Runtimes::set_auto`]).
pub const AUTO: &str = "auto";

/// The backend an exec goes to, and why.
struct Choice<'a> {
    registered: &'a Registered,
    reason: String,
    /// `auto` passed over a backend that could not run the script.
    escalated: bool,
}

/// The exec entry point over the registered backends.
#[derive(Default)]
pub struct Runtimes {
    backends: Vec<Registered>,
    execs: Mutex<HashMap<String, Arc<ExecState>>>,
    next_id: AtomicU64,
    audit: Option<Arc<dyn AuditSink>>,
    /// `auto`'s order of backends, cheapest first; empty: no `auto`.
    auto: Vec<String>,
}

/// What was asked of an exec, kept for its audit record.
#[derive(Clone)]
struct AskedOwned {
    caller: String,
    script: String,
    cwd: String,
}

impl AskedOwned {
    fn view<'a>(&'a self, id: &'a str) -> Asked<'a> {
        Asked {
            id,
            caller: &self.caller,
            script: &self.script,
            cwd: &self.cwd,
        }
    }
}

/// What `start` had settled when it failed, for the refusal's record.
#[derive(Default)]
struct Known {
    id: String,
    backend: String,
    reason: String,
}

struct ExecState {
    id: String,
    backend: String,
    reason: String,
    log: OutputLog,
    control: Mutex<Control>,
}

#[derive(Default)]
struct Control {
    process: Option<Arc<dyn Process>>,
    /// Set by the first kill: the driver escalates to SIGKILL after [`KILL_GRACE`].
    cancelled: bool,
    wake: Option<Sender<Wake>>,
    finished_at: Option<Instant>,
}

enum Wake {
    Exited(Result<i32>),
    Killed,
    Drained,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Runtimes {
    pub fn new() -> Runtimes {
        Runtimes::default()
    }

    /// Adds a backend; the first one registered is the default.
    pub fn register(&mut self, backend: Arc<dyn Backend>) -> Result<()> {
        let id = backend.id().to_owned();
        if self.backends.iter().any(|r| r.backend.id() == id) {
            return Err(Error::DuplicateBackend(id));
        }
        self.backends.push(Registered {
            backend,
            connection: Mutex::new(None),
        });
        Ok(())
    }

    /// The registered backends, then `auto` if it is set.
    pub fn backends(&self) -> Vec<Description> {
        let mut described: Vec<Description> =
            self.backends.iter().map(|r| r.backend.describe()).collect();
        if !self.auto.is_empty() {
            let order = self.auto.join(", then ");
            described.push(Description {
                id: AUTO.into(),
                summary: format!("routes each script to the first of {order} that can run it"),
                runs: "what the backend it picks runs; the same script always goes the same way"
                    .into(),
                touches: "what the backend it picks touches".into(),
            });
        }
        described
    }

    /// Waits up to `timeout` for the writes of a result whose sync was pending (its
    /// `intent`, on `backend` or the default) to reach the authoritative side: complete,
    /// still pending, or lost (the replica that held them is gone).
    pub fn wait_sync(
        &self,
        backend: Option<&str>,
        intent: &str,
        timeout: Duration,
    ) -> Result<SyncOutcome> {
        self.choose(backend)?.0.backend.wait_sync(intent, timeout)
    }

    /// Starts `script` and returns its handle once it runs. Errors before the command
    /// started (an unknown backend, a failed connect or pre-exec sync, a refusal by
    /// policy) are returned here, and the command did not run. Either way the audit
    /// sink, if any, gets a record: a refusal now, the exec when it ends.
    pub fn exec(&self, script: &str, options: ExecOptions) -> Result<ExecHandle> {
        let asked = AskedOwned {
            caller: options
                .caller
                .clone()
                .unwrap_or_else(|| "in-process".into()),
            script: script.to_owned(),
            cwd: options.cwd.clone().unwrap_or_else(|| "/".into()),
        };
        // Refused before an id was claimed: the caller's, or none.
        let mut known = Known {
            id: options.id.clone().unwrap_or_else(|| "-".into()),
            ..Known::default()
        };
        let started = self.start(script, options, &asked, &mut known);
        if let (Err(err), Some(audit)) = (&started, &self.audit) {
            let entry =
                AuditEntry::refused(&asked.view(&known.id), &known.backend, &known.reason, err);
            audit.keep(KIND_REFUSED, &entry);
        }
        started
    }

    /// Sends a record of each exec (and each refusal) to `sink` from now on.
    pub fn set_audit(&mut self, sink: Arc<dyn AuditSink>) {
        self.audit = Some(sink);
    }

    fn start(
        &self,
        script: &str,
        options: ExecOptions,
        asked: &AskedOwned,
        known: &mut Known,
    ) -> Result<ExecHandle> {
        let choice = self.choose_for(options.backend.as_deref(), script)?;
        let (registered, reason) = (choice.registered, choice.reason);
        known.backend = registered.backend.id().to_owned();
        known.reason = reason.clone();
        let cwd = normalize_cwd(options.cwd.as_deref().unwrap_or("/"))?;
        let state = self.claim(options.id, registered.backend.id(), reason)?;
        known.id = state.id.clone();
        if let (true, Some(audit)) = (choice.escalated, &self.audit) {
            let entry =
                AuditEntry::escalated(&asked.view(&known.id), &known.backend, &known.reason);
            audit.keep(KIND_ESCALATED, &entry);
        }
        let started = Instant::now();
        let span = tracing::info_span!("exec", id = %state.id, backend = %state.backend);
        let request = SpawnRequest {
            exec_id: state.id.clone(),
            script: script.to_owned(),
            cwd,
            env: options.env,
        };
        let spawned = span.in_scope(|| connect_and_spawn(registered, &request));
        let (spawned, connection) = match spawned {
            Ok(spawned) => spawned,
            Err(err) => {
                lock(&self.execs).remove(&state.id);
                return Err(err);
            }
        };
        // The caller's timeout, within the backend's.
        let timeout = match (options.timeout, connection.timeout_max()) {
            (Some(asked), Some(most)) => Some(asked.min(most)),
            (asked, most) => asked.or(most),
        };
        let driver = Driver {
            state: state.clone(),
            connection,
            timeout,
            started,
            audit: self.audit.clone().map(|sink| (sink, asked.clone())),
        };
        let process = spawned.process.clone();
        // Published before the handle exists, so that a kill right after exec returns
        // reaches the command instead of finding nothing to signal.
        let (wake, woken) = mpsc::channel();
        {
            let mut control = lock(&state.control);
            control.process = Some(process.clone());
            control.wake = Some(wake.clone());
        }
        let driving = std::thread::Builder::new()
            .name(format!("exec-{}", state.id))
            .spawn(move || driver.run(spawned, options.stdin, wake, woken));
        if let Err(err) = driving {
            // Nobody would watch the command: end it, and give the id back.
            let _ = process.kill_all();
            lock(&self.execs).remove(&state.id);
            return Err(Error::io("starting an exec's driver thread")(err));
        }
        Ok(ExecHandle::new(state, 0))
    }

    /// A handle on a running or recently finished exec, reading from event `from_seq`.
    pub fn attach(&self, id: &str, from_seq: u64) -> Result<ExecHandle> {
        let mut execs = lock(&self.execs);
        prune(&mut execs);
        let state = execs.get(id).cloned();
        state
            .map(|state| ExecHandle::new(state, from_seq))
            .ok_or_else(|| Error::NoSuchExec(id.to_owned(), FINISHED_KEPT_FOR))
    }

    /// Sends `signal` to a running exec's whole process tree; SIGKILL follows after
    /// [`KILL_GRACE`] if it has not ended. A finished exec is left alone.
    pub fn kill(&self, id: &str, signal: i32) -> Result<()> {
        self.attach(id, 0)?.kill(signal)
    }

    /// Ends every running exec (SIGKILL to its tree), waits up to `wait` for them to
    /// finish, and lets go of every backend's connection (a warm sandbox ends with it).
    /// For an owner about to unmount: a sandbox's view of the mount would keep the
    /// mount alive. An exec asked for afterwards connects again.
    pub fn close(&self, wait: Duration) {
        let running: Vec<ExecHandle> = (lock(&self.execs).values())
            .filter(|state| state.finished_at().is_none())
            .map(|state| ExecHandle::new(state.clone(), 0))
            .collect();
        for handle in &running {
            if let Err(err) = handle.kill(libc::SIGKILL) {
                tracing::warn!(exec = handle.id(), "killing at close: {err}");
            }
        }
        let deadline = Instant::now() + wait;
        for handle in &running {
            while handle.finished().is_none() && Instant::now() < deadline {
                std::thread::sleep(CLOSE_POLL);
            }
        }
        for registered in &self.backends {
            drop(lock(&registered.connection).take());
        }
    }

    /// Makes `auto` a backend id callers may ask for: it picks the first backend of
    /// `order` that can run the script ([`Backend::can_run`]), the last one if none
    /// says so. Every id must be registered.
    pub fn set_auto(&mut self, order: &[&str]) -> Result<()> {
        if order.is_empty() {
            return Err(Error::Invalid("auto needs at least one backend".into()));
        }
        for id in order {
            self.choose(Some(id))?;
        }
        self.auto = order.iter().map(|id| id.to_string()).collect();
        Ok(())
    }

    /// The backend for `script`: the one asked for, the default, or `auto`'s choice.
    fn choose_for(&self, asked: Option<&str>, script: &str) -> Result<Choice<'_>> {
        if asked != Some(AUTO) || self.auto.is_empty() {
            let (registered, reason) = self.choose(asked)?;
            return Ok(Choice {
                registered,
                reason,
                escalated: false,
            });
        }
        let mut refusals = Vec::new();
        for (at, id) in self.auto.iter().enumerate() {
            let (registered, _) = self.choose(Some(id))?;
            let last = at + 1 == self.auto.len();
            match registered.backend.can_run(script) {
                Ok(()) if refusals.is_empty() => {
                    let reason = format!("auto: {id} can run every command of the script");
                    return Ok(Choice {
                        registered,
                        reason,
                        escalated: false,
                    });
                }
                Ok(()) => {}
                Err(why) if !last => {
                    refusals.push(format!("not {id}: {why}"));
                    continue;
                }
                Err(why) => refusals.push(format!("{id} says: {why}")),
            }
            let reason = format!("auto: escalated to {id} ({})", refusals.join("; "));
            return Ok(Choice {
                registered,
                reason,
                escalated: true,
            });
        }
        unreachable!("the loop returns at the last backend of a non-empty order")
    }

    fn choose(&self, asked: Option<&str>) -> Result<(&Registered, String)> {
        let Some(asked) = asked else {
            let first = self
                .backends
                .first()
                .ok_or_else(|| Error::UnknownBackend("(default)".into(), "none".into()))?;
            return Ok((first, "the default backend".into()));
        };
        match self.backends.iter().find(|r| r.backend.id() == asked) {
            Some(registered) => Ok((registered, "asked for by the caller".into())),
            None => {
                let ids: Vec<&str> = self.backends.iter().map(|r| r.backend.id()).collect();
                Err(Error::UnknownBackend(asked.to_owned(), ids.join(", ")))
            }
        }
    }

    /// Takes an id for a new exec (the caller's, unless a live exec has it).
    fn claim(&self, id: Option<String>, backend: &str, reason: String) -> Result<Arc<ExecState>> {
        let mut execs = lock(&self.execs);
        prune(&mut execs);
        let running = execs.values().filter(|s| !s.is_finished()).count();
        if running >= RUNNING_MAX {
            return Err(Error::TooMany(RUNNING_MAX));
        }
        let id = match id {
            Some(id) if id.is_empty() || id.len() > 128 => {
                return Err(Error::Invalid(format!("exec id {id:?}: 1 to 128 bytes")))
            }
            Some(id) => id,
            None => loop {
                let n = self.next_id.fetch_add(1, Ordering::Relaxed);
                let id = format!("x{}-{n}", std::process::id());
                if !execs.contains_key(&id) {
                    break id;
                }
            },
        };
        if execs.get(&id).is_some_and(|s| !s.is_finished()) {
            return Err(Error::Busy(id));
        }
        let state = Arc::new(ExecState {
            id: id.clone(),
            backend: backend.to_owned(),
            reason,
            log: OutputLog::new(EXEC_LOG_BYTES_MAX),
            control: Mutex::new(Control::default()),
        });
        execs.insert(id, state.clone());
        Ok(state)
    }
}

/// The backend's connection, made now if there is none or it died. A failure is not
/// kept: the next exec tries again.
fn connected(registered: &Registered) -> Result<Arc<dyn Connection>> {
    let mut slot = lock(&registered.connection);
    if let Some(connection) = slot.as_ref().filter(|c| c.is_alive()) {
        return Ok(connection.clone());
    }
    *slot = None;
    let connection = registered.backend.connect()?;
    *slot = Some(connection.clone());
    Ok(connection)
}

/// The backend's connection, the first half of its bracket, and the command started.
fn connect_and_spawn(
    registered: &Registered,
    request: &SpawnRequest,
) -> Result<(Spawned, Arc<dyn Connection>)> {
    let connection = tracing::info_span!("connect").in_scope(|| connected(registered))?;
    let id = &request.exec_id;
    tracing::info_span!("before_exec").in_scope(|| connection.before_exec(id))?;
    let spawned = tracing::info_span!("spawn").in_scope(|| connection.spawn(request));
    let spawned = spawned.inspect_err(|_| {
        // The bracket closes even when the command never started: the view may count
        // the commands between its halves.
        let _ = connection.after_exec(id);
    })?;
    Ok((spawned, connection))
}

/// Drops finished execs past their time, then the oldest beyond the count kept.
fn prune(execs: &mut HashMap<String, Arc<ExecState>>) {
    let now = Instant::now();
    execs.retain(|_, s| {
        s.finished_at()
            .is_none_or(|at| now - at < FINISHED_KEPT_FOR)
    });
    let mut finished: Vec<(Instant, String)> = execs
        .iter()
        .filter_map(|(id, s)| Some((s.finished_at()?, id.clone())))
        .collect();
    if finished.len() > FINISHED_KEPT_MAX {
        finished.sort();
        for (_, id) in &finished[..finished.len() - FINISHED_KEPT_MAX] {
            execs.remove(id);
        }
    }
}

/// A working directory inside the workspace as `/` or `/a/b`; `..` may not leave it.
pub fn normalize_cwd(cwd: &str) -> Result<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in cwd.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(Error::Invalid(format!(
                        "working directory {cwd:?} climbs out of the workspace"
                    )));
                }
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

impl ExecState {
    fn finished_at(&self) -> Option<Instant> {
        lock(&self.control).finished_at
    }

    fn is_finished(&self) -> bool {
        self.finished_at().is_some()
    }
}

/// Runs one exec from its start to its recorded end.
struct Driver {
    state: Arc<ExecState>,
    connection: Arc<dyn Connection>,
    timeout: Option<Duration>,
    started: Instant,
    audit: Option<(Arc<dyn AuditSink>, AskedOwned)>,
}

/// What the driver saw of the command's end.
struct Ending {
    exit: Result<i32>,
    timed_out: bool,
    cancelled: bool,
    /// Output pipes already closed.
    drained: usize,
}

impl Driver {
    fn run(
        self,
        spawned: Spawned,
        stdin: Option<Vec<u8>>,
        wake: Sender<Wake>,
        woken: mpsc::Receiver<Wake>,
    ) {
        let Spawned {
            stdin: pipe,
            stdout,
            stderr,
            process,
        } = spawned;
        if let Some(pipe) = pipe {
            feed(pipe, stdin.unwrap_or_default());
        }
        self.read_into_log(stdout, Stream::Stdout, wake.clone());
        self.read_into_log(stderr, Stream::Stderr, wake.clone());
        let waiter = process.clone();
        let exited = wake.clone();
        std::thread::spawn(move || {
            let _ = exited.send(Wake::Exited(waiter.wait()));
        });
        drop(wake);
        let ending = self.wait_for_end(&*process, &woken);
        let value = process.value();
        lock(&self.state.control).wake = None;
        self.drain(&woken, ending.drained);
        let span = tracing::info_span!("exec", id = %self.state.id, backend = %self.state.backend);
        let sync = span.in_scope(|| {
            let _after = tracing::info_span!("after_exec").entered();
            self.connection.after_exec(&self.state.id)
        });
        self.finish(ending, sync, value);
    }

    /// Waits for the command to exit, sending SIGTERM at the timeout and SIGKILL a grace
    /// period after a timeout or kill.
    fn wait_for_end(&self, process: &dyn Process, woken: &mpsc::Receiver<Wake>) -> Ending {
        let timeout_at = self.timeout.map(|t| self.started + t);
        let mut kill_at: Option<Instant> = None;
        let mut timed_out = false;
        let mut drained = 0;
        loop {
            let next = [timeout_at.filter(|_| !timed_out), kill_at]
                .into_iter()
                .flatten()
                .min();
            let wait = next.map(|at| at.saturating_duration_since(Instant::now()));
            let woke = match wait {
                Some(wait) => woken.recv_timeout(wait),
                None => woken.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match woke {
                Ok(Wake::Exited(exit)) => {
                    let cancelled = lock(&self.state.control).cancelled;
                    return Ending {
                        exit,
                        timed_out,
                        cancelled,
                        drained,
                    };
                }
                Ok(Wake::Killed) => {
                    kill_at.get_or_insert(Instant::now() + KILL_GRACE);
                }
                Ok(Wake::Drained) => drained += 1,
                Err(RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    if kill_at.is_some_and(|at| now >= at) {
                        log_failure("SIGKILL", &self.state.id, process.kill_all());
                        kill_at = None;
                    } else if !timed_out && timeout_at.is_some_and(|at| now >= at) {
                        timed_out = true;
                        log_failure("SIGTERM", &self.state.id, process.signal(libc::SIGTERM));
                        kill_at.get_or_insert(now + KILL_GRACE);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Only if the waiter thread died without reporting.
                    return Ending {
                        exit: Err(Error::Invalid("lost track of the command".into())),
                        timed_out,
                        cancelled: true,
                        drained,
                    };
                }
            }
        }
    }

    /// Waits up to [`DRAIN_MAX`] for the output pipes still open to close.
    fn drain(&self, woken: &mpsc::Receiver<Wake>, mut drained: usize) {
        let deadline = Instant::now() + DRAIN_MAX;
        while drained < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            match woken.recv_timeout(left) {
                Ok(Wake::Drained) => drained += 1,
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(exec = %self.state.id, "output still open after the command ended; not waiting for it");
                    return;
                }
            }
        }
    }

    fn read_into_log(&self, mut pipe: Box<dyn Read + Send>, stream: Stream, wake: Sender<Wake>) {
        let state = self.state.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK_BYTES_MAX];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => state.log.push(stream, buf[..n].to_vec()),
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(err) => {
                        tracing::warn!(exec = %state.id, "reading {stream:?}: {err}");
                        break;
                    }
                }
            }
            let _ = wake.send(Wake::Drained);
        });
    }

    fn finish(self, ending: Ending, sync: SyncOutcome, value: Option<String>) {
        let (exit_code, error) = match ending.exit {
            Ok(code) => (code, None),
            Err(err) => (crate::exec::EXIT_NOT_STARTED, Some(err.to_string())),
        };
        let status = if ending.timed_out {
            ExecStatus::TimedOut
        } else if ending.cancelled {
            ExecStatus::Cancelled
        } else if exit_code == 0 && error.is_none() {
            ExecStatus::Completed
        } else {
            ExecStatus::Failed
        };
        let result = ExecResult {
            status,
            exit_code,
            duration: self.started.elapsed(),
            backend: self.state.backend.clone(),
            reason: self.state.reason.clone(),
            sync,
            error,
            value,
        };
        tracing::info!(exec = %self.state.id, backend = %result.backend, ?status, exit_code, "exec ended");
        if let Some((sink, asked)) = &self.audit {
            sink.keep(
                KIND_EXEC,
                &AuditEntry::ran(&asked.view(&self.state.id), &result),
            );
        }
        lock(&self.state.control).finished_at = Some(Instant::now());
        self.state.log.finish(result);
    }
}

/// Writes the caller's stdin and closes the pipe (a command that does not read it gets
/// EPIPE-free silence: the writer just stops).
fn feed(mut pipe: Box<dyn Write + Send>, bytes: Vec<u8>) {
    std::thread::spawn(move || {
        let _ = pipe.write_all(&bytes);
    });
}

fn log_failure(what: &str, exec: &str, result: Result<()>) {
    if let Err(err) = result {
        tracing::warn!(exec, "{what} of the process tree failed: {err}");
    }
}

/// A caller's view of one exec: its events from a position on, its result, and kill.
pub struct ExecHandle {
    state: Arc<ExecState>,
    next_seq: u64,
    ended: bool,
}

impl ExecHandle {
    fn new(state: Arc<ExecState>, next_seq: u64) -> ExecHandle {
        ExecHandle {
            state,
            next_seq,
            ended: false,
        }
    }

    pub fn id(&self) -> &str {
        &self.state.id
    }

    pub fn backend(&self) -> &str {
        &self.state.backend
    }

    /// The next event, waiting up to `wait` (`None`: until there is one). `None` once
    /// the exit event was returned, or when the wait ran out (see [`ExecHandle::ended`]).
    pub fn next_event(&mut self, wait: Option<Duration>) -> Option<Event> {
        if self.ended {
            return None;
        }
        let event = self.state.log.event(self.next_seq, wait)?;
        match &event {
            Event::Output { seq, .. } => self.next_seq = seq + 1,
            Event::Missed { next, .. } => self.next_seq = *next,
            Event::Exit { .. } => self.ended = true,
        }
        Some(event)
    }

    /// Whether the exit event was returned.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The sequence number of the next event this handle returns (to attach again there).
    pub fn position(&self) -> u64 {
        self.next_seq
    }

    /// The result if the exec ended, without waiting.
    pub fn finished(&self) -> Option<ExecResult> {
        self.state.log.result()
    }

    /// Waits for the end of the exec.
    pub fn result(&self) -> ExecResult {
        self.state.log.wait_result()
    }

    /// Sends `signal` to the whole process tree, SIGKILL following after [`KILL_GRACE`].
    pub fn kill(&self, signal: i32) -> Result<()> {
        let mut control = lock(&self.state.control);
        let (Some(process), Some(wake)) = (control.process.clone(), control.wake.clone()) else {
            return Ok(());
        };
        control.cancelled = true;
        drop(control);
        process.signal(signal)?;
        let _ = wake.send(Wake::Killed);
        Ok(())
    }
}

impl Iterator for ExecHandle {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        self.next_event(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// A backend that runs scripts with the host's `sh`, no sandbox: the spine's own
    /// behaviour, with connects counted and failures on demand.
    #[derive(Default)]
    struct HostShell {
        connects: AtomicUsize,
        connects_to_fail: AtomicUsize,
        fail_before_exec: AtomicBool,
        alive: Arc<AtomicBool>,
        spawned: Arc<AtomicUsize>,
        timeout_max: Option<Duration>,
    }

    struct HostConnection {
        fail_before_exec: bool,
        alive: Arc<AtomicBool>,
        spawned: Arc<AtomicUsize>,
        timeout_max: Option<Duration>,
    }

    /// A process group of the host, reaped by `wait` only.
    struct HostProcess {
        pid: i32,
        reaped: Mutex<bool>,
    }

    impl Backend for HostShell {
        fn id(&self) -> &str {
            "host"
        }
        fn describe(&self) -> Description {
            Description {
                id: "host".into(),
                summary: "sh on the host".into(),
                runs: "sh".into(),
                touches: "everything".into(),
            }
        }
        fn connect(&self) -> Result<Arc<dyn Connection>> {
            let failing = self.connects_to_fail.load(Ordering::SeqCst);
            if failing > 0 {
                self.connects_to_fail.store(failing - 1, Ordering::SeqCst);
                return Err(Error::Connect {
                    backend: "host".into(),
                    reason: "told to fail".into(),
                });
            }
            self.connects.fetch_add(1, Ordering::SeqCst);
            self.alive.store(true, Ordering::SeqCst);
            Ok(Arc::new(HostConnection {
                fail_before_exec: self.fail_before_exec.load(Ordering::SeqCst),
                alive: self.alive.clone(),
                spawned: self.spawned.clone(),
                timeout_max: self.timeout_max,
            }))
        }
    }

    impl Connection for HostConnection {
        fn before_exec(&self, _exec_id: &str) -> Result<()> {
            match self.fail_before_exec {
                true => Err(Error::NotSynced("told to fail".into())),
                false => Ok(()),
            }
        }
        fn spawn(&self, request: &SpawnRequest) -> Result<Spawned> {
            use std::os::unix::process::CommandExt;
            let mut child = Command::new("sh")
                .args(["-c", &request.script])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .map_err(Error::io("sh"))?;
            self.spawned.fetch_add(1, Ordering::SeqCst);
            Ok(Spawned {
                stdin: Some(Box::new(child.stdin.take().unwrap())),
                stdout: Box::new(child.stdout.take().unwrap()),
                stderr: Box::new(child.stderr.take().unwrap()),
                process: Arc::new(HostProcess {
                    pid: child.id() as i32,
                    reaped: Mutex::new(false),
                }),
            })
        }
        fn after_exec(&self, _exec_id: &str) -> SyncOutcome {
            SyncOutcome::Complete
        }
        fn is_alive(&self) -> bool {
            self.alive.load(Ordering::SeqCst)
        }
        fn timeout_max(&self) -> Option<Duration> {
            self.timeout_max
        }
    }

    impl Process for HostProcess {
        fn signal(&self, signal: i32) -> Result<()> {
            if !*lock(&self.reaped) {
                // SAFETY: kill(2) of the group this test started.
                unsafe { libc::kill(-self.pid, signal) };
            }
            Ok(())
        }
        fn kill_all(&self) -> Result<()> {
            self.signal(libc::SIGKILL)
        }
        fn wait(&self) -> Result<i32> {
            use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
            let pid = nix::unistd::Pid::from_raw(self.pid);
            let _ = waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
            let mut reaped = lock(&self.reaped);
            let status = waitpid(pid, None).map_err(|e| Error::io("waitpid")(e.into()))?;
            *reaped = true;
            Ok(match status {
                WaitStatus::Exited(_, code) => code,
                WaitStatus::Signaled(_, signal, _) => 128 + signal as i32,
                _ => -1,
            })
        }
    }

    fn with(backend: HostShell) -> (Runtimes, Arc<HostShell>) {
        let backend = Arc::new(backend);
        let mut runtimes = Runtimes::new();
        runtimes.register(backend.clone()).unwrap();
        (runtimes, backend)
    }

    #[test]
    fn the_first_backend_is_the_default_and_ids_are_unique() {
        let (mut runtimes, _) = with(HostShell::default());
        let duplicate = runtimes.register(Arc::new(HostShell::default()));
        assert!(matches!(duplicate, Err(Error::DuplicateBackend(id)) if id == "host"));
        let handle = runtimes.exec("exit 4", ExecOptions::default()).unwrap();
        let result = handle.result();
        assert_eq!((result.status, result.exit_code), (ExecStatus::Failed, 4));
        assert_eq!(
            (result.backend.as_str(), result.reason.as_str()),
            ("host", "the default backend")
        );
        assert_eq!(runtimes.backends()[0].id, "host");
        assert!(matches!(
            Runtimes::new().exec("true", ExecOptions::default()),
            Err(Error::UnknownBackend(..))
        ));
    }

    #[test]
    fn a_failed_connect_is_not_kept_and_a_dead_connection_is_replaced() {
        let (runtimes, backend) = with(HostShell {
            connects_to_fail: AtomicUsize::new(1),
            ..HostShell::default()
        });
        let failed = runtimes.exec("true", ExecOptions::default());
        assert!(matches!(failed, Err(Error::Connect { .. })));
        for _ in 0..2 {
            let handle = runtimes.exec("true", ExecOptions::default()).unwrap();
            assert_eq!(handle.result().status, ExecStatus::Completed);
        }
        assert_eq!(
            backend.connects.load(Ordering::SeqCst),
            1,
            "kept after it succeeded"
        );
        backend.alive.store(false, Ordering::SeqCst);
        runtimes
            .exec("true", ExecOptions::default())
            .unwrap()
            .result();
        assert_eq!(
            backend.connects.load(Ordering::SeqCst),
            2,
            "replaced once dead"
        );
    }

    #[test]
    fn no_command_runs_when_the_view_cannot_be_brought_up_to_date() {
        let (runtimes, backend) = with(HostShell {
            fail_before_exec: AtomicBool::new(true),
            ..HostShell::default()
        });
        let options = ExecOptions {
            id: Some("mine".into()),
            ..ExecOptions::default()
        };
        let failed = runtimes.exec("touch /nonexistent/x", options.clone());
        assert!(matches!(failed, Err(Error::NotSynced(_))));
        assert_eq!(backend.spawned.load(Ordering::SeqCst), 0);
        // The id was given back.
        assert!(matches!(
            runtimes.attach("mine", 0),
            Err(Error::NoSuchExec(..))
        ));
    }

    #[test]
    fn the_backends_timeout_bounds_the_callers() {
        let (runtimes, _) = with(HostShell {
            timeout_max: Some(Duration::from_millis(100)),
            ..HostShell::default()
        });
        let result = runtimes
            .exec("sleep 100", ExecOptions::default())
            .unwrap()
            .result();
        assert_eq!(result.status, ExecStatus::TimedOut);
        assert_eq!(result.exit_code, 128 + libc::SIGTERM);
    }

    #[test]
    fn running_execs_are_bounded_and_kill_of_a_finished_one_does_nothing() {
        let (runtimes, _) = with(HostShell::default());
        let handles: Vec<ExecHandle> = (0..RUNNING_MAX)
            .map(|_| runtimes.exec("sleep 100", ExecOptions::default()).unwrap())
            .collect();
        let refused = runtimes.exec("true", ExecOptions::default()).err().unwrap();
        assert_eq!(refused.errno(), libc::EAGAIN);
        for handle in &handles {
            handle.kill(libc::SIGKILL).unwrap();
        }
        for handle in &handles {
            assert_eq!(handle.result().status, ExecStatus::Cancelled);
            handle.kill(libc::SIGTERM).unwrap();
        }
        let handle = runtimes.exec("echo again", ExecOptions::default()).unwrap();
        assert_eq!(handle.result().status, ExecStatus::Completed);
    }

    /// Keeps records in memory.
    #[derive(Default)]
    struct Kept(Mutex<Vec<(String, AuditEntry)>>);

    impl AuditSink for Kept {
        fn keep(&self, kind: &str, entry: &AuditEntry) {
            lock(&self.0).push((kind.to_owned(), entry.clone()));
        }
    }

    #[test]
    fn every_exec_and_every_refusal_leaves_a_record() {
        let (mut runtimes, _) = with(HostShell::default());
        let kept = Arc::new(Kept::default());
        runtimes.set_audit(kept.clone());
        let options = ExecOptions {
            caller: Some("a test".into()),
            id: Some("one".into()),
            ..ExecOptions::default()
        };
        runtimes.exec("exit 3", options).unwrap().result();
        let climbing = ExecOptions {
            cwd: Some("../..".into()),
            ..ExecOptions::default()
        };
        assert!(runtimes.exec("ls", climbing).is_err());
        let records = lock(&kept.0).clone();
        assert_eq!(records.len(), 2);
        let (kind, ran) = &records[0];
        assert_eq!(kind, KIND_EXEC);
        assert_eq!(
            (ran.id.as_str(), ran.caller.as_str(), ran.script.as_str()),
            ("one", "a test", "exit 3")
        );
        assert_eq!((ran.status.as_str(), ran.exit_code), ("failed", Some(3)));
        assert_eq!(
            (ran.backend.as_str(), ran.sync.as_str()),
            ("host", "complete")
        );
        let (kind, refused) = &records[1];
        assert_eq!(kind, KIND_REFUSED);
        assert_eq!(
            (refused.status.as_str(), refused.cwd.as_str()),
            ("refused", "../..")
        );
        assert!(refused.error.as_ref().unwrap().contains("climbs out"));
        assert_eq!(refused.caller, "in-process");
        assert_eq!(refused.id, "-", "refused before an id was claimed");
    }

    #[test]
    fn working_directories_stay_inside_the_workspace() {
        assert_eq!(normalize_cwd("/").unwrap(), "/");
        assert_eq!(normalize_cwd("").unwrap(), "/");
        assert_eq!(normalize_cwd("src/./a//b/..").unwrap(), "/src/a");
        assert_eq!(normalize_cwd("/a/../b").unwrap(), "/b");
        assert!(normalize_cwd("..").is_err());
        assert!(normalize_cwd("/a/../../etc").is_err());
    }
}
