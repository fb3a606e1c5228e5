// `linear` on quantized rollout weights by integer dot products: int8 per output channel (`pack_weight_int8`,
// AVX-512 VNNI) and int4 in groups of 32 inputs (`pack_weight_int4`, AVX-512 VNNI or AVX2), the activations
// quantized to int8 per group of 32 as they enter, as llama.cpp's Q8_0 x Q8_0 and Q4_0 x Q8_0 dot products
// do.
//
// One `vpdpbusd` multiplies 64 unsigned weight bytes by 64 signed activation bytes and adds them in fours
// into 16 int32 sums: 64 multiply-adds, where the widened float32 tile (linear.cpp) makes 16 with three
// instructions. AVX2 has no such instruction: `vpmaddubsw` multiplies 32 byte pairs into 16 int16 pair sums
// and `vpmaddwd` adds those in pairs into int32, exact for int4's nibbles (a pair sum is at most 2 x 15 x
// 127) but not for int8's bytes (2 x 255 x 127 overflows int16), so on AVX2 int8 keeps the widened tile. The
// weights are stored unsigned (int8 q + 128, int4 q + 8), so each group's sum carries its offset times the
// sum of the group's quantized activations, which its int32 sum starts from negated. Both sides round only
// where they are quantized: each group's sum is exact in int32, then scaled in float32.
#include "kernels.h"

#if INTEGER_DOTS_BUILT

namespace {

constexpr int64_t GROUP = 32;  // inputs per activation scale and per int4 weight scale (Q8_0's, Q4_0's block)
constexpr int64_t DOT_BLOCK = 48, DOT_TILE_ROWS = 4;  // outputs per packed block; rows per tile (registers)

// x quantized per row and group of 32: q = round(x / d) in [-127, 127] with d = max |x| / 127; per group its
// d and the sum of its q.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};

#if INT8_DOTS_BUILT
// One group: its 32 q into `q`, its d and sum of q.
inline void quantize_group(const float* xg, int8_t* q, float& scale, int32_t& sum) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
  const float most =
      _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, a), _mm512_andnot_ps(sign, b)));
  const __m512 inverse = _mm512_set1_ps(most > 0 ? 127.0f / most : 0.0f);
  // round to nearest (even), as torch.round
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inverse));
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inverse));
  _mm_storeu_si128((__m128i*)q, _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtsepi32_epi8(qb));
  scale = most / 127.0f;
  sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

