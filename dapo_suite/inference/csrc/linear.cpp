// `pack_weight` and `linear`: x W^T + b for every projection, on bf16 pair products, float32 vectors (FMA)
// or, on an AMX CPU, the tile unit.
#include "kernels.h"

namespace {

// F32_LANES weights at `p` as float32: float32 as stored; int8 (`pack_weight_int8`) widened (`widen_int8`: 2
// instructions a vector, shared by a tile's rows).
inline Floats weight_floats(const float* p) { return *reinterpret_cast<const UnalignedFloats*>(p); }
inline Floats weight_floats(const int8_t* p) { return widen_int8(p); }

// ROWS rows of x (stride `in`) against one block of V vectors of outputs (`block`: (in, V F32_LANES) of W,
// float32 or int8); y points at the block's first output of row 0 (stride `out`). Per input: V weight loads,
// ROWS broadcasts, ROWS x V fused multiply-adds (an outer product; no horizontal sums). An int8 block's
// float32 scales follow its weights: each output's sum times its scale, then the bias (at one row the int8
// weights are the only stream, at a quarter of float32's bytes). `next`: this tile's share of the next block
// to prefetch meanwhile, or null.
template <int ROWS, int V, typename W>
void linear_tile_f32(const float* x, int64_t in, const W* block, const W* next, PrefetchShare share,
                     const float* bias, float* y, int64_t out) {
  Floats acc[ROWS][V] = {};
  for (int64_t i = 0; i < in; ++i) {
    const W* w = block + i * V * F32_LANES;
    prefetch_step(next, share, i);
    Floats ws[V];
    for (int v = 0; v < V; ++v) ws[v] = weight_floats(w + v * F32_LANES);
    for (int r = 0; r < ROWS; ++r) {
      const float xs = x[r * in + i];
      for (int v = 0; v < V; ++v) acc[r][v] += ws[v] * xs;
    }
  }
  for (int v = 0; v < V; ++v) {
    if constexpr (std::is_same_v<W, int8_t>) {
      const float* scales = reinterpret_cast<const float*>(block + in * V * F32_LANES);
      const Floats s = weight_floats(scales + v * F32_LANES);
      for (int r = 0; r < ROWS; ++r) acc[r][v] *= s;
    }
    Floats b = {};
    if (bias) b = *reinterpret_cast<const UnalignedFloats*>(bias + v * F32_LANES);
    for (int r = 0; r < ROWS; ++r)
      *reinterpret_cast<UnalignedFloats*>(y + r * out + v * F32_LANES) = acc[r][v] + b;
  }
}

// Every tile of x through one block of V vectors of outputs (`each_row_tile`).
template <int V, typename W, int... ROWS>
void linear_block(const float* x, int64_t rows, int64_t in, const W* block, const W* next, const float* bias,
                  float* y, int64_t out, std::integer_sequence<int, ROWS...>) {
  using Tile =
      void (*)(const float*, int64_t, const W*, const W*, PrefetchShare, const float*, float*, int64_t);
  static constexpr Tile tiles[] = {linear_tile_f32<ROWS + 1, V, W>...};  // tiles[r - 1]: r rows
  each_row_tile(tiles, x, rows, in, block, next, in * V * F32_LANES, in, bias, y, out);
}

// W (O, I) -> its rows in blocks of `block`, block j as its transpose (I, block) (the last one O % block
// wide), flattened.
at::Tensor in_blocks(const at::Tensor& weight, int64_t block) {
  const int64_t out = weight.size(0), full = out / block * block;
  std::vector<at::Tensor> parts;
  if (full)
    parts.push_back(weight.slice(0, 0, full).view({full / block, block, -1}).transpose(1, 2).flatten());
  if (out > full) parts.push_back(weight.slice(0, full).t().flatten());
  return torch::cat(parts);
}

}  // namespace

