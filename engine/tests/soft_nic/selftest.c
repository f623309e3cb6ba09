/*
 * Self-test and benchmark of the soft NIC (the software stand-in for libibverbs.so.1),
 * written as any verbs program is: against the real rdma-core headers, linked against
 * the real libibverbs, and run with LD_LIBRARY_PATH pointing at the soft NIC.
 *
 * Every mode forks into two processes (initiator = parent, target = child) that
 * exchange QP numbers, rkeys and addresses over a socketpair, then move bytes with
 * RDMA WRITE and READ. Exit status 0 = pass; failures print "FAIL: ..." and exit 1.
 *
 *   selftest xfer N          WRITE/READ both ways over N HCAs, bytes verified
 *   selftest neg CASE        one negative case (see neg_case)
 *   selftest threads         four threads post on one QP while another polls
 *   selftest states          QP state machine and port/GID contract (one process)
 *   selftest list            each HCA and its port state
 *   selftest bench SIZE N [SPAN]  GB/s of N RDMA WRITEs of SIZE bytes vs a raw
 *                            process_vm_writev loop between the same processes, both
 *                            cycling over SPAN bytes (default SIZE: one cache-hot block)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_HCAS 8
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static const char *role = "initiator";

#define CHECK(cond, ...)                                                              \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "FAIL (%s, line %d): ", role, __LINE__);      \
			fprintf(stderr, __VA_ARGS__);                                 \
			fprintf(stderr, "\n");                                        \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

struct opts {
	size_t len;
	int mr_access;
	int qp_access;
	unsigned max_send_wr;
	enum ibv_qp_state upto; /* how far to bring the QP */
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
	size_t len;
	int hca;
};

struct info {
	uint32_t qpn, rkey;
	uint64_t addr, len;
	int32_t pid;
};

struct pair {
	int nhcas;
	int sock;
	pid_t child;
	struct side s[MAX_HCAS];
	struct info peer[MAX_HCAS];
};

static void send_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t k = write(fd, p, n);
		CHECK(k > 0, "socket write: %s", strerror(errno));
		p = (const char *)p + k;
		n -= (size_t)k;
	}
}

static int recv_all(int fd, void *p, size_t n)
{
	while (n) {
		ssize_t k = read(fd, p, n);
		if (k <= 0)
			return -1;
		p = (char *)p + k;
		n -= (size_t)k;
	}
	return 0;
}

static unsigned char pattern(size_t i, unsigned seed)
{
	return (unsigned char)(i * 131 + seed * 7 + (i >> 8) + (i >> 16));
}

static void fill(unsigned char *b, size_t off, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		b[off + i] = pattern(i, seed);
}

static int matches(const unsigned char *b, size_t off, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		if (b[off + i] != pattern(i, seed))
			return 0;
	return 1;
}

static void setup(struct side *s, int hca, const struct opts *o)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > hca, "need HCA %d, the library lists %d", hca, n);
	s->ctx = ibv_open_device(list[hca]);
	CHECK(s->ctx, "ibv_open_device(%s)", ibv_get_device_name(list[hca]));
	ibv_free_device_list(list);
	s->hca = hca;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 1024, NULL, NULL, 0);
	CHECK(s->pd && s->cq, "pd/cq");
	struct ibv_qp_init_attr qa = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = {.max_send_wr = o->max_send_wr, .max_recv_wr = 16, .max_send_sge = 4,
			.max_recv_sge = 1, .max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
	};
	s->qp = ibv_create_qp(s->pd, &qa);
	CHECK(s->qp, "ibv_create_qp: %s", strerror(errno));
	s->len = o->len;
	s->buf = aligned_alloc(4096, (o->len + 4095) / 4096 * 4096);
	memset(s->buf, 0, o->len);
	s->mr = ibv_reg_mr(s->pd, s->buf, o->len, o->mr_access);
	CHECK(s->mr, "ibv_reg_mr: %s", strerror(errno));
}

