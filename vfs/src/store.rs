//! Rows of nodes and directory entries: the SQL behind the namespace.
//!
//! Plain functions over a connection. Read helpers take any connection (reader or the
//! write transaction); mutating helpers take the [`WriteTxn`] so they stamp its revision
//! and keep its counters. Policy (what rename may replace, when a node dies) lives in
//! `workspace.rs`; this module only reads and writes rows.

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::db::{kind_code, kind_from_code, WriteTxn};
use crate::error::{kind, Error, Result, StorageContext};
use crate::types::{Attr, DirEntry, FileKind, InodeNo, NewNode, Revision, TimestampNs};

/// Longest name of one directory entry, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest path the path API accepts, in bytes.
pub const PATH_MAX: usize = 4096;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Most hard links to one node.
pub const LINK_MAX: u32 = 65000;

// A name and a symlink target each fit in a path.
const _: () = assert!(NAME_MAX < PATH_MAX && SYMLINK_MAX < PATH_MAX);

/// Checks one entry name: not empty, no slash or NUL, not `.` or `..`, short enough.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(kind::NameTooLong());
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::invalid("not a valid entry name"));
    }
    Ok(())
}

/// The columns of `nodes` that make an [`Attr`], in the order `attr_from_row` reads
/// them, each prefixed with the table alias given (or none). A macro so that every
/// statement is one literal, made at compile time: the statement cache is keyed by the
/// text, and these statements serve the commonest requests.
macro_rules! attr_columns {
    ($($alias:literal)?) => {
        column_list!($($alias)?;
            ino, kind, perm, uid, gid, nlink, size, atime, mtime, ctime, rdev, revision)
    };
}

/// `a, b, c`, or with an alias `t.a, t.b, t.c`, as one literal.
macro_rules! column_list {
    (; $first:ident $(, $rest:ident)*) => {
        concat!(stringify!($first) $(, ", ", stringify!($rest))*)
    };
    ($alias:literal; $first:ident $(, $rest:ident)*) => {
        concat!($alias, ".", stringify!($first) $(, ", ", $alias, ".", stringify!($rest))*)
    };
}

/// How many columns `attr_columns!` names.
const ATTR_COLUMN_COUNT: usize = 12;

fn attr_from_row(row: &Row<'_>, first: usize) -> rusqlite::Result<(Attr, i64)> {
    let kind_code: i64 = row.get(first + 1)?;
    let attr = Attr {
        ino: InodeNo(row.get::<_, i64>(first)? as u64),
        kind: FileKind::File, // fixed up by the caller, which can return a typed error
        perm: row.get::<_, i64>(first + 2)? as u32,
        uid: row.get::<_, i64>(first + 3)? as u32,
        gid: row.get::<_, i64>(first + 4)? as u32,
        nlink: row.get::<_, i64>(first + 5)? as u32,
        size: row.get::<_, i64>(first + 6)? as u64,
        atime: row.get(first + 7)?,
        mtime: row.get(first + 8)?,
        ctime: row.get(first + 9)?,
        rdev: row.get::<_, i64>(first + 10)? as u32,
        revision: Revision(row.get::<_, i64>(first + 11)? as u64),
    };
    Ok((attr, kind_code))
}

fn finish_attr((mut attr, code): (Attr, i64)) -> Result<Attr> {
    attr.kind = kind_from_code(code)?;
    Ok(attr)
}

/// The attributes of `ino`, or `None` if no such node exists.
pub(crate) fn load_attr(conn: &Connection, ino: InodeNo) -> Result<Option<Attr>> {
    let row = conn
        .prepare_cached(concat!(
            "SELECT ",
            attr_columns!(),
            " FROM nodes WHERE ino = ?1"
        ))
        .and_then(|mut stmt| {
            stmt.query_row([ino.0 as i64], |row| attr_from_row(row, 0))
                .optional()
        })
        .ctx("reading a node")?;
    row.map(finish_attr).transpose()
}

/// Like [`load_attr`], but a missing node is ENOENT.
pub(crate) fn attr(conn: &Connection, ino: InodeNo) -> Result<Attr> {
    load_attr(conn, ino)?.ok_or_else(kind::NotFound)
}

