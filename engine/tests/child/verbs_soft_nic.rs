//! Roles of `verbs_soft_nic.rs` (`te-test-child verbs-soft-nic`, the role in
//! `VERBS_SOFT_NIC_ROLE`): the verbs wrappers over the soft NIC of the parent's fabric,
//! a target and an initiator that talk through the parent, a loopback, an async event.

#![allow(dead_code, reason = "its parent test includes it for a part")]

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{fnv, pattern, Buf};
use crate::soft_nic::gid_text;
use transfer_engine::verbs::{
    access, AsyncEventKind, Completion, Context, Cq, LinkLayer, Mtu, PortState, Qp, QpCaps,
    RtrAttr, RtsAttr, SendWr, Verbs, VerbsError, WcOpcode, WcStatus, WrOp,
};

/// One-SGE posts spelled out per field, so the tests read like the verbs they drive.
trait PostOne {
    /// # Safety
    /// As [`Qp::post`].
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per ibv_send_wr field"
    )]
    unsafe fn post_one(
        &self,
        op: WrOp,
        wr_id: u64,
        local_addr: u64,
        len: u32,
        lkey: u32,
        remote_addr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<(), VerbsError>;
}

impl PostOne for Qp {
    unsafe fn post_one(
        &self,
        op: WrOp,
        wr_id: u64,
        local_addr: u64,
        len: u32,
        lkey: u32,
        remote_addr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let wr = SendWr {
            wr_id,
            op,
            local_addr,
            len,
            lkey,
            remote_addr,
            rkey,
            signaled,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.post(&wr) }
    }
}

pub const ROLE: &str = "VERBS_SOFT_NIC_ROLE";
pub const HCAS: [&str; 2] = ["soft_0", "soft_1"];
/// The target's buffer: large enough for many slices, with an odd tail.
pub const LEN: usize = (4 << 20) + 4093;
pub const SLICE: usize = 64 << 10;

// ---------------------------------------------------------------------------------------
// Shared by both children.
// ---------------------------------------------------------------------------------------

/// A GID in sysfs text form (`fe80:0000:...`) as 16 bytes.
fn gid_bytes(text: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, group) in text.split(':').enumerate() {
        let v = u16::from_str_radix(group, 16).unwrap();
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// Loads the library from the environment (as the engine does), checks the device list
/// and the port/GID contract for every HCA, and opens `hca`.
fn open_checked(hca: &str) -> Arc<Context> {
    let verbs = Verbs::load().unwrap();
    assert!(
        verbs.path().ends_with("libibverbs.so.1"),
        "{}",
        verbs.path()
    );
    let devs = verbs.devices().unwrap();
    let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, HCAS);
    match verbs.open("mlx5_0").unwrap_err() {
        VerbsError::NoSuchDevice { name, available } => {
            assert_eq!(name, "mlx5_0");
            assert_eq!(available, HCAS);
        }
        other => panic!("expected NoSuchDevice, got {other:?}"),
    }
    for (i, name) in HCAS.iter().enumerate() {
        let ctx = verbs.open(name).unwrap();
        assert_eq!(ctx.name(), *name);
        let port = ctx.query_port(1).unwrap();
        assert_eq!(port.state, PortState::Active, "{name}");
        assert_eq!(port.lid, 0);
        assert_eq!(port.active_mtu, Some(Mtu::Mtu4096));
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
        assert_eq!(port.gid_tbl_len, 2);
        for g in 0..2 {
            assert_eq!(
                ctx.query_gid(1, g).unwrap(),
                gid_bytes(&gid_text(i, g as usize)),
                "{name} gid {g}"
            );
        }
        let dev = ctx.query_device().unwrap();
        assert!(dev.phys_port_cnt >= 1 && dev.max_qp_wr > 0, "{dev:?}");
    }
    verbs.open(hca).unwrap()
}

/// A connected-to-be QP on `ctx` (INIT, with remote read and write allowed).
fn new_qp(ctx: &Arc<Context>) -> (Arc<transfer_engine::verbs::Pd>, Arc<Cq>, Arc<Qp>) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert!(qp.caps().max_send_wr >= 256);
    qp.to_init(
        1,
        0,
        access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
    )
    .unwrap();
    (pd, cq, qp)
}

