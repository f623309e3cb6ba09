/*
 * A FAKE GPU runtime for CPU-only tests: exports the CUDA or MUSA runtime
 * symbols the engine loads (prefix chosen with -DPREFIX=cuda or musa) over
 * host memory. "Device" allocations are mapped PROT_NONE, so any access that
 * bypasses the runtime's copy functions faults: a test passes only if the
 * engine stages device memory through the runtime. Copies are counted.
 * PointerGetAttributes writes 88 bytes, as CUDA 13's larger struct does.
 *
 * IPC: every "device" allocation is a memfd mapped MAP_SHARED, so another
 * process can map it: the 64-byte IPC handle holds a magic, the creator's pid,
 * the memfd number and the allocation size; IpcOpenMemHandle maps
 * /proc/<pid>/fd/<fd> (PROT_NONE like any device memory), IpcCloseMemHandle
 * unmaps it. Opens and closes are counted (fake_gpu_ipc_stats). As with CUDA,
 * the handle of any pointer inside an allocation names the whole allocation,
 * and the driver's MemGetAddressRange (exported here under the CUDA and MUSA
 * driver names) gives its base and size; MemGetHandleForAddressRange exports an
 * allocation as a "dma-buf" (a dup of its memfd).
 *
 * Virtual-memory API (PyTorch's expandable segments): fake_gpu_vmm_malloc maps
 * several memfd "physical allocations" back to back in one reserved range;
 * IpcGetMemHandle refuses them, as CUDA does. MemRetainAllocationHandle /
 * MemExportToShareableHandle give a dup of the chunk's memfd (handle type 1, a POSIX
 * descriptor); MemImportFromShareableHandle / MemAddressReserve / MemMap /
 * MemSetAccess / MemUnmap / MemAddressFree / MemRelease map it in another process.
 * Exports, maps and unmaps are counted (fake_gpu_vmm_stats).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define API(name) CAT(PREFIX, name)

/* imported: 0 own allocation, 1 legacy IPC mapping, 2 virtual-memory mapping;
 * vmm: an own allocation of the virtual-memory API. */
typedef struct { uintptr_t base; size_t len; int device; int fd; int imported; int vmm; } region_t;
#define MAX_REGIONS 1024
static region_t regions[MAX_REGIONS];
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
    int fd = memfd_create("fake-gpu", MFD_CLOEXEC);
    if (fd < 0) return 2;
    if (ftruncate(fd, (off_t)l) != 0) { close(fd); return 2; }
    void *m = mmap(0, l, PROT_NONE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return 2; }
    pthread_mutex_lock(&lock);
    if (nregions == MAX_REGIONS) { pthread_mutex_unlock(&lock); munmap(m, l); close(fd); return 2; }
    regions[nregions++] = (region_t){(uintptr_t)m, l, current_device, fd, 0, 0};
    pthread_mutex_unlock(&lock);
    *p = m;
    return 0;
}

int API(Free)(void *p) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == (uintptr_t)p && !regions[i].imported) {
            munmap(p, regions[i].len);
            close(regions[i].fd);
            regions[i] = regions[--nregions];
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    return 1;
}

/* IPC handle layout (fake): magic, pid, fd, size; the rest zero. */
#define IPC_MAGIC 0x4350494b414646ULL /* "FFAKIPC" */
typedef struct { char bytes[64]; } ipc_handle_t;
typedef struct { uint64_t magic; int32_t pid; int32_t fd; uint64_t size; } ipc_fields_t;
static uint64_t ipc_opens, ipc_closes, ipc_gets;

int API(IpcGetMemHandle)(ipc_handle_t *h, void *p) {
    pthread_mutex_lock(&lock);
    region_t *r = find((uintptr_t)p);
    if (!r || r->imported || r->vmm) { pthread_mutex_unlock(&lock); return 1; }
    ipc_fields_t f = {IPC_MAGIC, (int32_t)getpid(), r->fd, r->len};
    ipc_gets++;
    pthread_mutex_unlock(&lock);
    memset(h, 0, sizeof *h);
    memcpy(h->bytes, &f, sizeof f);
    return 0;
}

