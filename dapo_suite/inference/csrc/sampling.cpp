// `sample_next`: the next tokens from the logits, by temperature and nucleus (top-p) sampling.
#include "kernels.h"

// Next-token sampling from logits (B, V): temperature, then nucleus (top-p) sampling (Holtzman et al. 2019,
// arXiv 1904.09751), one uniform per row (`uniforms` (B,), from the caller's torch generator); greedy when
// temperature == 0. Returns the tokens (B,) int64, their log-probs under softmax(logits / T) (T = 1 when
// greedy), the distribution before top-p, which is what the trainer recomputes, and that distribution's
// entropy (B,): log Z - sum_i p_i (z_i - z_max), one more sum in the pass that computes Z. The nucleus: the
// most likely tokens, in descending order, whose mass before each is <= top_p. It is found among the tokens
// above a probability threshold (1e-4, lowered while the tokens above it hold less than top_p; they are a
// prefix of the descending order, so the nucleus lies inside them), sorted, not among the whole vocabulary.
template <typename T>
void sample_rows(const T* logits, int64_t rows, int64_t vocab, float temperature, float top_p,
                 const float* uniforms, int64_t* tokens, float* log_probs, float* entropies) {
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    std::vector<float> weights(vocab);  // e^(z - z_max), z = logits / T
    std::vector<std::pair<float, int64_t>> candidates;
    for (int64_t b = first; b < last; ++b) {
      const T* row = logits + b * vocab;
      float largest = float(row[0]);
      for (int64_t i = 1; i < vocab; ++i) largest = std::max(largest, float(row[i]));
      const float t = temperature > 0 ? temperature : 1.f, top = largest / t;
      float total = 0.f, weighted = 0.f;  // Z and sum_i e^(z_i - z_max) (z_i - z_max)
      for (int64_t i = 0; i < vocab; ++i) {
        const float shifted = float(row[i]) / t - top;
        weights[i] = std::exp(shifted);
        total += weights[i];
        weighted += weights[i] * shifted;
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
          if (mass > target && weights[i] > 0.f) {
            token = i;
            break;
          }
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
          if (mass > target) {
            token = candidates[k].second;
            break;
          }
        }
      }
      tokens[b] = token;
      log_probs[b] = std::log(weights[token]) - std::log(total);
      entropies[b] = std::log(total) - weighted / total;
    }
  });
}

std::vector<torch::Tensor> sample_next(torch::Tensor logits, double temperature, double top_p,
                                       torch::Tensor uniforms) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits: contiguous (rows, vocabulary)");
  TORCH_CHECK(uniforms.scalar_type() == at::kFloat && uniforms.numel() == logits.size(0),
              "uniforms: (rows,) float32");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  auto tokens = torch::empty({rows}, logits.options().dtype(at::kLong));
  auto log_probs = torch::empty({rows}, logits.options().dtype(at::kFloat));
  auto entropies = torch::empty({rows}, logits.options().dtype(at::kFloat));
  if (logits.scalar_type() == at::kBFloat16)
    sample_rows(logits.data_ptr<BFloat16>(), rows, vocab, float(temperature), float(top_p),
                uniforms.data_ptr<float>(), tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>(),
                entropies.data_ptr<float>());
  else {
    const auto values = logits.to(at::kFloat);
    sample_rows(values.data_ptr<float>(), rows, vocab, float(temperature), float(top_p),
                uniforms.data_ptr<float>(), tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>(),
                entropies.data_ptr<float>());
  }
  return {tokens, log_probs, entropies};
}
