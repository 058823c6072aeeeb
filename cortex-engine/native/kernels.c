// cortex's CPU matrix kernels (see kernels.h for the layout and contract).
//
// llama.cpp multiplies a Q4_1 matrix one dot product at a time: for each
// (row, column) pair it unpacks the row's nibbles again and sums each
// block's 32 products across a register. Here a panel of 16 rows is laid
// out so that lane r of a register holds 4 consecutive weights of row r:
// one VNNI instruction then adds 4 products to each of the 16 rows' sums,
// a block needs 8 of them and no horizontal sum, and the unpacked weights
// stay in registers while up to 8 columns use them.

#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#    define CK_X86 1
#    include <immintrin.h>
#endif

// Bytes of one block of one panel: 16 rows of one quantization block.
#define Q4_1_PANEL_BLOCK 320  // 4 x 64 nibble bytes, 16 fp16 d, 16 fp16 m
#define Q8_0_PANEL_BLOCK 576  // 8 x 64 bytes, 16 fp16 d, 16 int16 row sums
#define Q4_1_BLOCK 20         // ggml's block_q4_1: fp16 d, fp16 m, 16 bytes
#define Q8_0_BLOCK 34         // ggml's block_q8_0: fp16 d, 32 bytes

// ---------------------------------------------------------------- fp16

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ggml's portable conversions (exact, round to nearest even), so that
// scales rounded here equal those ggml's F16C path rounds.
static float fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result = sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized));
    return float_of(result);
}

