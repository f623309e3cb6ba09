//! The data server with pipelined requests, driven by a raw-socket client (a stand-in
//! for our own lanes, which send several requests in one `sendmsg`, and for upstream's
//! client, which waits for each status before the next request).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "integration test: a failed unwrap is a failed test"
)]

mod raw_peer;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use transfer_engine::wire::tcp::{RequestHeader, Status};
use transfer_engine::OpCode;

use raw_peer::{header, pattern, status, target, TARGET_LEN as LEN};

/// Writes of several sizes, one outside the buffer, and a read, all sent in one go: every
/// status comes back, in order, and each byte lands where its request said.
#[test]
fn requests_sent_in_one_go_are_answered_in_order() {
    let (_e, buf, data) = target();
    let sizes = [
        1usize,
        100,
        4096,
        32 << 10,
        8 << 10,
        300 << 10,
        24,
        64 << 10,
    ];
    let mut wire = Vec::new();
    let mut off = 0usize;
    let mut placed = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let bytes = pattern(i, n);
        wire.extend_from_slice(&header(OpCode::Write, buf.addr() + off as u64, n));
        wire.extend_from_slice(&bytes);
        placed.push((off, bytes));
        off += n + 13;
        if i == 3 {
            // Outside every registered buffer: rejected, its payload drained.
            wire.extend_from_slice(&header(OpCode::Write, 0x10, 5000));
            wire.extend_from_slice(&[0xEE; 5000]);
        }
    }
    let (read_off, read_len) = placed[4].clone();
    let read_len = read_len.len();
    wire.extend_from_slice(&header(
        OpCode::Read,
        buf.addr() + read_off as u64,
        read_len,
    ));
    let mut s = TcpStream::connect(data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&wire).unwrap();
    for i in 0..sizes.len() {
        assert_eq!(status(&mut s), Status::Ok, "write {i}");
        if i == 3 {
            assert_eq!(status(&mut s), Status::AddrRejected, "the write outside");
        }
    }
    assert_eq!(status(&mut s), Status::Ok, "the read");
    let mut got = vec![0u8; read_len];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, placed[4].1);
    let mut landed = vec![0u8; LEN];
    // SAFETY: the buffer is ours and no transfer runs now.
    unsafe { std::ptr::copy_nonoverlapping(buf.addr() as *const u8, landed.as_mut_ptr(), LEN) };
    for (off, bytes) in &placed {
        assert!(
            landed[*off..off + bytes.len()] == bytes[..],
            "write at {off}"
        );
    }
}

/// A client that sends the next request's header early but its payload only once it
/// has the last status (nothing in the protocol forbids it): it gets that status without
/// waiting for the server's I/O timeout. The second case's payload is large and starts off
/// a cache line, so the server receives its first bytes apart (a wait of its own).
#[test]
fn a_status_is_not_held_back_from_a_client_that_waits_for_it() {
    let (_e, buf, data) = target();
    for (next_len, next_off) in [(32usize << 10, 8192u64), (128 << 10, 8192 + 40)] {
        let mut s = TcpStream::connect(data).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut wire = header(OpCode::Write, buf.addr(), 4096).to_vec();
        wire.extend_from_slice(&[1u8; 4096]);
        wire.extend_from_slice(&header(OpCode::Write, buf.addr() + next_off, next_len));
        s.write_all(&wire).unwrap();
        let t = Instant::now();
        assert_eq!(status(&mut s), Status::Ok, "{next_len}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{next_len}: {:?}",
            t.elapsed()
        );
        s.write_all(&vec![2u8; next_len]).unwrap();
        assert_eq!(status(&mut s), Status::Ok, "{next_len}");
    }
}