static struct info info_of(const struct side *s)
{
	struct info i = {s->qp->qp_num, s->mr->rkey, (uintptr_t)s->buf, s->len, getpid()};
	return i;
}

static int to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct side *s, uint32_t dest_qpn)
{
	struct ibv_port_attr port;
	CHECK(ibv_query_port(s->ctx, 1, &port) == 0, "ibv_query_port");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = port.active_mtu,
		.dest_qp_num = dest_qpn,
		.max_dest_rd_atomic = 16,
		.min_rnr_timer = 12,
		.ah_attr = {.is_global = 1, .port_num = 1,
			    .grh = {.sgid_index = 1, .hop_limit = 16}},
	};
	CHECK(ibv_query_gid(s->ctx, 1, 1, &a.ah_attr.grh.dgid) == 0, "ibv_query_gid");
	return ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				.rnr_retry = 7, .max_rd_atomic = 16};
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void bring_up(struct side *s, uint32_t dest_qpn, const struct opts *o)
{
	if (o->upto >= IBV_QPS_INIT)
		CHECK(to_init(s->qp, o->qp_access) == 0, "RESET->INIT");
	if (o->upto >= IBV_QPS_RTR)
		CHECK(to_rtr(s, dest_qpn) == 0, "INIT->RTR");
	if (o->upto >= IBV_QPS_RTS)
		CHECK(to_rts(s->qp) == 0, "RTR->RTS");
}

static int post(struct side *s, enum ibv_wr_opcode op, uint64_t laddr, uint32_t lkey, uint32_t len,
		uint64_t raddr, uint32_t rkey, int signaled, uint64_t wr_id)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = signaled ? IBV_SEND_SIGNALED : 0};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(s->qp, &wr, &bad);
	CHECK(rc == 0 || bad == &wr, "post failed (%d) without naming the bad WR", rc);
	return rc;
}

static struct ibv_wc wait_wc(struct side *s)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		CHECK(t.tv_sec - t0.tv_sec < 10, "no completion within 10 s");
	}
}

static void expect_wc(struct side *s, uint64_t wr_id, enum ibv_wc_status st)
{
	struct ibv_wc wc = wait_wc(s);
	CHECK(wc.wr_id == wr_id && wc.status == st, "completion wr_id %llu status '%s', want %llu '%s'",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
	      (unsigned long long)wr_id, ibv_wc_status_str(st));
}

static void expect_no_wc(struct side *s)
{
	struct ibv_wc wc;
	int n = ibv_poll_cq(s->cq, 1, &wc);
	CHECK(n == 0, "unexpected completion (wr_id %llu, '%s')", (unsigned long long)wc.wr_id,
	      n > 0 ? ibv_wc_status_str(wc.status) : "?");
}

/* ---------------------------------------------------------------- the target */

enum cmd { C_VERIFY = 'v', C_FILL = 'f', C_WRITE = 'w', C_DESTROY = 'd', C_EXIT = 'x', C_PAUSE = 'p' };

struct msg {
	uint8_t cmd;
	uint8_t hca;
	uint32_t seed;
	uint64_t off, len;
};

static void serve(struct pair *p)
{
	role = "target";
	struct msg m;
	while (recv_all(p->sock, &m, sizeof(m)) == 0) {
		struct side *s = &p->s[m.hca];
		int32_t ok = 1;
		switch (m.cmd) {
		case C_VERIFY:
			ok = matches(s->buf, m.off, m.len, m.seed);
			break;
		case C_FILL:
			fill(s->buf, m.off, m.len, m.seed);
			break;
		case C_WRITE: {
			/* Target-initiated WRITE into the initiator's buffer. */
			fill(s->buf, m.off, m.len, m.seed);
			post(s, IBV_WR_RDMA_WRITE, (uintptr_t)s->buf + m.off, s->mr->lkey,
			     (uint32_t)m.len, p->peer[m.hca].addr + m.off, p->peer[m.hca].rkey, 1, 77);
			struct ibv_wc wc = wait_wc(s);
			ok = wc.status == IBV_WC_SUCCESS ? 1 : -(int32_t)wc.status;
			break;
		}
		case C_DESTROY:
			ok = ibv_destroy_qp(s->qp) == 0;
			break;
		case C_PAUSE:
			send_all(p->sock, &ok, sizeof(ok));
			for (;;)
				pause();
		case C_EXIT:
			_exit(0);
		}
		send_all(p->sock, &ok, sizeof(ok));
	}
	_exit(0);
}

