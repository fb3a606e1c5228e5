// Fused pieces of one bfloat16 decode step of a Llama-style block, for dapo_suite.decoding.LeanStepper on a CPU.
//
// Between its four projections, a decode step runs ~20 small tensor ops per layer (RoPE, cache writes, attention,
// residual adds, RMSNorm, casts, SiLU x up). Each costs a dispatch and a pass over memory: ~5 us at 1 row,
// ~20 us at 64 rows on two threads. These kernels do the same arithmetic, reading each input once, in float32,
// and rounding to bfloat16 once where the result is stored; `run_layers` runs them with the projections for
// every layer in one call, and `sample_next` draws the next tokens:
//   attend          RoPE of q and k, the step's k and v written into the cache, grouped-query attention over the
//                   row's valid cache positions only (left padding is skipped, not masked)
//   add_rms_norm    h += x;  y = bf16(w * h / sqrt(mean(h^2) + eps))
//   silu_mul        y = bf16(silu(g) * u) for [g, u] = x
// Built on first use by torch.utils.cpp_extension (dapo_suite/fused_step.py); tests/test_sampler.py checks each
// against the float32 reference.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

using at::BFloat16;

namespace {

// Rotary position embedding (Su et al. 2021, arXiv 2104.09864), "rotate half" layout:
//   y[i] = x[i] cos[i] - x[i + D/2] sin[i],  y[i + D/2] = x[i + D/2] cos[i + D/2] + x[i] sin[i + D/2].
inline void rotate(const BFloat16* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = float(x[i]) * cos[i] - float(x[i + half]) * sin[i];
    out[i + half] = float(x[i + half]) * cos[i + half] + float(x[i]) * sin[i + half];
  }
}

// Scores of `fold` queries (fold x DIM, float32) against positions [begin, end) of one head's keys (T x DIM),
// written to scores[f * stride + t - begin]. Each key is converted once and dotted with every query.
// The same positions' values are prefetched meanwhile: the cache streams from memory, and two threads reading
// one stream each wait on memory (measured: 19 GB/s at 64 rows where a copy runs at 45-80); with the values
// in flight beside the keys, the weighted sum that follows reads them from cache.
template <int64_t DIM>
void score_span(const float* q, int64_t fold, const BFloat16* keys, const BFloat16* values, int64_t begin,
                int64_t end, float scale, float* scores, int64_t stride) {
  constexpr int64_t line = 64 / sizeof(BFloat16), ahead = 8;  // bf16 per cache line; positions ahead
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t d = 0; d < DIM; d += line) {
      __builtin_prefetch(keys + (t + ahead) * DIM + d);
      __builtin_prefetch(values + t * DIM + d);
    }
    float k[DIM];
    for (int64_t d = 0; d < DIM; ++d) k[d] = float(keys[t * DIM + d]);
    for (int64_t f = 0; f < fold; ++f) {
      float dot = 0.f;
      for (int64_t d = 0; d < DIM; ++d) dot += q[f * DIM + d] * k[d];
      scores[f * stride + t - begin] = dot * scale;
    }
  }
}

// out[f] += sum_t w[f][t - begin] v[t] over positions [begin, end); out (fold x DIM) float32.
template <int64_t DIM>
void accumulate_span(const float* weights, int64_t fold, const BFloat16* values, int64_t begin, int64_t end,
                     int64_t stride, float* out) {
  for (int64_t t = begin; t < end; ++t) {
    float v[DIM];
    for (int64_t d = 0; d < DIM; ++d) v[d] = float(values[t * DIM + d]);
    for (int64_t f = 0; f < fold; ++f) {
      const float w = weights[f * stride + t - begin];
      for (int64_t d = 0; d < DIM; ++d) out[f * DIM + d] += w * v[d];
    }
  }
}

}  // namespace

// The tensors of one `attend` call, as pointers and sizes (see `attend`).
struct Queries {
  const BFloat16* qkv;
  const float *cos, *sin;
  const int64_t *rows, *slots;
  BFloat16 *cache_k, *cache_v;
  const int64_t* cache_start;
  const BFloat16 *prompt_k, *prompt_v;
  const int64_t *prompt_start, *row_prompt;
  BFloat16* out;
  int64_t count, heads, kv_heads, cache_slots, prompts, prompt_len;
  float scale;
};

