//! Proves `engine/src/verbs/ffi.rs` (hand-written, so the build needs no
//! rdma-core headers) matches rdma-core's real ABI: compiles
//! `verbs_layout/probe.c` against `/usr/include/infiniband/verbs.h`
//! (Debian's `libibverbs-dev`) with one check per size, alignment, field
//! offset and constant of the Rust definitions, runs it, and compares.
//!
//! Skips, saying so, only when the header is absent
//! (`scripts/install-deps.sh` installs `libibverbs-dev`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration test: a failed unwrap is a failed test"
)]

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use transfer_engine::verbs::ffi::*;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// The checks: `checks.inc` lines for the C side, and the Rust values by key.
#[derive(Default)]
struct Checks {
    inc: String,
    rust: BTreeMap<String, i128>,
}

impl Checks {
    fn size(&mut self, key: &str, c_type: &str, size: usize, align: usize) {
        self.inc.push_str(&format!("SIZE(\"{key}\", {c_type})\n"));
        self.rust.insert(format!("size {key}"), size as i128);
        self.rust.insert(format!("align {key}"), align as i128);
    }

    fn off(&mut self, c_type: &str, c_field: &str, off: usize) {
        let key = format!("{c_type}.{c_field}");
        self.inc
            .push_str(&format!("OFF(\"{key}\", {c_type}, {c_field})\n"));
        self.rust.insert(format!("offset {key}"), off as i128);
    }

    fn konst(&mut self, name: &str, v: i128) {
        self.inc.push_str(&format!("CONST({name})\n"));
        self.rust.insert(format!("const {name}"), v);
    }
}

/// A struct whose Rust field names are the C names: size, alignment, every field.
macro_rules! layout {
    ($ck:ident, $c:literal, $t:ty, [$($f:ident),* $(,)?]) => {
        $ck.size($c, $c, size_of::<$t>(), align_of::<$t>());
        $( $ck.off($c, stringify!($f), offset_of!($t, $f)); )*
    };
}

/// A field whose C path differs from the Rust path (anonymous or nested unions).
macro_rules! field {
    ($ck:ident, $c:literal, $t:ty, $cf:literal => $($rf:ident).+) => {
        $ck.off($c, $cf, offset_of!($t, $($rf).+));
    };
}

/// A nested struct or union C has no name for: size and alignment through `__typeof__`.
macro_rules! nested {
    ($ck:ident, $key:literal, $cexpr:literal, $t:ty) => {
        $ck.size(
            $key,
            concat!("__typeof__(", $cexpr, ")"),
            size_of::<$t>(),
            align_of::<$t>(),
        );
    };
}

macro_rules! consts {
    ($ck:ident, [$($c:ident),* $(,)?]) => {
        $( $ck.konst(stringify!($c), $c as i128); )*
    };
}

