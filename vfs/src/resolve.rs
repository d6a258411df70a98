//! Path resolution inside one transaction: from an absolute path to the directory
//! holding its last entry, the entry's name and the node it names, following symlinks
//! (in the middle always, at the end when asked) and `..` as Linux does. Below the path
//! API, so that the store's other users (replication, subtree operations) resolve
//! paths the same way without reaching up to it.

use crate::error::{kind, Result};
use crate::store;
use crate::types::*;

/// Symlinks followed while resolving one path before giving up with ELOOP.
pub const SYMLINKS_MAX: usize = 40;

/// What resolution does with a symlink it meets where a path goes on through it (in
/// the middle, or at the end when following).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Symlinks {
    /// Follows it, as the kernel does: an absolute target starts at the workspace root.
    #[default]
    Follow,
    /// Fails with ELOOP: for callers that resolve links themselves, in a namespace of
    /// their own where an absolute target means something else (the shell backend's).
    Refuse,
}

/// Where a path leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The directory holding the final entry.
    pub parent: InodeNo,
    /// The final entry's name; empty for `/` and for paths ending in `.` or `..`.
    pub name: Vec<u8>,
    /// The node, if the entry exists.
    pub ino: Option<InodeNo>,
}

/// Resolves `path` (absolute, bytes) inside one read transaction.
pub(crate) fn resolve_in(
    conn: &rusqlite::Connection,
    path: &[u8],
    follow: bool,
    symlinks: Symlinks,
) -> Result<Resolved> {
    let must_be_dir = path.len() > 1 && path.ends_with(b"/");
    let mut pending: Vec<Vec<u8>> = components(path);
    pending.reverse();
    // The chain of directories from the root to the current one, for "..".
    let mut chain: Vec<InodeNo> = vec![InodeNo::ROOT];
    let mut links = 0;
    let mut last_name: Vec<u8> = Vec::new();
    let mut last_parent = InodeNo::ROOT;
    let mut last_ino = Some(InodeNo::ROOT);
    while let Some(component) = pending.pop() {
        let current = *chain.last().expect("the chain always holds the root");
        let is_last = pending.is_empty();
        if component == b"." || component == b".." {
            if component == b".." && chain.len() > 1 {
                chain.pop();
            }
            let dir = *chain.last().expect("the chain always holds the root");
            last_name.clear();
            last_parent = dir;
            last_ino = Some(dir);
            let attr = store::attr(conn, current)?;
            if !attr.is_dir() {
                return Err(kind::NotDir());
            }
            continue;
        }
        let dir = store::attr(conn, current)?;
        if !dir.is_dir() {
            return Err(kind::NotDir());
        }
        if component.len() > store::NAME_MAX {
            return Err(kind::NameTooLong());
        }
        let child = store::lookup_attr(conn, current, &component)?;
        let Some(child) = child else {
            if is_last {
                return Ok(Resolved {
                    parent: current,
                    name: component,
                    ino: None,
                });
            }
            return Err(kind::NotFound());
        };
        if child.kind == FileKind::Symlink && (!is_last || follow || must_be_dir) {
            if symlinks == Symlinks::Refuse {
                return Err(kind::Loop());
            }
            links += 1;
            if links > SYMLINKS_MAX {
                return Err(kind::Loop());
            }
            enter_link(conn, child.ino, &mut chain, &mut pending)?;
            continue;
        }
        if is_last {
            last_parent = current;
            last_name = component;
            last_ino = Some(child.ino);
            if must_be_dir && !child.is_dir() {
                return Err(kind::NotDir());
            }
            break;
        }
        chain.push(child.ino);
        last_ino = Some(child.ino);
    }
    Ok(Resolved {
        parent: last_parent,
        name: last_name,
        ino: last_ino,
    })
}

/// Goes on through symlink `ino`: its target's components are resolved next, from the
/// root if it is absolute.
fn enter_link(
    conn: &rusqlite::Connection,
    ino: InodeNo,
    chain: &mut Vec<InodeNo>,
    pending: &mut Vec<Vec<u8>>,
) -> Result<()> {
    let target = store::symlink_target(conn, ino)?;
    if target.starts_with(b"/") {
        chain.truncate(1);
    }
    let mut parts = components(&target);
    if parts.is_empty() {
        parts.push(b".".to_vec());
    }
    pending.extend(parts.into_iter().rev());
    Ok(())
}

fn components(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .map(|c| c.to_vec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_skip_empty_parts() {
        assert_eq!(components(b"/a//b/"), vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(components(b"/").is_empty());
    }
}