static int32_t ask(struct pair *p, enum cmd c, int hca, uint64_t off, uint64_t len, uint32_t seed)
{
	struct msg m = {.cmd = (uint8_t)c, .hca = (uint8_t)hca, .seed = seed, .off = off, .len = len};
	int32_t ok = 0;
	send_all(p->sock, &m, sizeof(m));
	CHECK(recv_all(p->sock, &ok, sizeof(ok)) == 0, "target gone while asked '%c'", c);
	return ok;
}

/* Forks the target; both sides set up `nhcas` HCAs and connect. */
static void start_pair(struct pair *p, int nhcas, const struct opts *mine, const struct opts *theirs)
{
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
	p->nhcas = nhcas;
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	int child = pid == 0;
	if (child)
		role = "target";
	p->sock = child ? sv[1] : sv[0];
	close(child ? sv[0] : sv[1]);
	const struct opts *o = child ? theirs : mine;
	struct info mine_info[MAX_HCAS];
	for (int i = 0; i < nhcas; i++) {
		setup(&p->s[i], i, o);
		mine_info[i] = info_of(&p->s[i]);
	}
	send_all(p->sock, mine_info, sizeof(mine_info[0]) * (size_t)nhcas);
	CHECK(recv_all(p->sock, p->peer, sizeof(p->peer[0]) * (size_t)nhcas) == 0, "peer info");
	for (int i = 0; i < nhcas; i++)
		bring_up(&p->s[i], p->peer[i].qpn, o);
	char ready = 'R';
	send_all(p->sock, &ready, 1);
	CHECK(recv_all(p->sock, &ready, 1) == 0, "peer not ready");
	if (child)
		serve(p);
	p->child = pid;
}

static void stop_pair(struct pair *p)
{
	struct msg m = {.cmd = C_EXIT};
	send_all(p->sock, &m, sizeof(m));
	int st = 0;
	waitpid(p->child, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "target failed (status %d)", st);
}

static const struct opts default_opts = {
	.len = (1 << 20) + 123, .mr_access = ALL_ACCESS, .qp_access = ALL_ACCESS,
	.max_send_wr = 64, .upto = IBV_QPS_RTS};

/* ---------------------------------------------------------------- modes */

