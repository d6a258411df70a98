//! `computerd mcp DB|--remote ADDR`: serves the agent tools of `runtimes::tools`
//! (read, write, edit, ls, find, grep and exec) over the Model Context Protocol on
//! stdio, for an agent host to start and talk to.
//!
//! This process translates, it does not decide: every call goes to the workspace's
//! owner over its channel, as `computerd exec` goes (the runner's `tool` and `exec`),
//! and the owner runs it under its policy and keeps its audit record. On a database
//! that is the running mount of it, or a mount this process makes in a private
//! directory for as long as it serves (taken down when the host closes stdin or
//! signals); with `--remote` it is the server at ADDR.
//!
//! Two threads: rmcp's session on a current-thread runtime of the main thread, and the
//! Cap'n Proto connection (whose clients cannot cross threads) on a thread of its own,
//! taking calls over a channel ([`Bridge`]). An exec's output goes to the host as
//! progress notifications as it arrives (when the call carried a progress token), and
//! the host cancelling the call kills the command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use computer_runtimes::tools::{self, ExecArgs, ToolSpec, Transcript, EXEC, FILE_TOOLS};
use computer_runtimes::{Description, Event, ExecOptions, ExecResult, KILL_GRACE};
use computer_sync::exec_capnp::runner;
use computer_sync::rpc::Address;
use computer_sync::RemoteUpstream;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::exec::Owner;
use crate::exec_wire;
use crate::fs_files::RemoteFiles;

/// Events of one exec on their way from the owner's connection to the host, at most:
/// a host that reads slowly slows the reading of the exec's events (the owner's log
/// keeps them, bounded) rather than piling them up here.
const EXEC_EVENTS_QUEUED: usize = 16;
/// The longest JSON-RPC message read from the host, bytes: a call's arguments at their
/// most and room for the rest. rmcp drops a longer line (with a line in the log).
const MESSAGE_BYTES_MAX: usize = tools::ARGUMENTS_BYTES_MAX + (1 << 20);
/// How long the end of the session waits for the commands it killed to end: SIGKILL
/// follows SIGTERM after `KILL_GRACE`.
const COMMANDS_STOP_WAIT: Duration = KILL_GRACE.saturating_add(Duration::from_secs(2));
/// What a call says once the owner's connection is lost: the session does not reconnect.
const OWNER_GONE: &str =
    "the workspace's owner is gone (unmounted or stopped): start the MCP server again";
/// How long the end of the session waits for rmcp's stdin reader to let go.
const STDIN_RELEASE_WAIT: Duration = Duration::from_millis(200);

#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// The workspace database (or give --remote): its running mount serves the calls,
    /// or a mount made for this session in a private directory.
    #[arg(
        value_name = "DB",
        required_unless_present = "remote",
        conflicts_with = "remote"
    )]
    db: Option<PathBuf>,
    /// Serve the workspace served at ADDR (a Unix socket path, or tcp:HOST:PORT).
    #[arg(long, value_name = "ADDR")]
    remote: Option<String>,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    token_file: Option<PathBuf>,
    /// The policy (docs/RUNTIMES.md) of the mount made for this session; not for a
    /// workspace mounted or served, whose owner's policy applies.
    #[arg(long, value_name = "FILE", conflicts_with = "remote")]
    policy: Option<PathBuf>,
}

pub fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    let (address, token, owner) = match (&args.remote, &args.db) {
        (Some(address), _) => (
            crate::remote::address(address)?,
            crate::remote::read_token(args.token_file.as_deref())?,
            None,
        ),
        (None, Some(db)) => {
            let owner = Owner::for_db(db, args.policy.as_deref())?;
            let (address, token) = owner.address();
            (address, token, Some(owner))
        }
        (None, None) => unreachable!("clap requires DB or --remote"),
    };
    let served = Bridge::start(address, token).and_then(|(bridge, backends, connection)| {
        let served = serve_stdio(McpServer::new(bridge, &backends));
        // Every `Bridge` went with the session's runtime: the thread stops what still
        // runs and ends.
        if connection.join().is_err() {
            tracing::warn!("the connection's thread panicked");
        }
        served
    });
    if let Some(owner) = owner {
        owner.finish()?;
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Serves the session until the host closes stdin or a signal comes.
fn serve_stdio(server: McpServer) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async move {
        let (stdin, stdout) = rmcp::transport::stdio();
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(stdin, stdout)
            .with_max_line_length(MESSAGE_BYTES_MAX);
        let service = server
            .serve(transport)
            .await
            .context("starting the MCP session on stdio")?;
        tokio::select! {
            ended = service.waiting() => {
                ended.context("the MCP session")?;
            }
            () = crate::serve::shutdown_signal() => {}
        }
        anyhow::Ok(())
    });
    // A blocked read of stdin would hold a plain drop of the runtime forever.
    runtime.shutdown_timeout(STDIN_RELEASE_WAIT);
    served
}

