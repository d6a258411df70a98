//! The owner's channel: a Unix socket beside the database (`DB.owner.sock`, mode 0600)
//! on which the process that owns a workspace (`owner.rs`) runs `computerd fs` commands
//! for other processes, with the same `fs` calls and file streams `computerd serve`
//! answers remote clients with, behind a token of its own that only the owner file tells.
//!
//! A command run here is a change of the owner's own workspace: a mount takes it like a
//! write through the kernel, so nothing of it is undone by the mount's staged files, and
//! the mount tells the kernel to forget what it cached of every path it changed (read
//! back from the change log, so a recursive remove or copy forgets its whole tree).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use computer_sync::files::FileStreams;
use computer_sync::rpc::{self, Address, RunnerMaker, ServeOptions, ServerSocket};
use computer_sync::{AppliedObserver, Authority};
use computer_vfs::Workspace;

use crate::owner::Channel;

/// File commands run at once for other processes.
const CONNECTIONS_MAX: usize = 16;

/// Where the channel of the database at `db` listens.
pub fn socket_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".owner.sock");
    PathBuf::from(name)
}

/// The channel's server, on a thread of its own, until dropped.
pub struct ChannelServer {
    stop: Option<futures::channel::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
}

impl ChannelServer {
    /// Starts serving file commands on `ws` for the database at `db`; `changed` hears
    /// the paths each command changed. Returns the server and what the owner file
    /// publishes of it.
    pub fn start(
        db: &Path,
        ws: Workspace,
        changed: Option<AppliedObserver>,
        runner: Option<RunnerMaker>,
    ) -> anyhow::Result<(ChannelServer, Channel)> {
        let socket = std::path::absolute(socket_path(db)).context("finding the channel's path")?;
        if socket.as_os_str().len() > rpc::UNIX_SOCKET_PATH_BYTES_MAX {
            bail!(
                "{}: too long for a Unix socket ({} bytes at most); use a database with a \
                 shorter path",
                socket.display(),
                rpc::UNIX_SOCKET_PATH_BYTES_MAX
            );
        }
        // We own the database, so a socket here is a dead owner's.
        match std::fs::remove_file(&socket) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(err).with_context(|| format!("{}: cannot replace", socket.display()))
            }
            _ => {}
        }
        let token = new_token();
        let (stop, stopped) = futures::channel::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        let address = Address::Unix(socket.clone());
        let authority = Authority::new(ws.clone(), token.clone());
        let options = ServeOptions {
            files: Some(FileStreams { changed }),
            connections_max: CONNECTIONS_MAX,
            runner,
            ..ServeOptions::default()
        };
        let thread_socket = socket.clone();
        let thread = std::thread::Builder::new()
            .name("owner-channel".into())
            .spawn(move || {
                let served = rpc::run_local(async move {
                    let listener = match ServerSocket::bind(&address).await {
                        Ok(listener) => listener,
                        Err(err) => {
                            let _ = bound_tx.send(Err(anyhow::Error::new(err)
                                .context(format!("{}: cannot listen", thread_socket.display()))));
                            return;
                        }
                    };
                    let _ = bound_tx.send(restrict(&thread_socket));
                    rpc::serve(listener, authority, options, async {
                        let _ = stopped.await;
                    })
                    .await;
                });
                if let Err(err) = served {
                    tracing::warn!("the owner channel's event loop: {err}");
                }
            })
            .context("starting the owner channel")?;
        let server = ChannelServer {
            stop: Some(stop),
            thread: Some(thread),
            socket: socket.clone(),
        };
        bound_rx
            .recv()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the owner channel did not start")))?;
        Ok((server, Channel { socket, token }))
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Only the owner's user may connect (the token guards the rest).
fn restrict(socket: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("{}: cannot restrict to its owner", socket.display()))
}

/// 32 random bytes in hex.
fn new_token() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