static int mode_xfer(int nhcas)
{
	struct pair p;
	start_pair(&p, nhcas, &default_opts, &default_opts);
	for (int h = 0; h < nhcas; h++) {
		struct side *s = &p.s[h];
		struct info *r = &p.peer[h];
		uint64_t n = s->len;
		/* One WRITE of the whole region. */
		fill(s->buf, 0, n, 10 + h);
		post(s, IBV_WR_RDMA_WRITE, (uintptr_t)s->buf, s->mr->lkey, (uint32_t)n, r->addr,
		     r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_SUCCESS);
		CHECK(ask(&p, C_VERIFY, h, 0, n, 10 + h) == 1, "hca %d: WRITE landed wrong bytes", h);
		/* Eight unsignaled WRITEs then a signaled one: one completion. */
		fill(s->buf, 0, n, 20 + h);
		uint64_t chunk = n / 9;
		for (int k = 0; k < 9; k++) {
			uint64_t len = k == 8 ? n - 8 * chunk : chunk;
			post(s, IBV_WR_RDMA_WRITE, (uintptr_t)s->buf + k * chunk, s->mr->lkey,
			     (uint32_t)len, r->addr + k * chunk, r->rkey, k == 8, 100 + k);
		}
		expect_wc(s, 108, IBV_WC_SUCCESS);
		expect_no_wc(s);
		CHECK(ask(&p, C_VERIFY, h, 0, n, 20 + h) == 1, "hca %d: batched WRITEs wrong", h);
		/* A WRITE gathering two SGEs. */
		fill(s->buf, 0, 8192, 30 + h);
		struct ibv_sge sge[2] = {{(uintptr_t)s->buf, 4096, s->mr->lkey},
					 {(uintptr_t)s->buf + 4096, 4096, s->mr->lkey}};
		struct ibv_send_wr wr = {.wr_id = 3, .sg_list = sge, .num_sge = 2,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
		wr.wr.rdma.remote_addr = r->addr + 5000;
		wr.wr.rdma.rkey = r->rkey;
		struct ibv_send_wr *bad;
		CHECK(ibv_post_send(s->qp, &wr, &bad) == 0, "post 2-SGE WRITE");
		expect_wc(s, 3, IBV_WC_SUCCESS);
		CHECK(ask(&p, C_VERIFY, h, 5000, 8192, 30 + h) == 1, "hca %d: 2-SGE WRITE wrong", h);
		/* READ the target's bytes back into a cleared buffer. */
		CHECK(ask(&p, C_FILL, h, 0, n, 40 + h) == 1, "fill");
		memset(s->buf, 0, n);
		post(s, IBV_WR_RDMA_READ, (uintptr_t)s->buf, s->mr->lkey, (uint32_t)n, r->addr,
		     r->rkey, 1, 4);
		struct ibv_wc wc = wait_wc(&p.s[h]);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == n,
		      "READ completion '%s' opcode %d bytes %u", ibv_wc_status_str(wc.status),
		      wc.opcode, wc.byte_len);
		CHECK(matches(s->buf, 0, n, 40 + h), "hca %d: READ returned wrong bytes", h);
		/* The other direction: the target WRITEs into our region. */
		memset(s->buf, 0, n);
		CHECK(ask(&p, C_WRITE, h, 0, n, 50 + h) == 1, "target-initiated WRITE failed");
		CHECK(matches(s->buf, 0, n, 50 + h), "hca %d: target's WRITE landed wrong bytes", h);
		printf("hca %s: WRITE, batched WRITE, 2-SGE WRITE, READ, reverse WRITE verified (%llu bytes)\n",
		       ibv_get_device_name(s->ctx->device), (unsigned long long)n);
	}
	stop_pair(&p);
	return 0;
}

/* `allowed` succeeds on the target's region, `denied` gets REM_ACCESS_ERR. */
static void allowed_then_denied(struct side *s, const struct info *r, enum ibv_wr_opcode allowed,
				enum ibv_wr_opcode denied)
{
	post(s, allowed, (uintptr_t)s->buf, s->mr->lkey, 4096, r->addr, r->rkey, 1, 1);
	expect_wc(s, 1, IBV_WC_SUCCESS);
	post(s, denied, (uintptr_t)s->buf, s->mr->lkey, 4096, r->addr, r->rkey, 1, 2);
	expect_wc(s, 2, IBV_WC_REM_ACCESS_ERR);
}

