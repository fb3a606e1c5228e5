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
//   linear          x W^T + b for any number of rows, W packed once in blocks of 48 outputs (`pack_weight`),
//                   each row tile an outer product of bf16 pairs (1.04-1.7x oneDNN's linear, 1-2048 rows)
// Built on first use by torch.utils.cpp_extension (dapo_suite/fused_step.py); tests/test_sampler.py checks each
// against the float32 reference.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

using at::BFloat16;

// The attention kernels and `linear` use bf16 pair dot products (avx512_bf16: Cooper Lake, Sapphire Rapids, Zen 4
// and later). Built elsewhere, the module keeps the norms and the sampler, and NATIVE_BF16 is false: the stepper
// then decodes with torch's ops (the default sampling dtype there is float32 anyway, dapo_suite.models.native_bf16).
#if defined(__AVX512BF16__)
constexpr bool NATIVE_BF16 = true;

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

// The totals of sixteen float32 vectors as one vector (lane j: the sum of a[j]'s lanes), by a transposed tree:
// four rounds that each pair vectors and add matching halves, ~3 instructions per vector instead of a full
// horizontal sum each.
inline __m512 sum_each16(__m512 (&a)[16]) {
  for (int j = 0; j < 8; ++j)  // per 128-bit block: a0+a2, b0+b2, a1+a3, b1+b3 of a = a[2j], b = a[2j+1]
    a[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  for (int j = 0; j < 4; ++j)  // per 128-bit block: one partial sum of each of four vectors
    a[j] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0xEE));
  for (int j = 0; j < 2; ++j)  // blocks: 4 vectors (blocks 0+1), same (2+3), next 4 (0+1), next 4 (2+3)
    a[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x88), _mm512_shuffle_f32x4(a[0], a[1], 0xDD));
}

// Scores of `fold` queries (fold x DIM, bf16) against positions [begin, end) of one head's keys (T x DIM, bf16),
// scale (q . k) written to scores[f * stride + t - begin]: bf16 pair products summed in float32 (avx512_bf16),
// sixteen positions at a time. The same positions' values are prefetched meanwhile: the cache streams from
// memory, and two threads reading one stream each wait on memory (measured: 19 GB/s at 64 rows where a copy runs
// at 45-80); with the values in flight beside the keys, the weighted sum that follows reads them from cache.
template <int64_t DIM>
void score_span(const BFloat16* q, int64_t fold, const BFloat16* keys, const BFloat16* values, int64_t begin,
                int64_t end, float scale, float* scores, int64_t stride) {
  constexpr int64_t chunks = DIM / 32, line = 64 / sizeof(BFloat16);  // 32 bf16 per vector and per cache line
  const __m512 scales = _mm512_set1_ps(scale);
  int64_t t = begin;
  for (; t + 16 <= end; t += 16) {
    for (int64_t d = 0; d < 16 * DIM; d += line) {
      __builtin_prefetch(keys + (t + 16) * DIM + d);
      __builtin_prefetch(values + t * DIM + d);
    }
    for (int64_t f = 0; f < fold; ++f) {
      __m512bh qs[chunks];
      for (int64_t c = 0; c < chunks; ++c) qs[c] = (__m512bh)_mm512_loadu_si512(q + f * DIM + 32 * c);
      __m512 dots[16];
      for (int j = 0; j < 16; ++j) {
        dots[j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c)
          dots[j] = _mm512_dpbf16_ps(dots[j], (__m512bh)_mm512_loadu_si512(keys + (t + j) * DIM + 32 * c), qs[c]);
      }
      _mm512_storeu_ps(scores + f * stride + t - begin, _mm512_mul_ps(sum_each16(dots), scales));
    }
  }
  for (; t < end; ++t) {
    for (int64_t f = 0; f < fold; ++f) {
      __m512 dot = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c)
        dot = _mm512_dpbf16_ps(dot, (__m512bh)_mm512_loadu_si512(keys + t * DIM + 32 * c),
                               (__m512bh)_mm512_loadu_si512(q + f * DIM + 32 * c));
      scores[f * stride + t - begin] = _mm512_reduce_add_ps(dot) * scale;
    }
  }
}

