// The matrix kernels: 16 rows of a packed panel times up to 8 quantized
// columns in registers (AVX-512 VNNI), or 8 rows times 4 (AVX2, AVX-VNNI),
// for every panel of a range (see kernels.h for the contract).

#include <pthread.h>
#include <stdlib.h>

#include "panels.h"

// Panels a column tile runs over before the next columns: each column's
// results then leave as the group's contiguous rows instead of one 64-byte
// line per panel (a write stream per column, each line a read for
// ownership), while the group's weights stay in L2 for the other columns.
// About 20% off a B = 64 product with Gemma's 262,144-row output projection
// (AVX-512). At most 16 panels, and no more than CK_GROUP_BYTES of them: a
// long row's panel is big (147 KiB at 8,192 columns of Q8_0), and 16 of
// them spilled out of L2, so that every column tile after the first read
// them from memory again (a 2,048 x 8,192 Q8_0 product at B = 64: 15%
// slower with 16 panels than with 3).
#define CK_PANEL_GROUP 16
#define CK_GROUP_BYTES (512 * 1024)

static int64_t panel_group(size_t panel_bytes) {
    const int64_t fit = (int64_t)(CK_GROUP_BYTES / panel_bytes);
    return fit < 1 ? 1 : fit > CK_PANEL_GROUP ? CK_PANEL_GROUP : fit;
}

// How far ahead of the block it multiplies a group's first column tile asks
// for the weights it reads next (into L1, from where the other column
// tiles' reads come out of L2): the hardware prefetcher alone left a product
// of weights that stream from memory (a model larger than the caches) 1.4x
// (B = 16) to 1.6x (B = 8) slower than the same product in cache, waiting
// for each line as the tile reached it (2 cores, Zen 5, 8,192 x 2,048 Q4_1).
// No effect on a product whose weights are in cache; at B = 1 it keeps a
// Q8_0 product near what memory gives (the 1B model's output projection,
// run alternately: 46.5 GB/s with it, 34.6 without); results do not change.
// On Intel the lines go to L2 instead (see fetch_ahead).
#define CK_FETCH_AHEAD 8192

#if CK_X86

// Keeps a running integer sum in its register, in program order. Integer
// adds are associative, so GCC otherwise regroups a tile's unrolled sums
// into trees that hold every product at once: with AVX2's 16 registers
// they spill to the stack, and the tile runs 1.2-1.4x slower.
#    define CK_KEEP_SUM(sum) __asm__("" : "+x"(sum))

// Asks for the lines CK_FETCH_AHEAD bytes past a panel block of `bytes`
// (a prefetch never faults, so past the matrix's end is harmless). Into L1
// on AMD, as measured on Zen 5 (where a prefetch to L2, since Zen 4, is at
// times dropped); into L2 on Intel, where a prefetch to L1 holds one of the
// core's few L1 miss buffers until the line comes and starves the loads
// behind it: on a Xeon with AVX-512 (2 cores), the 1B model's 8,192 x 2,048
// Q4 product at B = 1 with weights from memory drew 18.4 GB/s prefetching
// into L1, 23.0 without prefetching, 26.3 into L2 (B = 16 and 64: the same).
CK_INLINE void fetch_ahead(const uint8_t * blk, size_t bytes) {
    if (__builtin_cpu_is("intel")) {
        for (size_t k = 0; k < bytes; k += 64) {
            _mm_prefetch((const char *)blk + CK_FETCH_AHEAD + k, _MM_HINT_T1);
        }
    } else {
        for (size_t k = 0; k < bytes; k += 64) {
            _mm_prefetch((const char *)blk + CK_FETCH_AHEAD + k, _MM_HINT_T0);
        }
    }
}

// 16 fp16 as floats.
CK_AVX512 CK_INLINE __m512 fp16_zmm(const uint8_t * p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

// -x, exactly (the sign flipped, zeros too).
CK_AVX512 CK_INLINE __m512 negated_zmm(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}

// Asks for the lines ahead of block j of a super-block of Q4_K or
// Q6_PLANES panels (`super_bytes`, whole lines): the j-th eighth of the
// super-block's lines, so that its 8 blocks ask for each line of the
// next super-blocks once, header and all. Asking for each block's share
// rounded out to whole lines asked for some twice, and a prefetch is not
// free even of a line in L2: a Q6_PLANES product of 64 columns with its
// weights in L2 (C harness over this file, 1,024 x 2,048, AVX2 code, one
// thread, Intel Xeon) took 1.08-1.10x the time it took without asking,
// with 8 lines asked a block of 424 bytes (1.04x with 7).
CK_INLINE void fetch_super_share(const uint8_t * super, const int j, const size_t super_bytes) {
    const size_t lines = super_bytes / 64;
    const size_t first = (size_t)j * lines / CK_SUPER_BLOCKS, end = (size_t)(j + 1) * lines / CK_SUPER_BLOCKS;
    fetch_ahead(super + 64 * first, 64 * (end - first));
}

// acc + u8 . (the 32-bit word at `word` in every lane): vpdpbusd with the
// word as its embedded broadcast, one fused uop. GCC (12) instead loads each
// word with a vpbroadcastd of its own: a Q4_K tile's block was 180
// instructions instead of 128, more than the core's schedulers hold for its
// 8 columns' chains of sums to overlap the next block's, and a B = 64
// product ran 1.15x slower (Q6_PLANES 1.12x; Intel Xeon, 2 threads).
CK_AVX512 CK_INLINE __m512i dpbusd_word_zmm(__m512i acc, __m512i u8, const int32_t * word) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u8), "m"(*word));
    return acc;
}

// The same from zero: a chain's first step, zeroed by the idiom the core
// renames away rather than copied from a register of zeros.
CK_AVX512 CK_INLINE __m512i dpbusd_word_first_zmm(__m512i u8, const int32_t * word) {
    __m512i acc;
    __asm__("vpxord %0, %0, %0\n\tvpdpbusd %2%{1to16%}, %1, %0" : "=&v"(acc) : "v"(u8), "m"(*word));
    return acc;
}

// A block's float step for a format with a minimum (Q4_1, Q5_1, Q4_K; the
// rows' scales `dw` and minimums `mw`), in the scalar reference's order:
// each column's integer sums times the rows' and the column's scales, plus
// the rows' minimums times the column's scaled sum.
CK_AVX512 CK_INLINE void min_block_zmm(const __m512 dw, const __m512 mw, const uint8_t * act, size_t astride,
                                       int64_t nb, int64_t b, const __m512i * sums, __m512 * acc, const int C) {
    for (int c = 0; c < C; c++) {
        const uint8_t * col = act + (size_t)c * astride;
        const __m512 dx = _mm512_set1_ps(column_scales(col, nb)[b]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[c]), _mm512_mul_ps(dw, dx), acc[c]);
        acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(column_sums(col, nb)[b]), acc[c]);
    }
}

// A block's 4-bit quants (Q4_1's or Q4_K's nibbles, 16 rows), a byte each:
// g[2h] the low nibbles of the block's 64-byte chunk h (quants 4h..4h+3 of
// each row), g[2h+1] its high ones (16+4h..16+4h+3).
CK_AVX512 CK_INLINE void q4_nibbles_zmm(const uint8_t * blk, __m512i * g) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 4; h++) {
        const __m512i p = _mm512_loadu_si512(blk + 64 * h);
        g[2 * h] = _mm512_and_si512(p, low);
        g[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
}

// A block of 4-bit quants (Q4_1's nibbles, 16 rows) times C columns: one
// chain of 32-bit sums per column, the columns side by side at each step of
// the block (see the Q8_0 tile).
CK_AVX512 CK_INLINE void q4_block_sums_zmm(const uint8_t * blk, const uint8_t * act, size_t astride, int64_t b,
                                           __m512i * s, const int C) {
    __m512i g[8];
    q4_nibbles_zmm(blk, g);
    for (int c = 0; c < C; c++) {
        const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
        s[c] = dpbusd_word_first_zmm(g[0], &q[0]);
    }
    for (int i = 1; i < 8; i++) {
        // Quants 4(i/2).. for even i, 16+4(i/2).. for odd i.
        const int word = (i & 1) ? 4 + i / 2 : i / 2;
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            s[c] = dpbusd_word_zmm(s[c], g[i], &q[word]);
        }
    }
}

// 16 rows x C columns of a Q4_1 panel: a block's integer sums, then its
// float step.
CK_AVX512 CK_INLINE void q4_1_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C, const bool fetch) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q4_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q4_1_PANEL_BLOCK);
        }
        __m512i s[8];
        q4_block_sums_zmm(blk, act, astride, b, s, C);
        min_block_zmm(fp16_zmm(blk + 256), fp16_zmm(blk + 288), act, astride, nb, b, s, acc, C);
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

// A half of a Q4_K block (quants 16h..16h+15 of each row: g[h], g[h + 2],
// g[h + 4], g[h + 6] of q4_nibbles_zmm) times C columns, each column's sum
// added to `isum` times the rows' 8-bit scales. Four vpdpbusd from zero: a
// half's sum fits 16 bits (16 x 15 x 127 < 32768), so vpdpwssd multiplies
// it by the scale (its lane's low half; the high half, the sum's sign,
// meets a zero) and adds it in one micro-op, where a whole block's sum as a
// float took a conversion and a multiply-add.
CK_AVX512 CK_INLINE void q4_k_half_sums_zmm(const __m512i * g, const int h, const uint8_t * act, size_t astride,
                                            int64_t b, const __m512i scales, __m512i * isum, const int C) {
    __m512i s[8];
    for (int c = 0; c < C; c++) {
        const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
        s[c] = dpbusd_word_first_zmm(g[h], &q[4 * h]);
    }
    for (int i = 1; i < 4; i++) {
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            s[c] = dpbusd_word_zmm(s[c], g[2 * i + h], &q[4 * h + i]);
        }
    }
    for (int c = 0; c < C; c++) {
        isum[c] = _mm512_dpwssd_epi32(isum[c], s[c], scales);
    }
}