static int neg_case(const char *name)
{
	struct opts mine = default_opts, theirs = default_opts;
	struct pair p;
	if (!strcmp(name, "no_remote_write"))
		theirs.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	else if (!strcmp(name, "no_remote_read"))
		theirs.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	else if (!strcmp(name, "qp_no_remote_write"))
		theirs.qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	else if (!strcmp(name, "read_into_readonly"))
		mine.mr_access = IBV_ACCESS_REMOTE_READ;
	else if (!strcmp(name, "not_rts"))
		mine.upto = IBV_QPS_RTR;
	else if (!strcmp(name, "peer_not_ready"))
		theirs.upto = IBV_QPS_INIT;
	else if (!strcmp(name, "max_send_wr"))
		mine.max_send_wr = 4;
	start_pair(&p, 1, &mine, &theirs);
	struct side *s = &p.s[0];
	struct info *r = &p.peer[0];
	uint64_t b = (uintptr_t)s->buf;
	uint32_t lk = s->mr->lkey;
	enum ibv_wr_opcode W = IBV_WR_RDMA_WRITE, R = IBV_WR_RDMA_READ;

	if (!strcmp(name, "bad_rkey")) {
		post(s, W, b, lk, 4096, r->addr, r->rkey ^ 0x5a5a00, 1, 1);
		expect_wc(s, 1, IBV_WC_REM_ACCESS_ERR);
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 2);
		expect_wc(s, 2, IBV_WC_WR_FLUSH_ERR);
	} else if (!strcmp(name, "oob")) {
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_SUCCESS);
		post(s, W, b, lk, 100, r->addr + r->len - 10, r->rkey, 1, 2);
		expect_wc(s, 2, IBV_WC_REM_ACCESS_ERR);
	} else if (!strcmp(name, "oob_below")) {
		post(s, R, b, lk, 100, r->addr - 1, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_REM_ACCESS_ERR);
	} else if (!strcmp(name, "no_remote_write") || !strcmp(name, "qp_no_remote_write")) {
		allowed_then_denied(s, r, R, W);
	} else if (!strcmp(name, "no_remote_read")) {
		allowed_then_denied(s, r, W, R);
	} else if (!strcmp(name, "bad_lkey")) {
		post(s, W, b, lk + 999, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_LOC_PROT_ERR);
	} else if (!strcmp(name, "lkey_oob")) {
		post(s, W, b + s->len - 8, lk, 16, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_LOC_PROT_ERR);
	} else if (!strcmp(name, "read_into_readonly")) {
		post(s, R, b, lk, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_LOC_PROT_ERR);
	} else if (!strcmp(name, "not_rts")) {
		CHECK(post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 1) == EINVAL,
		      "post in RTR must fail with EINVAL");
		expect_no_wc(s);
		CHECK(to_rts(s->qp) == 0, "RTR->RTS");
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 2);
		expect_wc(s, 2, IBV_WC_SUCCESS);
	} else if (!strcmp(name, "peer_not_ready")) {
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_RETRY_EXC_ERR);
	} else if (!strcmp(name, "peer_killed")) {
		fill(s->buf, 0, 4096, 9);
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_SUCCESS);
		CHECK(ask(&p, C_VERIFY, 0, 0, 4096, 9) == 1, "first WRITE wrong");
		CHECK(ask(&p, C_PAUSE, 0, 0, 0, 0) == 1, "pause");
		kill(p.child, SIGKILL);
		int st;
		waitpid(p.child, &st, 0);
		CHECK(WIFSIGNALED(st), "target not killed");
		struct ibv_sge sge[4];
		struct ibv_send_wr wr[4], *bad;
		for (int k = 0; k < 4; k++) {
			sge[k] = (struct ibv_sge){b, 4096, lk};
			wr[k] = (struct ibv_send_wr){.wr_id = 10 + k, .sg_list = &sge[k], .num_sge = 1,
						     .opcode = W, .send_flags = IBV_SEND_SIGNALED,
						     .next = k < 3 ? &wr[k + 1] : NULL};
			wr[k].wr.rdma.remote_addr = r->addr;
			wr[k].wr.rdma.rkey = r->rkey;
		}
		CHECK(ibv_post_send(s->qp, wr, &bad) == 0, "post batch");
		expect_wc(s, 10, IBV_WC_RETRY_EXC_ERR);
		for (int k = 1; k < 4; k++)
			expect_wc(s, 10 + k, IBV_WC_WR_FLUSH_ERR);
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(s->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR,
		      "QP not in ERR after an error completion");
		printf("peer killed: RETRY_EXC_ERR then 3 x FLUSH_ERR\n");
		return 0; /* the target is gone: no stop_pair */
	} else if (!strcmp(name, "peer_qp_destroyed")) {
		CHECK(ask(&p, C_DESTROY, 0, 0, 0, 0) == 1, "destroy");
		post(s, W, b, lk, 4096, r->addr, r->rkey, 1, 1);
		expect_wc(s, 1, IBV_WC_RETRY_EXC_ERR);
	} else if (!strcmp(name, "max_send_wr")) {
		/* 4 slots: 3 unsignaled + 1 signaled fill them until that completion is polled. */
		for (int k = 0; k < 4; k++)
			CHECK(post(s, W, b, lk, 64, r->addr, r->rkey, k == 3, k) == 0, "post %d", k);
		CHECK(post(s, W, b, lk, 64, r->addr, r->rkey, 1, 9) == ENOMEM,
		      "a 5th WR on a full send queue must fail with ENOMEM");
		expect_wc(s, 3, IBV_WC_SUCCESS);
		for (int k = 0; k < 4; k++)
			CHECK(post(s, W, b, lk, 64, r->addr, r->rkey, 1, 20 + k) == 0,
			      "polling must free the send queue (post %d)", k);
		CHECK(post(s, W, b, lk, 64, r->addr, r->rkey, 1, 30) == ENOMEM, "full again");
		for (int k = 0; k < 4; k++)
			expect_wc(s, 20 + k, IBV_WC_SUCCESS);
	} else if (!strcmp(name, "inject")) {
		/* Run with SOFTNIC_FAIL=rem_access@2. */
		for (int k = 1; k <= 3; k++)
			post(s, W, b, lk, 64, r->addr, r->rkey, 1, k);
		expect_wc(s, 1, IBV_WC_SUCCESS);
		expect_wc(s, 2, IBV_WC_REM_ACCESS_ERR);
		expect_wc(s, 3, IBV_WC_WR_FLUSH_ERR);
	} else {
		CHECK(0, "unknown case %s", name);
	}
	expect_no_wc(s);
	stop_pair(&p);
	printf("case %s: ok\n", name);
	return 0;
}

