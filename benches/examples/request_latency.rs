//! The cost of one synchronous FUSE request, round trip: `getxattr(2)` of an attribute
//! that does not exist, which the kernel never caches and computerd answers without
//! touching the database (a few microseconds), so what is left is the kernel's queueing,
//! the wake-ups of the daemon and of the caller, and the copies. Each path given is timed
//! in turn (give a file on a tmpfs as the yardstick); prints the best of the rounds in
//! microseconds per call.
//!
//!   cargo run --release -p computer-benches --example request_latency -- PATH... \
//!       [--calls N] [--rounds N]
//!
//! With `taskset` on the daemon and on this process the same CPU or different ones can
//! be compared (`docs/benchmarks.md`, "Where the time of a small-file workload goes").

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};

fn main() -> anyhow::Result<()> {
    let mut paths = Vec::new();
    let (mut calls, mut rounds) = (20_000u32, 3u32);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--calls" => calls = args.next().context("--calls needs a number")?.parse()?,
            "--rounds" => rounds = args.next().context("--rounds needs a number")?.parse()?,
            _ => paths.push(PathBuf::from(arg)),
        }
    }
    if paths.is_empty() || calls == 0 || rounds == 0 {
        bail!("usage: request_latency PATH... [--calls N] [--rounds N]");
    }
    let name = CString::new("user.computer-request-latency")?;
    for path in &paths {
        let c_path = CString::new(path.as_os_str().as_bytes())?;
        let mut best = f64::INFINITY;
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..calls {
                // SAFETY: valid C strings; a null buffer of size 0 only asks for the size.
                let rc = unsafe {
                    libc::getxattr(c_path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0)
                };
                if rc >= 0 {
                    bail!(
                        "{}: the attribute exists; use a file without it",
                        path.display()
                    );
                }
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::ENODATA) {
                    return Err(err).with_context(|| format!("getxattr {}", path.display()));
                }
            }
            best = best.min(start.elapsed().as_secs_f64() * 1e6 / f64::from(calls));
        }
        println!(
            "{}: {best:.2} us per getxattr (best of {rounds} x {calls})",
            path.display()
        );
    }
    Ok(())
}
