//! A model test of one owner and a second process on one workspace.
//!
//! The owner writes as a mount does: the kernel writes staging files itself (passthrough)
//! and the store ingests them later, on its own time. Another process's `computerd fs`
//! commands reach the owner through its channel (`channel.rs`): the commands' own code
//! on the typed calls (`fs_ops.rs` on `RemoteFiles`), and file streams. After every step the workspace, read directly, must equal a simple model
//! (each path a file's content or a directory), and whatever the second process read
//! must equal the model too: a change from either side is never undone by the other
//! (the data loss of issue 13 was a mount's staged copy ingested over a command's write).

use computer_vfs::Who;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;

use computer_sync::rpc::Address;
use computer_vfs::{FileKind, MkdirOptions, NewNode, OpenFlags, Options, RmOptions, Workspace};
use proptest::prelude::*;

use crate::channel::ChannelServer;
use crate::fs_args::FsCommand;
use crate::fs_files::RemoteFiles;
use crate::fs_ops::Stdio;

/// The files the operations touch; `/d` is the one directory.
const FILES: [&str; 4] = ["/f1", "/f2", "/d/f1", "/d/f2"];
const DIR: &str = "/d";

/// Each path: `Some(content)` for a file, `None` for a directory.
type Tree = BTreeMap<String, Option<Vec<u8>>>;

#[derive(Clone, Debug)]
enum Op {
    /// The owner's kernel writes the whole file into its staging file.
    OwnerWrite(usize, Vec<u8>),
    OwnerRm(usize),
    OwnerMkdir,
    /// `computerd fs DB write`, through a stream.
    Write(usize, Vec<u8>),
    /// `computerd fs DB write --append`, through a stream.
    Append(usize, Vec<u8>),
    /// `computerd fs DB rm -r -f`.
    Rm(usize),
    /// `computerd fs DB mv`.
    Mv(usize, usize),
    /// `computerd fs DB cp`.
    Cp(usize, usize),
    /// `computerd fs DB mkdir -p /d`.
    Mkdir,
    /// `computerd fs DB cat`, through a stream: what it read is checked.
    Cat(usize),
}

/// A file, or (index 4) the directory.
fn path(index: usize) -> &'static str {
    FILES.get(index).copied().unwrap_or(DIR)
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(at) => &path[..at],
    }
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (1usize..3 << 20, any::<u8>()).prop_map(|(len, byte)| vec![byte; len]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let file = || 0usize..FILES.len();
    let any_path = || 0usize..=FILES.len();
    prop_oneof![
        4 => (file(), data()).prop_map(|(f, d)| Op::OwnerWrite(f, d)),
        1 => any_path().prop_map(Op::OwnerRm),
        1 => Just(Op::OwnerMkdir),
        4 => (file(), data()).prop_map(|(f, d)| Op::Write(f, d)),
        2 => (file(), data()).prop_map(|(f, d)| Op::Append(f, d)),
        1 => any_path().prop_map(Op::Rm),
        2 => (file(), file()).prop_map(|(a, b)| Op::Mv(a, b)),
        2 => (file(), file()).prop_map(|(a, b)| Op::Cp(a, b)),
        1 => Just(Op::Mkdir),
        3 => any_path().prop_map(Op::Cat),
    ]
}

// ------------------------------------------------------------------------------ model

struct Model {
    tree: Tree,
}

impl Model {
    fn new() -> Model {
        Model {
            tree: BTreeMap::from([("/".to_owned(), None)]),
        }
    }

    fn is_dir(&self, path: &str) -> bool {
        matches!(self.tree.get(path), Some(None))
    }

    fn file(&self, path: &str) -> Option<&Vec<u8>> {
        self.tree.get(path).and_then(Option::as_ref)
    }

    fn remove(&mut self, path: &str) {
        let below = format!("{path}/");
        self.tree.retain(|p, _| p != path && !p.starts_with(&below));
    }

    /// Sets a file's content; fails (`false`) if its directory is missing.
    fn put(&mut self, path: &str, content: Vec<u8>) -> bool {
        if !self.is_dir(parent(path)) {
            return false;
        }
        self.tree.insert(path.to_owned(), Some(content));
        true
    }

    fn mkdir(&mut self, exist_ok: bool) -> bool {
        if self.tree.contains_key(DIR) {
            return exist_ok;
        }
        self.tree.insert(DIR.to_owned(), None);
        true
    }