fn checks() -> Checks {
    let mut ck = Checks::default();
    layout!(
        ck,
        "struct _ibv_device_ops",
        _ibv_device_ops,
        [_dummy1, _dummy2]
    );
    layout!(
        ck,
        "struct ibv_device",
        ibv_device,
        [
            _ops,
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        ]
    );
    layout!(
        ck,
        "struct ibv_context_ops",
        ibv_context_ops,
        [
            _compat_query_device,
            _compat_query_port,
            _compat_alloc_pd,
            _compat_dealloc_pd,
            _compat_reg_mr,
            _compat_rereg_mr,
            _compat_dereg_mr,
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            _compat_cq_event,
            _compat_resize_cq,
            _compat_destroy_cq,
            _compat_create_srq,
            _compat_modify_srq,
            _compat_query_srq,
            _compat_destroy_srq,
            post_srq_recv,
            _compat_create_qp,
            _compat_query_qp,
            _compat_modify_qp,
            _compat_destroy_qp,
            post_send,
            post_recv,
            _compat_create_ah,
            _compat_destroy_ah,
            _compat_attach_mcast,
            _compat_detach_mcast,
            _compat_async_event,
        ]
    );
    layout!(
        ck,
        "struct ibv_context",
        ibv_context,
        [
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        ]
    );
    layout!(
        ck,
        "struct ibv_device_attr",
        ibv_device_attr,
        [
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt,
        ]
    );
    layout!(
        ck,
        "struct ibv_port_attr",
        ibv_port_attr,
        [
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2,
        ]
    );
    layout!(ck, "union ibv_gid", ibv_gid, [raw, global]);
    nested!(
        ck,
        "ibv_gid.global",
        "((union ibv_gid *)0)->global",
        ibv_gid_global
    );
    field!(ck, "union ibv_gid", ibv_gid, "global.subnet_prefix" => global.subnet_prefix);
    field!(ck, "union ibv_gid", ibv_gid, "global.interface_id" => global.interface_id);
    layout!(ck, "struct ibv_pd", ibv_pd, [context, handle]);
    layout!(
        ck,
        "struct ibv_mr",
        ibv_mr,
        [context, pd, addr, length, handle, lkey, rkey]
    );
    layout!(
        ck,
        "struct ibv_cq",
        ibv_cq,
        [
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
        ]
    );
    layout!(
        ck,
        "struct ibv_qp",
        ibv_qp,
        [
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
        ]
    );
    layout!(
        ck,
        "struct ibv_qp_cap",
        ibv_qp_cap,
        [
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        ]
    );
    layout!(
        ck,
        "struct ibv_qp_init_attr",
        ibv_qp_init_attr,
        [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]
    );
    layout!(
        ck,
        "struct ibv_global_route",
        ibv_global_route,
        [dgid, flow_label, sgid_index, hop_limit, traffic_class]
    );
    layout!(
        ck,
        "struct ibv_ah_attr",
        ibv_ah_attr,
        [
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        ]
    );
    layout!(
        ck,
        "struct ibv_qp_attr",
        ibv_qp_attr,
        [
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit,
        ]
    );
    layout!(ck, "struct ibv_sge", ibv_sge, [addr, length, lkey]);
    layout!(
        ck,
        "struct ibv_send_wr",
        ibv_send_wr,
        [wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type]
    );
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "invalidate_rkey" => imm_data);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "bind_mw" => ext);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "tso" => ext.tso);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.rdma" => wr.rdma);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.rdma.remote_addr" => wr.rdma.remote_addr);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.rdma.rkey" => wr.rdma.rkey);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.atomic.remote_addr" => wr.atomic.remote_addr);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.atomic.compare_add" => wr.atomic.compare_add);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.atomic.swap" => wr.atomic.swap);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.atomic.rkey" => wr.atomic.rkey);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.ud.ah" => wr.ud.ah);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.ud.remote_qpn" => wr.ud.remote_qpn);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "wr.ud.remote_qkey" => wr.ud.remote_qkey);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "qp_type.xrc.remote_srqn" => qp_type);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "bind_mw.mw" => ext.bind_mw.mw);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "bind_mw.rkey" => ext.bind_mw.rkey);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "bind_mw.bind_info" => ext.bind_mw.bind_info);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "tso.hdr" => ext.tso.hdr);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "tso.hdr_sz" => ext.tso.hdr_sz);
    field!(ck, "struct ibv_send_wr", ibv_send_wr, "tso.mss" => ext.tso.mss);
    nested!(
        ck,
        "ibv_send_wr.wr",
        "((struct ibv_send_wr *)0)->wr",
        ibv_send_wr_wr
    );
    nested!(
        ck,
        "ibv_send_wr.wr.rdma",
        "((struct ibv_send_wr *)0)->wr.rdma",
        ibv_send_wr_rdma
    );
    nested!(
        ck,
        "ibv_send_wr.wr.atomic",
        "((struct ibv_send_wr *)0)->wr.atomic",
        ibv_send_wr_atomic
    );
    nested!(
        ck,
        "ibv_send_wr.wr.ud",
        "((struct ibv_send_wr *)0)->wr.ud",
        ibv_send_wr_ud
    );
    nested!(
        ck,
        "ibv_send_wr.bind_mw",
        "((struct ibv_send_wr *)0)->bind_mw",
        ibv_send_wr_bind_mw
    );
    nested!(
        ck,
        "ibv_send_wr.tso",
        "((struct ibv_send_wr *)0)->tso",
        ibv_send_wr_tso
    );
    layout!(
        ck,
        "struct ibv_mw_bind_info",
        ibv_mw_bind_info,
        [mr, addr, length, mw_access_flags]
    );
    layout!(
        ck,
        "struct ibv_recv_wr",
        ibv_recv_wr,
        [wr_id, next, sg_list, num_sge]
    );
    layout!(
        ck,
        "struct ibv_wc",
        ibv_wc,
        [
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits,
        ]
    );
    field!(ck, "struct ibv_wc", ibv_wc, "invalidated_rkey" => imm_data);
    layout!(
        ck,
        "struct ibv_async_event",
        ibv_async_event,
        [element, event_type]
    );
    nested!(
        ck,
        "ibv_async_event.element",
        "((struct ibv_async_event *)0)->element",
        ibv_async_event_element
    );
    field!(ck, "struct ibv_async_event", ibv_async_event, "element.cq" => element.cq);
    field!(ck, "struct ibv_async_event", ibv_async_event, "element.qp" => element.qp);
    field!(ck, "struct ibv_async_event", ibv_async_event, "element.srq" => element.srq);
    field!(ck, "struct ibv_async_event", ibv_async_event, "element.wq" => element.wq);
    field!(ck, "struct ibv_async_event", ibv_async_event, "element.port_num" => element.port_num);

    consts!(
        ck,
        [
            IBV_SYSFS_NAME_MAX,
            IBV_SYSFS_PATH_MAX,
            IBV_NODE_UNKNOWN,
            IBV_NODE_CA,
            IBV_NODE_SWITCH,
            IBV_NODE_ROUTER,
            IBV_NODE_RNIC,
            IBV_NODE_USNIC,
            IBV_NODE_USNIC_UDP,
            IBV_NODE_UNSPECIFIED,
            IBV_TRANSPORT_UNKNOWN,
            IBV_TRANSPORT_IB,
            IBV_TRANSPORT_IWARP,
            IBV_TRANSPORT_USNIC,
            IBV_TRANSPORT_USNIC_UDP,
            IBV_TRANSPORT_UNSPECIFIED,
            IBV_ACCESS_LOCAL_WRITE,
            IBV_ACCESS_REMOTE_WRITE,
            IBV_ACCESS_REMOTE_READ,
            IBV_ACCESS_REMOTE_ATOMIC,
            IBV_ACCESS_MW_BIND,
            IBV_ACCESS_ZERO_BASED,
            IBV_ACCESS_ON_DEMAND,
            IBV_ACCESS_HUGETLB,
            IBV_ACCESS_RELAXED_ORDERING,
            IBV_ACCESS_OPTIONAL_RANGE,
            IBV_QPS_RESET,
            IBV_QPS_INIT,
            IBV_QPS_RTR,
            IBV_QPS_RTS,
            IBV_QPS_SQD,
            IBV_QPS_SQE,
            IBV_QPS_ERR,
            IBV_QPS_UNKNOWN,
            IBV_QPT_RC,
            IBV_QPT_UC,
            IBV_QPT_UD,
            IBV_QP_STATE,
            IBV_QP_CUR_STATE,
            IBV_QP_EN_SQD_ASYNC_NOTIFY,
            IBV_QP_ACCESS_FLAGS,
            IBV_QP_PKEY_INDEX,
            IBV_QP_PORT,
            IBV_QP_QKEY,
            IBV_QP_AV,
            IBV_QP_PATH_MTU,
            IBV_QP_TIMEOUT,
            IBV_QP_RETRY_CNT,
            IBV_QP_RNR_RETRY,
            IBV_QP_RQ_PSN,
            IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_ALT_PATH,
            IBV_QP_MIN_RNR_TIMER,
            IBV_QP_SQ_PSN,
            IBV_QP_MAX_DEST_RD_ATOMIC,
            IBV_QP_PATH_MIG_STATE,
            IBV_QP_CAP,
            IBV_QP_DEST_QPN,
            IBV_QP_RATE_LIMIT,
            IBV_WR_RDMA_WRITE,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            IBV_WR_SEND,
            IBV_WR_SEND_WITH_IMM,
            IBV_WR_RDMA_READ,
            IBV_WR_ATOMIC_CMP_AND_SWP,
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            IBV_SEND_FENCE,
            IBV_SEND_SIGNALED,
            IBV_SEND_SOLICITED,
            IBV_SEND_INLINE,
            IBV_WC_SUCCESS,
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_LOC_EEC_OP_ERR,
            IBV_WC_LOC_PROT_ERR,
            IBV_WC_WR_FLUSH_ERR,
            IBV_WC_MW_BIND_ERR,
            IBV_WC_BAD_RESP_ERR,
            IBV_WC_LOC_ACCESS_ERR,
            IBV_WC_REM_INV_REQ_ERR,
            IBV_WC_REM_ACCESS_ERR,
            IBV_WC_REM_OP_ERR,
            IBV_WC_RETRY_EXC_ERR,
            IBV_WC_RNR_RETRY_EXC_ERR,
            IBV_WC_LOC_RDD_VIOL_ERR,
            IBV_WC_REM_INV_RD_REQ_ERR,
            IBV_WC_REM_ABORT_ERR,
            IBV_WC_INV_EECN_ERR,
            IBV_WC_INV_EEC_STATE_ERR,
            IBV_WC_FATAL_ERR,
            IBV_WC_RESP_TIMEOUT_ERR,
            IBV_WC_GENERAL_ERR,
            IBV_WC_SEND,
            IBV_WC_RDMA_WRITE,
            IBV_WC_RDMA_READ,
            IBV_WC_COMP_SWAP,
            IBV_WC_FETCH_ADD,
            IBV_WC_RECV,
            IBV_WC_RECV_RDMA_WITH_IMM,
            IBV_MTU_256,
            IBV_MTU_512,
            IBV_MTU_1024,
            IBV_MTU_2048,
            IBV_MTU_4096,
            IBV_PORT_NOP,
            IBV_PORT_DOWN,
            IBV_PORT_INIT,
            IBV_PORT_ARMED,
            IBV_PORT_ACTIVE,
            IBV_PORT_ACTIVE_DEFER,
            IBV_LINK_LAYER_UNSPECIFIED,
            IBV_LINK_LAYER_INFINIBAND,
            IBV_LINK_LAYER_ETHERNET,
            IBV_EVENT_CQ_ERR,
            IBV_EVENT_QP_FATAL,
            IBV_EVENT_QP_REQ_ERR,
            IBV_EVENT_QP_ACCESS_ERR,
            IBV_EVENT_COMM_EST,
            IBV_EVENT_SQ_DRAINED,
            IBV_EVENT_PATH_MIG,
            IBV_EVENT_PATH_MIG_ERR,
            IBV_EVENT_DEVICE_FATAL,
            IBV_EVENT_PORT_ACTIVE,
            IBV_EVENT_PORT_ERR,
            IBV_EVENT_LID_CHANGE,
            IBV_EVENT_PKEY_CHANGE,
            IBV_EVENT_SM_CHANGE,
            IBV_EVENT_SRQ_ERR,
            IBV_EVENT_SRQ_LIMIT_REACHED,
            IBV_EVENT_QP_LAST_WQE_REACHED,
            IBV_EVENT_CLIENT_REREGISTER,
            IBV_EVENT_GID_CHANGE,
            IBV_EVENT_WQ_FATAL,
        ]
    );
    ck
}