/// The MCP side: the tool list, and each call handed to the [`Bridge`].
#[derive(Clone)]
struct McpServer {
    bridge: Bridge,
    tools: Arc<Vec<Tool>>,
    instructions: String,
}

impl McpServer {
    fn new(bridge: Bridge, backends: &[Description]) -> McpServer {
        let tools = tools::catalog()
            .into_iter()
            .map(|spec| mcp_tool(spec, backends))
            .collect();
        McpServer {
            bridge,
            tools: Arc::new(tools),
            instructions: instructions(backends),
        }
    }

    /// Runs an exec, sending its output as progress while it runs; the answer once it
    /// ended, or the sentence saying why it could not run.
    async fn exec(
        &self,
        arguments: serde_json::Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let args: ExecArgs =
            tools::parse(EXEC, &arguments.to_string()).map_err(|e| e.to_string())?;
        // The owner names the caller from the connection; this one is a placeholder.
        let (script, options) = args.into_exec("mcp").map_err(|e| e.to_string())?;
        let mut events = self.bridge.exec(script, options, context.ct.clone())?;
        let progress = context.meta.get_progress_token();
        let mut transcript = Transcript::default();
        let mut printed = 0;
        while let Some(event) = events.recv().await {
            let event = event?;
            transcript.push(&event);
            match (&event, &progress) {
                (Event::Output { data, .. }, Some(token)) => {
                    printed += data.len();
                    let note = ProgressNotificationParam::new(token.clone(), printed as f64)
                        .with_message(String::from_utf8_lossy(data));
                    if let Err(err) = context.peer.notify_progress(note).await {
                        tracing::debug!("sending exec output as progress: {err}");
                    }
                }
                (Event::Exit { result, .. }, _) => return Ok(transcript.answer(result)),
                _ => {}
            }
        }
        Err("the connection to the workspace's owner ended before the command did".into())
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("computerd", crate::VERSION))
            .with_instructions(self.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let answered = match request.name.as_ref() {
            EXEC => self.exec(arguments, &context).await,
            name if FILE_TOOLS.contains(&name) => {
                self.bridge.tool(name, arguments.to_string()).await
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("{other}: no such tool"),
                    None,
                ))
            }
        };
        // A tool's failure is the model's to read and act on, not a protocol error.
        let result = match answered {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
        };
        Ok(result.into())
    }
}

/// A tool as MCP lists it; `exec` names the backends the owner registered.
fn mcp_tool(spec: ToolSpec, backends: &[Description]) -> Tool {
    let mut schema = spec.input_schema;
    let mut description = spec.description.to_owned();
    if spec.name == EXEC {
        description.push_str(&backends_text(backends));
        let ids: Vec<&str> = backends.iter().map(|b| b.id.as_str()).collect();
        let default = ids.first().copied().unwrap_or("none");
        let said = format!("The backend: {} (default: {default}).", ids.join(", "));
        if let Some(backend) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut("backend"))
            .and_then(|b| b.as_object_mut())
        {
            backend.insert("description".into(), said.into());
        }
    }
    let mut tool = Tool::new(spec.name, description, Arc::new(schema));
    if spec.read_only {
        tool.annotations = Some(ToolAnnotations::new().read_only(true));
    }
    tool
}

