//! The deterministic sync simulation (`computer_sync::sim`) driven by the fuzzer's
//! bytes: every decision of a run (which step, which fault, which file operation, how
//! much time passes) is read from the input, so the fuzzer steers the interleavings of
//! syncs, faults and crashes. A run that breaks an invariant of sync (cursors moving
//! backwards, a database failing its check, an acknowledged write lost, trees that do
//! not converge once faults stop) panics with the failure, its step log and the hex of
//! the input to replay it with `computer_sync::sim::run_bytes`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(failure) = computer_sync::sim::run_bytes(data) {
        panic!("{failure}");
    }
});
