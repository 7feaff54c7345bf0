// The kernels behind ``matvec.cpp``'s ops and ``one_row.cpp``'s decode step: a few rows of
// float32 activations times a weight matrix, streamed at the machine's read bandwidth.
//
//
// Why not F.linear or inductor's generated reduction: a one-row product reads every weight once
// for two flops, so all that counts is how fast the weights stream. The BLAS kernel is built for
// matrices and reaches about half the read bandwidth; inductor's reduction gets further but keeps
// one or a few add chains per output. Here every thread takes a contiguous range of output rows
// and streams them in bands of four weight rows, each with its own accumulators (independent add
// chains), prefetching the next band as it goes, so the loop is bound by memory, not by the
// latency of the adds or the hardware prefetcher's restarts at every short row.
//
//   x      [R, K]  float32; more than kMaxRows rows are a matrix product, not a stream of weights,
//                  and go to at::linear (so a compiled graph whose row count varies calls one op)
//   weight [N, K]  float32, bfloat16 (widened to float32 as it loads, the input is not rounded),
//                  or int8 with scales [N, K / group] float32 (one scale per group of
//                  weights along K, weight-only quantisation: half the bytes of bf16),
//                  or 4-bit: uint8 [N, K / 2] with scales [N, K / 32] (``matvec_int4`` below)
//   -> out [R, N]  float32
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {  // each file that includes this gets its own copy
namespace matvec_kernels {

constexpr int64_t kMaxRows = 4;
constexpr int64_t kBand = 4;  // weight rows streamed together

#if defined(__AVX512F__)
constexpr int64_t kWidth = 16;
using V = __m512;
inline V zero() { return _mm512_setzero_ps(); }
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline V load(const at::BFloat16* p) {  // bf16 is the top half of a float32
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline V load(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V scaled(V acc, float s) { return _mm512_mul_ps(acc, _mm512_set1_ps(s)); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline float sum(V a) { return _mm512_reduce_add_ps(a); }
#else
// Portable: the compiler vectorises these loops as far as the target allows.
constexpr int64_t kWidth = 8;
struct V {
  float v[kWidth];
};
inline V zero() { return V{}; }
template <typename T>
inline V load(const T* p) {
  V r;
  for (int64_t i = 0; i < kWidth; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline V fma(V a, V b, V c) {
  for (int64_t i = 0; i < kWidth; ++i) c.v[i] += a.v[i] * b.v[i];
  return c;
}
inline V scaled(V a, float s) {
  for (int64_t i = 0; i < kWidth; ++i) a.v[i] *= s;
  return a;
}
inline V add(V a, V b) {
  for (int64_t i = 0; i < kWidth; ++i) a.v[i] += b.v[i];
  return a;
}
inline float sum(V a) {
  float s = 0.f;
  for (int64_t i = 0; i < kWidth; ++i) s += a.v[i];
  return s;
}
#endif

// The same place in the next band's rows, fetched ahead of use: the hardware prefetcher alone
// restarts on every short row and leaves a core's stream well below the bandwidth. Into L2, not
// L1: a core has only a few L1 miss buffers, and prefetches that wait in them cap its stream
// well below what it reaches when L2, which tracks many more misses at once, holds them
// (``aieng bench memory`` reports the kernel's share of the read bandwidth). The portable build
// prefetches the same way. Past the end of the matrix it asks for nothing
// that faults (a prefetch never does).
template <typename T>
inline void prefetch(const T* p) { __builtin_prefetch(p, 0, 2); }
// Rows ahead that ``band`` prefetches: the next band for float32 and bf16; for int8, whose row is
// half a bf16 row's bytes, twice as far, so as many bytes are in flight.
template <typename T>
constexpr int64_t rows_ahead() { return sizeof(T) == 1 ? 2 * kBand : kBand; }

// Output rows [n, n + B) for all R input rows. K is a multiple of kWidth; ``group`` (a multiple
// of kWidth) is the span of one scale along K (K itself when there are no scales).
template <typename T, int R, int B>
inline void band(const float* x, const T* w, const float* scales, int64_t K, int64_t group, int64_t n, float* out,
                 int64_t N) {
  V total[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) total[r][b] = zero();
  const int64_t groups = K / group;
  for (int64_t g = 0; g < groups; ++g) {
    V acc[R][B];
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b) acc[r][b] = zero();
    for (int64_t k = g * group; k < (g + 1) * group; k += kWidth) {
      V wv[B];
      for (int b = 0; b < B; ++b) prefetch(w + (n + b + rows_ahead<T>()) * K + k);
      for (int b = 0; b < B; ++b) wv[b] = load(w + (n + b) * K + k);
      for (int r = 0; r < R; ++r) {
        const V xv = load(x + r * K + k);
        for (int b = 0; b < B; ++b) acc[r][b] = fma(xv, wv[b], acc[r][b]);
      }
    }
    if (scales == nullptr) {
      for (int r = 0; r < R; ++r)
        for (int b = 0; b < B; ++b) total[r][b] = add(total[r][b], acc[r][b]);
    } else {
      for (int b = 0; b < B; ++b) {
        const float s = scales[(n + b) * groups + g];
        for (int r = 0; r < R; ++r) total[r][b] = add(total[r][b], scaled(acc[r][b], s));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) out[r * N + n + b] = sum(total[r][b]);
}

#if defined(__AVX512F__)
// bf16 without widening each weight: 32 weights load as one vector of 16 pairs; a pair's high
// half is the odd weight as a float32 once its low half is masked off, the low half the even
// weight once shifted up. The input is split once per call into the matching even/odd halves
// (``split_pairs``), so each 32 weights cost two integer ops and two FMAs, and nothing is rounded.
template <int R, int B>
inline void band_pairs(const float* xp, const at::BFloat16* w, int64_t K, int64_t n, float* out, int64_t N) {
  V acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = zero();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; k += 2 * kWidth) {
    V even[B], odd[B];
    for (int b = 0; b < B; ++b) prefetch(w + (n + b + B) * K + k);
    for (int b = 0; b < B; ++b) {
      const __m512i pairs = _mm512_loadu_si512(reinterpret_cast<const void*>(w + (n + b) * K + k));
      even[b] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      odd[b] = _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
    }
    for (int r = 0; r < R; ++r) {
      const V xe = load(xp + r * K + k), xo = load(xp + r * K + k + kWidth);
      for (int b = 0; b < B; ++b) acc[r][b] = fma(xo, odd[b], fma(xe, even[b], acc[r][b]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) out[r * N + n + b] = sum(acc[r][b]);
}

// x [R, K] into each 32-wide block's 16 even then 16 odd elements. A plain loop into a plain
// buffer: the input is a few thousand floats, and the tensor ops that would do the same (view,
// transpose, contiguous) cost more in dispatch than the copy, on every projection of every step.
std::vector<float> split_pairs(const float* x, int64_t R, int64_t K) {
  std::vector<float> out(R * K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t block = 0; block < K; block += 2 * kWidth)
      for (int64_t i = 0; i < kWidth; ++i) {
        out[r * K + block + i] = x[r * K + block + 2 * i];
        out[r * K + block + kWidth + i] = x[r * K + block + 2 * i + 1];
      }
  return out;
}

template <int R>
void pairs_of(const float* xp, const at::BFloat16* w, int64_t K, int64_t N, float* out) {
  const int64_t bands = N / kBand;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  at::parallel_for(0, bands, (bands + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) band_pairs<R, kBand>(xp, w, K, i * kBand, out, N);
  });
  for (int64_t n = bands * kBand; n < N; ++n) band_pairs<R, 1>(xp, w, K, n, out, N);
}
#endif

template <typename T, int R>
void rows_of(const float* x, const T* w, const float* scales, int64_t K, int64_t group, int64_t N, float* out) {
  // Bands of kBand rows split evenly over the threads, each a contiguous range of the matrix.
  const int64_t bands = N / kBand;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  at::parallel_for(0, bands, (bands + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) band<T, R, kBand>(x, w, scales, K, group, i * kBand, out, N);
  });
  for (int64_t n = bands * kBand; n < N; ++n) band<T, R, 1>(x, w, scales, K, group, n, out, N);
}

template <typename T>
void dispatch_rows(int64_t R, const float* x, const T* w, const float* scales, int64_t K, int64_t group, int64_t N,
                   float* out) {
  switch (R) {
    case 1: return rows_of<T, 1>(x, w, scales, K, group, N, out);
    case 2: return rows_of<T, 2>(x, w, scales, K, group, N, out);
    case 3: return rows_of<T, 3>(x, w, scales, K, group, N, out);
    default: return rows_of<T, 4>(x, w, scales, K, group, N, out);
  }
}

// ---- 4-bit weights ----------------------------------------------------------------------------
// A row of K weights is K / 64 chunks of 32 bytes: byte j of a chunk holds weight j in its low
// nibble and weight 32 + j in its high one, each stored as q + 8 for q in [-8, 7], one fp32 scale
// per 32 weights (two per chunk). A quarter of bf16's bytes, but widening every nibble to fp32
// costs more instructions than the memory saves, so the input is rounded instead: each group of
// 32 inputs to int8 with its own scale (what llama.cpp's Q4_0 x Q8_0 product does), and a group's
// product is one integer dot product, 64 weights at a time (AVX-512 VNNI's dpbusd: unsigned weights
// times signed inputs, four products summed per 32-bit lane). The stored offset of 8 is taken off
// through the accumulator's starting value (-8 x the group's input sum), so the unpacked nibbles
// go straight in. ``aieng eval --dtype int4`` grades exactly this rounding of weights and inputs.
constexpr int64_t kQ4Group = 32;
constexpr int64_t kQ4Chunk = 64;  // weights per 32-byte chunk: two groups
// Rows ahead that the band prefetches, weights and scales. A 4-bit row is short (a quarter of a
// bf16 row's bytes): the next band alone is too little in flight to keep a core's stream fed.
constexpr int64_t kQ4Ahead = 16;

struct Q4Input {  // one call's input, rounded per group of 32
  std::vector<int8_t> q;      // [R, K]
  std::vector<float> scale;   // [R, K / 32]
  std::vector<int32_t> sum;   // [R, K / 32], the sum of q over the group
};

Q4Input round_input(const float* x, int64_t R, int64_t K) {
  const int64_t groups = K / kQ4Group;
  Q4Input in{std::vector<int8_t>(R * K), std::vector<float>(R * groups), std::vector<int32_t>(R * groups)};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = x + r * K + g * kQ4Group;
      float amax = 0.f;
      for (int64_t i = 0; i < kQ4Group; ++i) amax = std::max(amax, std::abs(v[i]));
      const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t total = 0;
      for (int64_t i = 0; i < kQ4Group; ++i) {
        const int32_t q = static_cast<int32_t>(std::nearbyint(v[i] * inv));
        in.q[r * K + g * kQ4Group + i] = static_cast<int8_t>(q);
        total += q;
      }
      in.scale[r * groups + g] = d;
      in.sum[r * groups + g] = total;
    }
  return in;
}

// Output rows [n, n + B): the same sums in plain C++, for CPUs without AVX-512 (the compiler
// vectorises what it can; the format plan refuses 4-bit where this loses to the float formats).
template <int R, int B>
inline void q4_band_plain(const Q4Input& in, const uint8_t* w, const float* scales, int64_t K, int64_t n, float* out,
                          int64_t N) {
  const int64_t groups = K / kQ4Group;
  for (int b = 0; b < B; ++b) {
    const uint8_t* row = w + (n + b) * (K / 2);
    const float* ws = scales + (n + b) * groups;
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = in.q.data() + r * K;
      float total = 0.f;
      for (int64_t c = 0; c < K / kQ4Chunk; ++c) {
        int32_t low = 0, high = 0;
        for (int64_t j = 0; j < kQ4Chunk / 2; ++j) {
          const int32_t byte = row[c * 32 + j];
          low += ((byte & 15) - 8) * xq[c * kQ4Chunk + j];
          high += ((byte >> 4) - 8) * xq[c * kQ4Chunk + 32 + j];
        }
        total += ws[2 * c] * in.scale[r * groups + 2 * c] * static_cast<float>(low) +
                 ws[2 * c + 1] * in.scale[r * groups + 2 * c + 1] * static_cast<float>(high);
      }
      out[r * N + n + b] = total;
    }
  }
}

#if defined(__AVX512BW__)
// Per chunk and input row, what the inner loop needs ready: the input's 64 int8 values, the
// accumulator's start (-8 x each group's input sum, in the first lane of each group's eight) and
// the input's two scales spread over their groups' lanes.
struct Q4Lanes {
  std::vector<__m512i> start;
  std::vector<__m512> scale;
};

Q4Lanes q4_lanes(const Q4Input& in, int64_t R, int64_t K) {
  const int64_t chunks = K / kQ4Chunk, groups = K / kQ4Group;
  Q4Lanes lanes{std::vector<__m512i>(R * chunks), std::vector<__m512>(R * chunks)};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t* s = in.sum.data() + r * groups + 2 * c;
      const float* d = in.scale.data() + r * groups + 2 * c;
      alignas(64) int32_t start[16] = {0};
      start[0] = -8 * s[0];
      start[8] = -8 * s[1];
      lanes.start[r * chunks + c] = _mm512_load_si512(start);
      lanes.scale[r * chunks + c] = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d[0]), _mm512_set1_ps(d[1]));
    }
  return lanes;
}

// Four unsigned nibble weights times four signed inputs, summed into each 32-bit lane.
inline __m512i dot_u4_s8(__m512i acc, __m512i w, __m512i x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w, x);
#else  // AVX-512 without VNNI: pairs to 16 bits (at most 2 x 15 x 127, no saturation), then to 32
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}

template <int R, int B>
inline void q4_band(const Q4Input& in, const Q4Lanes& lanes, const uint8_t* w, const float* scales, int64_t K,
                    int64_t n, float* out, int64_t N) {
  const int64_t chunks = K / kQ4Chunk, groups = K / kQ4Group, row_bytes = K / 2;
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  V total[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) total[r][b] = zero();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i wv[B];
    __m512 ws[B];
    for (int b = 0; b < B; ++b) {
      prefetch(w + (n + b + kQ4Ahead) * row_bytes + c * 32);
      if (c % 8 == 0) prefetch(scales + (n + b + kQ4Ahead) * groups + 2 * c);  // a line holds 8 chunks' scales
    }
    for (int b = 0; b < B; ++b) {
      // the chunk's 32 bytes in both halves; the upper half's words shifted to their high nibbles
      const __m512i bytes = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          w + (n + b) * row_bytes + c * 32)));
      wv[b] = _mm512_and_si512(_mm512_mask_srli_epi16(bytes, 0xFFFF0000u, bytes, 4), nibble);
      const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(scales + (n + b) * groups + 2 * c)));
      ws[b] = _mm512_permutexvar_ps(pair, _mm512_castps128_ps512(two));
    }
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_loadu_si512(reinterpret_cast<const void*>(in.q.data() + r * K + c * kQ4Chunk));
      const __m512i start = lanes.start[r * chunks + c];
      const __m512 xs = lanes.scale[r * chunks + c];
      for (int b = 0; b < B; ++b)
        total[r][b] = fma(_mm512_cvtepi32_ps(dot_u4_s8(start, wv[b], xv)), _mm512_mul_ps(ws[b], xs), total[r][b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) out[r * N + n + b] = sum(total[r][b]);
}
#endif

