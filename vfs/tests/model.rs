//! Model-based test of the store: random sequences of operations on the path API (`Fs`)
//! and the inode API (`Workspace`), each compared with a small in-memory reference model.
//!
//! The model (`Model`) is the one definition of correctness: a map of nodes (files with
//! their bytes, directories with their entries, symlinks with their targets), path
//! resolution as POSIX does it, and nothing else. Link counts are not stored but counted
//! from the entries; nodes live while an entry or an open handle reaches them. The inode
//! quota is modelled (a mutation that would pass it fails with ENOSPC and changes
//! nothing); the byte quota is not, since stored bytes depend on compression.
//!
//! After every operation the result (value or errno), the whole tree (kinds, modes, link
//! counts, sizes, content, targets, extended attributes, which paths share a node) and
//! every open handle are compared with the model, and `Workspace::check` must pass.
//! `check` commits buffered writes, so a quarter of the cases run it only at reopens and
//! at the end, letting buffers live across operations; the comparison itself reads files
//! with open handles through those handles, since closing one commits.
//!
//! The staged path, a mount's default write path, is one more way to write the same
//! content. Most cases open the store with staging on, and `KernelOpen`/`KernelCreate`
//! open files as the FUSE daemon does with passthrough (`Workspace::open_for_kernel`,
//! `create_for_kernel`). Where the store hands back a staging file, the test plays the
//! kernel: reads and writes on that handle go to the file directly (`pread`/`pwrite`,
//! O_APPEND at its end, nothing without write access), while what the kernel still sends
//! the daemon (setattr for truncation, getattr, fsync, fallocate, copy_file_range,
//! release) goes to the store. The store may serve such an open through the write buffer
//! instead (the inode is open that way already, it is larger than `stage_size_max`, the
//! pool is empty), and every other open of a staged inode shares its staging file; the
//! model cares about neither, and the path API, buffered handles, renames, links and
//! unlinks interleave freely. Staged files are ingested by `check`, by `Sync` (after which
//! a read-only open of the database, which sees no staging file, must hold every file no
//! handle holds exactly as the model has it), by fsync, by a copy, by the background
//! worker, and at a reopen: `Reopen` drops the workspace with files still staged (open
//! for writing, or written and not ingested when `check` runs only at reopens), the case
//! of a crash before ingestion, and the next open must ingest them.
//!
//! Operations are generated with index-style arguments (`P`: pick among the existing
//! paths, optionally adding a fresh name) so most of them are valid, then resolved into
//! concrete commands (`Cmd`) against the model. A failure prints the concrete commands;
//! paste them into a `regression_*` test at the end of this file.
//!
//! `PROPTEST_CASES` raises the number of cases (default: moderate, for CI).

use computer_vfs::Who;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use computer_vfs::{
    ChunkSizes, Error, FileHandle, FileKind, Fs, InodeNo, MkdirOptions, NewNode, OpenFlags, Opened,
    Options, Quota, RenameFlags, RmOptions, SetAttr, StagedFile, Workspace, XattrSet,
};
use proptest::prelude::*;

// =====================================================================================
// The model
// =====================================================================================

type Ino = usize;
type R<T> = Result<T, i32>;

const ROOT: Ino = 0;
const SYMLINKS_MAX: usize = 40;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    File(Vec<u8>),
    Dir(BTreeMap<String, Ino>),
    Link(String),
}

#[derive(Clone, Debug)]
struct Node {
    body: Body,
    perm: u32,
    xattrs: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    File,
    Dir,
    Link,
}

/// Where a path leads: the directory holding the last entry, its name (empty for `/`
/// and paths ending in `.`/`..`), and the node if the entry exists.
#[derive(Debug)]
struct Resolved {
    parent: Ino,
    name: String,
    ino: Option<Ino>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flags {
    write: bool,
    truncate: bool,
    append: bool,
}

#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<Ino, Node>,
    next: Ino,
    /// Open handles: the node and how it was opened.
    handles: Vec<(Ino, Flags)>,
    /// The inode quota: a mutation that would leave more nodes fails with ENOSPC and
    /// changes nothing.
    inodes_max: Option<usize>,
}

