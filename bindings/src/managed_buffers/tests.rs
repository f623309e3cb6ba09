use std::collections::BTreeMap;

use super::*;

/// Synthetic address space: chunks at 1 GiB-aligned-ish bases, nothing touched.
#[derive(Default)]
struct FakeSource {
    next: u64,
    live: BTreeMap<u64, u64>,
    fail: bool,
}

impl ChunkSource for FakeSource {
    type Error = &'static str;
    fn acquire(&mut self, len: u64) -> Result<u64, Self::Error> {
        if self.fail {
            return Err("no memory");
        }
        // Page-aligned but deliberately not aligned to the block size.
        let addr = 0x7000_0000_1000 + self.next;
        self.next += len + 0x3000;
        self.live.insert(addr, len);
        Ok(addr)
    }
    fn release(&mut self, addr: u64, len: u64) {
        assert_eq!(
            self.live.remove(&addr),
            Some(len),
            "released what was not acquired"
        );
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn size_classes_follow_upstream() {
    assert_eq!(order_for(1), 0);
    assert_eq!(order_for(8192), 0);
    assert_eq!(order_for(8193), 1);
    assert_eq!(order_for(256 * MIB), 15);
    let m = ManagedBuffers::default();
    assert_eq!(m.max_block(), 256 * MIB);
}

#[test]
fn blocks_are_aligned_disjoint_and_reused() {
    let mut src = FakeSource::default();
    let mut m = ManagedBuffers::new(4 * MIB);
    let a = m.allocate(100, &mut src).unwrap();
    let b = m.allocate(8192, &mut src).unwrap();
    let c = m.allocate(20_000, &mut src).unwrap();
    assert_eq!(m.chunk_count(), 1);
    assert_eq!(m.capacity(a), Some(8192));
    assert_eq!(m.capacity(c), Some(32768));
    let mut spans = [(a, 8192), (b, 8192), (c, 32768)];
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {spans:x?}");
    }
    m.free(b, 8192, &mut src).unwrap();
    assert_eq!(
        m.allocate(5000, &mut src).unwrap(),
        b,
        "freed block is reused first"
    );
}

#[test]
fn freeing_everything_merges_back_to_whole_chunks() {
    let mut src = FakeSource::default();
    let mut m = ManagedBuffers::new(4 * MIB);
    let mut live = Vec::new();
    for i in 0..200u64 {
        let len = 1 + (i * 7919) % (300 * 1024);
        live.push((m.allocate(len, &mut src).unwrap(), len));
    }
    // Free in a scrambled order.
    live.sort_by_key(|&(a, _)| a.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for (a, len) in live {
        m.free(a, len, &mut src).unwrap();
    }
    assert_eq!(m.live(), 0);
    let chunks = m.chunk_count();
    // Every chunk is whole again: as many max-size blocks as chunks fit without new chunks.
    for _ in 0..chunks {
        m.allocate(4 * MIB, &mut src).unwrap();
    }
    assert_eq!(m.chunk_count(), chunks);
}

#[test]
fn large_requests_get_a_dedicated_mapping_released_on_free() {
    let mut src = FakeSource::default();
    let mut m = ManagedBuffers::new(4 * MIB);
    let big = m.allocate(5 * MIB + 1, &mut src).unwrap();
    assert_eq!(m.chunk_count(), 0);
    assert_eq!(src.live.get(&big), Some(&(5 * MIB + 4096)));
    m.free(big, 5 * MIB + 1, &mut src).unwrap();
    assert!(src.live.is_empty());
}

#[test]
fn bad_frees_are_refused_without_damage() {
    let mut src = FakeSource::default();
    let mut m = ManagedBuffers::new(4 * MIB);
    let a = m.allocate(10_000, &mut src).unwrap();
    assert_eq!(
        m.free(a + 8, 10_000, &mut src),
        Err(ManagedError::NotAllocated(a + 8))
    );
    assert!(matches!(
        m.free(a, 100, &mut src),
        Err(ManagedError::LengthMismatch { .. })
    ));
    m.free(a, 16384, &mut src).unwrap();
    assert_eq!(
        m.free(a, 16384, &mut src),
        Err(ManagedError::NotAllocated(a))
    );
    assert_eq!(m.allocate(0, &mut src), Err(ManagedError::ZeroLength));
}

#[test]
fn source_failure_is_reported() {
    let mut src = FakeSource {
        fail: true,
        ..FakeSource::default()
    };
    let mut m = ManagedBuffers::new(4 * MIB);
    assert_eq!(
        m.allocate(1, &mut src),
        Err(ManagedError::Source("no memory"))
    );
    assert_eq!(m.live(), 0);
}

#[test]
fn take_mappings_returns_chunks_and_dedicated_buffers() {
    let mut src = FakeSource::default();
    let mut m = ManagedBuffers::new(4 * MIB);
    m.allocate(1, &mut src).unwrap();
    m.allocate(4 * MIB, &mut src).unwrap();
    let big = m.allocate(8 * MIB, &mut src).unwrap();
    let maps = m.take_mappings();
    assert_eq!(maps.len(), 3);
    assert!(maps.contains(&(big, 8 * MIB)));
    for (a, l) in maps {
        src.release(a, l);
    }
    assert!(src.live.is_empty());
    assert_eq!(m.live(), 0);
}