static uint16_t fp32_to_fp16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = bits_of(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) {
        bias = 0x71000000u;
    }
    base = float_of((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = bits_of(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float round_through_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// ---------------------------------------------------------------- ISA

enum ck_isa ck_detect_isa(void) {
#if CK_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        return CK_ISA_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        return CK_ISA_AVX2;
    }
#endif
    return CK_ISA_NONE;
}

const char * ck_isa_name(enum ck_isa isa) {
    switch (isa) {
        case CK_ISA_AVX512: return "AVX-512 VNNI";
        case CK_ISA_AVX2: return "AVX2";
        default: return "none";
    }
}

// ---------------------------------------------------------------- layout

static size_t panel_block_bytes(enum ck_format format) {
    return format == CK_Q4_1 ? Q4_1_PANEL_BLOCK : Q8_0_PANEL_BLOCK;
}

static size_t block_bytes(enum ck_format format) {
    return format == CK_Q4_1 ? Q4_1_BLOCK : Q8_0_BLOCK;
}

bool ck_packable(int type, int64_t rows, int64_t cols) {
    return (type == CK_Q4_1 || type == CK_Q8_0) && rows > 0 && cols > 0 &&
           rows % CK_PANEL_ROWS == 0 && cols % CK_BLOCK == 0;
}

size_t ck_packed_size(enum ck_format format, int64_t rows, int64_t cols) {
    if (!ck_packable((int)format, rows, cols)) {
        return 0;
    }
    return (size_t)(rows / CK_PANEL_ROWS) * (size_t)(cols / CK_BLOCK) * panel_block_bytes(format);
}

// Where row r's block b lives in ggml's layout, and in the panels.
static const uint8_t * ggml_block(enum ck_format format, const void * m, int64_t cols, int64_t r, int64_t b) {
    return (const uint8_t *)m + ((size_t)r * (size_t)(cols / CK_BLOCK) + (size_t)b) * block_bytes(format);
}

static size_t panel_block_offset(enum ck_format format, int64_t cols, int64_t panel, int64_t b) {
    return ((size_t)panel * (size_t)(cols / CK_BLOCK) + (size_t)b) * panel_block_bytes(format);
}

// Q4_1 panel block: chunk h (64 bytes) holds, in lane r, row r's nibble
// bytes 4h..4h+3; their low nibbles are weights 4h..4h+3 and their high
// nibbles weights 16+4h..16+4h+3. Then 16 fp16 d and 16 fp16 m.
// Q8_0 panel block: chunk g holds, in lane r, row r's weights 4g..4g+3;
// then 16 fp16 d and the 16 rows' sums of the block's weights (int16).
static void pack_block(enum ck_format format, const void * src, int64_t cols, int64_t panel, int64_t b,
                       uint8_t * out) {
    for (int r = 0; r < CK_PANEL_ROWS; r++) {
        const uint8_t * blk = ggml_block(format, src, cols, panel * CK_PANEL_ROWS + r, b);
        if (format == CK_Q4_1) {
            for (int h = 0; h < 4; h++) {
                memcpy(out + 64 * h + 4 * r, blk + 4 + 4 * h, 4);
            }
            memcpy(out + 256 + 2 * r, blk, 2);      // d
            memcpy(out + 288 + 2 * r, blk + 2, 2);  // m
        } else {
            int16_t sum = 0;
            for (int g = 0; g < 8; g++) {
                memcpy(out + 64 * g + 4 * r, blk + 2 + 4 * g, 4);
            }
            for (int k = 0; k < CK_BLOCK; k++) {
                sum = (int16_t)(sum + (int8_t)blk[2 + k]);
            }
            memcpy(out + 512 + 2 * r, blk, 2);  // d
            memcpy(out + 544 + 2 * r, &sum, 2);
        }
    }
}

static void unpack_block(enum ck_format format, const uint8_t * in, int r, uint8_t * blk) {
    if (format == CK_Q4_1) {
        for (int h = 0; h < 4; h++) {
            memcpy(blk + 4 + 4 * h, in + 64 * h + 4 * r, 4);
        }
        memcpy(blk, in + 256 + 2 * r, 2);
        memcpy(blk + 2, in + 288 + 2 * r, 2);
    } else {
        for (int g = 0; g < 8; g++) {
            memcpy(blk + 2 + 4 * g, in + 64 * g + 4 * r, 4);
        }
        memcpy(blk, in + 512 + 2 * r, 2);
    }
}

void ck_pack(enum ck_format format, const void * src, void * dst, int64_t rows, int64_t cols) {
    const int64_t nb = cols / CK_BLOCK;
    for (int64_t p = 0; p < rows / CK_PANEL_ROWS; p++) {
        for (int64_t b = 0; b < nb; b++) {
            pack_block(format, src, cols, p, b, (uint8_t *)dst + panel_block_offset(format, cols, p, b));
        }
    }
}

void ck_unpack(enum ck_format format, const void * src, void * dst, int64_t rows, int64_t cols) {
    const int64_t nb = cols / CK_BLOCK;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t * in =
                (const uint8_t *)src + panel_block_offset(format, cols, r / CK_PANEL_ROWS, b);
            unpack_block(format, in, (int)(r % CK_PANEL_ROWS), (uint8_t *)ggml_block(format, dst, cols, r, b));
        }
    }
}

void ck_dequantize_row(enum ck_format format, const void * packed, int64_t rows, int64_t cols, int64_t row,
                       float * out) {
    (void)rows;
    uint8_t blk[Q8_0_BLOCK];
    for (int64_t b = 0; b < cols / CK_BLOCK; b++) {
        const uint8_t * in =
            (const uint8_t *)packed + panel_block_offset(format, cols, row / CK_PANEL_ROWS, b);
        unpack_block(format, in, (int)(row % CK_PANEL_ROWS), blk);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const float d = fp16_to_fp32(dh);
        float * o = out + b * CK_BLOCK;
        if (format == CK_Q4_1) {
            uint16_t mh;
            memcpy(&mh, blk + 2, 2);
            const float m = fp16_to_fp32(mh);
            for (int j = 0; j < 16; j++) {
                o[j] = (float)(blk[4 + j] & 0x0F) * d + m;
                o[j + 16] = (float)(blk[4 + j] >> 4) * d + m;
            }
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                o[j] = (float)(int8_t)blk[2 + j] * d;
            }
        }
    }
}

