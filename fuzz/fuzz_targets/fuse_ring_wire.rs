//! Arbitrary bytes as the buffers of one FUSE-over-io_uring entry, through computerd's
//! decoder of what the kernel writes there (`computerd/src/fuse_ring/wire.rs`, included
//! by path: computerd is a binary crate). The kernel is trusted, but not to be the
//! kernel the decoder was written for: every call must answer or refuse, never panic,
//! and a name it decodes lies within the payload.
//!
//! The input is an opcode (4 bytes, little-endian), then the header buffer (at most
//! `HEADER_BYTES`), then the payload.

#![no_main]

#[allow(dead_code)]
#[path = "../../computerd/src/fuse_ring/wire.rs"]
mod wire;

use std::os::unix::ffi::OsStrExt;

use libfuzzer_sys::fuzz_target;

/// Opcodes of the protocol and a few past them (`FUSE_STATX` is 52).
const OPCODES: u32 = 64;

fuzz_target!(|data: &[u8]| {
    let Some((opcode, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let opcode = u32::from_le_bytes(*opcode) % OPCODES;
    let (header, payload) = rest.split_at(rest.len().min(wire::HEADER_BYTES));
    let _ = wire::entry(header);
    let op_in = wire::op_in(header);
    // The ring answers a READ from these alone, before decoding the request: they must
    // be what decoding finds.
    let read = wire::read_args(opcode, op_in);
    let Ok(request) = wire::decode(opcode, op_in, payload) else {
        assert_eq!(read, None, "a READ decoding refuses");
        return;
    };
    if let wire::Request::Read { fh, offset, size } = request {
        assert_eq!(read, Some(wire::ReadArgs { fh, offset, size }));
    } else {
        assert_eq!(read, None, "a READ's arguments from another request");
    }
    let _ = request.exempt_from_owner_check();
    let name = match &request {
        wire::Request::Lookup { name } | wire::Request::Getxattr { name, .. } => name.as_bytes(),
        _ => return,
    };
    let within = payload.as_ptr_range();
    let name_range = name.as_ptr_range();
    assert!(within.start <= name_range.start && name_range.end <= within.end);
    assert!(!name.contains(&0), "a decoded name holds a NUL");
});
