// The emulator's launch, barriers and shuffles (see emu.h).
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "emu.h"

__thread struct emu_dim3 threadIdx;
struct emu_dim3 blockIdx, blockDim, gridDim;
unsigned char *emu_dyn_shared;

struct emu_kernel {
    const char *name;
    emu_entry f;
    size_t params_size;
};
static struct emu_kernel kernels[512];
static int n_kernels;

void emu_register(const char *name, emu_entry f, size_t params_size) {
    if (n_kernels == (int)(sizeof kernels / sizeof kernels[0])) {
        fprintf(stderr, "emu: too many kernels\n");
        abort();
    }
    kernels[n_kernels].name = name;
    kernels[n_kernels].f = f;
    kernels[n_kernels].params_size = params_size;
    n_kernels++;
}

// A barrier over the threads still running: a thread that returns from the kernel leaves
// every barrier it belongs to (as on Volta and later GPUs).
struct barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned live, waiting, gen;
};

static void barrier_init(struct barrier *b, unsigned n) {
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->live = n;
    b->waiting = 0;
    b->gen = 0;
}

static void barrier_release(struct barrier *b) {
    b->waiting = 0;
    b->gen++;
    pthread_cond_broadcast(&b->cv);
}

static void barrier_wait(struct barrier *b, const char *what) {
    pthread_mutex_lock(&b->mu);
    unsigned gen = b->gen;
    if (++b->waiting == b->live) {
        barrier_release(b);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30;
        while (gen == b->gen) {
            if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT) {
                fprintf(stderr,
                        "emu: %s waited 30 s: the threads of a block or warp diverged (block "
                        "%u, thread %u)\n",
                        what, blockIdx.x, threadIdx.x);
                abort();
            }
        }
    }
    pthread_mutex_unlock(&b->mu);
}

static void barrier_leave(struct barrier *b) {
    pthread_mutex_lock(&b->mu);
    b->live--;
    if (b->live > 0 && b->waiting == b->live) barrier_release(b);
    pthread_mutex_unlock(&b->mu);
}

struct warp {
    struct barrier bar;
    float xch[32];
};

static struct barrier block_bar;
static struct warp *warps;
static emu_entry current;
static const void *current_params;

void __syncthreads(void) { barrier_wait(&block_bar, "__syncthreads"); }

float shfl_xor(float v, int m) {
    struct warp *w = &warps[threadIdx.x / 32];
    unsigned lane = threadIdx.x % 32;
    w->xch[lane] = v;
    barrier_wait(&w->bar, "a warp shuffle");
    float r = w->xch[lane ^ (unsigned)m];
    barrier_wait(&w->bar, "a warp shuffle");
    return r;
}

static void *thread_main(void *arg) {
    threadIdx.x = (unsigned)(uintptr_t)arg;
    threadIdx.y = threadIdx.z = 0;
    current(current_params);
    barrier_leave(&warps[threadIdx.x / 32].bar);
    barrier_leave(&block_bar);
    return NULL;
}

// Runs kernel `name` over a 1-D grid of `grid` blocks of `block` threads (a multiple of
// 32), with `shared` bytes of dynamic shared memory (filled with 0xff, so reads before
// writes show as NaN). Returns 0; -1 for an unknown kernel; -2 when `params_size` is not the
// size of the kernel's parameter struct; -3 for a bad shape; -4 when threads cannot start.
int emu_launch(const char *name, unsigned grid, unsigned block, unsigned shared,
               const void *params, size_t params_size) {
    struct emu_kernel *k = NULL;
    for (int i = 0; i < n_kernels; ++i)
        if (strcmp(kernels[i].name, name) == 0) k = &kernels[i];
    if (!k) return -1;
    if (k->params_size != params_size) return -2;
    if (grid == 0 || block == 0 || block % 32 != 0 || block > 1024) return -3;
    unsigned char *dyn = malloc(shared ? shared : 1);
    memset(dyn, 0xff, shared);
    emu_dyn_shared = dyn;
    unsigned n_warps = block / 32;
    warps = calloc(n_warps, sizeof *warps);
    pthread_t *threads = calloc(block, sizeof *threads);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    current = k->f;
    current_params = params;
    gridDim.x = grid;
    gridDim.y = gridDim.z = 1;
    blockDim.x = block;
    blockDim.y = blockDim.z = 1;
    int rc = 0;
    for (unsigned b = 0; b < grid && rc == 0; ++b) {
        blockIdx.x = b;
        blockIdx.y = blockIdx.z = 0;
        barrier_init(&block_bar, block);
        for (unsigned w = 0; w < n_warps; ++w) barrier_init(&warps[w].bar, 32);
        unsigned started = 0;
        for (; started < block; ++started)
            if (pthread_create(&threads[started], &attr, thread_main,
                               (void *)(uintptr_t)started) != 0)
                break;
        if (started < block) {
            fprintf(stderr, "emu: could not start thread %u of a block\n", started);
            abort();
        }
        for (unsigned t = 0; t < block; ++t) pthread_join(threads[t], NULL);
    }
    pthread_attr_destroy(&attr);
    free(threads);
    free(warps);
    free(dyn);
    return rc;
}

// The parameter struct size of kernel `name`, or 0 when there is no such kernel.
size_t emu_params_size(const char *name) {
    for (int i = 0; i < n_kernels; ++i)
        if (strcmp(kernels[i].name, name) == 0) return kernels[i].params_size;
    return 0;
}

int emu_n_kernels(void) { return n_kernels; }
const char *emu_kernel_name(int i) { return i >= 0 && i < n_kernels ? kernels[i].name : NULL; }