// ---------------------------------------------------------------- activations

// One column: nb x 32 quant bytes, nb float scales, nb float scaled sums,
// padded to a cache line.
size_t ck_activation_bytes(int64_t cols) {
    const size_t nb = (size_t)(cols / CK_BLOCK);
    return (nb * (CK_BLOCK + 8) + 63) & ~(size_t)63;
}

static inline const float * column_scales(const uint8_t * column, int64_t nb) {
    return (const float *)(column + (size_t)nb * CK_BLOCK);
}

static inline const float * column_sums(const uint8_t * column, int64_t nb) {
    return (const float *)(column + (size_t)nb * CK_BLOCK) + nb;
}

// As ggml's quantize_row_q8_1 / quantize_row_q8_0: scale = max|x| / 127,
// quants rounded to nearest even, scale (and scale x sum) through fp16.
// The AVX-512 Q8_0 kernel takes its quants offset by 128, as unsigned
// bytes (VNNI multiplies unsigned by signed bytes).
static void quantize_column_scalar(enum ck_format format, bool offset, const float * x, int64_t cols,
                                   uint8_t * out) {
    const int64_t nb = cols / CK_BLOCK;
    float * scales = (float *)(out + (size_t)nb * CK_BLOCK);
    float * sums = scales + nb;
    for (int64_t b = 0; b < nb; b++) {
        const float * xb = x + b * CK_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < CK_BLOCK; j++) {
            amax = fmaxf(amax, fabsf(xb[j]));
        }
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        int8_t * q = (int8_t *)out + b * CK_BLOCK;
        for (int j = 0; j < CK_BLOCK; j++) {
            const int v = (int)nearbyintf(xb[j] * id);
            q[j] = (int8_t)v;
            sum += v;
        }
        if (offset) {
            for (int j = 0; j < CK_BLOCK; j++) {
                ((uint8_t *)q)[j] = (uint8_t)(q[j] + 128);
            }
        }
        scales[b] = round_through_fp16(d);
        sums[b] = format == CK_Q4_1 ? round_through_fp16(d * (float)sum) : 0.0f;
    }
}

// Whether `isa`'s kernel for `format` takes its quants offset by 128.
static bool offset_quants(enum ck_isa isa, enum ck_format format) {
    return format == CK_Q8_0 && isa == CK_ISA_AVX512;
}

static void quantize_column_avx512(enum ck_format format, bool offset, const float * x, int64_t cols,
                                   uint8_t * out);
static void quantize_column_avx2(enum ck_format format, bool offset, const float * x, int64_t cols,
                                 uint8_t * out);

void ck_quantize_column(enum ck_isa isa, enum ck_format format, const float * x, int64_t cols, uint8_t * out) {
    const bool offset = offset_quants(isa, format);
#if CK_X86
    if (isa == CK_ISA_AVX512) {
        quantize_column_avx512(format, offset, x, cols, out);
        return;
    }
    if (isa == CK_ISA_AVX2) {
        quantize_column_avx2(format, offset, x, cols, out);
        return;
    }
#endif
    quantize_column_scalar(format, offset, x, cols, out);
}

// ---------------------------------------------------------------- scalar reference

