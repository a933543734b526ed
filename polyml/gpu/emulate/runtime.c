/* The emulated CUDA grid: runs a kernel's blocks one after another on the calling host thread.
 *
 * A kernel without barriers runs its threads one after another (a plain loop over the block:
 * CUDA gives no order among a block's threads, and without a barrier a correct kernel cannot
 * observe one).  A kernel with barriers runs each thread of a block as a fibre with its own
 * stack (ucontext to start it, _setjmp/_longjmp to switch): every runnable thread runs until it
 * reaches a barrier or exits; when all have stopped, either all of them wait at the same barrier
 * (they are released together: the next phase), or all have exited (the block is done), or the
 * barrier is not reached by every thread of the block, which is reported as an error: CUDA's
 * __syncthreads semantics, without the hang a device would show.
 *
 * polyml.gpu.emulate.rewrite makes the kernels read their coordinates, shared memory and the
 * bounds of their arrays from emu_thread (the first fields' offsets are fixed there) and call
 * polyml_emu_fault on an out-of-bounds access: the launch stops and reports it.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

typedef void (*emu_kernel)(void **args, void *ctx);

/* 0, or 1 + the op step whose kernel met an out-of-range index in the input data (the kernels'
 * index checks set it, as on the CPU target; launch.py reads and clears it) */
int32_t polyml_status;

enum { EMU_OK = 0, EMU_OOB = 1, EMU_BARRIER_EXIT = 2, EMU_BARRIER_MISMATCH = 3, EMU_NO_MEMORY = 4,
       EMU_UNEXPECTED_BARRIER = 5 };
enum { T_RUNNABLE = 0, T_WAITING = 1, T_DONE = 2 };

typedef struct emu_error {
    int32_t kind;        /* EMU_* */
    int32_t site;        /* access or barrier site of the module */
    uint32_t thread[3], block[3];
    int64_t offset;      /* out of bounds: byte offset of the access from the array's start */
    int64_t size;        /* bytes accessed */
    int64_t extent;      /* bytes of the array */
    /* barrier errors: a thread that did something else, its site (-1: exited), counts */
    uint32_t other[3];
    int32_t other_site;
    uint32_t waiting, exited;
    uint64_t phase;      /* barriers the block had passed */
} emu_error;

struct emu_run;

typedef struct emu_thread {
    uint32_t sreg[12];   /* tid.xyz, ntid.xyz, ctaid.xyz, nctaid.xyz   (offset 0) */
    char *shared;        /* this block's shared buffer                  (offset 48) */
    char **bounds;       /* [lo, hi) of each kernel argument            (offset 56) */
    struct emu_run *run;
    int32_t state, site;
    jmp_buf jb;
    ucontext_t uc;
    int started;
} emu_thread;

typedef struct emu_run {
    emu_kernel fn;
    void **args;
    emu_error *err;
    jmp_buf abort;       /* plain mode: a fault returns here */
    jmp_buf sched;       /* fibre mode: the scheduler */
    emu_thread *cur;
    int fibres;
    int failed;
} emu_run;

static __thread emu_run *current;

/* fibre stacks, kept between launches (per host thread: launches on several threads do not share them) */
#define STACK_BYTES (256 * 1024)
static __thread char *stacks;
static __thread size_t stacks_n;

static int ensure_stacks(size_t n) {
    if (n <= stacks_n) return 0;
    if (stacks) munmap(stacks, stacks_n * STACK_BYTES);
    stacks = mmap(NULL, n * STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) { stacks = NULL; stacks_n = 0; return -1; }
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i++) mprotect(stacks + i * STACK_BYTES, (size_t)page, PROT_NONE); /* guard page */
    stacks_n = n;
    return 0;
}

static void coords(const emu_thread *t, uint32_t th[3], uint32_t bl[3]) {
    for (int a = 0; a < 3; a++) { th[a] = t->sreg[a]; bl[a] = t->sreg[6 + a]; }
}

void polyml_emu_fault(void *ctx, int32_t site, char *p, int64_t n, char *lo, char *hi) {
    emu_thread *t = ctx;
    emu_run *r = t->run;
    emu_error *e = r->err;
    e->kind = EMU_OOB;
    e->site = site;
    coords(t, e->thread, e->block);
    e->offset = (int64_t)(p - lo);
    e->size = n;
    e->extent = (int64_t)(hi - lo);
    r->failed = 1;
    if (r->fibres) {
        t->state = T_DONE;
        _longjmp(r->sched, 1);  /* never resumed: the scheduler stops the launch */
    }
    _longjmp(r->abort, 1);
}

void polyml_emu_barrier(void *ctx, int32_t site) {
    emu_thread *t = ctx;
    emu_run *r = t->run;
    if (!r->fibres) {  /* the rewriter said this kernel has no barrier */
        r->err->kind = EMU_UNEXPECTED_BARRIER;
        r->err->site = site;
        coords(t, r->err->thread, r->err->block);
        r->failed = 1;
        _longjmp(r->abort, 1);
    }
    t->state = T_WAITING;
    t->site = site;
    if (!_setjmp(t->jb)) _longjmp(r->sched, 1);
}

static void fibre_main(void) {
    emu_run *r = current;
    emu_thread *t = r->cur;
    r->fn(r->args, t);
    t->state = T_DONE;
    _longjmp(r->sched, 1);
}

