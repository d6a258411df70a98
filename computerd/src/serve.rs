//! `computerd serve <DB> --listen <ADDR>`: serve an authoritative workspace to replicas
//! (`computerd mount --remote`) and clients (`computerd fs --remote`) over Cap'n Proto
//! RPC, until SIGINT or SIGTERM. Commands asked of its runner run in a sandbox over a
//! replica of its own (`serve_exec.rs`), taken down before the server stops.
//!
//! Readiness: once the socket is bound and the runner can run commands, one line
//! `listening on ADDR` goes to stdout (with the port the system chose for `tcp:HOST:0`),
//! so a script or test can wait for it instead of sleeping.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use computer_runtimes::PolicyFile;
use computer_sync::files::FileStreams;
use computer_sync::rpc::{self, Address, ServeOptions, ServerSocket};
use computer_sync::Authority;
use computer_vfs::{Options, Workspace};

use crate::channel::ChannelServer;
use crate::exec_wire::{self, RuntimesSlot};
use crate::owner::{self, Holder, OwnerLock, Role};
use crate::remote;
use crate::serve_exec::ServedReplica;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The authoritative workspace database (made, and said so, if nothing is at that
    /// path).
    pub db: PathBuf,
    /// Where to listen: a Unix socket path, or tcp:HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// The file holding the token clients must present (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Connections served at once; more are closed as they come.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub connections_max: usize,
    /// The policy of the commands this server runs: a TOML file with [linux], [shell]
    /// and [js] tables (docs/RUNTIMES.md). Default: no network, the default limits.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let address = remote::address(&args.listen)?;
    let token = remote::read_token(args.token_file.as_deref())?;
    if args.connections_max == 0 {
        anyhow::bail!("--connections-max must be at least 1");
    }
    // Read before anything starts, so that a mistake in it stops the server.
    let policies = PolicyFile::policies_at(args.policy.as_deref())?;
    // Held until this function returns, after the last handle on the database closed.
    let holder = Holder::me(Role::Serve {
        address: args.listen.clone(),
    });
    let mut owner = match OwnerLock::acquire(&args.db, holder, false, Holder::will_leave)? {
        Ok(Some(lock)) => lock,
        Ok(None) => unreachable!("a writer never goes on without the lock"),
        Err(other) => return Err(owner::held_error(&args.db, &other)),
    };
    crate::init::announce_new(&args.db);
    let options = Options {
        // Only where nothing is: an existing file that is not a workspace is an error.
        create: args.db.symlink_metadata().is_err(),
        ..Options::default()
    };
    let ws = Workspace::open(&args.db, options).map_err(crate::fs_error::vfs_err)?;
    // `computerd fs DB` from other processes on this machine runs here, and so do
    // execs, once the socket is bound (the replica they run over dials it).
    let runtimes = RuntimesSlot::default();
    let runner = exec_wire::runner_maker(runtimes.clone(), ws.clone());
    let (channel, offer) = ChannelServer::start(&args.db, ws.clone(), None, Some(runner.clone()))?;
    owner.offer(offer)?;
    owner.serving(None)?;
    let serve_options = ServeOptions {
        connections_max: args.connections_max,
        files: Some(FileStreams::default()),
        runner: Some(runner),
        ..ServeOptions::default()
    };
    let authority = Authority::new(ws.clone(), token.clone());
    let audited = ws.clone();
    rpc::run_local(async move {
        let socket = ServerSocket::bind(&address)
            .await
            .with_context(|| format!("{address}: cannot listen"))?;
        let bound = socket.local_address().unwrap_or(address.clone());
        let replica = Arc::new(ServedReplica::new(&bound.to_string(), &token)?);
        // The shell works on the served workspace itself; its changes reach the
        // replica (and the sandboxes over it) with the next command's pull.
        let made = exec_wire::owner_runtimes(replica.clone(), policies, &audited, None)?;
        let _ = runtimes.set(made);
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "listening on {bound}")?;
            stdout.flush()?;
        }
        tracing::info!(db = %args.db.display(), %bound, "serving");
        let stop = stop_after_signal(runtimes, replica);
        rpc::serve(socket, authority, serve_options, stop).await;
        if let Address::Unix(path) = &bound {
            let _ = std::fs::remove_file(path);
        }
        anyhow::Ok(())
    })
    .context("starting the server's event loop")??;
    tracing::info!("stopped serving");
    owner.finishing();
    drop(channel);
    // The last handle: committing and checkpointing happen as it closes.
    drop(ws);
    Ok(ExitCode::SUCCESS)
}

/// Resolves once a signal asked the server to stop and its commands and replica are
/// gone: they go while the server still answers the replica's last push.
async fn stop_after_signal(runtimes: RuntimesSlot, replica: Arc<ServedReplica>) {
    shutdown_signal().await;
    let closing = tokio::task::spawn_blocking(move || {
        if let Some(runtimes) = runtimes.get() {
            runtimes.close(RUNTIMES_CLOSE_WAIT);
        }
        replica.close();
    });
    if let Err(err) = closing.await {
        tracing::warn!("taking the server's commands down: {err}");
    }
}

/// How long the server's end waits for the commands it killed to end.
const RUNTIMES_CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Resolves at the first SIGINT, SIGTERM or SIGHUP.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ];
    let mut streams = Vec::new();
    for kind in kinds {
        match signal(kind) {
            Ok(stream) => streams.push(stream),
            Err(err) => tracing::warn!("cannot watch signal {kind:?}: {err}"),
        }
    }
    if streams.is_empty() {
        std::future::pending::<()>().await;
    }
    let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
    futures::future::select_all(waits).await;
    tracing::info!("signalled, stopping");
}
