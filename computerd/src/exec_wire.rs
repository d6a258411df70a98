//! The runtimes' exec spine on the wire: the runner a workspace's owner hands out on its
//! channel (`Session.runner` in sync/schema/sync.capnp), and the caller's side of it.
//!
//! The owner runs each command (its sandboxes stay warm between execs) and keeps the
//! audit record in its workspace; the caller starts an exec, then follows its events by
//! sequence number with long polls (at most [`EVENTS_WAIT_MAX`] each, at most
//! [`EVENTS_BYTES_MAX`] of output per answer), so output streams as it comes and a
//! caller that lost the connection can attach again and resume.

use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use computer_runtimes::audit::status_name;
use computer_runtimes::js::JsBackend;
use computer_runtimes::linux::{LinuxBackend, WorkspaceView, LINUX_BACKEND_ID};
use computer_runtimes::shell::{ChangeObserver, ShellBackend, SHELL_BACKEND_ID};
use computer_runtimes::tools::Tools;
use computer_runtimes::{
    Description, Event, ExecHandle, ExecOptions, ExecResult, ExecStatus, Policies, Runtimes,
    Stream, SyncOutcome, WorkspaceAudit,
};
use computer_sync::exec_capnp::{
    audit_item, backend_info, exec, exec_event, exec_outcome, exec_request, runner,
};
use computer_sync::rpc::{error_answer, RunnerMaker};
use computer_vfs::{AuditRecord, Workspace};

/// The longest a caller's `events` call asks the owner to wait before asking again.
const EVENTS_WAIT: Duration = Duration::from_secs(10);
/// The longest one `events` call waits for a first event.
pub const EVENTS_WAIT_MAX: Duration = Duration::from_secs(30);
/// The most output one `events` answer carries, bytes (one chunk may pass it).
pub const EVENTS_BYTES_MAX: usize = 1 << 20;
/// The most audit records one `audit` answer carries.
pub const AUDIT_RECORDS_PER_CALL_MAX: u32 = 1000;
/// The most stdin an exec request carries, bytes.
pub const STDIN_BYTES_MAX: usize = 64 << 20;
/// The longest a `waitSync` call waits.
pub const SYNC_WAIT_MAX: Duration = Duration::from_secs(300);

/// Where an owner puts its `Runtimes` once it can run commands (a mount: once the
/// kernel answers at its mount point). Execs asked before fail EAGAIN.
pub type RuntimesSlot = Arc<OnceLock<OwnerRuntimes>>;

/// What an owner runs for its callers: the exec spine and the file tools agents call.
pub struct OwnerRuntimes {
    pub exec: Arc<Runtimes>,
    pub tools: Tools,
}

impl OwnerRuntimes {
    /// Ends the commands running and their sandboxes, waiting up to `wait`.
    pub fn close(&self, wait: Duration) {
        self.exec.close(wait);
    }
}

/// An owner's exec spine over `ws`: the Linux backend over `view` (the default), the
/// shell and the js backend on the store itself (telling `changed` what they changed:
/// a mount's kernel cache), and `auto` trying the shell first; the file tools under
/// the shell's path globs; the records of both kept in `ws`'s audit trail.
pub fn owner_runtimes(
    view: Arc<dyn WorkspaceView>,
    policies: Policies,
    ws: &Workspace,
    changed: Option<ChangeObserver>,
) -> anyhow::Result<OwnerRuntimes> {
    let audit = Arc::new(WorkspaceAudit(ws.clone()));
    let mut tools = Tools::new(ws, &policies.shell, changed.clone())?;
    tools.set_audit(audit.clone());
    let mut runtimes = Runtimes::new();
    runtimes.register(Arc::new(LinuxBackend::new(view, policies.linux)))?;
    let shell = ShellBackend::new(ws.clone(), policies.shell, changed.clone())?;
    runtimes.register(Arc::new(shell))?;
    runtimes.register(Arc::new(JsBackend::new(ws.clone(), policies.js, changed)))?;
    runtimes.set_auto(&[SHELL_BACKEND_ID, LINUX_BACKEND_ID])?;
    runtimes.set_audit(audit);
    Ok(OwnerRuntimes {
        exec: Arc::new(runtimes),
        tools,
    })
}

