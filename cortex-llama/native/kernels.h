// cortex's CPU matrix kernels: weights of a quantized format packed into
// panels of 16 rows, multiplied by activations quantized to 8 bits, with
// the 16 rows of a panel in the 16 lanes of one register so that a block's
// dot products need no horizontal sums. Every output element is computed by
// the same sequence of operations whatever the batch (a row alone or in a
// panel beside others), so results do not depend on batch composition.
//
// Shared by backend.c (the ggml backend that places weights and runs the
// products) and the self-check the Rust tests call.

#ifndef CORTEX_KERNELS_H
#define CORTEX_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Rows per panel: the lanes of a 512-bit register of 32-bit sums.
#define CK_PANEL_ROWS 16
// Weights per quantization block (every panel format alike).
#define CK_BLOCK 32
// Blocks per k-quant super-block (256 weights), the unit of the kernels that
// take activations with one scale per super-block.
#define CK_SUPER_BLOCKS 8

// The formats with kernels (the values are ggml's type ids, but for
// cortex's own blocks, panels.h, which no ggml type has).
enum ck_format {
    CK_Q4_1 = 3,
    CK_Q5_1 = 7,  // its 5-bit quants a byte each in the panels
    CK_Q8_0 = 8,
    // Q6_K's blocks (cortex's Q6 block: 32 6-bit quants, a scale for each 16
    // weights) in panels of 7 bits a weight: each quant's low 4 bits in a
    // plane of nibbles, its top 2 in a plane of bit pairs (memory bounds a
    // small batch, and this reads 22% fewer bytes than a byte a quant).
    CK_Q6_PLANES = 101,
    // Q4_K's own blocks (4.6 bits a weight where Q4_1 takes 5): the nibbles
    // of Q4_1, each 32 weights' 8-bit scale and min, and per 256 weights the
    // super-block's fp16 d and dmin; weight j of a block is
    // (d sc) q_j - dmin mn, as ggml computes it.
    CK_Q4_K = 102,
};

// Instruction sets the kernels are built for, best first.
enum ck_isa {
    CK_ISA_NONE = 0,
    CK_ISA_AVX2 = 1,       // AVX2 + FMA + F16C
    CK_ISA_AVX_VNNI = 2,   // the same with AVX-VNNI (256-bit vpdpbusd, no AVX-512)
    CK_ISA_AVX512 = 3,     // AVX-512 F/BW/VL + VNNI
};

// The best kernels this CPU runs (CK_ISA_NONE: none; the backend then
// stays unregistered and llama.cpp's own kernels run).
enum ck_isa ck_detect_isa(void);
// Whether this CPU runs `isa`'s kernels (an AVX-512 CPU may lack AVX-VNNI,
// whose instructions are encoded apart).
bool ck_isa_supported(enum ck_isa isa);
// The best kernels this CPU runs that are no better than `ceiling`.
enum ck_isa ck_best_isa_up_to(enum ck_isa ceiling);
const char * ck_isa_name(enum ck_isa isa);

// Other ggml formats are packed as one of these (convert.c): Q4_0 as
// Q4_1, Q4_K as CK_Q4_K, Q5_K as Q5_1, Q6_K as Q6_PLANES; Q5_0 as Q5_1 for
// the AVX2 kernels (where a block of unsigned quants costs about half a
// Q8_0 one), and as Q8_0 for the VNNI ones (where vpdpbusd costs the same
// for both, and Q8_0 has no minimum to add).
bool ck_convertible(int type);
// The panel format a ggml type is packed as for the kernels of `isa`.
enum ck_format ck_panel_format(enum ck_isa isa, int type);
// Weights per block of a ggml type (32, or 256 for the k-quants).
int64_t ck_type_block(int type);
// Rows of a convertible type -> rows of its panel format's ggml blocks, and
// back (as ggml's quantizer writes the values they hold).
void ck_convert(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols);
void ck_convert_back(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols);

// Bytes a packed matrix of ggml type `type` and `rows` x `cols` takes (in
// its panel format; Q4_1: as in ggml; Q5_1: a byte per quant, 576 bytes
// per panel block; Q6_PLANES: 424 (a panel's 8 blocks of 384 bytes after
// each super-block's 320); Q4_K: 296 (8 blocks of 256 after each
// super-block's 320); Q8_0: plus a 16-bit sum of each
// row's block, 576 bytes per panel block instead of 544). Returns 0 for a shape
// the kernels do not take.
size_t ck_packed_size(enum ck_isa isa, int type, int64_t rows, int64_t cols);
// Whether a matrix of this type and shape can be packed.
bool ck_packable(int type, int64_t rows, int64_t cols);

// ggml's row-major blocks of `type` -> panels, and back.
void ck_pack(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols);
void ck_unpack(enum ck_isa isa, int type, const void * src, void * dst, int64_t rows, int64_t cols);
// Rows of a packed matrix as floats (for GET_ROWS).
void ck_dequantize_row(enum ck_format format, const void * packed, int64_t rows, int64_t cols,
                       int64_t row, float * out);

// Activations quantized for one weight format: per column, `cols / 32`
// blocks of 32 bytes (int8; for the VNNI kernels' Q8_0, and the AVX2
// kernels' Q6_PLANES in a product of 32 columns or more, int8 + 128 as
// unsigned), then per block its scale and (Q4_1, Q5_1) scale times the sum
// of its quants, as floats, rounded through fp16 as ggml's Q8_1 and Q8_0
// blocks hold them (but Q5_1's sum: the scale times the sum, exact); for
// Q6_PLANES, in the sum's place, the sums of the block's two halves' quants
// as two int16, then per block -32 times those half sums as two int32; for
// Q4_K and Q6_PLANES, as ggml's Q8_K: one scale per 256 weights (in each of
// its blocks' places, a float not rounded) and, in Q4_K's sums' place,
// each block's sum of quants as int16. The encoding depends on the kernels that
// will read them (`isa`, and the product's number of columns `n_cols`; see
// activation_encoding in panels.h).
size_t ck_activation_bytes(int64_t cols);
void ck_quantize_column(enum ck_isa isa, enum ck_format format, int64_t n_cols, const float * x, int64_t cols,
                        uint8_t * out);

// dst[col * ldd + row] for rows [panel_begin * 16, panel_end * 16) and
// columns [0, n_cols) of `activations` (n_cols quantized columns, each
// ck_activation_bytes(cols) apart).
void ck_gemm(enum ck_isa isa, enum ck_format format, const void * packed, int64_t cols,
             int64_t panel_begin, int64_t panel_end, const uint8_t * activations, int64_t n_cols,
             float * dst, int64_t ldd);

// The index of the largest of `n` floats: the lowest on ties, NaN ignored;
// with nothing above -inf, the first -inf, else (all NaN) 0. The rule of
// cortex's host sampler, so a greedy row gets the same token wherever it is
// taken (argmax.c).
int32_t ck_argmax(enum ck_isa isa, const float * x, int64_t n);

// The multiply-adds a second of `isa`'s int8 instruction (vpdpbusd zmm,
// vpdpbusd ymm, vpmaddubsw ymm: what the matrix tiles are built on) run
// back to back on the calling thread for about `seconds` (peak.c); 0 where
// this CPU does not run `isa`.
double ck_int8_per_second(enum ck_isa isa, double seconds);

// Packs random matrices of each format and shape, multiplies them with the
// kernels of `isa` at several batch sizes, and compares every element with
// a scalar reference; returns the number of mismatches (0: all agree) and
// writes the first into `why`.
int ck_self_check(enum ck_isa isa, char * why, size_t why_len);

#endif