int API(IpcOpenMemHandle)(void **p, ipc_handle_t h, unsigned flags) {
    (void)flags;
    ipc_fields_t f;
    memcpy(&f, h.bytes, sizeof f);
    if (f.magic != IPC_MAGIC || f.size == 0) return 1;
    if (f.pid == (int32_t)getpid()) return 1; /* CUDA refuses handles of the own process */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", f.pid, f.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return 1;
    void *m = mmap(0, f.size, PROT_NONE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return 2; }
    pthread_mutex_lock(&lock);
    if (nregions == MAX_REGIONS) { pthread_mutex_unlock(&lock); munmap(m, f.size); close(fd); return 2; }
    regions[nregions++] = (region_t){(uintptr_t)m, f.size, current_device, fd, 1, 0};
    ipc_opens++;
    pthread_mutex_unlock(&lock);
    *p = m;
    return 0;
}

int API(IpcCloseMemHandle)(void *p) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == (uintptr_t)p && regions[i].imported) {
            munmap(p, regions[i].len);
            close(regions[i].fd);
            regions[i] = regions[--nregions];
            ipc_closes++;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    return 1;
}

/* Driver API: base and size of the allocation holding p. */
static int address_range(uintptr_t *base, size_t *size, uintptr_t p) {
    pthread_mutex_lock(&lock);
    region_t *r = find(p);
    if (r) { *base = r->base; *size = r->len; }
    pthread_mutex_unlock(&lock);
    return r ? 0 : 1;
}
int cuMemGetAddressRange_v2(uintptr_t *base, size_t *size, uintptr_t p) { return address_range(base, size, p); }
int muMemGetAddressRange(uintptr_t *base, size_t *size, uintptr_t p) { return address_range(base, size, p); }
/* Driver API: the allocation [base, base+size) exported as a dma-buf (handle type 1,
 * flags 0), here a new descriptor of the allocation's memfd. */
static int handle_for_range(void *handle, uintptr_t base, size_t size, int type, unsigned long long flags) {
    if (type != 1 || flags != 0) return 1;
    pthread_mutex_lock(&lock);
    region_t *r = find(base);
    int fd = -1;
    if (r && r->base == base && size <= r->len) fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_unlock(&lock);
    if (fd < 0) return 1;
    *(int *)handle = fd;
    return 0;
}
int cuMemGetHandleForAddressRange(void *h, uintptr_t b, size_t n, int t, unsigned long long f) { return handle_for_range(h, b, n, t, f); }
int muMemGetHandleForAddressRange(void *h, uintptr_t b, size_t n, int t, unsigned long long f) { return handle_for_range(h, b, n, t, f); }
int cuInit(unsigned flags) { (void)flags; return 0; }
int muInit(unsigned flags) { (void)flags; return 0; }

/* Test hook: handles exported, opened, closed; imported mappings alive now. */
void fake_gpu_ipc_stats(uint64_t out[4]) {
    pthread_mutex_lock(&lock);
    out[0] = ipc_gets;
    out[1] = ipc_opens;
    out[2] = ipc_closes;
    uint64_t live = 0;
    for (int i = 0; i < nregions; i++) live += regions[i].imported != 0;
    out[3] = live;
    pthread_mutex_unlock(&lock);
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

/* Every region overlapping [a, a+n) gets `prot` (a copy may cross the chunks of a
 * virtual-memory range). */
static void protect(uintptr_t a, size_t n, int prot) {
    for (int i = 0; i < nregions; i++)
        if (regions[i].base < a + n && a < regions[i].base + regions[i].len)
            mprotect((void *)regions[i].base, regions[i].len, prot);
}

static int copy(void *dst, const void *src, size_t n) {
    pthread_mutex_lock(&lock);
    protect((uintptr_t)src, n, PROT_READ);
    protect((uintptr_t)dst, n, PROT_READ | PROT_WRITE);
    memcpy(dst, src, n);
    protect((uintptr_t)dst, n, PROT_NONE);
    protect((uintptr_t)src, n, PROT_NONE);
    copies++;
    pthread_mutex_unlock(&lock);
    return 0;
}

int API(Memcpy)(void *dst, const void *src, size_t n, int kind) { (void)kind; return copy(dst, src, n); }
static int enqueue(void *stream, void *dst, const void *src, size_t n);
/* As a GPU does it: a copy on a stream happens later, here when the stream is
 * synchronised (or destroyed), reading its source then. So a caller that tells anyone
 * the bytes landed before it synchronised, or reuses the source buffer too early, is
 * caught by the bytes. On the legacy NULL stream the copy happens at once. */
int API(MemcpyAsync)(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)kind;
    __atomic_add_fetch(&async_copies, 1, __ATOMIC_RELAXED);
    return enqueue(stream, dst, src, n) ? 0 : copy(dst, src, n);
}
/* FAKE_CUDART_VERSION (default 13000): the version RuntimeGetVersion reports, and so the
 * signature MemcpyBatchAsync is read with: before 13000 (12.8, 12.9) a `size_t *failIdx`
 * comes before the stream. Declared with nine arguments to take either: with CUDA 13's
 * eight, the ninth is never read. */
