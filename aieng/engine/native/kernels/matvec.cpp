// The matrix-vector ops (``aieng::matvec``, ``matvec_int8``, ``matvec_int4``) and ``stream_read``:
// argument checks around ``matvec_kernels.h``, where the kernels and the reasons for them are.
#include "matvec_kernels.h"

namespace {

using namespace matvec_kernels;

void check_shapes(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "matvec: x [R, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "matvec: x must be float32");
  TORCH_CHECK(x.size(1) == weight.size(1), "matvec: x has ", x.size(1), " columns, weight ", weight.size(1));
  TORCH_CHECK(x.size(0) >= 1, "matvec: at least one row");
  TORCH_CHECK(weight.size(1) % kWidth == 0, "matvec: K must be a multiple of ", kWidth);
  TORCH_CHECK(weight.is_contiguous(), "matvec: weight must be contiguous");
}

at::Tensor matvec(const at::Tensor& x, const at::Tensor& weight) {
  check_shapes(x, weight);
  if (x.size(0) > kMaxRows) {
    TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
                "matvec: weight must be float32 or bfloat16");
    return at::linear(x.to(weight.scalar_type()), weight).to(at::kFloat);
  }
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "matvec: weight must be float32 or bfloat16 (int8 goes through matvec_int8)");
  const at::Tensor xs = x.contiguous();
  at::Tensor out = at::empty({xs.size(0), weight.size(0)}, xs.options());
  matvec_into(xs.data_ptr<float>(), xs.size(0), weight.size(1), weight, nullptr, 0, out.data_ptr<float>());
  return out;
}

at::Tensor matvec_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  check_shapes(x, weight);
  TORCH_CHECK(x.size(0) <= kMaxRows, "matvec_int8: 1 to ", kMaxRows, " rows, got ", x.size(0));
  TORCH_CHECK(weight.scalar_type() == at::kChar, "matvec_int8: weight must be int8");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 && scales.size(0) == weight.size(0) &&
                  scales.is_contiguous(),
              "matvec_int8: scales [N, K / group] float32");
  const int64_t R = x.size(0), K = weight.size(1), N = weight.size(0);
  TORCH_CHECK(scales.size(1) >= 1 && K % scales.size(1) == 0 && (K / scales.size(1)) % kWidth == 0,
              "matvec_int8: a group of weights per scale that divides K and is a multiple of ", kWidth);
  const at::Tensor xs = x.contiguous();
  at::Tensor out = at::empty({R, N}, xs.options());
  matvec_into(xs.data_ptr<float>(), R, K, weight, scales.data_ptr<float>(), scales.size(1), out.data_ptr<float>());
  return out;
}

at::Tensor matvec_int4(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "matvec_int4: x [R, K] and weight [N, K / 2]");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "matvec_int4: x must be float32");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.is_contiguous(),
              "matvec_int4: weight must be contiguous uint8, two 4-bit weights a byte");
  const int64_t R = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(R >= 1 && R <= kMaxRows, "matvec_int4: 1 to ", kMaxRows, " rows, got ", R);
  TORCH_CHECK(K % kQ4Chunk == 0, "matvec_int4: K must be a multiple of ", kQ4Chunk, ", got ", K);
  TORCH_CHECK(weight.size(1) * 2 == K, "matvec_int4: x has ", K, " columns, weight ", weight.size(1) * 2);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 && scales.size(0) == N &&
                  scales.size(1) == K / kQ4Group && scales.is_contiguous(),
              "matvec_int4: scales [N, K / 32] float32");
  const at::Tensor xs = x.contiguous();
  at::Tensor out = at::empty({R, N}, xs.options());
  matvec_into(xs.data_ptr<float>(), R, K, weight, scales.data_ptr<float>(), scales.size(1), out.data_ptr<float>());
  return out;
}

// The sum of a float32 buffer, read the way ``matvec`` reads weights (contiguous ranges per
// thread, several accumulators, the next lines prefetched): the read bandwidth a kernel can get
// here, the ceiling ``aieng bench memory`` states batch-1 results against. torch's own sum is a
// general reduction and on some machines reads slower than a matrix-vector product does.
double stream_read(const at::Tensor& buffer) {
  TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous(), "stream_read: a contiguous float32 buffer");
  const float* p = buffer.data_ptr<float>();
  const int64_t n = buffer.numel() / (4 * kWidth) * (4 * kWidth);
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t chunk = (n / (4 * kWidth) + threads - 1) / threads * (4 * kWidth);
  std::vector<double> partial(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      // four streams a thread, as matvec reads a band of four weight rows
      V acc[4] = {zero(), zero(), zero(), zero()};
      const int64_t first = std::min(n, t * chunk), stop = std::min(n, (t + 1) * chunk);
      const int64_t quarter = (stop - first) / (4 * kWidth) * kWidth;
      for (int64_t i = first; i < first + quarter; i += kWidth) {
        for (int j = 0; j < 4; ++j) prefetch(p + i + j * quarter + 4 * kWidth);
        for (int j = 0; j < 4; ++j) acc[j] = add(acc[j], load(p + i + j * quarter));
      }
      float rest = 0.f;
      for (int64_t i = first + 4 * quarter; i < stop; ++i) rest += p[i];
      partial[t] = sum(add(add(acc[0], acc[1]), add(acc[2], acc[3]))) + rest;
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  for (int64_t i = n; i < buffer.numel(); ++i) total += p[i];
  return total;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aieng, m) {
  m.def("matvec(Tensor x, Tensor weight) -> Tensor");
  m.def("matvec_int8(Tensor x, Tensor weight, Tensor scales) -> Tensor");
  m.def("matvec_int4(Tensor x, Tensor weight, Tensor scales) -> Tensor");
  m.def("stream_read(Tensor buffer) -> float");
}

TORCH_LIBRARY_IMPL(aieng, CPU, m) {
  m.impl("matvec", &matvec);
  m.impl("matvec_int8", &matvec_int8);
  m.impl("matvec_int4", &matvec_int4);
  m.impl("stream_read", &stream_read);
}