/// The backends, a line each, for the exec tool's description.
fn backends_text(backends: &[Description]) -> String {
    let mut text = String::from("\n\nBackends:");
    for (i, backend) in backends.iter().enumerate() {
        let default = if i == 0 { " (the default)" } else { "" };
        text.push_str(&format!(
            "\n- `{}`{default}: {}; runs {}; touches {}.",
            backend.id, backend.summary, backend.runs, backend.touches
        ));
    }
    text
}

fn instructions(backends: &[Description]) -> String {
    let ids: Vec<&str> = backends.iter().map(|b| b.id.as_str()).collect();
    format!(
        "A workspace: files that outlive any one sandbox. Work on its files with read, \
         write, edit, ls, find and grep (paths from the workspace root), and run commands \
         with exec, which sees the workspace at /workspace (backends: {}). Every answer \
         is bounded and says when it was cut.",
        ids.join(", ")
    )
}

/// The way from rmcp's tasks to the thread that holds the owner's connection.
#[derive(Clone)]
struct Bridge {
    calls: mpsc::UnboundedSender<Call>,
}

enum Call {
    Tool {
        name: String,
        arguments: String,
        reply: oneshot::Sender<Result<String, String>>,
    },
    Exec {
        script: String,
        options: ExecOptions,
        /// Fired when the host cancels the call: the command is killed.
        cancel: CancellationToken,
        events: mpsc::Sender<Result<Event, String>>,
    },
}

impl Bridge {
    /// Connects to the owner at `address` on a thread of its own; the backends its
    /// runner has.
    /// The thread ends once every `Bridge` is gone, having stopped the commands still
    /// running: join it before the process exits.
    fn start(
        address: Address,
        token: Vec<u8>,
    ) -> anyhow::Result<(Bridge, Vec<Description>, std::thread::JoinHandle<()>)> {
        let (calls, taken) = mpsc::unbounded_channel();
        let (ready, connected) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mcp-owner".into())
            .spawn(move || hold_connection(&address, &token, ready, taken))
            .context("starting the connection's thread")?;
        let backends = connected
            .recv()
            .context("the connection's thread ended before it connected")??;
        Ok((Bridge { calls }, backends, thread))
    }