// Query n's key and value for head h, rotated and stored at its cache row and slot.
template <int64_t DIM>
void store_key_value(const Queries& qs, int64_t n, int64_t h) {
  const BFloat16* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  float k[DIM];
  rotate(row + (qs.heads + h) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, k);
  const int64_t at = ((qs.rows[n] * qs.kv_heads + h) * qs.cache_slots + qs.slots[n]) * DIM;
  const BFloat16* v = row + (qs.heads + qs.kv_heads + h) * DIM;
  for (int64_t d = 0; d < DIM; ++d) {
    qs.cache_k[at + d] = BFloat16(k[d]);
    qs.cache_v[at + d] = v[d];
  }
}

// Query n's `fold` query heads of key/value head h attend to its row's valid positions: the shared prompt's
// [prompt_start, T) when there is one, then the row's own [cache_start, slot].
template <int64_t DIM>
void attend_head(const Queries& qs, int64_t n, int64_t h, float* q, float* scores, int64_t span, float* acc) {
  const int64_t fold = qs.heads / qs.kv_heads, b = qs.rows[n], slot = qs.slots[n];
  const BFloat16* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    rotate(row + (h * fold + f) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, q + f * DIM);
  int64_t shared = 0, p_begin = 0;
  const BFloat16 *pk = nullptr, *pv = nullptr;
  if (qs.prompts) {
    const int64_t p = qs.row_prompt[b], base = (p * qs.kv_heads + h) * qs.prompt_len * DIM;
    pk = qs.prompt_k + base, pv = qs.prompt_v + base, p_begin = qs.prompt_start[p];
    shared = qs.prompt_len - p_begin;
    score_span<DIM>(q, fold, pk, pv, p_begin, qs.prompt_len, qs.scale, scores, span);
  }
  const int64_t cache = (b * qs.kv_heads + h) * qs.cache_slots * DIM, o_begin = qs.cache_start[b];
  const int64_t count = shared + slot + 1 - o_begin;
  score_span<DIM>(q, fold, qs.cache_k + cache, qs.cache_v + cache, o_begin, slot + 1, qs.scale, scores + shared,
                  span);
  for (int64_t f = 0; f < fold; ++f) {  // softmax in place
    float* row_scores = scores + f * span;
    const float top = *std::max_element(row_scores, row_scores + count);
    float total = 0.f;
    for (int64_t t = 0; t < count; ++t) {
      row_scores[t] = std::exp(row_scores[t] - top);
      total += row_scores[t];
    }
    const float inverse = 1.f / total;
    for (int64_t t = 0; t < count; ++t) row_scores[t] *= inverse;
  }
  std::fill(acc, acc + fold * DIM, 0.f);
  if (qs.prompts) accumulate_span<DIM>(scores, fold, pv, p_begin, qs.prompt_len, span, acc);
  accumulate_span<DIM>(scores + shared, fold, qs.cache_v + cache, o_begin, slot + 1, span, acc);
  BFloat16* out = qs.out + (n * qs.heads + h * fold) * DIM;
  for (int64_t i = 0; i < fold * DIM; ++i) out[i] = BFloat16(acc[i]);
}

template <int64_t DIM>
void attend_all(const Queries& qs) {
  const int64_t pairs = qs.count * qs.kv_heads, fold = qs.heads / qs.kv_heads;
  // every key and value first: a prompt's queries (prefill) attend to each other's
  at::parallel_for(0, pairs, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) store_key_value<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads);
  });
  const int64_t span = qs.prompt_len + *std::max_element(qs.slots, qs.slots + qs.count) + 1;
  at::parallel_for(0, pairs, 1, [&](int64_t first, int64_t last) {
    std::vector<float> q(fold * DIM), scores(fold * span), acc(fold * DIM);
    for (int64_t i = first; i < last; ++i)
      attend_head<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads, q.data(), scores.data(), span, acc.data());
  });
}