/* ---------------------------------------------------------------- threads */

#define T_POSTERS 4
#define T_PER_THREAD 2000
#define T_BLOCK 4096

struct thread_arg {
	struct side *s;
	struct info *r;
	int t;
	int full; /* ENOMEM answers seen */
};

static void *poster(void *p)
{
	struct thread_arg *a = p;
	for (int i = 0; i < T_PER_THREAD; i++) {
		uint64_t off = (uint64_t)a->t * T_BLOCK;
		int rc;
		while ((rc = post(a->s, IBV_WR_RDMA_WRITE, (uintptr_t)a->s->buf + off, a->s->mr->lkey,
				  T_BLOCK, a->r->addr + off, a->r->rkey, 1,
				  (uint64_t)a->t << 32 | (uint64_t)i)) == ENOMEM) {
			a->full++;
			sched_yield();
		}
		CHECK(rc == 0, "thread %d post %d: %d", a->t, i, rc);
	}
	return NULL;
}

/* Four threads post on one QP while this thread polls its CQ. */
static int mode_threads(void)
{
	struct opts o = default_opts;
	o.max_send_wr = 32;
	struct pair p;
	start_pair(&p, 1, &o, &o);
	struct side *s = &p.s[0];
	for (int t = 0; t < T_POSTERS; t++)
		fill(s->buf, (size_t)t * T_BLOCK, T_BLOCK, 60 + t);
	pthread_t th[T_POSTERS];
	struct thread_arg args[T_POSTERS];
	for (int t = 0; t < T_POSTERS; t++) {
		args[t] = (struct thread_arg){s, &p.peer[0], t, 0};
		CHECK(pthread_create(&th[t], NULL, poster, &args[t]) == 0, "pthread_create");
	}
	int next[T_POSTERS] = {0};
	for (int done = 0; done < T_POSTERS * T_PER_THREAD;) {
		struct ibv_wc wc[8];
		int n = ibv_poll_cq(s->cq, 8, wc);
		CHECK(n >= 0, "poll");
		for (int k = 0; k < n; k++) {
			int t = (int)(wc[k].wr_id >> 32), i = (int)(uint32_t)wc[k].wr_id;
			CHECK(wc[k].status == IBV_WC_SUCCESS, "'%s'", ibv_wc_status_str(wc[k].status));
			CHECK(t < T_POSTERS && i == next[t], "thread %d: completion %d, want %d", t, i,
			      next[t]);
			next[t]++;
		}
		done += n;
	}
	int full = 0;
	for (int t = 0; t < T_POSTERS; t++) {
		pthread_join(th[t], NULL);
		full += args[t].full;
		CHECK(ask(&p, C_VERIFY, 0, (uint64_t)t * T_BLOCK, T_BLOCK, 60 + t) == 1,
		      "thread %d's bytes", t);
	}
	expect_no_wc(s);
	/* Every slot is free again. */
	for (unsigned k = 0; k < o.max_send_wr; k++)
		CHECK(post(s, IBV_WR_RDMA_WRITE, (uintptr_t)s->buf, s->mr->lkey, 64, p.peer[0].addr,
			   p.peer[0].rkey, k + 1 == o.max_send_wr, 999) == 0,
		      "send queue not fully free after all completions were polled");
	expect_wc(s, 999, IBV_WC_SUCCESS);
	stop_pair(&p);
	printf("threads: %d completions in order per thread, send queue full %d times\n",
	       T_POSTERS * T_PER_THREAD, full);
	return 0;
}

