// cortex's CPU kernels as a ggml backend: an accelerator device beside the
// CPU, the way llama.cpp's BLAS backend sits there.
//
// - Placement. llama.cpp offers each CPU-resident weight to an
//   accelerator's buffer type first, asking the device whether it would
//   run the weight's operation. This device says yes for the matrix
//   products of Q4_1 and Q8_0 weights (shapes in whole panels), so those
//   weights are stored here, and packed into panels as they are loaded.
//   Every other weight stays with the CPU backend.
// - Scheduling. ggml runs an operation where its weight lives, so every
//   product with a packed weight comes here (and a row lookup in one, which
//   the CPU could not read); everything else runs on the CPU backend.
// - Threads. A product runs as two custom operations (quantize the
//   activations, then multiply) on a CPU backend of our own that shares the
//   threadpool of the caller's context: the same threads run llama.cpp's
//   operations and ours, one after the other, never competing for cores.
//
// The buffer type is host memory (the CPU backend reads the products it
// writes without copies); only weights in the panel layout are marked (their
// `extra`), and a weight that arrived unpacked (written in pieces, or read
// straight into memory) is packed before its first use.

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "attention.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kernels.h"

#define DEVICE_NAME "CortexCPU"

static enum ck_isa kernels_isa = CK_ISA_NONE;

// ---------------------------------------------------------------- settings

// The threadpool the calling thread's contexts run on (set by cortex before
// each decode), and whether models loaded on this thread place their
// weights here.
static _Thread_local void * thread_pool = NULL;
static _Thread_local int thread_places_weights = 1;

void cortex_kernels_set_threadpool(void * pool) { thread_pool = pool; }
void cortex_kernels_place_weights(int place) { thread_places_weights = place; }

// ---------------------------------------------------------------- weights

// The marker in `extra` of a weight stored in the panel layout.
static const char packed_marker = 'P';
static pthread_mutex_t pack_lock = PTHREAD_MUTEX_INITIALIZER;

static bool is_packable(const struct ggml_tensor * t) {
    return ck_packable((int)t->type, t->ne[1], t->ne[0]) && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->view_src == NULL && ggml_is_contiguous(t);
}

static bool is_packed(const struct ggml_tensor * t) {
    return __atomic_load_n(&t->extra, __ATOMIC_ACQUIRE) == &packed_marker;
}

static void mark_packed(struct ggml_tensor * t) {
    __atomic_store_n(&t->extra, (void *)&packed_marker, __ATOMIC_RELEASE);
}

// A weight whose bytes arrived in ggml's layout: packed in place, once.
static void ensure_packed(struct ggml_tensor * t) {
    if (is_packed(t)) {
        return;
    }
    pthread_mutex_lock(&pack_lock);
    if (!is_packed(t)) {
        const size_t n = ggml_nbytes(t);
        void * raw = malloc(n);
        if (raw == NULL) {
            GGML_ABORT("%s: no memory to pack %s", DEVICE_NAME, t->name);
        }
        memcpy(raw, t->data, n);
        ck_pack((enum ck_format)t->type, raw, t->data, t->ne[1], t->ne[0]);
        free(raw);
        mark_packed(t);
    }
    pthread_mutex_unlock(&pack_lock);
}

// Whether [data, data + size) lies in one read-only mapping of a file
// (llama.cpp maps the GGUF and hands us pointers into it).
static bool in_read_only_file_mapping(const void * data, size_t size) {
#ifdef __linux__
    FILE * maps = fopen("/proc/self/maps", "r");
    if (maps == NULL) {
        return false;
    }
    const uintptr_t begin = (uintptr_t)data, end = begin + size;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long lo, hi, inode;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) != 4) {
            continue;
        }
        if (begin >= lo && end <= hi) {
            found = inode != 0 && perms[0] == 'r' && perms[1] == '-';
            break;
        }
    }
    fclose(maps);
    return found;
#else
    (void)data, (void)size;
    return false;
#endif
}

