//! What the commands that talk to a server share: the server's address and token, and
//! `computerd fs --remote ADDR <command>`, which runs a file command on the served
//! workspace through the protocol's typed calls and file streams.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use computer_sync::rpc::{Address, RemoteUpstream};
use computer_sync::wire::FILE_PIECE_BYTES_MAX;

use crate::fs_args::FsCommand;
use crate::fs_files::{connection_error, RemoteFiles};
use crate::fs_ops::Stdio;

/// The environment variable holding the token when no `--token-file` is given.
pub const TOKEN_ENV: &str = "COMPUTERD_TOKEN";

/// Longest token accepted (the protocol's bound).
const TOKEN_BYTES_MAX: usize = computer_sync::wire::TOKEN_BYTES_MAX;

/// The shared secret: the content of `file` (one trailing newline dropped), or else
/// `$COMPUTERD_TOKEN`. An empty token is refused here rather than by the server: it is
/// always a mistake.
pub fn read_token(file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    let token = match file {
        Some(path) => {
            let mut bytes = std::fs::read(path)
                .with_context(|| format!("{}: cannot read the token file", path.display()))?;
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
            }
            if bytes.is_empty() {
                bail!("{}: the token file is empty", path.display());
            }
            bytes
        }
        None => match std::env::var_os(TOKEN_ENV) {
            Some(value) if !value.is_empty() => value.as_bytes().to_vec(),
            _ => bail!("no token: pass --token-file FILE or set {TOKEN_ENV}"),
        },
    };
    if token.len() > TOKEN_BYTES_MAX {
        bail!(
            "the token is {} bytes long, at most {TOKEN_BYTES_MAX} are allowed",
            token.len()
        );
    }
    Ok(token)
}

/// Parses a `--listen`/`--remote` address.
pub fn address(text: &str) -> anyhow::Result<Address> {
    text.parse::<Address>().map_err(|err| anyhow!("{err}"))
}

/// `computerd fs --remote ADDR <command>`: sends the command line as given (it was
/// parsed here already, so a typo fails before anything is sent) and prints the output.
pub fn fs(
    remote: &str,
    token_file: Option<&Path>,
    command: &FsCommand,
) -> anyhow::Result<ExitCode> {
    if matches!(command, FsCommand::Import { .. } | FsCommand::Export { .. }) {
        bail!(
            "import and export copy between the workspace and this host's files, which a \
             remote workspace cannot reach: mount a replica (computerd mount --remote) and \
             copy with ordinary tools"
        );
    }
    let address = address(remote)?;
    let token = read_token(token_file)?;
    run_at(&address, &token, command)
}

/// `computerd fs DB <command>` on a database another process owns: the command runs in
/// that process, through the channel its owner file names (`owner.rs`).
pub fn fs_through_owner(
    db: &Path,
    channel: &crate::owner::Channel,
    command: &FsCommand,
) -> anyhow::Result<ExitCode> {
    if matches!(command, FsCommand::Import { .. } | FsCommand::Export { .. }) {
        bail!(
            "{}: import and export run only on a database no other process holds: copy \
             through its mount, or unmount it first",
            db.display()
        );
    }
    let address = Address::Unix(channel.socket.clone());
    run_at(&address, channel.token.as_bytes(), command)
}

/// Runs `command` on the server at `address`: file operations through its typed calls
/// (`fs_files.rs`), `cat` and `write` through file streams (any size, in bounded
/// memory). Exits with the command's status.
fn run_at(address: &Address, token: &[u8], command: &FsCommand) -> anyhow::Result<ExitCode> {
    let files = RemoteFiles::connect(address, token)?;
    if command.is_file_operation() {
        let (mut stdin, mut stdout, mut stderr) = (
            std::io::stdin().lock(),
            std::io::stdout(),
            std::io::stderr(),
        );
        let mut stdio = Stdio {
            stdin: &mut stdin,
            stdout: &mut stdout,
            stderr: &mut stderr,
        };
        return crate::fs_ops::run_file_operation(&files, command.clone(), &mut stdio, false);
    }
    let upstream = files.upstream();
    let ran = files.block_on(async {
        match command {
            FsCommand::Cat { paths } => cat(upstream, paths).await,
            FsCommand::Write { path, append } => write(upstream, path, *append).await,
            other => Err(Failure::Local(anyhow!(
                "{}: runs only on a database this process opens",
                other.name()
            ))),
        }
    });
    ran.map_err(|err| match err {
        Failure::Sync(err) => connection_error(address, err),
        Failure::Local(err) => err,
    })
}