// x W^T (+ b) in bfloat16 with float32 sums, for every projection of the decode step and the prompt pass.
// W is packed once (`pack_weight`) in blocks of 48 outputs: block j holds outputs [48j, 48j + 48) as
// (I/2, 48, 2), so for each pair of inputs the block's 48 outputs x 2 inputs are three vectors in a row (the
// pair layout `_mm512_dpbf16_ps` multiplies). A tile of up to 8 rows of x runs through a block with 24
// accumulators: per input pair, three vector loads of W, one broadcast of each row's pair, 24 pair products
// (an outer product; no horizontal sums). Each thread takes whole blocks, all tiles of x through a block
// while it sits in cache, the next block prefetched in equal shares by the tiles (`each_row_tile`). The last
// block holds the N % 48 outputs left (16 or 32). Why not oneDNN's linear on weights reordered once into its
// own layout: this runs a step's projections faster at every row count measured, 1 to 2048
// (benchmarks/projections.py; figures: docs/benchmarks.md, "Measurements behind code comments").
constexpr int64_t PAIR_BLOCK = 48, BF16_TILE_ROWS = 8;

// x W^T (+ b) by oneDNN on W in its blocked layout (torch's mkldnn::_linear_pointwise, what
// torch.ops.mkldnn._linear_pointwise calls, with no fused activation).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
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
// block's first output of row 0 (stride `out`). `next`: this tile's share of the next block to prefetch
// meanwhile, or null.
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
      _mm256_storeu_si256((__m256i*)(y + r * out + 16 * v),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][v], b)));
  }
}

// Every tile of x through one block of 16 V outputs (`each_row_tile`; its prefetch shares kept for one code
// path, they neither help nor hurt at 16-64 rows, where the pair products, not memory, set the pace).
template <int V, int... ROWS>
void linear_block(const BFloat16* x, int64_t rows, int64_t in, const BFloat16* pairs, const BFloat16* next,
                  const BFloat16* bias, BFloat16* y, int64_t out, std::integer_sequence<int, ROWS...>) {
  using Tile = void (*)(const BFloat16*, int64_t, const BFloat16*, const BFloat16*, PrefetchShare,
                        const BFloat16*, BFloat16*, int64_t);
  static constexpr Tile tiles[] = {linear_tile_bf16<ROWS + 1, V>...};  // tiles[r - 1]: r rows
  each_row_tile(tiles, x, rows, in, pairs, next, in * V * 16, in / 2, bias, y, out);
}
#endif

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
// The tile unit's register layout (palette 1) as `linear` uses it: tmm0-2 the sums of 16 rows x 16 outputs
// (float32), tmm3 16 rows of x x 32 inputs, tmm4-6 16 input pairs x 16 outputs x 2: one vector of a pair
// block
// (`pack_weight`'s (I/2, 48, 2)), loaded with the block's row stride, so AMX reads the pair products' layout
// as is.
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
  static const bool permitted =
      syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return permitted;
}

// All rows of x (I % 32 == 0; `linear` sends 8-64) through one block of 16 V outputs, 16 rows at a time (the
// last tile with N % 16 rows, under `part`'s config), each row's sums over I in steps of 32 inputs in one
// fixed order, whatever rows sit beside it. The next block's lines are prefetched a few per step across all
// tiles, so the memory stream keeps going while later tiles reread this block from cache.
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
      if (V > 1) {
        _tile_loadd(5, w + 32, V * 64);
        _tile_dpbf16ps(1, 3, 5);
      }
      if (V > 2) {
        _tile_loadd(6, w + 64, V * 64);
        _tile_dpbf16ps(2, 3, 6);
      }
    }
    _tile_stored(0, sums, V * 64);
    if (V > 1) _tile_stored(1, sums + 16, V * 64);
    if (V > 2) _tile_stored(2, sums + 32, V * 64);
    if (valid < 16 && tiles > 1) _tile_loadconfig(&full);
    for (int v = 0; v < V; ++v) {
      const __m512 b = bias_floats(bias, 16 * v);
      for (int64_t r = 0; r < valid; ++r)
        _mm256_storeu_si256(
            (__m256i*)(y + (t * 16 + r) * out + 16 * v),
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
      const BFloat16 *pairs = packed + begin * in,
                     *next = j + 1 < last ? packed + (begin + width) * in : nullptr;
      const BFloat16* b = bias ? bias + begin : nullptr;
      if (width == 48)
        tile_block<3>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
      else if (width == 32)
        tile_block<2>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
      else
        tile_block<1>(x, rows, in, pairs, next, b, y + begin, out, sums, full, part);
    }
    _tile_release();
  });
}
#endif