// Once a weight is packed, the pages of the file it was read from are not
// read again: let the kernel drop them from this process (they stay in the
// page cache), so the packed copy does not count twice in its memory. On a
// read-only file mapping this loses nothing: a later read maps them again.
static void release_source_pages(const void * data, size_t size) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = ((uintptr_t)data + page - 1) & ~(page - 1);
    const uintptr_t end = ((uintptr_t)data + size) & ~(page - 1);
    if (end > begin && in_read_only_file_mapping(data, size)) {
        madvise((void *)begin, end - begin, MADV_DONTNEED);
    }
}

// ---------------------------------------------------------------- buffer

static void buffer_free(ggml_backend_buffer_t buffer) { free(buffer->context); }

static void * buffer_base(ggml_backend_buffer_t buffer) { return buffer->context; }

static void buffer_memset_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, uint8_t value,
                                 size_t offset, size_t size) {
    (void)buffer;
    memset((char *)tensor->data + offset, value, size);
}

static void buffer_set_tensor(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, const void * data,
                              size_t offset, size_t size) {
    if (buffer->usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS && is_packable(tensor) && offset == 0 &&
        size == ggml_nbytes(tensor)) {
        ck_pack((enum ck_format)tensor->type, data, tensor->data, tensor->ne[1], tensor->ne[0]);
        mark_packed(tensor);
        release_source_pages(data, size);
        return;
    }
    memcpy((char *)tensor->data + offset, data, size);
}

static void buffer_get_tensor(ggml_backend_buffer_t buffer, const struct ggml_tensor * tensor, void * data,
                              size_t offset, size_t size) {
    (void)buffer;
    if (!is_packed(tensor)) {
        memcpy(data, (const char *)tensor->data + offset, size);
        return;
    }
    const size_t n = ggml_nbytes(tensor);
    char * raw = malloc(n);
    if (raw == NULL) {
        GGML_ABORT("%s: no memory to read %s", DEVICE_NAME, tensor->name);
    }
    ck_unpack((enum ck_format)tensor->type, tensor->data, raw, tensor->ne[1], tensor->ne[0]);
    memcpy(data, raw + offset, size);
    free(raw);
}

static void buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    memset(buffer->context, value, buffer->size);
}

static const struct ggml_backend_buffer_i buffer_interface = {
    /* .free_buffer   = */ buffer_free,
    /* .get_base      = */ buffer_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ buffer_memset_tensor,
    /* .set_tensor    = */ buffer_set_tensor,
    /* .get_tensor    = */ buffer_get_tensor,
    /* .set_tensor_2d = */ NULL,
    /* .get_tensor_2d = */ NULL,
    /* .cpy_tensor    = */ NULL,
    /* .clear         = */ buffer_clear,
    /* .reset         = */ NULL,
};

// ---------------------------------------------------------------- buffer type

#define ALIGNMENT 64

static const char * buffer_type_name(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return DEVICE_NAME;
}

static ggml_backend_buffer_t buffer_type_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    void * data = NULL;
    // At least one line, so that even an empty buffer has a base.
    if (posix_memalign(&data, ALIGNMENT, (size + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT + ALIGNMENT) != 0) {
        return NULL;
    }
    return ggml_backend_buffer_init(buft, buffer_interface, data, size);
}

static size_t buffer_type_alignment(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return ALIGNMENT;
}

static size_t buffer_type_alloc_size(ggml_backend_buffer_type_t buft, const struct ggml_tensor * tensor) {
    (void)buft;
    if (is_packable(tensor)) {
        return ck_packed_size((enum ck_format)tensor->type, tensor->ne[1], tensor->ne[0]);
    }
    return ggml_nbytes(tensor);
}

static bool buffer_type_is_host(ggml_backend_buffer_type_t buft) {
    (void)buft;
    return true;
}

static ggml_backend_dev_t device_of_registry(void);

static struct ggml_backend_buffer_type buffer_type = {
    /* .iface   = */ {
        /* .get_name         = */ buffer_type_name,
        /* .alloc_buffer     = */ buffer_type_alloc,
        /* .alloc_buffer_n   = */ NULL,
        /* .get_alignment    = */ buffer_type_alignment,
        /* .get_max_size     = */ NULL,
        /* .get_alloc_size   = */ buffer_type_alloc_size,
        /* .get_alloc_size_n = */ NULL,
        /* .is_host          = */ buffer_type_is_host,
    },
    /* .device  = */ NULL,  // set at registration
    /* .context = */ NULL,
};

