/*
 * soft NIC: a SOFTWARE STAND-IN for rdma-core's libibverbs.so.1, for tests only.
 *
 * There is no hardware, no kernel RDMA and no provider behind this library. It lists
 * the HCAs named in SOFTNIC_HCAS and moves the bytes of RDMA WRITE and READ between
 * processes of this machine with process_vm_writev / process_vm_readv. The processes
 * of one "fabric" share a registry file under SOFTNIC_DIR: memory regions by key and
 * queue pairs by number, so a poster can check the peer's rkey, bounds, access flags
 * and queue-pair state the way an RC responder would, and complete with the status a
 * real HCA gives. Compiled against Debian's real rdma-core headers so every struct
 * (ibv_context, verbs_context, ibv_wc, ...) has rdma-core's layout, and exported with
 * rdma-core's symbol versions (softnic.map), so programs built against the real
 * library run on it unchanged. The inline data-path verbs (ibv_post_send,
 * ibv_poll_cq, ...) reach this code through the context's ops table, as with a real
 * provider.
 *
 * Completions are produced synchronously, in the posting thread. See README.md for
 * the environment variables and the error-injection syntax.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The header wraps these exported verbs in macros; this file defines the symbols. */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define SN_EXPORT __attribute__((visibility("default")))
#define SN_MAX_HCAS 64
#define SN_MR_SLOTS (1u << 18)
#define SN_QP_SLOTS (1u << 16)
#define SN_QPN_BASE 0x100u
#define SN_KEY_BASE 0x1000u
#define SN_MAGIC 0x534f46544e494331ull /* "SOFTNIC1" */
#define SN_GID_TABLE 2
#define SN_MAX_SGE 16
#define SN_MAX_INLINE 256
#define SN_MAX_QP_WR 32768

/* ---------------------------------------------------------------- shared registry */

enum { SLOT_FREE = 0, SLOT_LIVE = 1, SLOT_DEAD = 2 };

struct sn_header {
	_Atomic uint64_t magic;
	_Atomic uint32_t next_mr;
	_Atomic uint32_t next_qp;
	_Atomic uint64_t next_pd;
	uint8_t pad[4096 - 24];
};

struct sn_mr_ent {
	_Atomic uint32_t state;
	uint32_t access;
	int32_t pid;
	uint32_t hca;
	uint64_t pd;
	uint64_t addr;
	uint64_t len;
	/* Non-zero for fake GPU memory (mapped PROT_NONE by its owner): the owner's
	 * read-write mapping of the same pages, through which the data path moves bytes,
	 * as a peer-memory module or a dma-buf import gives a real HCA access. */
	uint64_t shadow;
};

/* qp_state holds enum ibv_qp_state + 1 while the QP exists, 0 once destroyed. */
struct sn_qp_ent {
	_Atomic uint32_t qp_state;
	int32_t pid;
	_Atomic uint32_t dest_qpn;
	_Atomic uint32_t access;
	uint64_t pd;
	uint32_t hca;
	uint32_t pad;
	uint64_t start_time; /* of the owner process: tells a reused pid apart */
};

struct sn_registry {
	struct sn_header *hdr;
	struct sn_mr_ent *mrs;
	struct sn_qp_ent *qps;
};

static struct sn_registry reg;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int reg_errno;

static size_t registry_size(void)
{
	return sizeof(struct sn_header) + SN_MR_SLOTS * sizeof(struct sn_mr_ent) +
	       SN_QP_SLOTS * sizeof(struct sn_qp_ent);
}

static const char *fabric_dir(void)
{
	static char dflt[64];
	const char *d = getenv("SOFTNIC_DIR");
	if (d && *d)
		return d;
	snprintf(dflt, sizeof(dflt), "/tmp/softnic-%u", (unsigned)getuid());
	return dflt;
}

static void registry_open(void)
{
	char path[4096];
	const char *dir = fabric_dir();
	/* Peers copy into and out of this process; allow them even under Yama. */
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		reg_errno = errno;
		fprintf(stderr, "softnic: cannot create SOFTNIC_DIR %s: %s\n", dir,
			strerror(errno));
		return;
	}
	snprintf(path, sizeof(path), "%s/fabric", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		reg_errno = errno;
		fprintf(stderr, "softnic: cannot open %s: %s\n", path, strerror(errno));
		return;
	}
	/* A fresh file is all zeros: every slot free, counters at zero. Growing it
	 * concurrently from several processes to the same size is harmless. */
	struct stat st;
	if (fstat(fd, &st) != 0 || ((size_t)st.st_size < registry_size() &&
				    ftruncate(fd, (off_t)registry_size()) != 0)) {
		reg_errno = errno;
		fprintf(stderr, "softnic: cannot size %s: %s\n", path, strerror(errno));
		close(fd);
		return;
	}
	void *m = mmap(NULL, registry_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		reg_errno = errno;
		fprintf(stderr, "softnic: cannot map %s: %s\n", path, strerror(errno));
		return;
	}
	reg.hdr = m;
	reg.mrs = (struct sn_mr_ent *)((char *)m + sizeof(struct sn_header));
	reg.qps = (struct sn_qp_ent *)((char *)reg.mrs + SN_MR_SLOTS * sizeof(struct sn_mr_ent));
	uint64_t zero = 0;
	atomic_compare_exchange_strong(&reg.hdr->magic, &zero, SN_MAGIC);
	if (atomic_load(&reg.hdr->magic) != SN_MAGIC) {
		fprintf(stderr, "softnic: %s is not a soft NIC registry\n", path);
		reg.hdr = NULL;
		reg_errno = EINVAL;
	}
}

static int registry(void)
{
	pthread_once(&reg_once, registry_open);
	if (!reg.hdr) {
		errno = reg_errno ? reg_errno : EIO;
		return -1;
	}
	return 0;
}

/* Slots are never reused, so keys and QP numbers stay unique over the fabric's life. */
static int take_slot(_Atomic uint32_t *next, uint32_t slots, const char *what, uint32_t *slot)
{
	*slot = atomic_fetch_add(next, 1);
	if (*slot < slots)
		return 0;
	fprintf(stderr, "softnic: fabric out of %s (%u); use a fresh SOFTNIC_DIR\n", what, slots);
	errno = ENOMEM;
	return -1;
}

