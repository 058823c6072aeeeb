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
// Runs a split of the graph (products, attention, row lookups) on `pool`
// (the caller's ggml threadpool; NULL: one of the instance's own).
enum ggml_status ck_compute_graph(struct ck_compute * compute, struct ggml_cgraph * graph, void * pool);
// Operations that only relabel memory (nothing to compute).
bool ck_is_layout_only(enum ggml_op op);

#endif