static bool in_this_buffer_type(const struct ggml_tensor * t) {
    return t->buffer != NULL && t->buffer->buft == &buffer_type;
}

// ---------------------------------------------------------------- operations

static bool supports_mul_mat(const struct ggml_tensor * op) {
    const struct ggml_tensor * w = op->src[0];
    const struct ggml_tensor * x = op->src[1];
    if (!in_this_buffer_type(w) || !is_packable(w) || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) ||
        op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    // A weight without data is llama.cpp asking where to store it.
    return w->data != NULL || thread_places_weights;
}

static bool supports_get_rows(const struct ggml_tensor * op) {
    const struct ggml_tensor * w = op->src[0];
    const struct ggml_tensor * rows = op->src[1];
    // Only for weights already here (a lookup table is never placed here).
    return w->data != NULL && in_this_buffer_type(w) && is_packable(w) && rows->type == GGML_TYPE_I32 &&
           op->type == GGML_TYPE_F32 && ggml_is_contiguous(rows) && ggml_is_contiguous(op);
}

// Attention over an F16 KV cache without ALiBi, soft-capping or sinks, on
// AVX-512 (elsewhere llama.cpp's kernel runs). The softmax's precision
// setting needs nothing: the kernel computes in F32 throughout.
static bool supports_flash_attn(const struct ggml_tensor * op) {
    const struct ggml_tensor * q = op->src[0];
    const struct ggml_tensor * k = op->src[1];
    const struct ggml_tensor * v = op->src[2];
    const struct ggml_tensor * mask = op->src[3];
    float max_bias, softcap;
    memcpy(&max_bias, (const float *)op->op_params + 1, sizeof(float));
    memcpy(&softcap, (const float *)op->op_params + 2, sizeof(float));
    return kernels_isa == CK_ISA_AVX512 && q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 &&
           v->type == GGML_TYPE_F16 && (mask == NULL || (mask->type == GGML_TYPE_F16 && mask->nb[0] == 2 &&
                                                          mask->ne[0] >= k->ne[1] && mask->ne[1] >= q->ne[1])) &&
           op->src[4] == NULL && max_bias == 0.0f && softcap == 0.0f && q->nb[0] == sizeof(float) &&
           k->nb[0] == 2 && v->nb[0] == 2 && k->ne[0] == q->ne[0] && v->ne[1] == k->ne[1] &&
           v->ne[2] == k->ne[2] && k->ne[3] > 0 && q->ne[3] % k->ne[3] == 0 && op->type == GGML_TYPE_F32 &&
           ggml_is_contiguous(op) && op->ne[0] == v->ne[0] && op->ne[1] == q->ne[2] && op->ne[2] == q->ne[1] &&
           ck_attention_supported(q->ne[0], v->ne[0], q->ne[2], k->ne[2]);
}

static bool is_layout_only(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

static bool device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    (void)dev;
    switch (op->op) {
        case GGML_OP_MUL_MAT: return supports_mul_mat(op);
        case GGML_OP_GET_ROWS: return supports_get_rows(op);
        case GGML_OP_FLASH_ATTN_EXT: return supports_flash_attn(op);
        default: return is_layout_only(op->op);
    }
}

// dst[:, i] = row rows[i] of the packed weight, one thread (a rare path).
static void get_rows(struct ggml_tensor * op) {
    struct ggml_tensor * w = op->src[0];
    const struct ggml_tensor * rows = op->src[1];
    ensure_packed(w);
    const int64_t n = ggml_nelements(rows);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = ((const int32_t *)rows->data)[i];
        GGML_ASSERT(row >= 0 && row < w->ne[1]);
        ck_dequantize_row((enum ck_format)w->type, w->data, w->ne[1], w->ne[0], row,
                          (float *)((char *)op->data + i * op->nb[1]));
    }
}

// ---------------------------------------------------------------- products

// Activations quantized once per (input, format): Q, K and V share theirs.
struct activation_job {
    const struct ggml_tensor * x;
    enum ck_format format;
    size_t offset;  // into the scratch
    int64_t columns;
    int64_t column_begin;  // in the count over every job's columns
};