// 16 rows x C columns of Q4_K, the activations with one scale per
// super-block (ggml's Q8_K): each block's halves' integer sums times the
// rows' 8-bit scales, added up in integers over the super-block (exact, as
// the 256-bit tile and ggml sum them); the rows' minimums times the blocks'
// sums of quants, four vpdpwssd of minimum pairs a column; then one float
// step with the rows' d and dmin and the column's scale. Against a block's
// sums as floats times d sc, added up in floats (a conversion and a
// multiply-add a column a block, and d sc a block): 1.06x faster at B = 64
// and 1.02-1.07x at B = 16 (C harness over this file, Intel Xeon, 2,048 x
// 2,048 and 8,192 x 2,048). The tile's results live in `dst` between
// super-blocks: with them in registers as well as the nibbles and the sums,
// the tile would need all 32 registers.
CK_AVX512 CK_INLINE void q4_k_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C, const bool fetch) {
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, _mm512_setzero_ps());
    }
    for (int64_t sb = 0; sb < nb / Q4_K_SUPER_BLOCKS; sb++) {
        const uint8_t * super = w + (size_t)sb * Q4_K_PANEL_SUPER;
        __m512i isum[8];
        for (int c = 0; c < C; c++) {
            isum[c] = _mm512_setzero_si512();
        }
        for (int j = 0; j < Q4_K_SUPER_BLOCKS; j++) {
            const int64_t b = sb * Q4_K_SUPER_BLOCKS + j;
            const uint8_t * blk = super + past_header(CK_Q4_K, j);
            if (fetch) {
                fetch_super_share(super, j, Q4_K_PANEL_SUPER);
            }
            __m512i g[8];
            q4_nibbles_zmm(blk, g);
            // Each row's scale in its lane's low 16 bits, zeros above.
            const __m512i scales = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(super + Q4_K_SCALES(j))));
            q4_k_half_sums_zmm(g, 0, act, astride, b, scales, isum, C);
            q4_k_half_sums_zmm(g, 1, act, astride, b, scales, isum, C);
        }
        // Each row's minimums of blocks 2k and 2k + 1 as a 16-bit pair.
        __m512i mins[4];
        for (int k = 0; k < 4; k++) {
            const __m128i even = _mm_loadu_si128((const __m128i *)(super + Q4_K_SCALES(2 * k) + 16));
            const __m128i odd = _mm_loadu_si128((const __m128i *)(super + Q4_K_SCALES(2 * k + 1) + 16));
            mins[k] = _mm512_cvtepu8_epi16(
                _mm256_set_m128i(_mm_unpackhi_epi8(even, odd), _mm_unpacklo_epi8(even, odd)));
        }
        const __m512 d = fp16_zmm(super);
        const __m512 minus_dmin = negated_zmm(fp16_zmm(super + 32));
        for (int c = 0; c < C; c++) {
            const uint8_t * col = act + (size_t)c * astride;
            const int32_t * pairs = (const int32_t *)(column_block_sums(col, nb) + sb * Q4_K_SUPER_BLOCKS);
            __m512i imin = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                imin = _mm512_dpwssd_epi32(imin, mins[k], _mm512_set1_epi32(pairs[k]));
            }
            const __m512 dx = _mm512_set1_ps(column_scales(col, nb)[sb * Q4_K_SUPER_BLOCKS]);
            __m512 acc = _mm512_loadu_ps(dst + c * ldd);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, dx), acc);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(minus_dmin, dx), acc);
            _mm512_storeu_ps(dst + c * ldd, acc);
        }
    }
}

// 16 rows x C columns of a Q5_1 panel: as Q4_1's, a byte per quant. (One
// function for both, the quants' width a parameter, ran the Q4_1 products
// about 10% slower, with AVX-512 and with AVX-VNNI alike.)
CK_AVX512 CK_INLINE void q5_1_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C, const bool fetch) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q5_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q5_1_PANEL_BLOCK);
        }
        __m512i g[8];
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_loadu_si512(blk + 64 * i);
        }
        __m512i s[8];
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            s[c] = dpbusd_word_first_zmm(g[0], &q[0]);
        }
        for (int i = 1; i < 8; i++) {
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                s[c] = dpbusd_word_zmm(s[c], g[i], &q[i]);
            }
        }
        min_block_zmm(fp16_zmm(blk + 512), fp16_zmm(blk + 544), act, astride, nb, b, s, acc, C);
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

// 16 rows x C columns of a Q8_0 panel; the quants come offset by 128.
CK_AVX512 CK_INLINE void q8_0_tile_avx512(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                          float * dst, int64_t ldd, const int C, const bool fetch) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q8_0_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q8_0_PANEL_BLOCK);
        }
        __m512i g[8];
        for (int i = 0; i < 8; i++) {
            g[i] = _mm512_loadu_si512(blk + 64 * i);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 512)));
        // sum((x + 128) w) = sum(x w) + 128 sum(w): each sum starts at
        // -128 sum(w), so no subtraction per column.
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(blk + 544))), 7));
        // One chain of sums per column, the columns side by side at each
        // step of the block: independent chains hide vpdpbusd's latency,
        // and a column's sums need no final add.
        __m512i s[8];
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            s[c] = _mm512_dpbusd_epi32(start, _mm512_set1_epi32(q[0]), g[0]);
        }
        for (int i = 1; i < 8; i++) {
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                s[c] = _mm512_dpbusd_epi32(s[c], _mm512_set1_epi32(q[i]), g[i]);
            }
        }
        for (int c = 0; c < C; c++) {
            const __m512 dx = _mm512_set1_ps(column_scales(act + (size_t)c * astride, nb)[b]);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[c]), _mm512_mul_ps(dw, dx), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

// Nibble chunk h's two groups of a Q6_PLANES panel block: quants 4h..4h+3
// (low nibbles) and 16+4h..16+4h+3 (high) of each row, a byte each: their
// top bits from a chunk of bit pairs (a shift and a mask), their low ones
// from the nibbles (a ternary logic op merges the two).
CK_AVX512 CK_INLINE void q6_planes_groups(const uint8_t * blk, const int h, __m512i * g_low, __m512i * g_high) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i top = _mm512_set1_epi8(0x30);
    const __m512i p = _mm512_loadu_si512(blk + 64 * h);
    const __m512i pairs = _mm512_loadu_si512(blk + Q6_PLANES_PAIRS + 64 * (h / 2));
    // The pairs of this chunk's low and high nibbles' quants, moved to bits 4-5.
    const __m512i low_top = h % 2 ? pairs : _mm512_slli_epi16(pairs, 4);
    const __m512i high_top = h % 2 ? _mm512_srli_epi16(pairs, 2) : _mm512_slli_epi16(pairs, 2);
    // (a & c) | b: ternary logic 0xEC.
    *g_low = _mm512_ternarylogic_epi32(p, _mm512_and_si512(low_top, top), low, 0xEC);
    *g_high = _mm512_ternarylogic_epi32(_mm512_srli_epi16(p, 4), _mm512_and_si512(high_top, top), low, 0xEC);
}

// Bytes of a Q6_PLANES panel block's quants unpacked, a byte each (chunk g:
// quants 4g..4g+3 of each row: the bytes the tiles multiply).
#    define Q6_UNPACKED_BLOCK 512