// Grouped-query softmax attention (Vaswani et al. 2017, arXiv 1706.03762) of N queries, with RoPE and the cache
// write: out = softmax(scale RoPE(q) K^T) V over each query's valid positions.
//   qkv (N, (H + 2 H_kv) D) bf16, the queries' projections; cos, sin (N, D) float32 at their positions;
//   rows, slots (N,): each query's cache row and slot. Its rotated k and v are written there, and it attends to
//   its row's [cache_start[row], slot] (left padding is skipped, not masked). A decode step has one query per
//   row; a prompt pass has one per prompt token, which see each other's keys (they are all written first).
//   cache_k, cache_v (R, H_kv, S, D) bf16.
//   prompt_k, prompt_v (P, H_kv, T, D) bf16 and prompt_start (P,): a prompt cache shared by the rows of a group
//   (row r reads prompt row_prompt[r], positions [prompt_start, T), before its own); empty when rows hold their
//   prompts.
// Returns (N, H D) bf16, heads in q's order.
torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor rows, torch::Tensor slots,
                     torch::Tensor cache_k, torch::Tensor cache_v, torch::Tensor cache_start, torch::Tensor prompt_k,
                     torch::Tensor prompt_v, torch::Tensor prompt_start, torch::Tensor row_prompt, int64_t heads,
                     double scale) {
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16 && qkv.is_contiguous(), "qkv: contiguous bfloat16");
  TORCH_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous(), "cache: contiguous");
  TORCH_CHECK(rows.numel() == qkv.size(0) && slots.numel() == qkv.size(0), "rows, slots: one per query");
  const int64_t dim = cache_k.size(3), prompts = prompt_k.numel() ? prompt_k.size(0) : 0;
  auto out = torch::empty({qkv.size(0), heads * dim}, qkv.options());
  if (qkv.size(0) == 0) return out;
  Queries qs{qkv.data_ptr<BFloat16>(), cos.data_ptr<float>(), sin.data_ptr<float>(), rows.data_ptr<int64_t>(),
             slots.data_ptr<int64_t>(), cache_k.data_ptr<BFloat16>(), cache_v.data_ptr<BFloat16>(),
             cache_start.data_ptr<int64_t>(), prompts ? prompt_k.data_ptr<BFloat16>() : nullptr,
             prompts ? prompt_v.data_ptr<BFloat16>() : nullptr, prompts ? prompt_start.data_ptr<int64_t>() : nullptr,
             prompts ? row_prompt.data_ptr<int64_t>() : nullptr, out.data_ptr<BFloat16>(), qkv.size(0), heads,
             cache_k.size(1), cache_k.size(2), prompts, prompts ? prompt_k.size(2) : 0, float(scale)};
  if (dim == 64) attend_all<64>(qs);
  else if (dim == 128) attend_all<128>(qs);
  else TORCH_CHECK(false, "attend: head dim ", dim, " (compiled for 64 and 128)");
  return out;
}

// RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) of the residual stream after adding x (when given):
//   h += x;  y = bf16(w * h / sqrt(mean(h^2) + eps)).   hidden (B, C) float32, updated in place.
torch::Tensor add_rms_norm(torch::Tensor hidden, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps) {
  TORCH_CHECK(hidden.is_contiguous() && hidden.scalar_type() == at::kFloat, "hidden: contiguous float32");
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  auto out = torch::empty({rows, width}, hidden.options().dtype(at::kBFloat16));
  float* h_p = hidden.data_ptr<float>();
  const BFloat16* x_p = delta ? delta->data_ptr<BFloat16>() : nullptr;
  const float* w_p = weight.data_ptr<float>();
  BFloat16* out_p = out.data_ptr<BFloat16>();
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      float* h = h_p + b * width;
      if (x_p) {
        const BFloat16* x = x_p + b * width;
        for (int64_t i = 0; i < width; ++i) h[i] += float(x[i]);
      }
      float squares = 0.f;
      for (int64_t i = 0; i < width; ++i) squares += h[i] * h[i];
      const float inverse = 1.f / std::sqrt(squares / width + float(eps));
      BFloat16* y = out_p + b * width;
      for (int64_t i = 0; i < width; ++i) y[i] = BFloat16(w_p[i] * (h[i] * inverse));
    }
  });
  return out;
}