// 16 int32 lanes, each the sum of 4 byte products of one output.
struct Lanes {
  using Int = __m512i;
  using Float = __m512;
  static constexpr int64_t WIDTH = 16;
  static Int broadcast(int32_t word) { return _mm512_set1_epi32(word); }
  static Int load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static Int low_nibbles(Int bytes) { return _mm512_and_si512(bytes, _mm512_set1_epi8(0x0F)); }
  static Int high_nibbles(Int bytes) {
    return _mm512_and_si512(_mm512_srli_epi16(bytes, 4), _mm512_set1_epi8(0x0F));
  }
  // acc + per lane the sum of 4 products unsigned w x signed x
  static Int dot(Int acc, Int w, Int x) { return _mm512_dpbusd_epi32(acc, w, x); }
  // A block's vectors a pass over a group's inputs takes: all of a block's (3: 32 registers hold their sums).
  static constexpr int PASS = 3;
  // A group's sums being made for one vector of outputs: the int32 sums themselves, from their start.
  using Partial = Int;
  static Partial partial(int32_t start) { return broadcast(start); }
  // + low . x_low + high . x_high, on nibbles (< 16)
  static Partial add_nibble_products(Partial sums, Int low, Int x_low, Int high, Int x_high) {
    return dot(dot(sums, low, x_low), high, x_high);
  }
  static Int sums(Partial sums, int32_t) { return sums; }
  static Float to_float(Int v) { return _mm512_cvtepi32_ps(v); }
  static Float floats(float v) { return _mm512_set1_ps(v); }
  static Float zeros() { return _mm512_setzero_ps(); }
  static Float load_floats(const float* p) { return _mm512_loadu_ps(p); }
  static Float load_halves(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  static void store(float* p, Float v) { _mm512_storeu_ps(p, v); }
  static Float fmadd(Float a, Float b, Float c) { return _mm512_fmadd_ps(a, b, c); }
  static Float mul(Float a, Float b) { return _mm512_mul_ps(a, b); }
  static Float add(Float a, Float b) { return _mm512_add_ps(a, b); }
};
#else
inline void quantize_group(const float* xg, int8_t* q, float& scale, int32_t& sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a[4], most = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_loadu_ps(xg + 8 * i);
    most = _mm256_max_ps(most, _mm256_andnot_ps(sign, a[i]));
  }
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  const float largest = _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
  const __m256 inverse = _mm256_set1_ps(largest > 0 ? 127.0f / largest : 0.0f);
  __m256i qs[4];
  for (int i = 0; i < 4; ++i) qs[i] = _mm256_cvtps_epi32(_mm256_mul_ps(a[i], inverse));  // nearest even
  // packs interleave the 128-bit lanes: dwords come out as inputs 0-3, 8-11, 16-19, 24-27, 4-7, ...
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(qs[0], qs[1]), _mm256_packs_epi32(qs[2], qs[3]));
  _mm256_storeu_si256((__m256i*)q,
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(qs[0], qs[1]), _mm256_add_epi32(qs[2], qs[3]));
  __m128i fold = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  fold = _mm_add_epi32(fold, _mm_shuffle_epi32(fold, 0x4E));
  scale = largest / 127.0f;
  sum = _mm_cvtsi128_si32(_mm_add_epi32(fold, _mm_shuffle_epi32(fold, 0xB1)));
}