    /// Whether the operation succeeds, and what a read returns.
    fn apply(&mut self, op: &Op) -> (bool, Option<Vec<u8>>) {
        match op {
            Op::OwnerWrite(f, data) | Op::Write(f, data) => {
                (self.put(path(*f), data.clone()), None)
            }
            Op::Append(f, data) => {
                let mut content = self.file(path(*f)).cloned().unwrap_or_default();
                content.extend_from_slice(data);
                (self.put(path(*f), content), None)
            }
            Op::OwnerRm(p) | Op::Rm(p) => {
                self.remove(path(*p));
                (true, None)
            }
            Op::OwnerMkdir => (self.mkdir(false), None),
            Op::Mkdir => (self.mkdir(true), None),
            Op::Mv(a, b) => {
                let (a, b) = (path(*a), path(*b));
                let Some(content) = self.file(a).cloned() else {
                    return (false, None);
                };
                if !self.is_dir(parent(b)) {
                    return (false, None);
                }
                if a != b {
                    self.remove(a);
                    self.put(b, content);
                }
                (true, None)
            }
            Op::Cp(a, b) => {
                let (a, b) = (path(*a), path(*b));
                match self.file(a).cloned() {
                    Some(content) if a != b => (self.put(b, content), None),
                    _ => (false, None),
                }
            }
            Op::Cat(p) => match self.file(path(*p)) {
                Some(content) => (true, Some(content.clone())),
                None => (false, None),
            },
        }
    }
}

// --------------------------------------------------------------------------- the real

/// A workspace with staging, as a mount opens it, and its owner channel.
struct Owner {
    ws: Workspace,
    _channel: ChannelServer,
    files: RemoteFiles,
    _dir: tempfile::TempDir,
}

impl Owner {
    fn start() -> Owner {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ws.db");
        let options = Options {
            create: true,
            staging_dir: Some(crate::mount::staging_dir(&db)),
            ..Options::default()
        };
        let ws = Workspace::open(&db, options).unwrap();
        assert!(ws.has_staging(), "the owner writes as a mount does");
        let (channel, published) = ChannelServer::start(&db, ws.clone(), None, None).unwrap();
        let address = Address::Unix(published.socket.clone());
        let files = RemoteFiles::connect(&address, published.token.as_bytes()).unwrap();
        Owner {
            ws,
            _channel: channel,
            files,
            _dir: dir,
        }
    }

    /// Runs `op` on the workspace; returns whether it succeeded and what it read.
    fn apply(&self, op: &Op) -> (bool, Option<Vec<u8>>) {
        match op {
            Op::OwnerWrite(f, data) => (self.kernel_write(path(*f), data).is_ok(), None),
            Op::OwnerRm(p) => {
                let options = RmOptions {
                    recursive: true,
                    force: true,
                };
                (self.ws.fs().rm(path(*p), options).is_ok(), None)
            }
            Op::OwnerMkdir => (
                self.ws.fs().mkdir(DIR, MkdirOptions::default()).is_ok(),
                None,
            ),
            Op::Write(f, data) => (self.stream_write(path(*f), data, false), None),
            Op::Append(f, data) => (self.stream_write(path(*f), data, true), None),
            Op::Rm(p) => (self.command(&["rm", "-r", "-f", path(*p)]), None),
            Op::Mv(a, b) => (self.command(&["mv", path(*a), path(*b)]), None),
            Op::Cp(a, b) => (self.command(&["cp", path(*a), path(*b)]), None),
            Op::Mkdir => (self.command(&["mkdir", "-p", DIR]), None),
            Op::Cat(p) => match self.stream_read(path(*p)) {
                Some(content) => (true, Some(content)),
                None => (false, None),
            },
        }
    }

    /// What a mount does for `open(path, O_WRONLY|O_CREAT|O_TRUNC)`, `write`, `close`
    /// with passthrough: the kernel writes the staging file, the daemon hears only of
    /// the open and the release.
    fn kernel_write(&self, path: &str, data: &[u8]) -> computer_vfs::Result<()> {
        let fs = self.ws.fs();
        let dir = fs.stat(parent(path))?;
        let name = path.rsplit('/').next().unwrap().as_bytes();
        let flags = OpenFlags {
            truncate: true,
            ..OpenFlags::WRITE
        };
        let opened = match fs.lstat(path) {
            Ok(attr) => self
                .ws
                .open_for_kernel(Who::Trusted, attr.ino, flags, true)?,
            Err(computer_vfs::Error::NotFound(_)) => {
                let owner = NewNode {
                    perm: 0o644,
                    uid: 0,
                    gid: 0,
                };
                self.ws
                    .create_for_kernel(Who::Trusted, dir.ino, name, owner, flags, true)?
                    .1
            }
            Err(err) => return Err(err),
        };
        let written = match &opened.staged {
            Some(staged) => {
                staged
                    .file()
                    .write_all_at(data, 0)
                    .map_err(|source| computer_vfs::Error::Io {
                        path: computer_vfs::ErrorPath::of(path),
                        source,
                    })
            }
            None => self.ws.write(opened.handle, 0, data).map(drop),
        };
        let released = self.ws.release(opened.handle);
        written.and(released)
    }

