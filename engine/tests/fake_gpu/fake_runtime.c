/*
 * A FAKE GPU runtime for CPU-only tests: exports the CUDA or MUSA runtime
 * symbols the engine loads (prefix chosen with -DPREFIX=cuda or musa) over
 * host memory. "Device" allocations are mapped PROT_NONE, so any access that
 * bypasses the runtime's copy functions faults: a test passes only if the
 * engine stages device memory through the runtime. Copies are counted.
 * PointerGetAttributes writes 88 bytes, as CUDA 13's larger struct does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define API(name) CAT(PREFIX, name)

typedef struct { uintptr_t base; size_t len; int device; } region_t;
static region_t regions[256];
static int nregions;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int current_device;
static uint64_t copies, async_copies, host_allocs;
/* Pinned allocations alive now, and the most ever alive at once. */
static uint64_t host_live, host_peak;

static int devices(void) {
    const char *n = getenv("FAKE_GPU_DEVICES");
    return n ? atoi(n) : 2;
}

static region_t *find(uintptr_t p) {
    for (int i = 0; i < nregions; i++)
        if (p >= regions[i].base && p < regions[i].base + regions[i].len) return &regions[i];
    return 0;
}

int API(GetDeviceCount)(int *n) { *n = devices(); return 0; }
/* FAKE_GPU_PCI_BUS_IDS="0000:18:00.0,0000:3B:00.0,...": device i's PCI address; unset or
 * too short a list: the call fails, as a runtime without PCI information would. */
int API(DeviceGetPCIBusId)(char *out, int len, int d) {
    const char *ids = getenv("FAKE_GPU_PCI_BUS_IDS");
    if (!ids || d < 0 || len <= 0) return 101;
    for (int i = 0; i < d && ids; i++) { ids = strchr(ids, ','); if (ids) ids++; }
    if (!ids || !*ids) return 101;
    size_t n = strcspn(ids, ",");
    if (n >= (size_t)len) return 1;
    memcpy(out, ids, n);
    out[n] = 0;
    return 0;
}
int API(SetDevice)(int d) { if (d < 0 || d >= devices()) return 101; current_device = d; return 0; }
int API(GetDevice)(int *d) { *d = current_device; return 0; }
const char *API(GetErrorString)(int e) { (void)e; return "fake runtime error"; }
int API(GetLastError)(void) { return 0; }

int API(Malloc)(void **p, size_t len) {
    size_t l = (len + 4095) & ~(size_t)4095;
    void *m = mmap(0, l, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    pthread_mutex_lock(&lock);
    if (nregions == 256) { pthread_mutex_unlock(&lock); munmap(m, l); return 2; }
    regions[nregions++] = (region_t){(uintptr_t)m, l, current_device};
    pthread_mutex_unlock(&lock);
    *p = m;
    return 0;
}

int API(Free)(void *p) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == (uintptr_t)p) {
            munmap(p, regions[i].len);
            regions[i] = regions[--nregions];
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    return 1;
}

int API(PointerGetAttributes)(void *attr, const void *p) {
    memset(attr, 0, 88);
    pthread_mutex_lock(&lock);
    region_t *r = find((uintptr_t)p);
    int type = r ? 2 : 0, dev = r ? r->device : -1;
    pthread_mutex_unlock(&lock);
    memcpy(attr, &type, 4);
    memcpy((char *)attr + 4, &dev, 4);
    return 0;
}

static int copy(void *dst, const void *src, size_t n) {
    pthread_mutex_lock(&lock);
    region_t *d = find((uintptr_t)dst), *s = find((uintptr_t)src);
    if (d) mprotect((void *)d->base, d->len, PROT_READ | PROT_WRITE);
    if (s && s != d) mprotect((void *)s->base, s->len, PROT_READ);
    memcpy(dst, src, n);
    if (d) mprotect((void *)d->base, d->len, PROT_NONE);
    if (s && s != d) mprotect((void *)s->base, s->len, PROT_NONE);
    copies++;
    pthread_mutex_unlock(&lock);
    return 0;
}

int API(Memcpy)(void *dst, const void *src, size_t n, int kind) { (void)kind; return copy(dst, src, n); }
int API(MemcpyAsync)(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)kind; (void)stream;
    __atomic_add_fetch(&async_copies, 1, __ATOMIC_RELAXED);
    return copy(dst, src, n);
}
int API(StreamCreateWithFlags)(void **s, unsigned f) { (void)f; *s = malloc(1); return 0; }
int API(StreamSynchronize)(void *s) { (void)s; return 0; }
int API(StreamDestroy)(void *s) { free(s); return 0; }
int API(HostAlloc)(void **p, size_t n, unsigned f) {
    (void)f;
    __atomic_add_fetch(&host_allocs, 1, __ATOMIC_RELAXED);
    if (posix_memalign(p, 4096, n)) return 2;
    pthread_mutex_lock(&lock);
    if (++host_live > host_peak) host_peak = host_live;
    pthread_mutex_unlock(&lock);
    return 0;
}
int API(FreeHost)(void *p) {
    pthread_mutex_lock(&lock);
    host_live--;
    pthread_mutex_unlock(&lock);
    free(p);
    return 0;
}

/* Test hook: pinned allocations alive now and at most at once. */
void fake_gpu_pinned(uint64_t out[2]) {
    pthread_mutex_lock(&lock);
    out[0] = host_live;
    out[1] = host_peak;
    pthread_mutex_unlock(&lock);
}

/* Test hook: copies, asynchronous copies, pinned allocations. */
void fake_gpu_stats(uint64_t out[3]) {
    pthread_mutex_lock(&lock);
    out[0] = copies;
    pthread_mutex_unlock(&lock);
    out[1] = __atomic_load_n(&async_copies, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&host_allocs, __ATOMIC_RELAXED);
}
