// The kernel behind ``decode_attention.cpp``'s op and ``one_row.cpp``'s decode step.
//
// Decode attention on the CPU: each decoding row's query heads against its slot of the static KV
// cache, reading every key and value once.
//
// Why not scaled_dot_product_attention: its CPU kernel is written for prefill. A decode query is a
// few rows (the query heads of one key/value head), so its blocked matrix products run at a small
// fraction of the machine's memory bandwidth, and it parallelises over rows x heads only, which at
// batch 1 is 3 units of work for all the cores. Here the key range of each (row, KV head) is split
// into pieces so every core streams its share, each piece keeps a running softmax (max, sum,
// weighted values), and the pieces are merged at the end (the flash-decoding scheme).
//
//   query   [B, KV, G, D]          float32, the G query heads that share KV head h
//   keys    [slots, KV, cap, D]    float32 or bfloat16 (the cache; rows first..first+B-1 decode)
//   values  [slots, KV, cap, D]
//   positions [B]                  int64: row b attends keys 0..positions[b]
//   -> out  [B, KV, G, D]          float32
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {  // each file that includes this gets its own copy
namespace attention_kernels {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kBlock = 32;       // keys scored at once before the running softmax is updated
constexpr int64_t kMaxHeadDim = 256;

// Vec::size() floats from p (float32 or bfloat16 widened as it loads).
inline Vec load(const float* p) { return Vec::loadu(p); }
inline Vec load(const at::BFloat16* p) {
  float tmp[Vec::size()];
  for (int64_t i = 0; i < Vec::size(); ++i) tmp[i] = static_cast<float>(p[i]);
  return Vec::loadu(tmp);
}

// One piece: keys [begin, end) of one (row, KV head), for G query heads per KV head (a template
// parameter, so each head's accumulator stays in a register). Writes the piece's running max and
// sum per query head and its unnormalised weighted values. The head width d is a multiple of
// Vec::size().
template <typename T, int G>
void attend_piece(const float* q, const T* k, const T* v, int64_t stride_l, int64_t begin, int64_t end,
                  int64_t d, float scale, float* max_out, float* sum_out, float* acc_out) {
  constexpr int64_t W = Vec::size();
  alignas(64) float qs[G * kMaxHeadDim];
  for (int64_t i = 0; i < G * d; ++i) qs[i] = q[i] * scale;
  float m[G], s[G];
  std::fill(m, m + G, -std::numeric_limits<float>::infinity());
  std::fill(s, s + G, 0.f);
  std::fill(acc_out, acc_out + G * d, 0.f);
  alignas(64) float scores[G * kBlock];
  for (int64_t l0 = begin; l0 < end; l0 += kBlock) {
    const int64_t n = std::min(kBlock, end - l0);
    for (int64_t j = 0; j < n; ++j) {  // scores: each key row is read once for all G query heads
      const T* krow = k + (l0 + j) * stride_l;
      for (int64_t c = 0; c < d * (int64_t)sizeof(T); c += 64) {  // the next block's rows, ahead of use
        __builtin_prefetch(reinterpret_cast<const char*>(krow + kBlock * stride_l) + c);
        __builtin_prefetch(reinterpret_cast<const char*>(v + (l0 + j) * stride_l) + c);
      }
      Vec dots[G];
      for (int g = 0; g < G; ++g) dots[g] = Vec(0.f);
      for (int64_t i = 0; i < d; i += W) {
        const Vec kv = load(krow + i);
        for (int g = 0; g < G; ++g) dots[g] = at::vec::fmadd(Vec::loadu(qs + g * d + i), kv, dots[g]);
      }
      for (int g = 0; g < G; ++g)
        scores[g * kBlock + j] = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, dots[g]);
    }
    for (int g = 0; g < G; ++g) {  // running softmax
      float* sc = scores + g * kBlock;
      const float block_max = *std::max_element(sc, sc + n);
      const float new_max = std::max(m[g], block_max);
      const float rescale = std::exp(m[g] - new_max);  // 0 on the first block (m = -inf)
      if (rescale != 1.f) {
        float* a = acc_out + g * d;
        for (int64_t i = 0; i < d; i += W) (Vec::loadu(a + i) * Vec(rescale)).store(a + i);
        s[g] *= rescale;
      }
      m[g] = new_max;
      int64_t j = 0;
      for (; j + W <= n; j += W) (Vec::loadu(sc + j) - Vec(new_max)).exp_u20().store(sc + j);
      for (; j < n; ++j) sc[j] = std::exp(sc[j] - new_max);
      for (j = 0; j < n; ++j) s[g] += sc[j];
    }
    for (int64_t i = 0; i < d; i += W) {  // weighted values, a column strip at a time in registers
      Vec acc[G];
      for (int g = 0; g < G; ++g) acc[g] = Vec::loadu(acc_out + g * d + i);
      for (int64_t j = 0; j < n; ++j) {
        const Vec vv = load(v + (l0 + j) * stride_l + i);
        for (int g = 0; g < G; ++g) acc[g] = at::vec::fmadd(Vec(scores[g * kBlock + j]), vv, acc[g]);
      }
      for (int g = 0; g < G; ++g) acc[g].store(acc_out + g * d + i);
    }
  }
  std::copy(m, m + G, max_out);
  std::copy(s, s + G, sum_out);
}

// attend_piece for the query heads per KV head this model has (1 to 8: every Llama-family
// configuration in use); more fall back to 8 at a time.
template <typename T>
void attend_piece_any(const float* q, const T* k, const T* v, int64_t stride_l, int64_t begin, int64_t end,
                      int64_t groups, int64_t d, float scale, float* max_out, float* sum_out, float* acc_out) {
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const int64_t n = std::min<int64_t>(8, groups - g0);
    const float* qg = q + g0 * d;
    float *mo = max_out + g0, *so = sum_out + g0, *ao = acc_out + g0 * d;
    switch (n) {
      case 1: attend_piece<T, 1>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 2: attend_piece<T, 2>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 3: attend_piece<T, 3>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 4: attend_piece<T, 4>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 5: attend_piece<T, 5>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 6: attend_piece<T, 6>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      case 7: attend_piece<T, 7>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
      default: attend_piece<T, 8>(qg, k, v, stride_l, begin, end, d, scale, mo, so, ao); break;
    }
  }
}

