// Fused pieces of one decode step of a Llama-style block, for dapo_suite.inference.decoding.LeanStepper on a CPU,
// in bfloat16 (CPUs with avx512_bf16) and in float32 (every CPU: GCC/Clang vector types, compiled for the CPU it
// runs on).
//
// Between its four projections, a decode step runs ~20 small tensor ops per layer (RoPE, cache writes, attention,
// residual adds, RMSNorm, casts, SiLU x up). Each costs a dispatch and a pass over memory, which at few rows
// outweighs its arithmetic. These kernels do the same arithmetic, reading each input once, in float32,
// and (in bf16) rounding to bfloat16 once where the result is stored; `run_layers` runs them with the projections
// for every layer in one call, and `sample_next` draws the next tokens:
//   attend          RoPE of q and k, the step's k and v written into the cache, grouped-query attention over the
//                   row's valid cache positions only (left padding is skipped, not masked)
//   add_rms_norm    h += x;  y = w * h / sqrt(mean(h^2) + eps), stored in the sampling dtype
//   qk_rms_norm     Qwen3's RMSNorm of each query and key head, in place, before `attend`'s RoPE
//   silu_mul        y = silu(g) * u for [g, u] = x
//   linear          x W^T + b for any number of rows, W packed once in blocks of outputs (`pack_weight`): bf16,
//                   each row tile an outer product of bf16 pairs (faster than oneDNN's linear at every row count), or
//                   on an AMX CPU, 8-64 rows on the tile unit over the same packed weight and more through oneDNN;
//                   float32, an outer product of float32 vectors (FMA), tiles sized to the CPU's vector registers
// Built on first use by torch.utils.cpp_extension (dapo_suite/inference/fused_step.py); tests/inference/test_sampler.py
// checks each against the float32 reference.
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
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

using at::BFloat16;

namespace {

// Elements of T in one 64-byte cache line, the unit of a prefetch.
template <typename T>
constexpr int64_t PER_LINE = 64 / sizeof(T);

// The next block of weights, prefetched while `linear` runs this one, split into equal shares between the block's
// row tiles (`size` elements each), each share spread over its tile's steps (`per_step` lines a step): prefetching
// all of it during the first tile, a burst while the other tiles prefetch nothing, ran the float32 projections
// slower at 16-64 rows (figures: docs/benchmarks.md, "Measurements behind code comments").
// One tile (up to 8 rows) prefetches the whole block, a block row's lines each step.
struct PrefetchShare {
  int64_t size, per_step;
};

template <typename T>
inline PrefetchShare prefetch_share(int64_t block, int64_t tiles, int64_t steps) {
  const int64_t size = (block + tiles - 1) / tiles;
  return {size, (size + steps * PER_LINE<T> - 1) / (steps * PER_LINE<T>)};
}

// Step `step`'s lines of a tile's share starting at `next` (null: nothing to prefetch). A prefetch past the share's
// end is harmless (it never faults), so the last step rounds up.
template <typename T>
inline void prefetch_step(const T* next, PrefetchShare share, int64_t step) {
  if (next && step * share.per_step * PER_LINE<T> < share.size)
    for (int64_t l = 0; l < share.per_step; ++l) __builtin_prefetch(next + (step * share.per_step + l) * PER_LINE<T>);
}

// How a lone row tile (1 row up to a tile's rows: it reads each block once, so the weight is one sequential stream)
// prefetches, by CPU vendor: `bytes` ahead in its own stream from `min_rows` rows (fewer: the hardware prefetchers
// alone), or (not named here) the whole next block: each vendor's choice is the one that measured fastest on its
// CPUs (docs/benchmarks.md; AMD's L1 is smaller than a whole next block).
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

// Every row tile of x through one block of `linear`'s packed weight, `tiles[r - 1]` taking r rows (up to TILE), the
// block kept in cache between tiles; the next block (`size` elements, `steps` steps per tile) prefetched in equal
// shares by all tiles, or, with one tile on a CPU in STREAM_AHEAD, its own stream (the blocks lie one after the
// other, so the stream runs on into the next block).
template <typename T, typename Tile, size_t TILE>
void each_row_tile(const Tile (&tiles)[TILE], const T* x, int64_t rows, int64_t in, const T* block, const T* next,
                   int64_t size, int64_t steps, const T* bias, T* y, int64_t out) {
  constexpr int64_t most = TILE;
  const auto share = prefetch_share<T>(size, (rows + most - 1) / most, steps);
  const StreamAhead* ahead = stream_ahead();
  if (next && rows <= most && ahead)
    next = rows < ahead->min_rows ? nullptr : block + ahead->bytes / int64_t(sizeof(T));
  for (int64_t r = 0, k = 0; r < rows; r += most, ++k)
    tiles[std::min(most, rows - r) - 1](x + r * in, in, block, next ? next + k * share.size : nullptr, share, bias,
                                        y + r * out, out);
}

// Rotary position embedding (Su et al. 2021, arXiv 2104.09864), "rotate half" layout:
//   y[i] = x[i] cos[i] - x[i + D/2] sin[i],  y[i + D/2] = x[i + D/2] cos[i + D/2] + x[i] sin[i + D/2].
template <typename T>
inline void rotate(const T* x, const float* cos, const float* sin, int64_t dim, float* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    out[i] = float(x[i]) * cos[i] - float(x[i + half]) * sin[i];
    out[i + half] = float(x[i + half]) * cos[i + half] + float(x[i]) * sin[i + half];
  }
}

// The softmax's numerators in place, e^(s - max s) over scores[0, count), kept unnormalised; returns their total
// (the weighted sums are divided by it at the end).
inline float exp_minus_max(float* scores, int64_t count) {
  float top = scores[0];
  for (int64_t t = 1; t < count; ++t) top = std::max(top, scores[t]);  // vectorised, unlike std::max_element
  float total = 0.f;
  for (int64_t t = 0; t < count; ++t) {  // vectorised (libmvec's exp, -ffast-math)
    scores[t] = std::exp(scores[t] - top);
    total += scores[t];
  }
  return total;
}

}  // namespace

// The tensors of one `attend` call, as pointers and sizes (see `attend`).
template <typename T>
struct Queries {
  const T* qkv;
  const float *cos, *sin;
  const int64_t *rows, *slots;
  T *cache_k, *cache_v;
  const int64_t* cache_start;
  const T *prompt_k, *prompt_v;
  const int64_t *prompt_start, *row_prompt;
  T* out;
  int64_t count, heads, kv_heads, cache_slots, prompts, prompt_len;
  float scale;
};

// Query n's key and value for head h, rotated and stored at its cache row and slot.
template <int64_t DIM, typename T>
void store_key_value(const Queries<T>& qs, int64_t n, int64_t h) {
  const T* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  float k[DIM];
  rotate(row + (qs.heads + h) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, k);
  const int64_t at = ((qs.rows[n] * qs.kv_heads + h) * qs.cache_slots + qs.slots[n]) * DIM;
  const T* v = row + (qs.heads + qs.kv_heads + h) * DIM;
  for (int64_t d = 0; d < DIM; ++d) {
    qs.cache_k[at + d] = T(k[d]);
    qs.cache_v[at + d] = v[d];
  }
}