static struct sn_mr_ent *mr_by_key(uint32_t key)
{
	if (key < SN_KEY_BASE || key - SN_KEY_BASE >= SN_MR_SLOTS)
		return NULL;
	struct sn_mr_ent *e = &reg.mrs[key - SN_KEY_BASE];
	if (atomic_load_explicit(&e->state, memory_order_acquire) != SLOT_LIVE)
		return NULL;
	return e;
}

static struct sn_qp_ent *qp_by_num(uint32_t qpn)
{
	if (qpn < SN_QPN_BASE || qpn - SN_QPN_BASE >= SN_QP_SLOTS)
		return NULL;
	return &reg.qps[qpn - SN_QPN_BASE];
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), 0 if gone. */
static uint64_t start_time_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* the command name may hold spaces */
	if (!p)
		return 0;
	p++; /* the space before field 3 */
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* ---------------------------------------------------------------- configuration */

enum inject_kind { INJ_NONE, INJ_REM_ACCESS, INJ_RETRY_EXC, INJ_LOC_PROT };

struct inject {
	enum inject_kind kind;
	uint64_t nth; /* 1-based data WR count of this process; 0 = use hca */
	int hca;      /* -1 = any */
};

#define SN_MAX_INJECT 16

struct sn_config {
	int nhcas;
	char names[SN_MAX_HCAS][IBV_SYSFS_NAME_MAX];
	int down[SN_MAX_HCAS];
	struct inject inj[SN_MAX_INJECT];
	int ninj;
};

static struct sn_config cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t wr_counter;

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n'))
		*--e = 0;
	return s;
}

static int hca_index(const char *name)
{
	for (int i = 0; i < cfg.nhcas; i++)
		if (strcmp(cfg.names[i], name) == 0)
			return i;
	return -1;
}

static void config_load(void)
{
	const char *hcas = getenv("SOFTNIC_HCAS");
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", hcas ? hcas : "soft_0");
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		t = trim(t);
		if (!*t)
			continue;
		if (cfg.nhcas == SN_MAX_HCAS || strlen(t) >= IBV_SYSFS_NAME_MAX) {
			fprintf(stderr, "softnic: SOFTNIC_HCAS: too many HCAs or name too long: %s\n", t);
			continue;
		}
		snprintf(cfg.names[cfg.nhcas++], IBV_SYSFS_NAME_MAX, "%s", t);
	}
	const char *down = getenv("SOFTNIC_DOWN");
	snprintf(buf, sizeof(buf), "%s", down ? down : "");
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int i = hca_index(trim(t));
		if (i < 0)
			fprintf(stderr, "softnic: SOFTNIC_DOWN names %s, not in SOFTNIC_HCAS\n", trim(t));
		else
			cfg.down[i] = 1;
	}
	const char *fail = getenv("SOFTNIC_FAIL");
	snprintf(buf, sizeof(buf), "%s", fail ? fail : "");
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		t = trim(t);
		char *at = strchr(t, '@');
		struct inject in = {.kind = INJ_NONE, .nth = 0, .hca = -1};
		if (at) {
			*at++ = 0;
			if (strcmp(t, "rem_access") == 0)
				in.kind = INJ_REM_ACCESS;
			else if (strcmp(t, "retry_exc") == 0)
				in.kind = INJ_RETRY_EXC;
			else if (strcmp(t, "loc_prot") == 0)
				in.kind = INJ_LOC_PROT;
			if (strncmp(at, "hca:", 4) == 0) {
				in.hca = hca_index(at + 4);
				if (in.hca < 0)
					in.kind = INJ_NONE;
			} else {
				char *end;
				in.nth = strtoull(at, &end, 10);
				if (*end || in.nth == 0)
					in.kind = INJ_NONE;
			}
		}
		if (in.kind == INJ_NONE || cfg.ninj == SN_MAX_INJECT) {
			fprintf(stderr,
				"softnic: SOFTNIC_FAIL item '%s' ignored (want rem_access|retry_exc|loc_prot "
				"@N or @hca:NAME)\n",
				t);
			continue;
		}
		cfg.inj[cfg.ninj++] = in;
	}
}

static void config(void)
{
	pthread_once(&cfg_once, config_load);
}

/* ---------------------------------------------------------------- objects */

struct sn_device {
	struct ibv_device dev; /* first: ibv_device pointers are sn_device pointers */
	int index;
};

struct sn_context {
	struct verbs_context vctx; /* ends with the ibv_context, as rdma-core requires */
	int index;
	int async_wr;
};

struct sn_pd {
	struct ibv_pd pd;
	uint64_t id;
	_Atomic int users;
};

struct sn_mr {
	struct ibv_mr mr;
	uint32_t slot;
	void *shadow_map;
	size_t shadow_len;
};

struct sn_cqe {
	struct ibv_wc wc;
	struct sn_qp *qp;
	uint32_t retire; /* send-queue slots this completion frees */
	int is_recv;
};

struct sn_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct sn_cqe *ring;
	uint32_t cap, head, count;
	int armed;
	int notify_wr; /* write end of the channel's pipe, or -1 */
	_Atomic int users;
};

struct sn_qp {
	struct ibv_qp qp;
	pthread_mutex_t lock;
	int hca;
	uint64_t pd_id;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	_Atomic uint32_t sq_outstanding;
	uint32_t unsignaled; /* WRs since the last signaled one, under lock */
	uint64_t *rq_ids; /* posted receive wr_ids, flushed on error */
	uint32_t rq_head, rq_count;
	_Atomic uint32_t rq_outstanding;
	struct sn_qp_ent *ent;
	uint8_t port, path_mtu;
	uint32_t access;
	uint32_t dest_qpn;
	uint32_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
	uint32_t rq_psn, sq_psn, max_rd_atomic, max_dest_rd_atomic;
	struct ibv_ah_attr ah;
	/* The peer process, pinned by a pidfd once its start time matched the registry's,
	 * so a pid the kernel reused is never written to. */
	int peer_pidfd;
	uint32_t peer_pidfd_qpn;
	uint64_t peer_checked_ns;
};

