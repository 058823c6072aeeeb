// Activations quantized to 8 bits as ggml's Q8_1 and Q8_0 blocks hold them,
// into the column layout the kernels read (see kernels.h): in plain C, and
// a block at a time in AVX-512 and AVX2 registers, all bit for bit alike.

#include <math.h>
#include <string.h>

#include "fp16.h"
#include "panels.h"

// One column: nb x 32 quant bytes, nb float scales, nb float scaled sums
// (Q6_PLANES: nb pairs of int16 half sums), nb pairs of int32 (Q6_PLANES:
// -32 times the half sums), padded to a cache line.
size_t ck_activation_bytes(int64_t cols) {
    const size_t nb = (size_t)(cols / CK_BLOCK);
    return (nb * (CK_BLOCK + 16) + 63) & ~(size_t)63;
}

// A block's scale times the sum of its quants, for the formats with a
// minimum: for Q4_1 and Q4_K through fp16, as ggml's Q8_1 holds it; for Q5_1 the
// stored scale times the sum, exact in a float (11 + 12 bits). A Q5_1
// minimum's product cancels most of the quants' (Q5_0's is -16 d, its
// quants offset by 16), so an fp16 rounding of the sum would weigh up to
// 16 x 32 times a quant's rounding; exact, it weighs nothing.
// (`through_fp16`: the scale times the sum rounded through fp16, by the
// caller's instructions.)
static inline float scaled_sum(enum ck_format format, float stored_scale, float through_fp16, int sum) {
    switch (format) {
        case CK_Q4_1:
        case CK_Q4_K: return through_fp16;
        case CK_Q5_1: return stored_scale * (float)sum;
        default: return 0.0f;
    }
}

// Block b's entry in the sums: its scaled sum, or for Q6_PLANES the sums of
// its halves' quants (`first_half`: of quants 0-15), from which a kernel
// starts each half's integer sum at -32 times it, and those starts too,
// after the sums.
static inline void set_block_sum(enum ck_format format, float * sums, int64_t nb, int64_t b, float stored_scale,
                                 float through_fp16, int sum, int first_half) {
    if (format == CK_Q6_PLANES) {
        const int16_t halves[2] = {(int16_t)first_half, (int16_t)(sum - first_half)};
        memcpy(&sums[b], halves, sizeof halves);
        const int32_t starts[2] = {-Q6_OFFSET * first_half, -Q6_OFFSET * (sum - first_half)};
        memcpy(sums + nb + 2 * b, starts, sizeof starts);
        return;
    }
    sums[b] = scaled_sum(format, stored_scale, through_fp16, sum);
}

// Block b's quants as nearbyintf(x * id), written (offset by 128 when
// `offset`); returns their sum, and that of the first 16 in `first_half`.
static int quantize_block_scalar(const float * xb, float id, bool offset, int8_t * q, int * first_half) {
    int sum = 0;
    for (int j = 0; j < CK_BLOCK; j++) {
        const int v = (int)nearbyintf(xb[j] * id);
        q[j] = (int8_t)v;
        sum += v;
        if (j == 15) {
            *first_half = sum;
        }
    }
    if (offset) {
        for (int j = 0; j < CK_BLOCK; j++) {
            ((uint8_t *)q)[j] = (uint8_t)(q[j] + 128);
        }
    }
    return sum;
}

// Activations with one scale per super-block: each block's entry holds it;
// for Q6_PLANES the sums' place holds the blocks' half sums (as with a scale
// per block), else the block sums (int16) fill half of it, the rest zeros.
static void set_super_block(enum ck_format format, float * scales, int64_t nb, int64_t b, float d, int sum,
                            int first_half) {
    scales[b] = d;
    if (format == CK_Q6_PLANES) {
        set_block_sum(format, scales + nb, nb, b, d, d, sum, first_half);
        return;
    }
    int16_t * block_sums = (int16_t *)(scales + nb);
    block_sums[b] = (int16_t)sum;
    if (b == nb - 1) {
        memset(block_sums + nb, 0, sizeof(int16_t) * (size_t)nb);
    }
}

// The largest magnitude of `n` weights, in plain C.
static float amax_scalar(const float * x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    return amax;
}