// 16 rows x C columns of a Q6_PLANES panel: its quants from the planes
// (and, given `unpack_into`, stored there a byte each, nb blocks of
// Q6_UNPACKED_BLOCK bytes, for the panel's other column tiles), or from
// `unpacked` (stored so by an earlier tile); its scales from the panel.
// The block's halves, each with its own 8-bit scale, sum in two chains a
// column, started at -32 times the column's half sums
// (Q6's offset); as floats times their rows' d sc they add up over the
// super-block (a half's sum needs 17 bits: too wide for vpdpwssd), and the
// activations' one scale per super-block (see ck_encoding) multiplies that sum
// once. Against Q8_0 panels of the same weights (Intel Xeon, 8,192 x 2,048, 2
// threads): 1.15-1.25x faster at B = 1 from memory (7 bits a weight read
// instead of 9); unpacked within the tile 1.25-1.4x slower at B = 16-64 (the
// unpacking shares vpdpbusd's ports), so a product of many columns unpacks
// each panel once (see gemm_avx512), and was then about 1.2x slower with a
// scale per block (the two halves' float steps and the column's). (Unpacking
// with AVX512-VBMI's vpmultishiftqb, off the shifts' port, measured the same.)
CK_AVX512 CK_INLINE void q6_planes_tile_avx512(const uint8_t * w, const uint8_t * unpacked, uint8_t * unpack_into,
                                               int64_t nb, const uint8_t * act, size_t astride, float * dst,
                                               int64_t ldd, const int C, const bool fetch) {
    __m512 acc[8];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t sb = 0; sb < nb / CK_SUPER_BLOCKS; sb++) {
        const uint8_t * super = w + (size_t)sb * Q6_PLANES_PANEL_SUPER;
        const __m512 dw = fp16_zmm(super);
        __m512 sum[8];
        for (int c = 0; c < C; c++) {
            sum[c] = _mm512_setzero_ps();
        }
        for (int j = 0; j < CK_SUPER_BLOCKS; j++) {
            const int64_t b = CK_SUPER_BLOCKS * sb + j;
            const uint8_t * blk = super + past_header(CK_Q6_PLANES, j);
            if (fetch) {
                fetch_super_share(super, j, Q6_PLANES_PANEL_SUPER);
            }
            __m512i s0[8], s1[8];
            for (int c = 0; c < C; c++) {
                const int32_t * starts = column_half_offsets(act + (size_t)c * astride, nb) + 2 * b;
                s0[c] = _mm512_set1_epi32(starts[0]);
                s1[c] = _mm512_set1_epi32(starts[1]);
            }
            for (int h = 0; h < 4; h++) {
                __m512i g_low, g_high;
                if (unpacked) {
                    g_low = _mm512_loadu_si512(unpacked + (size_t)b * Q6_UNPACKED_BLOCK + 64 * h);
                    g_high = _mm512_loadu_si512(unpacked + (size_t)b * Q6_UNPACKED_BLOCK + 64 * (4 + h));
                } else {
                    q6_planes_groups(blk, h, &g_low, &g_high);
                    if (unpack_into) {
                        _mm512_storeu_si512(unpack_into + (size_t)b * Q6_UNPACKED_BLOCK + 64 * h, g_low);
                        _mm512_storeu_si512(unpack_into + (size_t)b * Q6_UNPACKED_BLOCK + 64 * (4 + h), g_high);
                    }
                }
                for (int c = 0; c < C; c++) {
                    const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                    s0[c] = dpbusd_word_zmm(s0[c], g_low, &q[h]);
                    s1[c] = dpbusd_word_zmm(s1[c], g_high, &q[4 + h]);
                }
            }
            // Each row's scales (int8 pairs) sign-extended: the first from the
            // low byte, the second from the high one.
            const __m512i pair =
                _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(super + Q6_PLANES_SCALES(j))));
            const __m512 ds0 =
                _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(pair, 24), 24)));
            const __m512 ds1 = _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_srai_epi32(pair, 8)));
            for (int c = 0; c < C; c++) {
                sum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0[c]), ds0, sum[c]);
                sum[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1[c]), ds1, sum[c]);
            }
        }
        for (int c = 0; c < C; c++) {
            const __m512 dx = _mm512_set1_ps(column_scales(act + (size_t)c * astride, nb)[CK_SUPER_BLOCKS * sb]);
            acc[c] = _mm512_fmadd_ps(sum[c], dx, acc[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        _mm512_storeu_ps(dst + c * ldd, acc[c]);
    }
}

// A thread's buffer for unpacked panels (a panel group's: at most about
// 600 KB), kept for the thread's next products and freed when it exits.
struct unpack_buffer {
    uint8_t * data;
    size_t capacity;
};

static pthread_key_t unpack_key;
static pthread_once_t unpack_key_once = PTHREAD_ONCE_INIT;

static void free_unpack_buffer(void * buffer) {
    free(((struct unpack_buffer *)buffer)->data);
    free(buffer);
}

static void make_unpack_key(void) {
    if (pthread_key_create(&unpack_key, free_unpack_buffer) != 0) {
        abort();
    }
}

// This thread's buffer, at least `bytes` long.
static uint8_t * unpack_buffer(size_t bytes) {
    pthread_once(&unpack_key_once, make_unpack_key);
    struct unpack_buffer * buffer = pthread_getspecific(unpack_key);
    if (buffer == NULL) {
        if ((buffer = calloc(1, sizeof *buffer)) == NULL || pthread_setspecific(unpack_key, buffer) != 0) {
            abort();
        }
    }
    if (bytes > buffer->capacity) {
        free(buffer->data);
        buffer->capacity = (bytes + 4095) & ~(size_t)4095;
        if ((buffer->data = aligned_alloc(64, buffer->capacity)) == NULL) {
            abort();
        }
    }
    return buffer->data;
}

// A panel unpacked: nb blocks of Q6_UNPACKED_BLOCK bytes, then for each
// super-block its rows' weight terms (for the AVX2 tiles of activations
// offset by 128, see q6_planes_block_ymm): 16 int32, the panel's first 8
// rows then the second's.
#    define Q6_UNPACKED_TERMS 64
static size_t q6_unpacked_panel_bytes(int64_t nb) {
    return (size_t)nb * Q6_UNPACKED_BLOCK + (size_t)(nb / CK_SUPER_BLOCKS) * Q6_UNPACKED_TERMS;
}

// Where a product's first column tile unpacks a panel group's Q6_PLANES
// panels for its other tiles (tiles of `tile_columns`): this thread's
// buffer when there are others, else NULL (each tile then unpacks its own
// in registers).
static uint8_t * q6_unpack_buffer(enum ck_format format, int64_t n_cols, int64_t tile_columns, int64_t nb,
                                  int64_t group_panels) {
    return format == CK_Q6_PLANES && n_cols > tile_columns
               ? unpack_buffer((size_t)group_panels * q6_unpacked_panel_bytes(nb))
               : NULL;
}

// A panel's place in that buffer (NULL where there is none).
static uint8_t * q6_unpacked_panel(uint8_t * buffer, int64_t nb, int64_t panel_in_group) {
    return buffer ? buffer + (size_t)panel_in_group * q6_unpacked_panel_bytes(nb) : NULL;
}

// Super-block sb's weight terms for half `half` of an unpacked panel.
static int32_t * q6_unpacked_terms(const uint8_t * panel, int64_t nb, int64_t sb, int half) {
    return (int32_t *)(panel + (size_t)nb * Q6_UNPACKED_BLOCK + (size_t)sb * Q6_UNPACKED_TERMS + 32 * half);
}

// `tile`(args..., C, fetch) for C = n (1-8) as a constant.
#    define CK_TILE8(tile, n, fetch, ...)                  \
        switch (n) {                                        \
            case 1: tile(__VA_ARGS__, 1, fetch); break;     \
            case 2: tile(__VA_ARGS__, 2, fetch); break;     \
            case 3: tile(__VA_ARGS__, 3, fetch); break;     \
            case 4: tile(__VA_ARGS__, 4, fetch); break;     \
            case 5: tile(__VA_ARGS__, 5, fetch); break;     \
            case 6: tile(__VA_ARGS__, 6, fetch); break;     \
            case 7: tile(__VA_ARGS__, 7, fetch); break;     \
            default: tile(__VA_ARGS__, 8, fetch); break;    \
        }

CK_AVX512 static void gemm_avx512(enum ck_format format, const uint8_t * packed, int64_t cols, int64_t p0,
                                  int64_t p1, const uint8_t * act, int64_t n_cols, float * dst, int64_t ldd) {
    const int64_t nb = cols / CK_BLOCK;
    const size_t astride = ck_activation_bytes(cols);
    const size_t panel_bytes = (size_t)nb * panel_block_bytes(format);
    const int64_t group_panels = panel_group(panel_bytes);
    // Q6_PLANES with more than one column tile: each panel of a group
    // unpacked once, by the group's first column tile as it multiplies, for
    // the others. A pass of its own before the tiles (2,048 x 2,048 on a Xeon,
    // a thread: 1.08x at 64 columns, 1.14x at 128, 0.93-0.97x at 24-32) took
    // 11-13% of a B = 64 product, its loads and stores not overlapping any
    // multiply.
    uint8_t * unpacked = q6_unpack_buffer(format, n_cols, 8, nb, group_panels);
    for (int64_t group = p0; group < p1; group += group_panels) {
        const int64_t group_end = group + group_panels < p1 ? group + group_panels : p1;
        for (int64_t c = 0; c < n_cols; c += 8) {
            const int n = (int)(n_cols - c < 8 ? n_cols - c : 8);
            const uint8_t * a = act + (size_t)c * astride;
            const bool fetch = c == 0;
            for (int64_t p = group; p < group_end; p++) {
                const uint8_t * w = packed + (size_t)p * panel_bytes;
                float * out = dst + p * CK_PANEL_ROWS + c * ldd;
                if (format == CK_Q4_1) {
                    CK_TILE8(q4_1_tile_avx512, n, fetch, w, nb, a, astride, out, ldd)
                } else if (format == CK_Q4_K) {
                    CK_TILE8(q4_k_tile_avx512, n, fetch, w, nb, a, astride, out, ldd)
                } else if (format == CK_Q5_1) {
                    CK_TILE8(q5_1_tile_avx512, n, fetch, w, nb, a, astride, out, ldd)
                } else if (format == CK_Q6_PLANES) {
                    uint8_t * bytes = q6_unpacked_panel(unpacked, nb, p - group);
                    CK_TILE8(q6_planes_tile_avx512, n, fetch, w, c == 0 ? NULL : bytes, c == 0 ? bytes : NULL, nb, a,
                             astride, out, ldd)
                } else {
                    CK_TILE8(q8_0_tile_avx512, n, fetch, w, nb, a, astride, out, ldd)
                }
            }
        }
    }
}

// ---------------------------------------------------------------- AVX2

// A tile's C columns of float sums for 8 rows (half `half`): from zero, or
// where an earlier range of super-blocks left them (sb0 > 0).
CK_AVX2 CK_INLINE void start_sums_ymm(const float * dst, int64_t ldd, const int half, const int64_t sb0, __m256 * acc,
                                      const int C) {
    for (int c = 0; c < C; c++) {
        acc[c] = sb0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(dst + c * ldd + 8 * half);
    }
}

// And out to the columns' rows.
CK_AVX2 CK_INLINE void store_sums_ymm(float * dst, int64_t ldd, const int half, const __m256 * acc, const int C) {
    for (int c = 0; c < C; c++) {
        _mm256_storeu_ps(dst + c * ldd + 8 * half, acc[c]);
    }
}

// A block's float step on 256 bits for a format with a minimum (Q4_1,
// Q5_1; d and m as fp16 at `d16` and `m16`), for AVX2 and AVX-VNNI alike:
// as min_block_zmm, the scalar reference's order, so both give its results
// bit for bit.
CK_AVX2 CK_INLINE void min_block_ymm(const uint8_t * d16, const uint8_t * m16, const uint8_t * act, size_t astride,
                                     int64_t nb, int64_t b, const __m256i * sums, __m256 * acc, const int C) {
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)m16));
    for (int c = 0; c < C; c++) {
        const uint8_t * col = act + (size_t)c * astride;
        const __m256 dx = _mm256_set1_ps(column_scales(col, nb)[b]);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[c]), _mm256_mul_ps(dw, dx), acc[c]);
        acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(column_sums(col, nb)[b]), acc[c]);
    }
}

// A block's float step on 256 bits for a format without minimums (the
// rows' d as fp16 at `d16`), as min_block_ymm.
CK_AVX2 CK_INLINE void scaled_block_ymm(const uint8_t * d16, const uint8_t * act, size_t astride, int64_t nb,
                                        int64_t b, const __m256i * sums, __m256 * acc, const int C) {
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d16));
    for (int c = 0; c < C; c++) {
        const __m256 dx = _mm256_set1_ps(column_scales(act + (size_t)c * astride, nb)[b]);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[c]), _mm256_mul_ps(dw, dx), acc[c]);
    }
}