inline void add_scaled(float* dst, float w, const float* src, int64_t d) {
  for (int64_t i = 0; i < d; i += Vec::size()) at::vec::fmadd(Vec(w), Vec::loadu(src + i), Vec::loadu(dst + i)).store(dst + i);
}

template <typename T>
void decode_attention_impl(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                           const std::vector<int64_t>& lengths, int64_t first, float scale, at::Tensor& out) {
  const int64_t rows = query.size(0), kv = query.size(1), groups = query.size(2), d = query.size(3);
  const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  // Enough pieces that every thread has several (batch 1 has only KV units otherwise), none
  // shorter than a few blocks, so the merge stays negligible.
  const int64_t threads = at::get_num_threads();
  const int64_t wanted = std::max<int64_t>(1, (4 * threads + rows * kv - 1) / (rows * kv));
  const int64_t pieces = std::max<int64_t>(1, std::min(wanted, (max_len + 4 * kBlock - 1) / (4 * kBlock)));
  const int64_t piece_len = (max_len + pieces - 1) / pieces;
  const int64_t units = rows * kv * pieces;
  std::vector<float> maxes(units * groups), sums(units * groups), accs(units * groups * d);

  const float* q = query.data_ptr<float>();
  const T* k = keys.data_ptr<T>();
  const T* v = values.data_ptr<T>();
  const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
  const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
  TORCH_CHECK(ks2 == vs2 && keys.stride(3) == 1 && values.stride(3) == 1, "keys and values need the same layout");

  at::parallel_for(0, units, 1, [&](int64_t start, int64_t stop) {
    for (int64_t u = start; u < stop; ++u) {
      const int64_t row = u / (kv * pieces), h = (u / pieces) % kv, p = u % pieces;
      const int64_t begin = p * piece_len, end = std::min(lengths[row], begin + piece_len);
      float* m = maxes.data() + u * groups;
      float* s = sums.data() + u * groups;
      float* a = accs.data() + u * groups * d;
      if (begin >= end) {  // this row is shorter than the longest: an empty piece
        std::fill(m, m + groups, -std::numeric_limits<float>::infinity());
        std::fill(s, s + groups, 0.f);
        std::fill(a, a + groups * d, 0.f);
        continue;
      }
      const int64_t slot = first + row;
      attend_piece_any<T>(q + (row * kv + h) * groups * d, k + slot * ks0 + h * ks1, v + slot * vs0 + h * vs1, ks2,
                          begin, end, groups, d, scale, m, s, a);
    }
  });

  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows * kv, 1, [&](int64_t start, int64_t stop) {
    for (int64_t rh = start; rh < stop; ++rh) {
      for (int64_t g = 0; g < groups; ++g) {
        float total_max = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < pieces; ++p) total_max = std::max(total_max, maxes[(rh * pieces + p) * groups + g]);
        float total = 0.f;
        float* dst = o + (rh * groups + g) * d;
        std::fill(dst, dst + d, 0.f);
        for (int64_t p = 0; p < pieces; ++p) {
          const int64_t u = rh * pieces + p;
          const float w = std::exp(maxes[u * groups + g] - total_max);  // 0 for an empty piece
          if (w == 0.f) continue;
          total += w * sums[u * groups + g];
          add_scaled(dst, w, accs.data() + (u * groups + g) * d, d);
        }
        const float inv = 1.f / total;
        for (int64_t i = 0; i < d; ++i) dst[i] *= inv;
      }
    }
  });
}

}  // namespace attention_kernels
}  // namespace
