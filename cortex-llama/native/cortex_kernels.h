// The entry points the Rust binding calls (`src/sys/kernels.rs` declares
// them again, in Rust; a test of the binding checks that both name the same
// functions, and that `enum ck_isa`'s values are the Rust enum's). Defined
// in backend.c and compute.c, which include this header so that the
// compiler checks each definition against its prototype.

#ifndef CORTEX_KERNELS_ENTRY_H
#define CORTEX_KERNELS_ENTRY_H

#include <stddef.h>
#include <stdint.h>

// Registers the kernels with ggml, once; returns the instruction set they
// run with (this CPU's best, or `ceiling` if lower and not 0), or 0 where
// this CPU has none of theirs (nothing registered).
int cortex_kernels_register(int ceiling);
// This CPU's best instruction set (`enum ck_isa`), 0 for none.
int cortex_kernels_detect_isa(void);
// Whether this CPU runs the instruction set `isa` (`enum ck_isa`).
int cortex_kernels_isa_supported(int isa);
// The thread pool the calling thread's next decodes run their work on.
void cortex_kernels_set_threadpool(void * pool);
// The prefix shares of the streams the calling thread's next decodes
// compute (see ck_prefix_shares); `streams` 0 clears them.
void cortex_kernels_set_prefix_shares(const int32_t * source, const int32_t * cells, int32_t streams);
// Work items of shared-prefix groups computed so far in this process.
long long cortex_kernels_attention_group_items(void);
// Whether the kernels multiply a weight matrix of ggml type `type` with
// `rows` rows of `cols` elements (1), or leave it to llama.cpp (0).
int cortex_kernels_multiplies(int type, long long rows, long long cols);
// Whether models loaded on the calling thread place their weights here.
void cortex_kernels_place_weights(int place);
// The kernels' self-check (see kernels.h): 0 when they agree with the
// scalar reference, else 1 with why in `why`.
int cortex_kernels_self_check(int isa, char * why, size_t why_len);
// The attention kernel's self-check (see attention.h).
int cortex_kernels_attention_self_check(int isa, int against, char * why, size_t why_len);
// Multiply-adds a second of `isa`'s int8 instruction run back to back on
// the calling thread for about `seconds` (see kernels.h).
double cortex_kernels_int8_per_second(int isa, double seconds);

#endif