// The gated MLP's activation (Shazeer 2020, arXiv 2002.05202): y = bf16(silu(g) * u), [g, u] = x (B, 2I) bf16.
torch::Tensor silu_mul(torch::Tensor x) {
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kBFloat16, "x: contiguous bfloat16");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  auto out = torch::empty({rows, width}, x.options());
  const BFloat16* x_p = x.data_ptr<BFloat16>();
  BFloat16* out_p = out.data_ptr<BFloat16>();
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const BFloat16 *g = x_p + b * 2 * width, *u = g + width;
      BFloat16* y = out_p + b * width;
      for (int64_t i = 0; i < width; ++i) {
        const float gate = float(g[i]);
        y[i] = BFloat16(gate / (1.f + std::exp(-gate)) * float(u[i]));
      }
    }
  });
  return out;
}

// Next-token sampling from logits (B, V): temperature, then nucleus (top-p) sampling (Holtzman et al. 2019, arXiv
// 1904.09751), one uniform per row (`uniforms` (B,), from the caller's torch generator); greedy when
// temperature == 0. Returns the tokens (B,) int64 and their log-probs under softmax(logits / T) (T = 1 when
// greedy), the distribution before top-p, which is what the trainer recomputes.
// The nucleus: the most likely tokens, in descending order, whose mass before each is <= top_p. It is found among
// the tokens above a probability threshold (1e-4, lowered while the tokens above it hold less than top_p; they
// are a prefix of the descending order, so the nucleus lies inside them), sorted, not among the whole vocabulary.
template <typename T>
void sample_rows(const T* logits, int64_t rows, int64_t vocab, float temperature, float top_p, const float* uniforms,
                 int64_t* tokens, float* log_probs) {
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    std::vector<float> weights(vocab);  // e^(z - z_max), z = logits / T
    std::vector<std::pair<float, int64_t>> candidates;
    for (int64_t b = first; b < last; ++b) {
      const T* row = logits + b * vocab;
      float largest = float(row[0]);
      for (int64_t i = 1; i < vocab; ++i) largest = std::max(largest, float(row[i]));
      const float t = temperature > 0 ? temperature : 1.f, top = largest / t;
      float total = 0.f;
      for (int64_t i = 0; i < vocab; ++i) {
        weights[i] = std::exp(float(row[i]) / t - top);
        total += weights[i];
      }
      int64_t token = 0;
      if (temperature <= 0) {  // greedy: the first most likely token, as argmax
        while (float(row[token]) != largest) ++token;
      } else if (top_p >= 1.f) {  // the whole distribution, in vocabulary order
        const float target = uniforms[b] * total;
        float mass = 0.f;
        token = vocab - 1;
        for (int64_t i = 0; i < vocab; ++i) {
          mass += weights[i];
          if (mass > target && weights[i] > 0.f) { token = i; break; }
        }
      } else {
        float threshold = 1e-4f * total, held = 0.f;
        for (;;) {
          candidates.clear();
          held = 0.f;
          for (int64_t i = 0; i < vocab; ++i)
            if (weights[i] >= threshold) candidates.emplace_back(weights[i], i), held += weights[i];
          if (held >= top_p * total || threshold == 0.f) break;
          threshold = threshold > 1e-30f * total ? threshold * 1e-3f : 0.f;
        }
        std::sort(candidates.begin(), candidates.end(), [](const auto& x, const auto& y) {
          return x.first > y.first || (x.first == y.first && x.second < y.second);
        });
        float before = 0.f;
        size_t kept = 0;
        while (kept < candidates.size() && before <= top_p * total) before += candidates[kept++].first;
        const float target = uniforms[b] * before;
        float mass = 0.f;
        token = candidates[kept - 1].second;
        for (size_t k = 0; k < kept; ++k) {
          mass += candidates[k].first;
          if (mass > target) { token = candidates[k].second; break; }
        }
      }
      tokens[b] = token;
      log_probs[b] = std::log(weights[token]) - std::log(total);
    }
  });
}

