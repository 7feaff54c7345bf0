// ``aieng::decode_attention``: argument checks around ``attention_kernels.h``, where the kernel
// and the reasons for it are.
#include "attention_kernels.h"

namespace {

using namespace attention_kernels;

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& positions, int64_t first, double scale) {
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "query [B, KV, G, D], keys/values [S, KV, L, D]");
  TORCH_CHECK(query.scalar_type() == at::kFloat, "query must be float32");
  TORCH_CHECK(keys.scalar_type() == values.scalar_type(), "keys and values must share a dtype");
  TORCH_CHECK(query.size(1) == keys.size(1) && query.size(3) == keys.size(3), "query and cache shapes differ");
  TORCH_CHECK(query.size(3) <= kMaxHeadDim && query.size(3) % Vec::size() == 0,
              "decode_attention: a head width of at most 256 and a multiple of ", Vec::size());
  const int64_t rows = query.size(0);
  TORCH_CHECK(positions.numel() == rows && first + rows <= keys.size(0), "one position per decoding row, within the cache");
  at::Tensor q = query.contiguous();
  at::Tensor out = at::empty_like(q);
  if (rows == 0) return out;
  at::Tensor pos = positions.to(at::kLong).contiguous();
  std::vector<int64_t> lengths(pos.data_ptr<int64_t>(), pos.data_ptr<int64_t>() + rows);
  for (auto& n : lengths) {
    n += 1;  // keys 0..position
    TORCH_CHECK(n >= 1 && n <= keys.size(2), "a position lies outside the cache");
  }
  if (keys.scalar_type() == at::kFloat)
    decode_attention_impl<float>(q, keys, values, lengths, first, static_cast<float>(scale), out);
  else if (keys.scalar_type() == at::kBFloat16)
    decode_attention_impl<at::BFloat16>(q, keys, values, lengths, first, static_cast<float>(scale), out);
  else
    TORCH_CHECK(false, "keys and values must be float32 or bfloat16");
  return out;
}

}  // namespace

TORCH_LIBRARY(aieng, m) {
  m.def("decode_attention(Tensor query, Tensor keys, Tensor values, Tensor positions, int first, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(aieng, CPU, m) { m.impl("decode_attention", &decode_attention); }
