// The serving shape's memory ceiling, with no sockets: what a host's CPUs and memory move when
// every payload byte is copied twice, as loopback TCP copies it (the sender's bytes into the
// kernel's buffers, those into the receiver's memory).
//
//   cc -O2 -pthread -static -o copy-ceiling scripts/lib/copy-ceiling.c   # or: scripts/bench-device.sh prepare copy-ceiling
//   ./copy-ceiling [SECONDS]        # one JSON line per thread count
//
// Each thread copies 32 KiB pieces (the serving shape's requests) from its own 256 MiB
// source, walked in order, into a 4 MiB ring (the socket buffers, reused while still in
// cache), and from the ring into its own 256 MiB destination. "payload_gbps" counts each
// byte once, as the serving figures do; "copy_gbps" counts both copies.
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PIECE (32u << 10)
#define BIG (256u << 20)
#define RING (4u << 20)

static atomic_int go, stop, ready;

struct job {
    uint64_t pieces;
};

static void *run(void *arg) {
    struct job *j = arg;
    char *src = aligned_alloc(4096, BIG), *dst = aligned_alloc(4096, BIG),
         *ring = aligned_alloc(4096, RING);
    memset(src, 1, BIG);
    memset(dst, 2, BIG);
    memset(ring, 3, RING);
    atomic_fetch_add(&ready, 1);
    while (!atomic_load(&go)) {
        sched_yield();
    }
    uint64_t n = 0;
    size_t off = 0, r = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        memcpy(ring + r, src + off, PIECE);
        memcpy(dst + off, ring + r, PIECE);
        off = (off + PIECE) % BIG;
        r = (r + PIECE) % RING;
        n++;
    }
    j->pieces = n;
    free(src);
    free(dst);
    free(ring);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int counts[] = {1, 2, 4, 8, 10, 12, 16, 20};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        int t = counts[c];
        if (t > 2 * cpus) break;
        pthread_t th[32];
        struct job jobs[32];
        atomic_store(&go, 0);
        atomic_store(&stop, 0);
        atomic_store(&ready, 0);
        for (int i = 0; i < t; i++) pthread_create(&th[i], NULL, run, &jobs[i]);
        while (atomic_load(&ready) < t) usleep(1000); // the buffers touched first
        double start = now();
        atomic_store(&go, 1);
        usleep((useconds_t)(secs * 1e6));
        atomic_store(&stop, 1);
        double took = now() - start;
        uint64_t pieces = 0;
        for (int i = 0; i < t; i++) {
            pthread_join(th[i], NULL);
            pieces += jobs[i].pieces;
        }
        double payload = pieces * (double)PIECE / took / 1e9;
        printf("{\"threads\": %d, \"cpus\": %ld, \"payload_gbps\": %.2f, \"copy_gbps\": %.2f}\n", t, cpus,
               payload, 2 * payload);
        fflush(stdout);
    }
    return 0;
}