// Every query's key and value written first (a prompt's queries, in a prefill, attend to each other's), then each
// (query, key/value head) pair through `head(n, h)`; `make_head(span)` gives each thread its own, with scratch for
// `span` scores per query head.
template <int64_t DIM, typename T, typename MakeHead>
void attend_all(const Queries<T>& qs, MakeHead make_head) {
  const int64_t pairs = qs.count * qs.kv_heads;
  at::parallel_for(0, pairs, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) store_key_value<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads);
  });
  const int64_t span = qs.prompt_len + *std::max_element(qs.slots, qs.slots + qs.count) + 1;
  // Pairs are handed out one at a time (their lengths differ: left padding, and a prompt's later tokens see more
  // keys), not in fixed halves, where one thread would wait on the other.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pairs);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    auto head = make_head(span);
    for (int64_t i = next++; i < pairs; i = next++) head(i / qs.kv_heads, i % qs.kv_heads);
  });
}

// ---- float32 vectors, on every CPU -----------------------------------------------------------------------------
// GCC/Clang vector types of the widest float32 vectors the build's target has (-march=native: the CPU it runs
// on), which the compiler maps to AVX-512, AVX2 (+FMA) or 128-bit SSE/NEON instructions. `linear`'s tile is sized
// to the register file: ROWS x V accumulators, V weight vectors and a broadcast (AVX-512 and NEON have 32
// registers: 8 x 3; AVX2 has 16: 6 x 2, the shape of BLAS's AVX2 kernels).
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
typedef float UnalignedFloats __attribute__((vector_size(F32_LANES * sizeof(float)), aligned(alignof(float))));

namespace {

// Two-source shuffles of float32 vectors with constant lane indices (GCC 12+ and Clang: __builtin_shufflevector;
// older GCC: __builtin_shuffle with a constant mask), which the compiler maps to the target's permutes.
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE_FLOATS(u, v, ...) __builtin_shufflevector(u, v, __VA_ARGS__)
#else
typedef int32_t LaneIndices __attribute__((vector_size(F32_LANES * sizeof(int32_t))));
#define SHUFFLE_FLOATS(u, v, ...) __builtin_shuffle(u, v, (LaneIndices){__VA_ARGS__})
#endif

// Lane i of a halving shuffle of u and v, vectors of blocks of `width` lanes (each block a partial sum of one
// source): the result holds u's blocks then v's at half the width, the first (`high` false) or second half of each.
constexpr int half_lane(int64_t width, bool high, int64_t i) {
  const int64_t half = width / 2, block = i / half, blocks = F32_LANES / width;
  const int64_t from = block < blocks ? block * width : F32_LANES + (block - blocks) * width;
  return int(from + (high ? half : 0) + i % half);
}

template <int64_t WIDTH, size_t... I>
inline Floats add_halves(Floats u, Floats v, std::index_sequence<I...>) {
  return SHUFFLE_FLOATS(u, v, half_lane(WIDTH, false, I)...) + SHUFFLE_FLOATS(u, v, half_lane(WIDTH, true, I)...);
}

// The totals of F32_LANES vectors as one vector (lane j: the sum of a[j]'s lanes; a[] is overwritten): rounds that
// pair the vectors and add the halves of their blocks, ~3 instructions per vector where a horizontal sum of each
// takes ~2 log2(lanes). Lanes are added in a horizontal sum's order (halves, then quarters, ...), so the totals
// are bit for bit those of one dot product at a time.
template <int64_t WIDTH = F32_LANES>
inline Floats sum_each(Floats* a) {
  for (int64_t j = 0; j < WIDTH / 2; ++j)
    a[j] = add_halves<WIDTH>(a[2 * j], a[2 * j + 1], std::make_index_sequence<F32_LANES>());
  if constexpr (WIDTH > 2) return sum_each<WIDTH / 2>(a);
  else return a[0];
}

inline Floats load_floats(const float* at) { return *reinterpret_cast<const UnalignedFloats*>(at); }

// How many query heads' weighted sums the attention keeps in registers at once: three quarters of the register file
// (DIM / F32_LANES vectors per head, in float32 and in bf16's unpacked pairs alike).
template <int64_t DIM>
constexpr int HEADS_IN_REGISTERS = int(std::max<int64_t>(1, F32_REGISTERS * 3 / 4 / (DIM / F32_LANES)));

// The weighted sums of all `fold` query heads, sizeof...(F) at a time through Span<DIM, k>::run (k heads; each group
// re-reads the values, from cache after the first). weights (fold x stride), sums (fold x DIM).
template <int64_t DIM, template <int64_t, int> class Span, typename T, int... F>
void accumulate_heads(const T* weights, int64_t fold, int64_t stride, const T* values, int64_t begin, int64_t end,
                      float* sums, std::integer_sequence<int, F...>) {
  using Run = void (*)(const T*, int64_t, const T*, int64_t, int64_t, float*);
  static constexpr Run spans[] = {Span<DIM, F + 1>::run...};  // spans[k - 1]: k heads
  constexpr int64_t most = sizeof...(F);
  for (int64_t f = 0; f < fold; f += most)
    spans[std::min(most, fold - f) - 1](weights + f * stride, stride, values, begin, end, sums + f * DIM);
}

}  // namespace

// ---- bf16 ------------------------------------------------------------------------------------------------------
// The attention kernels and `linear` use bf16 pair dot products (avx512_bf16: Cooper Lake, Sapphire Rapids, Zen 4
// and later). Built elsewhere, the module keeps the float32 kernels, the norms and the sampler, and NATIVE_BF16 is
// false: the stepper then decodes bf16 with torch's ops (the default sampling dtype there is float32 anyway,
// dapo_suite.inference.models.native_bf16).
#if defined(__AVX512BF16__)
constexpr bool NATIVE_BF16 = true;
static_assert(F32_LANES == 16, "avx512_bf16 implies AVX-512F: `sum_each` totals 16 vectors of 16 floats");

