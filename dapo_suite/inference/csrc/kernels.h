// The decode step's fused CPU kernels: what their sources share. One file per kernel family, built together
// into one module by torch.utils.cpp_extension (dapo_suite/inference/fused_step.py):
//   attention.cpp   `attend`: RoPE, the cache write and grouped-query attention, in bf16 and float32
//   linear.cpp      `pack_weight`, `linear`: the projections on bf16 pairs, float32 vectors or AMX tiles
//   norms.cpp       `add_rms_norm`, `qk_rms_norm`, `silu_mul`
//   sampling.cpp    `sample_next`: temperature and nucleus sampling
//   quantized.cpp   `linear` on int8 and int4 rollout weights by integer dot products (AVX-512 VNNI; int4
//   AVX2) module.cpp      `run_layers` (every layer in one call) and the Python bindings
//
// Fused pieces of one decode step of a Llama-style block, for dapo_suite.inference.decoding.LeanStepper on a
// CPU, in bfloat16 (CPUs with avx512_bf16) and in float32 (every CPU: GCC/Clang vector types, compiled for
// the CPU it runs on).
//
// Between its four projections, a decode step runs ~20 small tensor ops per layer (RoPE, cache writes,
// attention, residual adds, RMSNorm, casts, SiLU x up). Each costs a dispatch and a pass over memory, which
// at few rows outweighs its arithmetic. These kernels do the same arithmetic, reading each input once, in
// float32, and (in bf16) rounding to bfloat16 once where the result is stored; `run_layers` runs them with
// the projections for every layer in one call, and `sample_next` draws the next tokens:
//   attend          RoPE of q and k, the step's k and v written into the cache, grouped-query attention over
//   the
//                   row's valid cache positions only (left padding is skipped, not masked)
//   add_rms_norm    h += x;  y = w * h / sqrt(mean(h^2) + eps), stored in the sampling dtype
//   qk_rms_norm     Qwen3's RMSNorm of each query and key head, in place, before `attend`'s RoPE
//   silu_mul        y = silu(g) * u for [g, u] = x
//   linear          x W^T + b for any number of rows, W packed once in blocks of outputs (`pack_weight`):
//   bf16,
//                   each row tile an outer product of bf16 pairs (faster than oneDNN's linear at every row
//                   count), or on an AMX CPU, 8-64 rows on the tile unit over the same packed weight and more
//                   through oneDNN; float32, an outer product of float32 vectors (FMA), tiles sized to the
//                   CPU's vector registers; int8 weights (`pack_weight_int8`, rollout_quantization: int8),
//                   the float32 tile on weights widened as they are read, scaled per output at the end
// Built on first use by torch.utils.cpp_extension (dapo_suite/inference/fused_step.py);
// tests/inference/test_sampler.py checks each against the float32 reference.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

using at::BFloat16;

// ---- float32 vectors, on every CPU
// ----------------------------------------------------------------------------- GCC/Clang vector types of the
// widest float32 vectors the build's target has (-march=native: the CPU it runs on), which the compiler maps
// to AVX-512, AVX2 (+FMA) or 128-bit SSE/NEON instructions. `linear`'s tile is sized to the register file:
// ROWS x V accumulators, V weight vectors and a broadcast (AVX-512 and NEON have 32 registers: 8 x 3; AVX2
// has 16: 6 x 2, the shape of BLAS's AVX2 kernels).
#if defined(__AVX512F__)
constexpr int64_t F32_LANES = 16, F32_VECTORS = 3, F32_TILE_ROWS = 8, F32_REGISTERS = 32;
constexpr const char* F32_VECTOR_ISA = "avx512";
#elif defined(__AVX__)
constexpr int64_t F32_LANES = 8, F32_VECTORS = 2, F32_TILE_ROWS = 6, F32_REGISTERS = 16;
#if defined(__AVX2__) && defined(__FMA__)
constexpr const char* F32_VECTOR_ISA = "avx2";
#else
constexpr const char* F32_VECTOR_ISA = "avx";
#endif
#elif defined(__ARM_NEON)
constexpr int64_t F32_LANES = 4, F32_VECTORS = 3, F32_TILE_ROWS = 8, F32_REGISTERS = 32;
constexpr const char* F32_VECTOR_ISA = "neon";
#else
constexpr int64_t F32_LANES = 4, F32_VECTORS = 2, F32_TILE_ROWS = 6, F32_REGISTERS = 16;
constexpr const char* F32_VECTOR_ISA = "sse";
#endif
constexpr int64_t F32_BLOCK = F32_LANES * F32_VECTORS;  // the outputs of one packed block
typedef float Floats __attribute__((vector_size(F32_LANES * sizeof(float))));
// the same vector at any float's address (unaligned loads and stores)
typedef float UnalignedFloats
    __attribute__((vector_size(F32_LANES * sizeof(float)), aligned(alignof(float))));
