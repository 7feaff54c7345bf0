// Every decoder layer of one decoding row in one call: the batch-1 decode step.
//
// Why: at batch 1 a step reads every weight once, and the projections stream them at the read
// bandwidth (``matvec_kernels.h``). What lies between the projections is a few thousand floats
// per layer (two norms, the rotary embedding, the cache write, attention, the MLP's gate, two
// residual sums), yet run as separate ops (inductor's kernels, the dispatcher, the compiled
// graph's Python wrapper and guards) those cost as much per layer as the smaller projections.
// Here they are plain loops between the kernels, and the whole stack is one call, so a batch-1
// step costs its projections, its attention and little else. The arithmetic is the serving
// forward's (``llama.decoder_layer``): the same kernels for the projections and attention,
// float32 activations, the cache written in its own dtype.
//
//   x          [1, D] float32: the row's embedding -> returned: its hidden state after the layers
//   cos, sin   [d] float32: the rotary embedding at the row's position
//   position   the row's position: its key and value are written there, keys 0..position attended
//   slot       the row's slot in every layer's cache
//   layers     kFields tensors per layer, ``LayerWeights``' fields in order (optional ones None)
//   keys, values  one per layer, [slots, KV, cap, d] float32 or bfloat16, written in place
#include "attention_kernels.h"
#include "matvec_kernels.h"

namespace {

// LayerWeights' fields: qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down, down_bias,
// norm_attn, norm_mlp, qkv_scales, o_scales, gate_up_scales, down_scales.
constexpr int64_t kFields = 14;

struct Projection {
  at::Tensor weight;
  const float* bias;
  const float* scales;
  int64_t scale_cols;
  int64_t in, out;  // K and N
};

const float* float_data(const std::optional<at::Tensor>& t, int64_t numel, const char* what) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == numel, "one_row_layers: ", what,
              " must be a contiguous float32 tensor of ", numel, " values");
  return t->data_ptr<float>();
}

Projection projection(const c10::List<std::optional<at::Tensor>>& layers, int64_t at, int64_t bias_at,
                      int64_t scales_at, int64_t in, const char* what) {
  const std::optional<at::Tensor> w = layers.get(at);
  TORCH_CHECK(w.has_value() && w->dim() == 2 && w->is_contiguous(), "one_row_layers: ", what,
              " must be a contiguous matrix");
  const bool four_bit = w->scalar_type() == at::kByte;
  TORCH_CHECK(w->size(1) * (four_bit ? 2 : 1) == in, "one_row_layers: ", what, " takes ", w->size(1),
              " inputs, the layer gives it ", in);
  TORCH_CHECK(in % (four_bit ? matvec_kernels::kQ4Chunk : 2 * matvec_kernels::kWidth) == 0, "one_row_layers: ",
              what, " has an input width the kernels do not take");
  const int64_t out = w->size(0);
  const std::optional<at::Tensor> s = layers.get(scales_at);
  const bool quantized = w->scalar_type() == at::kChar || four_bit;
  TORCH_CHECK(quantized == s.has_value(), "one_row_layers: ", what, " has scales exactly when it is int8 or 4-bit");
  TORCH_CHECK(!s.has_value() || (s->scalar_type() == at::kFloat && s->dim() == 2 && s->size(0) == out &&
                                 s->is_contiguous() && in % s->size(1) == 0 &&
                                 (four_bit ? s->size(1) == in / matvec_kernels::kQ4Group
                                           : (in / s->size(1)) % matvec_kernels::kWidth == 0)),
              "one_row_layers: ", what, "'s scales must be float32 [N, K / group]");
  return Projection{*w, float_data(layers.get(bias_at), out, "a bias"), s.has_value() ? s->data_ptr<float>() : nullptr,
                    s.has_value() ? s->size(1) : 0, in, out};
}

struct Layer {
  Projection qkv, o, gate_up, down;
  const float* norm_attn;
  const float* norm_mlp;
  at::Tensor keys, values;
};

void project(const float* x, const Projection& p, float* out) {
  matvec_kernels::matvec_into(x, 1, p.in, p.weight, p.scales, p.scale_cols, out);
  if (p.bias != nullptr)
    for (int64_t n = 0; n < p.out; ++n) out[n] += p.bias[n];
}

// weight * (x * rsqrt(mean(x^2) + eps)), as ``llama.rms_norm`` on float32 activations.
void rms_norm(const float* x, const float* weight, int64_t D, float eps, float* out) {
  double squares = 0.0;
  for (int64_t i = 0; i < D; ++i) squares += static_cast<double>(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(static_cast<float>(squares / D) + eps);
  for (int64_t i = 0; i < D; ++i) out[i] = weight[i] * (x[i] * inv);
}

// x * cos + rotate_half(x) * sin on each of ``heads`` vectors of width d, in place.
void rotate(float* x, int64_t heads, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  std::vector<float> head(d);
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    std::copy(v, v + d, head.begin());
    for (int64_t i = 0; i < d; ++i) v[i] = head[i] * cos[i] + (i < half ? -head[i + half] : head[i - half]) * sin[i];
  }
}

template <typename T>
void write_cache(at::Tensor& cache, int64_t slot, int64_t position, const float* rows, int64_t kv, int64_t d) {
  T* base = cache.data_ptr<T>() + slot * cache.stride(0) + position * cache.stride(2);
  for (int64_t h = 0; h < kv; ++h)
    for (int64_t i = 0; i < d; ++i) base[h * cache.stride(1) + i] = static_cast<T>(rows[h * d + i]);
}