// out[f] += sum_t w[f][t - begin] v[t] over positions [begin, end), two positions per bf16 pair product: the two
// values interleaved (unpack), the two weights one 32-bit pair. weights (fold x stride) bf16; out (fold x DIM)
// float32 in the unpack's order: block 8k + i of a vector of 32 dims sits at lane 4k + i (i < 4) of its low
// accumulator, 8k + 4 + i at lane 4k + i of its high one (`attend_head` puts it back in order).
template <int64_t DIM>
void accumulate_span(const BFloat16* weights, int64_t fold, const BFloat16* values, int64_t begin, int64_t end,
                     int64_t stride, __m512* out) {
  constexpr int64_t chunks = DIM / 32;
  for (int64_t t = begin; t < end; t += 2) {
    const bool pair = t + 1 < end;  // an odd last position pairs with itself at weight zero
    __m512i low[chunks], high[chunks];
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i a = _mm512_loadu_si512(values + t * DIM + 32 * c);
      const __m512i b = pair ? _mm512_loadu_si512(values + (t + 1) * DIM + 32 * c) : a;
      low[c] = _mm512_unpacklo_epi16(a, b), high[c] = _mm512_unpackhi_epi16(a, b);
    }
    for (int64_t f = 0; f < fold; ++f) {
      const BFloat16* w = weights + f * stride + t - begin;
      const uint32_t bits = uint32_t(w[0].x) | (pair ? uint32_t(w[1].x) << 16 : 0u);
      const __m512bh ws = (__m512bh)_mm512_set1_epi32(int32_t(bits));
      for (int64_t c = 0; c < chunks; ++c) {
        out[f * 2 * chunks + 2 * c] = _mm512_dpbf16_ps(out[f * 2 * chunks + 2 * c], (__m512bh)low[c], ws);
        out[f * 2 * chunks + 2 * c + 1] = _mm512_dpbf16_ps(out[f * 2 * chunks + 2 * c + 1], (__m512bh)high[c], ws);
      }
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
// [prompt_start, T) when there is one, then the row's own [cache_start, slot]. The query is rounded to bf16 after
// RoPE and the softmax weights before the weighted sum, as the trainer's bf16 attention (autocast SDPA) does;
// scores, the softmax and the sums are float32, and the sums are divided by the softmax's total at the end.
template <int64_t DIM>
void attend_head(const Queries& qs, int64_t n, int64_t h, float* q, BFloat16* q_bf16, float* scores,
                 BFloat16* weights, int64_t span) {
  constexpr int64_t chunks = DIM / 32;
  const int64_t fold = qs.heads / qs.kv_heads, b = qs.rows[n], slot = qs.slots[n];
  const BFloat16* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    rotate(row + (h * fold + f) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, q + f * DIM);
  for (int64_t i = 0; i < fold * DIM; ++i) q_bf16[i] = BFloat16(q[i]);
  int64_t shared = 0, p_begin = 0;
  const BFloat16 *pk = nullptr, *pv = nullptr;
  if (qs.prompts) {
    const int64_t p = qs.row_prompt[b], base = (p * qs.kv_heads + h) * qs.prompt_len * DIM;
    pk = qs.prompt_k + base, pv = qs.prompt_v + base, p_begin = qs.prompt_start[p];
    shared = qs.prompt_len - p_begin;
    score_span<DIM>(q_bf16, fold, pk, pv, p_begin, qs.prompt_len, qs.scale, scores, span);
  }
  const int64_t cache = (b * qs.kv_heads + h) * qs.cache_slots * DIM, o_begin = qs.cache_start[b];
  const int64_t count = shared + slot + 1 - o_begin;
  score_span<DIM>(q_bf16, fold, qs.cache_k + cache, qs.cache_v + cache, o_begin, slot + 1, qs.scale,
                  scores + shared, span);
  float totals[16];  // fold <= 16 (checked by `attend`)
  for (int64_t f = 0; f < fold; ++f) {  // e^(s - max), kept unnormalised, rounded to bf16
    float* row_scores = scores + f * span;
    const float top = *std::max_element(row_scores, row_scores + count);
    float total = 0.f;
    for (int64_t t = 0; t < count; ++t) {  // vectorised (libmvec's exp, -ffast-math)
      row_scores[t] = std::exp(row_scores[t] - top);
      total += row_scores[t];
    }
    totals[f] = total;
    int64_t t = 0;
    for (; t + 16 <= count; t += 16)
      _mm256_storeu_si256((__m256i*)(weights + f * span + t),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row_scores + t)));
    for (; t < count; ++t) weights[f * span + t] = BFloat16(row_scores[t]);
  }
  __m512 acc[16 * 2 * chunks];
  for (int64_t i = 0; i < fold * 2 * chunks; ++i) acc[i] = _mm512_setzero_ps();
  if (qs.prompts) accumulate_span<DIM>(weights, fold, pv, p_begin, qs.prompt_len, span, acc);
  accumulate_span<DIM>(weights + shared, fold, qs.cache_v + cache, o_begin, slot + 1, span, acc);
  BFloat16* out = qs.out + (n * qs.heads + h * fold) * DIM;
  for (int64_t f = 0; f < fold; ++f) {
    const float inverse = 1.f / totals[f];
    for (int64_t c = 0; c < chunks; ++c) {
      float low[16], high[16];
      _mm512_storeu_ps(low, acc[f * 2 * chunks + 2 * c]);
      _mm512_storeu_ps(high, acc[f * 2 * chunks + 2 * c + 1]);
      BFloat16* o = out + f * DIM + 32 * c;
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 4; ++i) {
          o[8 * k + i] = BFloat16(low[4 * k + i] * inverse);
          o[8 * k + 4 + i] = BFloat16(high[4 * k + i] * inverse);
        }
    }
  }
}