namespace {

// Scores of `fold` queries (fold x DIM, bf16) against positions [begin, end) of one head's keys (T x DIM, bf16),
// scale (q . k) written to scores[f * stride + t - begin]: bf16 pair products summed in float32 (avx512_bf16),
// sixteen positions at a time. The same positions' values are prefetched meanwhile: the cache streams from
// memory, and two threads reading one stream each wait on memory (well below a copy's bandwidth); with the values
// in flight beside the keys, the weighted sum that follows reads them from cache.
template <int64_t DIM>
void score_span_bf16(const BFloat16* q, int64_t fold, const BFloat16* keys, const BFloat16* values,
                     int64_t begin, int64_t end, float scale, float* scores, int64_t stride) {
  constexpr int64_t chunks = DIM / 32, line = PER_LINE<BFloat16>;  // 32 bf16 per vector and per cache line
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
      Floats dots[16];
      for (int j = 0; j < 16; ++j) {
        dots[j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c)
          dots[j] = _mm512_dpbf16_ps(dots[j], (__m512bh)_mm512_loadu_si512(keys + (t + j) * DIM + 32 * c), qs[c]);
      }
      _mm512_storeu_ps(scores + f * stride + t - begin, _mm512_mul_ps(sum_each(dots), scales));
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

// sums[f] += sum_t w[f][t - begin] v[t] over positions [begin, end) for F query heads, whose sums stay in vector
// registers while the values stream by; two positions per bf16 pair product: the two values interleaved (unpack),
// the two weights one 32-bit pair. weights (F x stride) bf16; sums (F x DIM) float32 in the unpack's order: block
// 8k + i of 32 dims sits at lane 4k + i (i < 4) of its low vector, 8k + 4 + i at lane 4k + i of its high one
// (`attend_head_bf16` puts it back in order).
template <int64_t DIM, int F>
struct AccumulateSpanBF16 {
  static void run(const BFloat16* weights, int64_t stride, const BFloat16* values, int64_t begin, int64_t end,
                  float* sums) {
    constexpr int64_t chunks = DIM / 32;
    __m512 acc[F][2 * chunks];
    for (int f = 0; f < F; ++f)
      for (int64_t c = 0; c < 2 * chunks; ++c) acc[f][c] = _mm512_loadu_ps(sums + f * DIM + 16 * c);
    auto add = [&](int64_t t, auto pair) {  // positions t, t + 1; an odd last one pairs with itself at weight zero
      __m512i low[chunks], high[chunks];
      for (int64_t c = 0; c < chunks; ++c) {
        const __m512i a = _mm512_loadu_si512(values + t * DIM + 32 * c);
        const __m512i b = pair ? _mm512_loadu_si512(values + (t + 1) * DIM + 32 * c) : a;
        low[c] = _mm512_unpacklo_epi16(a, b), high[c] = _mm512_unpackhi_epi16(a, b);
      }
      for (int f = 0; f < F; ++f) {
        const BFloat16* w = weights + f * stride + t - begin;
        const uint32_t bits = uint32_t(w[0].x) | (pair ? uint32_t(w[1].x) << 16 : 0u);
        const __m512bh ws = (__m512bh)_mm512_set1_epi32(int32_t(bits));
        for (int64_t c = 0; c < chunks; ++c) {
          acc[f][2 * c] = _mm512_dpbf16_ps(acc[f][2 * c], (__m512bh)low[c], ws);
          acc[f][2 * c + 1] = _mm512_dpbf16_ps(acc[f][2 * c + 1], (__m512bh)high[c], ws);
        }
      }
    };
    int64_t t = begin;
    for (; t + 1 < end; t += 2) add(t, std::true_type());
    if (t < end) add(t, std::false_type());
    for (int f = 0; f < F; ++f)
      for (int64_t c = 0; c < 2 * chunks; ++c) _mm512_storeu_ps(sums + f * DIM + 16 * c, acc[f][c]);
  }
};

}  // namespace

// Query n's `fold` query heads of key/value head h attend to its row's valid positions: the shared prompt's
// [prompt_start, T) when there is one, then the row's own [cache_start, slot]. The query is rounded to bf16 after
// RoPE and the softmax weights before the weighted sum, as the trainer's bf16 attention (autocast SDPA) does;
// scores, the softmax and the sums are float32, and the sums are divided by the softmax's total at the end.
template <int64_t DIM>
void attend_head_bf16(const Queries<BFloat16>& qs, int64_t n, int64_t h, float* q, BFloat16* q_bf16,
                      float* scores, BFloat16* weights, int64_t span) {
  constexpr int64_t chunks = DIM / 32;
  const int64_t fold = qs.heads / qs.kv_heads, b = qs.rows[n], slot = qs.slots[n];
  const BFloat16* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    rotate(row + (h * fold + f) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, q + f * DIM);
  for (int64_t i = 0; i < fold * DIM; i += 16)  // rounded to nearest even, as BFloat16(float)
    _mm256_storeu_si256((__m256i*)(q_bf16 + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(q + i)));
  int64_t shared = 0, p_begin = 0;
  const BFloat16 *pk = nullptr, *pv = nullptr;
  if (qs.prompts) {
    const int64_t p = qs.row_prompt[b], base = (p * qs.kv_heads + h) * qs.prompt_len * DIM;
    pk = qs.prompt_k + base, pv = qs.prompt_v + base, p_begin = qs.prompt_start[p];
    shared = qs.prompt_len - p_begin;
    score_span_bf16<DIM>(q_bf16, fold, pk, pv, p_begin, qs.prompt_len, qs.scale, scores, span);
  }
  const int64_t cache = (b * qs.kv_heads + h) * qs.cache_slots * DIM, o_begin = qs.cache_start[b];
  const int64_t count = shared + slot + 1 - o_begin;
  score_span_bf16<DIM>(q_bf16, fold, qs.cache_k + cache, qs.cache_v + cache, o_begin, slot + 1, qs.scale,
                  scores + shared, span);
  float totals[16];  // fold <= 16 (checked by `attend`)
  for (int64_t f = 0; f < fold; ++f) {  // e^(s - max), kept unnormalised, rounded to bf16
    float* row_scores = scores + f * span;
    totals[f] = exp_minus_max(row_scores, count);
    int64_t t = 0;
    for (; t + 16 <= count; t += 16)
      _mm256_storeu_si256((__m256i*)(weights + f * span + t),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row_scores + t)));
    for (; t < count; ++t) weights[f * span + t] = BFloat16(row_scores[t]);
  }
  float sums[16 * DIM];
  std::fill(sums, sums + fold * DIM, 0.f);
  const auto groups = std::make_integer_sequence<int, HEADS_IN_REGISTERS<DIM>>();
  if (qs.prompts)
    accumulate_heads<DIM, AccumulateSpanBF16>(weights, fold, span, pv, p_begin, qs.prompt_len, sums, groups);
  accumulate_heads<DIM, AccumulateSpanBF16>(weights + shared, fold, span, qs.cache_v + cache, o_begin, slot + 1,
                                            sums, groups);
  BFloat16* out = qs.out + (n * qs.heads + h * fold) * DIM;
  // lanes of (low, high) (0-15 and 16-31) in dimension order: dim 8k + i is lane 4k + i of low, 8k + 4 + i of high
  const __m512i in_order[2] = {_mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
                               _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31)};
  for (int64_t f = 0; f < fold; ++f) {
    const __m512 scales = _mm512_set1_ps(1.f / totals[f]);
    for (int64_t c = 0; c < chunks; ++c) {
      const float *low = sums + f * DIM + 32 * c, *high = low + 16;
      BFloat16* o = out + f * DIM + 32 * c;
      for (int half = 0; half < 2; ++half) {  // dims 16 half + [0, 16): blocks of 4 from low, high, low, high
        const __m512 dims = _mm512_permutex2var_ps(_mm512_loadu_ps(low), in_order[half], _mm512_loadu_ps(high));
        _mm256_storeu_si256((__m256i*)(o + 16 * half), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(dims, scales)));
      }
    }
  }
}

#else
constexpr bool NATIVE_BF16 = false;
#endif