/* QP state machine and port contract, one process. */
static int mode_states(void)
{
	struct side s;
	setup(&s, 0, &default_opts);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) != 0, "RESET->RTR must fail");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1};
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX) != 0,
	      "RESET->INIT without access flags must fail");
	a.port_num = 2;
	a.qp_access_flags = ALL_ACCESS;
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
					      IBV_QP_ACCESS_FLAGS) != 0,
	      "port 2 must be refused");
	CHECK(to_init(s.qp, ALL_ACCESS) == 0, "RESET->INIT");
	CHECK(to_rts(s.qp) != 0, "INIT->RTS must fail");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096};
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU) != 0,
	      "INIT->RTR without AV/DEST_QPN must fail");
	CHECK(to_rtr(&s, 0x12345) == 0, "INIT->RTR");
	CHECK(to_rts(s.qp) == 0, "RTR->RTS");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) == 0, "->ERR");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RESET};
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) == 0, "->RESET");
	/* Port and GID contract. */
	struct ibv_port_attr port;
	CHECK(ibv_query_port(s.ctx, 1, &port) == 0 && port.state == IBV_PORT_ACTIVE &&
		      port.link_layer == IBV_LINK_LAYER_ETHERNET && port.active_mtu == IBV_MTU_4096 &&
		      port.gid_tbl_len == 2 && port.lid == 0,
	      "port 1 attributes");
	union ibv_gid g;
	CHECK(ibv_query_gid(s.ctx, 1, 1, &g) == 0 && g.raw[10] == 0xff && g.raw[11] == 0xff &&
		      g.raw[12] == 127 && g.raw[14] == 1 && g.raw[15] == 1,
	      "gid 1 is ::ffff:127.0.1.1");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(s.ctx, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2,
	      "gid 1 is RoCE v2");
	CHECK(ibv_query_gid_ex(s.ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V1 &&
		      ge.gid.raw[0] == 0xfe && ge.gid.raw[15] == 1,
	      "gid 0 is fe80::1, RoCE v1");
	CHECK(ibv_dealloc_pd(s.pd) == EBUSY, "a PD with a QP and MR must not be freed");
	CHECK(ibv_destroy_qp(s.qp) == 0 && ibv_dereg_mr(s.mr) == 0 && ibv_dealloc_pd(s.pd) == 0 &&
		      ibv_destroy_cq(s.cq) == 0 && ibv_close_device(s.ctx) == 0,
	      "teardown");
	printf("states: ok\n");
	return 0;
}