static int runtime_version(void) {
    const char *v = getenv("FAKE_CUDART_VERSION");
    return v ? atoi(v) : 13000;
}
int API(RuntimeGetVersion)(int *v) { *v = runtime_version(); return 0; }
static int is_stream(void *s);
static uint64_t batch_calls, batch_copies;
typedef struct { int order; int src_hint[2]; int dst_hint[2]; unsigned flags; } memcpy_attrs_t;
int API(MemcpyBatchAsync)(void *const *dsts, const void *const *srcs, const size_t *sizes,
                          size_t count, memcpy_attrs_t *attrs, size_t *attr_idxs,
                          size_t num_attrs, void *fail_idx_or_stream, void *stream) {
    int v12 = runtime_version() < 13000;
    size_t *fail_idx = v12 ? (size_t *)fail_idx_or_stream : 0;
    void *s = v12 ? stream : fail_idx_or_stream;
    /* The runtime's rules: attributes for every copy, starting at copy 0, in order, an
     * access order set, a stream that is not the legacy NULL stream (here: one created by
     * StreamCreateWithFlags, which a call in the other version's signature misses). */
    if (!count || !is_stream(s) || (v12 && !fail_idx) || !attrs || !attr_idxs || !num_attrs || num_attrs > count || attr_idxs[0] != 0)
        return 1;
    for (size_t k = 0; k < num_attrs; k++) {
        if (attrs[k].order < 1 || attrs[k].order > 3) return 1;
        if (k && (attr_idxs[k] <= attr_idxs[k - 1] || attr_idxs[k] >= count)) return 1;
    }
    for (size_t i = 0; i < count; i++) {
        pthread_mutex_lock(&lock);
        int ok = find((uintptr_t)dsts[i]) && find((uintptr_t)srcs[i]);
        pthread_mutex_unlock(&lock);
        if (!ok) { if (fail_idx) *fail_idx = i; return 1; }
        __atomic_add_fetch(&async_copies, 1, __ATOMIC_RELAXED);
        copy(dsts[i], srcs[i], sizes[i]);
    }
    __atomic_add_fetch(&batch_calls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&batch_copies, count, __ATOMIC_RELAXED);
    return 0;
}

/* Test hook: batch calls, copies made by them. */
void fake_gpu_batch_stats(uint64_t out[2]) {
    out[0] = __atomic_load_n(&batch_calls, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&batch_copies, __ATOMIC_RELAXED);
}
/* Streams alive, so that a call can tell a stream from a misplaced argument. */
#define MAX_STREAMS 256
static void *streams[MAX_STREAMS];
static int is_stream(void *s) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS && !found; i++) found = s && streams[i] == s;
    pthread_mutex_unlock(&lock);
    return found;
}
int API(StreamCreateWithFlags)(void **s, unsigned f) {
    (void)f;
    *s = malloc(1);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS; i++) if (!streams[i]) { streams[i] = *s; break; }
    pthread_mutex_unlock(&lock);
    return 0;
}
/* Copies enqueued on each stream, oldest first. */
typedef struct pending { void *dst; const void *src; size_t n; struct pending *next; } pending_t;
static pending_t *queued[MAX_STREAMS];
static int enqueue(void *stream, void *dst, const void *src, size_t n) {
    pending_t *p = malloc(sizeof *p);
    *p = (pending_t){dst, src, n, 0};
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < MAX_STREAMS && !(stream && streams[i] == stream)) i++;
    if (i < MAX_STREAMS) {
        pending_t **tail = &queued[i];
        while (*tail) tail = &(*tail)->next;
        *tail = p;
    }
    pthread_mutex_unlock(&lock);
    if (i == MAX_STREAMS) free(p);
    return i < MAX_STREAMS;
}
/* Runs the copies enqueued on `s`, in order. FAKE_COPY_DELAY_US: a stream with copies
 * enqueued takes that long to finish them (a GPU's copies queued behind others), so that
 * bytes told landed before their stream was synchronised are found missing. */
