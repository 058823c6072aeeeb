// The work of cortex's ggml backend: matrix products (activations
// quantized once per input and format, then panels handed out in chunks),
// attention, row lookups in packed weights and row argmaxes, run as ggml custom
// operations on a CPU backend of the instance's own that shares the
// threadpool of the caller's context: the same threads run llama.cpp's
// operations and these, one after the other, never competing for cores.

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "backend.h"
#include "cortex_kernels.h"

bool ck_is_layout_only(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

// dst[:, i] = row rows[i] of the packed weight, one thread (a rare path).
static void get_rows(struct ggml_tensor * op) {
    struct ggml_tensor * w = op->src[0];
    const struct ggml_tensor * rows = op->src[1];
    ck_ensure_packed(w);
    const int64_t n = ggml_nelements(rows);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = ((const int32_t *)rows->data)[i];
        GGML_ASSERT(row >= 0 && row < w->ne[1]);
        ck_dequantize_row(ck_panel_format(ck_kernels_isa, (int)w->type), w->data, w->ne[1], w->ne[0], row,
                          (float *)((char *)op->data + i * op->nb[1]));
    }
}

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
            ck_quantize_column(batch->isa, job->format, job->columns, column, x->ne[0],
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
        ck_gemm(batch->isa, ck_panel_format(batch->isa, (int)w->type), w->data, w->ne[0], p0, p1,
                batch->scratch + job->activations->offset, job->activations->columns, (float *)job->op->data,
                job->op->ne[0]);
    }
}

struct attention_run {
    struct ck_attention shape;
    float * scratch;  // per thread
    size_t floats_per_thread;
    size_t capacity;  // floats
    // The groups' items first (sequences that read a shared prefix once),
    // then the items of every other sequence (plain[i]: its index).
    struct ck_attention_group * groups;
    int64_t n_groups, groups_capacity;
    int64_t * plain;
    int64_t n_plain, plain_capacity;
    int64_t items;
    atomic_llong next_item;
};

// Work items of groups computed so far, in this process (for the tests:
// that shared prefixes reach the kernel).
static atomic_llong group_items = 0;

long long cortex_kernels_attention_group_items(void) { return atomic_load(&group_items); }

static void attention_task(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void)dst, (void)nth;
    struct attention_run * run = userdata;
    float * scratch = run->scratch + (size_t)ith * run->floats_per_thread;
    const struct ck_attention * a = &run->shape;
    const int64_t per_seq = ck_attention_items_per_seq(a);
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&run->next_item, 1, memory_order_relaxed);
        if (item >= run->items) {
            return;
        }
        if (item < run->n_groups) {
            ck_attention_group_item(a, &run->groups[item], scratch);
            atomic_fetch_add_explicit(&group_items, 1, memory_order_relaxed);
        } else {
            const int64_t i = item - run->n_groups;
            ck_attention_item(a, run->plain[i / per_seq] * per_seq + i % per_seq, scratch);
        }
    }
}

// A sequence's shared prefix: the stream it copies and the cells (whole
// 16-cell blocks within the attention's), or cells 0 for none.
struct share {
    int64_t seq, source, cells;
};

static bool same_prefix(const struct share * a, const struct share * b) {
    return a->source == b->source && a->cells == b->cells;
}

