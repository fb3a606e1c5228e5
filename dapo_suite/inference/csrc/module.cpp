// `run_layers` (every layer of the block in one call from Python) and the module's Python bindings.
#include "kernels.h"

// Every layer of a Llama-style block for N tokens, one call from Python (at one row, ~240 Python calls per
// step cost more than the step's arithmetic besides the weight reads):
//   x = RMSNorm(h);  per layer: h += Attn(RoPE(x W_qkv^T + b_qkv)) W_o^T;  x = RMSNorm(h);
//   h += (silu(g) * u) W_down^T for [g, u] = x W_gu^T;  x = RMSNorm(h) with the next layer's norm (the final
//   norm after the last). Qwen3's q and k are RMSNorm-ed per head before RoPE (`qk_rms_norm`).
// hidden (N, C) float32, updated in place; layers[i] = {norm_in, W_qkv, b_qkv (or empty), W_o, norm_post,
// W_gu, W_down, norm_after, then the four W in oneDNN's layout (or empty: `linear`'s `onednn`), then the q/k
// norms' weight (H + H_kv, D) or empty (`qk_rms_norm`: Qwen3)}, each W from pack_weight (or its int8 / int4
// packers); cache (2, layers, R, H_kv, S, D); prompt_kv (2, layers, P, H_kv, T, D) or empty. The activations
// and the biases in the weights' dtype (float32 for int8 and int4 weights); the caches in it or in bf16
// (`attend`). Returns x after the last layer's norm, (N, C) in the activations' dtype.
at::Tensor run_layers(at::Tensor hidden, const std::vector<std::vector<at::Tensor>>& layers, at::Tensor cos,
                      at::Tensor sin, at::Tensor rows, at::Tensor slots, at::Tensor cache,
                      at::Tensor cache_start, at::Tensor prompt_kv, at::Tensor prompt_start,
                      at::Tensor row_prompt, int64_t heads, double scale, double eps) {
  const bool shared = prompt_kv.numel() > 0;
  const at::Tensor empty = cache.new_empty({0});
  const auto packed = layers[0][1].scalar_type();  // int8 (kChar) and int4 (kByte) take float32 activations
  const auto dtype = packed == at::kChar || packed == at::kByte ? at::kFloat : packed;
  at::Tensor x = add_rms_norm(hidden, std::nullopt, layers[0][0], eps, dtype);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& w = layers[i];
    const at::Tensor qkv = linear(x, w[1], w[2], w[8]);
    if (w[12].numel()) qk_rms_norm(qkv, w[12], eps);  // Qwen3: q and k normed per head before `attend`'s RoPE
    const at::Tensor attended = attend(qkv, cos, sin, rows, slots, cache[0][i], cache[1][i], cache_start,
                                       shared ? prompt_kv[0][i] : empty, shared ? prompt_kv[1][i] : empty,
                                       prompt_start, row_prompt, heads, scale);
    x = add_rms_norm(hidden, linear(attended, w[3], empty, w[9]), w[4], eps, dtype);
    x = add_rms_norm(hidden, linear(silu_mul(linear(x, w[5], empty, w[10])), w[6], empty, w[11]), w[7], eps,
                     dtype);
  }
  return x;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("attend", &attend);
  module.def("add_rms_norm", &add_rms_norm);
  module.def("silu_mul", &silu_mul);
  module.def("sample_next", &sample_next);
  module.def("run_layers", &run_layers);
  module.def("qk_rms_norm", &qk_rms_norm);
  module.def("pack_weight", &pack_weight);
  module.def("pack_weight_int8", &pack_weight_int8);
  module.def("pack_weight_int4", &pack_weight_int4);
  module.def("linear", &linear);
  module.def("linear_on_vectors", &linear_on_vectors);
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
  module.def("linear_on_tiles", &linear_on_tiles);
#endif
  module.attr("NATIVE_BF16") = NATIVE_BF16;
  module.attr("INT8_DOTS") = INT8_DOTS;  // int8 weights by integer dot products (avx512_vnni)
  module.attr("INT4_DOTS") = INT4_DOTS;  // int4 weights by integer dot products (avx512_vnni or AVX2)
  module.attr("FLOAT32_VECTORS") = F32_VECTOR_ISA;  // the float32 kernels' instruction set: avx512, avx2, ...
  module.attr("FLOAT32_LANES") = F32_LANES;         // floats per vector
  module.attr("FLOAT32_BLOCK") = F32_BLOCK;         // outputs per packed block of `linear`
  module.attr("TILE_MIN_ROWS") =
      TILE_MIN_ROWS;  // bf16 rows from which `linear` uses the AMX tiles (0: never)
  module.attr("ONEDNN_MIN_ROWS") = ONEDNN_MIN_ROWS;  // bf16 rows from which `linear` uses oneDNN (0: never)
}