static void run_queued(void *s) {
    pending_t *p = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (s && streams[i] == s) { p = queued[i]; queued[i] = 0; }
    pthread_mutex_unlock(&lock);
    const char *delay = getenv("FAKE_COPY_DELAY_US");
    if (p && delay) usleep((useconds_t)atoi(delay));
    while (p) {
        pending_t *next = p->next;
        copy(p->dst, p->src, p->n);
        free(p);
        p = next;
    }
}
int API(StreamSynchronize)(void *s) { run_queued(s); return 0; }
/* Stream queries that found copies still queued. */
static uint64_t queries_not_ready;
/* As a GPU's: a stream with copies queued is not ready (cudaErrorNotReady, or
 * FAKE_NOT_READY_RC where a runtime numbers it otherwise); its copies run on the query
 * after that (taking FAKE_COPY_DELAY_US, as in a synchronisation), which finds it ready. */
static int queried_once[MAX_STREAMS];
int API(StreamQuery)(void *s) {
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < MAX_STREAMS && !(s && streams[i] == s)) i++;
    int wait = i < MAX_STREAMS && queued[i] && !queried_once[i];
    if (i < MAX_STREAMS) queried_once[i] = wait;
    pthread_mutex_unlock(&lock);
    if (i == MAX_STREAMS) return 400; /* cudaErrorInvalidResourceHandle */
    if (wait) {
        __atomic_add_fetch(&queries_not_ready, 1, __ATOMIC_RELAXED);
        const char *rc = getenv("FAKE_NOT_READY_RC");
        return rc ? atoi(rc) : 600;
    }
    run_queued(s);
    return 0;
}
/* Test hook: stream queries that found copies still queued. */
void fake_gpu_queries_not_ready(uint64_t out[1]) {
    out[0] = __atomic_load_n(&queries_not_ready, __ATOMIC_RELAXED);
}
int API(StreamDestroy)(void *s) {
    run_queued(s);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS; i++) if (streams[i] == s) streams[i] = 0;
    pthread_mutex_unlock(&lock);
    free(s);
    return 0;
}
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

/* Copies enqueued and not yet run, on every stream. */
void fake_gpu_queued(uint64_t out[1]) {
    uint64_t n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        for (pending_t *p = queued[i]; p; p = p->next) n++;
    pthread_mutex_unlock(&lock);
    out[0] = n;
}

/* ---- virtual-memory API ---- */
typedef struct { int fd; size_t size; } vmm_handle_t;
static uint64_t vmm_exports, vmm_maps, vmm_unmaps;

/* Test hook: `n` chunks of `chunk` bytes (page multiple), each its own memfd, mapped back
 * to back on the current device; *p is the first byte. */
int fake_gpu_vmm_malloc(void **p, size_t chunk, int n) {
    chunk = (chunk + 4095) & ~(size_t)4095;
    char *base = mmap(0, chunk * (size_t)n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return 2;
    for (int i = 0; i < n; i++) {
        int fd = memfd_create("fake-gpu-vmm", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)chunk) != 0) return 2;
        if (mmap(base + (size_t)i * chunk, chunk, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) return 2;
        pthread_mutex_lock(&lock);
        if (nregions == MAX_REGIONS) { pthread_mutex_unlock(&lock); return 2; }
        regions[nregions++] = (region_t){(uintptr_t)base + (size_t)i * chunk, chunk, current_device, fd, 0, 1};
        pthread_mutex_unlock(&lock);
    }
    *p = base;
    return 0;
}