template <int R>
void q4_rows(const Q4Input& in, const uint8_t* w, const float* scales, int64_t K, int64_t N, float* out) {
  const int64_t bands = N / kBand;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
#if defined(__AVX512BW__)
  const Q4Lanes lanes = q4_lanes(in, R, K);
  at::parallel_for(0, bands, (bands + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) q4_band<R, kBand>(in, lanes, w, scales, K, i * kBand, out, N);
  });
  for (int64_t n = bands * kBand; n < N; ++n) q4_band<R, 1>(in, lanes, w, scales, K, n, out, N);
#else
  at::parallel_for(0, bands, (bands + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) q4_band_plain<R, kBand>(in, w, scales, K, i * kBand, out, N);
  });
  for (int64_t n = bands * kBand; n < N; ++n) q4_band_plain<R, 1>(in, w, scales, K, n, out, N);
#endif
}


// out [R, N] = x [R, K] times weight [N, K] in any of the formats above, R <= kMaxRows: the
// one place that picks the kernel by the weight's dtype (float32, bfloat16, int8 with scales
// [N, K / group], 4-bit as uint8 [N, K / 2] with scales [N, K / 32]). ``scales`` is null for
// the float formats. The caller has checked the shapes.
inline void matvec_into(const float* x, int64_t R, int64_t K, const at::Tensor& weight, const float* scales,
                        int64_t scale_cols, float* out) {
  const int64_t N = weight.size(0);
  switch (weight.scalar_type()) {
    case at::kFloat: return dispatch_rows<float>(R, x, weight.data_ptr<float>(), nullptr, K, K, N, out);
    case at::kBFloat16: {
#if defined(__AVX512F__)
      if (K % (2 * kWidth) == 0) {
        const std::vector<float> xp = split_pairs(x, R, K);
        const at::BFloat16* w = weight.data_ptr<at::BFloat16>();
        switch (R) {
          case 1: return pairs_of<1>(xp.data(), w, K, N, out);
          case 2: return pairs_of<2>(xp.data(), w, K, N, out);
          case 3: return pairs_of<3>(xp.data(), w, K, N, out);
          default: return pairs_of<4>(xp.data(), w, K, N, out);
        }
      }
#endif
      return dispatch_rows<at::BFloat16>(R, x, weight.data_ptr<at::BFloat16>(), nullptr, K, K, N, out);
    }
    case at::kChar: return dispatch_rows<int8_t>(R, x, weight.data_ptr<int8_t>(), scales, K, K / scale_cols, N, out);
    case at::kByte: {
      const Q4Input in = round_input(x, R, K);
      const uint8_t* w = weight.data_ptr<uint8_t>();
      switch (R) {
        case 1: return q4_rows<1>(in, w, scales, K, N, out);
        case 2: return q4_rows<2>(in, w, scales, K, N, out);
        case 3: return q4_rows<3>(in, w, scales, K, N, out);
        default: return q4_rows<4>(in, w, scales, K, N, out);
      }
    }
    default: TORCH_CHECK(false, "matvec: weights in float32, bfloat16, int8 or 4-bit (uint8)");
  }
}

}  // namespace matvec_kernels
}  // namespace
