//! `#[repr(C)]` definitions of the rdma-core (libibverbs) structs and
//! constants the engine uses, written by hand for rdma-core's stable ABI
//! (`IBVERBS_1.1`; checked against Debian's v44 headers by
//! `engine/tests/verbs_layout.rs`, which compiles a C program against
//! `<infiniband/verbs.h>` and compares every size, offset and constant).
//!
//! Building needs no rdma-core headers. Only what the engine reads or writes
//! is defined, but every struct defined here has its exact C size and field
//! offsets, because libibverbs reads and writes whole structs. C enums are
//! `int`-sized, so enum-typed fields are plain integers here (a provider may
//! return a value this file does not name) and the values are constants.
//! Names follow the C headers so the two can be compared line by line.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

// enum ibv_node_type
pub const IBV_NODE_UNKNOWN: c_int = -1;
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_NODE_SWITCH: c_int = 2;
pub const IBV_NODE_ROUTER: c_int = 3;
pub const IBV_NODE_RNIC: c_int = 4;
pub const IBV_NODE_USNIC: c_int = 5;
pub const IBV_NODE_USNIC_UDP: c_int = 6;
pub const IBV_NODE_UNSPECIFIED: c_int = 7;

// enum ibv_transport_type
pub const IBV_TRANSPORT_UNKNOWN: c_int = -1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_TRANSPORT_IWARP: c_int = 1;
pub const IBV_TRANSPORT_USNIC: c_int = 2;
pub const IBV_TRANSPORT_USNIC_UDP: c_int = 3;
pub const IBV_TRANSPORT_UNSPECIFIED: c_int = 4;

// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_uint = 1 << 3;
pub const IBV_ACCESS_MW_BIND: c_uint = 1 << 4;
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
pub const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_FIRST` (`IB_UVERBS_ACCESS_OPTIONAL_FIRST`).
pub const IBV_ACCESS_RELAXED_ORDERING: c_uint = 1 << 20;
/// `IBV_ACCESS_OPTIONAL_RANGE`: flags a kernel may ignore; registering with
/// any of them goes through `ibv_reg_mr_iova2`, as the C header does.
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = ((1 << 30) - 1) & !((1 << 20) - 1);

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_SQD: c_uint = 4;
pub const IBV_QPS_SQE: c_uint = 5;
pub const IBV_QPS_ERR: c_uint = 6;
pub const IBV_QPS_UNKNOWN: c_uint = 7;

// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPT_UC: c_uint = 3;
pub const IBV_QPT_UD: c_uint = 4;

// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_QP_RATE_LIMIT: c_int = 1 << 25;

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;

// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

// enum ibv_wc_status
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_uint = 2;
pub const IBV_WC_LOC_EEC_OP_ERR: c_uint = 3;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_MW_BIND_ERR: c_uint = 6;
pub const IBV_WC_BAD_RESP_ERR: c_uint = 7;
pub const IBV_WC_LOC_ACCESS_ERR: c_uint = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_REM_OP_ERR: c_uint = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;
pub const IBV_WC_LOC_RDD_VIOL_ERR: c_uint = 14;
pub const IBV_WC_REM_INV_RD_REQ_ERR: c_uint = 15;
pub const IBV_WC_REM_ABORT_ERR: c_uint = 16;
pub const IBV_WC_INV_EECN_ERR: c_uint = 17;
pub const IBV_WC_INV_EEC_STATE_ERR: c_uint = 18;
pub const IBV_WC_FATAL_ERR: c_uint = 19;
pub const IBV_WC_RESP_TIMEOUT_ERR: c_uint = 20;
pub const IBV_WC_GENERAL_ERR: c_uint = 21;

// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_COMP_SWAP: c_uint = 3;
pub const IBV_WC_FETCH_ADD: c_uint = 4;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

// enum ibv_mtu
pub const IBV_MTU_256: c_uint = 1;
pub const IBV_MTU_512: c_uint = 2;
pub const IBV_MTU_1024: c_uint = 3;
pub const IBV_MTU_2048: c_uint = 4;
pub const IBV_MTU_4096: c_uint = 5;

// enum ibv_port_state
pub const IBV_PORT_NOP: c_uint = 0;
pub const IBV_PORT_DOWN: c_uint = 1;
pub const IBV_PORT_INIT: c_uint = 2;
pub const IBV_PORT_ARMED: c_uint = 3;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_PORT_ACTIVE_DEFER: c_uint = 5;

// IBV_LINK_LAYER_* (anonymous enum; stored in a uint8_t)
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// A function-pointer slot the engine never calls.
pub type unused_fn = Option<unsafe extern "C" fn()>;

/// `struct _ibv_device_ops`.
#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: unused_fn,
    pub _dummy2: unused_fn,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

pub type poll_cq_fn =
    unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
pub type req_notify_cq_fn = unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;
pub type post_send_fn = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int;
pub type post_recv_fn = unsafe extern "C" fn(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int;

/// `struct ibv_context_ops`: the legacy table the header's inline verbs
/// (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`)
/// call through. Slots in header order.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: unused_fn,
    pub _compat_query_port: unused_fn,
    pub _compat_alloc_pd: unused_fn,
    pub _compat_dealloc_pd: unused_fn,
    pub _compat_reg_mr: unused_fn,
    pub _compat_rereg_mr: unused_fn,
    pub _compat_dereg_mr: unused_fn,
    pub alloc_mw: unused_fn,
    pub bind_mw: unused_fn,
    pub dealloc_mw: unused_fn,
    pub _compat_create_cq: unused_fn,
    pub poll_cq: Option<poll_cq_fn>,
    pub req_notify_cq: Option<req_notify_cq_fn>,
    pub _compat_cq_event: unused_fn,
    pub _compat_resize_cq: unused_fn,
    pub _compat_destroy_cq: unused_fn,
    pub _compat_create_srq: unused_fn,
    pub _compat_modify_srq: unused_fn,
    pub _compat_query_srq: unused_fn,
    pub _compat_destroy_srq: unused_fn,
    pub post_srq_recv: unused_fn,
    pub _compat_create_qp: unused_fn,
    pub _compat_query_qp: unused_fn,
    pub _compat_modify_qp: unused_fn,
    pub _compat_destroy_qp: unused_fn,
    pub post_send: Option<post_send_fn>,
    pub post_recv: Option<post_recv_fn>,
    pub _compat_create_ah: unused_fn,
    pub _compat_destroy_ah: unused_fn,
    pub _compat_attach_mcast: unused_fn,
    pub _compat_detach_mcast: unused_fn,
    pub _compat_async_event: unused_fn,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (v44). The exported `ibv_query_port@IBVERBS_1.1`
/// writes only its legacy prefix (up to `flags`), so callers zero it first,
/// as the header's inline wrapper does.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `union ibv_gid` (`global`'s two `__be64` make it 8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

/// The `global` member of `union ibv_gid` (big-endian halves).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_global {
    pub subnet_prefix: u64,
    pub interface_id: u64,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut c_void,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// The `atomic` member of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// The `ud` member of `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// The `bind_mw` member of the last union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// The `tso` member of the last union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The last (anonymous) union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`. The anonymous unions of C get names here:
/// `imm_data` (first union: `imm_data` / `invalidate_rkey`), `wr`,
/// `qp_type` (`xrc.remote_srqn`), and `ext` (`bind_mw` / `tso`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    pub qp_type: u32,
    pub ext: ibv_send_wr_ext,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`. The anonymous union (`imm_data` / `invalidated_rkey`)
/// is `imm_data`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl ibv_send_wr {
    /// A zeroed work request (every pointer null), as C's `= {}`.
    pub fn zeroed() -> Self {
        // SAFETY: every field is an integer, a raw pointer or a union of
        // those; all-zero is a valid value for each.
        unsafe { std::mem::zeroed() }
    }
}

impl ibv_qp_attr {
    /// A zeroed attribute block, as C's `memset(&attr, 0, sizeof attr)`.
    pub fn zeroed() -> Self {
        // SAFETY: integers and a union of byte arrays and integers only.
        unsafe { std::mem::zeroed() }
    }
}