at::Tensor one_row_layers(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t position,
                          int64_t slot, const c10::List<std::optional<at::Tensor>>& layers, at::TensorList keys,
                          at::TensorList values, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == 1, "one_row_layers: x is [1, D] float32");
  const int64_t D = x.size(1), d = head_dim, L = static_cast<int64_t>(keys.size());
  TORCH_CHECK(layers.size() == static_cast<size_t>(L * kFields) && values.size() == keys.size(),
              "one_row_layers: ", kFields, " tensors, a key cache and a value cache per layer");
  TORCH_CHECK(heads % kv_heads == 0 && d % 16 == 0 && d <= 256, "one_row_layers: heads a multiple of KV heads, ",
              "a head width the attention kernel takes");
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(c.scalar_type() == at::kFloat && c.numel() == d && s.scalar_type() == at::kFloat && s.numel() == d,
              "one_row_layers: cos and sin are [d] float32");
  const int64_t q_size = heads * d, kv_size = kv_heads * d, groups = heads / kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  at::Tensor hidden = x.contiguous().clone();
  float* h = hidden.data_ptr<float>();
  std::vector<float> normed(D), qkv(q_size + 2 * kv_size), attn(q_size), projected(D), mixed;
  const auto floats = x.options();
  // Every layer's arguments are checked before the first is run: a bad call writes no cache.
  std::vector<Layer> stack;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t f = l * kFields;
    Layer layer{projection(layers, f + 0, f + 1, f + 10, D, "qkv"), projection(layers, f + 2, f + 3, f + 11, q_size, "o"),
                projection(layers, f + 4, f + 5, f + 12, D, "gate_up"), {}, float_data(layers.get(f + 8), D, "norm_attn"),
                float_data(layers.get(f + 9), D, "norm_mlp"), keys[l], values[l]};
    layer.down = projection(layers, f + 6, f + 7, f + 13, layer.gate_up.out / 2, "down");
    TORCH_CHECK(layer.qkv.out == q_size + 2 * kv_size && layer.o.out == D && layer.down.out == D &&
                    layer.gate_up.out % 2 == 0,
                "one_row_layers: layer ", l, "'s matrices do not match the heads and the hidden size");
    TORCH_CHECK(layer.norm_attn != nullptr && layer.norm_mlp != nullptr, "one_row_layers: every layer has its two norms");
    const at::Tensor &k_cache = layer.keys, &v_cache = layer.values;
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(1) == kv_heads && k_cache.size(3) == d && k_cache.stride(3) == 1 &&
                    slot >= 0 && slot < k_cache.size(0) && position >= 0 && position < k_cache.size(2) &&
                    v_cache.sizes() == k_cache.sizes() && v_cache.strides() == k_cache.strides() &&
                    v_cache.scalar_type() == k_cache.scalar_type() &&
                    (k_cache.scalar_type() == at::kFloat || k_cache.scalar_type() == at::kBFloat16),
                "one_row_layers: layer ", l, "'s caches (float32 or bfloat16 [slots, KV, cap, d]) do not hold slot ",
                slot, " at position ", position);
    stack.push_back(layer);
  }
  for (Layer& layer : stack) {
    at::Tensor &k_cache = layer.keys, &v_cache = layer.values;
    const float *norm_attn = layer.norm_attn, *norm_mlp = layer.norm_mlp;
    const Projection &p_qkv = layer.qkv, &p_o = layer.o, &p_gate_up = layer.gate_up, &p_down = layer.down;
    rms_norm(h, norm_attn, D, static_cast<float>(eps), normed.data());
    project(normed.data(), p_qkv, qkv.data());
    float *q = qkv.data(), *k = q + q_size, *v = k + kv_size;
    rotate(q, heads, d, c.data_ptr<float>(), s.data_ptr<float>());
    rotate(k, kv_heads, d, c.data_ptr<float>(), s.data_ptr<float>());
    at::Tensor out = at::from_blob(attn.data(), {1, kv_heads, groups, d}, floats);
    const at::Tensor query = at::from_blob(q, {1, kv_heads, groups, d}, floats);
    if (k_cache.scalar_type() == at::kBFloat16) {
      write_cache<at::BFloat16>(k_cache, slot, position, k, kv_heads, d);
      write_cache<at::BFloat16>(v_cache, slot, position, v, kv_heads, d);
      attention_kernels::decode_attention_impl<at::BFloat16>(query, k_cache, v_cache, {position + 1}, slot, scale, out);
    } else {
      write_cache<float>(k_cache, slot, position, k, kv_heads, d);
      write_cache<float>(v_cache, slot, position, v, kv_heads, d);
      attention_kernels::decode_attention_impl<float>(query, k_cache, v_cache, {position + 1}, slot, scale, out);
    }
    project(attn.data(), p_o, projected.data());
    for (int64_t i = 0; i < D; ++i) h[i] += projected[i];

    rms_norm(h, norm_mlp, D, static_cast<float>(eps), normed.data());
    mixed.resize(p_gate_up.out);
    project(normed.data(), p_gate_up, mixed.data());
    const int64_t inner = p_gate_up.out / 2;
    for (int64_t i = 0; i < inner; ++i) {  // silu(gate) * up
      const float gate = mixed[i];
      mixed[i] = gate / (1.f + std::exp(-gate)) * mixed[inner + i];
    }
    project(mixed.data(), p_down, projected.data());
    for (int64_t i = 0; i < D; ++i) h[i] += projected[i];
  }
  return hidden;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aieng, m) {
  m.def(
      "one_row_layers(Tensor x, Tensor cos, Tensor sin, int position, int slot, Tensor?[] layers, Tensor(a!)[] keys, "
      "Tensor(b!)[] values, int heads, int kv_heads, int head_dim, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(aieng, CPU, m) { m.impl("one_row_layers", &one_row_layers); }