/// Upstream's client: one request, its status, then the next, on one connection.
#[test]
fn one_request_at_a_time_is_answered_each_time() {
    let (_e, buf, data) = target();
    let mut s = TcpStream::connect(data).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for i in 0..50usize {
        let n = 1 + i * 1000;
        let bytes = pattern(i, n);
        let mut wire = header(OpCode::Write, buf.addr(), n).to_vec();
        wire.extend_from_slice(&bytes);
        s.write_all(&wire).unwrap();
        assert_eq!(status(&mut s), Status::Ok);
        s.write_all(&header(OpCode::Read, buf.addr(), n)).unwrap();
        assert_eq!(status(&mut s), Status::Ok);
        let mut got = vec![0u8; n];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, bytes, "round {i}");
    }
}

/// Reads sent in one go, as our lanes send them: runs of small reads of host memory,
/// answered together, broken by reads past the run's bounds (16 requests, 1 MiB), a read
/// outside every buffer (rejected), a write, and reads too large to join. Every status and
/// every byte comes back in request order, for v2 and for v1 (no statuses) alike.
#[test]
fn reads_sent_in_one_go_come_back_in_order_with_their_own_bytes() {
    let (_e, buf, data) = target();
    let fill = pattern(99, LEN);
    // SAFETY: the buffer is ours and no transfer runs now.
    unsafe { std::ptr::copy_nonoverlapping(fill.as_ptr(), buf.addr() as *mut u8, LEN) };
    #[derive(Clone, Copy)]
    enum Ask {
        Read(usize, usize),
        Outside,
        Write(usize, usize),
    }
    let mut asks = Vec::new();
    // 20 of 4 KiB: more than a run's 16 requests.
    for i in 0..20 {
        asks.push(Ask::Read(i * 5000 + 3, 4096));
    }
    // 64 KiB each: a run ends at 1 MiB.
    for i in 0..24 {
        asks.push(Ask::Read(200_000 + i * 70_000, 64 << 10));
    }
    asks.push(Ask::Outside);
    asks.extend([Ask::Read(17, 1), Ask::Read(LEN - 300_000, 300_000)]);
    asks.push(Ask::Write(3_000_000, 1000));
    asks.extend([
        Ask::Read(3_000_000, 1000),
        Ask::Read(0, 1 << 20),
        Ask::Read(5, 700_000),
    ]);
    asks.extend([Ask::Read(LEN - 1, 1), Ask::Read(2_000_000, 100)]);
    let written = pattern(7, 1000);
    for v2 in [true, false] {
        let head = |op: OpCode, addr: u64, size: usize| {
            RequestHeader {
                size: size as u64,
                addr,
                opcode: op,
                v2,
            }
            .encode()
        };
        let mut wire = Vec::new();
        for a in &asks {
            match *a {
                Ask::Read(off, n) => wire.extend(head(OpCode::Read, buf.addr() + off as u64, n)),
                Ask::Outside if v2 => wire.extend(head(OpCode::Read, 0x10, 4096)),
                // v1 cannot say no: its server closes on a bad range, so none is asked for.
                Ask::Outside => {}
                Ask::Write(off, n) => {
                    wire.extend(head(OpCode::Write, buf.addr() + off as u64, n));
                    wire.extend_from_slice(&written);
                }
            }
        }
        let mut s = TcpStream::connect(data).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let sender = {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || s.write_all(&wire).unwrap())
        };
        let mut expect = fill.clone();
        for (i, a) in asks.iter().enumerate() {
            match *a {
                Ask::Read(off, n) => {
                    if v2 {
                        assert_eq!(status(&mut s), Status::Ok, "v2 {v2}: read {i}");
                    }
                    let mut got = vec![0u8; n];
                    s.read_exact(&mut got).unwrap();
                    assert!(
                        got == expect[off..off + n],
                        "v2 {v2}: read {i} brought other bytes"
                    );
                }
                Ask::Outside if v2 => {
                    assert_eq!(status(&mut s), Status::AddrRejected, "the read outside")
                }
                Ask::Outside => {}
                Ask::Write(off, n) => {
                    if v2 {
                        assert_eq!(status(&mut s), Status::Ok, "the write");
                    }
                    expect[off..off + n].copy_from_slice(&written);
                }
            }
        }
        sender.join().unwrap();
    }
}
