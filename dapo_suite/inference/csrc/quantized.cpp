// `linear` on quantized rollout weights by integer dot products (AVX-512 VNNI): int8 per output channel
// (`pack_weight_int8`) and int4 in groups of 32 inputs (`pack_weight_int4`), the activations quantized to
// int8 per group of 32 as they enter, as llama.cpp's Q8_0 x Q8_0 and Q4_0 x Q8_0 dot products do.
//
// One `vpdpbusd` multiplies 64 unsigned weight bytes by 64 signed activation bytes and adds them in fours
// into 16 int32 sums: 64 multiply-adds, where the widened float32 tile (linear.cpp) makes 16 with three
// instructions. The weights are stored unsigned (int8 q + 128, int4 q + 8), so each group's sum carries its
// offset times the sum of the group's quantized activations, which its int32 sum starts from negated. Both
// sides round only where they are quantized: each group's sum is exact in int32, then scaled in float32.
#include "kernels.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__F16C__)

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

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t in) {
  const int64_t groups = in / GROUP;
  QuantizedRows out{std::vector<int8_t>(rows * in), std::vector<float>(rows * groups),
                    std::vector<int32_t>(rows * groups)};
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k = r * groups + g;
      const float* xg = x + r * in + g * GROUP;
      const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
      const float most =
          _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, a), _mm512_andnot_ps(sign, b)));
      const float inverse = most > 0 ? 127.0f / most : 0.0f;
      // round to nearest (even), as torch.round
      const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inverse)));
      const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inverse)));
      _mm_storeu_si128((__m128i*)(out.q.data() + r * in + g * GROUP), _mm512_cvtsepi32_epi8(qa));
      _mm_storeu_si128((__m128i*)(out.q.data() + r * in + g * GROUP + 16), _mm512_cvtsepi32_epi8(qb));
      out.scale[k] = most / 127.0f;
      out.sum[k] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    }
  }
  return out;
}

// Four activation bytes of one row, the same in all 16 lanes.
inline __m512i four_bytes(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

// Each group's int32 sums start at -offset x the sum of the row's quantized activations in the group: the
// unsigned weights' offset taken out exactly.
template <int ROWS, int V>
inline void start_sums(__m512i (&acc)[ROWS][V], const QuantizedRows& xr, int64_t r0, int64_t g,
                       int64_t groups, int32_t offset) {
  for (int r = 0; r < ROWS; ++r) {
    const __m512i start = _mm512_set1_epi32(-offset * xr.sum[(r0 + r) * groups + g]);
    for (int v = 0; v < V; ++v) acc[r][v] = start;
  }
}

// ROWS rows (first row `r0` of xr) against one int8 block of V x 16 outputs. Block layout: per group, per
// quad of inputs k (8), per vector v: 16 outputs x 4 inputs, unsigned (q + 128); then the block's float32
// scales per output. y = s_o sum_g d_g (sum_i (q_oi + 128) x_i - 128 sum_g) + b_o.
template <int ROWS, int V>
void int8_tile(const QuantizedRows& xr, int64_t r0, int64_t in, const uint8_t* block, const float* bias,
               float* y, int64_t out) {
  const int64_t groups = in / GROUP;
  __m512 total[ROWS][V];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) total[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = block + g * GROUP * V * 16;
    __m512i acc[ROWS][V];
    start_sums<ROWS, V>(acc, xr, r0, g, groups, 128);
    for (int k = 0; k < GROUP / 4; ++k) {
      __m512i w[V];
      for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_si512(wg + (k * V + v) * 64);
      for (int r = 0; r < ROWS; ++r) {
        const __m512i xs = four_bytes(xr.q.data() + (r0 + r) * in + g * GROUP + 4 * k);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], w[v], xs);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const __m512 d = _mm512_set1_ps(xr.scale[(r0 + r) * groups + g]);
      for (int v = 0; v < V; ++v)
        total[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), d, total[r][v]);
    }
  }
  const float* scales = reinterpret_cast<const float*>(block + in * V * 16);
  for (int v = 0; v < V; ++v) {
    const __m512 s = _mm512_loadu_ps(scales + 16 * v);
    const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < ROWS; ++r)
      _mm512_storeu_ps(y + (r0 + r) * out + 16 * v, _mm512_fmadd_ps(total[r][v], s, b));
  }
}