/// The runner maker an owner passes to its channel: every caller gets a runner over the
/// owner's one `Runtimes`, named after the peer its hello gave.
pub fn runner_maker(runtimes: RuntimesSlot, workspace: Workspace) -> RunnerMaker {
    Arc::new(move |caller: &str| {
        capnp_rpc::new_client(RunnerServer {
            runtimes: runtimes.clone(),
            workspace: workspace.clone(),
            caller: caller.to_owned(),
        })
    })
}

struct RunnerServer {
    runtimes: RuntimesSlot,
    workspace: Workspace,
    caller: String,
}

fn failed(err: computer_runtimes::Error) -> capnp::Error {
    error_answer(&computer_sync::Error::File {
        errno: err.errno(),
        message: err.to_string(),
    })
}

async fn off_the_loop<T: Send + 'static>(
    work: impl FnOnce() -> computer_runtimes::Result<T> + Send + 'static,
) -> capnp::Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done.map_err(failed),
        Err(err) => Err(capnp::Error::failed(format!("an exec call failed: {err}"))),
    }
}

impl runner::Server for RunnerServer {
    async fn backends(
        self: Rc<Self>,
        _params: runner::BackendsParams,
        mut results: runner::BackendsResults,
    ) -> capnp::Result<()> {
        let backends = self.owned()?.exec.backends();
        let mut list = results.get().init_backends(backends.len() as u32);
        for (i, backend) in backends.iter().enumerate() {
            write_backend(backend, list.reborrow().get(i as u32));
        }
        Ok(())
    }

    async fn exec(
        self: Rc<Self>,
        params: runner::ExecParams,
        mut results: runner::ExecResults,
    ) -> capnp::Result<()> {
        let (script, mut options) = read_request(params.get()?.get_request()?)?;
        options.caller = Some(self.caller.clone());
        let runtimes = self.runtimes()?;
        let handle = off_the_loop(move || runtimes.exec(&script, options)).await?;
        let mut out = results.get();
        out.set_id(handle.id());
        out.set_backend(handle.backend());
        out.set_exec(exec_client(self.runtimes()?, handle.id()));
        Ok(())
    }

    async fn tool(
        self: Rc<Self>,
        params: runner::ToolParams,
        mut results: runner::ToolResults,
    ) -> capnp::Result<()> {
        let params = params.get()?;
        let name = params.get_name()?.to_string()?;
        let arguments = params.get_arguments()?.to_string()?;
        let (tools, caller) = (self.owned()?.tools.clone(), self.caller.clone());
        let text = off_the_loop(move || tools.call(&name, &arguments, &caller)).await?;
        results.get().set_text(&text);
        Ok(())
    }

    async fn attach(
        self: Rc<Self>,
        params: runner::AttachParams,
        mut results: runner::AttachResults,
    ) -> capnp::Result<()> {
        let id = params.get()?.get_id()?.to_string()?;
        let runtimes = self.runtimes()?;
        let handle = runtimes.attach(&id, 0).map_err(failed)?;
        let mut out = results.get();
        out.set_backend(handle.backend());
        out.set_exec(exec_client(runtimes, &id));
        Ok(())
    }

    async fn audit(
        self: Rc<Self>,
        params: runner::AuditParams,
        mut results: runner::AuditResults,
    ) -> capnp::Result<()> {
        let params = params.get()?;
        let (after, limit) = (params.get_after_seq(), params.get_limit());
        let limit = limit.min(AUDIT_RECORDS_PER_CALL_MAX) as usize;
        let workspace = self.workspace.clone();
        let records = off_the_loop(move || {
            workspace
                .audit_records(after, limit)
                .map_err(|e| computer_runtimes::Error::Invalid(format!("the audit trail: {e}")))
        })
        .await?;
        let mut list = results.get().init_records(records.len() as u32);
        for (i, record) in records.iter().enumerate() {
            write_audit(record, list.reborrow().get(i as u32));
        }
        Ok(())
    }