// ---- float32 kernels, on every CPU -----------------------------------------------------------------------------
namespace {

// Scores of `fold` query heads (fold x DIM) against positions [begin, end) of one head's keys (T x DIM), scale (q .
// k) written to scores[f * stride + t - begin]: F32_LANES positions at a time, each a vector of partial products,
// totalled together by `sum_each` (faster than one position at a time from L2; from memory both run at one
// core's read bandwidth). The next
// block's keys and this block's values (read next, by the weighted sum) are prefetched meanwhile.
template <int64_t DIM>
void score_span_f32(const float* q, int64_t fold, const float* keys, const float* values, int64_t begin,
                    int64_t end, float scale, float* scores, int64_t stride) {
  constexpr int64_t V = DIM / F32_LANES, line = PER_LINE<float>;
  int64_t t = begin;
  for (; t + F32_LANES <= end; t += F32_LANES) {
    for (int64_t d = 0; d < F32_LANES * DIM; d += line) {
      __builtin_prefetch(keys + (t + F32_LANES) * DIM + d);
      __builtin_prefetch(values + t * DIM + d);
    }
    for (int64_t f = 0; f < fold; ++f) {
      Floats qv[V], dots[F32_LANES];
      for (int64_t c = 0; c < V; ++c) qv[c] = load_floats(q + f * DIM + c * F32_LANES);
      for (int64_t j = 0; j < F32_LANES; ++j) {
        const float* k = keys + (t + j) * DIM;
        dots[j] = qv[0] * load_floats(k);
        for (int64_t c = 1; c < V; ++c) dots[j] += qv[c] * load_floats(k + c * F32_LANES);
      }
      *reinterpret_cast<UnalignedFloats*>(scores + f * stride + t - begin) = sum_each(dots) * scale;
    }
  }
  for (; t < end; ++t)
    for (int64_t f = 0; f < fold; ++f) {
      float dot = 0.f;
      for (int64_t d = 0; d < DIM; ++d) dot += q[f * DIM + d] * keys[t * DIM + d];  // vectorised (-ffast-math)
      scores[f * stride + t - begin] = dot * scale;
    }
}

// sums[f] += sum_t w[f][t - begin] v[t] over positions [begin, end) for F query heads, whose F x DIM sums stay in
// vector registers while the values stream by. weights (F x stride), sums (F x DIM).
template <int64_t DIM, int F>
struct AccumulateSpanF32 {
  static void run(const float* weights, int64_t stride, const float* values, int64_t begin, int64_t end,
                  float* sums) {
    constexpr int64_t V = DIM / F32_LANES;
    Floats acc[F][V];
    for (int f = 0; f < F; ++f)
      for (int64_t c = 0; c < V; ++c) acc[f][c] = load_floats(sums + f * DIM + c * F32_LANES);
    for (int64_t t = begin; t < end; ++t) {
      const float* v = values + t * DIM;
      for (int f = 0; f < F; ++f) {
        const float w = weights[f * stride + t - begin];
        for (int64_t c = 0; c < V; ++c) acc[f][c] += load_floats(v + c * F32_LANES) * w;
      }
    }
    for (int f = 0; f < F; ++f)
      for (int64_t c = 0; c < V; ++c) *reinterpret_cast<UnalignedFloats*>(sums + f * DIM + c * F32_LANES) = acc[f][c];
  }
};

// Query n's `fold` query heads of key/value head h attend to its row's valid positions (the shared prompt's
// [prompt_start, T) when there is one, then the row's own [cache_start, slot]), all in float32: scores, e^(s -
// max) kept unnormalised, the weighted sum of the values, divided by the softmax's total at the end. Each key is
// read once for the fold's query heads (decode attention is bound by reading the cache).
template <int64_t DIM>
void attend_head_f32(const Queries<float>& qs, int64_t n, int64_t h, float* q, float* scores, float* sums,
                     int64_t span) {
  const int64_t fold = qs.heads / qs.kv_heads, b = qs.rows[n], slot = qs.slots[n];
  const float* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    rotate(row + (h * fold + f) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, q + f * DIM);
  int64_t shared = 0, p_begin = 0;
  const float *pk = nullptr, *pv = nullptr;
  if (qs.prompts) {
    const int64_t p = qs.row_prompt[b], base = (p * qs.kv_heads + h) * qs.prompt_len * DIM;
    pk = qs.prompt_k + base, pv = qs.prompt_v + base, p_begin = qs.prompt_start[p];
    shared = qs.prompt_len - p_begin;
    score_span_f32<DIM>(q, fold, pk, pv, p_begin, qs.prompt_len, qs.scale, scores, span);
  }
  const int64_t cache = (b * qs.kv_heads + h) * qs.cache_slots * DIM, o_begin = qs.cache_start[b];
  const int64_t count = shared + slot + 1 - o_begin;
  score_span_f32<DIM>(q, fold, qs.cache_k + cache, qs.cache_v + cache, o_begin, slot + 1, qs.scale, scores + shared,
                      span);
  float totals[16];  // fold <= 16 (checked by `attend`)
  for (int64_t f = 0; f < fold; ++f) totals[f] = exp_minus_max(scores + f * span, count);
  std::fill(sums, sums + fold * DIM, 0.f);
  const auto groups = std::make_integer_sequence<int, HEADS_IN_REGISTERS<DIM>>();
  if (qs.prompts)
    accumulate_heads<DIM, AccumulateSpanF32>(scores, fold, span, pv, p_begin, qs.prompt_len, sums, groups);
  accumulate_heads<DIM, AccumulateSpanF32>(scores + shared, fold, span, qs.cache_v + cache, o_begin, slot + 1, sums,
                                           groups);
  float* out = qs.out + (n * qs.heads + h * fold) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    for (int64_t d = 0; d < DIM; ++d) out[f * DIM + d] = sums[f * DIM + d] / totals[f];
}

// ROWS rows of x (stride `in`) against one block of V vectors of outputs (`block`: (in, V F32_LANES)); y points
// at the block's first output of row 0 (stride `out`). Per input: V weight loads, ROWS broadcasts, ROWS x V fused
// multiply-adds (an outer product; no horizontal sums). `next`: this tile's share of the next block to prefetch
// meanwhile, or null.
template <int ROWS, int V>
void linear_tile_f32(const float* x, int64_t in, const float* block, const float* next, PrefetchShare share,
                     const float* bias, float* y, int64_t out) {
  Floats acc[ROWS][V] = {};
  for (int64_t i = 0; i < in; ++i) {
    const float* w = block + i * V * F32_LANES;
    prefetch_step(next, share, i);
    Floats ws[V];
    for (int v = 0; v < V; ++v) ws[v] = *reinterpret_cast<const UnalignedFloats*>(w + v * F32_LANES);
    for (int r = 0; r < ROWS; ++r) {
      const float xs = x[r * in + i];
      for (int v = 0; v < V; ++v) acc[r][v] += ws[v] * xs;
    }
  }
  for (int v = 0; v < V; ++v) {
    Floats b = {};
    if (bias) b = *reinterpret_cast<const UnalignedFloats*>(bias + v * F32_LANES);
    for (int r = 0; r < ROWS; ++r) *reinterpret_cast<UnalignedFloats*>(y + r * out + v * F32_LANES) = acc[r][v] + b;
  }
}

// Every tile of x through one block of V vectors of outputs (`each_row_tile`).
template <int V, int... ROWS>
void linear_block_f32(const float* x, int64_t rows, int64_t in, const float* block, const float* next,
                      const float* bias, float* y, int64_t out, std::integer_sequence<int, ROWS...>) {
  using Tile = void (*)(const float*, int64_t, const float*, const float*, PrefetchShare, const float*, float*,
                        int64_t);
  static constexpr Tile tiles[] = {linear_tile_f32<ROWS + 1, V>...};  // tiles[r - 1]: r rows
  each_row_tile(tiles, x, rows, in, block, next, in * V * F32_LANES, in, bias, y, out);
}

}  // namespace