// W (O, I) -> the same shape in `linear`'s blocks: bf16, blocks of 48 outputs, each (I/2, 48, 2) (the last
// one N % 48 wide); float32, blocks of F32_BLOCK outputs, each (I, F32_BLOCK) (the last one narrower). Empty
// where `linear` cannot take it: bf16 with O % 16, I % 2 or no avx512_bf16; float32 with O % F32_LANES.
torch::Tensor pack_weight(torch::Tensor weight) {
  const int64_t out = weight.size(0), in = weight.size(1);
  if (weight.scalar_type() == at::kFloat && out % F32_LANES == 0)
    return in_blocks(weight.contiguous(), F32_BLOCK).view({out, in});
#if defined(__AVX512BF16__)
  if (weight.scalar_type() == at::kBFloat16 && out % 16 == 0 && in % 2 == 0)
    // each pair of inputs as one 32-bit element: packing is a transpose of 48 x (I/2) blocks, one 4-byte copy
    // per pair instead of two 2-byte ones
    return in_blocks(weight.contiguous().view(at::kInt), PAIR_BLOCK).view(at::kBFloat16).view({out, in});
#endif
  return weight.new_empty({0});
}

// Whether the integer dot products take a quantized weight (O, I) of a format they are `built` for: I in
// whole groups of 32, O in vectors of 16.
bool dots_take(const torch::Tensor& q, bool built) {
  return built && q.size(1) % 32 == 0 && q.size(0) % 16 == 0;
}

// q (O, I) int8 and its per-output scales s (O,) float32 (`weights.quantize_int8`: W ~ q s) -> `linear`'s
// int8 layout. With integer dot products (`INT8_DOTS`), their layout (quantized.cpp: uint8 (O, I + 4)).
// Else blocks of F32_BLOCK outputs as the float32 layout's, each block's I x width int8 followed by its width
// float32 scales, so a tile finds its scales beside its weights: one int8 tensor (O, I + 4); empty where
// O % F32_LANES.
torch::Tensor pack_weight_int8(torch::Tensor q, torch::Tensor scales) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar, "q: int8 (O, I)");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == q.size(0) && scales.scalar_type() == at::kFloat,
              "scales: float32 (O,)");
#if INT8_DOTS_BUILT
  if (dots_take(q, INT8_DOTS)) return pack_weight_dot_int8(q, scales);
#endif
  const int64_t out = q.size(0), in = q.size(1);
  if (out % F32_LANES) return q.new_empty({0});
  std::vector<at::Tensor> parts;
  for (int64_t begin = 0; begin < out; begin += F32_BLOCK) {
    const int64_t width = std::min(F32_BLOCK, out - begin);
    parts.push_back(q.slice(0, begin, begin + width).t().flatten());
    parts.push_back(scales.slice(0, begin, begin + width).contiguous().view(at::kChar));
  }
  return torch::cat(parts).view({out, in + 4});
}

// q (O, I) int8 in [-8, 7] and its scales s (O, ceil(I / 32)) float32, one per output and group of 32 inputs
// (`weights.quantize_int4`: W ~ q s) -> the integer dot products' int4 layout (quantized.cpp: uint8 (O, I / 2
// + I / 16), the scales as float16); empty where they cannot take it (no avx512_vnni nor AVX2, I % 32, O %
// 16).
torch::Tensor pack_weight_int4(torch::Tensor q, torch::Tensor scales) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar, "q: int8 (O, I) in [-8, 7]");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == q.size(0) && scales.size(1) == (q.size(1) + 31) / 32 &&
                  scales.scalar_type() == at::kFloat,
              "scales: float32 (O, ceil(I / 32))");