static struct sn_device devices[SN_MAX_HCAS];
static struct ibv_device *device_ptrs[SN_MAX_HCAS + 1];
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void devices_init(void)
{
	config();
	const char *root = getenv("MC_SYSFS_ROOT");
	for (int i = 0; i < cfg.nhcas; i++) {
		struct sn_device *d = &devices[i];
		d->index = i;
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->dev.name, sizeof(d->dev.name), "%s", cfg.names[i]);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
		snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "%s/class/infiniband_verbs/uverbs%d",
			 root && *root ? root : "/sys", i);
		snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "%s/class/infiniband/%s",
			 root && *root ? root : "/sys", cfg.names[i]);
		device_ptrs[i] = &d->dev;
	}
}

static int ctx_index(struct ibv_context *c)
{
	return ((struct sn_device *)c->device)->index;
}

/* ---------------------------------------------------------------- devices */

SN_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	if (registry() != 0) {
		if (num)
			*num = 0;
		return NULL;
	}
	pthread_once(&dev_once, devices_init);
	struct ibv_device **list = calloc((size_t)cfg.nhcas + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	memcpy(list, device_ptrs, (size_t)cfg.nhcas * sizeof(*list));
	if (num)
		*num = cfg.nhcas;
	return list;
}

SN_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

SN_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

SN_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	uint64_t g = 0x02005e0000000000ull | (uint64_t)(((struct sn_device *)device)->index + 1);
	return htobe64(g);
}

SN_EXPORT int ibv_fork_init(void)
{
	return 0;
}

static int sn_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len);
static int sn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int sn_req_notify_cq(struct ibv_cq *cq, int solicited);
static int sn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int sn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int sn_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
SN_EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a);
SN_EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a);

SN_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (registry() != 0)
		return NULL;
	struct sn_context *sc = calloc(1, sizeof(*sc));
	int p[2];
	if (!sc || pipe2(p, O_CLOEXEC) != 0) {
		free(sc);
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_context *c = &sc->vctx.context;
	sc->index = ((struct sn_device *)device)->index;
	sc->vctx.sz = sizeof(struct verbs_context);
	sc->vctx.query_port = sn_query_port;
	c->device = device;
	c->ops._compat_query_device = ibv_query_device;
	c->ops._compat_query_port = ibv_query_port;
	c->ops.poll_cq = sn_poll_cq;
	c->ops.req_notify_cq = sn_req_notify_cq;
	c->ops.post_send = sn_post_send;
	c->ops.post_recv = sn_post_recv;
	c->ops.post_srq_recv = sn_post_srq_recv;
	c->cmd_fd = -1;
	c->async_fd = p[0];
	sc->async_wr = p[1];
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	return c;
}

SN_EXPORT int ibv_close_device(struct ibv_context *c)
{
	struct sn_context *sc = (struct sn_context *)((char *)c - offsetof(struct sn_context, vctx.context));
	close(c->async_fd);
	close(sc->async_wr);
	pthread_mutex_destroy(&c->mutex);
	free(sc);
	return 0;
}

static void post_async(struct ibv_context *c, struct ibv_async_event ev)
{
	struct sn_context *sc = (struct sn_context *)((char *)c - offsetof(struct sn_context, vctx.context));
	if (write(sc->async_wr, &ev, sizeof(ev)) != (ssize_t)sizeof(ev))
		fprintf(stderr, "softnic: async event lost\n");
}

SN_EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	ssize_t n = read(c->async_fd, ev, sizeof(*ev));
	return n == (ssize_t)sizeof(*ev) ? 0 : -1;
}

SN_EXPORT void ibv_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
}

SN_EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "softnic-1.0");
	a->node_guid = ibv_get_device_guid(c->device);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = ~0ull;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x5f5f;
	a->vendor_part_id = 1;
	a->hw_ver = 1;
	a->max_qp = SN_QP_SLOTS;
	a->max_qp_wr = SN_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = SN_MAX_SGE;
	a->max_sge_rd = SN_MAX_SGE;
	a->max_cq = 1 << 16;
	a->max_cqe = 4194303;
	a->max_mr = SN_MR_SLOTS;
	a->max_pd = 1 << 16;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->max_res_rd_atom = 1 << 20;
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static int sn_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
	if (port != 1)
		return EINVAL;
	struct ibv_port_attr p;
	memset(&p, 0, sizeof(p));
	int down = cfg.down[ctx_index(c)];
	p.state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	p.max_mtu = IBV_MTU_4096;
	p.active_mtu = IBV_MTU_4096;
	p.gid_tbl_len = SN_GID_TABLE;
	p.port_cap_flags = IBV_PORT_CM_SUP;
	p.max_msg_sz = 1u << 31;
	p.pkey_tbl_len = 1;
	p.lid = 0;
	p.active_width = 2;  /* 4x */
	p.active_speed = 64; /* HDR */
	p.phys_state = down ? 3 : 5; /* Disabled / LinkUp */
	p.link_layer = IBV_LINK_LAYER_ETHERNET;
	memcpy(a, &p, len < sizeof(p) ? len : sizeof(p));
	return 0;
}

/* The symbol a program built against older headers, or the inline wrapper without
 * an extended context, calls. Same layout up to link_layer. */
SN_EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a)
{
	return sn_query_port(c, port, (struct ibv_port_attr *)a,
			     offsetof(struct ibv_port_attr, flags));
}

static void gid_of(int hca, int index, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (index == 0) {
		gid->raw[0] = 0xfe;
		gid->raw[1] = 0x80;
		gid->raw[14] = (uint8_t)((hca + 1) >> 8);
		gid->raw[15] = (uint8_t)(hca + 1);
	} else {
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		gid->raw[12] = 127;
		gid->raw[13] = 0;
		gid->raw[14] = (uint8_t)(hca + 1);
		gid->raw[15] = 1;
	}
}

SN_EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	if (port != 1 || index < 0 || index >= SN_GID_TABLE)
		return -1;
	gid_of(ctx_index(c), index, gid);
	return 0;
}

SN_EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	if (port != 1 || index >= SN_GID_TABLE)
		return ENODATA;
	memset(entry, 0, sizeof(*entry));
	gid_of(ctx_index(c), (int)index, &entry->gid);
	entry->gid_index = index;
	entry->port_num = port;
	entry->gid_type = index == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
	entry->ndev_ifindex = 1; /* lo */
	return 0;
}