template <int64_t DIM>
void attend_all(const Queries& qs) {
  const int64_t pairs = qs.count * qs.kv_heads, fold = qs.heads / qs.kv_heads;
  // every key and value first: a prompt's queries (prefill) attend to each other's
  at::parallel_for(0, pairs, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) store_key_value<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads);
  });
  const int64_t span = qs.prompt_len + *std::max_element(qs.slots, qs.slots + qs.count) + 1;
  // Pairs are handed out one at a time (their lengths differ: left padding, and a prompt's later tokens see more
  // keys), not in fixed halves, where one thread would wait on the other.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pairs);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> q(fold * DIM), scores(fold * span);
    std::vector<BFloat16> q_bf16(fold * DIM), weights(fold * span);
    for (int64_t i = next++; i < pairs; i = next++)
      attend_head<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads, q.data(), q_bf16.data(), scores.data(),
                       weights.data(), span);
  });
}

#else
constexpr bool NATIVE_BF16 = false;
#endif

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
  TORCH_CHECK(heads % cache_k.size(1) == 0 && heads / cache_k.size(1) <= 16, "attend: at most 16 query heads per "
              "key/value head");
  auto out = torch::empty({qkv.size(0), heads * dim}, qkv.options());
  if (qkv.size(0) == 0) return out;
#if defined(__AVX512BF16__)
  Queries qs{qkv.data_ptr<BFloat16>(), cos.data_ptr<float>(), sin.data_ptr<float>(), rows.data_ptr<int64_t>(),
             slots.data_ptr<int64_t>(), cache_k.data_ptr<BFloat16>(), cache_v.data_ptr<BFloat16>(),
             cache_start.data_ptr<int64_t>(), prompts ? prompt_k.data_ptr<BFloat16>() : nullptr,
             prompts ? prompt_v.data_ptr<BFloat16>() : nullptr, prompts ? prompt_start.data_ptr<int64_t>() : nullptr,
             prompts ? row_prompt.data_ptr<int64_t>() : nullptr, out.data_ptr<BFloat16>(), qkv.size(0), heads,
             cache_k.size(1), cache_k.size(2), prompts, prompts ? prompt_k.size(2) : 0, float(scale)};
  if (dim == 64) attend_all<64>(qs);
  else if (dim == 128) attend_all<128>(qs);
  else TORCH_CHECK(false, "attend: head dim ", dim, " (compiled for 64 and 128)");
#else
  TORCH_CHECK(false, "attend: built without avx512_bf16 (NATIVE_BF16 is false)");
#endif
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