#if INTEGER_DOTS_BUILT
  if (dots_take(q, INT4_DOTS)) return pack_weight_dot_int4(q, scales);
#endif
  return at::empty({0}, q.options().dtype(at::kByte));
}

// The bits of a weight packed for the integer dot products, told by its width: int8 (O, I + 4), int4 (O,
// I / 2 + I / 16).
int dot_bits(const torch::Tensor& packed, int64_t in) { return packed.size(1) == in + 4 ? 8 : 4; }

// x (N, I) bf16 or float32, contiguous; packed (O, I) from pack_weight, same dtype; bias (O,) same dtype or
// empty.
void check_linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kFloat),
              "x: contiguous bfloat16 or float32 (N, I)");
  if (packed.scalar_type() == at::kChar) {
    TORCH_CHECK(dtype == at::kFloat && packed.dim() == 2 && packed.size(1) == x.size(1) + 4,
                "packed int8: (O, I + 4) from pack_weight_int8, I = x.size(1), x float32");
  } else if (packed.scalar_type() == at::kByte) {
    const int64_t in = x.size(1);
    TORCH_CHECK(
        dtype == at::kFloat && packed.dim() == 2 && in % 32 == 0 &&
            ((INT8_DOTS && packed.size(1) == in + 4) || (INT4_DOTS && packed.size(1) == in / 2 + in / 16)),
        "packed for integer dots: (O, I + 4) from pack_weight_int8 or (O, I / 2 + I / 16) from "
        "pack_weight_int4, I = x.size(1), x float32");
  } else {
    TORCH_CHECK(packed.dim() == 2 && packed.size(1) == x.size(1) && packed.scalar_type() == dtype,
                "packed: (O, I) from pack_weight, I = x.size(1), x's dtype");
  }
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == packed.size(0) && bias.scalar_type() == dtype),
              "bias: (O,) or empty");
}

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
// Whether the tile unit runs x W^T here: bf16, I % 32 == 0, and the process allowed to use it.
bool tiles_take(const torch::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 && x.size(1) % 32 == 0 && tiles_permitted();
}