// Chunk h of a 4-bit block's 8 rows (half `half` of a panel): its low
// nibbles (quants 4h..4h+3 of each row) and its high ones (16 + 4h..).
CK_AVX2 CK_INLINE void q4_nibbles_ymm(const uint8_t * blk, const int h, const int half, __m256i * lo, __m256i * hi) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * half));
    *lo = _mm256_and_si256(p, low);
    *hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
}

// A block of 4-bit quants (Q4_1's or Q4_K's nibbles, 8 rows: half `half` of
// a panel) times C columns, in 16 bits: its 16 products per lane pair fit
// (16 x 15 x 127 < 32768), so they are summed there and widened once.
CK_AVX2 CK_INLINE void q4_block_sums_avx2(const uint8_t * blk, const int half, const uint8_t * act, size_t astride,
                                          int64_t b, __m256i * t, const int C) {
    for (int h = 0; h < 4; h++) {
        __m256i lo, hi;
        q4_nibbles_ymm(blk, h, half, &lo, &hi);
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            const __m256i a = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(q[h]));
            const __m256i z = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q[4 + h]));
            t[c] = h == 0 ? _mm256_add_epi16(a, z) : _mm256_add_epi16(t[c], _mm256_add_epi16(a, z));
            CK_KEEP_SUM(t[c]);
        }
    }
}

// 8 rows (half `half` of a panel) x C columns of Q4_1: a block's 16-bit
// sums widened, then its float step.
CK_AVX2 CK_INLINE void q4_1_tile_avx2(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                      float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q4_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q4_1_PANEL_BLOCK);
        }
        __m256i t[4];
        q4_block_sums_avx2(blk, half, act, astride, b, t, C);
        for (int c = 0; c < C; c++) {
            t[c] = _mm256_madd_epi16(t[c], ones);
        }
        min_block_ymm(blk + 256 + 16 * half, blk + 288 + 16 * half, act, astride, nb, b, t, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// Each of 8 rows' (half `half` of a panel's) 8-bit scales, of the 16 at
// `scales`, in both 16-bit halves of its 32-bit lane: what vpmaddwd
// multiplies a lane pair's two sums by.
CK_AVX2 CK_INLINE __m256i row_scales_ymm(const uint8_t * scales, const __m256i spread) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)scales)), spread);
}

// A Q4_K super-block's float step on 256 bits (8 rows, half `half` of the
// panel), after its blocks' integer sums times their rows' scales
// (`isum`): the rows' minimums times the blocks' sums of quants, four
// vpmaddwd, then (float)isum (d dx) and (float)(sum of mins) (-dmin dx).
CK_AVX2 CK_INLINE void q4_k_super_step_ymm(const uint8_t * super, const int half, const uint8_t * act,
                                           size_t astride, int64_t nb, int64_t sb, const __m256i * isum,
                                           __m256 * acc, const int C) {
    // Each row's minimums of blocks 2k and 2k + 1 as a 16-bit pair.
    __m256i mins[4];
    for (int k = 0; k < 4; k++) {
        const __m128i even = _mm_loadl_epi64((const __m128i *)(super + Q4_K_SCALES(2 * k) + 16 + 8 * half));
        const __m128i odd = _mm_loadl_epi64((const __m128i *)(super + Q4_K_SCALES(2 * k + 1) + 16 + 8 * half));
        mins[k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(even, odd));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(super + 16 * half)));
    const __m256 minus_dmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(super + 32 + 16 * half))),
                                            _mm256_set1_ps(-0.0f));
    for (int c = 0; c < C; c++) {
        const uint8_t * col = act + (size_t)c * astride;
        const int32_t * pairs = (const int32_t *)(column_block_sums(col, nb) + sb * Q4_K_SUPER_BLOCKS);
        __m256i imin = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(pairs[0]));
        for (int k = 1; k < 4; k++) {
            imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[k], _mm256_set1_epi32(pairs[k])));
        }
        const __m256 dx = _mm256_set1_ps(column_scales(col, nb)[sb * Q4_K_SUPER_BLOCKS]);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d, dx), acc[c]);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(minus_dmin, dx), acc[c]);
    }
}

// Each of 8 rows' (half `half` of a panel's) 8-bit scales, of the 16 a Q4_K
// block has, into bytes 0 and 2 of its 32-bit lane (vpshufb picks within
// each 128-bit half; both hold all 16): row_scales_ymm's pattern.
CK_AVX2 CK_INLINE __m256i q4_k_scale_spread(const int half) {
    const char r0 = (char)(8 * half);
    return _mm256_setr_epi8(r0, -1, r0, -1, r0 + 1, -1, r0 + 1, -1, r0 + 2, -1, r0 + 2, -1, r0 + 3, -1, r0 + 3, -1,
                            r0 + 4, -1, r0 + 4, -1, r0 + 5, -1, r0 + 5, -1, r0 + 6, -1, r0 + 6, -1, r0 + 7, -1, r0 + 7,
                            -1);
}

// The Q4_K tile on 256 bits: 8 rows x C columns, the activations with one
// scale per super-block (ggml's Q8_K), super-blocks [sb0, sb1). For each
// block, `add_block`(super, j, blk, half, act, astride, b, spread, isum, C)
// adds its integer sums times its rows' 8-bit scales to the columns' 32-bit
// sums; after the super-block's 8, q4_k_super_step_ymm. The AVX2 and
// AVX-VNNI tiles differ only in that step.
#    define CK_Q4_K_TILE_YMM(name, target, add_block)                                                        \
        target CK_INLINE void name(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,       \
                                   float * dst, int64_t ldd, const int64_t sb0, const int64_t sb1, const int C, \
                                   const int half, const bool fetch) {                                         \
            __m256 acc[4];                                                                                     \
            start_sums_ymm(dst, ldd, half, sb0, acc, C);                                                       \
            const __m256i spread = q4_k_scale_spread(half);                                                    \
            for (int64_t sb = sb0; sb < sb1; sb++) {                                                           \
                const uint8_t * super = w + (size_t)sb * Q4_K_PANEL_SUPER;                                     \
                __m256i isum[4];                                                                               \
                for (int c = 0; c < C; c++) {                                                                  \
                    isum[c] = _mm256_setzero_si256();                                                          \
                }                                                                                              \
                for (int j = 0; j < Q4_K_SUPER_BLOCKS; j++) {                                                  \
                    const int64_t b = sb * Q4_K_SUPER_BLOCKS + j;                                              \
                    if (fetch) {                                                                               \
                        fetch_super_share(super, j, Q4_K_PANEL_SUPER);                                         \
                    }                                                                                          \
                    add_block(super, j, super + past_header(CK_Q4_K, j), half, act, astride, b, spread, isum,  \
                              C);                                                                              \
                }                                                                                              \
                q4_k_super_step_ymm(super, half, act, astride, nb, sb, isum, acc, C);                          \
            }                                                                                                  \
            store_sums_ymm(dst, ldd, half, acc, C);                                                            \
        }

// A Q4_K block with AVX2: its 16-bit sums (as Q4_1's) meet its rows' 8-bit
// scales in one vpmaddwd and add up in 32 bits over the super-block; the
// super-block's minimums and float step follow (q4_k_super_step_ymm).
// Against Q4_1 panels (a float step a block: a widening, a conversion, two
// multiply-adds and a multiply a column), fewer instructions, and 4.6 bits a
// weight read instead of 5.
CK_AVX2 CK_INLINE void q4_k_block_avx2(const uint8_t * super, const int j, const uint8_t * blk, const int half,
                                       const uint8_t * act, size_t astride, int64_t b, const __m256i spread,
                                       __m256i * isum, const int C) {
    __m256i t[4];
    q4_block_sums_avx2(blk, half, act, astride, b, t, C);
    const __m256i scales = row_scales_ymm(super + Q4_K_SCALES(j), spread);
    for (int c = 0; c < C; c++) {
        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(t[c], scales));
        CK_KEEP_SUM(isum[c]);
    }
}

CK_Q4_K_TILE_YMM(q4_k_tile_avx2, CK_AVX2, q4_k_block_avx2)

// A Q5_1 block's chunks first..first + 3 times C columns, widened to 32
// bits. The quants are unsigned, as vpmaddubsw's first operand wants, and
// four of its products per lane pair fit in 16 bits (4 x 2 x 31 x 127 <
// 32768): they are summed there and widened once.
CK_AVX2 CK_INLINE void q5_1_half_sums_avx2(const uint8_t * blk, const int half, const uint8_t * act, size_t astride,
                                           int64_t b, const int first, __m256i * sums, const int C) {
    __m256i t[4];
    for (int c = 0; c < C; c++) {
        t[c] = _mm256_setzero_si256();
    }
    for (int g = first; g < first + 4; g++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * g + 32 * half));
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            t[c] = _mm256_add_epi16(t[c], _mm256_maddubs_epi16(v, _mm256_set1_epi32(q[g])));
            CK_KEEP_SUM(t[c]);
        }
    }
    for (int c = 0; c < C; c++) {
        sums[c] = _mm256_madd_epi16(t[c], _mm256_set1_epi16(1));
    }
}

