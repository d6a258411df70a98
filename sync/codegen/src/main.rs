//! Generates `sync/src/generated/sync_capnp.rs` from `sync/schema/sync.capnp`.
//!
//! Usage: `cargo run --manifest-path sync/codegen/Cargo.toml --locked -- [OUT_DIR]`
//! (default OUT_DIR: `sync/src/generated`). Needs the `capnp` compiler on PATH (Debian:
//! `apt-get install capnproto`); `scripts/check-capnp.sh` uses it to check that the
//! committed file is fresh.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let sync_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let schema_dir = sync_dir.join("schema");
    let out_dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| sync_dir.join("src").join("generated"));
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("codegen: creating {}: {e}", out_dir.display());
        return ExitCode::FAILURE;
    }
    let result = capnpc::CompilerCommand::new()
        .src_prefix(&schema_dir)
        .file(schema_dir.join("sync.capnp"))
        .output_path(&out_dir)
        .run();
    match result {
        Ok(()) => {
            println!("codegen: wrote {}", out_dir.join("sync_capnp.rs").display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("codegen: {e}");
            ExitCode::FAILURE
        }
    }
}