struct product_job {
    struct ggml_tensor * op;
    const struct activation_job * activations;
    int64_t panels;
    int64_t chunk_panels;
    int64_t first_chunk;
};

#define MAX_JOBS 64

struct product_batch {
    enum ck_isa isa;
    uint8_t * scratch;
    struct activation_job activations[MAX_JOBS];
    int n_activations;
    int64_t total_columns;
    struct product_job products[MAX_JOBS];
    int n_products;
    int64_t total_chunks;
    atomic_llong next_chunk;
};

static void split(int64_t n, int ith, int nth, int64_t * begin, int64_t * end) {
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

static void quantize_task(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void)dst;
    const struct product_batch * batch = userdata;
    int64_t begin, end;
    split(batch->total_columns, ith, nth, &begin, &end);
    for (int j = 0; j < batch->n_activations; j++) {
        const struct activation_job * job = &batch->activations[j];
        const struct ggml_tensor * x = job->x;
        const size_t stride = ck_activation_bytes(x->ne[0]);
        for (int64_t c = begin > job->column_begin ? begin - job->column_begin : 0;
             c < job->columns && job->column_begin + c < end; c++) {
            const int64_t i11 = c % x->ne[1];
            const int64_t i12 = (c / x->ne[1]) % x->ne[2];
            const int64_t i13 = c / (x->ne[1] * x->ne[2]);
            const float * column =
                (const float *)((const char *)x->data + i11 * x->nb[1] + i12 * x->nb[2] + i13 * x->nb[3]);
            ck_quantize_column(batch->isa, job->format, column, x->ne[0],
                               batch->scratch + job->offset + (size_t)c * stride);
        }
    }
}

// Chunks of panels, taken in turn by whichever thread is free.
static void multiply_task(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void)dst, (void)ith, (void)nth;
    struct product_batch * batch = userdata;
    int j = 0;
    for (;;) {
        const int64_t chunk = atomic_fetch_add_explicit(&batch->next_chunk, 1, memory_order_relaxed);
        if (chunk >= batch->total_chunks) {
            return;
        }
        while (chunk >= batch->products[j].first_chunk +
                            (batch->products[j].panels + batch->products[j].chunk_panels - 1) /
                                batch->products[j].chunk_panels) {
            j++;
        }
        const struct product_job * job = &batch->products[j];
        const struct ggml_tensor * w = job->op->src[0];
        const int64_t p0 = (chunk - job->first_chunk) * job->chunk_panels;
        const int64_t p1 = p0 + job->chunk_panels < job->panels ? p0 + job->chunk_panels : job->panels;
        ck_gemm(batch->isa, (enum ck_format)w->type, w->data, w->ne[0], p0, p1,
                batch->scratch + job->activations->offset, job->activations->columns, (float *)job->op->data,
                job->op->ne[0]);
    }
}

// ---------------------------------------------------------------- attention

struct attention_run {
    struct ck_attention shape;
    float * scratch;  // per thread
    size_t floats_per_thread;
    size_t capacity;  // floats
    int64_t items;
    atomic_llong next_item;
};

static void attention_task(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void)dst, (void)nth;
    struct attention_run * run = userdata;
    float * scratch = run->scratch + (size_t)ith * run->floats_per_thread;
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&run->next_item, 1, memory_order_relaxed);
        if (item >= run->items) {
            return;
        }
        ck_attention_item(&run->shape, item, scratch);
    }
}

static struct ck_attention attention_shape(const struct ggml_tensor * op) {
    const struct ggml_tensor * q = op->src[0];
    const struct ggml_tensor * k = op->src[1];
    const struct ggml_tensor * v = op->src[2];
    const struct ggml_tensor * mask = op->src[3];
    struct ck_attention a;
    memset(&a, 0, sizeof a);
    a.q = q->data, a.k = k->data, a.v = v->data, a.mask = mask ? mask->data : NULL, a.out = op->data;
    a.dk = q->ne[0], a.dv = v->ne[0], a.rows = q->ne[1], a.heads = q->ne[2], a.seqs = q->ne[3];
    a.cells = k->ne[1], a.kv_heads = k->ne[2], a.kv_seqs = k->ne[3];
    a.mask_heads = mask ? mask->ne[2] : 1, a.mask_seqs = mask ? mask->ne[3] : 1;
    for (int i = 0; i < 4; i++) {
        a.q_nb[i] = q->nb[i], a.k_nb[i] = k->nb[i], a.v_nb[i] = v->nb[i], a.out_nb[i] = op->nb[i];
        a.mask_nb[i] = mask ? mask->nb[i] : 0;
    }
    memcpy(&a.scale, (const float *)op->op_params, sizeof(float));
    return a;
}