// 8 int32 lanes, each the sum of 4 byte products of one output.
struct Lanes {
  using Int = __m256i;
  using Float = __m256;
  static constexpr int64_t WIDTH = 8;
  static Int broadcast(int32_t word) { return _mm256_set1_epi32(word); }
  static Int load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static Int low_nibbles(Int bytes) { return _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F)); }
  static Int high_nibbles(Int bytes) {
    return _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi8(0x0F));
  }
  // Two vectors of a block a pass: 16 registers hold two vectors' sums for a tile's rows, not six.
  static constexpr int PASS = 2;
  // A group's sums being made: the int16 pair sums of its products, which a group's 4 steps of nibble
  // products keep exact (at most 4 x 2 x 2 x 15 x 127 = 30,480), added into int32 once a group.
  using Partial = Int;
  static Partial partial(int32_t) { return _mm256_setzero_si256(); }
  static Partial add_nibble_products(Partial pairs, Int low, Int x_low, Int high, Int x_high) {
    return _mm256_add_epi16(
        pairs, _mm256_add_epi16(_mm256_maddubs_epi16(low, x_low), _mm256_maddubs_epi16(high, x_high)));
  }
  static Int sums(Partial pairs, int32_t start) {
    return _mm256_add_epi32(broadcast(start), _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static Float to_float(Int v) { return _mm256_cvtepi32_ps(v); }
  static Float floats(float v) { return _mm256_set1_ps(v); }
  static Float zeros() { return _mm256_setzero_ps(); }
  static Float load_floats(const float* p) { return _mm256_loadu_ps(p); }
  static Float load_halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static void store(float* p, Float v) { _mm256_storeu_ps(p, v); }
  static Float fmadd(Float a, Float b, Float c) { return _mm256_fmadd_ps(a, b, c); }
  static Float mul(Float a, Float b) { return _mm256_mul_ps(a, b); }
  static Float add(Float a, Float b) { return _mm256_add_ps(a, b); }
};
#endif

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t in) {
  const int64_t groups = in / GROUP;
  QuantizedRows out{std::vector<int8_t>(rows * in), std::vector<float>(rows * groups),
                    std::vector<int32_t>(rows * groups)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      quantize_group(x + r * in + g * GROUP, out.q.data() + r * in + g * GROUP, out.scale[r * groups + g],
                     out.sum[r * groups + g]);
  return out;
}

// Four activation bytes of one row, the same in every lane.
inline Lanes::Int four_bytes(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return Lanes::broadcast(word);
}

// A block's layout is in 64-byte chunks of 16 outputs x 4 bytes; its U = V x 16 / Lanes::WIDTH vectors of
// lanes (one a chunk on AVX-512, two on AVX2) at these offsets of chunk k's row of V chunks.
template <int V>
constexpr int U_OF = V * 16 / Lanes::WIDTH;
inline int64_t lanes_at(int64_t k, int V, int u) { return (k * V * 16 + u * Lanes::WIDTH) * 4; }

#if INT8_DOTS_BUILT
// ROWS rows (first row `r0` of xr) against one int8 block of V x 16 outputs. Block layout: per group, per
// quad of inputs k (8), per vector v: 16 outputs x 4 inputs, unsigned (q + 128); then the block's float32
// scales per output. y = s_o sum_g d_g (sum_i (q_oi + 128) x_i - 128 sum_g) + b_o.
template <int ROWS, int V>
void int8_tile(const QuantizedRows& xr, int64_t r0, int64_t in, const uint8_t* block, const float* bias,
               float* y, int64_t out) {
  constexpr int U = U_OF<V>;
  const int64_t groups = in / GROUP;
  Lanes::Float total[ROWS][U];
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < U; ++u) total[r][u] = Lanes::zeros();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = block + g * GROUP * V * 16;
    Lanes::Int acc[ROWS][U];
    for (int r = 0; r < ROWS; ++r) {  // from -128 x the group's activation sum: the unsigned offset taken out
      const Lanes::Int start = Lanes::broadcast(-128 * xr.sum[(r0 + r) * groups + g]);
      for (int u = 0; u < U; ++u) acc[r][u] = start;
    }
    for (int k = 0; k < GROUP / 4; ++k) {
      Lanes::Int w[U];
      for (int u = 0; u < U; ++u) w[u] = Lanes::load(wg + lanes_at(k, V, u));
      for (int r = 0; r < ROWS; ++r) {
        const Lanes::Int xs = four_bytes(xr.q.data() + (r0 + r) * in + g * GROUP + 4 * k);
        for (int u = 0; u < U; ++u) acc[r][u] = Lanes::dot(acc[r][u], w[u], xs);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const Lanes::Float d = Lanes::floats(xr.scale[(r0 + r) * groups + g]);
      for (int u = 0; u < U; ++u) total[r][u] = Lanes::fmadd(Lanes::to_float(acc[r][u]), d, total[r][u]);
    }
  }
  const float* scales = reinterpret_cast<const float*>(block + in * V * 16);
  for (int u = 0; u < U; ++u) {
    const Lanes::Float s = Lanes::load_floats(scales + Lanes::WIDTH * u);
    const Lanes::Float b = bias ? Lanes::load_floats(bias + Lanes::WIDTH * u) : Lanes::zeros();
    for (int r = 0; r < ROWS; ++r)
      Lanes::store(y + (r0 + r) * out + Lanes::WIDTH * u, Lanes::fmadd(total[r][u], s, b));
  }
}
#endif

