//! The `sluice` binary's allocator (mimalloc) and how it is tuned for a server.
//!
//! Every step allocates and frees its activations (hundreds of buffers of 64 KiB to 16 MiB at a
//! 64-sequence step). By default mimalloc (v3) returns memory to the OS once it has been free for
//! a second (ten in its arenas), so under load the process's RSS swung by tens of MiB from one
//! sampling interval to the next and drifted upwards over a 30-minute soak as fragmentation
//! spread the free spans, although the live heap stayed flat (measured with a counting
//! allocator: 472 MiB live throughout, RSS wandering between 550 and 617 MiB).
//! Like llama.cpp's compute buffers, the working set is better kept: with purging off, RSS rises
//! to the high-water mark of the first minutes (bounded by the step budget and the number of
//! requests in flight) and then stays flat, a leak shows up as growth at once, and the steps
//! never fault their buffers back in. An operator who sets `MIMALLOC_PURGE_DELAY` (milliseconds;
//! 0 purges at once, which cost a fifth of the soak's throughput) gets that value instead, to
//! trade speed for a smaller footprint after bursts.

// mimalloc's options are set through its C API; this module is the server's one FFI call.
#![allow(unsafe_code)]

use libmimalloc_sys as ffi;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (libmimalloc-sys binds no constant
/// for it); a test checks the index against the option's default.
const PURGE_DELAY: ffi::mi_option_t = 15;
const ENV_PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// Turns purging off unless the operator chose a purge delay. Call first thing in `main`.
pub fn keep_working_set() {
    if std::env::var_os(ENV_PURGE_DELAY).is_none() {
        // SAFETY: sets a process-wide option; mimalloc reads it on every purge decision.
        unsafe { ffi::mi_option_set(PURGE_DELAY, -1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_delay_index_names_the_purge_delay_option() {
        if std::env::var_os(ENV_PURGE_DELAY).is_some() {
            return; // the operator's value, not the default, is what mimalloc reports
        }
        // SAFETY: reads and sets a process-wide option.
        unsafe {
            // 1000 ms is v3's default purge delay; the options beside it in the enum default to
            // 1 and 0, so a shifted index fails here.
            assert_eq!(ffi::mi_option_get(PURGE_DELAY), 1000);
            keep_working_set();
            assert_eq!(ffi::mi_option_get(PURGE_DELAY), -1);
        }
    }
}