/* Prints each HCA with its port state, for the SOFTNIC_DOWN test. */
static int mode_list(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list, "ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n; i++) {
		struct ibv_context *c = ibv_open_device(list[i]);
		struct ibv_port_attr port;
		CHECK(c && ibv_query_port(c, 1, &port) == 0, "open/query %d", i);
		printf("%s %s\n", ibv_get_device_name(list[i]), ibv_port_state_str(port.state));
		ibv_close_device(c);
	}
	ibv_free_device_list(list);
	return 0;
}

/* ---------------------------------------------------------------- bench */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int mode_bench(size_t size, long iters, size_t span)
{
	/* Block i goes to offset (i mod blocks) * size of a span-sized buffer: a span
	 * larger than the caches measures the copy from and to memory, as an engine
	 * cycling over a batch of distinct blocks does. */
	size_t blocks = span / size ? span / size : 1;
	struct opts o = default_opts;
	o.len = blocks * size;
	o.max_send_wr = 256;
	struct pair p;
	start_pair(&p, 1, &o, &o);
	struct side *s = &p.s[0];
	struct info *r = &p.peer[0];
	fill(s->buf, 0, o.len, 1);
	double best_raw = 0, best_nic = 0;
	for (int round = 0; round < 3; round++) {
		/* Raw: the same bytes to the same place, one syscall per block. */
		double t0 = now();
		for (long i = 0; i < iters; i++) {
			size_t off = (size_t)i % blocks * size;
			struct iovec l = {s->buf + off, size},
				     rem = {(void *)(uintptr_t)(r->addr + off), size};
			CHECK(process_vm_writev(p.child, &l, 1, &rem, 1, 0) == (ssize_t)size,
			      "process_vm_writev: %s", strerror(errno));
		}
		double raw = (double)size * (double)iters / (now() - t0) / 1e9;
		/* Soft NIC: signaled WRITEs, 16 in flight, polled in batches. */
		t0 = now();
		long posted = 0, done = 0;
		struct ibv_wc wc[16];
		while (done < iters) {
			for (; posted < iters && posted - done < 16; posted++) {
				size_t off = (size_t)posted % blocks * size;
				CHECK(post(s, IBV_WR_RDMA_WRITE, (uintptr_t)s->buf + off, s->mr->lkey,
					   (uint32_t)size, r->addr + off, r->rkey, 1, (uint64_t)posted) == 0,
				      "post");
			}
			int n = ibv_poll_cq(s->cq, 16, wc);
			for (int k = 0; k < n; k++)
				CHECK(wc[k].status == IBV_WC_SUCCESS, "bench WR '%s'",
				      ibv_wc_status_str(wc[k].status));
			done += n;
		}
		double nic = (double)size * (double)iters / (now() - t0) / 1e9;
		if (raw > best_raw)
			best_raw = raw;
		if (nic > best_nic)
			best_nic = nic;
	}
	size_t written = (size_t)iters < blocks ? (size_t)iters * size : o.len;
	CHECK(ask(&p, C_VERIFY, 0, 0, written, 1) == 1, "bench bytes wrong");
	printf("size %zu span %zu: raw process_vm_writev %.2f GB/s, soft NIC RDMA WRITE %.2f GB/s, ratio %.1f%%\n",
	       size, o.len, best_raw, best_nic, 100.0 * best_nic / best_raw);
	stop_pair(&p);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "xfer"))
		return mode_xfer(atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "neg"))
		return neg_case(argv[2]);
	if (argc >= 2 && !strcmp(argv[1], "threads"))
		return mode_threads();
	if (argc >= 2 && !strcmp(argv[1], "states"))
		return mode_states();
	if (argc >= 2 && !strcmp(argv[1], "list"))
		return mode_list();
	if (argc >= 4 && !strcmp(argv[1], "bench"))
		return mode_bench((size_t)atol(argv[2]), atol(argv[3]),
				  (size_t)atol(argc >= 5 ? argv[4] : argv[2]));
	fprintf(stderr, "usage: selftest xfer N | neg CASE | threads | states | list | bench SIZE ITERS [SPAN]\n");
	return 2;
}
