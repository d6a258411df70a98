//! Arbitrary bytes as a stored block, through the decoders of stored content
//! (`computer_vfs::block::decode` and `decode_into`): a row's codec and length come from
//! a database that may be damaged, its bytes likewise. Every call must answer or refuse,
//! never panic or reserve more than the largest block, and what it answers is content
//! that hashes to the key. The same bytes, encoded as the store encodes them, decode to
//! themselves, and with one bit flipped decode to themselves or are refused.
//!
//! The input is a mode byte, a stored length (8 bytes, little-endian), then the bytes.

#![no_main]

use computer_vfs::block::{self, BlockHash, Codec, BLOCK_BYTES_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Some((raw_len, bytes)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let raw_len = u64::from_le_bytes(*raw_len);
    match mode % 3 {
        0 => stored(Codec::Raw, raw_len, bytes),
        1 => stored(Codec::Zstd, raw_len, bytes),
        _ => round_trip(mode, raw_len, bytes),
    }
});

/// `bytes` as a row of `codec` and `raw_len`, under the key of the bytes themselves (so
/// that a raw row can decode) and under a key no content has.
fn stored(codec: Codec, raw_len: u64, bytes: &[u8]) {
    let raw_len = usize::try_from(raw_len).unwrap_or(usize::MAX);
    for hash in [BlockHash::of(bytes), BlockHash([0; 32])] {
        let mut out = Vec::new();
        let decoded = block::decode_into(&hash, codec, raw_len, bytes, &mut out);
        assert!(
            out.capacity() <= BLOCK_BYTES_MAX,
            "reserved {}",
            out.capacity()
        );
        match (
            decoded,
            block::decode(&hash, codec, raw_len, bytes.to_vec()),
        ) {
            (Ok(()), Ok(content)) => {
                assert_eq!(BlockHash::of(&out), hash);
                assert_eq!(out.len(), raw_len);
                assert_eq!(content, out, "the two decoders agree");
            }
            (Err(_), Err(_)) => {}
            (into, owned) => panic!(
                "decode_into: {into:?}, decode: {:?}",
                owned.map(|c| c.len())
            ),
        }
    }
}

/// Encodes `bytes` at a level from `mode`, decodes them again, then flips a bit of the
/// byte at `at` (modulo the encoded length) and decodes that.
fn round_trip(mode: u8, at: u64, bytes: &[u8]) {
    let hash = BlockHash::of(bytes);
    let level = i32::from(mode / 3 % 4) + 1;
    let encoded = block::encode(bytes, hash, level);
    let mut out = Vec::new();
    block::decode_into(
        &hash,
        encoded.codec,
        encoded.raw_len,
        &encoded.data,
        &mut out,
    )
    .expect("an encoded block decodes");
    assert_eq!(out, bytes);
    if encoded.data.is_empty() {
        return;
    }
    let mut damaged = encoded.data.clone();
    let at = (at % damaged.len() as u64) as usize;
    damaged[at] ^= 1 << (mode % 8);
    match block::decode_into(&hash, encoded.codec, encoded.raw_len, &damaged, &mut out) {
        Ok(()) => assert_eq!(out, bytes),
        Err(err) => assert!(matches!(err, computer_vfs::Error::Corrupt { .. }), "{err}"),
    }
}