// 8 rows x C columns of Q5_1: half the work of a Q8_0 block (no signs to
// move, one widening per four products instead of one per product).
CK_AVX2 CK_INLINE void q5_1_tile_avx2(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                      float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q5_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q5_1_PANEL_BLOCK);
        }
        __m256i s[4], rest[4];
        q5_1_half_sums_avx2(blk, half, act, astride, b, 0, s, C);
        q5_1_half_sums_avx2(blk, half, act, astride, b, 4, rest, C);
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_add_epi32(s[c], rest[c]);
        }
        min_block_ymm(blk + 512 + 16 * half, blk + 544 + 16 * half, act, astride, nb, b, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// 8 rows x C columns of Q8_0: |w| times x with w's sign (maddubs takes one
// unsigned operand).
CK_AVX2 CK_INLINE void q8_0_tile_avx2(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                      float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q8_0_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q8_0_PANEL_BLOCK);
        }
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
                CK_KEEP_SUM(s[c]);
            }
        }
        scaled_block_ymm(blk + 512 + 16 * half, act, astride, nb, b, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// Chunk g (0-7: quants 4g..4g+3 of each row) of a Q6_PLANES panel block's 8
// rows (half `half`), a byte a quant: chunk g % 4's low nibbles (g < 4) or
// high ones, with their top two bits from the chunk of bit pairs (see
// q6_planes_groups).
CK_AVX2 CK_INLINE __m256i q6_planes_chunk_ymm(const uint8_t * blk, const int g, const int half) {
    const int h = g % 4;
    const __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * half));
    const __m256i pairs = _mm256_loadu_si256((const __m256i *)(blk + Q6_PLANES_PAIRS + 64 * (h / 2) + 32 * half));
    const __m256i nibbles = g < 4 ? p : _mm256_srli_epi16(p, 4);
    const __m256i top = g < 4 ? (h % 2 ? pairs : _mm256_slli_epi16(pairs, 4))
                              : (h % 2 ? _mm256_srli_epi16(pairs, 2) : _mm256_slli_epi16(pairs, 2));
    return _mm256_or_si256(_mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F)),
                           _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
}

// Nibble chunk h's two chunks of quants: chunk h (from the low nibbles) and
// chunk 4 + h (the high ones), from the same loads.
CK_AVX2 CK_INLINE void q6_planes_chunks_ymm(const uint8_t * blk, const int h, const int half, __m256i * low_chunk,
                                            __m256i * high_chunk) {
    *low_chunk = q6_planes_chunk_ymm(blk, h, half);
    *high_chunk = q6_planes_chunk_ymm(blk, 4 + h, half);
}

// The Q6_PLANES tile on 256 bits: 8 rows (half `half`) x C columns, the
// activations with one scale per super-block (ggml's Q8_K), super-blocks
// [sb0, sb1). For each block, `add_block`(super, j, unpacked, unpack_into,
// b, half, act, astride, nb, s, terms, C) adds its integer sums, each
// half's 8-bit scale times sum((q - 32) x), to the columns' 32-bit sums,
// taking its quants from the planes (and, given `unpack_into`, storing them
// there a byte each for the panel's other column tiles, as
// q6_planes_tile_avx512 does) or from `unpacked`; after the super-block's
// 8, one float step with Q6_K's d. The AVX2 and AVX-VNNI tiles differ in
// that step; AVX2's for activations offset by 128 (`weight_terms`) also
// take away the weights' terms its blocks summed in `terms` from the
// planes (or that the first column tile kept beside the unpacked bytes).
#    define CK_Q6_PLANES_TILE_YMM(name, target, add_block, weight_terms)                                         \
        target CK_INLINE void name(const uint8_t * w, const uint8_t * unpacked, uint8_t * unpack_into, int64_t nb, \
                                   const uint8_t * act, size_t astride, float * dst, int64_t ldd,                  \
                                   const int64_t sb0, const int64_t sb1, const int C, const int half,              \
                                   const bool fetch) {                                                             \
            __m256 acc[4];                                                                                         \
            start_sums_ymm(dst, ldd, half, sb0, acc, C);                                                           \
            for (int64_t sb = sb0; sb < sb1; sb++) {                                                               \
                __m256i s[4];                                                                                      \
                for (int c = 0; c < C; c++) {                                                                      \
                    s[c] = _mm256_setzero_si256();                                                                 \
                }                                                                                                  \
                __m256i terms = _mm256_setzero_si256();                                                            \
                const uint8_t * super = w + (size_t)sb * Q6_PLANES_PANEL_SUPER;                                    \
                for (int j = 0; j < CK_SUPER_BLOCKS; j++) {                                                        \
                    const int64_t b = CK_SUPER_BLOCKS * sb + j;                                                    \
                    if (fetch) {                                                                                   \
                        fetch_super_share(super, j, Q6_PLANES_PANEL_SUPER);                                        \
                    }                                                                                              \
                    add_block(super, j, unpacked, unpack_into, b, half, act, astride, nb, s, &terms, C);           \
                }                                                                                                  \
                if (weight_terms) {                                                                                \
                    if (unpacked) {                                                                                \
                        terms = _mm256_load_si256((const __m256i *)q6_unpacked_terms(unpacked, nb, sb, half));     \
                    } else if (unpack_into) {                                                                      \
                        _mm256_store_si256((__m256i *)q6_unpacked_terms(unpack_into, nb, sb, half), terms);        \
                    }                                                                                              \
                    take_weight_terms_ymm(terms, s, C);                                                            \
                }                                                                                                  \
                scaled_block_ymm(super + 16 * half, act, astride, nb, CK_SUPER_BLOCKS * sb, s, acc, C);            \
            }                                                                                                      \
            store_sums_ymm(dst, ldd, half, acc, C);                                                                \
        }

// Each column's super-block sums of (q - 32)(x + 128) less 128 times the
// rows' `terms` (their sums of (q - 32), times the scales): of (q - 32) x.
CK_AVX2 CK_INLINE void take_weight_terms_ymm(const __m256i terms, __m256i * s, const int C) {
    const __m256i offsets = _mm256_slli_epi32(terms, 7);
    for (int c = 0; c < C; c++) {
        s[c] = _mm256_sub_epi32(s[c], offsets);
    }
}

// Which scale of its row's pair each 16-bit sum of a Q6 block's first
// (bytes 0-1 of each pair) and second 16 quants (2-3) takes: vpshufb
// patterns for the AVX2 tiles.
#    define CK_Q6_PATTERN(...) __VA_ARGS__, __VA_ARGS__
static const uint8_t q6_scale_patterns_ymm[2][32] __attribute__((aligned(32))) = {
    {CK_Q6_PATTERN(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)},
    {CK_Q6_PATTERN(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15)},
};
#    undef CK_Q6_PATTERN

// q6_planes_block_ymm's products for 4 columns (`stride` apart, each at
// its block's words `q0`) from a block's quants unpacked to a byte each
// (`bytes`: chunk g at 64 g), written out: GCC's schedule of the same C
// kept the columns' sums in memory, and in the C harness (1 thread, Intel
// Xeon, 2,048 x 2,048) the tile ran 1.18x faster this way at 8, 16 and 64
// columns, with the same results. The same additions in another order, all
// in integers, so the same sums. `OFFSETS` starts the block (the offsets'
// part, or nothing), `MADDUBS(v, t)` multiplies quants by activations in
// the operands' order of the encoding.
#    define CK_Q6_BYTES_BLOCK4(OFFSETS, MADDUBS)                                     \
        "vpmovsxbw (%[sc]), %[pairs]\n\t"                                           \
        OFFSETS                                                                     \
        "vpshufb (%[patterns]), %[pairs], %[first]\n\t"                             \
        "vpshufb 32(%[patterns]), %[pairs], %[second]\n\t"                          \
        CK_Q6_CHUNKS(0, MADDUBS)                                                    \
        CK_Q6_CHUNKS(2, MADDUBS)
// Column Q's chunks P and P + 1 (first half) and 4 + P and 5 + P.
#    define CK_Q6_COLUMN(Q, S, P, MADDUBS)                       \
        "vpbroadcastd 4*" #P Q ", %[t0]\n\t"                  \
        "vpbroadcastd 4*" #P "+4" Q ", %[t1]\n\t"             \
        MADDUBS("%[v0]", "%[t0]")                              \
        MADDUBS("%[v1]", "%[t1]")                              \
        "vpaddw %[t1], %[t0], %[t0]\n\t"                     \
        "vpmaddwd %[first], %[t0], %[t0]\n\t"                \
        "vpaddd %[t0], " S ", " S "\n\t"                     \
        "vpbroadcastd 4*" #P "+16" Q ", %[t0]\n\t"            \
        "vpbroadcastd 4*" #P "+20" Q ", %[t1]\n\t"            \
        MADDUBS("%[v2]", "%[t0]")                              \
        MADDUBS("%[v3]", "%[t1]")                              \
        "vpaddw %[t1], %[t0], %[t0]\n\t"                     \
        "vpmaddwd %[second], %[t0], %[t0]\n\t"               \
        "vpaddd %[t0], " S ", " S "\n\t"
#    define CK_Q6_CHUNKS(P, MADDUBS)                             \
        "vmovdqu 64*" #P "(%[u]), %[v0]\n\t"                  \
        "vmovdqu 64*" #P "+64(%[u]), %[v1]\n\t"               \
        "vmovdqu 64*" #P "+256(%[u]), %[v2]\n\t"              \
        "vmovdqu 64*" #P "+320(%[u]), %[v3]\n\t"              \
        CK_Q6_COLUMN("(%[q0])", "%[s0]", P, MADDUBS)         \
        CK_Q6_COLUMN("(%[q0],%[st])", "%[s1]", P, MADDUBS)   \
        CK_Q6_COLUMN("(%[q2])", "%[s2]", P, MADDUBS)         \
        CK_Q6_COLUMN("(%[q2],%[st])", "%[s3]", P, MADDUBS)
// The quants (unsigned) times the activations (signed), or with the
// activations offset by 128 the activations (unsigned) times the quants
// less 32 (signed).
#    define CK_QUANTS_FIRST(v, t) "vpmaddubsw " t ", " v ", " t "\n\t"
#    define CK_ACTIVATIONS_FIRST(v, t) "vpmaddubsw " v ", " t ", " t "\n\t"

