//! The cost of one synchronous FUSE request, round trip. `--op getxattr` (the default):
//! `getxattr(2)` of an attribute that does not exist, which the kernel never caches and
//! computerd answers without touching the database (a few microseconds), so what is
//! left is the kernel's queueing, the wake-ups of the daemon and of the caller, and the
//! copies. `--op open`: `open(2)` and `close(2)` of the file, one OPEN round trip (the
//! RELEASE is sent in the background), what a warm `grep -r` or `cat` pays per file.
//! Each path given is timed in turn (give a file on a tmpfs as the yardstick); prints
//! the best of the rounds in microseconds per call.
//!
//!   cargo run --release -p computer-benches --example request_latency -- PATH... \
//!       [--op getxattr|open] [--calls N] [--rounds N]
//!
//! With `taskset` on the daemon and on this process the same CPU or different ones can
//! be compared (`docs/benchmarks.md`, "Where the time of a small-file workload goes").

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};

#[derive(Clone, Copy)]
enum Op {
    Getxattr,
    Open,
}

fn main() -> anyhow::Result<()> {
    let mut paths = Vec::new();
    let (mut calls, mut rounds, mut op) = (20_000u32, 3u32, Op::Getxattr);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--calls" => calls = args.next().context("--calls needs a number")?.parse()?,
            "--rounds" => rounds = args.next().context("--rounds needs a number")?.parse()?,
            "--op" => {
                op = match args.next().as_deref() {
                    Some("getxattr") => Op::Getxattr,
                    Some("open") => Op::Open,
                    _ => bail!("--op takes getxattr or open"),
                }
            }
            _ => paths.push(PathBuf::from(arg)),
        }
    }
    if paths.is_empty() || calls == 0 || rounds == 0 {
        bail!("usage: request_latency PATH... [--op getxattr|open] [--calls N] [--rounds N]");
    }
    for path in &paths {
        let c_path = CString::new(path.as_os_str().as_bytes())?;
        let mut best = f64::INFINITY;
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..calls {
                match op {
                    Op::Getxattr => missing_xattr(&c_path)?,
                    Op::Open => open_close(&c_path)?,
                }
            }
            best = best.min(start.elapsed().as_secs_f64() * 1e6 / f64::from(calls));
        }
        let name = match op {
            Op::Getxattr => "getxattr",
            Op::Open => "open+close",
        };
        println!(
            "{}: {best:.2} us per {name} (best of {rounds} x {calls})",
            path.display()
        );
    }
    Ok(())
}

fn missing_xattr(path: &CString) -> anyhow::Result<()> {
    const NAME: &std::ffi::CStr = c"user.computer-request-latency";
    // SAFETY: valid C strings; a null buffer of size 0 only asks for the size.
    let rc = unsafe { libc::getxattr(path.as_ptr(), NAME.as_ptr(), std::ptr::null_mut(), 0) };
    if rc >= 0 {
        bail!("{path:?}: the attribute exists; use a file without it");
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::ENODATA) {
        return Err(err).with_context(|| format!("getxattr {path:?}"));
    }
    Ok(())
}

fn open_close(path: &CString) -> anyhow::Result<()> {
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(err).with_context(|| format!("open {path:?}"));
    }
    // SAFETY: fd was just opened here and is closed once.
    unsafe { libc::close(fd) };
    Ok(())
}