// The same arithmetic as the vector kernels, one element at a time: a
// block's integer sum (exact), then fmaf(sum, dw * dx, acc) (and for Q4_1
// fmaf(m, dx * sum_x, acc)), blocks in order. The vector kernels must
// agree with it bit for bit.
static float reference_dot(enum ck_format format, const void * m, int64_t cols, int64_t row,
                           const uint8_t * column, bool offset) {
    const int64_t nb = cols / CK_BLOCK;
    const int8_t * q = (const int8_t *)column;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = ggml_block(format, m, cols, row, b);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        const float dw = fp16_to_fp32(dh);
        const float dx = column_scales(column, nb)[b];
        int32_t isum = 0;
        if (format == CK_Q4_1) {
            for (int j = 0; j < 16; j++) {
                isum += (blk[4 + j] & 0x0F) * q[b * CK_BLOCK + j];
                isum += (blk[4 + j] >> 4) * q[b * CK_BLOCK + j + 16];
            }
            uint16_t mh;
            memcpy(&mh, blk + 2, 2);
            acc = fmaf((float)isum, dw * dx, acc);
            acc = fmaf(fp16_to_fp32(mh), column_sums(column, nb)[b], acc);
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                const int x = offset ? (int)((const uint8_t *)q)[b * CK_BLOCK + j] - 128 : q[b * CK_BLOCK + j];
                isum += (int8_t)blk[2 + j] * x;
            }
            acc = fmaf((float)isum, dw * dx, acc);
        }
    }
    return acc;
}

// ---------------------------------------------------------------- AVX-512 VNNI

#if CK_X86

#    define CK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#    define CK_AVX2 __attribute__((target("avx2,fma,f16c")))
#    define CK_INLINE static inline __attribute__((always_inline))

// 16 rows x C columns of a Q4_1 panel.
CK_AVX512 CK_INLINE void q4_1_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q4_1_PANEL_BLOCK;
        __m512i g[8];
        for (int h = 0; h < 4; h++) {
            const __m512i p = _mm512_loadu_si512(blk + 64 * h);
            g[2 * h] = _mm512_and_si512(p, low);
            g[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 256)));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288)));
        for (int c = 0; c < C; c++) {
            const uint8_t * col = act + (size_t)c * astride;
            const int32_t * q = (const int32_t *)(col + (size_t)b * CK_BLOCK);
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g[0], _mm512_set1_epi32(q[0]));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g[1], _mm512_set1_epi32(q[4]));
            s0 = _mm512_dpbusd_epi32(s0, g[2], _mm512_set1_epi32(q[1]));
            s1 = _mm512_dpbusd_epi32(s1, g[3], _mm512_set1_epi32(q[5]));
            s0 = _mm512_dpbusd_epi32(s0, g[4], _mm512_set1_epi32(q[2]));
            s1 = _mm512_dpbusd_epi32(s1, g[5], _mm512_set1_epi32(q[6]));
            s0 = _mm512_dpbusd_epi32(s0, g[6], _mm512_set1_epi32(q[3]));
            s1 = _mm512_dpbusd_epi32(s1, g[7], _mm512_set1_epi32(q[7]));
            const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            const __m512 dx = _mm512_set1_ps(column_scales(col, nb)[b]);
            acc[c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, dx), acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(column_sums(col, nb)[b]), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

// 16 rows x C columns of a Q8_0 panel; the quants come offset by 128.
CK_AVX512 CK_INLINE void q8_0_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q8_0_PANEL_BLOCK;
        __m512i g[8];
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_loadu_si512(blk + 64 * i);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 512)));
        // sum((x + 128) w) = sum(x w) + 128 sum(w)
        const __m512i offset =
            _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(blk + 544))), 7);
        for (int c = 0; c < C; c++) {
            const uint8_t * col = act + (size_t)c * astride;
            const int32_t * q = (const int32_t *)(col + (size_t)b * CK_BLOCK);
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(q[0]), g[0]);
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(q[1]), g[1]);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q[2]), g[2]);
            s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(q[3]), g[3]);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q[4]), g[4]);
            s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(q[5]), g[5]);
            s0 = _mm512_dpbusd_epi32(s0, _mm512_set1_epi32(q[6]), g[6]);
            s1 = _mm512_dpbusd_epi32(s1, _mm512_set1_epi32(q[7]), g[7]);
            const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), offset);
            const __m512 dx = _mm512_set1_ps(column_scales(col, nb)[b]);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