SN_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *entries,
				       size_t max, uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	size_t n = max < SN_GID_TABLE ? max : SN_GID_TABLE;
	for (size_t i = 0; i < n; i++)
		_ibv_query_gid_ex(c, 1, (uint32_t)i,
				  (struct ibv_gid_entry *)((char *)entries + i * entry_size), 0,
				  sizeof(*entries));
	return (ssize_t)n;
}

SN_EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
	(void)c;
	if (port != 1 || index != 0)
		return -1;
	*pkey = htobe16(0xffff);
	return 0;
}

static const char *const wc_status_names[] = {
	[IBV_WC_SUCCESS] = "success",
	[IBV_WC_LOC_LEN_ERR] = "local length error",
	[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
	[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
	[IBV_WC_LOC_PROT_ERR] = "local protection error",
	[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
	[IBV_WC_MW_BIND_ERR] = "memory management operation error",
	[IBV_WC_BAD_RESP_ERR] = "bad response error",
	[IBV_WC_LOC_ACCESS_ERR] = "local access error",
	[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
	[IBV_WC_REM_ACCESS_ERR] = "remote access error",
	[IBV_WC_REM_OP_ERR] = "remote operation error",
	[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
	[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
	[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
	[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
	[IBV_WC_REM_ABORT_ERR] = "aborted error",
	[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
	[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
	[IBV_WC_FATAL_ERR] = "fatal error",
	[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
	[IBV_WC_GENERAL_ERR] = "general error",
	[IBV_WC_TM_ERR] = "TM error",
	[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
};

SN_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	if ((unsigned)status < sizeof(wc_status_names) / sizeof(wc_status_names[0]) &&
	    wc_status_names[status])
		return wc_status_names[status];
	return "unknown";
}

SN_EXPORT const char *ibv_event_type_str(enum ibv_event_type ev)
{
	static const char *const names[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if ((unsigned)ev < sizeof(names) / sizeof(names[0]) && names[ev])
		return names[ev];
	return "unknown";
}

SN_EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const names[] = {"no state change (NOP)", "down", "init", "armed",
					    "active", "active defer"};
	return (unsigned)s < 6 ? names[s] : "unknown";
}

SN_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	return t == IBV_NODE_CA ? "InfiniBand channel adapter" : "unknown";
}

/* ---------------------------------------------------------------- PD and MR */

SN_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct sn_pd *p = calloc(1, sizeof(*p));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = c;
	p->id = atomic_fetch_add(&reg.hdr->next_pd, 1) + 1;
	p->pd.handle = (uint32_t)p->id;
	return &p->pd;
}

SN_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct sn_pd *p = (struct sn_pd *)pd;
	if (atomic_load(&p->users) != 0)
		return EBUSY;
	free(p);
	return 0;
}

/* The mapping of this process holding addr, from /proc/self/maps: its start, file
 * offset and inode, and whether it is fake GPU memory (the test runtime's memfd). */
struct sn_mapping {
	uintptr_t start;
	uint64_t offset;
	unsigned long inode;
	int fake_gpu;
};

static int mapping_of(uintptr_t addr, struct sn_mapping *out)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return -1;
	char line[512];
	int found = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end, off, inode;
		int n = 0;
		if (sscanf(line, "%lx-%lx %*s %lx %*s %lu %n", &start, &end, &off, &inode, &n) < 4)
			continue;
		if (addr < start || addr >= end)
			continue;
		out->start = start;
		out->offset = off;
		out->inode = inode;
		out->fake_gpu = strstr(line + n, "memfd:fake-gpu") != NULL;
		found = 0;
		break;
	}
	fclose(f);
	return found;
}

/* A read-write mapping of len bytes of fd at offset, for a shadow. */
static void *map_shadow(int fd, uint64_t offset, size_t len, size_t *map_len)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t skip = offset % page;
	*map_len = len + skip;
	void *m = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(offset - skip));
	if (m == MAP_FAILED)
		return NULL;
	return (char *)m + skip;
}

/* An fd of this process open on the file with this inode (the fake runtime keeps its
 * memfds open), or -1: how the soft NIC plays a peer-memory module. */
static int fd_of_inode(unsigned long inode)
{
	for (int fd = 0; fd < 4096; fd++) {
		struct stat st;
		if (fstat(fd, &st) == 0 && st.st_ino == inode && S_ISREG(st.st_mode))
			return fd;
	}
	return -1;
}

static struct ibv_mr *reg_mr_core(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				  int access, int dmabuf_fd, uint64_t dmabuf_offset);

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access)
{
	return reg_mr_core(pd, addr, len, iova, access, -1, 0);
}

static struct ibv_mr *reg_mr_core(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				  int access, int dmabuf_fd, uint64_t dmabuf_offset)
{
	struct sn_pd *p = (struct sn_pd *)pd;
	if (iova != (uintptr_t)addr) {
		fprintf(stderr, "softnic: an iova other than the address is not supported\n");
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (len == 0 || (uintptr_t)addr + len < (uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	/* As the IB spec demands: remote write needs local write. */
	if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	/* Fake GPU memory: refused as by an HCA without the peer-memory module
	 * (SOFTNIC_REFUSE_MR=fake_gpu), else reached through a shadow mapping. */
	struct sn_mapping map = {0};
	void *shadow = NULL;
	size_t shadow_len = 0;
	if (dmabuf_fd >= 0) {
		struct stat st;
		if (fstat(dmabuf_fd, &st) != 0 || mapping_of((uintptr_t)addr, &map) != 0 ||
		    st.st_ino != map.inode || map.offset + ((uintptr_t)addr - map.start) != dmabuf_offset) {
			fprintf(stderr, "softnic: dma-buf fd %d at offset %llu is not the memory at iova %p\n",
				dmabuf_fd, (unsigned long long)dmabuf_offset, addr);
			errno = EINVAL;
			return NULL;
		}
		shadow = map_shadow(dmabuf_fd, dmabuf_offset, len, &shadow_len);
		if (!shadow)
			return NULL;
	} else if (mapping_of((uintptr_t)addr, &map) == 0 && map.fake_gpu) {
		const char *refuse = getenv("SOFTNIC_REFUSE_MR");
		if (refuse && strcmp(refuse, "fake_gpu") == 0) {
			errno = EFAULT;
			return NULL;
		}
		int fd = fd_of_inode(map.inode);
		if (fd < 0) {
			errno = EFAULT;
			return NULL;
		}
		shadow = map_shadow(fd, map.offset + ((uintptr_t)addr - map.start), len, &shadow_len);
		if (!shadow)
			return NULL;
	}
	uint32_t slot;
	if (take_slot(&reg.hdr->next_mr, SN_MR_SLOTS, "memory-region keys", &slot) != 0)
		return NULL;
	struct sn_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	if (shadow) {
		uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
		m->shadow_map = (char *)shadow - ((uintptr_t)shadow % page);
		m->shadow_len = shadow_len;
	}
	struct sn_mr_ent *e = &reg.mrs[slot];
	e->access = (uint32_t)access;
	e->pid = getpid();
	e->hca = (uint32_t)ctx_index(pd->context);
	e->pd = p->id;
	e->addr = (uintptr_t)addr;
	e->len = len;
	e->shadow = (uintptr_t)shadow;
	atomic_store_explicit(&e->state, SLOT_LIVE, memory_order_release);
	m->slot = slot;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = slot;
	m->mr.lkey = m->mr.rkey = SN_KEY_BASE + slot;
	atomic_fetch_add(&p->users, 1);
	return &m->mr;
}

SN_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return reg_mr(pd, addr, len, (uintptr_t)addr, access);
}

SN_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
					  unsigned int access)
{
	return reg_mr(pd, addr, len, iova, (int)access);
}

SN_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
					 int access)
{
	return reg_mr(pd, addr, len, iova, access);
}

SN_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct sn_mr *m = (struct sn_mr *)mr;
	atomic_store_explicit(&reg.mrs[m->slot].state, SLOT_DEAD, memory_order_release);
	atomic_fetch_sub(&((struct sn_pd *)mr->pd)->users, 1);
	if (m->shadow_map)
		munmap(m->shadow_map, m->shadow_len);
	free(m);
	return 0;
}

/* dma-buf registration (rdma-core v34+): the fd must be the file mapped at iova in this
 * process (the fake GPU runtime's memfd export); refused with SOFTNIC_REFUSE_DMABUF=1. */
SN_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					   uint64_t iova, int fd, int access)
{
	const char *refuse = getenv("SOFTNIC_REFUSE_DMABUF");
	if (refuse && strcmp(refuse, "1") == 0) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	return reg_mr_core(pd, (void *)(uintptr_t)iova, length, iova, access, fd, offset);
}

/* ---------------------------------------------------------------- CQ */

SN_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch) + sizeof(int));
	int p[2];
	if (!ch || pipe2(p, O_CLOEXEC) != 0) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	ch->context = c;
	ch->fd = p[0];
	*(int *)(ch + 1) = p[1];
	return ch;
}