    async fn wait_sync(
        self: Rc<Self>,
        params: runner::WaitSyncParams,
        mut results: runner::WaitSyncResults,
    ) -> capnp::Result<()> {
        let params = params.get()?;
        let backend = params.get_backend()?.to_string()?;
        let intent = params.get_intent()?.to_string()?;
        let wait = Duration::from_millis(params.get_wait_ms().into()).min(SYNC_WAIT_MAX);
        let runtimes = self.runtimes()?;
        let outcome = off_the_loop(move || {
            let backend = (!backend.is_empty()).then_some(backend.as_str());
            runtimes.wait_sync(backend, &intent, wait)
        })
        .await?;
        let (sync, detail, reason) = sync_fields(&outcome);
        let mut out = results.get();
        out.set_sync(sync);
        out.set_sync_detail(detail);
        out.set_sync_reason(reason);
        Ok(())
    }
}

impl RunnerServer {
    fn runtimes(&self) -> capnp::Result<Arc<Runtimes>> {
        Ok(self.owned()?.exec.clone())
    }

    fn owned(&self) -> capnp::Result<&OwnerRuntimes> {
        self.runtimes.get().ok_or_else(|| {
            error_answer(&computer_sync::Error::File {
                errno: libc::EAGAIN,
                message: "the workspace's owner cannot run commands yet (its mount is not \
                          answering); try again"
                    .into(),
            })
        })
    }
}

fn exec_client(runtimes: Arc<Runtimes>, id: &str) -> exec::Client {
    capnp_rpc::new_client(ExecServer {
        runtimes,
        id: id.to_owned(),
    })
}

struct ExecServer {
    runtimes: Arc<Runtimes>,
    id: String,
}

impl exec::Server for ExecServer {
    async fn events(
        self: Rc<Self>,
        params: exec::EventsParams,
        mut results: exec::EventsResults,
    ) -> capnp::Result<()> {
        let params = params.get()?;
        let from = params.get_from();
        let wait = Duration::from_millis(params.get_wait_ms().into()).min(EVENTS_WAIT_MAX);
        let handle = self.runtimes.attach(&self.id, from).map_err(failed)?;
        let events = off_the_loop(move || Ok(next_events(handle, wait))).await?;
        let mut list = results.get().init_events(events.len() as u32);
        for (i, event) in events.iter().enumerate() {
            write_event(event, list.reborrow().get(i as u32));
        }
        Ok(())
    }

    async fn kill(
        self: Rc<Self>,
        params: exec::KillParams,
        _results: exec::KillResults,
    ) -> capnp::Result<()> {
        let signal = params.get()?.get_signal();
        if !(1..=64).contains(&signal) {
            return Err(failed(computer_runtimes::Error::Invalid(format!(
                "signal {signal}: not a signal"
            ))));
        }
        self.runtimes.kill(&self.id, signal).map_err(failed)
    }
}

/// The events ready at the handle's position: waits up to `wait` for the first, then
/// takes what is there, up to [`EVENTS_BYTES_MAX`] of output.
fn next_events(mut handle: ExecHandle, wait: Duration) -> Vec<Event> {
    let mut events = Vec::new();
    let mut bytes = 0;
    let mut next_wait = wait;
    while bytes < EVENTS_BYTES_MAX {
        let Some(event) = handle.next_event(Some(next_wait)) else {
            break;
        };
        if let Event::Output { data, .. } = &event {
            bytes += data.len();
        }
        events.push(event);
        next_wait = Duration::ZERO;
    }
    events
}