// ROWS rows against one int4 block of V x 16 outputs. Block layout: per group, per k (4), per vector v: 16
// outputs x 4 bytes, each byte two inputs, unsigned (q + 8): the low nibble input 4k + b of the group, the
// high one 4k + 16 + b; then the group's float16 scales of the block's outputs. y = sum_g d_g s_og (sum_i
// (q_oi + 8) x_i - 8 sum_g) + b_o. Each group's inputs run in passes of Lanes::PASS vectors of outputs.
template <int ROWS, int V>
void int4_tile(const QuantizedRows& xr, int64_t r0, int64_t in, const uint8_t* block, const float* bias,
               float* y, int64_t out) {
  constexpr int U = U_OF<V>, PASS = std::min(U, Lanes::PASS);
  static_assert(U % PASS == 0, "a block's vectors in whole passes");
  const int64_t groups = in / GROUP, group_bytes = V * 16 * (GROUP / 2 + 2);
  Lanes::Float total[ROWS][U];
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < U; ++u) total[r][u] = Lanes::zeros();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = block + g * group_bytes;
    const int8_t* xg = xr.q.data() + r0 * in + g * GROUP;
    const uint8_t* scale_bytes = wg + V * 16 * GROUP / 2;
    for (int u0 = 0; u0 < U; u0 += PASS) {
      Lanes::Partial acc[ROWS][PASS];
      int32_t start[ROWS];  // -8 x the sum of the group's quantized activations: the offset taken out
      for (int r = 0; r < ROWS; ++r) {
        start[r] = -8 * xr.sum[(r0 + r) * groups + g];
        for (int p = 0; p < PASS; ++p) acc[r][p] = Lanes::partial(start[r]);
      }
      for (int k = 0; k < GROUP / 8; ++k) {
        Lanes::Int low[PASS], high[PASS];
        for (int p = 0; p < PASS; ++p) {
          const Lanes::Int bytes = Lanes::load(wg + lanes_at(k, V, u0 + p));
          low[p] = Lanes::low_nibbles(bytes);
          high[p] = Lanes::high_nibbles(bytes);
        }
        for (int r = 0; r < ROWS; ++r) {
          const Lanes::Int xl = four_bytes(xg + r * in + 4 * k), xh = four_bytes(xg + r * in + 16 + 4 * k);
          for (int p = 0; p < PASS; ++p)
            acc[r][p] = Lanes::add_nibble_products(acc[r][p], low[p], xl, high[p], xh);
        }
      }
      for (int p = 0; p < PASS; ++p) {
        const Lanes::Float s = Lanes::load_halves(scale_bytes + 2 * Lanes::WIDTH * (u0 + p));
        for (int r = 0; r < ROWS; ++r) {
          const Lanes::Float d = Lanes::floats(xr.scale[(r0 + r) * groups + g]);
          total[r][u0 + p] = Lanes::fmadd(Lanes::to_float(Lanes::sums(acc[r][p], start[r])), Lanes::mul(d, s),
                                          total[r][u0 + p]);
        }
      }
    }
  }
  for (int u = 0; u < U; ++u) {
    const Lanes::Float b = bias ? Lanes::load_floats(bias + Lanes::WIDTH * u) : Lanes::zeros();
    for (int r = 0; r < ROWS; ++r)
      Lanes::store(y + (r0 + r) * out + Lanes::WIDTH * u, Lanes::add(total[r][u], b));
  }
}

using DotTile = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, const float*, float*,
                         int64_t);

// A format's tiles: [V - 1][rows - 1].
using DotTiles = std::array<std::array<DotTile, DOT_TILE_ROWS>, 3>;
constexpr auto TILE_ROWS = std::make_integer_sequence<int, DOT_TILE_ROWS>();
template <int V, int... ROWS>
constexpr std::array<DotTile, DOT_TILE_ROWS> int4_tiles(std::integer_sequence<int, ROWS...>) {
  return {int4_tile<ROWS + 1, V>...};
}
constexpr DotTiles INT4_TILES = {int4_tiles<1>(TILE_ROWS), int4_tiles<2>(TILE_ROWS),
                                 int4_tiles<3>(TILE_ROWS)};
#if INT8_DOTS_BUILT
template <int V, int... ROWS>
constexpr std::array<DotTile, DOT_TILE_ROWS> int8_tiles(std::integer_sequence<int, ROWS...>) {
  return {int8_tile<ROWS + 1, V>...};
}
constexpr DotTiles INT8_TILES = {int8_tiles<1>(TILE_ROWS), int8_tiles<2>(TILE_ROWS),
                                 int8_tiles<3>(TILE_ROWS)};
#endif

// Bytes of a packed block `width` outputs wide: int8, a byte a weight and a float32 scale an output; int4,
// half a byte a weight and a float16 scale per output and group.
int64_t block_bytes(int bits, int64_t in, int64_t width) {
  return bits == 8 ? width * (in + 4) : width * (in / 2 + in / GROUP * 2);
}