#    define CK_TILE8(tile, w, nb, act, astride, dst, ldd, n)         \
        switch (n) {                                                  \
            case 1: tile(w, nb, act, astride, dst, ldd, 1); break;    \
            case 2: tile(w, nb, act, astride, dst, ldd, 2); break;    \
            case 3: tile(w, nb, act, astride, dst, ldd, 3); break;    \
            case 4: tile(w, nb, act, astride, dst, ldd, 4); break;    \
            case 5: tile(w, nb, act, astride, dst, ldd, 5); break;    \
            case 6: tile(w, nb, act, astride, dst, ldd, 6); break;    \
            case 7: tile(w, nb, act, astride, dst, ldd, 7); break;    \
            default: tile(w, nb, act, astride, dst, ldd, 8); break;   \
        }

CK_AVX512 static void gemm_avx512(enum ck_format format, const uint8_t * packed, int64_t cols, int64_t p0,
                                  int64_t p1, const uint8_t * act, int64_t n_cols, float * dst, int64_t ldd) {
    const int64_t nb = cols / CK_BLOCK;
    const size_t astride = ck_activation_bytes(cols);
    const size_t panel_bytes = (size_t)nb * panel_block_bytes(format);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t * w = packed + (size_t)p * panel_bytes;
        float * out = dst + p * CK_PANEL_ROWS;
        for (int64_t c = 0; c < n_cols; c += 8) {
            const int n = (int)(n_cols - c < 8 ? n_cols - c : 8);
            const uint8_t * a = act + (size_t)c * astride;
            if (format == CK_Q4_1) {
                CK_TILE8(q4_1_tile_avx512, w, nb, a, astride, out + c * ldd, ldd, n)
            } else {
                CK_TILE8(q8_0_tile_avx512, w, nb, a, astride, out + c * ldd, ldd, n)
            }
        }
    }
}

// ---------------------------------------------------------------- AVX2

// 8 rows (half `half` of a panel) x C columns of Q4_1. A block's 16
// products per lane pair fit in 16 bits (16 x 15 x 127 < 32768), so they
// are summed there and widened once.
CK_AVX2 CK_INLINE void q4_1_tile_avx2(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                      float * dst, int64_t ldd, const int C, const int half) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q4_1_PANEL_BLOCK;
        __m256i t[4];
        for (int c = 0; c < C; c++) {
            t[c] = _mm256_setzero_si256();
        }
        for (int h = 0; h < 4; h++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * half));
            const __m256i lo = _mm256_and_si256(p, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                const __m256i a = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(q[h]));
                const __m256i z = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q[4 + h]));
                t[c] = _mm256_add_epi16(t[c], _mm256_add_epi16(a, z));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 256 + 16 * half)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 288 + 16 * half)));
        for (int c = 0; c < C; c++) {
            const uint8_t * col = act + (size_t)c * astride;
            const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(t[c], ones));
            const __m256 dx = _mm256_set1_ps(column_scales(col, nb)[b]);
            acc[c] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, dx), acc[c]);
            acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(column_sums(col, nb)[b]), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm256_storeu_ps(dst + c * ldd + 8 * half, acc[c]);
    }
}

// 8 rows x C columns of Q8_0: |w| times x with w's sign (maddubs takes one
// unsigned operand).
CK_AVX2 CK_INLINE void q8_0_tile_avx2(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                      float * dst, int64_t ldd, const int C, const int half) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q8_0_PANEL_BLOCK;
        __m256i s[4];
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_setzero_si256();
        }
        for (int g = 0; g < 8; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * g + 32 * half));
            const __m256i magnitude = _mm256_sign_epi8(v, v);
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(q[g]), v);
                s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 512 + 16 * half)));
        for (int c = 0; c < C; c++) {
            const __m256 dx = _mm256_set1_ps(column_scales(act + (size_t)c * astride, nb)[b]);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[c]), _mm256_mul_ps(dw, dx), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm256_storeu_ps(dst + c * ldd + 8 * half, acc[c]);
    }
}

