//! Files handed to the kernel for passthrough: it reads and writes a staged file's
//! local copy itself once an open names the file's backing id. One registration per
//! inode, shared by its open handles and closed (`FUSE_DEV_IOC_BACKING_CLOSE`) with the
//! last of them. Registrations go through a duplicate of the session's `/dev/fuse`
//! descriptor, so that either transport's opens can name them.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use computer_vfs::StagedFile;
use fuser::INodeNo;

use super::WorkspaceFs;

/// Where the session's device descriptor is put once the session exists (mount.rs);
/// until then nothing can be registered.
pub type DeviceSlot = Arc<OnceLock<Arc<OwnedFd>>>;

/// The open handles' registrations.
#[derive(Default)]
pub(super) struct BackingTable {
    by_handle: HashMap<u64, Arc<KernelBacking>>,
    by_inode: HashMap<u64, Weak<KernelBacking>>,
}

/// A file the kernel knows by `id` for passthrough, until this is dropped.
struct KernelBacking {
    device: Arc<OwnedFd>,
    id: u32,
}

/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const IOC_BACKING_CLOSE: libc::c_ulong = (1 << 30) | (4 << 16) | (229 << 8) | 2;

impl KernelBacking {
    fn register(device: &Arc<OwnedFd>, file: &std::fs::File) -> std::io::Result<KernelBacking> {
        let id = fuser::BackingId::create_raw(device.as_fd(), file)?;
        Ok(KernelBacking {
            device: device.clone(),
            id,
        })
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        let id: *const u32 = &self.id;
        // SAFETY: the ioctl reads one u32 from a live reference.
        let closed = unsafe { libc::ioctl(self.device.as_raw_fd(), IOC_BACKING_CLOSE, id) };
        if closed < 0 {
            let err = std::io::Error::last_os_error();
            // After the unmount the connection has forgotten every id itself.
            tracing::debug!("closing passthrough backing id {}: {err}", self.id);
        }
    }
}

impl WorkspaceFs {
    /// The slot for the session's device, which registrations go through.
    pub fn device_slot(&self) -> DeviceSlot {
        self.device.clone()
    }

    fn backing(&self) -> std::sync::MutexGuard<'_, BackingTable> {
        self.backing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kernel's id for `staged`, registering it on first use. `None` if the kernel
    /// refuses (no CAP_SYS_ADMIN, say): passthrough is then off for the rest of the mount.
    pub(super) fn backing_id(
        &self,
        inode: INodeNo,
        handle: u64,
        staged: &StagedFile,
    ) -> Option<u32> {
        let mut table = self.backing();
        let backing = match table.by_inode.get(&inode.0).and_then(Weak::upgrade) {
            Some(backing) => backing,
            None => match self.register_backing(staged.file()) {
                Ok(backing) => {
                    let backing = Arc::new(backing);
                    table.by_inode.insert(inode.0, Arc::downgrade(&backing));
                    backing
                }
                Err(err) => {
                    tracing::warn!(
                        "kernel refused passthrough, serving data through the daemon: {err}"
                    );
                    self.passthrough.store(false, Ordering::Relaxed);
                    return None;
                }
            },
        };
        let id = backing.id;
        table.by_handle.insert(handle, backing);
        // Pages the kernel cached may go stale behind the passthrough file.
        self.pages.passthrough_open(inode.0);
        Some(id)
    }

    fn register_backing(&self, file: &std::fs::File) -> std::io::Result<KernelBacking> {
        let device = self
            .device
            .get()
            .ok_or_else(|| std::io::Error::other("the session's device is not attached yet"))?;
        KernelBacking::register(device, file)
    }

    /// A handle closed: its registration goes with the inode's last handle.
    pub(super) fn forget_backing(&self, handle: u64, inode: INodeNo) {
        let mut table = self.backing();
        table.by_handle.remove(&handle);
        if table
            .by_inode
            .get(&inode.0)
            .is_some_and(|w| w.strong_count() == 0)
        {
            table.by_inode.remove(&inode.0);
        }
    }
}
