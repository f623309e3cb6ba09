// Issue 12, session 23: what would a target save by taking a batch's payloads in with few
// `recvmsg` calls? A stand-alone model of the serving shape over loopback TCP, not the engine.
//
// S sender threads (one process) each send batches of 32 writes of 32 KiB to one of R
// receiver processes (sender i to receiver i % R), one connection each, and wait for the
// batch's 32 statuses (16 bytes each, the low mark at all of them) before the next batch.
//   mode A, the engine's shape: [40-byte header, payload] x 32 in one sendmsg; the receiver
//          takes each payload with one recvmsg that also takes the next header if it is there,
//          holds statuses back (16 at most) and sends them before it would block.
//   mode B, headers first: [32 headers][32 payloads] in one sendmsg; the receiver reads the
//          headers, then the payloads with recvmsg calls over all 32 places at once.
// Sources and destinations cycle through 256 MiB buffers, as the benchmark's do.
//
//   gcc -O2 -pthread -o rb issue12-s23-recv-batched.c
//   ./rb A|B SENDERS RECEIVERS SECONDS     -> one JSON line
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REQ 32
#define SZ 32768
#define HDR 40
#define ST 16
#define BUF (256UL << 20)
#define PORT0 47100

static char mode;
static atomic_long batches_done;
static atomic_int stop;

static void die(const char *w) { perror(w); exit(1); }

static void read_exact(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) exit(0);
        p += r;
        n -= (size_t)r;
    }
}

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r <= 0) exit(0);
        p += r;
        n -= (size_t)r;
    }
}

// Consumes `got` bytes from iov[*first..], advancing it.
static void advance(struct iovec *iov, int *first, int n, size_t got) {
    while (got && *first < n) {
        if (got >= iov[*first].iov_len) {
            got -= iov[*first].iov_len;
            iov[*first].iov_len = 0;
            (*first)++;
        } else {
            iov[*first].iov_base = (char *)iov[*first].iov_base + got;
            iov[*first].iov_len -= got;
            got = 0;
        }
    }
}

static char *dst;
static atomic_long *recvs; // in a shared page: counted by every receiver process

static void *serve_a(void *arg) {
    int fd = (int)(intptr_t)arg;
    char hdr[HDR], held[16 * ST];
    int nheld = 0;
    size_t have = 0; // bytes of the next header already here
    long calls = 0, reqs = 0;
    for (;;) {
        if (have < HDR) read_exact(fd, hdr + have, HDR - have);
        uint64_t off;
        memcpy(&off, hdr + 8, 8);
        struct iovec iov[2] = {{dst + off, SZ}, {hdr, HDR}};
        int first = 0;
        have = 0;
        while (first == 0) {
            ssize_t r = recvmsg(fd, &(struct msghdr){.msg_iov = iov + first, .msg_iovlen = 2 - first}, MSG_DONTWAIT);
            if (r < 0 && errno == EAGAIN) {
                if (nheld) write_all(fd, held, (size_t)nheld * ST), nheld = 0;
                r = recvmsg(fd, &(struct msghdr){.msg_iov = iov + first, .msg_iovlen = 2 - first}, 0);
            }
            if (r <= 0) exit(0);
            calls++;
            size_t got = (size_t)r;
            advance(iov, &first, 2, got);
        }
        have = HDR - iov[1].iov_len;
        memset(held + nheld * ST, 0, ST);
        nheld++;
        if (nheld == 16 || have < HDR) write_all(fd, held, (size_t)nheld * ST), nheld = 0;
        if (++reqs % 4096 == 0) atomic_fetch_add(recvs, calls), calls = 0;
    }
}

static void *serve_b(void *arg) {
    int fd = (int)(intptr_t)arg;
    char hdrs[REQ * HDR], sts[REQ * ST];
    memset(sts, 0, sizeof sts);
    long calls = 0, n = 0;
    for (;;) {
        read_exact(fd, hdrs, sizeof hdrs);
        struct iovec iov[REQ];
        for (int i = 0; i < REQ; i++) {
            uint64_t off;
            memcpy(&off, hdrs + i * HDR + 8, 8);
            iov[i] = (struct iovec){dst + off, SZ};
        }
        int first = 0;
        while (first < REQ) {
            ssize_t r = recvmsg(fd, &(struct msghdr){.msg_iov = iov + first, .msg_iovlen = (size_t)(REQ - first)}, 0);
            if (r <= 0) exit(0);
            calls++;
            advance(iov, &first, REQ, (size_t)r);
        }
        write_all(fd, sts, sizeof sts);
        if (++n % 128 == 0) atomic_fetch_add(recvs, calls), calls = 0;
    }
}