std::vector<torch::Tensor> sample_next(torch::Tensor logits, double temperature, double top_p,
                                       torch::Tensor uniforms) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits: contiguous (rows, vocabulary)");
  TORCH_CHECK(uniforms.scalar_type() == at::kFloat && uniforms.numel() == logits.size(0), "uniforms: (rows,) float32");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  auto tokens = torch::empty({rows}, logits.options().dtype(at::kLong));
  auto log_probs = torch::empty({rows}, logits.options().dtype(at::kFloat));
  if (logits.scalar_type() == at::kBFloat16)
    sample_rows(logits.data_ptr<BFloat16>(), rows, vocab, float(temperature), float(top_p),
                uniforms.data_ptr<float>(), tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>());
  else {
    const auto values = logits.to(at::kFloat);
    sample_rows(values.data_ptr<float>(), rows, vocab, float(temperature), float(top_p), uniforms.data_ptr<float>(),
                tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>());
  }
  return {tokens, log_probs};
}

// x W^T + b by oneDNN for a weight reordered once into its blocked layout (what the Python side calls
// torch.ops.mkldnn._linear_pointwise), else by aten's linear.
at::Tensor project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool packed) {
  const std::optional<at::Tensor> b = bias.numel() ? std::optional<at::Tensor>(bias) : std::nullopt;
  if (!packed) return at::linear(x, weight, b);
  static auto linear = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                             c10::string_view, c10::List<std::optional<at::Scalar>>,
                                             std::optional<c10::string_view>)>();
  return linear.call(x, weight, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

// Every layer of a Llama-style block for N tokens, one call from Python (at one row, ~240 Python calls per
// step cost more than the step's arithmetic besides the weight reads):
//   x = RMSNorm(h);  per layer: h += Attn(RoPE(x W_qkv^T)) W_o^T;  x = RMSNorm(h);  h += (silu(g) * u) W_down^T
//   for [g, u] = x W_gu^T;  x = RMSNorm(h) with the next layer's norm (the final norm after the last).
// hidden (N, C) float32, updated in place; layers[i] = {norm_in, W_qkv, b_qkv (or empty), W_o, norm_post, W_gu,
// W_down, norm_after}; cache (2, layers, R, H_kv, S, D); prompt_kv (2, layers, P, H_kv, T, D) or empty.
// Returns x after the last layer's norm, (N, C) bf16.
at::Tensor run_layers(at::Tensor hidden, const std::vector<std::vector<at::Tensor>>& layers, bool packed,
                      at::Tensor cos, at::Tensor sin, at::Tensor rows, at::Tensor slots, at::Tensor cache,
                      at::Tensor cache_start, at::Tensor prompt_kv, at::Tensor prompt_start, at::Tensor row_prompt,
                      int64_t heads, double scale, double eps) {
  const bool shared = prompt_kv.numel() > 0;
  const at::Tensor empty = cache.new_empty({0});
  at::Tensor x = add_rms_norm(hidden, std::nullopt, layers[0][0], eps);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& w = layers[i];
    const at::Tensor attended = attend(
        project(x, w[1], w[2], packed), cos, sin, rows, slots, cache[0][i], cache[1][i], cache_start,
        shared ? prompt_kv[0][i] : empty, shared ? prompt_kv[1][i] : empty, prompt_start, row_prompt, heads, scale);
    x = add_rms_norm(hidden, project(attended, w[3], empty, packed), w[4], eps);
    x = add_rms_norm(hidden, project(silu_mul(project(x, w[5], empty, packed)), w[6], empty, packed), w[7], eps);
  }
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("attend", &attend);
  module.def("add_rms_norm", &add_rms_norm);
  module.def("silu_mul", &silu_mul);
  module.def("sample_next", &sample_next);
  module.def("run_layers", &run_layers);
}