// As ggml's quantize_row_q8_1 / quantize_row_q8_0: scale = max|x| / 127,
// quants rounded to nearest even, scale (and scale x sum) through fp16. The
// AVX-512 Q8_0 kernel takes its quants offset by 128, as unsigned bytes
// (VNNI multiplies unsigned by signed bytes). One scale per super-block:
// as ggml's quantize_row_q8_K, max|x| over 256 weights, the scale a float.
void ck_quantize_column_scalar(enum ck_format format, struct ck_encoding encoding, const float * x, int64_t cols,
                               uint8_t * out) {
    const int64_t nb = cols / CK_BLOCK;
    float * scales = (float *)(out + (size_t)nb * CK_BLOCK);
    float * sums = scales + nb;
    float amax = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float * xb = x + b * CK_BLOCK;
        if (!encoding.per_super_block) {
            amax = amax_scalar(xb, CK_BLOCK);
        } else if (b % CK_SUPER_BLOCKS == 0) {
            amax = amax_scalar(xb, CK_SUPER_BLOCKS * CK_BLOCK);
        }
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int first_half = 0;
        const int sum = quantize_block_scalar(xb, id, encoding.offset, (int8_t *)out + b * CK_BLOCK, &first_half);
        if (encoding.per_super_block) {
            set_super_block(format, scales, nb, b, d, sum, first_half);
            continue;
        }
        scales[b] = ck_round_through_fp16(d);
        set_block_sum(format, sums, nb, b, scales[b], ck_round_through_fp16(d * (float)sum), sum, first_half);
    }
}

static void quantize_column_avx512(enum ck_format format, bool offset, const float * x, int64_t cols,
                                   uint8_t * out);
static void quantize_column_avx2(enum ck_format format, struct ck_encoding encoding, const float * x, int64_t cols,
                                 uint8_t * out);

void ck_quantize_column(enum ck_isa isa, enum ck_format format, int64_t n_cols, const float * x, int64_t cols,
                        uint8_t * out) {
    const struct ck_encoding encoding = activation_encoding(isa, format, n_cols);
#if CK_X86
    if (isa == CK_ISA_AVX512 && !encoding.per_super_block) {
        quantize_column_avx512(format, encoding.offset, x, cols, out);
        return;
    }
    if (ymm_isa(isa) || encoding.per_super_block) {
        quantize_column_avx2(format, encoding, x, cols, out);
        return;
    }
#endif
    ck_quantize_column_scalar(format, encoding, x, cols, out);
}

#if CK_X86

// The same quantization as ck_quantize_column_scalar, a block at a time in
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
        const int first_half = _mm512_reduce_add_epi32(q0);
        const int sum = first_half + _mm512_reduce_add_epi32(q1);
        _mm_storeu_si128((__m128i *)(out + b * CK_BLOCK), _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, bias)));
        _mm_storeu_si128((__m128i *)(out + b * CK_BLOCK + 16), _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, bias)));
        scales[b] = _cvtsh_ss(_cvtss_sh(d, 0));
        set_block_sum(format, sums, nb, b, scales[b], _cvtsh_ss(_cvtss_sh(d * (float)sum, 0)), sum, first_half);
    }
}

// The sum of a vector's eight int32.
CK_AVX2 CK_INLINE int sum_epi32_ymm(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

// The largest magnitude of `n` vectors of 8 floats.
CK_AVX2 CK_INLINE float amax_ymm(const float * x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
    }
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

CK_AVX2 static void quantize_column_avx2(enum ck_format format, struct ck_encoding encoding, const float * x,
                                        int64_t cols, uint8_t * out) {
    const int64_t nb = cols / CK_BLOCK;
    float * scales = (float *)(out + (size_t)nb * CK_BLOCK);
    float * sums = scales + nb;
    float amax = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        if (!encoding.per_super_block) {
            amax = amax_ymm(x + b * CK_BLOCK, 4);
        } else if (b % CK_SUPER_BLOCKS == 0) {
            amax = amax_ymm(x + b * CK_BLOCK, CK_SUPER_BLOCKS * CK_BLOCK / 8);
        }
        const float d = amax / 127.f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * CK_BLOCK + 8 * i), id));
        }
        const int first_half = sum_epi32_ymm(_mm256_add_epi32(q[0], q[1]));
        const int sum = first_half + sum_epi32_ymm(_mm256_add_epi32(q[2], q[3]));
        // Narrow to bytes: the packs interleave lanes; a permute restores order.
        const __m256i lo = _mm256_packs_epi32(q[0], q[1]);
        const __m256i hi = _mm256_packs_epi32(q[2], q[3]);
        __m256i bytes = _mm256_packs_epi16(lo, hi);
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        if (encoding.offset) {
            bytes = _mm256_add_epi8(bytes, _mm256_set1_epi8((char)128));
        }
        _mm256_storeu_si256((__m256i *)(out + b * CK_BLOCK), bytes);
        if (encoding.per_super_block) {
            set_super_block(format, scales, nb, b, d, sum, first_half);
            continue;
        }
        scales[b] = _cvtsh_ss(_cvtss_sh(d, 0));
        set_block_sum(format, sums, nb, b, scales[b], _cvtsh_ss(_cvtss_sh(d * (float)sum, 0)), sum, first_half);
    }
}

#endif  // CK_X86
