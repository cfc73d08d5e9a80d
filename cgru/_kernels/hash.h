/* cgru_fingerprint: a keyed 122-bit fingerprint of a byte string, for binding a reserve to the
 * arrays of its call.
 *
 * A reserve records what the forward that wrote it computed with (x, the weights, h0, the state
 * mask), so that a backward given other arrays is refused. A hash that anyone can evaluate
 * could be steered: someone who knows it can change an input (a crafted model, say) so that the
 * fingerprint stays the same. This one is keyed by a random secret drawn once per process, and
 * built so that its collision probability is bounded for every pair of inputs, whatever they
 * are, as long as the key is unknown to whoever chose them (a universal hash, as UMAC and VHASH
 * are built):
 *
 *   1. NH over 1 KiB blocks (256 little-endian 32-bit words m[0..255], the last block padded
 *      with zeros), twice, with key words k and the same key shifted by four words (Toeplitz):
 *          NH_k(m) = Σ_{j<128} ((m[2j] + k[2j]) mod 2³²) · ((m[2j+1] + k[2j+1]) mod 2³²)  mod 2⁶⁴.
 *      Two different blocks give equal NH values with probability at most 2⁻³² per key, and
 *      equal pairs of values (both keys) at most 2⁻⁶⁴.
 *   2. Each stream's block values go, as two 32-bit halves, into a polynomial over the field of
 *      the prime p = 2⁶¹ − 1 with a secret point r (h ← h·r + half mod p, from h = 1), and the
 *      byte length last. Two different sequences of ℓ elements agree with probability at most
 *      ℓ/p per stream.
 *
 * So two different inputs of ℓ KiB at most get equal fingerprints (both results) with
 * probability at most 2⁻⁶⁴ + (2ℓ + 2)/p, whatever their contents: below 2⁻³⁸ for 4 GiB. The
 * results are never shown as they are: the reserve stores a keyed BLAKE2b MAC of them
 * (cgru/core/reserve.py), so it reveals nothing of the key.
 *
 * The NH inner loop is 32×32→64-bit multiplies (one vpmuludq per four pairs on AVX2, eight on
 * AVX-512, chosen at run time), so it runs at memory speed; the polynomial costs four
 * multiplications per KiB.
 * Integer arithmetic only: the same key and bytes give the same result in every clone and
 * thread.
 */
#ifndef CGRU_HASH_H
#define CGRU_HASH_H

#include "simd.h"

#define CGRU_FP_WORDS 256                  /* 32-bit words per NH block (1 KiB) */
#define CGRU_FP_P ((1ULL << 61) - 1)

typedef struct {
    uint32_t nh[CGRU_FP_WORDS + 4];    /* NH key words; the second stream starts at word 4 */
    uint64_t r[2];                     /* polynomial points, in [1, p − 1] */
} cgru_fp_key;

/* h·r + m mod p (h, r < p; m < 2³²) */
CGRU_INLINE uint64_t cgru_fp_poly(uint64_t h, uint64_t r, uint64_t m) {
    unsigned __int128 t = (unsigned __int128)h * r;
    uint64_t s = ((uint64_t)t & CGRU_FP_P) + (uint64_t)(t >> 61);
    s = (s >= CGRU_FP_P ? s - CGRU_FP_P : s) + m;
    return s >= CGRU_FP_P ? s - CGRU_FP_P : s;
}

/* the two NH values of one 1 KiB block: portable code, and AVX2 / AVX-512 (vpmuludq: four or
 * eight 32×32→64-bit products per instruction), all giving the same sums. With copy non-NULL
 * the block is also copied there, and the values summed are the copy's: the vector levels
 * store each loaded vector to the copy and sum that same register (one load feeds both, so a
 * thread writing the source meanwhile cannot make them differ); the portable code copies the
 * block first and reads the copy. */
static void cgru_fp_block_base(const unsigned char *p, const cgru_fp_key *key, uint64_t out[2],
                               unsigned char *copy) {
    if (copy) {
        memcpy(copy, p, 4 * CGRU_FP_WORDS);
        p = copy;
    }
    uint64_t s1 = 0, s2 = 0;
    for (int i = 0; i < CGRU_FP_WORDS; i += 2) {
        uint32_t a, b;
        memcpy(&a, p + 4 * (size_t)i, 4);
        memcpy(&b, p + 4 * (size_t)i + 4, 4);
        s1 += (uint64_t)(uint32_t)(a + key->nh[i]) * (uint32_t)(b + key->nh[i + 1]);
        s2 += (uint64_t)(uint32_t)(a + key->nh[i + 4]) * (uint32_t)(b + key->nh[i + 5]);
    }
    out[0] = s1;
    out[1] = s2;
}

#if CGRU_X86
#include <immintrin.h>