/// The node a directory entry names, if the entry exists.
pub(crate) fn lookup(conn: &Connection, parent: InodeNo, name: &[u8]) -> Result<Option<InodeNo>> {
    conn.prepare_cached("SELECT ino FROM dirents WHERE parent = ?1 AND name = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![parent.0 as i64, name], |row| row.get::<_, i64>(0))
                .optional()
        })
        .map(|ino| ino.map(|i| InodeNo(i as u64)))
        .ctx("looking up a name")
}

/// The attributes of the node a directory entry names.
pub(crate) fn lookup_attr(conn: &Connection, parent: InodeNo, name: &[u8]) -> Result<Option<Attr>> {
    let row = conn
        .prepare_cached(concat!(
            "SELECT ",
            attr_columns!("n"),
            " FROM dirents d JOIN nodes n ON n.ino = d.ino WHERE d.parent = ?1 AND d.name = ?2"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![parent.0 as i64, name], |row| attr_from_row(row, 0))
                .optional()
        })
        .ctx("looking up a name")?;
    row.map(finish_attr).transpose()
}

/// The attributes of directory `parent` (`None` if no such node) and of the node its
/// entry `name` names (`None` if there is no such entry), in one statement.
pub(crate) fn lookup_in(
    conn: &Connection,
    parent: InodeNo,
    name: &[u8],
) -> Result<(Option<Attr>, Option<Attr>)> {
    const SQL: &str = concat!(
        "SELECT ",
        attr_columns!("p"),
        ", ",
        attr_columns!("n"),
        " FROM nodes p
         LEFT JOIN dirents d ON d.parent = p.ino AND d.name = ?2
         LEFT JOIN nodes n ON n.ino = d.ino
         WHERE p.ino = ?1"
    );
    let row = conn
        .prepare_cached(SQL)
        .and_then(|mut stmt| {
            stmt.query_row(params![parent.0 as i64, name], |row| {
                let dir = attr_from_row(row, 0)?;
                let child = match row.get::<_, Option<i64>>(ATTR_COLUMN_COUNT)? {
                    Some(_) => Some(attr_from_row(row, ATTR_COLUMN_COUNT)?),
                    None => None,
                };
                Ok((dir, child))
            })
            .optional()
        })
        .ctx("looking up a name")?;
    match row {
        None => Ok((None, None)),
        Some((dir, child)) => Ok((Some(finish_attr(dir)?), child.map(finish_attr).transpose()?)),
    }
}

/// The target of a symlink.
pub(crate) fn symlink_target(conn: &Connection, ino: InodeNo) -> Result<Vec<u8>> {
    let row: Option<(i64, Option<Vec<u8>>)> = conn
        .prepare_cached("SELECT kind, target FROM nodes WHERE ino = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([ino.0 as i64], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .ctx("reading a symlink")?;
    match row {
        None => Err(kind::NotFound()),
        Some((code, target)) => {
            if kind_from_code(code)? != FileKind::Symlink {
                return Err(kind::NotSymlink());
            }
            target.ok_or_else(|| Error::corrupt(format!("symlink {ino} has no target")))
        }
    }
}

/// Entries of a directory with a cookie greater than `after`, in cookie order.
pub(crate) fn list(
    conn: &Connection,
    dir: InodeNo,
    after: u64,
    limit: usize,
) -> Result<Vec<DirEntry>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT d.cookie, d.name, d.ino, n.kind FROM dirents d JOIN nodes n ON n.ino = d.ino
             WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3",
        )
        .ctx("listing a directory")?;
    let rows = stmt
        .query_map(
            params![
                dir.0 as i64,
                after.min(i64::MAX as u64) as i64,
                limit.min(i64::MAX as usize) as i64
            ],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, Vec<u8>>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            },
        )
        .ctx("listing a directory")?;
    let mut out = Vec::new();
    for row in rows {
        let (cookie, name, ino, code) = row.ctx("listing a directory")?;
        out.push(DirEntry {
            name,
            ino: InodeNo(ino as u64),
            kind: kind_from_code(code)?,
            cookie: cookie as u64,
        });
    }
    Ok(out)
}