// By source, then cells, then sequence.
static int by_prefix(const void * x, const void * y) {
    const struct share * a = x;
    const struct share * b = y;
    if (a->source != b->source) {
        return a->source < b->source ? -1 : 1;
    }
    if (a->cells != b->cells) {
        return a->cells < b->cells ? -1 : 1;
    }
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

// The stream a view of a layer's KV cache starts at and how many streams
// the cache holds: llama.cpp's cache tensors (`cache_k_l<n>`, `cache_v_l<n>`)
// are [row, cells, streams], and attention reads a view of streams s0..;
// false for anything else (a copy, another layout), which is then not
// grouped.
static bool streams_of(const struct ggml_tensor * view, int64_t * first, int64_t * total) {
    const struct ggml_tensor * root = view->view_src;
    if (root == NULL || strncmp(root->name, "cache_", 6) != 0 || view->nb[3] == 0 || view->nb[3] != root->nb[2] ||
        view->view_offs % view->nb[3] != 0) {
        return false;
    }
    *first = (int64_t)(view->view_offs / view->nb[3]);
    *total = root->ne[2];
    return *first + view->ne[3] <= *total;
}

static bool grow(void ** array, int64_t * capacity, int64_t needed, size_t size) {
    if (needed <= *capacity) {
        return true;
    }
    void * bigger = realloc(*array, (size_t)needed * size);
    if (bigger == NULL) {
        return false;
    }
    *array = bigger;
    *capacity = needed;
    return true;
}

// Splits the attention's work into items: sequences that hold copies of one
// stream's first cells (by `shares`) in groups that read those cells once,
// the rest alone. A group is cut into pieces enough for the threads to
// share (each piece reads the prefix once).
static bool plan_attention(struct attention_run * run, const struct ggml_tensor * op,
                           const struct ck_prefix_shares * shares, int n_threads) {
    const struct ck_attention * a = &run->shape;
    const int64_t group = a->heads / a->kv_heads;
    const int64_t per_item = group * a->rows > 0 ? CK_ATTENTION_GROUP_QUERIES / (group * a->rows) : 0;
    run->n_groups = 0;
    run->n_plain = 0;
    if (!grow((void **)&run->plain, &run->plain_capacity, a->seqs, sizeof(int64_t))) {
        return false;
    }
    int64_t k0 = 0, v0 = 0, k_total = 0, v_total = 0;
    const bool grouping = shares != NULL && a->seqs >= 2 && a->kv_seqs == a->seqs && a->rows <= CK_ATTENTION_ROWS &&
                          per_item >= 2 && streams_of(op->src[1], &k0, &k_total) &&
                          streams_of(op->src[2], &v0, &v_total) && k0 == v0;
    struct share * found = grouping ? malloc(sizeof(struct share) * (size_t)a->seqs) : NULL;
    int64_t n_found = 0;
    for (int64_t seq = 0; seq < a->seqs; seq++) {
        const int64_t stream = k0 + seq;
        int64_t source = -1, cells = 0;
        if (found != NULL && stream < shares->streams) {
            source = shares->source[stream];
            cells = shares->cells[stream] < a->cells ? shares->cells[stream] : a->cells;
            cells -= cells % 16;
        }
        if (source >= 0 && source < k_total && source < v_total && cells > 0) {
            found[n_found++] = (struct share){seq, source, cells};
        } else {
            run->plain[run->n_plain++] = seq;
        }
    }
    if (n_found > 0) {
        qsort(found, (size_t)n_found, sizeof *found, by_prefix);
    }
    // Runs of one source and length; each a group unless alone.
    int64_t runs = 0;
    for (int64_t i = 0; i < n_found; i++) {
        runs += i == 0 || !same_prefix(&found[i], &found[i - 1]);
    }
    // Pieces per group: enough to hold its members, and about two items per
    // thread over all groups, but at least two members a piece.
    const int64_t wanted = runs > 0 ? (2 * (int64_t)n_threads + a->kv_heads * runs - 1) / (a->kv_heads * runs) : 1;
    for (int64_t i = 0; i < n_found;) {
        int64_t end = i + 1;
        while (end < n_found && same_prefix(&found[end], &found[i])) {
            end++;
        }
        const int64_t n = end - i;
        if (n < 2) {
            run->plain[run->n_plain++] = found[i].seq;
            i = end;
            continue;
        }
        // As many pieces as hold its members at most, or more to spread the
        // work, never so many that a piece has one member.
        int64_t pieces = (n + per_item - 1) / per_item;
        const int64_t spread = wanted < n / 2 ? wanted : n / 2;
        if (pieces < spread) {
            pieces = spread;
        }
        const int64_t size = (n + pieces - 1) / pieces;
        for (int64_t p0 = i; p0 < end; p0 += size) {
            for (int64_t g = 0; g < a->kv_heads; g++) {
                if (!grow((void **)&run->groups, &run->groups_capacity, run->n_groups + 1, sizeof *run->groups)) {
                    free(found);
                    return false;
                }
                struct ck_attention_group * piece = &run->groups[run->n_groups++];
                piece->k_offset = (ptrdiff_t)(found[i].source - k0) * (ptrdiff_t)op->src[1]->nb[3];
                piece->v_offset = (ptrdiff_t)(found[i].source - v0) * (ptrdiff_t)op->src[2]->nb[3];
                piece->cells = found[i].cells;
                piece->g = g;
                piece->n = 0;
                for (int64_t m = p0; m < end && m < p0 + size; m++) {
                    piece->seqs[piece->n++] = found[m].seq;
                }
            }
        }
        i = end;
    }
    free(found);
    const int64_t per_seq = ck_attention_items_per_seq(a);
    run->items = run->n_groups + run->n_plain * per_seq;
    return true;
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
    a.isa = ck_kernels_isa;
    return a;
}

struct ck_compute {
    ggml_backend_t cpu;  // runs our two operations on the caller's threads
    void * pool;         // the caller's threadpool for this graph, if any
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
static bool prepare_cpu(struct ck_compute * ctx) {
    if (ctx->cpu == NULL) {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ctx->cpu = cpu ? ggml_backend_dev_init(cpu, NULL) : NULL;
        if (ctx->cpu == NULL) {
            return false;
        }
    }
    set_n_threads_fn set_n_threads = (set_n_threads_fn)cpu_proc("ggml_backend_set_n_threads");
    set_threadpool_fn set_threadpool = (set_threadpool_fn)cpu_proc("ggml_backend_cpu_set_threadpool");
    void * pool = ctx->pool;
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

static bool reserve_scratch(struct ck_compute * ctx, size_t size) {
    if (size <= ctx->scratch_size) {
        return true;
    }
    free(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_size = 0;
    void * memory = NULL;
    if (posix_memalign(&memory, CK_ALIGNMENT, size) != 0) {
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
static enum ggml_status run_on_threads(struct ck_compute * ctx, ggml_custom_op_t first, ggml_custom_op_t then,
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

static enum ggml_status run_attention(struct ck_compute * ctx, struct ggml_tensor * op,
                                      const struct ck_prefix_shares * shares) {
    struct attention_run * run = &ctx->attention;
    run->shape = attention_shape(op);
    if (!plan_attention(run, op, shares, ctx->n_threads)) {
        return GGML_STATUS_ALLOC_FAILED;
    }
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
        if (posix_memalign(&memory, CK_ALIGNMENT, needed * sizeof(float)) != 0) {
            return GGML_STATUS_ALLOC_FAILED;
        }
        run->scratch = memory;
        run->capacity = needed;
    }
    atomic_store(&run->next_item, 0);
    return run_on_threads(ctx, NULL, attention_task, run);
}

// Rows of an ARGMAX (greedy rows sampled in the graph), taken in turn by
// whichever thread is free.
struct argmax_run {
    const struct ggml_tensor * src;
    struct ggml_tensor * dst;
    atomic_llong next_row;
};

static void argmax_task(struct ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void)dst, (void)ith, (void)nth;
    struct argmax_run * run = userdata;
    const int64_t rows = run->src->ne[1];
    for (;;) {
        const int64_t row = atomic_fetch_add_explicit(&run->next_row, 1, memory_order_relaxed);
        if (row >= rows) {
            return;
        }
        const float * x = (const float *)((const char *)run->src->data + (size_t)row * run->src->nb[1]);
        ((int32_t *)run->dst->data)[row] = ck_argmax(ck_kernels_isa, x, run->src->ne[0]);
    }
}

static enum ggml_status run_argmax(struct ck_compute * ctx, struct ggml_tensor * op) {
    if (!prepare_cpu(ctx)) {
        return GGML_STATUS_ALLOC_FAILED;
    }
    struct argmax_run run = {.src = op->src[0], .dst = op};
    atomic_init(&run.next_row, 0);
    return run_on_threads(ctx, NULL, argmax_task, &run);
}

// Runs the products gathered in ctx->batch, on the CPU backend's threads.
static enum ggml_status run_products(struct ck_compute * ctx) {
    struct product_batch * batch = &ctx->batch;
    if (batch->n_products == 0) {
        return GGML_STATUS_SUCCESS;
    }
    size_t scratch_used = 0;
    batch->isa = ck_kernels_isa;
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
        ck_ensure_packed(w);
        job->activations =
            activations_for(batch, job->op->src[1], ck_panel_format(batch->isa, (int)w->type), &scratch_used);
        job->panels = w->ne[1] / CK_PANEL_ROWS;
        job->chunk_panels = target_chunk;
        job->first_chunk = batch->total_chunks;
        batch->total_chunks += (job->panels + job->chunk_panels - 1) / job->chunk_panels;
    }
    if (!reserve_scratch(ctx, scratch_used) || !prepare_cpu(ctx)) {
        return GGML_STATUS_ALLOC_FAILED;
    }
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

struct ck_compute * ck_compute_new(void) {
    struct ck_compute * ctx = calloc(1, sizeof *ctx);
    if (ctx != NULL) {
        ctx->n_threads = 1;
    }
    return ctx;
}

void ck_compute_set_threads(struct ck_compute * ctx, int n_threads) { ctx->n_threads = n_threads > 0 ? n_threads : 1; }

void ck_compute_free(struct ck_compute * ctx) {
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
    free(ctx->attention.groups);
    free(ctx->attention.plain);
    free(ctx);
}

enum ggml_status ck_compute_graph(struct ck_compute * ctx, struct ggml_cgraph * cgraph, void * pool,
                                  const struct ck_prefix_shares * shares) {
    ctx->pool = pool;
    ctx->batch.n_products = 0;
    for (int i = 0; i < ggml_graph_n_nodes(cgraph); i++) {
        struct ggml_tensor * node = ggml_graph_node(cgraph, i);
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || ck_is_layout_only(node->op)) {
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
            const enum ggml_status attended = run_attention(ctx, node, shares);
            if (attended != GGML_STATUS_SUCCESS) {
                return attended;
            }
        } else if (node->op == GGML_OP_ARGMAX) {
            const enum ggml_status taken = run_argmax(ctx, node);
            if (taken != GGML_STATUS_SUCCESS) {
                return taken;
            }
        } else {
            GGML_ABORT("%s: unsupported operation %s", CK_DEVICE_NAME, ggml_op_desc(node));
        }
    }
    return run_products(ctx);
}