// Grouped-query softmax attention (Vaswani et al. 2017, arXiv 1706.03762) of N queries, with RoPE and the cache
// write: out = softmax(scale RoPE(q) K^T) V over each query's valid positions.
//   qkv (N, (H + 2 H_kv) D), the queries' projections, bf16 or float32 (the cache's dtype); cos, sin (N, D)
//   float32 at their positions;
//   rows, slots (N,): each query's cache row and slot. Its rotated k and v are written there, and it attends to
//   its row's [cache_start[row], slot] (left padding is skipped, not masked). A decode step has one query per
//   row; a prompt pass has one per prompt token, which see each other's keys (they are all written first).
//   cache_k, cache_v (R, H_kv, S, D).
//   prompt_k, prompt_v (P, H_kv, T, D) and prompt_start (P,): a prompt cache shared by the rows of a group
//   (row r reads prompt row_prompt[r], positions [prompt_start, T), before its own); empty when rows hold their
//   prompts.
// Returns (N, H D) in qkv's dtype, heads in q's order. bf16 needs avx512_bf16 (NATIVE_BF16).
torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor rows, torch::Tensor slots,
                     torch::Tensor cache_k, torch::Tensor cache_v, torch::Tensor cache_start, torch::Tensor prompt_k,
                     torch::Tensor prompt_v, torch::Tensor prompt_start, torch::Tensor row_prompt, int64_t heads,
                     double scale) {
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && qkv.is_contiguous(),
              "qkv: contiguous bfloat16 or float32");
  TORCH_CHECK(cache_k.scalar_type() == dtype && cache_v.scalar_type() == dtype, "cache: qkv's dtype");
  TORCH_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous(), "cache: contiguous");
  TORCH_CHECK(rows.numel() == qkv.size(0) && slots.numel() == qkv.size(0), "rows, slots: one per query");
  const int64_t dim = cache_k.size(3), prompts = prompt_k.numel() ? prompt_k.size(0) : 0;
  TORCH_CHECK(dim == 64 || dim == 128, "attend: head dim ", dim, " (compiled for 64 and 128)");
  TORCH_CHECK(heads % cache_k.size(1) == 0 && heads / cache_k.size(1) <= 16, "attend: at most 16 query heads per "
              "key/value head");
  auto out = torch::empty({qkv.size(0), heads * dim}, qkv.options());
  if (qkv.size(0) == 0) return out;
  const int64_t fold = heads / cache_k.size(1);
  auto run = [&](auto element, auto make_head) {
    using T = decltype(element);
    Queries<T> qs{qkv.data_ptr<T>(), cos.data_ptr<float>(), sin.data_ptr<float>(), rows.data_ptr<int64_t>(),
                  slots.data_ptr<int64_t>(), cache_k.data_ptr<T>(), cache_v.data_ptr<T>(),
                  cache_start.data_ptr<int64_t>(), prompts ? prompt_k.data_ptr<T>() : nullptr,
                  prompts ? prompt_v.data_ptr<T>() : nullptr, prompts ? prompt_start.data_ptr<int64_t>() : nullptr,
                  prompts ? row_prompt.data_ptr<int64_t>() : nullptr, out.data_ptr<T>(), qkv.size(0), heads,
                  cache_k.size(1), cache_k.size(2), prompts, prompts ? prompt_k.size(2) : 0, float(scale)};
    if (dim == 64) attend_all<64>(qs, make_head(qs, std::integral_constant<int64_t, 64>()));
    else attend_all<128>(qs, make_head(qs, std::integral_constant<int64_t, 128>()));
  };
  if (dtype == at::kFloat) {
    run(float(), [fold](const Queries<float>& qs, auto dim_constant) {
      constexpr int64_t DIM = decltype(dim_constant)::value;
      return [&qs, fold](int64_t span) {
        return [&qs, fold, span, q = std::vector<float>(fold * DIM), scores = std::vector<float>(fold * span),
                sums = std::vector<float>(fold * DIM)](int64_t n, int64_t h) mutable {
          attend_head_f32<DIM>(qs, n, h, q.data(), scores.data(), sums.data(), span);
        };
      };
    });
    return out;
  }
#if defined(__AVX512BF16__)
  run(BFloat16(), [fold](const Queries<BFloat16>& qs, auto dim_constant) {
    constexpr int64_t DIM = decltype(dim_constant)::value;
    return [&qs, fold](int64_t span) {
      return [&qs, span, q = std::vector<float>(fold * DIM), scores = std::vector<float>(fold * span),
              q_bf16 = std::vector<BFloat16>(fold * DIM),
              weights = std::vector<BFloat16>(fold * span)](int64_t n, int64_t h) mutable {
        attend_head_bf16<DIM>(qs, n, h, q.data(), q_bf16.data(), scores.data(), weights.data(), span);
      };
    };
  });
#else
  TORCH_CHECK(false, "attend in bfloat16: built without avx512_bf16 (NATIVE_BF16 is false)");
#endif
  return out;
}

// RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) of the residual stream after adding x (when given):
//   h += x;  y = w * h / sqrt(mean(h^2) + eps), stored as `dtype` (bf16: rounded once).   hidden (B, C) float32,
//   updated in place; x (B, C) in `dtype`.
torch::Tensor add_rms_norm(torch::Tensor hidden, c10::optional<torch::Tensor> delta, torch::Tensor weight,
                           double eps, at::ScalarType dtype) {
  TORCH_CHECK(hidden.is_contiguous() && hidden.scalar_type() == at::kFloat, "hidden: contiguous float32");
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "add_rms_norm: dtype bfloat16 or float32");
  TORCH_CHECK(!delta || (delta->scalar_type() == dtype && delta->is_contiguous()), "delta: contiguous, of dtype");
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

// Next-token sampling from logits (B, V): temperature, then nucleus (top-p) sampling (Holtzman et al. 2019, arXiv
// 1904.09751), one uniform per row (`uniforms` (B,), from the caller's torch generator); greedy when
// temperature == 0. Returns the tokens (B,) int64, their log-probs under softmax(logits / T) (T = 1 when
// greedy), the distribution before top-p, which is what the trainer recomputes, and that distribution's entropy
// (B,): log Z - sum_i p_i (z_i - z_max), one more sum in the pass that computes Z.
// The nucleus: the most likely tokens, in descending order, whose mass before each is <= top_p. It is found among
// the tokens above a probability threshold (1e-4, lowered while the tokens above it hold less than top_p; they
// are a prefix of the descending order, so the nucleus lies inside them), sorted, not among the whole vocabulary.
template <typename T>
void sample_rows(const T* logits, int64_t rows, int64_t vocab, float temperature, float top_p, const float* uniforms,
                 int64_t* tokens, float* log_probs, float* entropies) {
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
      entropies[b] = std::log(total) - weighted / total;
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
  auto entropies = torch::empty({rows}, logits.options().dtype(at::kFloat));
  if (logits.scalar_type() == at::kBFloat16)
    sample_rows(logits.data_ptr<BFloat16>(), rows, vocab, float(temperature), float(top_p),
                uniforms.data_ptr<float>(), tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>(),
                entropies.data_ptr<float>());
  else {
    const auto values = logits.to(at::kFloat);
    sample_rows(values.data_ptr<float>(), rows, vocab, float(temperature), float(top_p), uniforms.data_ptr<float>(),
                tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>(), entropies.data_ptr<float>());
  }
  return {tokens, log_probs, entropies};
}

