// The emulator's launch, barriers and shuffles (see emu.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"

struct emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
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

// One emulated thread: its saved context and stack. On x86-64 a thread switch is a few
// instructions (`emu_switch` below: the callee-saved registers on the stack, then the stack
// pointer); glibc's swapcontext, used elsewhere, also saves the signal mask with a system
// call at every switch, which made the emulator's tests spend most of their time in the
// kernel.
#define STACK_BYTES (128 * 1024)

#if defined(__x86_64__)
struct context {
    void *sp;
};
// Saves the callee-saved registers and the stack pointer in *from, resumes `to`.
void emu_switch(void **from, void *to);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".hidden emu_switch\n"
        ".type emu_switch,@function\n"
        "emu_switch:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
        "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n"
        "    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".size emu_switch, .-emu_switch\n");
#define SWITCH(from, to) emu_switch(&(from)->sp, (to)->sp)
#else
#include <ucontext.h>
struct context {
    ucontext_t uc;
};
#define SWITCH(from, to) swapcontext(&(from)->uc, &(to)->uc)
#endif

struct thread {
    struct context ctx;
    char *stack;
    int done;
};

static struct context scheduler;
static struct thread *threads;
// Stacks, kept from launch to launch (a block has at most 1024 threads).
static char *stacks[1024];
static unsigned current_thread;
static emu_entry current;
static const void *current_params;
static const char *current_name;
// Barrier arrivals, openings and thread exits: a pass over the threads that changes it not
// is a deadlock.
static unsigned long events;

// A barrier over the threads still running: a thread that returns from the kernel leaves
// every barrier it belongs to (as on Volta and later GPUs).
struct barrier {
    unsigned live, waiting, gen;
};

static void barrier_init(struct barrier *b, unsigned n) {
    b->live = n;
    b->waiting = 0;
    b->gen = 0;
}

static void yield(void) { SWITCH(&threads[current_thread].ctx, &scheduler); }

static void barrier_wait(struct barrier *b) {
    unsigned gen = b->gen;
    events++;
    if (++b->waiting == b->live) {
        b->waiting = 0;
        b->gen++;
        return;
    }
    while (b->gen == gen) yield();
}

static void barrier_leave(struct barrier *b) {
    events++;
    b->live--;
    if (b->live > 0 && b->waiting == b->live) {
        b->waiting = 0;
        b->gen++;
    }
}

struct warp {
    struct barrier bar;
    float xch[32];
};

static struct barrier block_bar;
static struct warp *warps;

void __syncthreads(void) { barrier_wait(&block_bar); }

float shfl_xor(float v, int m) {
    struct warp *w = &warps[threadIdx.x / 32];
    unsigned lane = threadIdx.x % 32;
    w->xch[lane] = v;
    barrier_wait(&w->bar);
    float r = w->xch[lane ^ (unsigned)m];
    barrier_wait(&w->bar);
    return r;
}

static void thread_main(void) {
    current(current_params);
    barrier_leave(&warps[threadIdx.x / 32].bar);
    barrier_leave(&block_bar);
    threads[current_thread].done = 1;
#if defined(__x86_64__)
    // Back to the scheduler for good (a done thread is never resumed).
    SWITCH(&threads[current_thread].ctx, &scheduler);
    abort();
#endif
    // Returning resumes `scheduler` (uc_link).
}

// Makes `th` start at thread_main when first switched to.
static void thread_init(struct thread *th) {
#if defined(__x86_64__)
    // The stack emu_switch pops: six callee-saved registers, then thread_main as the return
    // address, above it a null return address for thread_main, so that thread_main starts
    // with the stack aligned as after a call.
    void **top = (void **)(((unsigned long)(th->stack + STACK_BYTES)) & ~15UL);
    top[-1] = NULL;
    top[-2] = (void *)thread_main;
    for (int i = 3; i <= 8; ++i) top[-i] = NULL;
    th->ctx.sp = top - 8;
#else
    getcontext(&th->ctx.uc);
    th->ctx.uc.uc_stack.ss_sp = th->stack;
    th->ctx.uc.uc_stack.ss_size = STACK_BYTES;
    th->ctx.uc.uc_link = &scheduler.uc;
    makecontext(&th->ctx.uc, thread_main, 0);
#endif
    th->done = 0;
}

// Runs one block: every thread from the kernel's start, switched round-robin at barriers.
static void run_block(unsigned block) {
    unsigned n_warps = block / 32;
    barrier_init(&block_bar, block);
    for (unsigned w = 0; w < n_warps; ++w) barrier_init(&warps[w].bar, 32);
    for (unsigned t = 0; t < block; ++t) thread_init(&threads[t]);
    unsigned remaining = block;
    while (remaining > 0) {
        unsigned long before = events;
        for (unsigned t = 0; t < block; ++t) {
            if (threads[t].done) continue;
            current_thread = t;
            threadIdx.x = t;
            threadIdx.y = threadIdx.z = 0;
            SWITCH(&scheduler, &threads[t].ctx);
            if (threads[t].done) remaining--;
        }
        if (remaining > 0 && events == before) {
            fprintf(stderr,
                    "emu: kernel %s, block %u: every live thread waits at a barrier that cannot "
                    "open (the threads of a block or warp diverged at __syncthreads or a "
                    "shuffle)\n",
                    current_name, blockIdx.x);
            abort();
        }
    }
}

// Runs kernel `name` over a 1-D grid of `grid` blocks of `block` threads (a multiple of
// 32), with `shared` bytes of dynamic shared memory (filled with 0xff, so reads before
// writes show as NaN). Returns 0; -1 for an unknown kernel; -2 when `params_size` is not the
// size of the kernel's parameter struct; -3 for a bad shape.
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
    warps = calloc(block / 32, sizeof *warps);
    threads = calloc(block, sizeof *threads);
    for (unsigned t = 0; t < block; ++t) {
        if (!stacks[t]) stacks[t] = malloc(STACK_BYTES);
        threads[t].stack = stacks[t];
    }
    current = k->f;
    current_params = params;
    current_name = name;
    gridDim.x = grid;
    gridDim.y = gridDim.z = 1;
    blockDim.x = block;
    blockDim.y = blockDim.z = 1;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        blockIdx.y = blockIdx.z = 0;
        run_block(block);
    }
    free(threads);
    free(warps);
    free(dyn);
    return 0;
}

// The parameter struct size of kernel `name`, or 0 when there is no such kernel.
size_t emu_params_size(const char *name) {
    for (int i = 0; i < n_kernels; ++i)
        if (strcmp(kernels[i].name, name) == 0) return kernels[i].params_size;
    return 0;
}

int emu_n_kernels(void) { return n_kernels; }
const char *emu_kernel_name(int i) { return i >= 0 && i < n_kernels ? kernels[i].name : NULL; }