/// Compiles and runs the probe; its output as key → value.
fn c_values(inc: &str) -> BTreeMap<String, i128> {
    let dir = std::env::temp_dir().join(format!("verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("checks.inc"), inc).unwrap();
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/verbs_layout/probe.c");
    let exe = dir.join("probe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg("-I")
        .arg(&dir)
        .arg("-o")
        .arg(&exe)
        .arg(&probe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed on the layout probe (a name in the Rust table that verbs.h lacks?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (key, v) = l.rsplit_once(' ').unwrap();
            (key.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn ffi_layouts_and_constants_match_the_rdma_core_headers() {
    assert!(
        Path::new(HEADER).exists(),
        "{HEADER} is absent, so the verbs layouts cannot be checked: install Debian's \
         libibverbs-dev (`apt-get install libibverbs-dev`, or scripts/install-deps.sh)"
    );
    let ck = checks();
    let c = c_values(&ck.inc);
    assert_eq!(
        c.len(),
        ck.rust.len(),
        "the probe printed a different set of checks"
    );
    let mismatches: Vec<String> = ck
        .rust
        .iter()
        .filter(|(k, v)| c.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: Rust {v}, C {:?}", c.get(k)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} checks differ:\n{}",
        mismatches.len(),
        ck.rust.len(),
        mismatches.join("\n")
    );
    eprintln!(
        "{} layout and constant checks match {HEADER}",
        ck.rust.len()
    );
}