static int retain(uint64_t *h, void *p) {
    pthread_mutex_lock(&lock);
    region_t *r = find((uintptr_t)p);
    int fd = (r && r->vmm) ? fcntl(r->fd, F_DUPFD_CLOEXEC, 0) : -1;
    size_t size = r ? r->len : 0;
    pthread_mutex_unlock(&lock);
    if (fd < 0) return 1; /* CUDA_ERROR_INVALID_VALUE: not from cuMemCreate */
    vmm_handle_t *v = malloc(sizeof *v);
    v->fd = fd;
    v->size = size;
    *h = (uint64_t)(uintptr_t)v;
    return 0;
}
static int release(uint64_t h) {
    vmm_handle_t *v = (vmm_handle_t *)(uintptr_t)h;
    if (!v) return 1;
    close(v->fd);
    free(v);
    return 0;
}
static int export_fd(void *out, uint64_t h, int type, unsigned long long flags) {
    vmm_handle_t *v = (vmm_handle_t *)(uintptr_t)h;
    if (!v || type != 1 || flags != 0) return 1;
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return 2;
    *(int *)out = fd;
    __atomic_add_fetch(&vmm_exports, 1, __ATOMIC_RELAXED);
    return 0;
}
static int import_fd(uint64_t *h, void *os, int type) {
    if (type != 1) return 1;
    int fd = fcntl((int)(intptr_t)os, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return 1;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size <= 0) { close(fd); return 1; }
    vmm_handle_t *v = malloc(sizeof *v);
    v->fd = fd;
    v->size = (size_t)size;
    *h = (uint64_t)(uintptr_t)v;
    return 0;
}
static int reserve(uintptr_t *p, size_t size, size_t align, uintptr_t addr, unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    void *m = mmap(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    *p = (uintptr_t)m;
    return 0;
}
static int address_free(uintptr_t p, size_t size) { return munmap((void *)p, size) == 0 ? 0 : 1; }
static int map(uintptr_t p, size_t size, size_t offset, uint64_t h, unsigned long long flags) {
    vmm_handle_t *v = (vmm_handle_t *)(uintptr_t)h;
    if (!v || offset != 0 || flags != 0 || size != v->size) return 1;
    int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return 2;
    if (mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) { close(fd); return 2; }
    pthread_mutex_lock(&lock);
    if (nregions == MAX_REGIONS) { pthread_mutex_unlock(&lock); close(fd); return 2; }
    regions[nregions++] = (region_t){p, size, current_device, fd, 2, 0};
    vmm_maps++;
    pthread_mutex_unlock(&lock);
    return 0;
}
static int unmap(uintptr_t p, size_t size) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregions; i++)
        if (regions[i].base == p && regions[i].imported == 2 && regions[i].len == size) {
            mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            close(regions[i].fd);
            regions[i] = regions[--nregions];
            vmm_unmaps++;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    pthread_mutex_unlock(&lock);
    return 1;
}
typedef struct { int type; int id; int flags; } access_desc_t;
static int set_access(uintptr_t p, size_t size, const access_desc_t *d, size_t count) {
    if (count < 1 || d->type != 1 || d->flags != 3 || d->id < 0 || d->id >= devices()) return 1;
    /* Every byte must be mapped. */
    uintptr_t at = p;
    pthread_mutex_lock(&lock);
    while (at < p + size) {
        region_t *r = find(at);
        if (!r || r->imported != 2) { pthread_mutex_unlock(&lock); return 1; }
        at = r->base + r->len;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}
#define VMM_API(pre) \
    int pre##MemRetainAllocationHandle(uint64_t *h, void *p) { return retain(h, p); } \
    int pre##MemRelease(uint64_t h) { return release(h); } \
    int pre##MemExportToShareableHandle(void *o, uint64_t h, int t, unsigned long long f) { return export_fd(o, h, t, f); } \
    int pre##MemImportFromShareableHandle(uint64_t *h, void *os, int t) { return import_fd(h, os, t); } \
    int pre##MemAddressReserve(uintptr_t *p, size_t s, size_t a, uintptr_t ad, unsigned long long f) { return reserve(p, s, a, ad, f); } \
    int pre##MemAddressFree(uintptr_t p, size_t s) { return address_free(p, s); } \
    int pre##MemMap(uintptr_t p, size_t s, size_t o, uint64_t h, unsigned long long f) { return map(p, s, o, h, f); } \
    int pre##MemUnmap(uintptr_t p, size_t s) { return unmap(p, s); } \
    int pre##MemSetAccess(uintptr_t p, size_t s, const access_desc_t *d, size_t c) { return set_access(p, s, d, c); }
VMM_API(cu)
VMM_API(mu)

/* Test hook: chunks exported, mapped, unmapped; virtual-memory mappings alive now. */
void fake_gpu_vmm_stats(uint64_t out[4]) {
    pthread_mutex_lock(&lock);
    out[0] = __atomic_load_n(&vmm_exports, __ATOMIC_RELAXED);
    out[1] = vmm_maps;
    out[2] = vmm_unmaps;
    uint64_t live = 0;
    for (int i = 0; i < nregions; i++) live += regions[i].imported == 2;
    out[3] = live;
    pthread_mutex_unlock(&lock);
}