// The quants, unsigned, times the columns' activations, each column's sums
// starting with -32 times the scales times its half sums (at `h0`).
CK_AVX2 CK_INLINE void q6_bytes_block4_avx2(const uint8_t * bytes, const uint8_t * scales, const uint8_t * q0,
                                            const uint8_t * h0, size_t stride, __m256i * s) {
    const uint8_t * q2 = q0 + 2 * stride;
    const uint8_t * h2 = h0 + 2 * stride;
    __m256i t0, t1, pairs, offsets, first, second, v0, v1, v2, v3;
    __asm__(CK_Q6_BYTES_BLOCK4(
                "vpsllw $5, %[pairs], %[t0]\n\t"
                "vpxor %[offsets], %[offsets], %[offsets]\n\t"
                "vpsubw %[t0], %[offsets], %[offsets]\n\t"
                "vpbroadcastd (%[h0]), %[t0]\n\t"
                "vpbroadcastd (%[h0],%[st]), %[t1]\n\t"
                "vpmaddwd %[t0], %[offsets], %[t0]\n\t"
                "vpmaddwd %[t1], %[offsets], %[t1]\n\t"
                "vpaddd %[t0], %[s0], %[s0]\n\t"
                "vpaddd %[t1], %[s1], %[s1]\n\t"
                "vpbroadcastd (%[h2]), %[t0]\n\t"
                "vpbroadcastd (%[h2],%[st]), %[t1]\n\t"
                "vpmaddwd %[t0], %[offsets], %[t0]\n\t"
                "vpmaddwd %[t1], %[offsets], %[t1]\n\t"
                "vpaddd %[t0], %[s2], %[s2]\n\t"
                "vpaddd %[t1], %[s3], %[s3]\n\t",
                CK_QUANTS_FIRST)
            : [s0] "+x"(s[0]), [s1] "+x"(s[1]), [s2] "+x"(s[2]), [s3] "+x"(s[3]), [t0] "=&x"(t0), [t1] "=&x"(t1),
              [pairs] "=&x"(pairs), [offsets] "=&x"(offsets), [first] "=&x"(first), [second] "=&x"(second),
              [v0] "=&x"(v0), [v1] "=&x"(v1), [v2] "=&x"(v2), [v3] "=&x"(v3)
            : [u] "r"(bytes), [sc] "r"(scales), [q0] "r"(q0), [q2] "r"(q2), [h0] "r"(h0), [h2] "r"(h2),
              [st] "r"(stride), [patterns] "r"(q6_scale_patterns_ymm)
            : "memory");
}

// The columns' activations offset by 128 times the quants less 32.
CK_AVX2 CK_INLINE void q6_bytes_block4_offset_avx2(const uint8_t * bytes, const uint8_t * scales, const uint8_t * q0,
                                                   size_t stride, __m256i * s) {
    const uint8_t * q2 = q0 + 2 * stride;
    __m256i t0, t1, pairs, first, second, v0, v1, v2, v3;
    __asm__(CK_Q6_BYTES_BLOCK4("", CK_ACTIVATIONS_FIRST)
            : [s0] "+x"(s[0]), [s1] "+x"(s[1]), [s2] "+x"(s[2]), [s3] "+x"(s[3]), [t0] "=&x"(t0), [t1] "=&x"(t1),
              [pairs] "=&x"(pairs), [first] "=&x"(first), [second] "=&x"(second), [v0] "=&x"(v0), [v1] "=&x"(v1),
              [v2] "=&x"(v2), [v3] "=&x"(v3)
            : [u] "r"(bytes), [sc] "r"(scales), [q0] "r"(q0), [q2] "r"(q2), [st] "r"(stride),
              [patterns] "r"(q6_scale_patterns_ymm)
            : "memory");
}
#    undef CK_ACTIVATIONS_FIRST
#    undef CK_QUANTS_FIRST
#    undef CK_Q6_CHUNKS
#    undef CK_Q6_COLUMN
#    undef CK_Q6_BYTES_BLOCK4

// A chunk of quants times a column's 4 activations (`word`), in the order
// of the encoding: the quants first (unsigned), or (`offset`) the
// activations.
CK_AVX2 CK_INLINE __m256i q6_quants_times_ymm(const __m256i quants, const int32_t word, const bool offset) {
    const __m256i x = _mm256_set1_epi32(word);
    return offset ? _mm256_maddubs_epi16(x, quants) : _mm256_maddubs_epi16(quants, x);
}

// A Q6_PLANES block with AVX2. Two of its quants' products, a lane pair,
// add up in 16 bits, widened by vpmaddwd with the half's scales. Either
// (`offset` false) the sums start with the offsets' part, -32 times the
// scales times the column's half sums (one vpmaddwd of the rows' scale
// pairs), and the quants, unsigned as vpmaddubsw's first operand wants,
// multiply the activations (2 x 2 x 63 x 127 < 32768); or (`offset`: the
// activations offset by 128) the activations, unsigned, multiply the
// quants less 32 (2 x 2 x 255 x 32 < 32768), a sum of (q - 32) x plus 128
// (q - 32), whose weights' part, the same for every column, the block adds
// to `terms` (the scales times the sums of the quants less 32) as it
// unpacks them, for the tile to take away once a super-block. That moves
// a vpmaddwd a column and block to the unpacking: the product of a group's
// later column tiles is cheaper, of its first dearer (the C harness over
// this file, 2,048 x 2,048 Q6, one thread, Intel Xeon, the same results:
// 0.85-0.98x at 1-16 columns, 1.0-1.02x at 32, 1.02-1.13x at 64 in runs
// that swing; every Q6_K product of a 1B model's B = 64 step 1.06x faster),
// so a product takes it from CK_Q6_OFFSET_COLUMNS columns. Against
// panels of a byte a quant (9 bits a weight instead of 7; the same harness,
// the same results): 1.11x faster at B = 1 with the weights from memory,
// 1.0-1.04x at B = 16-64.
CK_AVX2 CK_INLINE void q6_planes_block_ymm(const uint8_t * super, const int j, const uint8_t * unpacked,
                                           uint8_t * unpack_into, const int64_t b, const int half,
                                           const uint8_t * act, size_t astride, int64_t nb, __m256i * s,
                                           __m256i * terms, const int C, const bool offset) {
    const uint8_t * blk = super + past_header(CK_Q6_PLANES, j);
    const __m256i first_scale = _mm256_load_si256((const __m256i *)q6_scale_patterns_ymm[0]);
    const __m256i second_scale = _mm256_load_si256((const __m256i *)q6_scale_patterns_ymm[1]);
    const __m256i scale_pairs =
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(super + Q6_PLANES_SCALES(j) + 16 * half)));
    if (!offset) {
        const __m256i offsets = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scale_pairs, 5));
        for (int c = 0; c < C; c++) {
            const int16_t * halves = column_half_sums(act + (size_t)c * astride, nb) + 2 * b;
            int32_t both;
            memcpy(&both, halves, sizeof both);
            s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(offsets, _mm256_set1_epi32(both)));
        }
    }
    const __m256i first = _mm256_shuffle_epi8(scale_pairs, first_scale);
    const __m256i second = _mm256_shuffle_epi8(scale_pairs, second_scale);
    for (int pair = 0; pair < 4; pair += 2) {
        // Chunks pair and pair + 1 (of the first half's quants), 4 + pair
        // and 5 + pair (of the second's).
        __m256i v[4];
        if (unpacked) {
            const uint8_t * u = unpacked + (size_t)b * Q6_UNPACKED_BLOCK + 32 * half;
            v[0] = _mm256_loadu_si256((const __m256i *)(u + 64 * pair));
            v[1] = _mm256_loadu_si256((const __m256i *)(u + 64 * (pair + 1)));
            v[2] = _mm256_loadu_si256((const __m256i *)(u + 64 * (4 + pair)));
            v[3] = _mm256_loadu_si256((const __m256i *)(u + 64 * (5 + pair)));
        } else {
            q6_planes_chunks_ymm(blk, pair, half, &v[0], &v[2]);
            q6_planes_chunks_ymm(blk, pair + 1, half, &v[1], &v[3]);
            if (offset) {
                for (int k = 0; k < 4; k++) {
                    v[k] = _mm256_sub_epi8(v[k], _mm256_set1_epi8(Q6_OFFSET));
                }
                // Each row's quants summed in pairs, two chunks at a time
                // (2 x 32 to a byte), times the half's scale.
                const __m256i ones = _mm256_set1_epi8(1);
                const __m256i first_quants = _mm256_maddubs_epi16(ones, _mm256_add_epi8(v[0], v[1]));
                const __m256i second_quants = _mm256_maddubs_epi16(ones, _mm256_add_epi8(v[2], v[3]));
                *terms = _mm256_add_epi32(*terms, _mm256_madd_epi16(first_quants, first));
                *terms = _mm256_add_epi32(*terms, _mm256_madd_epi16(second_quants, second));
            }
            if (unpack_into) {
                uint8_t * u = unpack_into + (size_t)b * Q6_UNPACKED_BLOCK + 32 * half;
                _mm256_storeu_si256((__m256i *)(u + 64 * pair), v[0]);
                _mm256_storeu_si256((__m256i *)(u + 64 * (pair + 1)), v[1]);
                _mm256_storeu_si256((__m256i *)(u + 64 * (4 + pair)), v[2]);
                _mm256_storeu_si256((__m256i *)(u + 64 * (5 + pair)), v[3]);
            }
        }
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            const __m256i t0 = _mm256_add_epi16(q6_quants_times_ymm(v[0], q[pair], offset),
                                                q6_quants_times_ymm(v[1], q[pair + 1], offset));
            s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(t0, first));
            CK_KEEP_SUM(s[c]);
            const __m256i t1 = _mm256_add_epi16(q6_quants_times_ymm(v[2], q[4 + pair], offset),
                                                q6_quants_times_ymm(v[3], q[5 + pair], offset));
            s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(t1, second));
            CK_KEEP_SUM(s[c]);
        }
    }
}

CK_AVX2 CK_INLINE void q6_planes_block_avx2(const uint8_t * super, const int j, const uint8_t * unpacked,
                                            uint8_t * unpack_into, const int64_t b, const int half,
                                            const uint8_t * act, size_t astride, int64_t nb, __m256i * s,
                                            __m256i * terms, const int C) {
    q6_planes_block_ymm(super, j, unpacked, unpack_into, b, half, act, astride, nb, s, terms, C, false);
}