#    define CK_TILE2(tile, w, nb, act, astride, dst, ldd, n)                          \
        for (int half = 0; half < 2; half++) {                                          \
            switch (n) {                                                                \
                case 1: tile(w, nb, act, astride, dst, ldd, 1, half); break;            \
                case 2: tile(w, nb, act, astride, dst, ldd, 2, half); break;            \
                case 3: tile(w, nb, act, astride, dst, ldd, 3, half); break;            \
                default: tile(w, nb, act, astride, dst, ldd, 4, half); break;           \
            }                                                                           \
        }

CK_AVX2 static void gemm_avx2(enum ck_format format, const uint8_t * packed, int64_t cols, int64_t p0,
                              int64_t p1, const uint8_t * act, int64_t n_cols, float * dst, int64_t ldd) {
    const int64_t nb = cols / CK_BLOCK;
    const size_t astride = ck_activation_bytes(cols);
    const size_t panel_bytes = (size_t)nb * panel_block_bytes(format);
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t * w = packed + (size_t)p * panel_bytes;
        float * out = dst + p * CK_PANEL_ROWS;
        for (int64_t c = 0; c < n_cols; c += 4) {
            const int n = (int)(n_cols - c < 4 ? n_cols - c : 4);
            const uint8_t * a = act + (size_t)c * astride;
            if (format == CK_Q4_1) {
                CK_TILE2(q4_1_tile_avx2, w, nb, a, astride, out + c * ldd, ldd, n)
            } else {
                CK_TILE2(q8_0_tile_avx2, w, nb, a, astride, out + c * ldd, ldd, n)
            }
        }
    }
}

// The same quantization as quantize_column_scalar, a block at a time in
// registers: the product x * (127 / max) is rounded by the conversion
// (round to nearest even, as nearbyintf), so the quants are identical.
CK_AVX512 static void quantize_column_avx512(enum ck_format format, bool offset, const float * x, int64_t cols,
                                            uint8_t * out) {
    const int64_t nb = cols / CK_BLOCK;
    float * scales = (float *)(out + (size_t)nb * CK_BLOCK);
    float * sums = scales + nb;
    const __m512i bias = _mm512_set1_epi32(offset ? 128 : 0);
    for (int64_t b = 0; b < nb; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * CK_BLOCK);
        const __m512 v1 = _mm512_loadu_ps(x + b * CK_BLOCK + 16);
        const float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.f;
        const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm_storeu_si128((__m128i *)(out + b * CK_BLOCK), _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, bias)));
        _mm_storeu_si128((__m128i *)(out + b * CK_BLOCK + 16), _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, bias)));
        scales[b] = _cvtsh_ss(_cvtss_sh(d, 0));
        sums[b] = format == CK_Q4_1 ? _cvtsh_ss(_cvtss_sh(d * (float)sum, 0)) : 0.0f;
    }
}

CK_AVX2 static void quantize_column_avx2(enum ck_format format, bool offset, const float * x, int64_t cols,
                                        uint8_t * out) {
    const int64_t nb = cols / CK_BLOCK;
    float * scales = (float *)(out + (size_t)nb * CK_BLOCK);
    float * sums = scales + nb;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        __m256 v[4];
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + b * CK_BLOCK + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i q[4];
        __m256i total = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
            total = _mm256_add_epi32(total, q[i]);
        }
        __m128i t = _mm_add_epi32(_mm256_extracti128_si256(total, 1), _mm256_castsi256_si128(total));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        const int sum = _mm_cvtsi128_si32(t);
        // Narrow to bytes: the packs interleave lanes; a permute restores order.
        const __m256i lo = _mm256_packs_epi32(q[0], q[1]);
        const __m256i hi = _mm256_packs_epi32(q[2], q[3]);
        __m256i bytes = _mm256_packs_epi16(lo, hi);
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        if (offset) {
            bytes = _mm256_add_epi8(bytes, _mm256_set1_epi8((char)128));
        }
        _mm256_storeu_si256((__m256i *)(out + b * CK_BLOCK), bytes);
        scales[b] = _cvtsh_ss(_cvtss_sh(d, 0));
        sums[b] = format == CK_Q4_1 ? _cvtsh_ss(_cvtss_sh(d * (float)sum, 0)) : 0.0f;
    }
}