// W's rows in blocks of DOT_BLOCK outputs (the last one narrower), each block's bytes from `block(begin,
// width)`, flattened into one uint8 tensor (O, bytes per output).
template <typename Block>
at::Tensor in_dot_blocks(int64_t out, int64_t per_output, Block block) {
  std::vector<at::Tensor> parts;
  for (int64_t begin = 0; begin < out; begin += DOT_BLOCK)
    parts.push_back(block(begin, std::min(DOT_BLOCK, out - begin)));
  return torch::cat(parts).view({out, per_output});
}

}  // namespace

#if INT8_DOTS_BUILT
torch::Tensor pack_weight_dot_int8(const torch::Tensor& q, const torch::Tensor& scales) {
  const int64_t out = q.size(0), in = q.size(1);
  const at::Tensor unsigned_q = (q.to(at::kInt) + 128).to(at::kByte);
  return in_dot_blocks(out, in + 4, [&](int64_t begin, int64_t width) {
    const at::Tensor weights = unsigned_q.slice(0, begin, begin + width)
                                   .reshape({width / 16, 16, in / GROUP, GROUP / 4, 4})
                                   .permute({2, 3, 0, 1, 4})
                                   .flatten();
    return torch::cat({weights, scales.slice(0, begin, begin + width).contiguous().view(at::kByte)});
  });
}
#endif

torch::Tensor pack_weight_dot_int4(const torch::Tensor& q, const torch::Tensor& scales) {
  const int64_t out = q.size(0), in = q.size(1), groups = in / GROUP;
  const at::Tensor unsigned_q = (q.to(at::kInt) + 8).to(at::kByte);
  const at::Tensor half_scales = scales.to(at::kHalf);
  return in_dot_blocks(out, in / 2 + groups * 2, [&](int64_t begin, int64_t width) {
    // (V, 16, G, half h, k, byte b) -> (G, k, V, 16, b, h): byte = low | high << 4
    const at::Tensor nibbles = unsigned_q.slice(0, begin, begin + width)
                                   .reshape({width / 16, 16, groups, 2, 4, 4})
                                   .permute({2, 4, 0, 1, 5, 3});
    const at::Tensor bytes = nibbles.select(5, 0) + nibbles.select(5, 1) * 16;
    const at::Tensor group_scales =
        half_scales.slice(0, begin, begin + width).t().contiguous().view(at::kByte);
    return torch::cat({bytes.reshape({groups, -1}), group_scales.view({groups, -1})}, 1).flatten();
  });
}

// x W^T + b for a weight packed by pack_weight_dot_int8 (bits 8, AVX-512 VNNI) or pack_weight_dot_int4 (bits
// 4): x (N, I) float32 quantized per group of 32, each thread taking whole blocks, every row tile through a
// block while it sits in cache.
torch::Tensor product_on_integer_dots(const torch::Tensor& x, const torch::Tensor& packed,
                                      const torch::Tensor& bias, int bits) {
  const int64_t rows = x.size(0), in = x.size(1), out = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
  const QuantizedRows xr = quantize_rows(x.data_ptr<float>(), rows, in);
  const uint8_t* w_p = packed.data_ptr<uint8_t>();
  const float* b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* y_p = y.data_ptr<float>();
#if INT8_DOTS_BUILT
  const DotTiles& tiles = bits == 8 ? INT8_TILES : INT4_TILES;
#else
  TORCH_CHECK(bits == 4, "int8 weights in the integer dots' layout need avx512_vnni");
  const DotTiles& tiles = INT4_TILES;
#endif
  each_block(out, DOT_BLOCK, [&](int64_t begin, int64_t width, bool) {
    const uint8_t* block = w_p + block_bytes(bits, in, DOT_BLOCK) * (begin / DOT_BLOCK);
    const auto& by_rows = tiles[width / 16 - 1];
    for (int64_t r = 0; r < rows; r += DOT_TILE_ROWS)
      by_rows[std::min(DOT_TILE_ROWS, rows - r) - 1](xr, r, in, block, b_p ? b_p + begin : nullptr,
                                                     y_p + begin, out);
  });
  return y;
}

#endif