fn read_request(request: exec_request::Reader<'_>) -> capnp::Result<(String, ExecOptions)> {
    let text = |t: capnp::Result<capnp::text::Reader<'_>>| -> capnp::Result<Option<String>> {
        let t = t?.to_string()?;
        Ok((!t.is_empty()).then_some(t))
    };
    let stdin = request.get_stdin()?;
    if stdin.len() > STDIN_BYTES_MAX {
        return Err(failed(computer_runtimes::Error::Invalid(format!(
            "stdin of {} bytes: at most {} MiB",
            stdin.len(),
            STDIN_BYTES_MAX >> 20
        ))));
    }
    let mut env = Vec::new();
    for var in request.get_env()? {
        env.push((var.get_name()?.to_string()?, var.get_value()?.to_string()?));
    }
    let timeout_ms = request.get_timeout_ms();
    let options = ExecOptions {
        backend: text(request.get_backend())?,
        cwd: text(request.get_cwd())?,
        stdin: Some(stdin.to_vec()),
        env,
        timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
        id: text(request.get_id())?,
        caller: None,
    };
    Ok((request.get_script()?.to_string()?, options))
}

fn write_backend(backend: &Description, mut out: backend_info::Builder<'_>) {
    out.set_id(&backend.id);
    out.set_summary(&backend.summary);
    out.set_runs(&backend.runs);
    out.set_touches(&backend.touches);
}

fn write_audit(record: &AuditRecord, mut out: audit_item::Builder<'_>) {
    out.set_seq(record.seq);
    out.set_at_ms(record.at_ms);
    out.set_kind(&record.kind);
    out.set_subject(&record.subject);
    out.set_body(&record.body);
}

fn write_event(event: &Event, out: exec_event::Builder<'_>) {
    match event {
        Event::Output { seq, stream, data } => {
            let mut output = out.init_output();
            output.set_seq(*seq);
            output.set_stderr(*stream == Stream::Stderr);
            output.set_data(data);
        }
        Event::Missed { first, next } => {
            let mut missed = out.init_missed();
            missed.set_first(*first);
            missed.set_next(*next);
        }
        Event::Exit { seq, result } => {
            let mut exit = out.init_exit();
            exit.set_seq(*seq);
            write_outcome(result, exit.init_result());
        }
    }
}

fn write_outcome(result: &ExecResult, mut out: exec_outcome::Builder<'_>) {
    out.set_status(status_name(result.status));
    out.set_exit_code(result.exit_code);
    out.set_duration_ms(result.duration.as_millis() as u64);
    out.set_backend(&result.backend);
    out.set_reason(&result.reason);
    let (sync, detail, reason) = sync_fields(&result.sync);
    out.set_sync(sync);
    out.set_sync_detail(detail);
    out.set_sync_reason(reason);
    out.set_error(result.error.as_deref().unwrap_or(""));
    if let Some(value) = &result.value {
        out.set_value(value);
    }
}

/// A sync outcome as the wire carries it: its name, the intent (pending) or the reason
/// (lost), and why a pending one's last attempt failed.
fn sync_fields(outcome: &SyncOutcome) -> (&'static str, &str, &str) {
    match outcome {
        SyncOutcome::Complete => ("complete", "", ""),
        SyncOutcome::Pending { intent, reason } => ("pending", intent, reason),
        SyncOutcome::Lost { reason } => ("lost", reason, ""),
    }
}

/// The outcome [`sync_fields`] wrote.
fn read_sync(sync: &str, detail: String, reason: String) -> SyncOutcome {
    match sync {
        "complete" => SyncOutcome::Complete,
        "pending" => SyncOutcome::Pending {
            intent: detail,
            reason,
        },
        _ => SyncOutcome::Lost { reason: detail },
    }
}

// ---------------------------------------------------------------------------------------
// The caller's side.

pub fn write_request(script: &str, options: &ExecOptions, mut out: exec_request::Builder<'_>) {
    out.set_script(script);
    out.set_backend(options.backend.as_deref().unwrap_or(""));
    out.set_cwd(options.cwd.as_deref().unwrap_or(""));
    out.set_stdin(options.stdin.as_deref().unwrap_or(&[]));
    out.set_timeout_ms(options.timeout.map_or(0, |t| t.as_millis().max(1) as u64));
    out.set_id(options.id.as_deref().unwrap_or(""));
    let mut env = out.init_env(options.env.len() as u32);
    for (i, (name, value)) in options.env.iter().enumerate() {
        let mut var = env.reborrow().get(i as u32);
        var.set_name(name);
        var.set_value(value);
    }
}