// ROWS rows against one int4 block of V x 16 outputs. Block layout: per group, per k (4), per vector v: 16
// outputs x 4 bytes, each byte two inputs, unsigned (q + 8): the low nibble input 4k + b of the group, the
// high one 4k + 16 + b; then the group's float16 scales of the block's outputs. y = sum_g d_g s_og (sum_i
// (q_oi + 8) x_i - 8 sum_g) + b_o.
template <int ROWS, int V>
void int4_tile(const QuantizedRows& xr, int64_t r0, int64_t in, const uint8_t* block, const float* bias,
               float* y, int64_t out) {
  const int64_t groups = in / GROUP, group_bytes = V * 16 * (GROUP / 2 + 2);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 total[ROWS][V];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) total[r][v] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = block + g * group_bytes;
    __m512i acc[ROWS][V];
    start_sums<ROWS, V>(acc, xr, r0, g, groups, 8);
    for (int k = 0; k < GROUP / 8; ++k) {
      __m512i low[V], high[V];
      for (int v = 0; v < V; ++v) {
        const __m512i bytes = _mm512_loadu_si512(wg + (k * V + v) * 64);
        low[v] = _mm512_and_si512(bytes, nibble);
        high[v] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
      }
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* xg = xr.q.data() + (r0 + r) * in + g * GROUP;
        const __m512i xl = four_bytes(xg + 4 * k), xh = four_bytes(xg + 16 + 4 * k);
        for (int v = 0; v < V; ++v)
          acc[r][v] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r][v], low[v], xl), high[v], xh);
      }
    }
    const uint8_t* scale_bytes = wg + V * 16 * GROUP / 2;
    __m512 s[V];
    for (int v = 0; v < V; ++v)
      s[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(scale_bytes + 32 * v)));
    for (int r = 0; r < ROWS; ++r) {
      const __m512 d = _mm512_set1_ps(xr.scale[(r0 + r) * groups + g]);
      for (int v = 0; v < V; ++v)
        total[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_mul_ps(d, s[v]), total[r][v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < ROWS; ++r)
      _mm512_storeu_ps(y + (r0 + r) * out + 16 * v, _mm512_add_ps(total[r][v], b));
  }
}

using DotTile = void (*)(const QuantizedRows&, int64_t, int64_t, const uint8_t*, const float*, float*,
                         int64_t);

// tiles[bits == 4][V - 1][rows - 1]
template <int V, int... ROWS>
constexpr std::array<DotTile, DOT_TILE_ROWS> int8_tiles(std::integer_sequence<int, ROWS...>) {
  return {int8_tile<ROWS + 1, V>...};
}
template <int V, int... ROWS>
constexpr std::array<DotTile, DOT_TILE_ROWS> int4_tiles(std::integer_sequence<int, ROWS...>) {
  return {int4_tile<ROWS + 1, V>...};
}
constexpr auto TILE_ROWS = std::make_integer_sequence<int, DOT_TILE_ROWS>();
constexpr std::array<DotTile, DOT_TILE_ROWS> DOT_TILES[2][3] = {
    {int8_tiles<1>(TILE_ROWS), int8_tiles<2>(TILE_ROWS), int8_tiles<3>(TILE_ROWS)},
    {int4_tiles<1>(TILE_ROWS), int4_tiles<2>(TILE_ROWS), int4_tiles<3>(TILE_ROWS)}};

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

// x W^T + b for a weight packed by pack_weight_dot_int8 (bits 8) or pack_weight_dot_int4 (bits 4): x (N, I)
// float32 quantized per group of 32, each thread taking whole blocks, every row tile through a block while it
// sits in cache.
torch::Tensor product_on_integer_dots(const torch::Tensor& x, const torch::Tensor& packed,
                                      const torch::Tensor& bias, int bits) {
  const int64_t rows = x.size(0), in = x.size(1), out = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
  const QuantizedRows xr = quantize_rows(x.data_ptr<float>(), rows, in);
  const uint8_t* w_p = packed.data_ptr<uint8_t>();
  const float* b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* y_p = y.data_ptr<float>();
  const auto& tiles = DOT_TILES[bits == 4];
  at::parallel_for(0, (out + DOT_BLOCK - 1) / DOT_BLOCK, 1, [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j) {
      const int64_t begin = j * DOT_BLOCK, width = std::min(DOT_BLOCK, out - begin);
      const uint8_t* block = w_p + block_bytes(bits, in, DOT_BLOCK) * j;
      const auto& by_rows = tiles[width / 16 - 1];
      for (int64_t r = 0; r < rows; r += DOT_TILE_ROWS)
        by_rows[std::min(DOT_TILE_ROWS, rows - r) - 1](xr, r, in, block, b_p ? b_p + begin : nullptr,
                                                       y_p + begin, out);
    }
  });
  return y;
}

#endif