    async fn tool(&self, name: &str, arguments: String) -> Result<String, String> {
        let (reply, answer) = oneshot::channel();
        let call = Call::Tool {
            name: name.to_owned(),
            arguments,
            reply,
        };
        self.calls.send(call).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    fn exec(
        &self,
        script: String,
        options: ExecOptions,
        cancel: CancellationToken,
    ) -> Result<mpsc::Receiver<Result<Event, String>>, String> {
        let (events, receiver) = mpsc::channel(EXEC_EVENTS_QUEUED);
        let call = Call::Exec {
            script,
            options,
            cancel,
            events,
        };
        self.calls.send(call).map_err(|_| gone())?;
        Ok(receiver)
    }
}

fn gone() -> String {
    "the connection to the workspace's owner is gone; start the MCP server again".into()
}

/// The connection's thread: connects, says what backends there are, then answers calls
/// (each a task of its own, so an exec does not hold up a read) until the MCP side ends.
fn hold_connection(
    address: &Address,
    token: &[u8],
    ready: std::sync::mpsc::Sender<anyhow::Result<Vec<Description>>>,
    mut calls: mpsc::UnboundedReceiver<Call>,
) {
    let files = match RemoteFiles::connect(address, token) {
        Ok(files) => files,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    let upstream = files.upstream().clone();
    files.block_on(async move {
        let runner = match backends(&upstream).await {
            Ok((runner, backends)) => {
                let _ = ready.send(Ok(backends));
                runner
            }
            Err(err) => {
                let _ = ready.send(Err(crate::exec::owner_call_error(address, err)));
                return;
            }
        };
        // The exec calls not seen to end: what the end of the session must stop.
        let mut running: Vec<(CancellationToken, JoinHandle<()>)> = Vec::new();
        while let Some(call) = calls.recv().await {
            let cancel = match &call {
                Call::Exec { cancel, .. } => Some(cancel.clone()),
                Call::Tool { .. } => None,
            };
            let (upstream, runner, address) = (upstream.clone(), runner.clone(), address.clone());
            let task = tokio::task::spawn_local(async move {
                answer(&upstream, &runner, &address, call).await;
            });
            running.retain(|(_, task)| !task.is_finished());
            running.extend(cancel.map(|cancel| (cancel, task)));
        }
        stop_commands(running).await;
    });
}

/// The host is gone (it closed stdin, or a signal came): the commands it started and
/// did not see end are killed, as if it had cancelled each, and followed to their end
/// for a while so that the kill reaches them.
async fn stop_commands(running: Vec<(CancellationToken, JoinHandle<()>)>) {
    let (cancels, tasks): (Vec<_>, Vec<_>) = running.into_iter().unzip();
    cancels.iter().for_each(CancellationToken::cancel);
    if tokio::time::timeout(COMMANDS_STOP_WAIT, futures::future::join_all(tasks))
        .await
        .is_err()
    {
        tracing::warn!("commands of the MCP session still running after the kill");
    }
}

async fn backends(upstream: &RemoteUpstream) -> anyhow::Result<(runner::Client, Vec<Description>)> {
    let runner = upstream.runner().await?;
    let request = runner.backends_request();
    let answer = upstream.answer(request.send().promise).await?;
    let backends = answer
        .get()?
        .get_backends()?
        .iter()
        .map(exec_wire::read_backend)
        .collect::<capnp::Result<_>>()?;
    Ok((runner, backends))
}

async fn answer(upstream: &RemoteUpstream, runner: &runner::Client, address: &Address, call: Call) {
    let said = |err: anyhow::Error| {
        let lost = matches!(
            err.downcast_ref::<computer_sync::Error>(),
            Some(computer_sync::Error::Disconnected { .. })
        );
        let said = crate::exec::owner_call_error(address, err);
        if !lost {
            return said.to_string();
        }
        format!("{said}; {OWNER_GONE}")
    };
    match call {
        Call::Tool {
            name,
            arguments,
            reply,
        } => {
            let answered = tool(upstream, runner, &name, &arguments).await;
            let _ = reply.send(answered.map_err(said));
        }
        Call::Exec {
            script,
            options,
            cancel,
            events,
        } => {
            let sink = events.clone();
            let each = move |event| {
                let sink = sink.clone();
                // A host gone from the call still has its command followed to the end.
                async move { drop(sink.send(Ok(event)).await) }
            };
            let ran = exec(upstream, runner, &script, &options, cancel, each).await;
            if let Err(err) = ran {
                let _ = events.send(Err(said(err))).await;
            }
        }
    }
}

async fn tool(
    upstream: &RemoteUpstream,
    runner: &runner::Client,
    name: &str,
    arguments: &str,
) -> anyhow::Result<String> {
    let mut request = runner.tool_request();
    request.get().set_name(name);
    request.get().set_arguments(arguments);
    let answer = upstream.answer(request.send().promise).await?;
    Ok(answer.get()?.get_text()?.to_string()?)
}

/// Starts the exec and follows it to its end, each event to `each`; `cancel` firing
/// sends it SIGTERM (the owner follows with SIGKILL).
async fn exec<Fut: std::future::Future<Output = ()>>(
    upstream: &RemoteUpstream,
    runner: &runner::Client,
    script: &str,
    options: &ExecOptions,
    cancel: CancellationToken,
    each: impl FnMut(Event) -> Fut,
) -> anyhow::Result<ExecResult> {
    let mut request = runner.exec_request();
    exec_wire::write_request(script, options, request.get().init_request());
    let answer = upstream.answer(request.send().promise).await?;
    let exec = answer.get()?.get_exec()?;
    let (killer, link) = (exec.clone(), upstream.clone());
    let killing = tokio::task::spawn_local(async move {
        cancel.cancelled().await;
        let mut request = killer.kill_request();
        request.get().set_signal(libc::SIGTERM);
        if let Err(err) = link.answer(request.send().promise).await {
            tracing::warn!("killing a cancelled exec: {err}");
        }
    });
    let followed = exec_wire::follow(upstream, &exec, each).await;
    killing.abort();
    followed
}