/// Entries with their attributes, as `readdirplus` needs them.
pub(crate) fn list_plus(
    conn: &Connection,
    dir: InodeNo,
    after: u64,
    limit: usize,
) -> Result<Vec<(DirEntry, Attr)>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT d.cookie, d.name, ",
            attr_columns!("n"),
            " FROM dirents d JOIN nodes n ON n.ino = d.ino
             WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3"
        ))
        .ctx("listing a directory")?;
    let rows = stmt
        .query_map(
            params![
                dir.0 as i64,
                after.min(i64::MAX as u64) as i64,
                limit.min(i64::MAX as usize) as i64
            ],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, Vec<u8>>(1)?,
                    attr_from_row(row, 2)?,
                ))
            },
        )
        .ctx("listing a directory")?;
    let mut out = Vec::new();
    for row in rows {
        let (cookie, name, raw) = row.ctx("listing a directory")?;
        let attr = finish_attr(raw)?;
        let entry = DirEntry {
            name,
            ino: attr.ino,
            kind: attr.kind,
            cookie: cookie as u64,
        };
        out.push((entry, attr));
    }
    Ok(out)
}

/// Whether a directory has any entry.
pub(crate) fn has_entries(conn: &Connection, dir: InodeNo) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM dirents WHERE parent = ?1 LIMIT 1")
        .and_then(|mut stmt| stmt.exists([dir.0 as i64]))
        .ctx("checking a directory")
}

/// The directory holding `dir` and its name there. `None` for the root. Directories
/// have exactly one entry naming them.
pub(crate) fn parent_of_dir(conn: &Connection, dir: InodeNo) -> Result<Option<(InodeNo, Vec<u8>)>> {
    if dir == InodeNo::ROOT {
        return Ok(None);
    }
    conn.prepare_cached("SELECT parent, name FROM dirents WHERE ino = ?1 LIMIT 1")
        .and_then(|mut stmt| {
            stmt.query_row([dir.0 as i64], |row| {
                Ok((
                    InodeNo(row.get::<_, i64>(0)? as u64),
                    row.get::<_, Vec<u8>>(1)?,
                ))
            })
            .optional()
        })
        .ctx("finding a parent")
}

/// The absolute path of a directory, walking up its entries.
pub(crate) fn dir_path(conn: &Connection, dir: InodeNo) -> Result<Vec<u8>> {
    let mut names = Vec::new();
    let mut current = dir;
    while let Some((parent, name)) = parent_of_dir(conn, current)? {
        names.push(name);
        if names.len() > PATH_MAX {
            return Err(Error::corrupt(format!("{dir} has a cycle of parents")));
        }
        current = parent;
    }
    if current != InodeNo::ROOT {
        // A detached directory (being deleted): no path.
        return Err(kind::NotFound());
    }
    let mut path = Vec::new();
    for name in names.iter().rev() {
        path.push(b'/');
        path.extend_from_slice(name);
    }
    if path.is_empty() {
        path.push(b'/');
    }
    Ok(path)
}

/// The path of entry `name` in `parent`.
pub(crate) fn entry_path(conn: &Connection, parent: InodeNo, name: &[u8]) -> Result<Vec<u8>> {
    let mut path = dir_path(conn, parent)?;
    if path != b"/" {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    Ok(path)
}

/// Whether `ancestor` is `dir` or one of its ancestors.
pub(crate) fn is_ancestor(conn: &Connection, ancestor: InodeNo, dir: InodeNo) -> Result<bool> {
    let mut current = dir;
    for _ in 0..=PATH_MAX {
        if current == ancestor {
            return Ok(true);
        }
        match parent_of_dir(conn, current)? {
            Some((parent, _)) => current = parent,
            None => return Ok(false),
        }
    }
    Err(Error::corrupt(format!("{dir} has a cycle of parents")))
}

/// Inserts a node with the link count of a freshly named node (2 for a directory, 1
/// otherwise) and returns its number. Counts it against the inode quota.
pub(crate) fn insert_node(
    txn: &mut WriteTxn<'_>,
    kind: FileKind,
    owner: NewNode,
    rdev: u32,
    target: Option<&[u8]>,
    now: TimestampNs,
) -> Result<InodeNo> {
    let nlink = if kind == FileKind::Directory { 2 } else { 1 };
    let size = target.map_or(0, |t| t.len() as i64);
    let ino = txn.allocate_ino();
    txn.prepare_cached(
        "INSERT INTO nodes (ino, kind, perm, uid, gid, nlink, size, atime, mtime, ctime, rdev, target, revision)
         VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            kind_code(kind),
            owner.perm & 0o7777,
            owner.uid,
            owner.gid,
            nlink,
            size,
            now,
            rdev,
            target,
            txn.revision.0 as i64,
            ino as i64
        ])
    })
    .ctx("creating a node")?;
    txn.node_count += 1;
    Ok(InodeNo(ino))
}