/// Why a remote command could not finish: the server or the connection failed, or
/// something on this side did (stdin, stdout).
enum Failure {
    Sync(computer_sync::Error),
    Local(anyhow::Error),
}

impl From<computer_sync::Error> for Failure {
    fn from(err: computer_sync::Error) -> Failure {
        Failure::Sync(err)
    }
}

/// `cat`: each file streamed to stdout as it arrives. A path that fails is reported
/// and the rest go on, as `cat` does locally.
async fn cat(upstream: &RemoteUpstream, paths: &[String]) -> Result<ExitCode, Failure> {
    let mut stdout = std::io::stdout().lock();
    let mut failed = false;
    for arg in paths {
        let path = crate::fs_ops::ws_path(arg).map_err(Failure::Local)?;
        let mut reader = match upstream.open_read(&path).await {
            Ok(reader) => reader,
            Err(computer_sync::Error::File { message, .. }) => {
                eprintln!("computerd: {message}");
                failed = true;
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        while let Some(piece) = reader.next_piece().await? {
            if let Err(err) = stdout.write_all(&piece) {
                return quiet_if_closed(err);
            }
        }
    }
    if let Err(err) = stdout.flush() {
        return quiet_if_closed(err);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A closed stdout (`| head`) ends `cat` quietly; anything else is an error.
fn quiet_if_closed(err: std::io::Error) -> Result<ExitCode, Failure> {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(ExitCode::SUCCESS);
    }
    Err(Failure::Local(anyhow!(
        "standard output: {}",
        crate::fs_error::describe_io(&err)
    )))
}

/// Pieces of stdin read ahead of the stream (each up to one protocol piece).
const STDIN_PIECES_AHEAD: usize = 2;

/// `write`: stdin streamed to the file. Without `--append` the file is replaced whole
/// once stdin ends; a write cut short (the connection lost, this process killed) leaves
/// it as it was.
async fn write(upstream: &RemoteUpstream, path: &str, append: bool) -> Result<ExitCode, Failure> {
    let path = crate::fs_ops::ws_path(path).map_err(Failure::Local)?;
    let mut writer = match upstream.open_write(&path, append).await {
        Ok(writer) => writer,
        Err(computer_sync::Error::File { message, .. }) => {
            return Err(Failure::Local(anyhow!("{message}")))
        }
        Err(err) => return Err(err.into()),
    };
    // Stdin is read on a thread of its own: a slow producer must not stall the event
    // loop that answers the calls in flight.
    let (pieces, mut arriving) = tokio::sync::mpsc::channel(STDIN_PIECES_AHEAD);
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || read_stdin_into(pieces))
        .map_err(|err| Failure::Local(anyhow!("starting to read stdin: {err}")))?;
    while let Some(piece) = arriving.recv().await {
        let piece = piece.map_err(Failure::Local)?;
        writer.write(&piece).await.map_err(file_error)?;
    }
    writer.commit().await.map_err(file_error)?;
    Ok(ExitCode::SUCCESS)
}

/// A store's refusal reads as the store's own one line; others name the server.
fn file_error(err: computer_sync::Error) -> Failure {
    match err {
        computer_sync::Error::File { message, .. } => Failure::Local(anyhow!("{message}")),
        other => Failure::Sync(other),
    }
}

/// Sends stdin to `pieces` until its end or an error (sent too), or until the receiver
/// is gone.
fn read_stdin_into(pieces: tokio::sync::mpsc::Sender<anyhow::Result<Vec<u8>>>) {
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut piece = vec![0u8; FILE_PIECE_BYTES_MAX];
        let n = match stdin.read(&mut piece) {
            Ok(0) => return,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                let err = anyhow!("standard input: {}", crate::fs_error::describe_io(&err));
                let _ = pieces.blocking_send(Err(err));
                return;
            }
        };
        piece.truncate(n);
        if pieces.blocking_send(Ok(piece)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_the_file_without_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        assert_eq!(read_token(Some(&file)).unwrap(), b"s3cret");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_token(Some(&file)).is_err());
        assert!(read_token(Some(&dir.path().join("missing"))).is_err());
    }
}