#endif  // CK_X86

void ck_gemm(enum ck_isa isa, enum ck_format format, const void * packed, int64_t cols, int64_t panel_begin,
             int64_t panel_end, const uint8_t * activations, int64_t n_cols, float * dst, int64_t ldd) {
#if CK_X86
    if (isa == CK_ISA_AVX512) {
        gemm_avx512(format, packed, cols, panel_begin, panel_end, activations, n_cols, dst, ldd);
        return;
    }
    if (isa == CK_ISA_AVX2) {
        gemm_avx2(format, packed, cols, panel_begin, panel_end, activations, n_cols, dst, ldd);
        return;
    }
#endif
    (void)isa, (void)format, (void)packed, (void)cols, (void)panel_begin, (void)panel_end;
    (void)activations, (void)n_cols, (void)dst, (void)ldd;
    abort();  // the backend is registered only where a kernel exists
}

// ---------------------------------------------------------------- self-check

static uint32_t next_random(uint64_t * state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

static float random_unit(uint64_t * state) { return (float)next_random(state) / 2147483648.0f - 1.0f; }

// Random ggml blocks: scales of either sign and size, every nibble/byte.
static void random_matrix(enum ck_format format, uint8_t * m, int64_t rows, int64_t cols, uint64_t * state) {
    const size_t n = (size_t)rows * (size_t)(cols / CK_BLOCK);
    for (size_t i = 0; i < n; i++) {
        uint8_t * blk = m + i * block_bytes(format);
        const uint16_t d = fp32_to_fp16(random_unit(state) * 0.02f);
        memcpy(blk, &d, 2);
        if (format == CK_Q4_1) {
            const uint16_t mn = fp32_to_fp16(random_unit(state) * 0.1f);
            memcpy(blk + 2, &mn, 2);
            for (int j = 0; j < 16; j++) {
                blk[4 + j] = (uint8_t)next_random(state);
            }
        } else {
            for (int j = 0; j < CK_BLOCK; j++) {
                blk[2 + j] = (uint8_t)next_random(state);
            }
        }
    }
}

int ck_self_check(enum ck_isa isa, char * why, size_t why_len) {
    static const int64_t shapes[][2] = {{16, 32}, {48, 96}, {192, 576}, {576, 576}, {576, 1536}, {1536, 576}};
    static const int64_t batches[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 33};
    const enum ck_format formats[] = {CK_Q4_1, CK_Q8_0};
    uint64_t state = 0x5eed;
    int mismatches = 0;
    if (why_len) {
        why[0] = 0;
    }
    for (size_t f = 0; f < 2; f++) {
        const enum ck_format format = formats[f];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            const size_t raw_bytes = (size_t)rows * (size_t)(cols / CK_BLOCK) * block_bytes(format);
            uint8_t * raw = malloc(raw_bytes);
            uint8_t * back = malloc(raw_bytes);
            uint8_t * packed = malloc(ck_packed_size(format, rows, cols));
            random_matrix(format, raw, rows, cols, &state);
            ck_pack(format, raw, packed, rows, cols);
            ck_unpack(format, packed, back, rows, cols);
            if (memcmp(raw, back, raw_bytes) != 0 && mismatches++ == 0) {
                snprintf(why, why_len, "format %d %lldx%lld: unpack(pack(m)) != m", (int)format,
                         (long long)rows, (long long)cols);
            }
            float * row = malloc(sizeof(float) * (size_t)cols);
            ck_dequantize_row(format, packed, rows, cols, rows - 1, row);
            for (int64_t k = 0; k < cols; k++) {
                const uint8_t * blk = ggml_block(format, raw, cols, rows - 1, k / CK_BLOCK);
                uint16_t dh;
                memcpy(&dh, blk, 2);
                const int j = (int)(k % CK_BLOCK);
                float expected;
                if (format == CK_Q4_1) {
                    uint16_t mh;
                    memcpy(&mh, blk + 2, 2);
                    const int q = j < 16 ? blk[4 + j] & 0x0F : blk[4 + j - 16] >> 4;
                    expected = (float)q * fp16_to_fp32(dh) + fp16_to_fp32(mh);
                } else {
                    expected = (float)(int8_t)blk[2 + j] * fp16_to_fp32(dh);
                }
                if (row[k] != expected && mismatches++ == 0) {
                    snprintf(why, why_len, "format %d: dequantized row differs at %lld", (int)format, (long long)k);
                }
            }
            free(row);
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                const int64_t n = batches[bi];
                const size_t astride = ck_activation_bytes(cols);
                uint8_t * act = aligned_alloc(64, astride * (size_t)n);
                float * x = malloc(sizeof(float) * (size_t)cols);
                for (int64_t c = 0; c < n; c++) {
                    for (int64_t k = 0; k < cols; k++) {
                        x[k] = random_unit(&state) * (k % 7 == 0 ? 8.0f : 1.0f);
                    }
                    if (c == 1) {
                        memset(x, 0, sizeof(float) * CK_BLOCK);  // an all-zero block
                    }
                    if (c == 2) {
                        // A block whose scale is 1: 2.5, 3.5 and -2.5 are ties,
                        // rounded to even.
                        x[0] = 127.0f;
                        x[1] = 2.5f;
                        x[2] = 3.5f;
                        x[3] = -2.5f;
                    }
                    ck_quantize_column(isa, format, x, cols, act + (size_t)c * astride);
                    uint8_t * scalar = malloc(astride);
                    quantize_column_scalar(format, offset_quants(isa, format), x, cols, scalar);
                    if (memcmp(scalar, act + (size_t)c * astride, (size_t)(cols / CK_BLOCK) * (CK_BLOCK + 8)) != 0 &&
                        mismatches++ == 0) {
                        snprintf(why, why_len, "%s format %d: vector quantization differs from the scalar one",
                                 ck_isa_name(isa), (int)format);
                    }
                    free(scalar);
                }
                float * out = malloc(sizeof(float) * (size_t)(rows * n));
                // Two calls over halves of the panels, as two threads would.
                const int64_t panels = rows / CK_PANEL_ROWS;
                ck_gemm(isa, format, packed, cols, 0, panels / 2, act, n, out, rows);
                ck_gemm(isa, format, packed, cols, panels / 2, panels, act, n, out, rows);
                const bool offset = offset_quants(isa, format);
                for (int64_t c = 0; c < n; c++) {
                    for (int64_t r = 0; r < rows; r++) {
                        const float expected = reference_dot(format, raw, cols, r, act + (size_t)c * astride, offset);
                        const float got = out[c * rows + r];
                        if (memcmp(&expected, &got, sizeof got) != 0 && mismatches++ == 0) {
                            snprintf(why, why_len,
                                     "%s format %d %lldx%lld batch %lld: row %lld column %lld is %.9g, "
                                     "the reference %.9g",
                                     ck_isa_name(isa), (int)format, (long long)rows, (long long)cols, (long long)n,
                                     (long long)r, (long long)c, got, expected);
                        }
                    }
                }
                free(out);
                free(x);
                free(act);
            }
            free(packed);
            free(back);
            free(raw);
        }
    }
    return mismatches;
}