// F32_LANES int8 at `p` (any address) as float32: sign-extend and convert, two instructions on AVX2 and
// AVX-512 (GCC's __builtin_convertvector of an int8 vector does it element by element, ~10x slower there).
inline Floats widen_int8(const int8_t* p) {
#if defined(__AVX512F__)
  return (Floats)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif defined(__AVX2__)
  return (Floats)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#else
  typedef int8_t Bytes __attribute__((vector_size(F32_LANES), aligned(1)));
  return __builtin_convertvector(*reinterpret_cast<const Bytes*>(p), Floats);
#endif
}

// ---- bf16
// ------------------------------------------------------------------------------------------------------ The
// attention kernels and `linear` use bf16 pair dot products (avx512_bf16: Cooper Lake, Sapphire Rapids, Zen 4
// and later). Built elsewhere, the module keeps the float32 kernels, the norms and the sampler, and
// NATIVE_BF16 is false: the stepper then decodes bf16 with torch's ops (the default sampling dtype there is
// float32 anyway, dapo_suite.inference.models.native_bf16).
#if defined(__AVX512BF16__)
constexpr bool NATIVE_BF16 = true;
#else
constexpr bool NATIVE_BF16 = false;
#endif

// Integer dot products: `linear` on quantized rollout weights (int8 per output channel, int4 per group of 32)
// multiplies them by activations quantized to int8 per group of 32 (quantized.cpp), where the widened float32
// tile makes a quarter of the multiply-adds per instruction. int8 needs avx512_vnni (Cascade Lake, Zen 4 and
// later; AVX2's byte products overflow on its range), int4 avx512_vnni or AVX2 with FMA and F16C (x86-64-v3).
// Built without them, int8 weights run the widened float32 tile and int4 weights torch's ops.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__F16C__)
#define INT8_DOTS_BUILT 1
#else
#define INT8_DOTS_BUILT 0
#endif
#if INT8_DOTS_BUILT || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define INTEGER_DOTS_BUILT 1
#else
#define INTEGER_DOTS_BUILT 0
#endif
constexpr bool INT8_DOTS = INT8_DOTS_BUILT, INT4_DOTS = INTEGER_DOTS_BUILT;

// On a CPU with AMX (Sapphire Rapids and later), `linear` runs 8-64 rows on the tile unit over the same
// packed weight (`tile_linear`), faster there than both oneDNN's AMX matmul and the pair products
// (benchmarks/projections.py; figures: docs/benchmarks.md, "Measurements behind code comments"). From 65 rows
// (the prompt pass's chunks) oneDNN's blocked matmul wins, on the weight reordered once into its layout when
// the caller keeps it
// (`onednn`, from mkldnn::_reorder_linear_weight; aten's linear on the weight as given would reorder it on
// every call). 0: no AMX in this build, never.
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
constexpr int64_t TILE_MIN_ROWS = 8, ONEDNN_MIN_ROWS = 65;
#else
constexpr int64_t TILE_MIN_ROWS = 0, ONEDNN_MIN_ROWS = 0;
#endif

namespace {

// Elements of T in one 64-byte cache line, the unit of a prefetch.
template <typename T>
constexpr int64_t PER_LINE = 64 / sizeof(T);

// The next block of weights, prefetched while `linear` runs this one, split into equal shares between the
// block's row tiles (`size` elements each), each share spread over its tile's steps (`per_step` lines a
// step): prefetching all of it during the first tile, a burst while the other tiles prefetch nothing, ran the
// float32 projections slower at 16-64 rows (figures: docs/benchmarks.md, "Measurements behind code
// comments"). One tile (up to 8 rows) prefetches the whole block, a block row's lines each step.
struct PrefetchShare {
  int64_t size, per_step;
};

template <typename T>
inline PrefetchShare prefetch_share(int64_t block, int64_t tiles, int64_t steps) {
  const int64_t size = (block + tiles - 1) / tiles;
  return {size, (size + steps * PER_LINE<T> - 1) / (steps * PER_LINE<T>)};
}

// Step `step`'s lines of a tile's share starting at `next` (null: nothing to prefetch). A prefetch past the
// share's end is harmless (it never faults), so the last step rounds up.
template <typename T>
inline void prefetch_step(const T* next, PrefetchShare share, int64_t step) {
  if (next && step * share.per_step * PER_LINE<T> < share.size)
    for (int64_t l = 0; l < share.per_step; ++l)
      __builtin_prefetch(next + (step * share.per_step + l) * PER_LINE<T>);
}

// How a lone row tile (1 row up to a tile's rows: it reads each block once, so the weight is one sequential
// stream) prefetches, by CPU vendor: `bytes` ahead in its own stream from `min_rows` rows (fewer: the
// hardware prefetchers alone), or (not named here) the whole next block: each vendor's choice is the one that
// measured fastest on its CPUs (docs/benchmarks.md; AMD's L1 is smaller than a whole next block).
struct StreamAhead {
  const char* vendor;  // what cpuid leaf 0 reports
  int64_t bytes, min_rows;
};
constexpr StreamAhead STREAM_AHEAD[] = {{"AuthenticAMD", 8192, 3}};

// This CPU's entry in STREAM_AHEAD, or null.
inline const StreamAhead* stream_ahead() {
  static const StreamAhead* const known = []() -> const StreamAhead* {
#if defined(__x86_64__) || defined(__i386__)
    unsigned level, b, c, d;
    char vendor[13] = {};
    if (__get_cpuid(0, &level, &b, &c, &d)) {
      std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &c, 4);
      for (const auto& entry : STREAM_AHEAD)
        if (std::strcmp(vendor, entry.vendor) == 0) return &entry;
    }
#endif
    return nullptr;
  }();
  return known;
}