// x W^T + b on the tile unit, arguments checked and taken (check_linear, tiles_take).
torch::Tensor product_on_tiles(const torch::Tensor& x, const torch::Tensor& packed,
                               const torch::Tensor& bias) {
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

// x W^T + b on the vector units (bf16 pair products, float32 outer products), arguments checked
// (check_linear).
torch::Tensor product_on_vectors(const torch::Tensor& x, const torch::Tensor& packed,
                                 const torch::Tensor& bias);

// x W^T + b, (N, O) in x's dtype, by what runs the row count fastest here: on an AMX CPU in bf16, the tile
// unit from TILE_MIN_ROWS and oneDNN from ONEDNN_MIN_ROWS (or from TILE_MIN_ROWS where the tiles cannot take
// x), on `onednn`, the weight in oneDNN's layout when the caller keeps one; else the vector units. Arguments
// as check_linear's.
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

namespace {

// fn(std::integral_constant<int, V>()) for a block of V = `vectors` (1-3) vectors: V as a template argument.
template <typename Fn>
void by_vectors(int64_t vectors, Fn fn) {
  if (vectors == 3)
    fn(std::integral_constant<int, 3>());
  else if (vectors == 2)
    fn(std::integral_constant<int, 2>());
  else
    fn(std::integral_constant<int, 1>());
}

}  // namespace

// Each thread takes whole blocks, all tiles of x through a block while it sits in cache, the next block
// prefetched meanwhile: float32 blocks of F32_BLOCK outputs (F32_LANES a vector), bf16 blocks of PAIR_BLOCK
// (16 a vector); the last block may be narrower.
torch::Tensor product_on_vectors(const torch::Tensor& x, const torch::Tensor& packed,
                                 const torch::Tensor& bias) {
  const int64_t rows = x.size(0), in = x.size(1), out = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
#if INTEGER_DOTS_BUILT
  if (packed.scalar_type() == at::kByte)
    return product_on_integer_dots(x, packed, bias, dot_bits(packed, in));
#endif
  static_assert(F32_VECTORS <= 3, "a block is dispatched for 1-3 vectors");
  auto run = [&](auto element, int64_t block, int64_t lanes, auto tile_rows) {
    using T = decltype(element);
    const T *w_p = packed.data_ptr<T>(), *x_p = x.data_ptr<T>();
    const T* b_p = bias.numel() ? bias.data_ptr<T>() : nullptr;
    T* y_p = y.data_ptr<T>();
    each_block(out, block, [&](int64_t begin, int64_t width, bool more) {
      const T *weights = w_p + begin * in, *ahead = more ? w_p + (begin + width) * in : nullptr;
      const T* b = b_p ? b_p + begin : nullptr;
      by_vectors(width / lanes, [&](auto vectors) {
        linear_block<decltype(vectors)::value>(x_p, rows, in, weights, ahead, b, y_p + begin, out, tile_rows);
      });
    });
  };
  if (packed.scalar_type() == at::kChar) {  // int8 blocks: I x width weights, then width float32 scales
    const int8_t* w_p = packed.data_ptr<int8_t>();
    const float *x_p = x.data_ptr<float>(), *b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
    float* y_p = y.data_ptr<float>();
    // One row tile: each weight widened as it streams past. More rows: each block widened and scaled once
    // into float32 (I x width, in L2), which every row tile then reads, rather than widened once per tile.
    const bool widen_block = rows > F32_TILE_ROWS;
    const auto tile_rows = std::make_integer_sequence<int, F32_TILE_ROWS>();
    each_block(out, F32_BLOCK, [&](int64_t begin, int64_t width, bool more) {
      const int8_t *weights = w_p + begin * (in + 4),
                   *ahead = more ? w_p + (begin + width) * (in + 4) : nullptr;
      const float* b = b_p ? b_p + begin : nullptr;
      by_vectors(width / F32_LANES, [&](auto vectors) {
        constexpr int V = decltype(vectors)::value;
        if (!widen_block)
          return linear_block<V>(x_p, rows, in, weights, ahead, b, y_p + begin, out, tile_rows);
        thread_local std::vector<float> widened;
        widened.resize(in * F32_BLOCK);
        const float* scales = reinterpret_cast<const float*>(weights + in * width);
        Floats s[V];
        for (int v = 0; v < V; ++v) s[v] = *reinterpret_cast<const UnalignedFloats*>(scales + v * F32_LANES);
        for (int64_t i = 0; i < in; ++i)
          for (int v = 0; v < V; ++v)
            *reinterpret_cast<UnalignedFloats*>(widened.data() + (i * V + v) * F32_LANES) =
                widen_int8(weights + (i * V + v) * F32_LANES) * s[v];
        linear_block<V>(x_p, rows, in, static_cast<const float*>(widened.data()),
                        static_cast<const float*>(nullptr), b, y_p + begin, out, tile_rows);
      });
    });
    return y;
  }
  if (x.scalar_type() == at::kFloat) {
    run(float(), F32_BLOCK, F32_LANES, std::make_integer_sequence<int, F32_TILE_ROWS>());
    return y;
  }
#if defined(__AVX512BF16__)
  run(BFloat16(), PAIR_BLOCK, 16, std::make_integer_sequence<int, BF16_TILE_ROWS>());
#else
  TORCH_CHECK(false, "linear in bfloat16 needs avx512_bf16 (pack_weight returns an empty weight without it)");
#endif
  return y;
}
