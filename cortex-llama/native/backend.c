// cortex's CPU kernels as a ggml backend: an accelerator device beside the
// CPU, the way llama.cpp's BLAS backend sits there.
//
// - Placement. llama.cpp offers each CPU-resident weight to an
//   accelerator's buffer type first, asking the device whether it would
//   run the weight's operation. This device says yes for the matrix
//   products of the weights it can pack (Q4_1, Q5_1 and Q8_0, and what
//   convert.c turns into them: Q4_0, Q4_K, Q5_0, Q5_K, Q6_K; shapes in
//   whole panels), so those weights are stored here, converted and
//   packed into panels as they are loaded.
//   Every other weight stays with the CPU backend.
// - Scheduling. ggml runs an operation where its weight lives, so every
//   product with a packed weight comes here (and a row lookup in one, which
//   the CPU could not read). The device also takes attention over an F16
//   KV cache (attention.h), and the argmax of greedy rows
//   after the output projection (argmax.c); everything else runs on the
//   CPU backend.
// - Threads. A product runs as two custom operations (quantize the
//   activations, then multiply) on a CPU backend of our own that shares the
//   threadpool of the caller's context: the same threads run llama.cpp's
//   operations and ours, one after the other, never competing for cores.
//
// Files: buffer.c (the buffer type and packing), compute.c (running the
// work on the shared threads), this one (what the device takes, and the
// registry).

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "backend.h"
#include "cortex_kernels.h"

enum ck_isa ck_kernels_isa = CK_ISA_NONE;

// ---------------------------------------------------------------- settings

// The threadpool the calling thread's contexts run on (set by cortex before
// each decode), and whether models loaded on this thread place their
// weights here.
static _Thread_local void * thread_pool = NULL;
static _Thread_local int thread_places_weights = 1;

void cortex_kernels_set_threadpool(void * pool) { thread_pool = pool; }

// The prefix shares of the streams the calling thread's next decodes
// compute (see ck_prefix_shares); the arrays stay cortex's and must outlive
// those decodes. `streams` 0 clears them.
static _Thread_local struct ck_prefix_shares thread_shares = {NULL, NULL, 0};

void cortex_kernels_set_prefix_shares(const int32_t * source, const int32_t * cells, int32_t streams) {
    thread_shares.source = source;
    thread_shares.cells = cells;
    thread_shares.streams = source != NULL && cells != NULL && streams > 0 ? streams : 0;
}
void cortex_kernels_place_weights(int place) { thread_places_weights = place; }
int cortex_kernels_multiplies(int type, long long rows, long long cols) { return ck_packable(type, rows, cols); }

// ---------------------------------------------------------------- operations

static bool supports_mul_mat(const struct ggml_tensor * op) {
    const struct ggml_tensor * w = op->src[0];
    const struct ggml_tensor * x = op->src[1];
    if (!ck_in_buffer_type(w) || !ck_is_packable(w) || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) ||
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
    return w->data != NULL && ck_in_buffer_type(w) && ck_is_packable(w) && rows->type == GGML_TYPE_I32 &&
           op->type == GGML_TYPE_F32 && ggml_is_contiguous(rows) && ggml_is_contiguous(op);
}

// Attention over an F16 KV cache without ALiBi, soft-capping or sinks
// (otherwise llama.cpp's kernel runs). The softmax's precision setting
// needs nothing: the kernel computes in F32 throughout.
static bool supports_flash_attn(const struct ggml_tensor * op) {
    const struct ggml_tensor * q = op->src[0];
    const struct ggml_tensor * k = op->src[1];
    const struct ggml_tensor * v = op->src[2];
    const struct ggml_tensor * mask = op->src[3];
    float max_bias, softcap;
    memcpy(&max_bias, (const float *)op->op_params + 1, sizeof(float));
    memcpy(&softcap, (const float *)op->op_params + 2, sizeof(float));
    return ck_kernels_isa != CK_ISA_NONE && q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F16 &&
           v->type == GGML_TYPE_F16 && (mask == NULL || (mask->type == GGML_TYPE_F16 && mask->nb[0] == 2 &&
                                                          mask->ne[0] >= k->ne[1] && mask->ne[1] >= q->ne[1])) &&
           op->src[4] == NULL && max_bias == 0.0f && softcap == 0.0f && q->nb[0] == sizeof(float) &&
           k->nb[0] == 2 && v->nb[0] == 2 && k->ne[0] == q->ne[0] && v->ne[1] == k->ne[1] &&
           v->ne[2] == k->ne[2] && k->ne[3] > 0 && q->ne[3] % k->ne[3] == 0 && op->type == GGML_TYPE_F32 &&
           ggml_is_contiguous(op) && op->ne[0] == v->ne[0] && op->ne[1] == q->ne[2] && op->ne[2] == q->ne[1] &&
           ck_attention_supported(q->ne[0], v->ne[0], q->ne[2], k->ne[2]);
}