/// Adds entry `name` in `parent` for `ino`. Link counts are the caller's business.
pub(crate) fn insert_dirent(
    txn: &mut WriteTxn<'_>,
    parent: InodeNo,
    name: &[u8],
    ino: InodeNo,
) -> Result<()> {
    let cookie = txn.allocate_cookie();
    txn.prepare_cached(
        "INSERT INTO dirents (cookie, parent, name, ino, revision) VALUES (?5, ?1, ?2, ?3, ?4)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            parent.0 as i64,
            name,
            ino.0 as i64,
            txn.revision.0 as i64,
            cookie as i64
        ])
    })
    .map_err(|e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => kind::Exists(),
        _ => Error::Storage {
            path: Default::default(),
            context: "adding an entry",
            source: e,
        },
    })?;
    Ok(())
}

/// Removes entry `name` from `parent` and records a tombstone for its path. Inside a
/// removed tree only the top gets one (`tombstone` false below it): a tombstone covers
/// everything under its path.
pub(crate) fn remove_dirent(txn: &WriteTxn<'_>, parent: InodeNo, name: &[u8]) -> Result<()> {
    remove_dirent_with(txn, parent, name, true)
}

pub(crate) fn remove_dirent_with(
    txn: &WriteTxn<'_>,
    parent: InodeNo,
    name: &[u8],
    tombstone: bool,
) -> Result<()> {
    let path = if tombstone {
        entry_path(txn, parent, name)?
    } else {
        Vec::new()
    };
    let removed = txn
        .prepare_cached("DELETE FROM dirents WHERE parent = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.execute(params![parent.0 as i64, name]))
        .ctx("removing an entry")?;
    if removed != 1 {
        return Err(Error::corrupt("removed an entry that was not there"));
    }
    if !tombstone {
        return Ok(());
    }
    txn.prepare_cached("INSERT INTO tombstones (revision, path) VALUES (?1, ?2)")
        .and_then(|mut stmt| stmt.execute(params![txn.revision.0 as i64, path]))
        .ctx("recording a tombstone")?;
    Ok(())
}

/// Adds `delta` to a node's link count and stamps the change.
pub(crate) fn add_nlink(
    txn: &WriteTxn<'_>,
    ino: InodeNo,
    delta: i64,
    now: TimestampNs,
) -> Result<()> {
    txn.prepare_cached(
        "UPDATE nodes SET nlink = nlink + ?2, ctime = ?3, revision = ?4 WHERE ino = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, delta, now, txn.revision.0 as i64]))
    .ctx("counting links")?;
    Ok(())
}

/// Marks a directory's content as changed now (entry added or removed).
pub(crate) fn touch_dir(
    txn: &WriteTxn<'_>,
    dir: InodeNo,
    nlink_delta: i64,
    now: TimestampNs,
) -> Result<()> {
    txn.prepare_cached(
        "UPDATE nodes SET mtime = ?2, ctime = ?2, nlink = nlink + ?3, revision = ?4 WHERE ino = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            dir.0 as i64,
            now,
            nlink_delta,
            txn.revision.0 as i64
        ])
    })
    .ctx("updating a directory")?;
    Ok(())
}