    /// `computerd fs DB ARGS` (a file operation) through the channel; whether it
    /// succeeded.
    fn command(&self, args: &[&str]) -> bool {
        #[derive(clap::Parser)]
        #[command(no_binary_name = true)]
        struct Line {
            #[command(subcommand)]
            command: FsCommand,
        }
        let line = <Line as clap::Parser>::try_parse_from(args).unwrap();
        let (mut stdin, mut stdout, mut stderr) = (&b""[..], Vec::new(), Vec::new());
        let mut stdio = Stdio {
            stdin: &mut stdin,
            stdout: &mut stdout,
            stderr: &mut stderr,
        };
        let ran = crate::fs_ops::run_file_operation(&self.files, line.command, &mut stdio, false);
        matches!(ran, Ok(code) if code == std::process::ExitCode::SUCCESS)
    }

    fn stream_write(&self, path: &str, data: &[u8], append: bool) -> bool {
        let written = self.files.block_on(async {
            let mut writer = self.files.upstream().open_write(path, append).await?;
            writer.write(data).await?;
            writer.commit().await
        });
        match written {
            Ok(size) => {
                assert_eq!(size, data.len() as u64, "{path}: the stream's size");
                true
            }
            Err(computer_sync::Error::File { .. }) => false,
            Err(err) => panic!("{path}: the stream failed: {err}"),
        }
    }

    fn stream_read(&self, path: &str) -> Option<Vec<u8>> {
        let read = self.files.block_on(async {
            let mut reader = self.files.upstream().open_read(path).await?;
            let mut content = Vec::new();
            while let Some(piece) = reader.next_piece().await? {
                content.extend_from_slice(&piece);
            }
            Ok::<_, computer_sync::Error>(content)
        });
        match read {
            Ok(content) => Some(content),
            Err(computer_sync::Error::File { .. }) => None,
            Err(err) => panic!("{path}: the stream failed: {err}"),
        }
    }

    /// The whole tree, read directly from the workspace (staged content included).
    fn tree(&self) -> Tree {
        let fs = self.ws.fs();
        let mut tree = Tree::new();
        let mut dirs = vec!["/".to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in fs.readdir(&dir).unwrap() {
                let child = computer_vfs::join(&dir, &entry.name_lossy());
                assert!(
                    !entry.name_lossy().contains(".replace-"),
                    "{child}: a replacement's hidden file was left"
                );
                match entry.kind {
                    FileKind::Directory => dirs.push(child.clone()),
                    _ => {
                        let content = fs.read_file(&child).unwrap();
                        tree.insert(child, Some(content));
                        continue;
                    }
                }
                tree.insert(child, None);
            }
            tree.insert(dir, None);
        }
        tree
    }
}

/// A path, and a file's length and first bytes.
type BriefEntry = (String, Option<(usize, Vec<u8>)>);

/// A tree with each file's content cut to its length and first bytes, for messages.
fn brief(tree: &Tree) -> Vec<BriefEntry> {
    tree.iter()
        .map(|(p, c)| {
            let c = c
                .as_ref()
                .map(|c| (c.len(), c.iter().take(8).copied().collect()));
            (p.clone(), c)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]

    #[test]
    fn an_owner_and_a_second_process_agree_with_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let owner = Owner::start();
        let mut model = Model::new();
        for (step, op) in ops.iter().enumerate() {
            let expected = model.apply(op);
            let got = owner.apply(op);
            prop_assert_eq!(got.0, expected.0, "step {}: {:?} succeeded differently", step, op);
            prop_assert!(got.1 == expected.1, "step {}: {:?} read other content", step, op);
            let tree = owner.tree();
            prop_assert!(
                tree == model.tree,
                "step {}: after {:?} the workspace holds {:?}, the model {:?}",
                step, op, brief(&tree), brief(&model.tree)
            );
        }
        // Once the owner has ingested every staging file, nothing has changed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while owner.ws.staged_waiting() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let tree = owner.tree();
        prop_assert!(
            tree == model.tree,
            "after ingestion the workspace holds {:?}, the model {:?}",
            brief(&tree), brief(&model.tree)
        );
    }
}