CK_AVX2 CK_INLINE void q6_planes_block_offset_avx2(const uint8_t * super, const int j, const uint8_t * unpacked,
                                                   uint8_t * unpack_into, const int64_t b, const int half,
                                                   const uint8_t * act, size_t astride, int64_t nb, __m256i * s,
                                                   __m256i * terms, const int C) {
    q6_planes_block_ymm(super, j, unpacked, unpack_into, b, half, act, astride, nb, s, terms, C, true);
}

CK_Q6_PLANES_TILE_YMM(q6_planes_tile_avx2, CK_AVX2, q6_planes_block_avx2, false)
CK_Q6_PLANES_TILE_YMM(q6_planes_offset_tile_avx2, CK_AVX2, q6_planes_block_offset_avx2, true)

// The Q6_PLANES tile of a group's later column tiles, whose panels the first
// unpacked into `unpacked`: 4 columns by q6_bytes_block4_avx2 (`offset`:
// q6_bytes_block4_offset_avx2, then the weights' terms taken away), fewer
// as the first tile's code does them.
CK_AVX2 CK_INLINE void q6_bytes_tile_ymm(const uint8_t * w, const uint8_t * unpacked, int64_t nb,
                                         const uint8_t * act, size_t astride, float * dst, int64_t ldd,
                                         const int64_t sb0, const int64_t sb1, const int C, const int half,
                                         const bool fetch, const bool offset) {
    if (C < 4) {
        if (offset) {
            q6_planes_offset_tile_avx2(w, unpacked, NULL, nb, act, astride, dst, ldd, sb0, sb1, C, half, fetch);
        } else {
            q6_planes_tile_avx2(w, unpacked, NULL, nb, act, astride, dst, ldd, sb0, sb1, C, half, fetch);
        }
        return;
    }
    __m256 acc[4];
    start_sums_ymm(dst, ldd, half, sb0, acc, C);
    const uint8_t * halves = (const uint8_t *)column_half_sums(act, nb);
    for (int64_t sb = sb0; sb < sb1; sb++) {
        __m256i s[4];
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_setzero_si256();
        }
        const uint8_t * super = w + (size_t)sb * Q6_PLANES_PANEL_SUPER;
        for (int j = 0; j < CK_SUPER_BLOCKS; j++) {
            const int64_t b = CK_SUPER_BLOCKS * sb + j;
            const uint8_t * bytes = unpacked + (size_t)b * Q6_UNPACKED_BLOCK + 32 * half;
            const uint8_t * scales = super + Q6_PLANES_SCALES(j) + 16 * half;
            if (offset) {
                q6_bytes_block4_offset_avx2(bytes, scales, act + (size_t)b * CK_BLOCK, astride, s);
            } else {
                q6_bytes_block4_avx2(bytes, scales, act + (size_t)b * CK_BLOCK, halves + 4 * b, astride, s);
            }
        }
        if (offset) {
            take_weight_terms_ymm(_mm256_load_si256((const __m256i *)q6_unpacked_terms(unpacked, nb, sb, half)), s,
                                  C);
        }
        scaled_block_ymm(super + 16 * half, act, astride, nb, CK_SUPER_BLOCKS * sb, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

CK_AVX2 CK_INLINE void q6_bytes_tile_avx2(const uint8_t * w, const uint8_t * unpacked, int64_t nb,
                                          const uint8_t * act, size_t astride, float * dst, int64_t ldd,
                                          const int64_t sb0, const int64_t sb1, const int C, const int half,
                                          const bool fetch) {
    q6_bytes_tile_ymm(w, unpacked, nb, act, astride, dst, ldd, sb0, sb1, C, half, fetch, false);
}

CK_AVX2 CK_INLINE void q6_bytes_offset_tile_avx2(const uint8_t * w, const uint8_t * unpacked, int64_t nb,
                                                 const uint8_t * act, size_t astride, float * dst, int64_t ldd,
                                                 const int64_t sb0, const int64_t sb1, const int C, const int half,
                                                 const bool fetch) {
    q6_bytes_tile_ymm(w, unpacked, nb, act, astride, dst, ldd, sb0, sb1, C, half, fetch, true);
}

// (The first half asks for the lines ahead: the second reads the same ones.)
// `tile`(args..., C, half, fetch) for both halves of a panel and C = n
// (1-4) as a constant.
#    define CK_TILE2(tile, n, fetch, ...)                                   \
        for (int half = 0; half < 2; half++) {                              \
            const bool ask = (fetch) && half == 0;                          \
            switch (n) {                                                    \
                case 1: tile(__VA_ARGS__, 1, half, ask); break;             \
                case 2: tile(__VA_ARGS__, 2, half, ask); break;             \
                case 3: tile(__VA_ARGS__, 3, half, ask); break;             \
                default: tile(__VA_ARGS__, 4, half, ask); break;            \
            }                                                               \
        }

// CK_TILE2 for the tiles that take a range of super-blocks (sb0, sb1):
// one column's halves take turns every CK_TURN_SUPERS super-blocks, so the
// second half reads from L1 what the first just brought and the first's
// prefetches keep memory busy all along (more columns: one turn over the
// whole width, as before). With each half over the whole
// panel in turn, memory sat idle through the second half's pass, and
// one sequence ran at 0.82x the AVX-512 code's rate (Zen 4). The sums are
// added in the same order, so results do not change.
#    define CK_TURN_SUPERS 2
#    define CK_TILE2_TURNS(tile, n, fetch, nb, ...)                                          \
        const int64_t supers = (nb) / CK_SUPER_BLOCKS;                                       \
        const int64_t turn = (n) == 1 ? CK_TURN_SUPERS : supers;                             \
        for (int64_t sb = 0; sb < supers; sb += turn) {                                      \
            const int64_t end = sb + turn < supers ? sb + turn : supers;                     \
            CK_TILE2(tile, n, fetch, __VA_ARGS__, sb, end)                                   \
        }

// Every panel of [p0, p1) times the columns, 4 at a time, with `q4_1_tile`,
// `q4_k_tile`, `q5_1_tile`, `q6_planes_tile` (its panels unpacked once for
// many columns, as gemm_avx512 does, by a group's first column tile, for the
// others' `q6_bytes_tile`; where `q6_offset`, the activations are offset
// by 128 and those tiles are `q6_offset_planes_tile` and
// `q6_offset_bytes_tile`) and `q8_0_tile` (8 rows each, see CK_TILE2): the
// loop both 256-bit instruction sets share.
#    define CK_GEMM_YMM(q4_1_tile, q4_k_tile, q5_1_tile, q6_planes_tile, q6_bytes_tile, q6_offset,                \
                        q6_offset_planes_tile, q6_offset_bytes_tile, q8_0_tile)                                 \
        const int64_t nb = cols / CK_BLOCK;                                                              \
        const size_t astride = ck_activation_bytes(cols);                                                \
        const size_t panel_bytes = (size_t)nb * panel_block_bytes(format);                               \
        const int64_t group_panels = panel_group(panel_bytes);                                           \
        uint8_t * unpacked = q6_unpack_buffer(format, n_cols, 4, nb, group_panels);                      \
        for (int64_t group = p0; group < p1; group += group_panels) {                                    \
            const int64_t group_end = group + group_panels < p1 ? group + group_panels : p1;             \
            for (int64_t c = 0; c < n_cols; c += 4) {                                                    \
                const int n = (int)(n_cols - c < 4 ? n_cols - c : 4);                                    \
                const uint8_t * a = act + (size_t)c * astride;                                           \
                const bool fetch = c == 0;                                                               \
                for (int64_t p = group; p < group_end; p++) {                                            \
                    const uint8_t * w = packed + (size_t)p * panel_bytes;                                \
                    float * out = dst + p * CK_PANEL_ROWS + c * ldd;                                     \
                    if (format == CK_Q4_1) {                                                             \
                        CK_TILE2(q4_1_tile, n, fetch, w, nb, a, astride, out, ldd)                       \
                    } else if (format == CK_Q5_1) {                                                      \
                        CK_TILE2(q5_1_tile, n, fetch, w, nb, a, astride, out, ldd)                       \
                    } else if (format == CK_Q4_K) {                                                      \
                        CK_TILE2_TURNS(q4_k_tile, n, fetch, nb, w, nb, a, astride, out, ldd)             \
                    } else if (format == CK_Q6_PLANES && c == 0 && (q6_offset)) {                        \
                        uint8_t * bytes = q6_unpacked_panel(unpacked, nb, p - group);                    \
                        CK_TILE2_TURNS(q6_offset_planes_tile, n, fetch, nb, w, NULL, bytes, nb, a, astride, out, \
                                       ldd)                                                              \
                    } else if (format == CK_Q6_PLANES && c == 0) {                                       \
                        uint8_t * bytes = q6_unpacked_panel(unpacked, nb, p - group);                    \
                        CK_TILE2_TURNS(q6_planes_tile, n, fetch, nb, w, NULL, bytes, nb, a, astride, out, ldd) \
                    } else if (format == CK_Q6_PLANES && (q6_offset)) {                                  \
                        const uint8_t * bytes = q6_unpacked_panel(unpacked, nb, p - group);              \
                        CK_TILE2_TURNS(q6_offset_bytes_tile, n, fetch, nb, w, bytes, nb, a, astride, out, ldd) \
                    } else if (format == CK_Q6_PLANES) {                                                 \
                        const uint8_t * bytes = q6_unpacked_panel(unpacked, nb, p - group);              \
                        CK_TILE2_TURNS(q6_bytes_tile, n, fetch, nb, w, bytes, nb, a, astride, out, ldd)  \
                    } else {                                                                             \
                        CK_TILE2(q8_0_tile, n, fetch, w, nb, a, astride, out, ldd)                       \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }

CK_AVX2 static void gemm_avx2(enum ck_format format, const uint8_t * packed, int64_t cols, int64_t p0,
                              int64_t p1, const uint8_t * act, int64_t n_cols, float * dst, int64_t ldd) {
    CK_GEMM_YMM(q4_1_tile_avx2, q4_k_tile_avx2, q5_1_tile_avx2, q6_planes_tile_avx2, q6_bytes_tile_avx2,
                offset_quants(CK_ISA_AVX2, format, n_cols), q6_planes_offset_tile_avx2, q6_bytes_offset_tile_avx2,
                q8_0_tile_avx2)
}

// ---------------------------------------------------------------- AVX-VNNI

// A block of 4-bit quants (8 rows: half `half` of a panel) times C
// columns with AVX-VNNI: vpdpbusd multiplies the nibbles (unsigned) by the
// quants and adds in 32 bits, one instruction where AVX2 needs a multiply,
// a widening add and an add.
CK_AVX_VNNI CK_INLINE void q4_block_sums_avx_vnni(const uint8_t * blk, const int half, const uint8_t * act,
                                                  size_t astride, int64_t b, __m256i * t, const int C) {
    for (int c = 0; c < C; c++) {
        t[c] = _mm256_setzero_si256();
    }
    for (int h = 0; h < 4; h++) {
        __m256i lo, hi;
        q4_nibbles_ymm(blk, h, half, &lo, &hi);
        for (int c = 0; c < C; c++) {
            const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
            t[c] = _mm256_dpbusd_avx_epi32(t[c], lo, _mm256_set1_epi32(q[h]));
            t[c] = _mm256_dpbusd_avx_epi32(t[c], hi, _mm256_set1_epi32(q[4 + h]));
        }
    }
}

// 8 rows x C columns of Q4_1 with AVX-VNNI (q4_block_sums_avx_vnni, then
// the float step). (A second chain of
// sums per column measured no faster: the tile is bound by the two ports
// that run vpdpbusd and the float step, not by latency.)
CK_AVX_VNNI CK_INLINE void q4_1_tile_avx_vnni(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                              float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q4_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q4_1_PANEL_BLOCK);
        }
        __m256i s[4];
        q4_block_sums_avx_vnni(blk, half, act, astride, b, s, C);
        min_block_ymm(blk + 256 + 16 * half, blk + 288 + 16 * half, act, astride, nb, b, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// 8 rows x C columns of Q5_1 with AVX-VNNI: vpdpbusd on the quant bytes.
CK_AVX_VNNI CK_INLINE void q5_1_tile_avx_vnni(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                              float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q5_1_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q5_1_PANEL_BLOCK);
        }
        __m256i s[4];
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_setzero_si256();
        }
        for (int g = 0; g < 8; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * g + 32 * half));
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                s[c] = _mm256_dpbusd_avx_epi32(s[c], v, _mm256_set1_epi32(q[g]));
            }
        }
        min_block_ymm(blk + 512 + 16 * half, blk + 544 + 16 * half, act, astride, nb, b, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// 8 rows x C columns of Q8_0 with AVX-VNNI: as the AVX-512 tile (the quants
// offset by 128, each sum starting at -128 sum(w)).
CK_AVX_VNNI CK_INLINE void q8_0_tile_avx_vnni(const uint8_t * w, int64_t nb, const uint8_t * act, size_t astride,
                                              float * dst, int64_t ldd, const int C, const int half,
                                      const bool fetch) {
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk = w + (size_t)b * Q8_0_PANEL_BLOCK;
        if (fetch) {
            fetch_ahead(blk, Q8_0_PANEL_BLOCK);
        }
        const __m256i start = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_slli_epi32(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(blk + 544 + 16 * half))), 7));
        __m256i s[4];
        for (int c = 0; c < C; c++) {
            s[c] = start;
        }
        for (int g = 0; g < 8; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * g + 32 * half));
            for (int c = 0; c < C; c++) {
                const int32_t * q = (const int32_t *)(act + (size_t)c * astride + (size_t)b * CK_BLOCK);
                s[c] = _mm256_dpbusd_avx_epi32(s[c], _mm256_set1_epi32(q[g]), v);
            }
        }
        scaled_block_ymm(blk + 512 + 16 * half, act, astride, nb, b, s, acc, C);
    }
    store_sums_ymm(dst, ldd, half, acc, C);
}