/// Counts a subdirectory in or out of `dir`, leaving its times and its revision alone:
/// replication applies a directory's state (times, mode) from its own entry, and an
/// entry added to it is a change of the entry, not of the directory (see
/// [`set_revision`]).
pub(crate) fn count_subdirs(txn: &WriteTxn<'_>, dir: InodeNo, nlink_delta: i64) -> Result<()> {
    txn.prepare_cached("UPDATE nodes SET nlink = nlink + ?2 WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute(params![dir.0 as i64, nlink_delta]))
        .ctx("updating a directory")?;
    Ok(())
}

/// Puts back a node's revision. Replication uses it for a directory that a received
/// batch added an entry to or removed one from: stamping the directory with the batch's
/// revision would mark its state as received, and a change of our own to it that is
/// not pushed yet (its mtime, say) would never be sent.
pub(crate) fn set_revision(txn: &WriteTxn<'_>, ino: InodeNo, revision: Revision) -> Result<()> {
    txn.prepare_cached("UPDATE nodes SET revision = ?2 WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, revision.0 as i64]))
        .ctx("updating a node")?;
    Ok(())
}

/// Stamps a node's ctime and revision (a metadata change).
pub(crate) fn touch_ctime(txn: &WriteTxn<'_>, ino: InodeNo, now: TimestampNs) -> Result<()> {
    txn.prepare_cached("UPDATE nodes SET ctime = ?2, revision = ?3 WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, now, txn.revision.0 as i64]))
        .ctx("updating a node")?;
    Ok(())
}

/// Writes back the settable attributes of a node.
pub(crate) fn store_attr(txn: &WriteTxn<'_>, attr: &Attr) -> Result<()> {
    txn.prepare_cached(
        "UPDATE nodes SET perm = ?2, uid = ?3, gid = ?4, size = ?5, atime = ?6, mtime = ?7, ctime = ?8,
                revision = ?9 WHERE ino = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            attr.ino.0 as i64,
            attr.perm,
            attr.uid,
            attr.gid,
            attr.size as i64,
            attr.atime,
            attr.mtime,
            attr.ctime,
            txn.revision.0 as i64
        ])
    })
    .ctx("updating a node")?;
    Ok(())
}

/// Deletes a node row and its extended attributes. Content must be released first.
pub(crate) fn delete_node_row(txn: &mut WriteTxn<'_>, ino: InodeNo) -> Result<()> {
    assert_ne!(ino, InodeNo::ROOT, "the root directory is never deleted");
    txn.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute([ino.0 as i64]))
        .ctx("deleting attributes")?;
    let deleted = txn
        .prepare_cached("DELETE FROM nodes WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute([ino.0 as i64]))
        .ctx("deleting a node")?;
    if deleted == 1 {
        txn.node_count -= 1;
    }
    Ok(())
}

/// Nodes whose last link is gone: left by a crash while they were open.
pub(crate) fn orphans(conn: &Connection) -> Result<Vec<InodeNo>> {
    let mut stmt = conn
        .prepare("SELECT ino FROM nodes WHERE nlink = 0 AND ino != 1")
        .ctx("finding orphans")?;
    let rows = stmt
        .query_map([], |row| row.get::<_, i64>(0))
        .ctx("finding orphans")?;
    rows.map(|r| r.map(|i| InodeNo(i as u64)).ctx("finding orphans"))
        .collect()
}

// ------------------------------------------------------------------ extended attributes

/// Whether any node has an extended attribute.
pub(crate) fn any_xattr(conn: &Connection) -> Result<bool> {
    conn.query_row("SELECT EXISTS (SELECT 1 FROM xattrs)", [], |row| row.get(0))
        .ctx("reading attributes")
}

/// The value of `ino`'s attribute `name`, if it has one.
pub(crate) fn xattr(conn: &Connection, ino: InodeNo, name: &[u8]) -> Result<Option<Vec<u8>>> {
    conn.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![ino.0 as i64, name], |row| row.get(0))
                .optional()
        })
        .ctx("reading an attribute")
}

pub(crate) fn xattr_exists(conn: &Connection, ino: InodeNo, name: &[u8]) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM xattrs WHERE ino = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.exists(params![ino.0 as i64, name]))
        .ctx("reading an attribute")
}

/// The names of `ino`'s attributes, in byte order.
pub(crate) fn xattr_names(conn: &Connection, ino: InodeNo) -> Result<Vec<Vec<u8>>> {
    let mut stmt = conn
        .prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")
        .ctx("listing attributes")?;
    let rows = stmt
        .query_map([ino.0 as i64], |row| row.get(0))
        .ctx("listing attributes")?;
    rows.map(|r| r.ctx("listing attributes")).collect()
}

/// Sets `ino`'s attribute `name`, replacing a value it had.
pub(crate) fn put_xattr(txn: &WriteTxn<'_>, ino: InodeNo, name: &[u8], value: &[u8]) -> Result<()> {
    txn.prepare_cached("INSERT OR REPLACE INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)")
        .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, name, value]))
        .ctx("writing an attribute")?;
    Ok(())
}

/// Removes `ino`'s attribute `name`; whether it had one.
pub(crate) fn remove_xattr(txn: &WriteTxn<'_>, ino: InodeNo, name: &[u8]) -> Result<bool> {
    let removed = txn
        .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, name]))
        .ctx("removing an attribute")?;
    Ok(removed > 0)
}