/// INIT → RTR → RTS towards the peer, over RoCE v2 (GID index 1) with upstream's values.
fn connect(ctx: &Context, qp: &Qp, peer_qpn: u32, peer_gid: [u8; 16]) {
    let port = ctx.query_port(1).unwrap();
    qp.to_rtr(&RtrAttr {
        path_mtu: port.active_mtu.unwrap().min(Mtu::Mtu4096),
        dest_qp_num: peer_qpn,
        dgid: peer_gid,
        sgid_index: 1,
        ..RtrAttr::default()
    })
    .unwrap();
    qp.to_rts(&RtsAttr::default()).unwrap();
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n@@{line}").unwrap();
    out.flush().unwrap();
}

fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// Polls until `n` completions arrived (5 s at most).
fn wait_for(cq: &Cq, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 8];
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n {
        let k = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            got.len()
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

// ---------------------------------------------------------------------------------------
// The two children.
// ---------------------------------------------------------------------------------------

/// Target: exposes a patterned buffer, connects, then reports its hash when asked.
fn target() {
    let ctx = open_checked("soft_1");
    let (pd, _cq, qp) = new_qp(&ctx);
    let buf = Buf::new(LEN);
    buf.write_at(0, &pattern(LEN, 1)).unwrap();
    let access = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    // SAFETY: `buf` outlives `mr` (dropped first, below).
    let mr = unsafe { pd.reg_mr(buf.addr(), LEN, access) }.unwrap();
    let gid = ctx.query_gid(1, 1).unwrap();
    say(format!(
        "INFO {} {} {} {} {}",
        qp.qp_num(),
        hex(&gid),
        buf.addr(),
        LEN,
        mr.rkey()
    ));
    let peer = hear();
    let mut it = peer.split_whitespace();
    let (qpn, pgid) = (
        it.next().unwrap().parse().unwrap(),
        unhex(it.next().unwrap()),
    );
    connect(&ctx, &qp, qpn, pgid);
    say("READY".into());
    while hear() == "HASH" {
        say(format!("HASH {}", fnv(&buf.to_vec())));
    }
    drop(mr);
}

/// Initiator: connects, reads, writes, reads back, then checks a bad rkey.
fn initiator() {
    let ctx = open_checked("soft_0");
    let (pd, cq, qp) = new_qp(&ctx);
    let local = Buf::new(LEN);
    let access = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    // SAFETY: `local` outlives `mr`.
    let mr = unsafe { pd.reg_mr(local.addr(), LEN, access) }.unwrap();

    // Posting before the QP is connected is refused by the library, not crashed on.
    // SAFETY: the range is registered; the post is refused, so nothing is touched.
    let early = unsafe { qp.post_one(WrOp::Write, 1, local.addr(), 8, mr.lkey(), 0, 0, true) };
    assert!(
        matches!(early, Err(VerbsError::Failed { verb: "ibv_post_send", errno, .. }) if errno == libc::EINVAL),
        "{early:?}"
    );

    let gid = ctx.query_gid(1, 1).unwrap();
    say(format!("INFO {} {}", qp.qp_num(), hex(&gid)));
    let peer = hear();
    let f: Vec<&str> = peer.split_whitespace().collect();
    let (qpn, pgid, raddr, rlen, rkey): (u32, _, u64, usize, u32) = (
        f[0].parse().unwrap(),
        unhex(f[1]),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
        f[4].parse().unwrap(),
    );
    assert_eq!(rlen, LEN);
    connect(&ctx, &qp, qpn, pgid);
    assert_eq!(hear(), "GO");

    let slices = |op: WrOp, first_id: u64| -> Vec<SendWr> {
        (0..LEN)
            .step_by(SLICE)
            .enumerate()
            .map(|(i, off)| SendWr {
                wr_id: first_id + i as u64,
                op,
                local_addr: local.addr() + off as u64,
                len: SLICE.min(LEN - off) as u32,
                lkey: mr.lkey(),
                remote_addr: raddr + off as u64,
                rkey,
                signaled: true,
            })
            .collect()
    };

    // 1. READ the target's pattern, in slices posted as one batch (several doorbells).
    let reads = slices(WrOp::Read, 1000);
    // SAFETY: every slice lies in `local`'s MR, untouched until the completions are polled.
    unsafe { qp.post_batch(&reads) }.unwrap();
    let done = wait_for(&cq, reads.len());
    let mut ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, reads.iter().map(|w| w.wr_id).collect::<Vec<_>>());
    for c in &done {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.opcode, WcOpcode::RdmaRead);
        assert_eq!(c.qp_num, qp.qp_num());
    }
    assert!(local.to_vec() == pattern(LEN, 1), "READ bytes differ");

    // 2. WRITE a new pattern; only the last slice is signaled (RC completes in order).
    let data = pattern(LEN, 2);
    local.write_at(0, &data).unwrap();
    let mut writes = slices(WrOp::Write, 2000);
    let last = writes.len() - 1;
    for (i, w) in writes.iter_mut().enumerate() {
        w.signaled = i == last;
    }
    // SAFETY: as above.
    unsafe { qp.post_batch(&writes) }.unwrap();
    let done = wait_for(&cq, 1);
    assert_eq!(done[0].wr_id, writes[last].wr_id);
    assert_eq!(
        (done[0].status, done[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    say("WRITTEN".into());

    // 3. READ it back into a cleared buffer with the single-WR calls.
    local.fill(0);
    for (i, off) in (0..LEN).step_by(SLICE).enumerate() {
        let len = SLICE.min(LEN - off) as u32;
        // SAFETY: as above.
        unsafe {
            qp.post_one(
                WrOp::Read,
                3000 + i as u64,
                local.addr() + off as u64,
                len,
                mr.lkey(),
                raddr + off as u64,
                rkey,
                true,
            )
        }
        .unwrap();
    }
    let done = wait_for(&cq, LEN.div_ceil(SLICE));
    assert!(done.iter().all(|c| c.status.is_success()));
    assert!(local.to_vec() == data, "bytes read back differ");

    // 4. A bad rkey: remote access error, typed; the QP errs and the next WR is flushed.
    // SAFETY: as above.
    unsafe {
        qp.post_one(
            WrOp::Write,
            4000,
            local.addr(),
            4096,
            mr.lkey(),
            raddr,
            rkey ^ 0x5a5a,
            true,
        )
    }
    .unwrap();
    // SAFETY: as above.
    unsafe {
        qp.post_one(
            WrOp::Write,
            4001,
            local.addr(),
            4096,
            mr.lkey(),
            raddr,
            rkey,
            false,
        )
    }
    .unwrap();
    let done = wait_for(&cq, 2);
    assert_eq!(done[0].wr_id, 4000);
    assert_eq!(done[0].status, WcStatus::RemAccessErr, "{:?}", done[0]);
    assert_eq!(done[0].status_raw, 10);
    assert_eq!(
        ctx.verbs().wc_status_str(done[0].status_raw),
        WcStatus::RemAccessErr.to_string()
    );
    assert_eq!(done[1].wr_id, 4001);
    assert_eq!(done[1].status, WcStatus::WrFlushErr, "{:?}", done[1]);

    // 5. The QP can be reset and connected again: the rebuild path after an error.
    qp.to_reset().unwrap();
    qp.to_init(1, 0, access).unwrap();
    connect(&ctx, &qp, qpn, pgid);
    // SAFETY: as above.
    unsafe {
        qp.post_one(
            WrOp::Read,
            5000,
            local.addr(),
            4096,
            mr.lkey(),
            raddr,
            rkey,
            true,
        )
    }
    .unwrap();
    let done = wait_for(&cq, 1);
    assert_eq!(done[0].status, WcStatus::Success, "{:?}", done[0]);

    // Objects dropped out of order: the Arcs keep each parent until its children are gone.
    drop(ctx);
    drop(pd);
    drop(cq);
    drop(qp);
    drop(mr);
    say("DONE".into());
}

/// Two QPs of one context on one CQ of `cqe` entries, connected to each other.
fn pair(
    ctx: &Arc<Context>,
    gid_index: u32,
    cqe: u32,
) -> (Arc<transfer_engine::verbs::Pd>, Arc<Cq>, Arc<Qp>, Arc<Qp>) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(cqe).unwrap();
    let acc = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    let a = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let b = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let gid = ctx.query_gid(1, gid_index).unwrap();
    let port = ctx.query_port(1).unwrap();
    for (qp, peer) in [(&a, &b), (&b, &a)] {
        qp.to_init(1, 0, acc).unwrap();
        qp.to_rtr(&RtrAttr {
            path_mtu: port.active_mtu.unwrap().min(Mtu::Mtu4096),
            dest_qp_num: peer.qp_num(),
            dgid: gid,
            sgid_index: gid_index as u8,
            dlid: port.lid,
            is_global: port.link_layer == LinkLayer::Ethernet,
            ..RtrAttr::default()
        })
        .unwrap();
        qp.to_rts(&RtsAttr::default()).unwrap();
    }
    (pd, cq, a, b)
}

/// Two QPs of one context connected to each other: WRITE from one buffer into another
/// and READ it back, bytes verified; both QPs polled through one shared CQ from two
/// threads at once (the wrappers are `Send + Sync`; the library locks).
pub fn loopback(ctx: &Arc<Context>, gid_index: u32) {
    let (pd, cq, a, b) = pair(ctx, gid_index, 1024);
    let len = 1 << 20;
    let (src, dst, back) = (Buf::new(len), Buf::new(len), Buf::new(len));
    src.write_at(0, &pattern(len, 3)).unwrap();
    let acc = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
    // SAFETY: the buffers outlive the MRs (dropped first at the end of this function).
    let mrs: Vec<_> = [&src, &dst, &back]
        .iter()
        .map(|b| unsafe { pd.reg_mr(b.addr(), len, acc) }.unwrap())
        .collect();
    let posts = std::thread::scope(|s| {
        let (a, cq, mrs) = (&a, &cq, &mrs);
        let (src, dst) = (&src, &dst);
        let w = s.spawn(move || {
            for (i, off) in (0..len).step_by(SLICE).enumerate() {
                // SAFETY: in `src`'s and `dst`'s MRs; not touched until polled below.
                unsafe {
                    a.post_one(
                        WrOp::Write,
                        i as u64,
                        src.addr() + off as u64,
                        SLICE as u32,
                        mrs[0].lkey(),
                        dst.addr() + off as u64,
                        mrs[1].rkey(),
                        true,
                    )
                }
                .unwrap();
            }
        });
        let polled = s.spawn(move || wait_for(cq, len / SLICE));
        w.join().unwrap();
        polled.join().unwrap()
    });
    assert!(posts.iter().all(|c| c.status.is_success()), "{posts:?}");
    assert!(
        dst.to_vec() == pattern(len, 3),
        "loopback WRITE bytes differ"
    );
    // SAFETY: as above.
    unsafe {
        b.post_one(
            WrOp::Read,
            9,
            back.addr(),
            len as u32,
            mrs[2].lkey(),
            dst.addr(),
            mrs[1].rkey(),
            true,
        )
    }
    .unwrap();
    let done = wait_for(&cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (9, WcStatus::Success));
    assert_eq!(done[0].qp_num, b.qp_num());
    assert!(
        back.to_vec() == pattern(len, 3),
        "loopback READ bytes differ"
    );
    drop(mrs);
}

/// Plays the role `VERBS_SOFT_NIC_ROLE` names (`te-test-child verbs-soft-nic`).
pub fn run() {
    match std::env::var(ROLE).as_deref() {
        Ok("target") => target(),
        Ok("initiator") => initiator(),
        Ok("loopback") => {
            let ctx = open_checked("soft_1");
            loopback(&ctx, 1);
            say("LOOPBACK ok".into());
        }
        Ok("events") => {
            let ctx = open_checked("soft_0");
            assert_eq!(
                ctx.wait_async_event(Duration::from_millis(50)).unwrap(),
                None
            );
            let (pd, _cq, a, _b) = pair(&ctx, 1, 4);
            let buf = Buf::new(4096);
            // SAFETY: `buf` outlives `mr`.
            let mr =
                unsafe { pd.reg_mr(buf.addr(), 4096, access::LOCAL_WRITE | access::REMOTE_WRITE) }
                    .unwrap();
            for i in 0..8 {
                // SAFETY: both ends in `mr`; completions are deliberately never polled.
                unsafe {
                    a.post_one(
                        WrOp::Write,
                        i,
                        buf.addr(),
                        64,
                        mr.lkey(),
                        buf.addr() + 2048,
                        mr.rkey(),
                        true,
                    )
                }
                .unwrap();
            }
            let ev = ctx
                .wait_async_event(Duration::from_secs(5))
                .unwrap()
                .unwrap();
            assert_eq!(ev.kind, AsyncEventKind::CqErr, "{ev:?}");
            assert_eq!((ev.qp_num, ev.port), (None, None));
            say("EVENTS ok".into());
        }
        Ok("list") => {
            let verbs = Verbs::load().unwrap();
            match verbs.devices() {
                Ok(d) => say(format!("LIST {d:?}")),
                Err(e) => say(format!("LIST {e:?} | {e}")),
            }
        }
        other => panic!("{ROLE}={other:?} names no role"),
    }
}