// A Q4_K block with AVX-VNNI: its products by vpdpbusd into a 32-bit sum a
// row (8 instructions a column where AVX2 spends 8 multiplies and 7 adds in
// 16 bits, then a widening with the scales), times the rows' 6-bit scales
// by one vpmulld, into sums over the super-block (at most 8 x 63 x 32 x 15
// x 127). The same integer sums as q4_k_block_avx2, so the same results;
// products of Q4_K 0.93x the time of the Q4_1 panels these kernels took
// before (1B model, B = 64, Zen 5).
CK_AVX_VNNI CK_INLINE void q4_k_block_avx_vnni(const uint8_t * super, const int j, const uint8_t * blk,
                                               const int half, const uint8_t * act, size_t astride, int64_t b,
                                               const __m256i spread, __m256i * isum, const int C) {
    (void)spread;
    __m256i t[4];
    q4_block_sums_avx_vnni(blk, half, act, astride, b, t, C);
    const __m256i scales = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(super + Q4_K_SCALES(j) + 8 * half)));
    for (int c = 0; c < C; c++) {
        isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(t[c], scales));
        CK_KEEP_SUM(isum[c]);
    }
}

CK_Q4_K_TILE_YMM(q4_k_tile_avx_vnni, CK_AVX_VNNI, q4_k_block_avx_vnni)

// A Q6_PLANES block with AVX-VNNI: each half block's sum of (q - 32) x in
// 32 bits, from the column's -32 times its half sum, by four vpdpbusd,
// times the rows' 8-bit scale of that half by one vpmulld (12 instructions
// a block and column where AVX2 spends 22; at most 16 x 127 x 64 x 128 a
// block). The two halves' chains run side by side: one after the other,
// their latency showed (a 1B model's output projection at B = 64, Zen 5:
// 106 ms against 88). The same integer sums as q6_planes_block_ymm, so
// the same results.
CK_AVX_VNNI CK_INLINE void q6_planes_block_avx_vnni(const uint8_t * super, const int j, const uint8_t * unpacked,
                                                    uint8_t * unpack_into, const int64_t b, const int half,
                                                    const uint8_t * act, size_t astride, int64_t nb, __m256i * s,
                                                    __m256i * terms, const int C) {
    (void)terms;  // its activations are not offset
    const uint8_t * blk = super + past_header(CK_Q6_PLANES, j);
    __m256i v[8];
    for (int g = 0; g < 8; g++) {
        const size_t at = (size_t)b * Q6_UNPACKED_BLOCK + 32 * half + 64 * g;
        if (unpacked) {
            v[g] = _mm256_loadu_si256((const __m256i *)(unpacked + at));
        } else {
            v[g] = q6_planes_chunk_ymm(blk, g, half);
            if (unpack_into) {
                _mm256_storeu_si256((__m256i *)(unpack_into + at), v[g]);
            }
        }
    }
    for (int c = 0; c < C; c++) {
        const uint8_t * col = act + (size_t)c * astride;
        const int32_t * q = (const int32_t *)(col + (size_t)b * CK_BLOCK);
        const int32_t * offsets = column_half_offsets(col, nb) + 2 * b;
        __m256i first = _mm256_set1_epi32(offsets[0]);
        __m256i second = _mm256_set1_epi32(offsets[1]);
        for (int i = 0; i < 4; i++) {
            first = _mm256_dpbusd_avx_epi32(first, v[i], _mm256_set1_epi32(q[i]));
            second = _mm256_dpbusd_avx_epi32(second, v[4 + i], _mm256_set1_epi32(q[4 + i]));
        }
        // Each row's two scales (a 16-bit pair), as 32-bit lanes.
        const __m256i scale_pairs =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(super + Q6_PLANES_SCALES(j) + 16 * half)));
        const __m256i first_scales = _mm256_srai_epi32(_mm256_slli_epi32(scale_pairs, 16), 16);
        s[c] = _mm256_add_epi32(s[c], _mm256_mullo_epi32(first, first_scales));
        CK_KEEP_SUM(s[c]);
        s[c] = _mm256_add_epi32(s[c], _mm256_mullo_epi32(second, _mm256_srai_epi32(scale_pairs, 16)));
        CK_KEEP_SUM(s[c]);
    }
}

CK_Q6_PLANES_TILE_YMM(q6_planes_tile_avx_vnni, CK_AVX_VNNI, q6_planes_block_avx_vnni, false)

// The later column tiles' Q6_PLANES tile: the same, from the bytes.
CK_AVX_VNNI CK_INLINE void q6_bytes_tile_avx_vnni(const uint8_t * w, const uint8_t * unpacked, int64_t nb,
                                                  const uint8_t * act, size_t astride, float * dst, int64_t ldd,
                                                  const int64_t sb0, const int64_t sb1, const int C, const int half,
                                                  const bool fetch) {
    q6_planes_tile_avx_vnni(w, unpacked, NULL, nb, act, astride, dst, ldd, sb0, sb1, C, half, fetch);
}

CK_AVX_VNNI static void gemm_avx_vnni(enum ck_format format, const uint8_t * packed, int64_t cols, int64_t p0,
                                      int64_t p1, const uint8_t * act, int64_t n_cols, float * dst, int64_t ldd) {
    // (Its Q6 activations are never offset: vpdpbusd multiplies an offset
    // start as cheaply.)
    CK_GEMM_YMM(q4_1_tile_avx_vnni, q4_k_tile_avx_vnni, q5_1_tile_avx_vnni, q6_planes_tile_avx_vnni,
                q6_bytes_tile_avx_vnni, false, q6_planes_tile_avx_vnni, q6_bytes_tile_avx_vnni, q8_0_tile_avx_vnni)
}

#endif  // CK_X86

void ck_gemm(enum ck_isa isa, enum ck_format format, const void * packed, int64_t cols, int64_t panel_begin,
             int64_t panel_end, const uint8_t * activations, int64_t n_cols, float * dst, int64_t ldd) {
#if CK_X86
    if (isa == CK_ISA_AVX512) {
        gemm_avx512(format, packed, cols, panel_begin, panel_end, activations, n_cols, dst, ldd);
        return;
    }
    if (isa == CK_ISA_AVX_VNNI) {
        gemm_avx_vnni(format, packed, cols, panel_begin, panel_end, activations, n_cols, dst, ldd);
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

