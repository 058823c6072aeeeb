// What the files of cortex's ggml backend share (see backend.c).

#ifndef CORTEX_BACKEND_H
#define CORTEX_BACKEND_H

#include <stdbool.h>

#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kernels.h"

#define CK_DEVICE_NAME "CortexCPU"
#define CK_ALIGNMENT 64

// The instruction set the kernels run with (set once, at registration).
extern enum ck_isa ck_kernels_isa;

// buffer.c: the buffer type that holds packed weights (host memory).
extern struct ggml_backend_buffer_type ck_buffer_type;
// Whether a weight of this type and shape is stored packed.
bool ck_is_packable(const struct ggml_tensor * t);
bool ck_in_buffer_type(const struct ggml_tensor * t);
// Packs (once) a weight whose bytes arrived in ggml's layout.
void ck_ensure_packed(struct ggml_tensor * t);

// compute.c: a backend instance's work, run on the CPU backend's threads.
struct ck_compute;
struct ck_compute * ck_compute_new(void);
void ck_compute_free(struct ck_compute * compute);
void ck_compute_set_threads(struct ck_compute * compute, int n_threads);
// Which streams of a KV cache hold copies of another's first cells (a shared
// prompt prefix), as cortex set them for the calling thread's decode:
// stream s holds stream source[s]'s first cells[s] cells (source[s] < 0:
// none); `streams` entries.
struct ck_prefix_shares {
    const int32_t * source;
    const int32_t * cells;
    int32_t streams;
};
// Runs a split of the graph (products, attention, row lookups) on `pool`
// (the caller's ggml threadpool; NULL: one of the instance's own), its
// attention reading shared prefixes once where `shares` (or NULL) says.
enum ggml_status ck_compute_graph(struct ck_compute * compute, struct ggml_cgraph * graph, void * pool,
                                  const struct ck_prefix_shares * shares);
// Operations that only relabel memory (nothing to compute).
bool ck_is_layout_only(enum ggml_op op);

#endif