fn components(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Model {
    fn new() -> Model {
        let root = Node {
            body: Body::Dir(BTreeMap::new()),
            perm: 0o755,
            xattrs: BTreeMap::new(),
        };
        Model {
            nodes: BTreeMap::from([(ROOT, root)]),
            next: 1,
            handles: Vec::new(),
            inodes_max: None,
        }
    }

    fn node(&self, ino: Ino) -> &Node {
        &self.nodes[&ino]
    }

    fn kind(&self, ino: Ino) -> Kind {
        match self.node(ino).body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
            Body::Link(_) => Kind::Link,
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        self.kind(ino) == Kind::Dir
    }

    fn entries(&self, dir: Ino) -> &BTreeMap<String, Ino> {
        match &self.node(dir).body {
            Body::Dir(entries) => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<String, Ino> {
        match &mut self.nodes.get_mut(&dir).unwrap().body {
            Body::Dir(entries) => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn data(&self, ino: Ino) -> &Vec<u8> {
        match &self.node(ino).body {
            Body::File(data) => data,
            _ => panic!("model: {ino} is not a file"),
        }
    }

    fn data_mut(&mut self, ino: Ino) -> &mut Vec<u8> {
        match &mut self.nodes.get_mut(&ino).unwrap().body {
            Body::File(data) => data,
            _ => panic!("model: {ino} is not a file"),
        }
    }

    fn size(&self, ino: Ino) -> u64 {
        match &self.node(ino).body {
            Body::File(data) => data.len() as u64,
            Body::Dir(_) => 0,
            Body::Link(target) => target.len() as u64,
        }
    }

    /// Directories: 2 plus one per subdirectory. Others: the entries naming them.
    fn nlink(&self, ino: Ino) -> u32 {
        if let Body::Dir(entries) = &self.node(ino).body {
            return 2 + entries.values().filter(|&&c| self.is_dir(c)).count() as u32;
        }
        let mut count = 0;
        for node in self.nodes.values() {
            if let Body::Dir(entries) = &node.body {
                count += entries.values().filter(|&&c| c == ino).count() as u32;
            }
        }
        count
    }

    /// The directory holding directory `dir` (`None` for the root).
    fn parent_of_dir(&self, dir: Ino) -> Option<Ino> {
        self.nodes.iter().find_map(|(&ino, node)| match &node.body {
            Body::Dir(entries) if entries.values().any(|&c| c == dir) => Some(ino),
            _ => None,
        })
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&self, ancestor: Ino, dir: Ino) -> bool {
        let mut current = Some(dir);
        while let Some(d) = current {
            if d == ancestor {
                return true;
            }
            current = self.parent_of_dir(d);
        }
        false
    }

    fn add(&mut self, body: Body, perm: u32) -> Ino {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(
            ino,
            Node {
                body,
                perm,
                xattrs: BTreeMap::new(),
            },
        );
        ino
    }

    /// Forgets nodes no entry and no handle reaches.
    fn gc(&mut self) {
        let mut live = BTreeSet::new();
        let mut stack = vec![ROOT];
        stack.extend(self.handles.iter().map(|h| h.0));
        while let Some(ino) = stack.pop() {
            if live.insert(ino) {
                if let Body::Dir(entries) = &self.node(ino).body {
                    stack.extend(entries.values().copied());
                }
            }
        }
        self.nodes.retain(|ino, _| live.contains(ino));
    }

    /// Path resolution: symlinks are followed in the middle of a path and, with
    /// `follow`, at its end; relative targets start from the link's directory; more
    /// than 40 links is ELOOP.
    fn resolve(&self, path: &str, follow: bool) -> R<Resolved> {
        let mut pending = components(path);
        pending.reverse();
        let mut chain = vec![ROOT];
        let mut links = 0;
        let mut last = Resolved {
            parent: ROOT,
            name: String::new(),
            ino: Some(ROOT),
        };
        while let Some(component) = pending.pop() {
            let current = *chain.last().unwrap();
            let is_last = pending.is_empty();
            if !self.is_dir(current) {
                return Err(libc::ENOTDIR);
            }
            if component == "." || component == ".." {
                if component == ".." && chain.len() > 1 {
                    chain.pop();
                }
                let dir = *chain.last().unwrap();
                last = Resolved {
                    parent: dir,
                    name: String::new(),
                    ino: Some(dir),
                };
                continue;
            }
            let Some(&child) = self.entries(current).get(&component) else {
                if is_last {
                    return Ok(Resolved {
                        parent: current,
                        name: component,
                        ino: None,
                    });
                }
                return Err(libc::ENOENT);
            };
            match &self.node(child).body {
                Body::Link(target) if !is_last || follow => {
                    links += 1;
                    if links > SYMLINKS_MAX {
                        return Err(libc::ELOOP);
                    }
                    if target.starts_with('/') {
                        chain.truncate(1);
                    }
                    let mut parts = components(target);
                    if parts.is_empty() {
                        parts.push(".".into());
                    }
                    pending.extend(parts.into_iter().rev());
                }
                _ if is_last => {
                    return Ok(Resolved {
                        parent: current,
                        name: component,
                        ino: Some(child),
                    })
                }
                _ => chain.push(child),
            }
        }
        Ok(last)
    }

    /// The node at `path` (following a final symlink if `follow`); ENOENT if missing.
    fn existing(&self, path: &str, follow: bool) -> R<Ino> {
        self.resolve(path, follow)?.ino.ok_or(libc::ENOENT)
    }

    /// The parent and name for a new entry at `path`; EEXIST if something is there.
    fn for_create(&self, path: &str) -> R<(Ino, String)> {
        let r = self.resolve(path, false)?;
        if r.name.is_empty() || r.ino.is_some() {
            return Err(libc::EEXIST);
        }
        Ok((r.parent, r.name))
    }

    /// A file to read or write; directories are EISDIR.
    fn file_at(&self, path: &str) -> R<Ino> {
        let ino = self.existing(path, true)?;
        if self.is_dir(ino) {
            return Err(libc::EISDIR);
        }
        Ok(ino)
    }

    fn write_bytes(&mut self, ino: Ino, offset: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let data = self.data_mut(ino);
        let end = offset as usize + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset as usize..end].copy_from_slice(bytes);
    }

    fn attr(&self, ino: Ino) -> Out {
        Out::Attr {
            kind: self.kind(ino),
            perm: self.node(ino).perm,
            nlink: self.nlink(ino),
            size: self.size(ino),
        }
    }

    // --------------------------------------------------------------- the operations

    fn write_file(&mut self, path: &str, bytes: &[u8]) -> R<Out> {
        let r = self.resolve(path, true)?;
        if r.name.is_empty() {
            return Err(libc::EISDIR);
        }
        match r.ino {
            Some(ino) if self.is_dir(ino) => return Err(libc::EISDIR),
            Some(ino) => *self.data_mut(ino) = bytes.to_vec(),
            None => {
                let ino = self.add(Body::File(bytes.to_vec()), 0o644);
                self.entries_mut(r.parent).insert(r.name, ino);
            }
        }
        Ok(Out::Unit)
    }

    /// `Fs::create_replace`: a new node with the old one's permission bits, renamed over
    /// the path (a final symlink followed) if `commit`. Its hidden file is one more node
    /// while it lives, so it needs room for one even when the old node goes after.
    fn replace(&mut self, path: &str, bytes: &[u8], commit: bool) -> R<Out> {
        let r = self.resolve(path, true)?;
        if r.name.is_empty() {
            return Err(libc::EISDIR);
        }
        let perm = match r.ino {
            Some(ino) if self.is_dir(ino) => return Err(libc::EISDIR),
            Some(ino) => self.node(ino).perm,
            None => 0o644,
        };
        if self
            .inodes_max
            .is_some_and(|max| self.nodes.len() + 1 > max)
        {
            return Err(libc::ENOSPC);
        }
        if commit {
            let ino = self.add(Body::File(bytes.to_vec()), perm);
            self.entries_mut(r.parent).insert(r.name, ino);
        }
        Ok(Out::Unit)
    }

    fn mkdir(&mut self, path: &str) -> R<Out> {
        let (parent, name) = self.for_create(path)?;
        let ino = self.add(Body::Dir(BTreeMap::new()), 0o755);
        self.entries_mut(parent).insert(name, ino);
        Ok(Out::Unit)
    }

    /// `mkdir -p`: existing directories (also through symlinks) are fine, an existing
    /// non-directory is EEXIST at the end and ENOTDIR before it, and a name taken by a
    /// symlink that leads nowhere is EEXIST (mkdir(2) does not follow it).
    fn mkdir_all(&mut self, path: &str) -> R<Out> {
        let parts = components(path);
        for i in 0..parts.len() {
            let prefix = format!("/{}", parts[..=i].join("/"));
            let r = self.resolve(&prefix, false)?;
            let Some(ino) = r.ino else {
                let mut parent = r.parent;
                for part in &parts[i..] {
                    let ino = self.add(Body::Dir(BTreeMap::new()), 0o755);
                    self.entries_mut(parent).insert(part.clone(), ino);
                    parent = ino;
                }
                return Ok(Out::Unit);
            };
            let ino = if self.kind(ino) == Kind::Link {
                match self.resolve(&prefix, true) {
                    Ok(Resolved { ino: Some(t), .. }) => t,
                    _ => return Err(libc::EEXIST),
                }
            } else {
                ino
            };
            if !self.is_dir(ino) {
                return Err(if i + 1 == parts.len() {
                    libc::EEXIST
                } else {
                    libc::ENOTDIR
                });
            }
        }
        Ok(Out::Unit)
    }

    fn rm(&mut self, path: &str, recursive: bool, force: bool) -> R<Out> {
        let r = match self.resolve(path, false) {
            Err(libc::ENOENT) if force => return Ok(Out::Unit),
            other => other?,
        };
        let Some(ino) = r.ino else {
            return if force {
                Ok(Out::Unit)
            } else {
                Err(libc::ENOENT)
            };
        };
        if r.name.is_empty() {
            return Err(libc::EINVAL);
        }
        if self.is_dir(ino) && !recursive {
            return Err(libc::EISDIR);
        }
        self.entries_mut(r.parent).remove(&r.name);
        Ok(Out::Unit)
    }

    fn rmdir(&mut self, path: &str) -> R<Out> {
        let r = self.resolve(path, false)?;
        if r.name.is_empty() {
            return Err(libc::EINVAL);
        }
        let ino = r.ino.ok_or(libc::ENOENT)?;
        if !self.is_dir(ino) {
            return Err(libc::ENOTDIR);
        }
        if !self.entries(ino).is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.entries_mut(r.parent).remove(&r.name);
        Ok(Out::Unit)
    }

    fn unlink(&mut self, path: &str) -> R<Out> {
        let r = self.resolve(path, false)?;
        if r.name.is_empty() {
            return Err(libc::EISDIR);
        }
        let ino = r.ino.ok_or(libc::ENOENT)?;
        if self.is_dir(ino) {
            return Err(libc::EISDIR);
        }
        self.entries_mut(r.parent).remove(&r.name);
        Ok(Out::Unit)
    }

    fn rename_path(&mut self, from: &str, to: &str) -> R<Out> {
        let src = self.resolve(from, false)?;
        if src.ino.is_none() {
            return Err(libc::ENOENT);
        }
        if src.name.is_empty() {
            return Err(libc::EINVAL);
        }
        let dst = self.resolve(to, false)?;
        if dst.name.is_empty() {
            return Err(libc::EINVAL);
        }
        self.rename(
            src.parent,
            &src.name,
            dst.parent,
            &dst.name,
            RenameHow::Plain,
        )
    }

    /// rename(2) / renameat2(2) on two directory entries.
    fn rename(&mut self, p: Ino, n: &str, np: Ino, nn: &str, how: RenameHow) -> R<Out> {
        if n.is_empty() || nn.is_empty() {
            return Err(libc::EINVAL);
        }
        if !self.is_dir(p) || !self.is_dir(np) {
            return Err(libc::ENOTDIR);
        }
        let src = *self.entries(p).get(n).ok_or(libc::ENOENT)?;
        let dst = self.entries(np).get(nn).copied();
        if how == RenameHow::NoReplace && dst.is_some() {
            return Err(libc::EEXIST);
        }
        if how == RenameHow::Exchange {
            let dst = dst.ok_or(libc::ENOENT)?;
            if src == dst {
                return Ok(Out::Unit);
            }
            if (self.is_dir(src) && self.is_ancestor(src, np))
                || (self.is_dir(dst) && self.is_ancestor(dst, p))
            {
                return Err(libc::EINVAL);
            }
            self.entries_mut(p).insert(n.into(), dst);
            self.entries_mut(np).insert(nn.into(), src);
            return Ok(Out::Unit);
        }
        if dst == Some(src) {
            return Ok(Out::Unit);
        }
        if self.is_dir(src) && self.is_ancestor(src, np) {
            return Err(libc::EINVAL);
        }
        if let Some(dst) = dst {
            match (self.is_dir(src), self.is_dir(dst)) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.entries(dst).is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries_mut(p).remove(n);
        self.entries_mut(np).insert(nn.into(), src);
        Ok(Out::Unit)
    }

    /// A copy of the tree at `ino`: new nodes, same content, modes and targets; no
    /// extended attributes; hard links inside become separate files.
    fn deep_copy(&mut self, ino: Ino) -> Ino {
        let node = self.node(ino).clone();
        let body = match node.body {
            Body::Dir(entries) => Body::Dir(
                entries
                    .into_iter()
                    .map(|(name, child)| (name, self.deep_copy(child)))
                    .collect(),
            ),
            other => other,
        };
        self.add(body, node.perm)
    }

    fn copy(&mut self, from: &str, to: &str, recursive: bool) -> R<Out> {
        let src = self.existing(from, true)?;
        if self.is_dir(src) && !recursive {
            return Err(libc::EISDIR);
        }
        let (parent, name) = self.for_create(to)?;
        if self.is_dir(src) && self.is_ancestor(src, parent) {
            return Err(libc::EINVAL);
        }
        let copy = self.deep_copy(src);
        self.entries_mut(parent).insert(name, copy);
        Ok(Out::Unit)
    }

    fn symlink(&mut self, target: &str, path: &str) -> R<Out> {
        let (parent, name) = self.for_create(path)?;
        let ino = self.add(Body::Link(target.into()), 0o777);
        self.entries_mut(parent).insert(name, ino);
        Ok(Out::Unit)
    }

    fn link(&mut self, existing: &str, new: &str) -> R<Out> {
        let ino = self.existing(existing, false)?;
        let (parent, name) = self.for_create(new)?;
        if self.is_dir(ino) {
            return Err(libc::EPERM);
        }
        self.entries_mut(parent).insert(name, ino);
        Ok(Out::Unit)
    }

    fn readdir(&self, path: &str) -> R<Out> {
        let ino = self.existing(path, true)?;
        if !self.is_dir(ino) {
            return Err(libc::ENOTDIR);
        }
        let names = self
            .entries(ino)
            .iter()
            .map(|(name, &child)| (name.clone(), self.kind(child)))
            .collect();
        Ok(Out::Names(names))
    }

    fn read_range(&self, path: &str, offset: u64, len: usize) -> R<Out> {
        let ino = self.file_at(path)?;
        Ok(Out::Data(slice(self.data(ino), offset, len)))
    }

    fn open(&mut self, path: &str, flags: Flags) -> R<Out> {
        let ino = self.file_at(path)?;
        if flags.write && flags.truncate {
            self.data_mut(ino).clear();
        }
        self.handles.push((ino, flags));
        Ok(Out::Unit)
    }

    /// `Workspace::create` in the directory at `parent` (found by following symlinks).
    fn create(&mut self, parent: &str, name: &str, flags: Flags) -> R<Out> {
        let dir = self.existing(parent, true)?;
        if name.is_empty() {
            return Err(libc::EINVAL);
        }
        if !self.is_dir(dir) {
            return Err(libc::ENOTDIR);
        }
        if self.entries(dir).contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.add(Body::File(Vec::new()), 0o600);
        self.entries_mut(dir).insert(name.into(), ino);
        self.handles.push((ino, flags));
        Ok(Out::Unit)
    }

    fn h_write(&mut self, h: usize, offset: u64, bytes: &[u8]) -> R<Out> {
        let (ino, flags) = self.handles[h];
        if !flags.write {
            return Err(libc::EBADF);
        }
        let offset = if flags.append { self.size(ino) } else { offset };
        self.write_bytes(ino, offset, bytes);
        Ok(Out::N(bytes.len() as u64))
    }

    fn resize(&mut self, ino: Ino, len: u64) {
        self.data_mut(ino).resize(len as usize, 0);
    }

    fn xattr_target(&self, path: &str) -> R<Ino> {
        self.existing(path, true)
    }

    fn set_xattr(&mut self, path: &str, name: &str, value: &[u8], mode: XattrSet) -> R<Out> {
        let ino = self.xattr_target(path)?;
        let xattrs = &mut self.nodes.get_mut(&ino).unwrap().xattrs;
        match (mode, xattrs.contains_key(name)) {
            (XattrSet::Create, true) => return Err(libc::EEXIST),
            (XattrSet::Replace, false) => return Err(libc::ENODATA),
            _ => {}
        }
        xattrs.insert(name.into(), value.to_vec());
        Ok(Out::Unit)
    }

    fn get_xattr(&self, path: &str, name: &str) -> R<Out> {
        let ino = self.xattr_target(path)?;
        let value = self.node(ino).xattrs.get(name).ok_or(libc::ENODATA)?;
        Ok(Out::Data(value.clone()))
    }

    fn remove_xattr(&mut self, path: &str, name: &str) -> R<Out> {
        let ino = self.xattr_target(path)?;
        let xattrs = &mut self.nodes.get_mut(&ino).unwrap().xattrs;
        xattrs.remove(name).ok_or(libc::ENODATA)?;
        Ok(Out::Unit)
    }

    fn apply(&mut self, cmd: &Cmd) -> R<Out> {
        let before = self.clone();
        let out = self.apply_unlimited(cmd);
        self.gc();
        if out.is_ok() && self.inodes_max.is_some_and(|max| self.nodes.len() > max) {
            *self = before;
            return Err(libc::ENOSPC);
        }
        out
    }

    fn apply_unlimited(&mut self, cmd: &Cmd) -> R<Out> {
        match cmd {
            Cmd::WriteFile(path, data) => self.write_file(path, &data.bytes()),
            Cmd::WriteAt(path, offset, data) => {
                let ino = self.file_at(path)?;
                self.write_bytes(ino, *offset, &data.bytes());
                Ok(Out::Unit)
            }
            Cmd::Append(path, data) => match self.resolve(path, true)?.ino {
                None => self.write_file(path, &data.bytes()),
                Some(_) => {
                    let ino = self.file_at(path)?;
                    let end = self.size(ino);
                    self.write_bytes(ino, end, &data.bytes());
                    Ok(Out::Unit)
                }
            },
            Cmd::Truncate(path, len) => {
                let ino = self.file_at(path)?;
                self.resize(ino, *len);
                Ok(Out::Unit)
            }
            Cmd::Mkdir(path, false) => self.mkdir(path),
            Cmd::Mkdir(path, true) => self.mkdir_all(path),
            Cmd::Rm(path, recursive, force) => self.rm(path, *recursive, *force),
            Cmd::Rmdir(path) => self.rmdir(path),
            Cmd::Unlink(path) => self.unlink(path),
            Cmd::Rename(from, to) => self.rename_path(from, to),
            Cmd::RenameAt(from, to, how) => {
                let (fp, fname) = split(from);
                let (tp, tname) = split(to);
                let p = self.existing(&fp, true)?;
                let np = self.existing(&tp, true)?;
                self.rename(p, &fname, np, &tname, *how)
            }
            Cmd::Copy(from, to, recursive) => self.copy(from, to, *recursive),
            Cmd::Symlink(target, path) => self.symlink(target, path),
            Cmd::Link(existing, new) => self.link(existing, new),
            Cmd::Chmod(path, mode) => {
                let ino = self.existing(path, true)?;
                self.nodes.get_mut(&ino).unwrap().perm = mode & 0o7777;
                Ok(Out::Unit)
            }
            Cmd::Readdir(path) => self.readdir(path),
            Cmd::Stat(path) => Ok(self.attr(self.existing(path, true)?)),
            Cmd::Lstat(path) => Ok(self.attr(self.existing(path, false)?)),
            Cmd::ReadRange(path, offset, len) => self.read_range(path, *offset, *len),
            // However the store serves an open (buffered or staged), the file is the same.
            Cmd::Open(path, flags) | Cmd::KernelOpen(path, flags) => self.open(path, *flags),
            Cmd::Create(path, flags) | Cmd::KernelCreate(path, flags) => {
                let (parent, name) = split(path);
                self.create(&parent, &name, *flags)
            }
            Cmd::HWrite(h, offset, data) => self.h_write(*h, *offset, &data.bytes()),
            Cmd::HRead(h, offset, len) => Ok(Out::Data(slice(
                self.data(self.handles[*h].0),
                *offset,
                *len,
            ))),
            Cmd::HFlush(_) | Cmd::HFsync(_) => Ok(Out::Unit),
            Cmd::HRelease(h) => {
                self.handles.remove(*h);
                Ok(Out::Unit)
            }
            Cmd::HSetSize(h, len) => {
                let ino = self.handles[*h].0;
                self.resize(ino, *len);
                Ok(self.attr(ino))
            }
            Cmd::HStat(h) => Ok(self.attr(self.handles[*h].0)),
            Cmd::HCopyRange(hi, off_in, ho, off_out, len) => {
                if !self.handles[*ho].1.write {
                    return Err(libc::EBADF);
                }
                let (src, dst) = (self.handles[*hi].0, self.handles[*ho].0);
                let bytes = slice(self.data(src), *off_in, *len as usize);
                // copy_file_range(2): overlapping ranges of one file are EINVAL.
                let count = bytes.len() as u64;
                if src == dst && *off_out < off_in + count && *off_in < off_out + count {
                    return Err(libc::EINVAL);
                }
                self.write_bytes(dst, *off_out, &bytes);
                Ok(Out::N(bytes.len() as u64))
            }
            Cmd::HAllocate(h, offset, len, keep_size) => {
                let (ino, flags) = self.handles[*h];
                if !flags.write {
                    return Err(libc::EBADF);
                }
                if !keep_size && offset + len > self.size(ino) {
                    self.resize(ino, offset + len);
                }
                Ok(Out::Unit)
            }
            Cmd::CreateWrite(path, pieces) => {
                let bytes: Vec<u8> = pieces.iter().flat_map(|d| d.bytes()).collect();
                self.write_file(path, &bytes)
            }
            Cmd::Replace(path, pieces, commit) => {
                let bytes: Vec<u8> = pieces.iter().flat_map(|d| d.bytes()).collect();
                self.replace(path, &bytes, *commit)
            }
            Cmd::BadHandle => Err(libc::EBADF),
            Cmd::SetXattr(path, name, value, mode) => self.set_xattr(path, name, value, *mode),
            Cmd::GetXattr(path, name) => self.get_xattr(path, name),
            Cmd::RemoveXattr(path, name) => self.remove_xattr(path, name),
            Cmd::Compact | Cmd::Sync => Ok(Out::Unit),
            Cmd::Reopen => {
                // Closing the workspace closes every handle; what they wrote stays.
                self.handles.clear();
                Ok(Out::Unit)
            }
            Cmd::SetQuota(max) => {
                self.inodes_max = max.map(|m| m as usize);
                Ok(Out::Unit)
            }
        }
    }

    // ---------------------------------------------------------------- observation

    /// Every path, not following symlinks, in sorted order.
    fn paths(&self) -> Vec<(String, Ino)> {
        let mut out = Vec::new();
        let mut stack = vec![("/".to_string(), ROOT)];
        while let Some((path, ino)) = stack.pop() {
            out.push((path.clone(), ino));
            if let Body::Dir(entries) = &self.node(ino).body {
                for (name, &child) in entries.iter().rev() {
                    stack.push((join(&path, name), child));
                }
            }
        }
        out.sort();
        out
    }

    fn snapshot(&self) -> Snapshot {
        let mut tree = BTreeMap::new();
        let mut first_path: BTreeMap<Ino, String> = BTreeMap::new();
        for (path, ino) in self.paths() {
            let node = self.node(ino);
            let same_as = first_path
                .entry(ino)
                .or_insert_with(|| path.clone())
                .clone();
            let content = match &node.body {
                Body::File(data) => data.clone(),
                Body::Dir(_) => Vec::new(),
                Body::Link(target) => target.clone().into_bytes(),
            };
            tree.insert(
                path,
                Entry {
                    kind: self.kind(ino),
                    perm: node.perm,
                    nlink: self.nlink(ino),
                    size: self.size(ino),
                    content,
                    xattrs: node.xattrs.clone(),
                    same_as,
                },
            );
        }
        let handles = self
            .handles
            .iter()
            .map(|&(ino, _)| (self.nlink(ino), self.data(ino).clone()))
            .collect();
        Snapshot { tree, handles }
    }
}

fn slice(data: &[u8], offset: u64, len: usize) -> Vec<u8> {
    let start = (offset as usize).min(data.len());
    let end = (start + len).min(data.len());
    data[start..end].to_vec()
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The parent path and last name of a path (`/` gives `/` and an empty name).
fn split(path: &str) -> (String, String) {
    let mut parts = components(path);
    let name = parts.pop().unwrap_or_default();
    (format!("/{}", parts.join("/")), name)
}

// =====================================================================================
// Commands, results and snapshots
// =====================================================================================

/// File content, described compactly so a failing case prints readably.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Data {
    len: usize,
    /// 0: pseudo-random, 1: compressible text, 2: zeros, 3: a short repeated pattern.
    kind: u8,
    /// Few distinct seeds, so identical content (and shared blocks) is common.
    seed: u8,
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "d({}, {}, {})", self.len, self.kind, self.seed)
    }
}

fn d(len: usize, kind: u8, seed: u8) -> Data {
    Data { len, kind, seed }
}

impl Data {
    fn bytes(&self) -> Vec<u8> {
        let seed = u64::from(self.seed);
        match self.kind % 4 {
            0 => {
                let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                (0..self.len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect()
            }
            1 => {
                let mut out = Vec::with_capacity(self.len + 32);
                let mut line = 0;
                while out.len() < self.len {
                    out.extend_from_slice(format!("line {line} of text {seed}\n").as_bytes());
                    line += 1;
                }
                out.truncate(self.len);
                out
            }
            2 => vec![0; self.len],
            _ => (0..self.len).map(|i| b"abcab"[i % 5] ^ self.seed).collect(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RenameHow {
    Plain,
    NoReplace,
    Exchange,
}

/// One concrete operation.
#[derive(Clone, Debug)]
enum Cmd {
    WriteFile(String, Data),
    WriteAt(String, u64, Data),
    Append(String, Data),
    Truncate(String, u64),
    /// Path, recursive.
    Mkdir(String, bool),
    /// Path, recursive, force.
    Rm(String, bool, bool),
    Rmdir(String),
    Unlink(String),
    /// `Fs::rename`.
    Rename(String, String),
    /// `Workspace::rename` on the parents (found with `Fs::stat`) and names.
    RenameAt(String, String, RenameHow),
    /// From, to, recursive.
    Copy(String, String, bool),
    /// Target, path.
    Symlink(String, String),
    /// Existing, new.
    Link(String, String),
    Chmod(String, u32),
    Readdir(String),
    Stat(String),
    Lstat(String),
    ReadRange(String, u64, usize),
    /// `Workspace::open_file` on the node at the path.
    Open(String, Flags),
    /// `Workspace::create` in the parent directory.
    Create(String, Flags),
    /// `Workspace::open_for_kernel` with passthrough, as the FUSE daemon opens a file.
    KernelOpen(String, Flags),
    /// `Workspace::create_for_kernel` with passthrough, as the FUSE daemon creates one.
    KernelCreate(String, Flags),
    /// Handle operations take an index into the open handles.
    HWrite(usize, u64, Data),
    HRead(usize, u64, usize),
    HFlush(usize),
    HFsync(usize),
    HRelease(usize),
    HSetSize(usize, u64),
    HStat(usize),
    /// `Workspace::copy_range`: in, offset in, out, offset out, length.
    HCopyRange(usize, u64, usize, u64, u64),
    /// `Workspace::allocate`: offset, length, keep size.
    HAllocate(usize, u64, u64, bool),
    /// `Fs::create_write`: a stream, written in pieces.
    CreateWrite(String, Vec<Data>),
    /// `Fs::create_replace`, its pieces written in order, committed or dropped.
    Replace(String, Vec<Data>, bool),
    BadHandle,
    SetXattr(String, String, Vec<u8>, XattrSet),
    GetXattr(String, String),
    RemoveXattr(String, String),
    /// Drop the workspace and open the database again. Files still staged (written and
    /// not ingested, or open for writing) are ingested by the next open.
    Reopen,
    /// `Workspace::sync`: ingests every staged file no writer holds, commits buffers.
    Sync,
    /// Gives free pages back to the file system: changes no file.
    Compact,
    /// Set (or clear) the inode quota.
    SetQuota(Option<u64>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    Unit,
    N(u64),
    Data(Vec<u8>),
    Names(Vec<(String, Kind)>),
    Attr {
        kind: Kind,
        perm: u32,
        nlink: u32,
        size: u64,
    },
}

#[derive(Clone, PartialEq, Eq)]
struct Entry {
    kind: Kind,
    perm: u32,
    nlink: u32,
    size: u64,
    /// File bytes or symlink target.
    content: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
    /// The first path (in sorted order) naming the same node.
    same_as: String,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let content = if self.kind == Kind::Link {
            format!("{:?}", String::from_utf8_lossy(&self.content))
        } else {
            format!(
                "{} bytes, hash {:08x}",
                self.content.len(),
                hash(&self.content)
            )
        };
        write!(
            f,
            "{:?} {:o} nlink {} size {} [{content}] xattrs {:?} same_as {}",
            self.kind,
            self.perm,
            self.nlink,
            self.size,
            self.xattrs.keys().collect::<Vec<_>>(),
            self.same_as
        )
    }
}

fn hash(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    tree: BTreeMap<String, Entry>,
    /// Per open handle: link count and content.
    handles: Vec<(u32, Vec<u8>)>,
}

fn describe_diff(model: &Snapshot, real: &Snapshot) -> String {
    let mut out = String::new();
    let paths: BTreeSet<&String> = model.tree.keys().chain(real.tree.keys()).collect();
    for path in paths {
        let (m, r) = (model.tree.get(path), real.tree.get(path));
        if m != r {
            out.push_str(&format!("  {path}:\n    model {m:?}\n    store {r:?}\n"));
            if let (Some(m), Some(r)) = (m, r) {
                if let Some(at) = m.content.iter().zip(&r.content).position(|(a, b)| a != b) {
                    out.push_str(&format!("    content differs first at byte {at}\n"));
                }
            }
        }
    }
    for (i, (m, r)) in model.handles.iter().zip(&real.handles).enumerate() {
        if m != r {
            out.push_str(&format!(
                "  handle {i}: model nlink {} {} bytes (hash {:08x}), store nlink {} {} bytes (hash {:08x})\n",
                m.0,
                m.1.len(),
                hash(&m.1),
                r.0,
                r.1.len(),
                hash(&r.1)
            ));
        }
    }
    if model.handles.len() != real.handles.len() {
        out.push_str("  different numbers of handles\n");
    }
    out
}

// =====================================================================================
// The store under test
// =====================================================================================

struct Real {
    _dir: tempfile::TempDir,
    path: PathBuf,
    options: Options,
    ws: Option<Workspace>,
    handles: Vec<Handle>,
}

/// An open handle, as the model's handle of the same index.
struct Handle {
    fh: FileHandle,
    flags: Flags,
    /// The staging file handed over with an open for the kernel: the kernel reads and
    /// writes it directly, and so does the test on its behalf.
    staged: Option<Arc<StagedFile>>,
}

fn kind_of(kind: FileKind) -> Kind {
    match kind {
        FileKind::File => Kind::File,
        FileKind::Directory => Kind::Dir,
        FileKind::Symlink => Kind::Link,
        other => panic!("unexpected node kind {other:?}"),
    }
}

fn errno(err: Error) -> i32 {
    err.errno()
}

fn open_flags(flags: Flags) -> OpenFlags {
    OpenFlags {
        exec: false,
        read: true,
        write: flags.write,
        truncate: flags.truncate,
        append: flags.append,
    }
}

impl Real {
    /// A new workspace; with `staging`, in `<db>.staging` beside the database (where a
    /// workspace opened without staging also looks for files to recover).
    fn new(mut options: Options, staging: bool) -> Real {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.db");
        options.staging_dir = staging.then(|| dir.path().join("ws.db.staging"));
        let ws = Workspace::open(&path, options.clone()).unwrap();
        Real {
            _dir: dir,
            path,
            options,
            ws: Some(ws),
            handles: Vec::new(),
        }
    }

    fn ws(&self) -> &Workspace {
        self.ws.as_ref().unwrap()
    }

    fn fs(&self) -> Fs {
        self.ws().fs()
    }

    fn fh(&self, h: usize) -> FileHandle {
        self.handles[h].fh
    }

    /// Opens the node at `path` as the FUSE daemon does, with passthrough on.
    fn kernel_open(&mut self, path: &str, flags: Flags) -> R<Out> {
        let ws = self.ws().clone();
        let ino = ws.fs().stat(path).map_err(errno)?.ino;
        let opened = ws
            .open_for_kernel(Who::Trusted, ino, open_flags(flags), true)
            .map_err(errno)?;
        self.add_kernel_handle(ino, flags, opened);
        Ok(Out::Unit)
    }

    /// Creates a file as the FUSE daemon does, with passthrough on.
    fn kernel_create(&mut self, path: &str, flags: Flags) -> R<Out> {
        let ws = self.ws().clone();
        let (parent, name) = split(path);
        let dir = ws.fs().stat(&parent).map_err(errno)?.ino;
        let (attr, opened) = ws
            .create_for_kernel(
                Who::Trusted,
                dir,
                name.as_bytes(),
                NewNode::new(0o600),
                open_flags(flags),
                true,
            )
            .map_err(errno)?;
        self.add_kernel_handle(attr.ino, flags, opened);
        Ok(Out::Unit)
    }

    /// Keeps a handle opened for the kernel. Once an inode is staged every open of it
    /// shares its one staging file (`staged.rs`), so the kernel sees one file.
    fn add_kernel_handle(&mut self, ino: InodeNo, flags: Flags, opened: Opened) {
        let staged_before = self
            .handles
            .iter()
            .filter_map(|other| other.staged.as_ref())
            .find(|theirs| theirs.inode() == ino);
        if let Some(theirs) = staged_before {
            let shared = opened
                .staged
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, theirs));
            assert!(
                shared,
                "{ino} is staged, but a new open of it has another file"
            );
        }
        self.handles.push(Handle {
            fh: opened.handle,
            flags,
            staged: opened.staged,
        });
    }

    fn h_write(&self, h: usize, offset: u64, data: &Data) -> R<Out> {
        let handle = &self.handles[h];
        match &handle.staged {
            Some(staged) => kernel_write(staged, handle.flags, offset, &data.bytes()),
            None => self
                .ws()
                .write(handle.fh, offset, &data.bytes())
                .map(|n| Out::N(n as u64))
                .map_err(errno),
        }
    }

    fn h_read(&self, h: usize, offset: u64, len: usize) -> R<Out> {
        let handle = &self.handles[h];
        match &handle.staged {
            Some(staged) => kernel_read(staged, offset, len),
            // Both ways to read a handle: into a buffer of the store's (fuser's
            // transport) or the caller's (the ring's, prefilled here with bytes a read
            // must overwrite), chosen by the offset's parity so that both meet every
            // kind of content.
            None if offset.is_multiple_of(2) => self
                .ws()
                .read(handle.fh, offset, len)
                .map(Out::Data)
                .map_err(errno),
            None => {
                let mut buf = vec![0xA5; len];
                let filled = self.ws().read_into(handle.fh, offset, &mut buf);
                let filled = filled.map_err(errno)?;
                buf.truncate(filled);
                Ok(Out::Data(buf))
            }
        }
    }

    fn attr_out(attr: computer_vfs::Attr) -> Out {
        Out::Attr {
            kind: kind_of(attr.kind),
            perm: attr.perm,
            nlink: attr.nlink,
            size: attr.size,
        }
    }

    fn apply(&mut self, cmd: &Cmd) -> R<Out> {
        let fs = self.fs();
        let ws = self.ws().clone();
        let unit = |r: computer_vfs::Result<()>| r.map(|()| Out::Unit).map_err(errno);
        match cmd {
            Cmd::WriteFile(path, data) => unit(fs.write_file(path, data.bytes())),
            Cmd::WriteAt(path, offset, data) => unit(fs.write_at(path, *offset, data.bytes())),
            Cmd::Append(path, data) => unit(fs.append(path, data.bytes())),
            Cmd::Truncate(path, len) => unit(fs.truncate(path, *len)),
            Cmd::Mkdir(path, recursive) => unit(fs.mkdir(
                path,
                MkdirOptions {
                    recursive: *recursive,
                    mode: 0o755,
                },
            )),
            Cmd::Rm(path, recursive, force) => unit(fs.rm(
                path,
                RmOptions {
                    recursive: *recursive,
                    force: *force,
                },
            )),
            Cmd::Rmdir(path) => unit(fs.rmdir(path)),
            Cmd::Unlink(path) => unit(fs.unlink(path)),
            Cmd::Rename(from, to) => unit(fs.rename(from, to)),
            Cmd::RenameAt(from, to, how) => {
                let (fp, fname) = split(from);
                let (tp, tname) = split(to);
                let p = fs.stat(&fp).map_err(errno)?.ino;
                let np = fs.stat(&tp).map_err(errno)?.ino;
                let flags = RenameFlags {
                    no_replace: *how == RenameHow::NoReplace,
                    exchange: *how == RenameHow::Exchange,
                };
                unit(ws.rename(
                    Who::Trusted,
                    p,
                    fname.as_bytes(),
                    np,
                    tname.as_bytes(),
                    flags,
                ))
            }
            Cmd::Copy(from, to, recursive) => unit(fs.copy(from, to, *recursive)),
            Cmd::Symlink(target, path) => unit(fs.symlink(target, path)),
            Cmd::Link(existing, new) => unit(fs.link(existing, new)),
            Cmd::Chmod(path, mode) => unit(fs.chmod(path, *mode)),
            Cmd::Readdir(path) => {
                let mut names: Vec<(String, Kind)> = fs
                    .readdir(path)
                    .map_err(errno)?
                    .into_iter()
                    .map(|e| (e.name_lossy(), kind_of(e.kind)))
                    .collect();
                names.sort();
                Ok(Out::Names(names))
            }
            Cmd::Stat(path) => fs.stat(path).map(Real::attr_out).map_err(errno),
            Cmd::Lstat(path) => fs.lstat(path).map(Real::attr_out).map_err(errno),
            Cmd::ReadRange(path, offset, len) => fs
                .read_range(path, *offset, *len)
                .map(Out::Data)
                .map_err(errno),
            Cmd::Open(path, flags) => {
                let ino = fs.stat(path).map_err(errno)?.ino;
                let fh = ws.open_file(ino, open_flags(*flags)).map_err(errno)?;
                self.handles.push(Handle {
                    fh,
                    flags: *flags,
                    staged: None,
                });
                Ok(Out::Unit)
            }
            Cmd::Create(path, flags) => {
                let (parent, name) = split(path);
                let dir = fs.stat(&parent).map_err(errno)?.ino;
                let (_, fh) = ws
                    .create(
                        Who::Trusted,
                        dir,
                        name.as_bytes(),
                        NewNode::new(0o600),
                        open_flags(*flags),
                    )
                    .map_err(errno)?;
                self.handles.push(Handle {
                    fh,
                    flags: *flags,
                    staged: None,
                });
                Ok(Out::Unit)
            }
            Cmd::KernelOpen(path, flags) => self.kernel_open(path, *flags),
            Cmd::KernelCreate(path, flags) => self.kernel_create(path, *flags),
            Cmd::HWrite(h, offset, data) => self.h_write(*h, *offset, data),
            Cmd::HRead(h, offset, len) => self.h_read(*h, *offset, *len),
            // The kernel sends flush, fsync, setattr, getattr, fallocate, copy_file_range
            // and release to the daemon for a passthrough file too.
            Cmd::HFlush(h) => unit(ws.flush(self.fh(*h))),
            Cmd::HFsync(h) => unit(ws.fsync(self.fh(*h), false)),
            Cmd::HRelease(h) => {
                let handle = self.handles.remove(*h);
                unit(ws.release(handle.fh))
            }
            Cmd::HSetSize(h, len) => {
                let ino = ws.handle_inode(self.fh(*h)).map_err(errno)?;
                let changes = SetAttr {
                    size: Some(*len),
                    ..Default::default()
                };
                ws.setattr(Who::Trusted, ino, &changes)
                    .map(Real::attr_out)
                    .map_err(errno)
            }
            Cmd::HStat(h) => {
                let ino = ws.handle_inode(self.fh(*h)).map_err(errno)?;
                ws.getattr(ino).map(Real::attr_out).map_err(errno)
            }
            Cmd::HCopyRange(hi, off_in, ho, off_out, len) => ws
                .copy_range(self.fh(*hi), *off_in, self.fh(*ho), *off_out, *len)
                .map(Out::N)
                .map_err(errno),
            Cmd::HAllocate(h, offset, len, keep_size) => {
                unit(ws.allocate(self.fh(*h), *offset, *len, *keep_size))
            }
            Cmd::Replace(path, pieces, commit) => {
                let mut replacement = fs.create_replace(path).map_err(errno)?;
                for piece in pieces {
                    let end = replacement.size();
                    replacement.write_at(end, &piece.bytes()).map_err(errno)?;
                }
                if *commit {
                    unit(replacement.commit().map(drop))
                } else {
                    drop(replacement);
                    Ok(Out::Unit)
                }
            }
            Cmd::CreateWrite(path, pieces) => {
                let mut writer = fs.create_write(path).map_err(errno)?;
                for piece in pieces {
                    std::io::Write::write_all(&mut writer, &piece.bytes()).unwrap();
                }
                unit(writer.finish())
            }
            Cmd::BadHandle => ws
                .read(FileHandle(u64::MAX), 0, 1)
                .map(Out::Data)
                .map_err(errno),
            Cmd::SetXattr(path, name, value, mode) => {
                let ino = fs.stat(path).map_err(errno)?.ino;
                unit(ws.setxattr(Who::Trusted, ino, name.as_bytes(), value, *mode))
            }
            Cmd::GetXattr(path, name) => {
                let ino = fs.stat(path).map_err(errno)?.ino;
                ws.getxattr(Who::Trusted, ino, name.as_bytes())
                    .map(Out::Data)
                    .map_err(errno)
            }
            Cmd::RemoveXattr(path, name) => {
                let ino = fs.stat(path).map_err(errno)?.ino;
                unit(ws.removexattr(Who::Trusted, ino, name.as_bytes()))
            }
            Cmd::Compact => unit(ws.compact(&mut |_| {}).map(drop)),
            Cmd::Sync => unit(ws.sync()),
            Cmd::SetQuota(max) => unit(ws.set_quota(Quota {
                bytes_max: None,
                inodes_max: *max,
            })),
            Cmd::Reopen => {
                // Handles on staged files are dropped unreleased, as a crash leaves them.
                self.handles.clear();
                drop(fs);
                drop(ws);
                self.ws = None;
                let ws = Workspace::open(&self.path, self.options.clone()).map_err(errno)?;
                self.ws = Some(ws);
                Ok(Out::Unit)
            }
        }
    }

    fn snapshot(&self) -> Snapshot {
        let fhs: Vec<FileHandle> = self.handles.iter().map(|h| h.fh).collect();
        snapshot_of(self.ws(), &fhs)
    }

    /// The tree as the database holds it, read by a read-only open beside this one: no
    /// staging file, no buffer, only what is committed.
    fn stored_snapshot(&self) -> Snapshot {
        let options = Options {
            create: false,
            read_only: true,
            ..self.options.clone()
        };
        let ws = Workspace::open(&self.path, options).unwrap();
        snapshot_of(&ws, &[])
    }
}

/// A write as the kernel makes it into the staging file of a passthrough open: not at
/// all without write access, at the end of the file with O_APPEND.
fn kernel_write(staged: &StagedFile, flags: Flags, offset: u64, bytes: &[u8]) -> R<Out> {
    if !flags.write {
        return Err(libc::EBADF);
    }
    let file = staged.file();
    let offset = if flags.append {
        file.metadata().map_err(io_errno)?.len()
    } else {
        offset
    };
    file.write_all_at(bytes, offset).map_err(io_errno)?;
    Ok(Out::N(bytes.len() as u64))
}

/// A read as the kernel makes it from the staging file of a passthrough open.
fn kernel_read(staged: &StagedFile, offset: u64, len: usize) -> R<Out> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        match staged
            .file()
            .read_at(&mut buf[done..], offset + done as u64)
        {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) => return Err(io_errno(err)),
        }
    }
    buf.truncate(done);
    Ok(Out::Data(buf))
}

fn io_errno(err: std::io::Error) -> i32 {
    err.raw_os_error().unwrap_or(libc::EIO)
}

/// The whole tree of `ws`, and the content of each handle in `handles`.
fn snapshot_of(ws: &Workspace, handles: &[FileHandle]) -> Snapshot {
    let fs = ws.fs();
    let mut tree = BTreeMap::new();
    let mut inos = BTreeMap::new();
    // Files with open handles are read through them: closing a handle (as `read_file`
    // does) commits the buffered writes of its inode, and the comparison must not
    // change what it compares.
    let open: BTreeMap<_, _> = handles
        .iter()
        .map(|&fh| (ws.handle_inode(fh).unwrap(), fh))
        .collect();
    let mut stack = vec!["/".to_string()];
    while let Some(path) = stack.pop() {
        let attr = fs.lstat(&path).unwrap();
        let content = match attr.kind {
            FileKind::File => match open.get(&attr.ino) {
                Some(&fh) => ws.read(fh, 0, attr.size as usize + 1).unwrap(),
                None => fs.read_file(&path).unwrap(),
            },
            FileKind::Symlink => fs.readlink(&path).unwrap().into_bytes(),
            FileKind::Directory => {
                for entry in fs.readdir(&path).unwrap() {
                    stack.push(join(&path, &entry.name_lossy()));
                }
                Vec::new()
            }
            other => panic!("unexpected node kind {other:?}"),
        };
        let mut xattrs = BTreeMap::new();
        for name in ws.listxattr(attr.ino).unwrap() {
            let value = ws.getxattr(Who::Trusted, attr.ino, &name).unwrap();
            xattrs.insert(String::from_utf8(name).unwrap(), value);
        }
        inos.insert(path.clone(), attr.ino);
        tree.insert(
            path.clone(),
            Entry {
                kind: kind_of(attr.kind),
                perm: attr.perm,
                nlink: attr.nlink,
                size: attr.size,
                content,
                xattrs,
                same_as: path,
            },
        );
    }
    let mut first_path = BTreeMap::new();
    for (path, entry) in tree.iter_mut() {
        entry.same_as = first_path
            .entry(inos[path])
            .or_insert_with(|| path.clone())
            .clone();
    }
    let handles = handles
        .iter()
        .map(|&fh| {
            let attr = ws.getattr(ws.handle_inode(fh).unwrap()).unwrap();
            // The tree above is read into the store's buffers, each handle here into
            // the caller's (as the ring's transport reads), which must come out the
            // same.
            let mut data = vec![0xA5; attr.size as usize + 1];
            let filled = ws.read_into(fh, 0, &mut data).unwrap();
            data.truncate(filled);
            (attr.nlink, data)
        })
        .collect();
    Snapshot { tree, handles }
}

// =====================================================================================
// Running a sequence
// =====================================================================================

#[derive(Clone, Debug)]
struct Config {
    small_chunks: bool,
    /// Commit buffered writes of a file past this many bytes (of all files: twice that).
    dirty_file_bytes_max: usize,
    /// `check()` commits buffered writes, so checking after every operation never lets
    /// buffers live across operations; some cases check only at the end.
    check_every_op: bool,
    /// Stage files opened for the kernel with passthrough (as a mount does).
    staging: bool,
    /// Files larger than this are written through the buffer even when opened for the
    /// kernel with passthrough.
    stage_size_max: u64,
}

impl Config {
    fn options(&self) -> Options {
        let mut options = Options {
            dirty_file_bytes_max: self.dirty_file_bytes_max,
            dirty_total_bytes_max: 2 * self.dirty_file_bytes_max,
            block_cache_bytes: 1 << 20,
            stage_size_max: self.stage_size_max,
            ..Options::default()
        };
        if self.small_chunks {
            options.chunk_sizes = ChunkSizes {
                min: 256,
                avg: 1024,
                max: 4096,
            };
        }
        options
    }
}

const SMALL: Config = Config {
    small_chunks: true,
    dirty_file_bytes_max: 8 << 20,
    check_every_op: true,
    staging: true,
    stage_size_max: STAGE_SIZE_MAX,
};

/// `Options::stage_size_max` of most cases: larger than any file here.
const STAGE_SIZE_MAX: u64 = 4 << 30;
/// ... and of some others: many files here are larger.
const STAGE_SIZE_SMALL: u64 = 16 << 10;

fn check(real: &Real, trace: &str) {
    let report = real.ws().check().unwrap();
    assert!(
        report.is_ok(),
        "check() failed after:\n{trace}problems: {:#?}",
        report.problems
    );
}

/// After `Sync`, every file nobody has open is in the database as the model has it (the
/// comparison through the workspace reads staging files, which may hide what the
/// database lacks).
fn check_stored(model: &Model, real: &Real, trace: &str) {
    let open: BTreeSet<Ino> = model.handles.iter().map(|h| h.0).collect();
    let held: BTreeSet<String> = model
        .paths()
        .into_iter()
        .filter(|(_, ino)| open.contains(ino))
        .map(|(path, _)| path)
        .collect();
    let without_held = |snapshot: Snapshot| Snapshot {
        tree: snapshot
            .tree
            .into_iter()
            .filter(|(path, _)| !held.contains(path))
            .collect(),
        handles: Vec::new(),
    };
    let expected = without_held(model.snapshot());
    let stored = without_held(real.stored_snapshot());
    assert!(
        expected == stored,
        "the database differs after sync:\n{trace}{}",
        describe_diff(&expected, &stored)
    );
}

/// Runs commands on the model and the store, comparing after each one.
fn run_cmds(config: &Config, cmds: impl IntoIterator<Item = Cmd>) {
    run(config, cmds.into_iter().map(Step::Cmd))
}

enum Step {
    Cmd(Cmd),
    Op(Op),
}

/// A small tree to start from, so that early operations find something to work on.
fn prelude() -> Vec<Step> {
    use Cmd::*;
    [
        Mkdir("/a/b".into(), true),
        Mkdir("/c".into(), false),
        WriteFile("/f".into(), d(3000, 0, 0)),
        WriteFile("/a/g".into(), d(20_000, 1, 1)),
        WriteFile("/a/b/h".into(), d(100, 3, 2)),
        Symlink("../f".into(), "/a/l".into()),
    ]
    .into_iter()
    .map(Step::Cmd)
    .collect()
}

fn run(config: &Config, steps: impl IntoIterator<Item = Step>) {
    let mut model = Model::new();
    let mut real = Real::new(config.options(), config.staging);
    let mut trace = format!("config: {config:?}\n");
    for step in steps {
        let cmd = match step {
            Step::Cmd(cmd) => cmd,
            Step::Op(op) => op.resolve(&model),
        };
        trace.push_str(&format!("    {cmd:?},\n"));
        let expected = model.apply(&cmd);
        let actual = real.apply(&cmd);
        assert_eq!(
            actual, expected,
            "result differs (left: store, right: model) after:\n{trace}"
        );
        let (m, r) = (model.snapshot(), real.snapshot());
        assert!(
            m == r,
            "state differs after:\n{trace}{}",
            describe_diff(&m, &r)
        );
        if matches!(cmd, Cmd::Sync) {
            check_stored(&model, &real, &trace);
        }
        if config.check_every_op || matches!(cmd, Cmd::Reopen) {
            check(&real, &trace);
        }
    }
    // Everything survives closing and reopening (buffered writes are committed at close).
    let cmd = Cmd::Reopen;
    trace.push_str("    Reopen (final),\n");
    model.apply(&cmd).unwrap();
    real.apply(&cmd).unwrap();
    let (m, r) = (model.snapshot(), real.snapshot());
    assert!(
        m == r,
        "state differs after:\n{trace}{}",
        describe_diff(&m, &r)
    );
    check(&real, &trace);
}

// =====================================================================================
// Generating operations
// =====================================================================================

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
const XATTRS: [&str; 3] = ["user.a", "user.b", "user.c"];
const MODES: [u32; 7] = [0o600, 0o644, 0o755, 0o700, 0o4755, 0o1777, 0o000];

/// Which existing paths a [`P`] picks among.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Every path, `/` included.
    Any,
    /// Every path but `/`.
    NonRoot,
    Files,
    Dirs,
}

/// A path, index-style. `idx` picks among the existing paths of `class` (sorted; all
/// paths if there are none, or if `stray`, to make invalid operations too). `fresh` 0
/// uses that path; otherwise it picks a directory (any path if `stray`) and appends one
/// new name (1..=5) or two (more).
#[derive(Clone, Copy, Debug)]
struct P {
    idx: u16,
    fresh: u8,
    class: Class,
    stray: bool,
}

impl P {
    fn resolve(self, model: &Model) -> String {
        let paths = model.paths();
        let class = match (self.stray, self.fresh) {
            (true, _) => Class::Any,
            (false, 0) => self.class,
            (false, _) => Class::Dirs,
        };
        let fresh = self.fresh != 0;
        let wanted: Vec<&String> = paths
            .iter()
            .filter(|(path, ino)| match class {
                Class::Any => true,
                Class::NonRoot => path != "/",
                Class::Files => model.kind(*ino) == Kind::File,
                // New names go under the root too; existing directories are others.
                Class::Dirs => model.kind(*ino) == Kind::Dir && (fresh || path != "/"),
            })
            .map(|(path, _)| path)
            .collect();
        let base = if wanted.is_empty() {
            &paths[self.idx as usize % paths.len()].0
        } else {
            wanted[self.idx as usize % wanted.len()]
        };
        match self.fresh {
            0 => base.clone(),
            f @ 1..=5 => join(base, NAMES[f as usize - 1]),
            f => join(
                &join(base, NAMES[f as usize % 5]),
                NAMES[(f as usize / 5) % 5],
            ),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    WriteFile(P, Data),
    WriteAt(P, u32, Data),
    Append(P, Data),
    Truncate(P, u32),
    Mkdir(P, bool),
    Rm(P, bool, bool),
    Rmdir(P),
    Unlink(P),
    Rename(P, P),
    RenameAt(P, P, u8),
    Copy(P, P, bool),
    Symlink(u8, u16, P),
    Link(P, P),
    Chmod(P, u8),
    Readdir(P),
    Stat(P),
    Lstat(P),
    ReadRange(P, u32, u16),
    Open(P, u8),
    Create(P, u8),
    KernelOpen(P, u8),
    KernelCreate(P, u8),
    HWrite(u8, u32, Data),
    HRead(u8, u32, u16),
    HFlush(u8),
    HFsync(u8),
    HRelease(u8),
    HSetSize(u8, u32),
    HStat(u8),
    HCopyRange(u8, u32, u8, u32, u32),
    HAllocate(u8, u32, u32, bool),
    CreateWrite(P, Data, Data, Data),
    Replace(P, Data, Data, bool),
    SetXattr(P, u8, u8, u8),
    GetXattr(P, u8),
    RemoveXattr(P, u8),
    Reopen,
    Sync,
    Compact,
    SetQuota(u8),
}

fn flags_of(bits: u8) -> Flags {
    Flags {
        write: bits & 1 != 0 || bits & 6 != 0,
        truncate: bits & 2 != 0,
        append: bits & 4 != 0,
    }
}

/// The size of the file at `path`, to place offsets around its end.
fn size_at(model: &Model, path: &str) -> u64 {
    match model.resolve(path, true) {
        Ok(Resolved { ino: Some(ino), .. }) => model.size(ino),
        _ => 0,
    }
}

/// An offset or length around `size`: inside the file, at its end, or past it.
fn around(size: u64, pick: u32) -> u64 {
    match pick % 8 {
        0 => size,
        1 => 0,
        _ => u64::from(pick / 8) % (size + size / 2 + 9000),
    }
}

/// A symlink target for a link at `link`: an existing path, absolute or relative to the
/// link's directory; a name that may not exist; the link itself (a loop); `..`; `/`.
fn symlink_target(model: &Model, kind: u8, idx: u16, link: &str) -> String {
    let paths = model.paths();
    let existing = &paths[idx as usize % paths.len()].0;
    match kind % 8 {
        0 | 1 => existing.clone(),
        2 | 3 => {
            let depth = components(&split(link).0).len();
            let mut target = "../".repeat(depth);
            target.push_str(existing.trim_start_matches('/'));
            if target.is_empty() {
                target.push('.');
            }
            target
        }
        4 => NAMES[idx as usize % 5].to_string(),
        5 => format!("/nowhere/{}", NAMES[idx as usize % 5]),
        6 => link.to_string(),
        _ => ["..", "/", "."][idx as usize % 3].to_string(),
    }
}

impl Op {
    fn resolve(self, model: &Model) -> Cmd {
        let handle = |h: u8| -> Option<usize> {
            (!model.handles.is_empty()).then(|| h as usize % model.handles.len())
        };
        let is_handle_op = matches!(
            self,
            Op::HWrite(..)
                | Op::HRead(..)
                | Op::HFlush(..)
                | Op::HFsync(..)
                | Op::HRelease(..)
                | Op::HSetSize(..)
                | Op::HStat(..)
                | Op::HCopyRange(..)
                | Op::HAllocate(..)
        );
        if is_handle_op && model.handles.is_empty() {
            // Nothing open: open something instead (mostly), or use a bad handle.
            let h = match self {
                Op::HWrite(h, ..) | Op::HRead(h, ..) | Op::HSetSize(h, ..) => h,
                Op::HFlush(h) | Op::HFsync(h) | Op::HRelease(h) | Op::HStat(h) => h,
                Op::HCopyRange(h, ..) | Op::HAllocate(h, ..) => h,
                _ => unreachable!(),
            };
            if h % 8 == 0 {
                return Cmd::BadHandle;
            }
            let p = P {
                idx: u16::from(h),
                fresh: 0,
                class: Class::Files,
                stray: false,
            };
            let (path, flags) = (p.resolve(model), flags_of(h / 8));
            return if h & 0x40 != 0 {
                Cmd::KernelOpen(path, flags)
            } else {
                Cmd::Open(path, flags)
            };
        }
        let handle_size = |h: usize| model.size(model.handles[h].0);
        match self {
            Op::WriteFile(p, data) => Cmd::WriteFile(p.resolve(model), data),
            Op::WriteAt(p, off, data) => {
                let path = p.resolve(model);
                let offset = around(size_at(model, &path), off);
                Cmd::WriteAt(path, offset, data)
            }
            Op::Append(p, data) => Cmd::Append(p.resolve(model), data),
            Op::Truncate(p, len) => {
                let path = p.resolve(model);
                let len = around(size_at(model, &path), len);
                Cmd::Truncate(path, len)
            }
            Op::Mkdir(p, recursive) => Cmd::Mkdir(p.resolve(model), recursive),
            Op::Rm(p, recursive, force) => Cmd::Rm(p.resolve(model), recursive, force),
            Op::Rmdir(p) => Cmd::Rmdir(p.resolve(model)),
            Op::Unlink(p) => Cmd::Unlink(p.resolve(model)),
            Op::Rename(a, b) => Cmd::Rename(a.resolve(model), b.resolve(model)),
            Op::RenameAt(a, b, how) => Cmd::RenameAt(
                a.resolve(model),
                b.resolve(model),
                [RenameHow::Plain, RenameHow::NoReplace, RenameHow::Exchange][how as usize % 3],
            ),
            Op::Copy(a, b, recursive) => Cmd::Copy(a.resolve(model), b.resolve(model), recursive),
            Op::Symlink(kind, idx, p) => {
                let path = p.resolve(model);
                Cmd::Symlink(symlink_target(model, kind, idx, &path), path)
            }
            Op::Link(a, b) => Cmd::Link(a.resolve(model), b.resolve(model)),
            Op::Chmod(p, mode) => Cmd::Chmod(p.resolve(model), MODES[mode as usize % 7]),
            Op::Readdir(p) => Cmd::Readdir(p.resolve(model)),
            Op::Stat(p) => Cmd::Stat(p.resolve(model)),
            Op::Lstat(p) => Cmd::Lstat(p.resolve(model)),
            Op::ReadRange(p, off, len) => {
                let path = p.resolve(model);
                let offset = around(size_at(model, &path), off);
                Cmd::ReadRange(path, offset, len as usize)
            }
            Op::Open(p, bits) => Cmd::Open(p.resolve(model), flags_of(bits)),
            Op::Create(p, bits) => Cmd::Create(p.resolve(model), flags_of(bits)),
            Op::KernelOpen(p, bits) => Cmd::KernelOpen(p.resolve(model), flags_of(bits)),
            Op::KernelCreate(p, bits) => Cmd::KernelCreate(p.resolve(model), flags_of(bits)),
            Op::HWrite(h, off, data) => match handle(h) {
                Some(h) => Cmd::HWrite(h, around(handle_size(h), off), data),
                None => Cmd::BadHandle,
            },
            Op::HRead(h, off, len) => match handle(h) {
                Some(h) => Cmd::HRead(h, around(handle_size(h), off), len as usize),
                None => Cmd::BadHandle,
            },
            Op::HFlush(h) => handle(h).map_or(Cmd::BadHandle, Cmd::HFlush),
            Op::HFsync(h) => handle(h).map_or(Cmd::BadHandle, Cmd::HFsync),
            Op::HRelease(h) => handle(h).map_or(Cmd::BadHandle, Cmd::HRelease),
            Op::HSetSize(h, len) => match handle(h) {
                Some(h) => Cmd::HSetSize(h, around(handle_size(h), len)),
                None => Cmd::BadHandle,
            },
            Op::HStat(h) => handle(h).map_or(Cmd::BadHandle, Cmd::HStat),
            Op::HCopyRange(hi, off_in, ho, off_out, len) => {
                let (hi, ho) = (handle(hi).unwrap(), handle(ho).unwrap());
                let off_in = around(handle_size(hi), off_in);
                let off_out = around(handle_size(ho), off_out);
                // Mostly the rest of the file, sometimes a piece, sometimes past the end.
                let len = match len % 4 {
                    0 => u64::from(len / 4) % 70_000,
                    1 => u64::from(len / 4) % 3000,
                    _ => handle_size(hi).saturating_sub(off_in),
                };
                Cmd::HCopyRange(hi, off_in, ho, off_out, len)
            }
            Op::HAllocate(h, offset, len, keep_size) => {
                let h = handle(h).unwrap();
                let offset = around(handle_size(h), offset);
                Cmd::HAllocate(h, offset, u64::from(len % 20_000), keep_size)
            }
            Op::CreateWrite(p, a, b, c) => Cmd::CreateWrite(p.resolve(model), vec![a, b, c]),
            Op::Replace(p, a, b, commit) => Cmd::Replace(p.resolve(model), vec![a, b], commit),
            Op::SetXattr(p, name, value, mode) => Cmd::SetXattr(
                p.resolve(model),
                XATTRS[name as usize % 3].into(),
                vec![value; value as usize % 7],
                [XattrSet::Any, XattrSet::Create, XattrSet::Replace][mode as usize % 3],
            ),
            Op::GetXattr(p, name) => {
                Cmd::GetXattr(p.resolve(model), XATTRS[name as usize % 3].into())
            }
            Op::RemoveXattr(p, name) => {
                Cmd::RemoveXattr(p.resolve(model), XATTRS[name as usize % 3].into())
            }
            Op::Reopen => Cmd::Reopen,
            Op::Sync => Cmd::Sync,
            Op::Compact => Cmd::Compact,
            // A few nodes more than there are now, or none.
            Op::SetQuota(k) => {
                Cmd::SetQuota((k % 8 < 6).then(|| model.nodes.len() as u64 + u64::from(k % 8)))
            }
        }
    }
}

fn data_strategy() -> impl Strategy<Value = Data> {
    let len = prop_oneof![
        3 => 0usize..64,
        4 => 0usize..3000,
        2 => 0usize..20_000,
        1 => 0usize..65_536,
    ];
    (len, 0u8..4, 0u8..3).prop_map(|(len, kind, seed)| Data { len, kind, seed })
}

/// A path of `class`, new (a fresh name under a directory) with probability `new`.
fn p(class: Class, new: f64) -> impl Strategy<Value = P> {
    let fresh = prop_oneof![4 => 1u8..=5, 1 => 6u8..30];
    let fresh = prop::bool::weighted(new).prop_flat_map(move |new| {
        if new {
            fresh.clone().boxed()
        } else {
            Just(0u8).boxed()
        }
    });
    (any::<u16>(), fresh, prop::bool::weighted(0.1)).prop_map(move |(idx, fresh, stray)| P {
        idx,
        fresh,
        class,
        stray,
    })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    use Class::*;
    let file = || p(Files, 0.0);
    let file_or_new = || p(Files, 0.4);
    let new = || p(Any, 0.9);
    let old = || p(NonRoot, 0.1);
    let any_path = || p(Any, 0.2);
    let h = || any::<u8>();
    prop_oneof![
        10 => (file_or_new(), data_strategy()).prop_map(|(p, d)| Op::WriteFile(p, d)),
        6 => (file(), any::<u32>(), data_strategy()).prop_map(|(p, o, d)| Op::WriteAt(p, o, d)),
        3 => (file_or_new(), data_strategy()).prop_map(|(p, d)| Op::Append(p, d)),
        4 => (file(), any::<u32>()).prop_map(|(p, l)| Op::Truncate(p, l)),
        6 => (new(), any::<bool>()).prop_map(|(p, r)| Op::Mkdir(p, r)),
        3 => (old(), any::<bool>(), any::<bool>()).prop_map(|(p, r, f)| Op::Rm(p, r, f)),
        2 => p(Dirs, 0.1).prop_map(Op::Rmdir),
        2 => old().prop_map(Op::Unlink),
        5 => (old(), p(Any, 0.6)).prop_map(|(a, b)| Op::Rename(a, b)),
        5 => (old(), p(Any, 0.4), any::<u8>()).prop_map(|(a, b, f)| Op::RenameAt(a, b, f)),
        3 => (old(), new(), any::<bool>()).prop_map(|(a, b, r)| Op::Copy(a, b, r)),
        4 => (any::<u8>(), any::<u16>(), new()).prop_map(|(k, i, p)| Op::Symlink(k, i, p)),
        3 => (p(Files, 0.05), new()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (any_path(), any::<u8>()).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => p(Dirs, 0.1).prop_map(Op::Readdir),
        1 => any_path().prop_map(Op::Stat),
        1 => any_path().prop_map(Op::Lstat),
        2 => (file(), any::<u32>(), any::<u16>()).prop_map(|(p, o, l)| Op::ReadRange(p, o, l)),
        3 => (file(), any::<u8>()).prop_map(|(p, f)| Op::Open(p, f)),
        2 => (new(), any::<u8>()).prop_map(|(p, f)| Op::Create(p, f)),
        4 => (file(), any::<u8>()).prop_map(|(p, f)| Op::KernelOpen(p, f)),
        3 => (new(), any::<u8>()).prop_map(|(p, f)| Op::KernelCreate(p, f)),
        7 => (h(), any::<u32>(), data_strategy()).prop_map(|(h, o, d)| Op::HWrite(h, o, d)),
        2 => (h(), any::<u32>(), any::<u16>()).prop_map(|(h, o, l)| Op::HRead(h, o, l)),
        1 => h().prop_map(Op::HFlush),
        1 => h().prop_map(Op::HFsync),
        2 => h().prop_map(Op::HRelease),
        2 => (h(), any::<u32>()).prop_map(|(h, l)| Op::HSetSize(h, l)),
        1 => h().prop_map(Op::HStat),
        3 => (h(), any::<u32>(), h(), any::<u32>(), any::<u32>())
            .prop_map(|(a, o, b, p, l)| Op::HCopyRange(a, o, b, p, l)),
        1 => (h(), any::<u32>(), any::<u32>(), any::<bool>())
            .prop_map(|(h, o, l, k)| Op::HAllocate(h, o, l, k)),
        2 => (file_or_new(), data_strategy(), data_strategy(), data_strategy())
            .prop_map(|(p, a, b, c)| Op::CreateWrite(p, a, b, c)),
        2 => (file_or_new(), data_strategy(), data_strategy(), prop::bool::weighted(0.8))
            .prop_map(|(p, a, b, commit)| Op::Replace(p, a, b, commit)),
        2 => (any_path(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(p, n, v, m)| Op::SetXattr(p, n, v, m)),
        1 => (any_path(), any::<u8>()).prop_map(|(p, n)| Op::GetXattr(p, n)),
        1 => (any_path(), any::<u8>()).prop_map(|(p, n)| Op::RemoveXattr(p, n)),
        2 => Just(Op::Reopen),
        1 => Just(Op::Sync),
        1 => Just(Op::Compact),
        1 => any::<u8>().prop_map(Op::SetQuota),
    ]
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn proptest_config(default_cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default_cases),
        // Shrunk failures become `regression_*` tests below, not files.
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config(64))]

    /// Small blocks, so content is many blocks and every change re-chunks.
    #[test]
    fn model_small_chunks(
        ops in prop::collection::vec(op_strategy(), 1..60),
        dirty_small in any::<bool>(),
        check_every_op in prop::bool::weighted(0.75),
        with_prelude in prop::bool::weighted(0.8),
        staging in prop::bool::weighted(0.8),
        stage_small in prop::bool::weighted(0.25),
    ) {
        let config = Config {
            small_chunks: true,
            dirty_file_bytes_max: if dirty_small { 3000 } else { 8 << 20 },
            check_every_op,
            staging,
            stage_size_max: if stage_small { STAGE_SIZE_SMALL } else { STAGE_SIZE_MAX },
        };
        let start = if with_prelude { prelude() } else { Vec::new() };
        run(&config, start.into_iter().chain(ops.into_iter().map(Step::Op)));
    }
}

proptest! {
    #![proptest_config(proptest_config(12))]

    /// The default block sizes: most files are one block.
    #[test]
    fn model_default_chunks(ops in prop::collection::vec(op_strategy(), 1..60)) {
        let config = Config {
            small_chunks: false,
            dirty_file_bytes_max: 8 << 20,
            check_every_op: true,
            staging: true,
            stage_size_max: STAGE_SIZE_MAX,
        };
        run(&config, prelude().into_iter().chain(ops.into_iter().map(Step::Op)));
    }
}

// =====================================================================================
// Regressions: shrunk failures, fixed
// =====================================================================================

/// Writing through a handle, then a few of everything, then closing the workspace.
#[test]
fn regression_smoke() {
    use Cmd::*;
    run_cmds(
        &SMALL,
        [
            Mkdir("/a".into(), false),
            WriteFile("/a/b".into(), d(5000, 0, 1)),
            WriteAt("/a/b".into(), 9000, d(100, 1, 0)),
            Symlink("a/b".into(), "/l".into()),
            Append("/l".into(), d(10, 3, 2)),
            Open("/a/b".into(), RW),
            Unlink("/a/b".into()),
            HWrite(0, 20_000, d(3000, 0, 2)),
            HSetSize(0, 7000),
            Reopen,
        ],
    );
}

const RW: Flags = Flags {
    write: true,
    truncate: false,
    append: false,
};

/// RENAME_NOREPLACE onto an existing target naming the same node (the entry itself or
/// another hard link) reported success; renameat2(2) fails with EEXIST.
#[test]
fn regression_rename_noreplace_onto_same_node() {
    use Cmd::*;
    run_cmds(
        &SMALL,
        [
            Mkdir("/a".into(), false),
            RenameAt("/a".into(), "/a".into(), RenameHow::NoReplace),
            WriteFile("/f".into(), d(10, 1, 0)),
            Link("/f".into(), "/g".into()),
            RenameAt("/f".into(), "/g".into(), RenameHow::NoReplace),
            RenameAt("/f".into(), "/g".into(), RenameHow::Plain),
        ],
    );
}

/// `mkdir -p` over a dangling symlink followed it and created the directory where the
/// link pointed, under the link's name (`/d/a` here), or failed with ENOENT; mkdir(2)
/// does not follow a final symlink, so the name is taken: EEXIST.
#[test]
fn regression_mkdir_recursive_over_dangling_symlink() {
    use Cmd::*;
    run_cmds(
        &SMALL,
        [
            Symlink("/nowhere/a".into(), "/a".into()),
            Mkdir("/a".into(), true),
            Mkdir("/d".into(), false),
            Symlink("/d/x".into(), "/b".into()),
            Mkdir("/b".into(), true),
            Mkdir("/b/c".into(), true),
            Symlink("/b".into(), "/loop".into()),
            Rm("/b".into(), false, false),
            Symlink("/loop".into(), "/b".into()),
            Mkdir("/loop/c".into(), true),
            // Through a symlink to a directory it works.
            Symlink("/d".into(), "/e".into()),
            Mkdir("/e/f/g".into(), true),
        ],
    );
}

/// Writes still buffered when the workspace was dropped were lost, although dropping it
/// is documented to commit them.
#[test]
fn regression_buffered_writes_survive_close() {
    use Cmd::*;
    run_cmds(
        &Config {
            check_every_op: false,
            ..SMALL
        },
        [
            Create("/f".into(), RW),
            HWrite(0, 0, d(100, 1, 0)),
            Reopen,
            Open("/f".into(), RW),
            HWrite(0, 5000, d(70_000, 0, 1)),
            HSetSize(0, 60_000),
            HWrite(0, 10, d(10, 3, 0)),
            Reopen,
        ],
    );
}

/// `Fs::write_file` over a staged file changed the database only. While a file is staged
/// its staging file is its content: every open (the handle here, later ones) read the
/// old bytes there, and ingesting the file put them back over the new ones.
#[test]
fn regression_write_file_over_staged_file() {
    use Cmd::*;
    run_cmds(
        &SMALL,
        [
            // Open for writing through its staging file.
            KernelCreate("/f".into(), RW),
            HWrite(0, 0, d(100, 0, 1)),
            WriteFile("/f".into(), d(10, 1, 0)),
            HRelease(0),
            // Ingested: clean, and kept as a cache that the next open shares.
            Sync,
            WriteFile("/f".into(), d(20, 3, 1)),
            ReadRange("/f".into(), 0, 100),
            Reopen,
        ],
    );
}

/// `Fs::copy` of a file open for writing through its staging file shared the blocks the
/// store had before the open (here, before it truncated the file), not what the file
/// held: a copy ingested only the staged files no writer held.
#[test]
fn regression_copy_of_staged_file_open_for_writing() {
    use Cmd::*;
    let truncate = Flags {
        truncate: true,
        ..RW
    };
    run_cmds(
        &SMALL,
        [
            WriteFile("/f".into(), d(3000, 0, 0)),
            KernelOpen("/f".into(), truncate),
            Copy("/f".into(), "/g".into(), false),
            HWrite(0, 100, d(5000, 1, 0)),
            // The file deeper in a copied tree, under another name.
            Mkdir("/d".into(), false),
            Link("/f".into(), "/d/f".into()),
            Copy("/d".into(), "/e".into(), true),
            Reopen,
        ],
    );
}

/// copy_file_range(2) refuses overlapping ranges of one file with EINVAL. A staged file
/// did (the host's copy between staging files refused), a buffered one copied.
#[test]
fn regression_copy_range_overlapping_in_one_file() {
    use Cmd::*;
    run_cmds(
        &SMALL,
        [
            WriteFile("/f".into(), d(3000, 0, 0)),
            Open("/f".into(), RW),
            HCopyRange(0, 0, 0, 1000, 3000),
            // Side by side, and past the end (the length is cut there first): no overlap.
            HCopyRange(0, 0, 0, 3000, 3000),
            HCopyRange(0, 5000, 0, 0, 2000),
            HRelease(0),
            KernelOpen("/f".into(), RW),
            HCopyRange(0, 0, 0, 1000, 3000),
            HCopyRange(0, 0, 0, 6000, 10_000),
        ],
    );
}

/// copy_file_range from a staged file into a buffered one loaded the source's write
/// buffer state, which a staged inode never uses: once the staging file was clean again
/// (the truncation here ingested by `check`), getattr took the size from that stale state
/// (0) and a later copy from it would have copied nothing.
#[test]
fn regression_copy_range_from_staged_file_to_buffered_one() {
    use Cmd::*;
    let read_only = Flags { write: false, ..RW };
    run_cmds(
        &SMALL,
        [
            Create("/b".into(), RW),
            KernelCreate("/e".into(), read_only),
            HCopyRange(1, 0, 0, 5076, 44641),
            HSetSize(1, 7548),
            Stat("/e".into()),
            HCopyRange(1, 0, 0, 0, 10_000),
        ],
    );
}
