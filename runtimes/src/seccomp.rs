//! The seccomp filter of every sandboxed command: system calls that mount, load kernel
//! code, trace other processes or reach the kernel's keyrings and raw I/O fail with
//! EPERM, whatever capabilities a command might come by. Defence in depth: without
//! capabilities most of them fail already.
//!
//! A classic BPF program, built here (a dozen instructions and a list) rather than by
//! libseccomp, handed to bubblewrap on a pipe (`--seccomp FD`), which installs it last,
//! right before the command runs; children inherit it. x86-64 only: elsewhere there is
//! no filter (`filter` returns `None`) and the sandbox rests on its dropped capabilities.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// The system calls a command may not make.
#[cfg(target_arch = "x86_64")]
const DENIED: &[libc::c_long] = &[
    // Mounting and changing the mount tree.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    // Kernel code and the machine.
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    // Other processes' memory.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // Raw devices and handles that bypass paths.
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_open_by_handle_at,
    libc::SYS_quotactl,
    // The kernel's keyrings.
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_keyctl,
];

/// `AUDIT_ARCH_X86_64`: EM_X86_64 (62), 64-bit, little-endian.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// System call numbers of the x32 ABI carry this bit; none is allowed.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    jump(code, k, 0, 0)
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The program, or `None` on an architecture it is not written for.
pub fn program() -> Option<Vec<libc::sock_filter>> {
    #[cfg(target_arch = "x86_64")]
    {
        use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
        let denied = DENIED.len();
        // Layout: arch check (2), load nr (1), x32 check (1), one test per denied
        // call, allow, deny, kill. Jumps count the instructions skipped.
        assert!(denied + 3 < u8::MAX as usize, "jumps are 8 bits");
        let to_deny = |at: usize| (denied - at) as u8;
        let mut prog = vec![
            statement(BPF_LD | BPF_W | BPF_ABS, DATA_ARCH),
            jump(
                BPF_JMP | BPF_JEQ | BPF_K,
                AUDIT_ARCH_X86_64,
                0,
                (denied + 4) as u8,
            ),
            statement(BPF_LD | BPF_W | BPF_ABS, DATA_NR),
            jump(
                BPF_JMP | BPF_JGE | BPF_K,
                X32_SYSCALL_BIT,
                to_deny(0) + 1,
                0,
            ),
        ];
        for (at, &nr) in DENIED.iter().enumerate() {
            prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr as u32, to_deny(at), 0));
        }
        prog.push(statement(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW));
        prog.push(statement(
            BPF_RET | BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ));
        prog.push(statement(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS));
        Some(prog)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// A pipe holding the program, ready to be read by bubblewrap: the read end (close on
/// exec; the caller hands it over). `None` where there is no program.
pub fn filter() -> Result<Option<OwnedFd>> {
    let Some(prog) = program() else {
        return Ok(None);
    };
    // SAFETY: sock_filter is plain data; its bytes are what the kernel reads.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            prog.as_ptr().cast::<u8>(),
            std::mem::size_of_val(prog.as_slice()),
        )
    };
    let mut fds = [0; 2];
    // SAFETY: a two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io("making the seccomp pipe")(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pipe2 returned two new descriptors nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The program is a few hundred bytes, far below a pipe's capacity: no reader needed.
    let mut writer = std::fs::File::from(write);
    std::io::Write::write_all(&mut writer, bytes)
        .map_err(Error::io("writing the seccomp program"))?;
    Ok(Some(read))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program over one system call the way the kernel does.
    #[cfg(target_arch = "x86_64")]
    fn verdict(prog: &[libc::sock_filter], arch: u32, nr: u32) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = prog[pc];
            let code = ins.code as u32;
            match code & 0x07 {
                c if c == libc::BPF_LD => {
                    acc = if ins.k == DATA_ARCH { arch } else { nr };
                    pc += 1;
                }
                c if c == libc::BPF_JMP => {
                    let taken = match code & 0xf0 {
                        op if op == libc::BPF_JEQ => acc == ins.k,
                        op if op == libc::BPF_JGE => acc >= ins.k,
                        op => panic!("jump {op:#x}"),
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
                c if c == libc::BPF_RET => return ins.k,
                c => panic!("class {c:#x}"),
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_program_denies_exactly_its_list() {
        let prog = program().unwrap();
        let deny = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        for &nr in DENIED {
            assert_eq!(verdict(&prog, AUDIT_ARCH_X86_64, nr as u32), deny, "{nr}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_clone3,
            libc::SYS_execve,
        ] {
            let got = verdict(&prog, AUDIT_ARCH_X86_64, nr as u32);
            assert_eq!(got, libc::SECCOMP_RET_ALLOW, "{nr}");
        }
        let x32 = X32_SYSCALL_BIT | libc::SYS_read as u32;
        assert_eq!(verdict(&prog, AUDIT_ARCH_X86_64, x32), deny);
        let i386 = 3 | 0x4000_0000; // AUDIT_ARCH_I386
        assert_eq!(verdict(&prog, i386, 1), libc::SECCOMP_RET_KILL_PROCESS);
    }
}