SN_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (ch->refcnt)
		return EBUSY;
	close(ch->fd);
	close(*(int *)(ch + 1));
	free(ch);
	return 0;
}

SN_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	(void)comp_vector;
	if (cqe <= 0 || cqe > 4194303) {
		errno = EINVAL;
		return NULL;
	}
	struct sn_cq *q = calloc(1, sizeof(*q));
	if (q)
		q->ring = calloc((size_t)cqe, sizeof(*q->ring));
	if (!q || !q->ring) {
		if (q)
			free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->cap = (uint32_t)cqe;
	q->cq.context = c;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.cqe = cqe;
	q->notify_wr = channel ? *(int *)(channel + 1) : -1;
	if (channel)
		channel->refcnt++;
	pthread_mutex_init(&q->lock, NULL);
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	return &q->cq;
}

SN_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct sn_cq *q = (struct sn_cq *)cq;
	if (atomic_load(&q->users) != 0)
		return EBUSY;
	if (cq->channel)
		cq->channel->refcnt--;
	pthread_mutex_destroy(&q->lock);
	free(q->ring);
	free(q);
	return 0;
}

SN_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *got;
	if (read(ch->fd, &got, sizeof(got)) != (ssize_t)sizeof(got))
		return -1;
	*cq = got;
	*cq_context = got->cq_context;
	return 0;
}

SN_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += n;
	pthread_mutex_unlock(&cq->mutex);
}

static int sn_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	(void)solicited;
	struct sn_cq *q = (struct sn_cq *)cq;
	pthread_mutex_lock(&q->lock);
	q->armed = 1;
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Appends a completion; false when the CQ overran (the completion is lost, as on
 * hardware, and a CQ error event is raised). */
static void cq_push(struct sn_cq *q, const struct sn_cqe *e)
{
	int notify = 0, overrun = 0;
	pthread_mutex_lock(&q->lock);
	if (q->count == q->cap) {
		overrun = 1;
	} else {
		q->ring[(q->head + q->count) % q->cap] = *e;
		q->count++;
		if (q->armed && q->notify_wr >= 0) {
			q->armed = 0;
			notify = 1;
		}
	}
	pthread_mutex_unlock(&q->lock);
	if (notify) {
		struct ibv_cq *p = &q->cq;
		if (write(q->notify_wr, &p, sizeof(p)) != (ssize_t)sizeof(p))
			fprintf(stderr, "softnic: completion event lost\n");
	}
	if (overrun) {
		fprintf(stderr, "softnic: CQ overrun (%u entries): completion lost\n", q->cap);
		struct ibv_async_event ev = {.element.cq = &q->cq, .event_type = IBV_EVENT_CQ_ERR};
		post_async(q->cq.context, ev);
	}
}

static int sn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct sn_cq *q = (struct sn_cq *)cq;
	int got = 0;
	if (n <= 0)
		return 0;
	pthread_mutex_lock(&q->lock);
	while (got < n && q->count > 0) {
		struct sn_cqe *e = &q->ring[q->head];
		wc[got++] = e->wc;
		if (e->is_recv)
			atomic_fetch_sub(&e->qp->rq_outstanding, 1);
		else
			atomic_fetch_sub(&e->qp->sq_outstanding, e->retire);
		q->head = (q->head + 1) % q->cap;
		q->count--;
	}
	pthread_mutex_unlock(&q->lock);
	return got;
}

/* Drops the completions of a QP being destroyed, as a provider cleans its CQ. */
static void cq_clean(struct sn_cq *q, struct sn_qp *qp)
{
	pthread_mutex_lock(&q->lock);
	uint32_t kept = 0;
	for (uint32_t i = 0; i < q->count; i++) {
		struct sn_cqe e = q->ring[(q->head + i) % q->cap];
		if (e.qp != qp)
			q->ring[(q->head + kept++) % q->cap] = e;
	}
	q->count = kept;
	pthread_mutex_unlock(&q->lock);
}

