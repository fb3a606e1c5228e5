// The norms and the gated MLP's activation: `add_rms_norm`, `qk_rms_norm`, `silu_mul`.
#include "kernels.h"

// RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) of the residual stream after adding x (when given):
//   h += x;  y = w * h / sqrt(mean(h^2) + eps), stored as `dtype` (bf16: rounded once).   hidden (B, C)
//   float32, updated in place; x (B, C) in `dtype`.
torch::Tensor add_rms_norm(torch::Tensor hidden, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps, at::ScalarType dtype) {
  TORCH_CHECK(hidden.is_contiguous() && hidden.scalar_type() == at::kFloat, "hidden: contiguous float32");
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "add_rms_norm: dtype bfloat16 or float32");
  TORCH_CHECK(!delta || (delta->scalar_type() == dtype && delta->is_contiguous()),
              "delta: contiguous, of dtype");
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  auto out = torch::empty({rows, width}, hidden.options().dtype(dtype));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "add_rms_norm", [&] {
    float* h_p = hidden.data_ptr<float>();
    const scalar_t* x_p = delta ? delta->data_ptr<scalar_t>() : nullptr;
    const float* w_p = weight.data_ptr<float>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        float* h = h_p + b * width;
        if (x_p) {
          const scalar_t* x = x_p + b * width;
          for (int64_t i = 0; i < width; ++i) h[i] += float(x[i]);
        }
        float squares = 0.f;
        for (int64_t i = 0; i < width; ++i) squares += h[i] * h[i];
        const float inverse = 1.f / std::sqrt(squares / width + float(eps));
        scalar_t* y = out_p + b * width;
        for (int64_t i = 0; i < width; ++i) y[i] = scalar_t(w_p[i] * (h[i] * inverse));
      }
    });
  });
  return out;
}

// The gated MLP's activation (Shazeer 2020, arXiv 2002.05202): y = silu(g) * u, [g, u] = x (B, 2I), bf16 or
// float32 (computed in float32, stored in x's dtype).
torch::Tensor silu_mul(torch::Tensor x) {
  TORCH_CHECK(x.is_contiguous() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "x: contiguous bfloat16 or float32");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  auto out = torch::empty({rows, width}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "silu_mul", [&] {
    const scalar_t* x_p = x.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        const scalar_t *g = x_p + b * 2 * width, *u = g + width;
        scalar_t* y = out_p + b * width;
        for (int64_t i = 0; i < width; ++i) {
          const float gate = float(g[i]);
          y[i] = scalar_t(gate / (1.f + std::exp(-gate)) * float(u[i]));
        }
      }
    });
  });
  return out;
}

// Qwen3's RMSNorm of each query and key head before RoPE, in place: qkv (N, (H + 2 H_kv) D) bf16 or float32;
//   for each of the first H + H_kv heads j (queries, then keys), x_j = w[j] * x_j / sqrt(mean(x_j^2) + eps),
//   computed in float32; weight (H + H_kv, D) float32 (the q norm's weight on the query rows, the k norm's
//   after).
void qk_rms_norm(at::Tensor qkv, const at::Tensor& weight, double eps) {
  TORCH_CHECK(qkv.is_contiguous() && weight.is_contiguous() && weight.scalar_type() == at::kFloat,
              "qk_rms_norm: contiguous qkv, float32 weight");
  const int64_t heads = weight.size(0), dim = weight.size(1), width = qkv.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, qkv.scalar_type(), "qk_rms_norm", [&] {
    scalar_t* x_p = qkv.data_ptr<scalar_t>();
    const float* w_p = weight.data_ptr<float>();
    at::parallel_for(0, qkv.size(0) * heads, 16, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        scalar_t* x = x_p + (i / heads) * width + (i % heads) * dim;
        const float* w = w_p + (i % heads) * dim;
        float squares = 0.f;
        for (int64_t d = 0; d < dim; ++d) squares += float(x[d]) * float(x[d]);
        const float inverse = 1.f / std::sqrt(squares / dim + float(eps));
        for (int64_t d = 0; d < dim; ++d) x[d] = scalar_t(w[d] * (float(x[d]) * inverse));
      }
    });
  });
}