// ---------------------------------------------------------------- backend

struct backend_context {
    ggml_backend_t cpu;  // runs our two operations on the caller's threads
    void * cpu_pool;     // the pool set on `cpu`
    void * own_pool;     // made when the caller has none
    int n_threads;
    uint8_t * scratch;
    size_t scratch_size;
    struct product_batch batch;
    struct attention_run attention;
    // ggml wants its context memory aligned to GGML_MEM_ALIGN (16); calloc
    // gives at least that.
    _Alignas(16) char graph_memory[16 * 1024];
};

typedef void (*set_n_threads_fn)(ggml_backend_t, int);
typedef void (*set_threadpool_fn)(ggml_backend_t, void *);
typedef void * (*threadpool_new_fn)(struct ggml_threadpool_params *);
typedef void (*threadpool_free_fn)(void *);

static void * cpu_proc(const char * name) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    return cpu ? ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu), name) : NULL;
}

// The CPU backend we run on, on the caller's threadpool (or one of our own
// when the caller gave none: ggml would otherwise start threads per call).
static bool prepare_cpu(struct backend_context * ctx) {
    if (ctx->cpu == NULL) {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ctx->cpu = cpu ? ggml_backend_dev_init(cpu, NULL) : NULL;
        if (ctx->cpu == NULL) {
            return false;
        }
    }
    set_n_threads_fn set_n_threads = (set_n_threads_fn)cpu_proc("ggml_backend_set_n_threads");
    set_threadpool_fn set_threadpool = (set_threadpool_fn)cpu_proc("ggml_backend_cpu_set_threadpool");
    void * pool = thread_pool;
    if (pool == NULL) {
        if (ctx->own_pool == NULL) {
            threadpool_new_fn pool_new = (threadpool_new_fn)cpu_proc("ggml_threadpool_new");
            if (pool_new != NULL) {
                struct ggml_threadpool_params params = ggml_threadpool_params_default(ctx->n_threads);
                ctx->own_pool = pool_new(&params);
            }
        }
        pool = ctx->own_pool;
    }
    if (pool != ctx->cpu_pool && set_threadpool != NULL) {
        set_threadpool(ctx->cpu, pool);
        ctx->cpu_pool = pool;
    }
    if (set_n_threads != NULL) {
        set_n_threads(ctx->cpu, ctx->n_threads);
    }
    return true;
}