/* ---------------------------------------------------------------- QP */

SN_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq || attr->srq ||
	    attr->cap.max_send_wr > SN_MAX_QP_WR || attr->cap.max_recv_wr > SN_MAX_QP_WR ||
	    attr->cap.max_send_sge > SN_MAX_SGE || attr->cap.max_recv_sge > SN_MAX_SGE ||
	    attr->cap.max_inline_data > SN_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	uint32_t slot;
	if (take_slot(&reg.hdr->next_qp, SN_QP_SLOTS, "QP numbers", &slot) != 0)
		return NULL;
	struct sn_qp *q = calloc(1, sizeof(*q));
	if (q)
		q->rq_ids = calloc(attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1, sizeof(uint64_t));
	if (!q || !q->rq_ids) {
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->hca = ctx_index(pd->context);
	q->pd_id = ((struct sn_pd *)pd)->id;
	q->cap = attr->cap;
	q->sq_sig_all = attr->sq_sig_all;
	q->ent = &reg.qps[slot];
	q->qp.context = pd->context;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.handle = slot;
	q->qp.qp_num = SN_QPN_BASE + slot;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&q->lock, NULL);
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->peer_pidfd = -1;
	q->ent->pid = getpid();
	q->ent->start_time = start_time_of(getpid());
	q->ent->pd = q->pd_id;
	q->ent->hca = (uint32_t)q->hca;
	atomic_store(&q->ent->dest_qpn, 0);
	atomic_store(&q->ent->access, 0);
	atomic_store_explicit(&q->ent->qp_state, IBV_QPS_RESET + 1, memory_order_release);
	atomic_fetch_add(&((struct sn_pd *)pd)->users, 1);
	atomic_fetch_add(&((struct sn_cq *)attr->send_cq)->users, 1);
	atomic_fetch_add(&((struct sn_cq *)attr->recv_cq)->users, 1);
	return &q->qp;
}

SN_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct sn_qp *q = (struct sn_qp *)qp;
	atomic_store_explicit(&q->ent->qp_state, 0, memory_order_release);
	cq_clean((struct sn_cq *)qp->send_cq, q);
	if (qp->recv_cq != qp->send_cq)
		cq_clean((struct sn_cq *)qp->recv_cq, q);
	atomic_fetch_sub(&((struct sn_pd *)qp->pd)->users, 1);
	atomic_fetch_sub(&((struct sn_cq *)qp->send_cq)->users, 1);
	atomic_fetch_sub(&((struct sn_cq *)qp->recv_cq)->users, 1);
	if (q->peer_pidfd >= 0)
		close(q->peer_pidfd);
	pthread_mutex_destroy(&q->lock);
	free(q->rq_ids);
	free(q);
	return 0;
}

static void set_state(struct sn_qp *q, enum ibv_qp_state s)
{
	q->qp.state = s;
	atomic_store_explicit(&q->ent->qp_state, (uint32_t)s + 1, memory_order_release);
}

static void flush_recvs(struct sn_qp *q)
{
	while (q->rq_count > 0) {
		struct sn_cqe e = {.qp = q, .is_recv = 1};
		e.wc.wr_id = q->rq_ids[q->rq_head];
		e.wc.status = IBV_WC_WR_FLUSH_ERR;
		e.wc.opcode = IBV_WC_RECV;
		e.wc.qp_num = q->qp.qp_num;
		q->rq_head = (q->rq_head + 1) % (q->cap.max_recv_wr ? q->cap.max_recv_wr : 1);
		q->rq_count--;
		cq_push((struct sn_cq *)q->qp.recv_cq, &e);
	}
}

/* The attributes the IB spec requires (and allows) for each RC transition. */
static int transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
	const int req_init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	const int req_rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	const int req_rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
	const int opt_init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	const int opt_rtr = opt_init | IBV_QP_ALT_PATH;
	const int opt_rts = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
			    IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
	int req, opt;
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		return (mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE)) == 0;
	if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
		req = req_init;
		opt = 0;
	} else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
		req = IBV_QP_STATE;
		opt = opt_init;
	} else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
		req = req_rtr;
		opt = opt_rtr;
	} else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
		req = req_rts;
		opt = opt_rts;
	} else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
		req = IBV_QP_STATE;
		opt = opt_rts;
	} else {
		return 0;
	}
	return (mask & req) == req && (mask & ~(req | opt | IBV_QP_CUR_STATE)) == 0;
}

SN_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct sn_qp *q = (struct sn_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&q->lock);
	enum ibv_qp_state cur = qp->state;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
	if (((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) || !transition_ok(cur, next, mask)) {
		rc = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_PORT) && a->port_num != 1) {
		rc = EINVAL;
		goto out;
	}
	if (mask & IBV_QP_AV) {
		/* RoCE: every address carries a GRH with a source GID of this port. */
		if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= SN_GID_TABLE ||
		    a->ah_attr.port_num > 1) {
			rc = EINVAL;
			goto out;
		}
		q->ah = a->ah_attr;
	}
	if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) {
		rc = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16) {
		rc = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16) {
		rc = EINVAL;
		goto out;
	}
	if (next == IBV_QPS_RTR && cfg.down[q->hca]) {
		rc = ENETDOWN; /* the port is down: no path to the peer */
		goto out;
	}
	if (mask & IBV_QP_PORT)
		q->port = a->port_num;
	if (mask & IBV_QP_ACCESS_FLAGS) {
		q->access = a->qp_access_flags;
		atomic_store(&q->ent->access, a->qp_access_flags);
	}
	if (mask & IBV_QP_PATH_MTU)
		q->path_mtu = (uint8_t)a->path_mtu;
	if (mask & IBV_QP_DEST_QPN) {
		q->dest_qpn = a->dest_qp_num;
		atomic_store(&q->ent->dest_qpn, a->dest_qp_num);
	}
	if (mask & IBV_QP_RQ_PSN)
		q->rq_psn = a->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		q->sq_psn = a->sq_psn;
	if (mask & IBV_QP_TIMEOUT)
		q->timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		q->retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		q->rnr_retry = a->rnr_retry;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		q->min_rnr_timer = a->min_rnr_timer;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		q->max_rd_atomic = a->max_rd_atomic;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		q->max_dest_rd_atomic = a->max_dest_rd_atomic;
	if (next == IBV_QPS_RESET) {
		q->rq_count = q->rq_head = 0;
		q->unsignaled = 0;
		atomic_store(&q->rq_outstanding, 0);
		atomic_store(&q->sq_outstanding, 0);
		q->dest_qpn = 0;
		atomic_store(&q->ent->dest_qpn, 0);
	}
	set_state(q, next);
	if (next == IBV_QPS_ERR)
		flush_recvs(q);