/// Reads an exec's events until its exit, handing each (the exit too) to `each` as it
/// comes and waiting for what `each` returns before reading on: a slow consumer slows
/// the reading, it does not make events pile up here.
pub async fn follow<Fut: std::future::Future<Output = ()>>(
    upstream: &computer_sync::RemoteUpstream,
    exec: &exec::Client,
    mut each: impl FnMut(Event) -> Fut,
) -> anyhow::Result<ExecResult> {
    let mut from = 0;
    loop {
        let mut request = exec.events_request();
        request.get().set_from(from);
        request.get().set_wait_ms(EVENTS_WAIT.as_millis() as u32);
        let answer = upstream.answer(request.send().promise).await?;
        for event in answer.get()?.get_events()? {
            let event = read_event(event)?;
            let ended = match &event {
                Event::Output { seq, .. } => {
                    from = seq + 1;
                    None
                }
                Event::Missed { next, .. } => {
                    from = *next;
                    None
                }
                Event::Exit { result, .. } => Some(result.clone()),
            };
            each(event).await;
            if let Some(result) = ended {
                return Ok(result);
            }
        }
    }
}

/// A backend as the runner's `backends` answered.
pub fn read_backend(backend: backend_info::Reader<'_>) -> capnp::Result<Description> {
    Ok(Description {
        id: text(backend.get_id())?,
        summary: text(backend.get_summary())?,
        runs: text(backend.get_runs())?,
        touches: text(backend.get_touches())?,
    })
}

pub fn read_event(event: exec_event::Reader<'_>) -> capnp::Result<Event> {
    Ok(match event.which()? {
        exec_event::Which::Output(output) => Event::Output {
            seq: output.get_seq(),
            stream: match output.get_stderr() {
                true => Stream::Stderr,
                false => Stream::Stdout,
            },
            data: output.get_data()?.to_vec(),
        },
        exec_event::Which::Missed(missed) => Event::Missed {
            first: missed.get_first(),
            next: missed.get_next(),
        },
        exec_event::Which::Exit(exit) => Event::Exit {
            seq: exit.get_seq(),
            result: read_outcome(exit.get_result()?)?,
        },
    })
}

/// Text the wire carries, as an owned string.
fn text(t: capnp::Result<capnp::text::Reader<'_>>) -> capnp::Result<String> {
    Ok(t?.to_string()?)
}

/// The outcome a `waitSync` call answered.
pub fn read_wait_sync(answer: runner::wait_sync_results::Reader<'_>) -> capnp::Result<SyncOutcome> {
    Ok(read_sync(
        answer.get_sync()?.to_str()?,
        text(answer.get_sync_detail())?,
        text(answer.get_sync_reason())?,
    ))
}

fn read_outcome(outcome: exec_outcome::Reader<'_>) -> capnp::Result<ExecResult> {
    let status = match outcome.get_status()?.to_str()? {
        "completed" => ExecStatus::Completed,
        "cancelled" => ExecStatus::Cancelled,
        "timed out" => ExecStatus::TimedOut,
        _ => ExecStatus::Failed,
    };
    let sync = read_sync(
        outcome.get_sync()?.to_str()?,
        text(outcome.get_sync_detail())?,
        text(outcome.get_sync_reason())?,
    );
    let error = text(outcome.get_error())?;
    Ok(ExecResult {
        status,
        exit_code: outcome.get_exit_code(),
        duration: Duration::from_millis(outcome.get_duration_ms()),
        backend: text(outcome.get_backend())?,
        reason: text(outcome.get_reason())?,
        sync,
        error: (!error.is_empty()).then_some(error),
        value: (outcome.has_value())
            .then(|| text(outcome.get_value()))
            .transpose()?,
    })
}

pub fn read_audit(item: audit_item::Reader<'_>) -> capnp::Result<AuditRecord> {
    Ok(AuditRecord {
        seq: item.get_seq(),
        at_ms: item.get_at_ms(),
        kind: item.get_kind()?.to_string()?,
        subject: item.get_subject()?.to_string()?,
        body: item.get_body()?.to_string()?,
    })
}