static bool reserve_scratch(struct backend_context * ctx, size_t size) {
    if (size <= ctx->scratch_size) {
        return true;
    }
    free(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_size = 0;
    void * memory = NULL;
    if (posix_memalign(&memory, ALIGNMENT, size) != 0) {
        return false;
    }
    ctx->scratch = memory;
    ctx->scratch_size = size;
    return true;
}

static const struct activation_job * activations_for(struct product_batch * batch, const struct ggml_tensor * x,
                                                     enum ck_format format, size_t * scratch_used) {
    for (int j = 0; j < batch->n_activations; j++) {
        if (batch->activations[j].x == x && batch->activations[j].format == format) {
            return &batch->activations[j];
        }
    }
    struct activation_job * job = &batch->activations[batch->n_activations++];
    job->x = x;
    job->format = format;
    job->columns = ggml_nrows(x);
    job->column_begin = batch->total_columns;
    job->offset = *scratch_used;
    *scratch_used += (size_t)job->columns * ck_activation_bytes(x->ne[0]);
    batch->total_columns += job->columns;
    return job;
}

// Runs `task` on every thread of the CPU backend's pool, once: as two
// custom operations when `first` is given (ggml puts a barrier between
// them), else one.
static enum ggml_status run_on_threads(struct backend_context * ctx, ggml_custom_op_t first, ggml_custom_op_t then,
                                       void * userdata) {
    struct ggml_init_params params = {sizeof ctx->graph_memory, ctx->graph_memory, true};
    struct ggml_context * graph_ctx = ggml_init(params);
    if (graph_ctx == NULL) {
        return GGML_STATUS_ALLOC_FAILED;
    }
    struct ggml_tensor * before = NULL;
    if (first != NULL) {
        before = ggml_custom_4d(graph_ctx, GGML_TYPE_F32, 1, 1, 1, 1, NULL, 0, first, GGML_N_TASKS_MAX, userdata);
    }
    struct ggml_tensor * last = ggml_custom_4d(graph_ctx, GGML_TYPE_F32, 1, 1, 1, 1, before ? &before : NULL,
                                               before ? 1 : 0, then, GGML_N_TASKS_MAX, userdata);
    struct ggml_cgraph * graph = ggml_new_graph_custom(graph_ctx, 4, false);
    ggml_build_forward_expand(graph, last);
    const enum ggml_status status = ggml_backend_graph_compute(ctx->cpu, graph);
    ggml_free(graph_ctx);
    return status;
}

static enum ggml_status run_attention(struct backend_context * ctx, struct ggml_tensor * op) {
    struct attention_run * run = &ctx->attention;
    run->shape = attention_shape(op);
    run->items = ck_attention_items(&run->shape);
    run->floats_per_thread = (ck_attention_scratch_floats(&run->shape) + 15) & ~(size_t)15;
    if (!prepare_cpu(ctx)) {
        return GGML_STATUS_ALLOC_FAILED;
    }
    const size_t needed = run->floats_per_thread * (size_t)ctx->n_threads;
    if (needed > run->capacity) {
        free(run->scratch);
        run->scratch = NULL;
        run->capacity = 0;
        void * memory = NULL;
        if (posix_memalign(&memory, ALIGNMENT, needed * sizeof(float)) != 0) {
            return GGML_STATUS_ALLOC_FAILED;
        }
        run->scratch = memory;
        run->capacity = needed;
    }
    atomic_store(&run->next_item, 0);
    return run_on_threads(ctx, NULL, attention_task, run);
}

// Runs the products gathered in ctx->batch, on the CPU backend's threads.
static enum ggml_status run_products(struct backend_context * ctx) {
    struct product_batch * batch = &ctx->batch;
    if (batch->n_products == 0) {
        return GGML_STATUS_SUCCESS;
    }
    size_t scratch_used = 0;
    batch->n_activations = 0;
    batch->total_columns = 0;
    batch->total_chunks = 0;
    // Enough chunks for every thread to take several (the last ones even
    // out threads that started late), never less than a panel.
    int64_t all_panels = 0;
    for (int j = 0; j < batch->n_products; j++) {
        all_panels += batch->products[j].op->src[0]->ne[1] / CK_PANEL_ROWS;
    }
    const int64_t target_chunk = all_panels / ((int64_t)ctx->n_threads * 8) > 0
                                     ? all_panels / ((int64_t)ctx->n_threads * 8)
                                     : 1;
    for (int j = 0; j < batch->n_products; j++) {
        struct product_job * job = &batch->products[j];
        struct ggml_tensor * w = job->op->src[0];
        ensure_packed(w);
        job->activations = activations_for(batch, job->op->src[1], (enum ck_format)w->type, &scratch_used);
        job->panels = w->ne[1] / CK_PANEL_ROWS;
        job->chunk_panels = target_chunk;
        job->first_chunk = batch->total_chunks;
        batch->total_chunks += (job->panels + job->chunk_panels - 1) / job->chunk_panels;
    }
    if (!reserve_scratch(ctx, scratch_used) || !prepare_cpu(ctx)) {
        return GGML_STATUS_ALLOC_FAILED;
    }
    batch->isa = kernels_isa;
    batch->scratch = ctx->scratch;
    atomic_store(&batch->next_chunk, 0);
    const enum ggml_status status = run_on_threads(ctx, quantize_task, multiply_task, batch);
    batch->n_products = 0;
    return status;
}

// Whether `x` is (a view of) the output of a product gathered but not yet
// run: its inputs are quantized before any product runs, so it must wait.
static bool reads_pending_output(const struct product_batch * batch, const struct ggml_tensor * x) {
    for (; x != NULL; x = x->view_src) {
        for (int j = 0; j < batch->n_products; j++) {
            if (batch->products[j].op == x) {
                return true;
            }
        }
    }
    return false;
}

static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph) {
    struct backend_context * ctx = backend->context;
    ctx->batch.n_products = 0;
    for (int i = 0; i < ggml_graph_n_nodes(cgraph); i++) {
        struct ggml_tensor * node = ggml_graph_node(cgraph, i);
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || is_layout_only(node->op)) {
            continue;
        }
        if (node->op == GGML_OP_MUL_MAT) {
            if (ctx->batch.n_products == MAX_JOBS || reads_pending_output(&ctx->batch, node->src[1])) {
                const enum ggml_status status = run_products(ctx);
                if (status != GGML_STATUS_SUCCESS) {
                    return status;
                }
            }
            ctx->batch.products[ctx->batch.n_products++].op = node;
            continue;
        }
        // Products before it may be its input.
        const enum ggml_status status = run_products(ctx);
        if (status != GGML_STATUS_SUCCESS) {
            return status;
        }
        if (node->op == GGML_OP_GET_ROWS) {
            get_rows(node);
        } else if (node->op == GGML_OP_FLASH_ATTN_EXT) {
            const enum ggml_status attended = run_attention(ctx, node);
            if (attended != GGML_STATUS_SUCCESS) {
                return attended;
            }
        } else {
            GGML_ABORT("%s: unsupported operation %s", DEVICE_NAME, ggml_op_desc(node));
        }
    }
    return run_products(ctx);
}