out:
	pthread_mutex_unlock(&q->lock);
	return rc;
}

SN_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
			   struct ibv_qp_init_attr *init)
{
	(void)mask;
	struct sn_qp *q = (struct sn_qp *)qp;
	pthread_mutex_lock(&q->lock);
	memset(a, 0, sizeof(*a));
	a->qp_state = a->cur_qp_state = qp->state;
	a->path_mtu = q->path_mtu;
	a->qp_access_flags = q->access;
	a->dest_qp_num = q->dest_qpn;
	a->rq_psn = q->rq_psn;
	a->sq_psn = q->sq_psn;
	a->cap = q->cap;
	a->ah_attr = q->ah;
	a->port_num = q->port;
	a->timeout = (uint8_t)q->timeout;
	a->retry_cnt = (uint8_t)q->retry_cnt;
	a->rnr_retry = (uint8_t)q->rnr_retry;
	a->min_rnr_timer = (uint8_t)q->min_rnr_timer;
	a->max_rd_atomic = (uint8_t)q->max_rd_atomic;
	a->max_dest_rd_atomic = (uint8_t)q->max_dest_rd_atomic;
	if (init) {
		memset(init, 0, sizeof(*init));
		init->qp_context = qp->qp_context;
		init->send_cq = qp->send_cq;
		init->recv_cq = qp->recv_cq;
		init->cap = q->cap;
		init->qp_type = IBV_QPT_RC;
		init->sq_sig_all = q->sq_sig_all;
	}
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* ---------------------------------------------------------------- data path */

static enum ibv_wc_status injected(int hca)
{
	if (cfg.ninj == 0)
		return IBV_WC_SUCCESS;
	uint64_t n = atomic_fetch_add(&wr_counter, 1) + 1;
	for (int i = 0; i < cfg.ninj; i++) {
		const struct inject *in = &cfg.inj[i];
		if ((in->nth && in->nth == n) || (!in->nth && in->hca == hca)) {
			switch (in->kind) {
			case INJ_REM_ACCESS:
				return IBV_WC_REM_ACCESS_ERR;
			case INJ_RETRY_EXC:
				return IBV_WC_RETRY_EXC_ERR;
			case INJ_LOC_PROT:
				return IBV_WC_LOC_PROT_ERR;
			default:
				break;
			}
		}
	}
	return IBV_WC_SUCCESS;
}

/* Copies between our iovecs and one remote range, to the end or the first fault. */
static enum ibv_wc_status vm_copy(pid_t pid, int write, struct iovec *loc, int nloc,
				  uint64_t raddr, uint64_t len)
{
	uint64_t done = 0;
	while (done < len) {
		struct iovec rem = {.iov_base = (void *)(uintptr_t)(raddr + done),
				    .iov_len = (size_t)(len - done)};
		ssize_t n = write ? process_vm_writev(pid, loc, (unsigned long)nloc, &rem, 1, 0)
				  : process_vm_readv(pid, loc, (unsigned long)nloc, &rem, 1, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ESRCH)
				return IBV_WC_RETRY_EXC_ERR;
			if (errno == EPERM) {
				fprintf(stderr, "softnic: process_vm_%s to pid %d: %s\n",
					write ? "writev" : "readv", (int)pid, strerror(errno));
				return IBV_WC_RETRY_EXC_ERR;
			}
			return IBV_WC_REM_ACCESS_ERR;
		}
		if (n == 0)
			return IBV_WC_REM_ACCESS_ERR;
		done += (uint64_t)n;
		/* Partial: drop what was copied from the local side and go on. */
		size_t skip = (size_t)n;
		while (nloc > 0 && skip >= loc->iov_len) {
			skip -= loc->iov_len;
			loc++;
			nloc--;
		}
		if (nloc > 0) {
			loc->iov_base = (char *)loc->iov_base + skip;
			loc->iov_len -= skip;
		}
	}
	return IBV_WC_SUCCESS;
}

/* True while the peer process that owns `peer` is the one that registered it. */
static int peer_alive(struct sn_qp *q, const struct sn_qp_ent *peer)
{
	if (q->peer_pidfd < 0 || q->peer_pidfd_qpn != q->dest_qpn) {
		if (q->peer_pidfd >= 0)
			close(q->peer_pidfd);
		q->peer_pidfd = (int)syscall(SYS_pidfd_open, peer->pid, 0);
		q->peer_pidfd_qpn = q->dest_qpn;
		q->peer_checked_ns = 0;
		if (q->peer_pidfd < 0)
			return 0;
		if (start_time_of(peer->pid) != peer->start_time) {
			close(q->peer_pidfd);
			q->peer_pidfd = -1;
			return 0;
		}
	}
	/* A pidfd turns readable when its process exits. While it lives, a dead peer shows
	 * as ESRCH from process_vm_*; the check only has to beat pid reuse, which takes
	 * far longer than a millisecond, so it is not paid on every WR. */
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if (now - q->peer_checked_ns < 1000000)
		return 1;
	struct pollfd pfd = {.fd = q->peer_pidfd, .events = POLLIN};
	if (poll(&pfd, 1, 0) != 0)
		return 0;
	q->peer_checked_ns = now;
	return 1;
}