// x W^T (+ b) in bfloat16 with float32 sums, for every projection of the decode step and the prompt pass.
// W is packed once (`pack_weight`) in blocks of 48 outputs: block j holds outputs [48j, 48j + 48) as
// (I/2, 48, 2), so for each pair of inputs the block's 48 outputs x 2 inputs are three vectors in a row (the
// pair layout `_mm512_dpbf16_ps` multiplies). A tile of up to 8 rows of x runs through a block with 24
// accumulators: per input pair, three vector loads of W, one broadcast of each row's pair, 24 pair products
// (an outer product; no horizontal sums). Each thread takes whole blocks, all tiles of x through a block while
// it sits in cache, the next block prefetched in equal shares by the tiles (`each_row_tile`). The last block
// holds the N % 48 outputs left (16 or 32).
// Why not oneDNN's linear on weights reordered once into its own layout: this runs a step's projections faster
// at every row count measured, 1 to 2048 (benchmarks/projections.py; figures: docs/benchmarks.md, "Measurements behind code comments").
constexpr int64_t PAIR_BLOCK = 48, BF16_TILE_ROWS = 8;

// On a CPU with AMX (Sapphire Rapids and later), `linear` runs 8-64 rows on the tile unit over the same packed
// weight (`tile_linear`), faster there than both oneDNN's AMX matmul and the pair products
// (benchmarks/projections.py; figures: docs/benchmarks.md, "Measurements behind code comments"). From 65 rows (the prompt
// pass's chunks) oneDNN's blocked matmul wins, on the weight reordered once into its layout when the caller keeps it
// (`onednn`, from mkldnn::_reorder_linear_weight; aten's linear on the weight as given would reorder it on every
// call). 0: no AMX in this build, never.
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
constexpr int64_t TILE_MIN_ROWS = 8, ONEDNN_MIN_ROWS = 65;
#else
constexpr int64_t TILE_MIN_ROWS = 0, ONEDNN_MIN_ROWS = 0;
#endif

// x W^T (+ b) by oneDNN on W in its blocked layout (torch's mkldnn::_linear_pointwise, what
// torch.ops.mkldnn._linear_pointwise calls, with no fused activation).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                        c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>)>();
  return op.call(x, weight, bias.numel() ? std::optional<at::Tensor>(bias) : std::nullopt, "none",
                 c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

#if defined(__AVX512BF16__)
// bias[first, first + 16) as float32 (bf16 is the top 16 bits of a float32), or zeros where there is no bias.
inline __m512 bias_floats(const BFloat16* bias, int64_t first) {
  if (!bias) return _mm512_setzero_ps();
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(bias + first))), 16));
}

// ROWS rows of x (stride `in`) against one block of 16 V outputs (`pairs`: (in/2, 16 V, 2)); y points at the
// block's first output of row 0 (stride `out`). `next`: this tile's share of the next block to prefetch meanwhile,
// or null.
template <int ROWS, int V>
void linear_tile_bf16(const BFloat16* x, int64_t in, const BFloat16* pairs, const BFloat16* next,
                      PrefetchShare share, const BFloat16* bias, BFloat16* y, int64_t out) {
  __m512 acc[ROWS][V];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < in / 2; ++p) {
    const BFloat16* w = pairs + p * V * 32;  // 16 V outputs x 2 inputs: V vectors, V cache lines
    prefetch_step(next, share, p);
    __m512bh ws[V];
    for (int v = 0; v < V; ++v) ws[v] = (__m512bh)_mm512_loadu_si512(w + v * 32);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh xs = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(x + r * in + 2 * p));
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ws[v], xs);
    }
  }
  for (int v = 0; v < V; ++v) {
    const __m512 b = bias_floats(bias, 16 * v);
    for (int r = 0; r < ROWS; ++r)
      _mm256_storeu_si256((__m256i*)(y + r * out + 16 * v), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v], b)));
  }
}

// Every tile of x through one block of 16 V outputs (`each_row_tile`; its prefetch shares kept for one code path,
// they neither help nor hurt at 16-64 rows, where the pair products, not memory, set the pace).
template <int V, int... ROWS>
void linear_block_bf16(const BFloat16* x, int64_t rows, int64_t in, const BFloat16* pairs, const BFloat16* next,
                       const BFloat16* bias, BFloat16* y, int64_t out, std::integer_sequence<int, ROWS...>) {
  using Tile = void (*)(const BFloat16*, int64_t, const BFloat16*, const BFloat16*, PrefetchShare, const BFloat16*,
                        BFloat16*, int64_t);
  static constexpr Tile tiles[] = {linear_tile_bf16<ROWS + 1, V>...};  // tiles[r - 1]: r rows
  each_row_tile(tiles, x, rows, in, pairs, next, in * V * 16, in / 2, bias, y, out);
}
#endif

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
// The tile unit's register layout (palette 1) as `linear` uses it: tmm0-2 the sums of 16 rows x 16 outputs
// (float32), tmm3 16 rows of x x 32 inputs, tmm4-6 16 input pairs x 16 outputs x 2: one vector of a pair block
// (`pack_weight`'s (I/2, 48, 2)), loaded with the block's row stride, so AMX reads the pair products' layout as is.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
  TileConfig(int64_t sum_rows) {
    for (int t = 0; t < 7; ++t) bytes_per_row[t] = 64, rows[t] = t < 4 ? sum_rows : 16;
  }
};

// Linux hands out the tile registers' 8 KB of state per process on request (arch_prctl, once).
bool tiles_permitted() {
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return permitted;
}