static const char * backend_name(ggml_backend_t backend) {
    (void)backend;
    return DEVICE_NAME;
}

static void backend_free(ggml_backend_t backend) {
    struct backend_context * ctx = backend->context;
    if (ctx->cpu != NULL) {
        ggml_backend_free(ctx->cpu);
    }
    if (ctx->own_pool != NULL) {
        threadpool_free_fn pool_free = (threadpool_free_fn)cpu_proc("ggml_threadpool_free");
        if (pool_free != NULL) {
            pool_free(ctx->own_pool);
        }
    }
    free(ctx->scratch);
    free(ctx->attention.scratch);
    free(ctx);
    free(backend);
}

static const struct ggml_backend_i backend_interface = {
    /* .get_name            = */ backend_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ NULL,
    /* .get_tensor_async    = */ NULL,
    /* .set_tensor_2d_async = */ NULL,
    /* .get_tensor_2d_async = */ NULL,
    /* .cpy_tensor_async    = */ NULL,
    /* .synchronize         = */ NULL,
    /* .graph_plan_create   = */ NULL,
    /* .graph_plan_free     = */ NULL,
    /* .graph_plan_update   = */ NULL,
    /* .graph_plan_compute  = */ NULL,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ NULL,
    /* .event_wait          = */ NULL,
    /* .graph_optimize      = */ NULL,
};

static ggml_guid_t backend_guid(void) {
    static ggml_guid guid = {0x63, 0x6f, 0x72, 0x74, 0x65, 0x78, 0x2d, 0x6b,
                             0x65, 0x72, 0x6e, 0x65, 0x6c, 0x73, 0x2d, 0x31};
    return &guid;
}

static void backend_set_n_threads(ggml_backend_t backend, int n_threads) {
    if (backend != NULL && ggml_guid_matches(backend->guid, backend_guid())) {
        ((struct backend_context *)backend->context)->n_threads = n_threads > 0 ? n_threads : 1;
    }
}

// ---------------------------------------------------------------- device

static char description[96];

static const char * device_name(ggml_backend_dev_t dev) {
    (void)dev;
    return DEVICE_NAME;
}

static const char * device_description(ggml_backend_dev_t dev) {
    (void)dev;
    return description;
}

static void device_memory(ggml_backend_dev_t dev, size_t * free, size_t * total) {
    (void)dev;
    *free = 0;
    *total = 0;
}

static enum ggml_backend_dev_type device_type(ggml_backend_dev_t dev) {
    (void)dev;
    return GGML_BACKEND_DEVICE_TYPE_ACCEL;
}