/* Executes one RDMA WRITE or READ as an RC requester and its responder would. */
static enum ibv_wc_status execute(struct sn_qp *q, struct ibv_send_wr *wr, uint32_t *bytes)
{
	int write = wr->opcode == IBV_WR_RDMA_WRITE;
	struct iovec loc[SN_MAX_SGE];
	uint64_t len = 0;
	for (int i = 0; i < wr->num_sge; i++) {
		struct ibv_sge *s = &wr->sg_list[i];
		if (!(write && (wr->send_flags & IBV_SEND_INLINE))) {
			struct sn_mr_ent *m = mr_by_key(s->lkey);
			if (!m || m->pid != q->ent->pid || m->pd != q->pd_id || s->addr < m->addr ||
			    s->addr + s->length > m->addr + m->len || s->addr + s->length < s->addr ||
			    (!write && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
				return IBV_WC_LOC_PROT_ERR;
		}
		loc[i].iov_base = (void *)(uintptr_t)s->addr;
		if (!(write && (wr->send_flags & IBV_SEND_INLINE))) {
			struct sn_mr_ent *m = mr_by_key(s->lkey);
			if (m && m->shadow)
				loc[i].iov_base = (void *)(uintptr_t)(m->shadow + (s->addr - m->addr));
		}
		loc[i].iov_len = s->length;
		len += s->length;
	}
	*bytes = (uint32_t)len;
	if (cfg.down[q->hca])
		return IBV_WC_RETRY_EXC_ERR;
	/* The responder: its QP must exist, be connected back to us, and accept. */
	struct sn_qp_ent *peer = qp_by_num(q->dest_qpn);
	uint32_t ps = peer ? atomic_load_explicit(&peer->qp_state, memory_order_acquire) : 0;
	if (!peer || (ps != IBV_QPS_RTR + 1 && ps != IBV_QPS_RTS + 1) ||
	    atomic_load(&peer->dest_qpn) != q->qp.qp_num || cfg.down[peer->hca < SN_MAX_HCAS ? peer->hca : 0])
		return IBV_WC_RETRY_EXC_ERR;
	uint32_t need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	if (!(atomic_load(&peer->access) & need))
		return IBV_WC_REM_ACCESS_ERR;
	struct sn_mr_ent *r = mr_by_key(wr->wr.rdma.rkey);
	uint64_t ra = wr->wr.rdma.remote_addr;
	if (!r || r->pid != peer->pid || r->pd != peer->pd || !(r->access & need) || ra < r->addr ||
	    ra + len < ra || ra + len > r->addr + r->len)
		return IBV_WC_REM_ACCESS_ERR;
	if (len == 0)
		return IBV_WC_SUCCESS;
	if (r->shadow)
		ra = r->shadow + (ra - r->addr);
	if (peer->pid == q->ent->pid) {
		/* Loopback within one process: the same copy without the syscall. */
		uint64_t off = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			void *remote = (void *)(uintptr_t)(ra + off);
			if (write)
				memmove(remote, loc[i].iov_base, loc[i].iov_len);
			else
				memmove(loc[i].iov_base, remote, loc[i].iov_len);
			off += loc[i].iov_len;
		}
		return IBV_WC_SUCCESS;
	}
	if (!peer_alive(q, peer))
		return IBV_WC_RETRY_EXC_ERR;
	return vm_copy(peer->pid, write, loc, wr->num_sge, ra, len);
}

static void complete_send(struct sn_qp *q, struct ibv_send_wr *wr, enum ibv_wc_status st,
			  uint32_t bytes, uint32_t retire)
{
	struct sn_cqe e = {.qp = q, .retire = retire};
	e.wc.wr_id = wr->wr_id;
	e.wc.status = st;
	e.wc.opcode = wr->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	e.wc.byte_len = st == IBV_WC_SUCCESS ? bytes : 0;
	e.wc.qp_num = q->qp.qp_num;
	e.wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x5f;
	cq_push((struct sn_cq *)q->qp.send_cq, &e);
}

static int sn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sn_qp *q = (struct sn_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&q->lock);
	for (; wr; wr = wr->next) {
		if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR && qp->state != IBV_QPS_SQD) {
			rc = EINVAL;
			break;
		}
		if ((wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ) ||
		    wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge ||
		    (wr->num_sge > 0 && !wr->sg_list)) {
			rc = EINVAL;
			break;
		}
		if (wr->send_flags & IBV_SEND_INLINE) {
			uint64_t total = 0;
			for (int i = 0; i < wr->num_sge; i++)
				total += wr->sg_list[i].length;
			if (wr->opcode != IBV_WR_RDMA_WRITE || total > q->cap.max_inline_data) {
				rc = EINVAL;
				break;
			}
		}
		if (atomic_load(&q->sq_outstanding) >= q->cap.max_send_wr) {
			rc = ENOMEM;
			break;
		}
		atomic_fetch_add(&q->sq_outstanding, 1);
		q->unsignaled++;
		int signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
		if (qp->state == IBV_QPS_ERR) {
			complete_send(q, wr, IBV_WC_WR_FLUSH_ERR, 0, q->unsignaled);
			q->unsignaled = 0;
			continue;
		}
		uint32_t bytes = 0;
		enum ibv_wc_status st = injected(q->hca);
		if (st == IBV_WC_SUCCESS)
			st = execute(q, wr, &bytes);
		if (st != IBV_WC_SUCCESS) {
			complete_send(q, wr, st, 0, q->unsignaled);
			q->unsignaled = 0;
			set_state(q, IBV_QPS_ERR);
			flush_recvs(q);
			continue;
		}
		if (signaled) {
			complete_send(q, wr, IBV_WC_SUCCESS, bytes, q->unsignaled);
			q->unsignaled = 0;
		}
	}
	pthread_mutex_unlock(&q->lock);
	if (rc && bad)
		*bad = wr;
	return rc;
}

static int sn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sn_qp *q = (struct sn_qp *)qp;
	int rc = 0;
	pthread_mutex_lock(&q->lock);
	for (; wr; wr = wr->next) {
		if (qp->state == IBV_QPS_RESET || wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge > q->cap.max_recv_sge) {
			rc = EINVAL;
			break;
		}
		if (atomic_load(&q->rq_outstanding) >= q->cap.max_recv_wr) {
			rc = ENOMEM;
			break;
		}
		atomic_fetch_add(&q->rq_outstanding, 1);
		q->rq_ids[(q->rq_head + q->rq_count) % q->cap.max_recv_wr] = wr->wr_id;
		q->rq_count++;
		if (qp->state == IBV_QPS_ERR)
			flush_recvs(q);
	}
	pthread_mutex_unlock(&q->lock);
	if (rc && bad)
		*bad = wr;
	return rc;
}

static int sn_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)srq;
	*bad = wr;
	return EOPNOTSUPP;
}