// x W^T (+ b) in bfloat16 with float32 sums, for every projection of the decode step and the prompt pass.
// W is packed once (`pack_weight`) in blocks of 48 outputs: block j holds outputs [48j, 48j + 48) as
// (I/2, 48, 2), so for each pair of inputs the block's 48 outputs x 2 inputs are three vectors in a row (the
// pair layout `_mm512_dpbf16_ps` multiplies). A tile of up to 8 rows of x runs through a block with 24
// accumulators: per input pair, three vector loads of W, one broadcast of each row's pair, 24 pair products
// (an outer product; no horizontal sums). Each thread takes whole blocks, all tiles of x through a block while
// it sits in cache, the next block prefetched during the first tile. The last block holds the N % 48 outputs
// left (16 or 32).
// Against oneDNN's linear on weights reordered once into its own layout, the 121 projections of one step with
// the weights read from memory as a decode step reads them (benchmarks/projections.py): 1.6x at 1 row (96 % of
// the copy bandwidth), 1.5-1.7x at 4-16 rows, 1.3x at 30-64 (83-96 % of the square matmul's rate), 1.04x at 2048
// (the prompt pass).
constexpr int64_t PAIR_BLOCK = 48, TILE_ROWS = 8;

#if defined(__AVX512BF16__)
// ROWS rows of x (stride `in`) against one block of 16 V outputs (`pairs`: (in/2, 16 V, 2)); y points at the
// block's first output of row 0 (stride `out`). `next`: the block to prefetch meanwhile, or null.
template <int ROWS, int V>
void linear_tile(const BFloat16* x, int64_t in, const BFloat16* pairs, const BFloat16* next, const BFloat16* bias,
                 BFloat16* y, int64_t out) {
  __m512 acc[ROWS][V];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < in / 2; ++p) {
    const BFloat16* w = pairs + p * V * 32;  // 16 V outputs x 2 inputs: V vectors, V cache lines
    if (next)
      for (int v = 0; v < V; ++v) __builtin_prefetch(next + p * V * 32 + v * 32);
    __m512bh ws[V];
    for (int v = 0; v < V; ++v) ws[v] = (__m512bh)_mm512_loadu_si512(w + v * 32);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh xs = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(x + r * in + 2 * p));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ws[v], xs);
    }
  }
  for (int v = 0; v < V; ++v) {
    __m512 b = _mm512_setzero_ps();
    if (bias)  // bf16 -> float32: the 16 bits on top
      b = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(bias + 16 * v))), 16));
    for (int r = 0; r < ROWS; ++r)
      _mm256_storeu_si256((__m256i*)(y + r * out + 16 * v), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v], b)));
  }
}

// Every tile of x through one block of 16 V outputs.
template <int V>
void linear_block(const BFloat16* x, int64_t rows, int64_t in, const BFloat16* pairs, const BFloat16* next,
                  const BFloat16* bias, BFloat16* y, int64_t out) {
  for (int64_t r = 0; r < rows; r += TILE_ROWS, next = nullptr) {
    const BFloat16* x_r = x + r * in;
    BFloat16* y_r = y + r * out;
    switch (std::min(TILE_ROWS, rows - r)) {
      case 8: linear_tile<8, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 7: linear_tile<7, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 6: linear_tile<6, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 5: linear_tile<5, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 4: linear_tile<4, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 3: linear_tile<3, V>(x_r, in, pairs, next, bias, y_r, out); break;
      case 2: linear_tile<2, V>(x_r, in, pairs, next, bias, y_r, out); break;
      default: linear_tile<1, V>(x_r, in, pairs, next, bias, y_r, out);
    }
  }
}
#endif

// W (O, I) bf16 -> the same shape in `linear`'s blocks of 48 outputs, each (I/2, 48, 2) (the last one N % 48
// wide); empty where `linear` cannot take it: O % 16, I % 2, or no avx512_bf16.
torch::Tensor pack_weight(torch::Tensor weight) {
  const int64_t out = weight.size(0), in = weight.size(1), full = out / PAIR_BLOCK * PAIR_BLOCK;
#if defined(__AVX512BF16__)
  if (weight.scalar_type() == at::kBFloat16 && out % 16 == 0 && in % 2 == 0) {
    // each pair of inputs as one 32-bit element: packing is a transpose of 48 x (I/2) blocks (a 4-byte copy,
    // 3.7x faster than moving bf16 pairs as two elements)
    const at::Tensor pairs = weight.contiguous().view(at::kInt);  // (O, I/2)
    std::vector<at::Tensor> parts;
    if (full) parts.push_back(pairs.slice(0, 0, full).view({full / PAIR_BLOCK, PAIR_BLOCK, in / 2}).transpose(1, 2)
                                  .flatten());
    if (out > full) parts.push_back(pairs.slice(0, full).t().flatten());
    return torch::cat(parts).view(at::kBFloat16).view({out, in});
  }
#endif
  return weight.new_empty({0});
}