static void receiver(int r) {
    dst = aligned_alloc(4096, BUF);
    memset(dst, 1, BUF);
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT0 + r), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 64)) die("listen");
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) die("accept");
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_t t;
        pthread_create(&t, NULL, mode == 'A' ? serve_a : serve_b, (void *)(intptr_t)fd);
    }
}

static char *src;
static int receivers;

static void *sender(void *arg) {
    int i = (int)(intptr_t)arg, fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, low = REQ * ST;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT0 + i % receivers), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    while (connect(fd, (void *)&a, sizeof a)) usleep(10000);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
    char hdrs[REQ * HDR], sts[REQ * ST];
    memset(hdrs, 0, sizeof hdrs);
    uint64_t next = (uint64_t)i * REQ * SZ;
    while (!atomic_load(&stop)) {
        struct iovec iov[2 * REQ + 1];
        int n = 0;
        if (mode == 'B') iov[n++] = (struct iovec){hdrs, sizeof hdrs};
        for (int k = 0; k < REQ; k++) {
            uint64_t off = next % BUF, size = SZ;
            next += SZ;
            memcpy(hdrs + k * HDR, &size, 8);
            memcpy(hdrs + k * HDR + 8, &off, 8);
            if (mode == 'A') iov[n++] = (struct iovec){hdrs + k * HDR, HDR};
            if (mode == 'B') continue;
            iov[n++] = (struct iovec){src + off, SZ};
        }
        if (mode == 'B')
            for (int k = 0; k < REQ; k++) {
                uint64_t off;
                memcpy(&off, hdrs + k * HDR + 8, 8);
                iov[n++] = (struct iovec){src + off, SZ};
            }
        int first = 0;
        while (first < n) {
            ssize_t r = sendmsg(fd, &(struct msghdr){.msg_iov = iov + first, .msg_iovlen = (size_t)(n - first)}, MSG_NOSIGNAL);
            if (r <= 0) die("sendmsg");
            advance(iov, &first, n, (size_t)r);
        }
        // As the engine waits: in poll until the low mark's bytes are all there (a recv that
        // has taken part of them is not woken by the rest while they are under the mark).
        poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, -1);
        read_exact(fd, sts, sizeof sts);
        atomic_fetch_add(&batches_done, 1);
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_of(pid_t p) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", p);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv) {
    if (argc != 5) return fprintf(stderr, "usage: %s A|B SENDERS RECEIVERS SECONDS\n", argv[0]), 2;
    mode = argv[1][0];
    int senders = atoi(argv[2]);
    receivers = atoi(argv[3]);
    double secs = atof(argv[4]);
    recvs = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (recvs == MAP_FAILED) die("mmap");
    pid_t kids[64];
    for (int r = 0; r < receivers; r++) {
        kids[r] = fork();
        if (kids[r] == 0) receiver(r), exit(0);
    }
    src = aligned_alloc(4096, BUF);
    memset(src, 2, BUF);
    usleep(300000);
    pthread_t t[64];
    for (int i = 0; i < senders; i++) pthread_create(&t[i], NULL, sender, (void *)(intptr_t)i);
    usleep(500000); // warm-up
    long b0 = atomic_load(&batches_done), r0 = atomic_load(recvs);
    double c0 = cpu_of(getpid()), k0 = 0, t0 = now();
    for (int r = 0; r < receivers; r++) k0 += cpu_of(kids[r]);
    usleep((useconds_t)(secs * 1e6));
    long b1 = atomic_load(&batches_done), r1 = atomic_load(recvs);
    double c1 = cpu_of(getpid()), k1 = 0, t1 = now();
    for (int r = 0; r < receivers; r++) k1 += cpu_of(kids[r]);
    double reqs = (double)(b1 - b0) * REQ;
    printf("{\"mode\": \"%c\", \"senders\": %d, \"receivers\": %d, \"gbps\": %.3f, "
           "\"batches_per_s\": %.0f, \"snd_cpu_us_per_req\": %.2f, \"rcv_cpu_us_per_req\": %.2f, "
           "\"recvmsg_per_req\": %.2f}\n",
           mode, senders, receivers, reqs * SZ / (t1 - t0) / 1e9, (double)(b1 - b0) / (t1 - t0),
           (c1 - c0) * 1e6 / reqs, (k1 - k0) * 1e6 / reqs, (double)(r1 - r0) / reqs);
    fflush(stdout);
    atomic_store(&stop, 1);
    for (int r = 0; r < receivers; r++) kill(kids[r], SIGKILL), waitpid(kids[r], NULL, 0);
    _exit(0);
}