// All rows of x (I % 32 == 0; `linear` sends 8-64) through one block of 16 V outputs, 16 rows at a time (the last
// tile with N % 16 rows, under `part`'s config), each row's sums over I in steps of 32 inputs in one fixed order,
// whatever rows sit beside it. The next block's lines are prefetched a few per step across all tiles, so the
// memory stream keeps going while later tiles reread this block from cache.
template <int V>
void tile_block(const BFloat16* x, int64_t rows, int64_t in, const BFloat16* pairs, const BFloat16* next,
                const BFloat16* bias, BFloat16* y, int64_t out, float* sums, const TileConfig& full,
                const TileConfig& part) {
  const int64_t tiles = (rows + 15) / 16, steps = in / 32, lines = in / 2 * V;
  const int64_t per_step = (lines + tiles * steps - 1) / (tiles * steps);
  int64_t prefetched = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t valid = std::min<int64_t>(16, rows - t * 16);
    if (valid < 16 && tiles > 1) _tile_loadconfig(&part);  // one tile alone is under `part` already
    _tile_zero(0);
    if (V > 1) _tile_zero(1);
    if (V > 2) _tile_zero(2);
    for (int64_t s = 0; s < steps; ++s) {
      const BFloat16* w = pairs + s * 16 * V * 32;
      for (int64_t l = 0; next && l < per_step && prefetched < lines; ++l, ++prefetched)
        _mm_prefetch((const char*)(next + prefetched * 32), _MM_HINT_T1);
      _tile_loadd(3, x + t * 16 * in + s * 32, in * 2);
      _tile_loadd(4, w, V * 64);
      _tile_dpbf16ps(0, 3, 4);
      if (V > 1) { _tile_loadd(5, w + 32, V * 64); _tile_dpbf16ps(1, 3, 5); }
      if (V > 2) { _tile_loadd(6, w + 64, V * 64); _tile_dpbf16ps(2, 3, 6); }
    }
    _tile_stored(0, sums, V * 64);
    if (V > 1) _tile_stored(1, sums + 16, V * 64);
    if (V > 2) _tile_stored(2, sums + 32, V * 64);
    if (valid < 16 && tiles > 1) _tile_loadconfig(&full);
    for (int v = 0; v < V; ++v) {
      const __m512 b = bias_floats(bias, 16 * v);
      for (int64_t r = 0; r < valid; ++r)
        _mm256_storeu_si256((__m256i*)(y + (t * 16 + r) * out + 16 * v),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(sums + r * V * 16 + 16 * v), b)));
    }
  }
}

// x W^T (+ b) on the tile unit, every block of `packed` (pack_weight) through tile_block.
void tile_linear(const BFloat16* x, int64_t rows, int64_t in, const BFloat16* packed, const BFloat16* bias,
                 BFloat16* y, int64_t out) {
  at::parallel_for(0, (out + PAIR_BLOCK - 1) / PAIR_BLOCK, 1, [&](int64_t first, int64_t last) {
    const TileConfig full(16), part(rows % 16);
    _tile_loadconfig(rows < 16 ? &part : &full);
    alignas(64) float sums[16 * PAIR_BLOCK];
    for (int64_t j = first; j < last; ++j) {
      const int64_t begin = j * PAIR_BLOCK, width = std::min(PAIR_BLOCK, out - begin);
      const BFloat16 *pairs = packed + begin * in, *next = j + 1 < last ? packed + (begin + width) * in : nullptr;
      const BFloat16* b = bias ? bias + begin : nullptr;
      if (width == 48) tile_block<3>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
      else if (width == 32) tile_block<2>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
      else tile_block<1>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
    }
    _tile_release();
  });
}
#endif

// W (O, I) -> the same shape in `linear`'s blocks: bf16, blocks of 48 outputs, each (I/2, 48, 2) (the last one
// N % 48 wide); float32, blocks of F32_BLOCK outputs, each (I, F32_BLOCK) (the last one narrower). Empty where
// `linear` cannot take it: bf16 with O % 16, I % 2 or no avx512_bf16; float32 with O % F32_LANES.
torch::Tensor pack_weight(torch::Tensor weight) {
  const int64_t out = weight.size(0), in = weight.size(1);
  // W's rows in blocks of `block` (elements of `units`, a view of W): block j as its transpose (in, block)
  auto blocked = [out](const at::Tensor& units, int64_t block) {
    const int64_t full = out / block * block;
    std::vector<at::Tensor> parts;
    if (full) parts.push_back(units.slice(0, 0, full).view({full / block, block, -1}).transpose(1, 2).flatten());
    if (out > full) parts.push_back(units.slice(0, full).t().flatten());
    return torch::cat(parts);
  };
  if (weight.scalar_type() == at::kFloat && out % F32_LANES == 0)
    return blocked(weight.contiguous(), F32_BLOCK).view({out, in});
#if defined(__AVX512BF16__)
  if (weight.scalar_type() == at::kBFloat16 && out % 16 == 0 && in % 2 == 0)
    // each pair of inputs as one 32-bit element: packing is a transpose of 48 x (I/2) blocks, one 4-byte copy
    // per pair instead of two 2-byte ones
    return blocked(weight.contiguous().view(at::kInt), PAIR_BLOCK).view(at::kBFloat16).view({out, in});
#endif
  return weight.new_empty({0});
}

// x (N, I) bf16 or float32, contiguous; packed (O, I) from pack_weight, same dtype; bias (O,) same dtype or empty.
void check_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kFloat),
              "x: contiguous bfloat16 or float32 (N, I)");
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) == x.size(1) && packed.scalar_type() == dtype,
              "packed: (O, I) from pack_weight, I = x.size(1), x's dtype");
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == packed.size(0) && bias.scalar_type() == dtype),
              "bias: (O,) or empty");
}

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
// Whether the tile unit runs x W^T here: bf16, I % 32 == 0, and the process allowed to use it.
bool tiles_take(const torch::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 && x.size(1) % 32 == 0 && tiles_permitted();
}

// x W^T + b on the tile unit, arguments checked and taken (check_linear, tiles_take).
torch::Tensor product_on_tiles(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  auto y = torch::empty({x.size(0), packed.size(0)}, x.options());
  if (x.size(0))
    tile_linear(x.data_ptr<BFloat16>(), x.size(0), x.size(1), packed.data_ptr<BFloat16>(),
                bias.numel() ? bias.data_ptr<BFloat16>() : nullptr, y.data_ptr<BFloat16>(), packed.size(0));
  return y;
}

// `linear` on the tile unit at any row count (`linear` picks it for TILE_MIN_ROWS to ONEDNN_MIN_ROWS - 1).
torch::Tensor linear_on_tiles(torch::Tensor x, torch::Tensor packed, torch::Tensor bias) {
  check_linear(x, packed, bias);
  TORCH_CHECK(tiles_take(x), "linear_on_tiles: bf16 x with I % 32 == 0, on a CPU and kernel that allow AMX");
  return product_on_tiles(x, packed, bias);
}
#endif

// x W^T + b on the vector units (bf16 pair products, float32 outer products), arguments checked (check_linear).
torch::Tensor product_on_vectors(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias);

// x W^T + b, (N, O) in x's dtype, by what runs the row count fastest here: on an AMX CPU in bf16, the tile unit
// from TILE_MIN_ROWS and oneDNN from ONEDNN_MIN_ROWS (or from TILE_MIN_ROWS where the tiles cannot take x), on
// `onednn`, the weight in oneDNN's layout when the caller keeps one; else the vector units. Arguments as
// check_linear's.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, torch::Tensor onednn) {
  check_linear(x, packed, bias);
  const int64_t rows = x.size(0);
  if (x.scalar_type() == at::kBFloat16 && TILE_MIN_ROWS && rows >= TILE_MIN_ROWS) {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
    if (rows < ONEDNN_MIN_ROWS && tiles_take(x)) return product_on_tiles(x, packed, bias);
#endif
    if (onednn.numel()) return onednn_linear(x, onednn, bias);
  }
  return product_on_vectors(x, packed, bias);
}

// `linear` on the vector units at any row count.
torch::Tensor linear_on_vectors(torch::Tensor x, torch::Tensor packed, torch::Tensor bias) {
  check_linear(x, packed, bias);
  return product_on_vectors(x, packed, bias);
}