// x (N, I) bf16; packed (O, I) from pack_weight; bias (O,) bf16 or empty. Returns x W^T + b, (N, O) bf16.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16, "x: contiguous bfloat16 (N, I)");
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) == x.size(1), "packed: (O, I) from pack_weight, I = x.size(1)");
  const int64_t rows = x.size(0), in = x.size(1), out = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
#if defined(__AVX512BF16__)
  TORCH_CHECK(bias.numel() == 0 || bias.numel() == out, "bias: (O,) or empty");
  const BFloat16 *w_p = packed.data_ptr<BFloat16>(), *x_p = x.data_ptr<BFloat16>();
  const BFloat16* b_p = bias.numel() ? bias.data_ptr<BFloat16>() : nullptr;
  BFloat16* y_p = y.data_ptr<BFloat16>();
  const int64_t blocks = (out + PAIR_BLOCK - 1) / PAIR_BLOCK;
  if (rows) at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j) {
      const int64_t begin = j * PAIR_BLOCK, width = std::min(PAIR_BLOCK, out - begin);
      const BFloat16* pairs = w_p + begin * in;
      const BFloat16* next = j + 1 < last ? pairs + width * in : nullptr;
      const BFloat16* b = b_p ? b_p + begin : nullptr;
      if (width == 48) linear_block<3>(x_p, rows, in, pairs, next, b, y_p + begin, out);
      else if (width == 32) linear_block<2>(x_p, rows, in, pairs, next, b, y_p + begin, out);
      else linear_block<1>(x_p, rows, in, pairs, next, b, y_p + begin, out);
    }
  });
#else
  TORCH_CHECK(false, "linear needs avx512_bf16 (pack_weight returns an empty weight without it)");
#endif
  return y;
}

// Every layer of a Llama-style block for N tokens, one call from Python (at one row, ~240 Python calls per
// step cost more than the step's arithmetic besides the weight reads):
//   x = RMSNorm(h);  per layer: h += Attn(RoPE(x W_qkv^T)) W_o^T;  x = RMSNorm(h);  h += (silu(g) * u) W_down^T
//   for [g, u] = x W_gu^T;  x = RMSNorm(h) with the next layer's norm (the final norm after the last).
// hidden (N, C) float32, updated in place; layers[i] = {norm_in, W_qkv, b_qkv (or empty), W_o, norm_post, W_gu,
// W_down, norm_after}, each W from pack_weight; cache (2, layers, R, H_kv, S, D); prompt_kv (2, layers, P, H_kv,
// T, D) or empty. Returns x after the last layer's norm, (N, C) bf16.
at::Tensor run_layers(at::Tensor hidden, const std::vector<std::vector<at::Tensor>>& layers, at::Tensor cos,
                      at::Tensor sin, at::Tensor rows, at::Tensor slots, at::Tensor cache, at::Tensor cache_start,
                      at::Tensor prompt_kv, at::Tensor prompt_start, at::Tensor row_prompt, int64_t heads,
                      double scale, double eps) {
  const bool shared = prompt_kv.numel() > 0;
  const at::Tensor empty = cache.new_empty({0});
  at::Tensor x = add_rms_norm(hidden, std::nullopt, layers[0][0], eps);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& w = layers[i];
    const at::Tensor attended = attend(
        linear(x, w[1], w[2]), cos, sin, rows, slots, cache[0][i], cache[1][i], cache_start,
        shared ? prompt_kv[0][i] : empty, shared ? prompt_kv[1][i] : empty, prompt_start, row_prompt, heads, scale);
    x = add_rms_norm(hidden, linear(attended, w[3], empty), w[4], eps);
    x = add_rms_norm(hidden, linear(silu_mul(linear(x, w[5], empty)), w[6], empty), w[7], eps);
  }
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("attend", &attend);
  module.def("add_rms_norm", &add_rms_norm);
  module.def("silu_mul", &silu_mul);
  module.def("sample_next", &sample_next);
  module.def("run_layers", &run_layers);
  module.def("pack_weight", &pack_weight);
  module.def("linear", &linear);
  module.attr("NATIVE_BF16") = NATIVE_BF16;
}