// Every row tile of x through one block of `linear`'s packed weight, `tiles[r - 1]` taking r rows (up to
// TILE), the block kept in cache between tiles; the next block (`size` elements of W, `steps` steps per
// tile) prefetched in equal shares by all tiles, or, with one tile on a CPU in STREAM_AHEAD, its own stream
// (the blocks lie one after the other, so the stream runs on into the next block). W is x's type, or int8
// for weights quantized per channel (`pack_weight_int8`).
template <typename T, typename W, typename Tile, size_t TILE>
void each_row_tile(const Tile (&tiles)[TILE], const T* x, int64_t rows, int64_t in, const W* block,
                   const W* next, int64_t size, int64_t steps, const T* bias, T* y, int64_t out) {
  constexpr int64_t most = TILE;
  const auto share = prefetch_share<W>(size, (rows + most - 1) / most, steps);
  const StreamAhead* ahead = stream_ahead();
  if (next && rows <= most && ahead)
    next = rows < ahead->min_rows ? nullptr : block + ahead->bytes / int64_t(sizeof(W));
  for (int64_t r = 0, k = 0; r < rows; r += most, ++k)
    tiles[std::min(most, rows - r) - 1](x + r * in, in, block, next ? next + k * share.size : nullptr, share,
                                        bias, y + r * out, out);
}

// fn(begin, width, more) for each block of `block` outputs of `out` (the last one narrower), each thread
// taking a run of whole blocks; `more`: the thread's next block follows (what a block may prefetch).
template <typename Fn>
inline void each_block(int64_t out, int64_t block, Fn fn) {
  at::parallel_for(0, (out + block - 1) / block, 1, [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j) fn(j * block, std::min(block, out - j * block), j + 1 < last);
  });
}

}  // namespace

// The kernels one source calls in another (each documented where it is defined).
torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor rows,
                     torch::Tensor slots, torch::Tensor cache_k, torch::Tensor cache_v,
                     torch::Tensor cache_start, torch::Tensor prompt_k, torch::Tensor prompt_v,
                     torch::Tensor prompt_start, torch::Tensor row_prompt, int64_t heads, double scale);
torch::Tensor add_rms_norm(torch::Tensor hidden, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps, at::ScalarType dtype);
torch::Tensor silu_mul(torch::Tensor x);
void qk_rms_norm(at::Tensor qkv, const at::Tensor& weight, double eps);
std::vector<torch::Tensor> sample_next(torch::Tensor logits, double temperature, double top_p,
                                       torch::Tensor uniforms);
torch::Tensor pack_weight(torch::Tensor weight);
torch::Tensor pack_weight_int8(torch::Tensor q, torch::Tensor scales);
torch::Tensor pack_weight_int4(torch::Tensor q, torch::Tensor scales);
#if INT8_DOTS_BUILT
torch::Tensor pack_weight_dot_int8(const torch::Tensor& q, const torch::Tensor& scales);
#endif
#if INTEGER_DOTS_BUILT
torch::Tensor pack_weight_dot_int4(const torch::Tensor& q, const torch::Tensor& scales);
torch::Tensor product_on_integer_dots(const torch::Tensor& x, const torch::Tensor& packed,
                                      const torch::Tensor& bias, int bits);
#endif
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, torch::Tensor onednn);
torch::Tensor linear_on_vectors(torch::Tensor x, torch::Tensor packed, torch::Tensor bias);
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
torch::Tensor linear_on_tiles(torch::Tensor x, torch::Tensor packed, torch::Tensor bias);
#endif