CGRU_TARGET_V4 static void cgru_fp_block_v4(const unsigned char *p, const cgru_fp_key *key,
                                            uint64_t out[2], unsigned char *copy) {
    __m512i acc1 = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
    for (int i = 0; i < CGRU_FP_WORDS; i += 16) {
        __m512i w = _mm512_loadu_si512((const void *)(p + 4 * (size_t)i));
        if (copy) _mm512_storeu_si512((void *)(copy + 4 * (size_t)i), w);
        __m512i v1 = _mm512_add_epi32(w, _mm512_loadu_si512((const void *)(key->nh + i)));
        __m512i v2 = _mm512_add_epi32(w, _mm512_loadu_si512((const void *)(key->nh + i + 4)));
        acc1 = _mm512_add_epi64(acc1, _mm512_mul_epu32(v1, _mm512_srli_epi64(v1, 32)));
        acc2 = _mm512_add_epi64(acc2, _mm512_mul_epu32(v2, _mm512_srli_epi64(v2, 32)));
    }
    out[0] = (uint64_t)_mm512_reduce_add_epi64(acc1);
    out[1] = (uint64_t)_mm512_reduce_add_epi64(acc2);
}

CGRU_TARGET_V3 static void cgru_fp_block_v3(const unsigned char *p, const cgru_fp_key *key,
                                            uint64_t out[2], unsigned char *copy) {
    __m256i acc1 = _mm256_setzero_si256(), acc2 = _mm256_setzero_si256();
    for (int i = 0; i < CGRU_FP_WORDS; i += 8) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(p + 4 * (size_t)i));
        if (copy) _mm256_storeu_si256((__m256i *)(copy + 4 * (size_t)i), w);
        __m256i v1 = _mm256_add_epi32(w, _mm256_loadu_si256((const __m256i *)(key->nh + i)));
        __m256i v2 = _mm256_add_epi32(w, _mm256_loadu_si256((const __m256i *)(key->nh + i + 4)));
        acc1 = _mm256_add_epi64(acc1, _mm256_mul_epu32(v1, _mm256_srli_epi64(v1, 32)));
        acc2 = _mm256_add_epi64(acc2, _mm256_mul_epu32(v2, _mm256_srli_epi64(v2, 32)));
    }
    uint64_t l1[4], l2[4];
    _mm256_storeu_si256((__m256i *)l1, acc1);
    _mm256_storeu_si256((__m256i *)l2, acc2);
    out[0] = l1[0] + l1[1] + l1[2] + l1[3];
    out[1] = l2[0] + l2[1] + l2[2] + l2[3];
}
#endif

static void cgru_fp_block(const unsigned char *p, const cgru_fp_key *key, uint64_t out[2],
                          int isa, unsigned char *copy) {
#if CGRU_X86
    switch (isa) {
    case 4: cgru_fp_block_v4(p, key, out, copy); return;
    case 3: cgru_fp_block_v3(p, key, out, copy); return;
    default: break;
    }
#endif
    cgru_fp_block_base(p, key, out, copy);
}

/* The fingerprint of p[0..n): out[0], out[1] < p, one per stream (isa: cgru_isa()'s value of
 * the code to run, or lower — every choice gives the same result).
 * With copy non-NULL, p[0..n) is also copied there, and what is fingerprinted is the copy's
 * bytes (cgru_fp_block): one pass over the source instead of a copy and then a fingerprint of
 * it — a training loop's new weights take both, and the copy's stores come free beside the
 * fingerprint's arithmetic. (A copy of each block before fingerprinting it was three times
 * slower than the two passes: the loads waited on the copy's stores still in flight.) */
static void cgru_fingerprint_copy(const unsigned char *p, unsigned char *copy, size_t n,
                                  const cgru_fp_key *key, uint64_t out[2], int isa) {
    uint64_t h[2] = {1, 1}, nh[2];
    size_t i = 0;
    for (; i + 4 * CGRU_FP_WORDS <= n; i += 4 * CGRU_FP_WORDS) {
        cgru_fp_block(p + i, key, nh, isa, copy ? copy + i : NULL);
        for (int s = 0; s < 2; s++) {
            h[s] = cgru_fp_poly(h[s], key->r[s], nh[s] >> 32);
            h[s] = cgru_fp_poly(h[s], key->r[s], nh[s] & 0xFFFFFFFFULL);
        }
    }
    if (i < n) {                                   /* the last, partial block: zero-padded */
        unsigned char last[4 * CGRU_FP_WORDS];
        memset(last, 0, sizeof last);
        if (copy) {                                /* (the copy's bytes, as above) */
            memcpy(copy + i, p + i, n - i);
            memcpy(last, copy + i, n - i);
        } else {
            memcpy(last, p + i, n - i);
        }
        cgru_fp_block(last, key, nh, isa, NULL);
        for (int s = 0; s < 2; s++) {
            h[s] = cgru_fp_poly(h[s], key->r[s], nh[s] >> 32);
            h[s] = cgru_fp_poly(h[s], key->r[s], nh[s] & 0xFFFFFFFFULL);
        }
    }
    for (int s = 0; s < 2; s++) {                  /* the length, as two 32-bit halves */
        h[s] = cgru_fp_poly(h[s], key->r[s], (uint64_t)n >> 32);
        out[s] = cgru_fp_poly(h[s], key->r[s], (uint64_t)n & 0xFFFFFFFFULL);
    }
}

static void cgru_fingerprint(const unsigned char *p, size_t n, const cgru_fp_key *key,
                             uint64_t out[2], int isa) {
    cgru_fingerprint_copy(p, NULL, n, key, out, isa);
}

#endif
