//! What the peer still owes on one connection ([`InFlight`]): the replies its receiver has
//! yet to read and the bytes of reads among them, which hold a lane back from the queue
//! once it has asked for its share.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::transport::Slice;
use crate::wire::tcp::OpCode;

/// Bytes of reads a lane may have asked for and not yet received (beyond two requests)
/// before it leaves the peer's queue to the other lanes. A read request is a header, sent
/// in an instant: without this bound the first lanes to wake took `MC_TCP_PIPELINE_DEPTH`
/// requests each and the rest of the lanes stayed idle (4 of 8 lanes carried a batch of
/// 64 reads on the 16-core host, which is why reads did not scale with lanes).
pub(super) const READ_BYTES_PER_LANE: u64 = 512 << 10;

/// Requests a lane may have out before [`READ_BYTES_PER_LANE`] holds it back: two, or
/// [`DEVICE_READS_OUT`] while a read into device memory is among them.
const REQUESTS_OUT: usize = 2;

/// Requests out while a read into device memory is: one, and a second once half of that
/// one's bytes are in (see [`InFlight::half_in`]). Such reads are cut in stripes of
/// a staging chunk (2 MiB), so two out kept twice the bytes of host reads in flight on a
/// connection. On the 16-CPU H200 host (loopback, 4 MiB x 64, cases rotated in one process,
/// 6 rounds), one out moved GPU-to-GPU reads 1.02-1.22x of two out (0.96 of host reads at
/// the median, from 0.87), reads into our GPU from host memory 0.98-1.33x (0.98 of host
/// reads, from 0.84), while four out moved 0.91-0.99x and 0.87-0.95x, and host reads cut in
/// 2 MiB stripes 0.84-0.88x of 1 MiB ones: the less a connection holds in flight, the faster
/// on loopback (docs/benchmarks.md, issue 12, session 17). Between hosts it is not measured;
/// the lanes together still hold 2 MiB each, as host reads do. With one out, though, the
/// peer never found the next read waiting, and each read waited there for its first chunk's
/// copy out of the device (some 125 us of each ~1 ms read, session 21). Asking for the next
/// when half is in lets the peer copy it ahead while it sends the rest: with the peer's
/// sends in pieces, GPU-to-GPU reads moved 1.06-1.15x of one out (session 21).
const DEVICE_READS_OUT: usize = 1;

/// What the receiver of a connection has still to read, and a way for the lane to wait
/// until that falls under its share.
#[derive(Default)]
pub(super) struct InFlight {
    slices: AtomicUsize,
    /// Of those, reads into device memory.
    device_reads: AtomicUsize,
    /// Payload bytes of reads still to come.
    pub(super) bytes: AtomicU64,
    /// Half of the read into device memory being received is in: it counts as out no more
    /// (see [`DEVICE_READS_OUT`]). One reply is received at a time, so one such read at most.
    past_half: AtomicBool,
    /// The lane waits in `wait_below` (so `done` must wake it).
    waiting: AtomicBool,
    lock: Mutex<()>,
    fell: Condvar,
}

impl InFlight {
    pub(super) fn add(&self, owed: Owed) {
        self.slices.fetch_add(1, Ordering::SeqCst);
        if owed.device_read {
            self.device_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.bytes.fetch_add(owed.bytes, Ordering::SeqCst);
    }

    pub(super) fn done(&self, owed: Owed) {
        self.bytes.fetch_sub(owed.bytes, Ordering::SeqCst);
        if owed.device_read {
            self.device_reads.fetch_sub(1, Ordering::SeqCst);
        }
        self.slices.fetch_sub(1, Ordering::SeqCst);
        self.wake_lane();
    }

    /// SeqCst with `wait_below`: either the lane sees the smaller count, or this sees it
    /// waiting and wakes it.
    fn wake_lane(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            let _guard = self.lock.lock();
            self.fell.notify_one();
        }
    }

    /// No reply outstanding: the next reply on the socket is the next request's.
    pub(super) fn is_empty(&self) -> bool {
        self.slices.load(Ordering::SeqCst) == 0
    }

    fn over(&self, cap: u64) -> bool {
        let out = if self.device_reads.load(Ordering::SeqCst) > 0 {
            DEVICE_READS_OUT
        } else {
            REQUESTS_OUT
        };
        let past_half = usize::from(self.past_half.load(Ordering::SeqCst));
        let slices = self.slices.load(Ordering::SeqCst).saturating_sub(past_half);
        slices >= out && self.bytes.load(Ordering::SeqCst) >= cap
    }

    /// Half of the read into device memory being received is in: the lane may ask for the
    /// next.
    pub(super) fn half_in(&self) {
        self.past_half.store(true, Ordering::SeqCst);
        self.wake_lane();
    }

    /// The read into device memory that was received is done with (whole or failed).
    pub(super) fn whole_in(&self) {
        self.past_half.store(false, Ordering::SeqCst);
    }

    /// Waits while [`REQUESTS_OUT`] requests (or [`DEVICE_READS_OUT`]) and at least `cap`
    /// bytes of reads are owed, and the connection is not `broken`.
    pub(super) fn wait_below(&self, cap: u64, broken: &AtomicBool) {
        if !self.over(cap) {
            return;
        }
        self.waiting.store(true, Ordering::SeqCst);
        let mut guard = self.lock.lock();
        while self.over(cap) && !broken.load(Ordering::Acquire) {
            // The timeout only guards against a receiver that stopped without a word.
            self.fell.wait_for(&mut guard, Duration::from_millis(10));
        }
        self.waiting.store(false, Ordering::SeqCst);
    }
}

/// What the peer owes for a slice once its request is sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Owed {
    /// A read's data.
    bytes: u64,
    /// It is a read into device memory.
    device_read: bool,
}

pub(super) fn owed(slice: &Slice) -> Owed {
    Owed {
        bytes: owed_bytes(slice),
        device_read: slice.op == OpCode::Read && slice.local_device.is_some(),
    }
}

/// Bytes the peer still owes for a slice once its request is sent: a read's data.
pub(super) fn owed_bytes(slice: &Slice) -> u64 {
    match slice.op {
        OpCode::Read => slice.len,
        OpCode::Write => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_into_device_memory_half_in_lets_one_more_out_and_no_more() {
        let cap = READ_BYTES_PER_LANE;
        let stripe = Owed {
            bytes: crate::device::staging::CHUNK as u64,
            device_read: true,
        };
        let f = InFlight::default();
        assert!(!f.over(cap), "nothing out");
        f.add(stripe);
        assert!(
            f.over(cap),
            "one read into device memory out holds the lane"
        );
        f.half_in();
        assert!(!f.over(cap), "half of it in: the lane may ask for the next");
        f.add(stripe);
        assert!(f.over(cap), "the next is out: the lane waits again");
        // The first is whole: the second is now the one out.
        f.whole_in();
        f.done(stripe);
        assert!(f.over(cap), "the second read still holds the lane");
        f.half_in();
        assert!(!f.over(cap));
        f.whole_in();
        f.done(stripe);
        assert!(!f.over(cap), "nothing out");
        // Host reads: two out, as before.
        let host = Owed {
            bytes: cap,
            device_read: false,
        };
        f.add(host);
        assert!(!f.over(cap));
        f.add(host);
        assert!(f.over(cap));
    }
}
