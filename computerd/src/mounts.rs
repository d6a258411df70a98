//! The kernel's mount table, as this process sees it (`/proc/self/mountinfo`): which
//! paths are mount points, and which mounts are computerd's and of what database.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// What a computerd mount says of itself in the mount table: a FUSE type (`fuse`, or
/// `fuse.computer` where the subtype is kept), and its source: `computer:` then the
/// database's path, set at mount time.
const FS_TYPES: [&str; 2] = ["fuse", "fuse.computer"];
pub const SOURCE_PREFIX: &str = "computer:";

/// One line of the mount table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub fs_type: String,
    pub source: PathBuf,
}

impl MountEntry {
    /// The database a computerd mount serves, `None` for any other mount.
    pub fn computer_db(&self) -> Option<PathBuf> {
        if !FS_TYPES.contains(&self.fs_type.as_str()) {
            return None;
        }
        let source = self.source.as_os_str().as_encoded_bytes();
        let db = source.strip_prefix(SOURCE_PREFIX.as_bytes())?;
        Some(PathBuf::from(OsString::from_vec(db.to_vec())))
    }
}

/// The mount table; `None` if it cannot be read.
pub fn table() -> Option<Vec<MountEntry>> {
    let text = std::fs::read("/proc/self/mountinfo").ok()?;
    Some(text.split(|&b| b == b'\n').filter_map(parse_line).collect())
}

/// Whether `path` is a mount point now (true when the table cannot be read: callers
/// use this to tell a live owner from one on its way out, and must never wait for a
/// live one).
pub fn is_mount_point(path: &Path) -> bool {
    table().is_none_or(|table| table.iter().any(|m| m.mountpoint == path))
}

/// `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`.
fn parse_line(line: &[u8]) -> Option<MountEntry> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let mountpoint = fields.get(4)?;
    let dash = fields.iter().position(|f| *f == b"-")?;
    let fs_type = fields.get(dash + 1)?;
    let source = fields.get(dash + 2)?;
    Some(MountEntry {
        mountpoint: path_of(&unescape(mountpoint)),
        fs_type: String::from_utf8_lossy(&unescape(fs_type)).into_owned(),
        source: path_of(&unescape(source)),
    })
}

fn path_of(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes.to_vec()))
}

/// A mount table field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_with_their_escapes() {
        assert_eq!(unescape(b"/mnt/a\\040b"), b"/mnt/a b");
        assert_eq!(unescape(b"/x\\134y\\"), b"/x\\y\\");
        assert_eq!(unescape(br"/x\0"), br"/x\0");
    }

    #[test]
    fn lines_give_mount_point_type_and_source() {
        let line = b"52 30 0:45 / /mnt/my\\040ws rw,nosuid shared:1 - fuse.computer \
                     computer:/data/w\\040s.db rw,user_id=0";
        let entry = parse_line(line).unwrap();
        assert_eq!(entry.mountpoint, Path::new("/mnt/my ws"));
        assert_eq!(entry.fs_type, "fuse.computer");
        assert_eq!(entry.computer_db().unwrap(), Path::new("/data/w s.db"));
        let plain = b"46 27 0:41 / /tmp/m rw,nosuid - fuse computer:/tmp/w.db rw,user_id=0";
        assert_eq!(
            parse_line(plain).unwrap().computer_db().unwrap(),
            Path::new("/tmp/w.db")
        );
        let other = parse_line(b"1 0 8:1 / / rw - ext4 /dev/sda1 rw").unwrap();
        assert_eq!(other.computer_db(), None);
        let other_fuse = parse_line(b"1 0 0:9 / /m rw - fuse sshfs#host: rw").unwrap();
        assert_eq!(other_fuse.computer_db(), None);
        assert_eq!(parse_line(b"garbage"), None);
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_new_directory_is_not() {
        assert!(is_mount_point(Path::new("/")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()));
    }
}