static void device_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props * props) {
    props->name = device_name(dev);
    props->description = device_description(dev);
    props->type = device_type(dev);
    device_memory(dev, &props->memory_free, &props->memory_total);
    // No buffers over mapped files: weights are copied in (and packed).
    props->caps.async = false;
    props->caps.host_buffer = false;
    props->caps.buffer_from_host_ptr = false;
    props->caps.events = false;
    props->caps.mmap_support = true;
}

static ggml_backend_t device_init_backend(ggml_backend_dev_t dev, const char * params) {
    (void)params;
    struct backend_context * ctx = calloc(1, sizeof *ctx);
    ggml_backend_t backend = calloc(1, sizeof *backend);
    if (ctx == NULL || backend == NULL) {
        free(ctx);
        free(backend);
        return NULL;
    }
    ctx->n_threads = 1;
    backend->guid = backend_guid();
    backend->iface = backend_interface;
    backend->device = dev;
    backend->context = ctx;
    return backend;
}

static ggml_backend_buffer_type_t device_buffer_type(ggml_backend_dev_t dev) {
    (void)dev;
    return &buffer_type;
}

static bool device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    (void)dev;
    return ggml_backend_buft_is_host(buft);
}

static const struct ggml_backend_device_i device_interface = {
    /* .get_name             = */ device_name,
    /* .get_description      = */ device_description,
    /* .get_memory           = */ device_memory,
    /* .get_type             = */ device_type,
    /* .get_props            = */ device_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_buffer_type,
    /* .get_host_buffer_type = */ NULL,
    /* .buffer_from_host_ptr = */ NULL,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ NULL,
    /* .event_new            = */ NULL,
    /* .event_free           = */ NULL,
    /* .event_synchronize    = */ NULL,
};

// ---------------------------------------------------------------- registry

static const char * registry_name(ggml_backend_reg_t reg) {
    (void)reg;
    return DEVICE_NAME;
}

static size_t registry_device_count(ggml_backend_reg_t reg) {
    (void)reg;
    return 1;
}

static struct ggml_backend_reg registry;
static struct ggml_backend_device device = {device_interface, &registry, NULL};

static ggml_backend_dev_t registry_device(ggml_backend_reg_t reg, size_t index) {
    (void)reg;
    return index == 0 ? &device : NULL;
}

static ggml_backend_dev_t device_of_registry(void) { return &device; }

static void * registry_proc_address(ggml_backend_reg_t reg, const char * name) {
    (void)reg;
    if (strcmp(name, "ggml_backend_set_n_threads") == 0) {
        return (void *)backend_set_n_threads;
    }
    return NULL;
}

static struct ggml_backend_reg registry = {
    /* .api_version = */ GGML_BACKEND_API_VERSION,
    /* .iface       = */ {registry_name, registry_device_count, registry_device, registry_proc_address},
    /* .context     = */ NULL,
};

// Registers the kernels with ggml, once; returns the instruction set they
// run with, or 0 where this CPU has none of theirs (nothing registered).
int cortex_kernels_register(void) {
    pthread_mutex_lock(&pack_lock);
    if (kernels_isa == CK_ISA_NONE) {
        const enum ck_isa isa = ck_detect_isa();
        if (isa != CK_ISA_NONE) {
            buffer_type.device = device_of_registry();
            snprintf(description, sizeof description, "cortex kernels for Q4_1 and Q8_0 weights%s (%s)",
                     isa == CK_ISA_AVX512 ? " and attention" : "", ck_isa_name(isa));
            ggml_backend_register(&registry);
            kernels_isa = isa;
        }
    }
    pthread_mutex_unlock(&pack_lock);
    return (int)kernels_isa;
}

// The attention kernel's self-check (see attention.h) for the Rust tests.
int cortex_kernels_attention_self_check(char * why, size_t why_len) {
    return ck_attention_self_check(why, why_len);
}

// The kernels' self-check (see kernels.h) for the Rust tests.
int cortex_kernels_self_check(int isa, char * why, size_t why_len) {
    return ck_self_check((enum ck_isa)isa, why, why_len);
}

int cortex_kernels_detect_isa(void) { return (int)ck_detect_isa(); }