// The argmax of each row of an F32 matrix (greedy rows sampled in the
// graph, right after the output projection computed here): read in place
// by the shared threads, instead of llama.cpp copying every row's logits
// out for the host to read again.
static bool supports_argmax(const struct ggml_tensor * op) {
    const struct ggml_tensor * x = op->src[0];
    return x->type == GGML_TYPE_F32 && x->nb[0] == sizeof(float) && x->ne[2] == 1 && x->ne[3] == 1 &&
           op->type == GGML_TYPE_I32 && ggml_is_contiguous(op) && x->ne[0] <= INT32_MAX;
}

static bool device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    (void)dev;
    switch (op->op) {
        case GGML_OP_ARGMAX: return supports_argmax(op);
        case GGML_OP_MUL_MAT: return supports_mul_mat(op);
        case GGML_OP_GET_ROWS: return supports_get_rows(op);
        case GGML_OP_FLASH_ATTN_EXT: return supports_flash_attn(op);
        default: return ck_is_layout_only(op->op);
    }
}

static const char * backend_name(ggml_backend_t backend) {
    (void)backend;
    return CK_DEVICE_NAME;
}

static void backend_free(ggml_backend_t backend) {
    ck_compute_free(backend->context);
    free(backend);
}

static enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph) {
    return ck_compute_graph(backend->context, cgraph, thread_pool, thread_shares.streams > 0 ? &thread_shares : NULL);
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
        ck_compute_set_threads(backend->context, n_threads);
    }
}

// ---------------------------------------------------------------- device

static char description[96];

static const char * device_name(ggml_backend_dev_t dev) {
    (void)dev;
    return CK_DEVICE_NAME;
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
    struct ck_compute * ctx = ck_compute_new();
    ggml_backend_t backend = calloc(1, sizeof *backend);
    if (ctx == NULL || backend == NULL) {
        if (ctx != NULL) {
            ck_compute_free(ctx);
        }
        free(backend);
        return NULL;
    }
    backend->guid = backend_guid();
    backend->iface = backend_interface;
    backend->device = dev;
    backend->context = ctx;
    return backend;
}

static ggml_backend_buffer_type_t device_buffer_type(ggml_backend_dev_t dev) {
    (void)dev;
    return &ck_buffer_type;
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
    return CK_DEVICE_NAME;
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
// run with (this CPU's best, or `ceiling` if lower and not 0), or 0 where
// this CPU has none of theirs (nothing registered).
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

int cortex_kernels_register(int ceiling) {
    pthread_mutex_lock(&register_lock);
    if (ck_kernels_isa == CK_ISA_NONE) {
        const enum ck_isa isa = ceiling > 0 ? ck_best_isa_up_to((enum ck_isa)ceiling) : ck_detect_isa();
        if (isa != CK_ISA_NONE) {
            ck_buffer_type.device = device_of_registry();
            snprintf(description, sizeof description, "cortex kernels for 4- to 8-bit weights and attention (%s)",
                     ck_isa_name(isa));
            ggml_backend_register(&registry);
            ck_kernels_isa = isa;
        }
    }
    pthread_mutex_unlock(&register_lock);
    return (int)ck_kernels_isa;
}

// The attention kernel's self-check (see attention.h) for the Rust tests.
int cortex_kernels_attention_self_check(int isa, int against, char * why, size_t why_len) {
    return ck_attention_self_check((enum ck_isa)isa, (enum ck_isa)against, why, why_len);
}

// The kernels' self-check (see kernels.h) for the Rust tests.
int cortex_kernels_self_check(int isa, char * why, size_t why_len) {
    return ck_self_check((enum ck_isa)isa, why, why_len);
}

double cortex_kernels_int8_per_second(int isa, double seconds) {
    return ck_int8_per_second((enum ck_isa)isa, seconds);
}

int cortex_kernels_detect_isa(void) { return (int)ck_detect_isa(); }

int cortex_kernels_isa_supported(int isa) { return ck_isa_supported((enum ck_isa)isa); }