// Each thread takes whole blocks, all tiles of x through a block while it sits in cache, the next block
// prefetched meanwhile.
torch::Tensor product_on_vectors(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  const auto dtype = x.scalar_type();
  const int64_t rows = x.size(0), in = x.size(1), out = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
  // blocks of `block` outputs through `run_block(first output, width, next block or null)`
  auto each_block = [out, in](int64_t block, auto run_block) {
    at::parallel_for(0, (out + block - 1) / block, 1, [&](int64_t first, int64_t last) {
      for (int64_t j = first; j < last; ++j) {
        const int64_t begin = j * block, width = std::min(block, out - begin);
        run_block(begin, width, j + 1 < last ? (begin + width) * in : -1);
      }
    });
  };
  if (dtype == at::kFloat) {
    const float *w_p = packed.data_ptr<float>(), *x_p = x.data_ptr<float>();
    const float* b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
    float* y_p = y.data_ptr<float>();
    constexpr auto tile_rows = std::make_integer_sequence<int, F32_TILE_ROWS>();
    each_block(F32_BLOCK, [&](int64_t begin, int64_t width, int64_t next) {
      const float *block = w_p + begin * in, *ahead = next >= 0 ? w_p + next : nullptr;
      const float* b = b_p ? b_p + begin : nullptr;
      const int64_t vectors = width / F32_LANES;  // the last block may be narrower
      if (vectors == F32_VECTORS)
        linear_block_f32<F32_VECTORS>(x_p, rows, in, block, ahead, b, y_p + begin, out, tile_rows);
      else if (vectors == 2) linear_block_f32<2>(x_p, rows, in, block, ahead, b, y_p + begin, out, tile_rows);
      else linear_block_f32<1>(x_p, rows, in, block, ahead, b, y_p + begin, out, tile_rows);
    });
    return y;
  }
#if defined(__AVX512BF16__)
  const BFloat16 *w_p = packed.data_ptr<BFloat16>(), *x_p = x.data_ptr<BFloat16>();
  const BFloat16* b_p = bias.numel() ? bias.data_ptr<BFloat16>() : nullptr;
  BFloat16* y_p = y.data_ptr<BFloat16>();
  constexpr auto pair_rows = std::make_integer_sequence<int, BF16_TILE_ROWS>();
  each_block(PAIR_BLOCK, [&](int64_t begin, int64_t width, int64_t next) {
    const BFloat16 *pairs = w_p + begin * in, *ahead = next >= 0 ? w_p + next : nullptr;
    const BFloat16* b = b_p ? b_p + begin : nullptr;
    if (width == 48) linear_block_bf16<3>(x_p, rows, in, pairs, ahead, b, y_p + begin, out, pair_rows);
    else if (width == 32) linear_block_bf16<2>(x_p, rows, in, pairs, ahead, b, y_p + begin, out, pair_rows);
    else linear_block_bf16<1>(x_p, rows, in, pairs, ahead, b, y_p + begin, out, pair_rows);
  });
#else
  TORCH_CHECK(false, "linear in bfloat16 needs avx512_bf16 (pack_weight returns an empty weight without it)");
#endif
  return y;
}

// Qwen3's RMSNorm of each query and key head before RoPE, in place: qkv (N, (H + 2 H_kv) D) bf16 or float32;
//   for each of the first H + H_kv heads j (queries, then keys), x_j = w[j] * x_j / sqrt(mean(x_j^2) + eps),
//   computed in float32; weight (H + H_kv, D) float32 (the q norm's weight on the query rows, the k norm's after).
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

// Every layer of a Llama-style block for N tokens, one call from Python (at one row, ~240 Python calls per
// step cost more than the step's arithmetic besides the weight reads):
//   x = RMSNorm(h);  per layer: h += Attn(RoPE(x W_qkv^T + b_qkv)) W_o^T;  x = RMSNorm(h);
//   h += (silu(g) * u) W_down^T for [g, u] = x W_gu^T;  x = RMSNorm(h) with the next layer's norm (the final norm
//   after the last). Qwen3's q and k are RMSNorm-ed per head before RoPE (`qk_rms_norm`).
// hidden (N, C) float32, updated in place; layers[i] = {norm_in, W_qkv, b_qkv (or empty), W_o, norm_post, W_gu,
// W_down, norm_after, then the four W in oneDNN's layout (or empty: `linear`'s `onednn`), then the q/k norms'
// weight (H + H_kv, D) or empty (`qk_rms_norm`: Qwen3)}, each W from pack_weight; cache (2, layers, R, H_kv, S,
// D); prompt_kv (2, layers, P, H_kv, T, D) or empty; every tensor but hidden and the norms in the cache's dtype
// (bf16 or float32). Returns x after the last layer's norm, (N, C) in that dtype.
at::Tensor run_layers(at::Tensor hidden, const std::vector<std::vector<at::Tensor>>& layers, at::Tensor cos,
                      at::Tensor sin, at::Tensor rows, at::Tensor slots, at::Tensor cache, at::Tensor cache_start,
                      at::Tensor prompt_kv, at::Tensor prompt_start, at::Tensor row_prompt, int64_t heads,
                      double scale, double eps) {
  const bool shared = prompt_kv.numel() > 0;
  const at::Tensor empty = cache.new_empty({0});
  const auto dtype = cache.scalar_type();
  at::Tensor x = add_rms_norm(hidden, std::nullopt, layers[0][0], eps, dtype);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& w = layers[i];
    const at::Tensor qkv = linear(x, w[1], w[2], w[8]);
    if (w[12].numel()) qk_rms_norm(qkv, w[12], eps);  // Qwen3: q and k normed per head before `attend`'s RoPE
    const at::Tensor attended = attend(
        qkv, cos, sin, rows, slots, cache[0][i], cache[1][i], cache_start,
        shared ? prompt_kv[0][i] : empty, shared ? prompt_kv[1][i] : empty, prompt_start, row_prompt, heads, scale);
    x = add_rms_norm(hidden, linear(attended, w[3], empty, w[9]), w[4], eps, dtype);
    x = add_rms_norm(hidden, linear(silu_mul(linear(x, w[5], empty, w[10])), w[6], empty, w[11]), w[7], eps, dtype);
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
  module.def("linear", &linear);
  module.def("linear_on_vectors", &linear_on_vectors);
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
  module.def("linear_on_tiles", &linear_on_tiles);
#endif
  module.attr("NATIVE_BF16") = NATIVE_BF16;
  module.attr("FLOAT32_VECTORS") = F32_VECTOR_ISA;  // the float32 kernels' instruction set: avx512, avx2, ...
  module.attr("FLOAT32_LANES") = F32_LANES;  // floats per vector
  module.attr("FLOAT32_BLOCK") = F32_BLOCK;  // outputs per packed block of `linear`
  module.attr("TILE_MIN_ROWS") = TILE_MIN_ROWS;  // bf16 rows from which `linear` uses the AMX tiles (0: never)
  module.attr("ONEDNN_MIN_ROWS") = ONEDNN_MIN_ROWS;  // bf16 rows from which `linear` uses oneDNN (0: never)
}
