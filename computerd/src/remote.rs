//! What the commands that talk to a server share: the server's address and token, and
//! `computerd fs --remote ADDR <command>`, which runs a file command on the served
//! workspace and prints what it printed.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use computer_sync::rpc::{self, Address};
use computer_sync::wire::FS_STREAM_BYTES_MAX;
use computer_sync::ClientInfo;

use crate::fs_args::FsCommand;

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
    let args = command_line(std::env::args_os().skip(1));
    run_at(&address, &token, args, command)
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
    let mut args = command_line(std::env::args_os().skip(1));
    // The database is the first word left: the owner knows which it is.
    let db_word = db.as_os_str().as_bytes();
    if let Some(at) = args.iter().position(|a| a == db_word) {
        args.remove(at);
    }
    let address = Address::Unix(channel.socket.clone());
    run_at(&address, channel.token.as_bytes(), args, command)
}

/// Sends the command line `args` of `command` to the server at `address` and prints
/// what it printed; exits with its status.
fn run_at(
    address: &Address,
    token: &[u8],
    args: Vec<Vec<u8>>,
    command: &FsCommand,
) -> anyhow::Result<ExitCode> {
    let stdin = if matches!(command, FsCommand::Write { .. }) {
        read_stdin()?
    } else {
        Vec::new()
    };
    let output = rpc::run_local(async {
        let (upstream, _) = rpc::connect(address, token, ClientInfo::default()).await?;
        upstream.fs(&args, &stdin).await
    })
    .context("starting the client's event loop")?
    .map_err(|err| match err {
        // It names the address already.
        computer_sync::Error::Disconnected { .. } => anyhow!("{err}"),
        _ => anyhow!("{address}: {err}"),
    })?;
    // A reader that went away (`| head`) is not an error of ours.
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(&output.stdout)
        .and_then(|()| stdout.flush());
    let _ = std::io::stderr().write_all(&output.stderr);
    Ok(ExitCode::from(u8::try_from(output.status).unwrap_or(1)))
}

/// Stdin for a remote `write`, within what one call carries.
fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut stdin = Vec::new();
    std::io::stdin()
        .lock()
        .take(FS_STREAM_BYTES_MAX as u64 + 1)
        .read_to_end(&mut stdin)
        .context("reading stdin")?;
    if stdin.len() > FS_STREAM_BYTES_MAX {
        bail!(
            "stdin is larger than the {} MiB a remote write carries: mount a replica to \
             write large files",
            FS_STREAM_BYTES_MAX >> 20
        );
    }
    Ok(stdin)
}

/// The file command's own arguments out of this process's command line (`args` without
/// the program name): what follows `fs`, without the options that only say where the
/// workspace is (`--remote`, `--token-file`) or how this process logs (`--log`).
fn command_line(args: impl IntoIterator<Item = OsString>) -> Vec<Vec<u8>> {
    const LOCAL_OPTIONS: [&str; 3] = ["--remote", "--token-file", "--log"];
    let mut args = args.into_iter().map(|a| a.as_bytes().to_vec());
    // Global options may come before `fs`.
    for arg in args.by_ref() {
        if arg == b"fs" {
            break;
        }
    }
    let mut out = Vec::new();
    let mut after_separator = false;
    while let Some(arg) = args.next() {
        if !after_separator {
            if arg == b"--" {
                after_separator = true;
            } else if LOCAL_OPTIONS.iter().any(|o| arg == o.as_bytes()) {
                args.next();
                continue;
            } else if LOCAL_OPTIONS
                .iter()
                .any(|o| arg.starts_with(o.as_bytes()) && arg.get(o.len()) == Some(&b'='))
            {
                continue;
            }
        }
        out.push(arg);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> Vec<String> {
        command_line(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| String::from_utf8(a).unwrap())
            .collect()
    }

    #[test]
    fn the_command_line_loses_only_where_the_workspace_is() {
        assert_eq!(
            line(&["--log", "debug", "fs", "--remote", "tcp:h:1", "ls", "-l", "/a"]),
            ["ls", "-l", "/a"]
        );
        assert_eq!(
            line(&[
                "fs",
                "--remote=/s",
                "--token-file",
                "/t",
                "cat",
                "/x",
                "--log=info"
            ]),
            ["cat", "/x"]
        );
        // After `--`, everything is the command's, even what looks like an option.
        assert_eq!(
            line(&["fs", "--remote", "/s", "rm", "--", "--remote"]),
            ["rm", "--", "--remote"]
        );
    }

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