static void set_sregs(emu_thread *t, const uint32_t grid[3], const uint32_t block[3], const uint32_t b[3],
                      const uint32_t th[3]) {
    for (int a = 0; a < 3; a++) {
        t->sreg[a] = th[a];
        t->sreg[3 + a] = block[a];
        t->sreg[6 + a] = b[a];
        t->sreg[9 + a] = grid[a];
    }
}

static int run_block_fibres(emu_run *r, emu_thread *ts, uint32_t nt, const uint32_t grid[3],
                            const uint32_t block[3], const uint32_t b[3], char *shared, char **bounds) {
    for (uint32_t i = 0; i < nt; i++) {
        emu_thread *t = &ts[i];
        uint32_t th[3] = {i % block[0], (i / block[0]) % block[1], i / (block[0] * block[1])};
        set_sregs(t, grid, block, b, th);
        t->shared = shared;
        t->bounds = bounds;
        t->run = r;
        t->state = T_RUNNABLE;
        t->site = -1;
        t->started = 0;
    }
    uint64_t phase = 0;
    for (;;) {
        for (uint32_t i = 0; i < nt; i++) {
            emu_thread *t = &ts[i];
            if (t->state != T_RUNNABLE) continue;
            r->cur = t;
            if (!_setjmp(r->sched)) {
                if (!t->started) {
                    t->started = 1;
                    getcontext(&t->uc);
                    t->uc.uc_stack.ss_sp = stacks + (size_t)i * STACK_BYTES;
                    t->uc.uc_stack.ss_size = STACK_BYTES;
                    t->uc.uc_link = NULL;
                    makecontext(&t->uc, fibre_main, 0);
                    ucontext_t here;
                    swapcontext(&here, &t->uc);  /* fibre_main never returns here: it jumps to sched */
                } else {
                    _longjmp(t->jb, 1);
                }
            }
            if (r->failed) return -1;
        }
        uint32_t waiting = 0, exited = 0;
        emu_thread *first = NULL, *done = NULL, *elsewhere = NULL;
        for (uint32_t i = 0; i < nt; i++) {
            emu_thread *t = &ts[i];
            if (t->state == T_DONE) {
                exited++;
                if (!done) done = t;
                continue;
            }
            waiting++;
            if (!first) first = t;
            else if (t->site != first->site && !elsewhere) elsewhere = t;
        }
        if (!waiting) return 0;
        if (done || elsewhere) {
            emu_error *e = r->err;
            emu_thread *odd = done ? done : elsewhere;
            e->kind = done ? EMU_BARRIER_EXIT : EMU_BARRIER_MISMATCH;
            e->site = first->site;
            coords(first, e->thread, e->block);
            uint32_t unused[3];
            coords(odd, e->other, unused);
            e->other_site = done ? -1 : odd->site;
            e->waiting = waiting;
            e->exited = exited;
            e->phase = phase;
            r->failed = 1;
            return -1;
        }
        for (uint32_t i = 0; i < nt; i++) ts[i].state = T_RUNNABLE;
        phase++;
    }
}

/* Run fn over grid x block.  args: the kernel's buffer pointers; bounds: [lo, hi) per argument;
 * shared_bytes: the per-block shared buffer (filled with 0xff: NaN floats, as uninitialized
 * device memory reads would be garbage); fibres: the kernel has barriers.  Returns EMU_OK or the
 * kind of the error written to *err. */
int polyml_emu_launch(emu_kernel fn, void **args, char **bounds, const uint32_t *grid, const uint32_t *block,
                      uint64_t shared_bytes, int fibres, emu_error *err) {
    emu_run r;
    memset(&r, 0, sizeof r);
    memset(err, 0, sizeof *err);
    r.fn = fn;
    r.args = args;
    r.err = err;
    r.fibres = fibres;
    uint32_t nt = block[0] * block[1] * block[2];
    char *shared = shared_bytes ? malloc(shared_bytes) : NULL;
    emu_thread *ts = calloc(fibres ? nt : 1, sizeof(emu_thread));
    if ((shared_bytes && !shared) || !ts || (fibres && ensure_stacks(nt))) {
        free(shared);
        free(ts);
        err->kind = EMU_NO_MEMORY;
        return EMU_NO_MEMORY;
    }
    emu_run *saved = current;
    current = &r;
    int status = EMU_OK;
    uint32_t b[3];
    for (b[2] = 0; b[2] < grid[2] && status == EMU_OK; b[2]++)
        for (b[1] = 0; b[1] < grid[1] && status == EMU_OK; b[1]++)
            for (b[0] = 0; b[0] < grid[0] && status == EMU_OK; b[0]++) {
                if (shared) memset(shared, 0xff, shared_bytes);
                if (fibres) {
                    if (run_block_fibres(&r, ts, nt, grid, block, b, shared, bounds)) status = err->kind;
                    continue;
                }
                emu_thread *t = ts;
                t->shared = shared;
                t->bounds = bounds;
                t->run = &r;
                if (_setjmp(r.abort)) { status = err->kind; break; }
                uint32_t th[3];
                for (th[2] = 0; th[2] < block[2]; th[2]++)
                    for (th[1] = 0; th[1] < block[1]; th[1]++)
                        for (th[0] = 0; th[0] < block[0]; th[0]++) {
                            set_sregs(t, grid, block, b, th);
                            fn(args, t);
                        }
            }
    current = saved;
    free(shared);
    free(ts);
    return status;
}

size_t polyml_emu_error_size(void) { return sizeof(emu_error); }