// ------------------------------------------------------------------------------ totals

/// For each kind of node: how many there are and the sum of their sizes.
pub(crate) fn nodes_by_kind(conn: &Connection) -> Result<Vec<(FileKind, u64, u64)>> {
    let mut stmt = conn
        .prepare("SELECT kind, count(*), coalesce(sum(size), 0) FROM nodes GROUP BY kind")
        .ctx("counting nodes")?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .ctx("counting nodes")?;
    rows.map(|row| {
        let (code, count, size) = row.ctx("counting nodes")?;
        Ok((kind_from_code(code)?, count as u64, size as u64))
    })
    .collect()
}

/// The stored blocks: how many, their raw bytes and their bytes as stored.
pub(crate) struct BlockTotals {
    pub count: u64,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

pub(crate) fn block_totals(conn: &Connection) -> Result<BlockTotals> {
    let sql = "SELECT count(*), coalesce(sum(raw_len), 0), coalesce(sum(stored_len), 0) \
               FROM blocks";
    let (count, raw, stored): (i64, i64, i64) = conn
        .query_row(sql, [], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .ctx("counting blocks")?;
    Ok(BlockTotals {
        count: count as u64,
        raw_bytes: raw as u64,
        stored_bytes: stored as u64,
    })
}

/// Nodes changed after revision `after` that still have links, and the sum of their
/// sizes: the backlog a sync loop measures (`gate.rs`). Cheap when the backlog is small
/// (an index range), proportional to it otherwise.
pub(crate) fn changed_since(conn: &Connection, after: Revision) -> Result<(u64, u64)> {
    conn.prepare_cached(
        "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM nodes
         WHERE revision > ?1 AND nlink > 0",
    )
    .and_then(|mut s| {
        s.query_row([after.0 as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
        })
    })
    .ctx("measuring the backlog")
}

/// The entry `name` in `parent`: its node and the revision that bound it there.
pub(crate) fn binding(
    conn: &Connection,
    parent: InodeNo,
    name: &[u8],
) -> Result<Option<(InodeNo, Revision)>> {
    conn.prepare_cached("SELECT ino, revision FROM dirents WHERE parent = ?1 AND name = ?2")
        .and_then(|mut s| {
            s.query_row(params![parent.0 as i64, name], |r| {
                Ok((
                    InodeNo(r.get::<_, i64>(0)? as u64),
                    Revision(r.get::<_, i64>(1)? as u64),
                ))
            })
            .optional()
        })
        .ctx("reading an entry")
}

/// Every entry of `parent`: (node, name, the revision that bound it there).
pub(crate) fn bindings(
    conn: &Connection,
    parent: InodeNo,
) -> Result<Vec<(InodeNo, Vec<u8>, Revision)>> {
    conn.prepare_cached("SELECT ino, name, revision FROM dirents WHERE parent = ?1")
        .and_then(|mut s| {
            s.query_map([parent.0 as i64], |r| {
                Ok((
                    InodeNo(r.get::<_, i64>(0)? as u64),
                    r.get(1)?,
                    Revision(r.get::<_, i64>(2)? as u64),
                ))
            })?
            .collect()
        })
        .ctx("listing a directory")
}

/// The revision of the last removal at `path`, if any left a tombstone.
pub(crate) fn last_removal(conn: &Connection, path: &[u8]) -> Result<Option<Revision>> {
    let removed: Option<i64> = conn
        .prepare_cached("SELECT MAX(revision) FROM tombstones WHERE path = ?1")
        .and_then(|mut s| s.query_row([path], |r| r.get(0)))
        .ctx("reading tombstones")?;
    Ok(removed.map(|r| Revision(r as u64)))
}

#[cfg(test)]
mod tests {
    use super::ATTR_COLUMN_COUNT;

    #[test]
    fn the_attribute_columns_agree_with_their_count_and_their_aliases() {
        let plain: Vec<&str> = attr_columns!().split(", ").collect();
        assert_eq!(plain.len(), ATTR_COLUMN_COUNT);
        let aliased: Vec<String> = plain.iter().map(|c| format!("n.{c}")).collect();
        assert_eq!(attr_columns!("n"), aliased.join(", "));
    }
}
