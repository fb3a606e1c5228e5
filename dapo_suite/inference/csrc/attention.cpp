// `attend`: RoPE of q and k, the step's k and v written into the cache, and grouped-query attention over each
// row's valid cache positions, in bf16 (avx512_bf16 pair products) and float32 (the build's widest vectors).
#include "kernels.h"

namespace {

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

// The softmax's numerators in place, e^(s - max s) over scores[0, count), kept unnormalised; returns their
// total (the weighted sums are divided by it at the end).
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

// The tensors of one `attend` call, as pointers and sizes (see `attend`): queries and outputs in T, the
// cache in C (T, or bf16 under float32 queries).
template <typename T, typename C = T>
struct Queries {
  const T* qkv;
  const float *cos, *sin;
  const int64_t *rows, *slots;
  C *cache_k, *cache_v;
  const int64_t* cache_start;
  const C *prompt_k, *prompt_v;
  const int64_t *prompt_start, *row_prompt;
  T* out;
  int64_t count, heads, kv_heads, cache_slots, prompts, prompt_len;
  float scale;
};

// Query n's key and value for head h, rotated and stored at its cache row and slot.
template <int64_t DIM, typename T, typename C>
void store_key_value(const Queries<T, C>& qs, int64_t n, int64_t h) {
  const T* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  float k[DIM];
  rotate(row + (qs.heads + h) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, k);
  const int64_t at = ((qs.rows[n] * qs.kv_heads + h) * qs.cache_slots + qs.slots[n]) * DIM;
  const T* v = row + (qs.heads + qs.kv_heads + h) * DIM;
  for (int64_t d = 0; d < DIM; ++d) {
    qs.cache_k[at + d] = C(k[d]);
    qs.cache_v[at + d] = C(float(v[d]));
  }
}

// Every query's key and value written first (a prompt's queries, in a prefill, attend to each other's), then
// each (query, key/value head) pair through `head(n, h)`; `make_head(span)` gives each thread its own, with
// scratch for `span` scores per query head.
template <int64_t DIM, typename T, typename C, typename MakeHead>
void attend_all(const Queries<T, C>& qs, MakeHead make_head) {
  const int64_t pairs = qs.count * qs.kv_heads;
  at::parallel_for(0, pairs, 16, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) store_key_value<DIM>(qs, i / qs.kv_heads, i % qs.kv_heads);
  });
  const int64_t span = qs.prompt_len + *std::max_element(qs.slots, qs.slots + qs.count) + 1;
  // Pairs are handed out one at a time (their lengths differ: left padding, and a prompt's later tokens see
  // more keys), not in fixed halves, where one thread would wait on the other.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), pairs);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    auto head = make_head(span);
    for (int64_t i = next++; i < pairs; i = next++) head(i / qs.kv_heads, i % qs.kv_heads);
  });
}

namespace {

// Two-source shuffles of float32 vectors with constant lane indices (GCC 12+ and Clang:
// __builtin_shufflevector; older GCC: __builtin_shuffle with a constant mask), which the compiler maps to the
// target's permutes.
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE_FLOATS(u, v, ...) __builtin_shufflevector(u, v, __VA_ARGS__)
#else
typedef int32_t LaneIndices __attribute__((vector_size(F32_LANES * sizeof(int32_t))));
#define SHUFFLE_FLOATS(u, v, ...) __builtin_shuffle(u, v, (LaneIndices){__VA_ARGS__})
#endif

// Lane i of a halving shuffle of u and v, vectors of blocks of `width` lanes (each block a partial sum of one
// source): the result holds u's blocks then v's at half the width, the first (`high` false) or second half of
// each.
constexpr int half_lane(int64_t width, bool high, int64_t i) {
  const int64_t half = width / 2, block = i / half, blocks = F32_LANES / width;
  const int64_t from = block < blocks ? block * width : F32_LANES + (block - blocks) * width;
  return int(from + (high ? half : 0) + i % half);
}

template <int64_t WIDTH, size_t... I>
inline Floats add_halves(Floats u, Floats v, std::index_sequence<I...>) {
  return SHUFFLE_FLOATS(u, v, half_lane(WIDTH, false, I)...) +
         SHUFFLE_FLOATS(u, v, half_lane(WIDTH, true, I)...);
}

// The totals of F32_LANES vectors as one vector (lane j: the sum of a[j]'s lanes; a[] is overwritten): rounds
// that pair the vectors and add the halves of their blocks, ~3 instructions per vector where a horizontal sum
// of each takes ~2 log2(lanes). Lanes are added in a horizontal sum's order (halves, then quarters, ...), so
// the totals are bit for bit those of one dot product at a time.
template <int64_t WIDTH = F32_LANES>
inline Floats sum_each(Floats* a) {
  for (int64_t j = 0; j < WIDTH / 2; ++j)
    a[j] = add_halves<WIDTH>(a[2 * j], a[2 * j + 1], std::make_index_sequence<F32_LANES>());
  if constexpr (WIDTH > 2)
    return sum_each<WIDTH / 2>(a);
  else
    return a[0];
}

inline Floats load_floats(const float* at) { return *reinterpret_cast<const UnalignedFloats*>(at); }

// F32_LANES bf16 at `at` as float32, exactly: each one's 16 bits become a float's high half (zero-extend,
// shift; two instructions on AVX2 and AVX-512, no bf16 instructions needed).
inline Floats load_floats(const BFloat16* at) {
  typedef uint16_t Halves __attribute__((vector_size(F32_LANES * sizeof(uint16_t)), aligned(2)));
  typedef uint32_t Words __attribute__((vector_size(F32_LANES * sizeof(uint32_t))));
  return (Floats)(__builtin_convertvector(*reinterpret_cast<const Halves*>(at), Words) << 16);
}

// How many query heads' weighted sums the attention keeps in registers at once: three quarters of the
// register file (DIM / F32_LANES vectors per head, in float32 and in bf16's unpacked pairs alike).
template <int64_t DIM>
constexpr int HEADS_IN_REGISTERS = int(std::max<int64_t>(1, F32_REGISTERS * 3 / 4 / (DIM / F32_LANES)));

// The weighted sums of all `fold` query heads, sizeof...(F) at a time through Span<DIM, k>::run (k heads;
// each group re-reads the values, from cache after the first). weights (fold x stride), sums (fold x DIM).
template <int64_t DIM, template <int64_t, int> class Span, typename W, typename C, int... F>
void accumulate_heads(const W* weights, int64_t fold, int64_t stride, const C* values, int64_t begin,
                      int64_t end, float* sums, std::integer_sequence<int, F...>) {
  using Run = void (*)(const W*, int64_t, const C*, int64_t, int64_t, float*);
  static constexpr Run spans[] = {Span<DIM, F + 1>::run...};  // spans[k - 1]: k heads
  constexpr int64_t most = sizeof...(F);
  for (int64_t f = 0; f < fold; f += most)
    spans[std::min(most, fold - f) - 1](weights + f * stride, stride, values, begin, end, sums + f * DIM);
}

}  // namespace

// What a precision of `attend_head` names: its element type, its cache's, whether it rounds the query and the
// weights to its element type (then `AttendScratch` keeps rounded copies), and its weighted sum
// (`accumulate_heads`'s Span).
template <typename Element, template <int64_t, int> class Span, typename Cache = Element>
struct Precision {
  using T = Element;
  using C = Cache;
  static constexpr bool ROUNDED = !std::is_same<Element, float>::value;
  template <int64_t DIM, int F>
  using Accumulate = Span<DIM, F>;
};

// ---- bf16 (avx512_bf16 pair dot products; NATIVE_BF16 in kernels.h)
// ---------------------------------------------
#if defined(__AVX512BF16__)
static_assert(F32_LANES == 16, "avx512_bf16 implies AVX-512F: `sum_each` totals 16 vectors of 16 floats");

namespace {

// Scores of `fold` queries (fold x DIM, bf16) against positions [begin, end) of one head's keys (T x DIM,
// bf16), scale (q . k) written to scores[f * stride + t - begin]: bf16 pair products summed in float32
// (avx512_bf16), sixteen positions at a time. The same positions' values are prefetched meanwhile: the cache
// streams from memory, and two threads reading one stream each wait on memory (well below a copy's
// bandwidth); with the values in flight beside the keys, the weighted sum that follows reads them from cache.
template <int64_t DIM>
void score_span(const BFloat16* q, int64_t fold, const BFloat16* keys, const BFloat16* values, int64_t begin,
                int64_t end, float scale, float* scores, int64_t stride) {
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
          dots[j] =
              _mm512_dpbf16_ps(dots[j], (__m512bh)_mm512_loadu_si512(keys + (t + j) * DIM + 32 * c), qs[c]);
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

// sums[f] += sum_t w[f][t - begin] v[t] over positions [begin, end) for F query heads, whose sums stay in
// vector registers while the values stream by; two positions per bf16 pair product: the two values
// interleaved (unpack), the two weights one 32-bit pair. weights (F x stride) bf16; sums (F x DIM) float32 in
// the unpack's order: block 8k + i of 32 dims sits at lane 4k + i (i < 4) of its low vector, 8k + 4 + i at
// lane 4k + i of its high one
// (`Bf16Attention::write` puts it back in order).
template <int64_t DIM, int F>
struct AccumulateSpanBF16 {
  static void run(const BFloat16* weights, int64_t stride, const BFloat16* values, int64_t begin, int64_t end,
                  float* sums) {
    constexpr int64_t chunks = DIM / 32;
    __m512 acc[F][2 * chunks];
    for (int f = 0; f < F; ++f)
      for (int64_t c = 0; c < 2 * chunks; ++c) acc[f][c] = _mm512_loadu_ps(sums + f * DIM + 16 * c);
    auto add = [&](int64_t t,
                   auto pair) {  // positions t, t + 1; an odd last one pairs with itself at weight zero
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

// bf16: the query is rounded to bf16 after RoPE and the softmax weights before the weighted sum, as the
// trainer's bf16 attention (autocast SDPA) does; scores, the softmax and the sums stay float32. The sums come
// out in the pair products' lane order and are put back in order as they are written.
struct Bf16Attention : Precision<BFloat16, AccumulateSpanBF16> {
  // The rotated queries as the scores read them, rounded to nearest even (as BFloat16(float)).
  template <typename Scratch>
  static const T* query(Scratch& s, int64_t size) {
    for (int64_t i = 0; i < size; i += 16)
      _mm256_storeu_si256((__m256i*)(s.q_rounded.data() + i),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(&s.q[i])));
    return s.q_rounded.data();
  }

  // The softmax's numerators of the fold's heads (`count` a head, `span` apart) as the weighted sum reads
  // them.
  template <typename Scratch>
  static const T* weights(Scratch& s, int64_t fold, int64_t count, int64_t span) {
    for (int64_t f = 0; f < fold; ++f) {
      const float* row_scores = s.scores.data() + f * span;
      BFloat16* w = s.weights.data() + f * span;
      int64_t t = 0;
      for (; t + 16 <= count; t += 16)
        _mm256_storeu_si256((__m256i*)(w + t), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row_scores + t)));
      for (; t < count; ++t) w[t] = BFloat16(row_scores[t]);
    }
    return s.weights.data();
  }

  // out[f] = sums[f] / totals[f], rounded to bf16, dimension 8k + i from lane 4k + i of a 32-dim block's low
  // vector and 8k + 4 + i from its high one (`AccumulateSpanBF16`'s order).
  template <int64_t DIM>
  static void write(T* out, const float* sums, const float* totals, int64_t fold) {
    constexpr int64_t chunks = DIM / 32;
    const __m512i in_order[2] = {
        _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31)};
    for (int64_t f = 0; f < fold; ++f) {
      const __m512 scales = _mm512_set1_ps(1.f / totals[f]);
      for (int64_t c = 0; c < chunks; ++c) {
        const float *low = sums + f * DIM + 32 * c, *high = low + 16;
        BFloat16* o = out + f * DIM + 32 * c;
        for (int half = 0; half < 2;
             ++half) {  // dims 16 half + [0, 16): blocks of 4 from low, high, low, high
          const __m512 dims =
              _mm512_permutex2var_ps(_mm512_loadu_ps(low), in_order[half], _mm512_loadu_ps(high));
          _mm256_storeu_si256((__m256i*)(o + 16 * half),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(dims, scales)));
        }
      }
    }
  }
};

}  // namespace
#endif

// ---- float32 kernels, on every CPU
// -----------------------------------------------------------------------------
namespace {

// Scores of `fold` query heads (fold x DIM) against positions [begin, end) of one head's keys (T x DIM),
// scale (q . k) written to scores[f * stride + t - begin]: F32_LANES positions at a time, each a vector of
// partial products, totalled together by `sum_each` (faster than one position at a time from L2; from memory
// both run at one core's read bandwidth). The next block's keys and this block's values (read next, by the
// weighted sum) are prefetched meanwhile.
template <int64_t DIM, typename C>
void score_span(const float* q, int64_t fold, const C* keys, const C* values, int64_t begin, int64_t end,
                float scale, float* scores, int64_t stride) {
  constexpr int64_t V = DIM / F32_LANES, line = PER_LINE<C>;
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
        const C* k = keys + (t + j) * DIM;
        dots[j] = qv[0] * load_floats(k);
        for (int64_t c = 1; c < V; ++c) dots[j] += qv[c] * load_floats(k + c * F32_LANES);
      }
      *reinterpret_cast<UnalignedFloats*>(scores + f * stride + t - begin) = sum_each(dots) * scale;
    }
  }
  for (; t < end; ++t)
    for (int64_t f = 0; f < fold; ++f) {
      float dot = 0.f;
      for (int64_t d = 0; d < DIM; ++d)
        dot += q[f * DIM + d] * float(keys[t * DIM + d]);  // vectorised (-ffast-math)
      scores[f * stride + t - begin] = dot * scale;
    }
}

// sums[f] += sum_t w[f][t - begin] v[t] over positions [begin, end) for F query heads, whose F x DIM sums
// stay in vector registers while the values (C: float32, or bf16 read as float32) stream by. weights
// (F x stride), sums (F x DIM).
template <typename C>
struct AccumulateF32 {
  template <int64_t DIM, int F>
  struct Span {
    static void run(const float* weights, int64_t stride, const C* values, int64_t begin, int64_t end,
                    float* sums) {
      constexpr int64_t V = DIM / F32_LANES;
      Floats acc[F][V];
      for (int f = 0; f < F; ++f)
        for (int64_t c = 0; c < V; ++c) acc[f][c] = load_floats(sums + f * DIM + c * F32_LANES);
      for (int64_t t = begin; t < end; ++t) {
        const C* v = values + t * DIM;
        for (int f = 0; f < F; ++f) {
          const float w = weights[f * stride + t - begin];
          for (int64_t c = 0; c < V; ++c) acc[f][c] += load_floats(v + c * F32_LANES) * w;
        }
      }
      for (int f = 0; f < F; ++f)
        for (int64_t c = 0; c < V; ++c)
          *reinterpret_cast<UnalignedFloats*>(sums + f * DIM + c * F32_LANES) = acc[f][c];
    }
  };
};

// float32: everything in float32; the weights are the softmax's numerators themselves. The cache in float32,
// or in bf16 (`kv_cache_dtype`: half the bytes a decode step reads; each key and value rounded once, as
// stored, and read back exactly).
template <typename Cache>
struct F32Attention : Precision<float, AccumulateF32<Cache>::template Span, Cache> {
  using T = float;

  template <typename Scratch>
  static const T* query(Scratch& s, int64_t) {
    return s.q.data();
  }

  template <typename Scratch>
  static const T* weights(Scratch& s, int64_t, int64_t, int64_t) {
    return s.scores.data();
  }

  template <int64_t DIM>
  static void write(T* out, const float* sums, const float* totals, int64_t fold) {
    for (int64_t f = 0; f < fold; ++f)
      for (int64_t d = 0; d < DIM; ++d) out[f * DIM + d] = sums[f * DIM + d] / totals[f];
  }
};

}  // namespace

// One thread's scratch for `attend_head`: the rotated queries, the scores (then the softmax's numerators) and
// the weighted sums in float32, and, where the precision rounds them (bf16), the queries and weights rounded.
template <typename P>
struct AttendScratch {
  std::vector<float> q, scores, sums;
  std::vector<typename P::T> q_rounded, weights;
  AttendScratch(int64_t fold, int64_t dim, int64_t span)
      : q(fold * dim),
        scores(fold * span),
        sums(fold * dim),
        q_rounded(P::ROUNDED ? fold * dim : 0),
        weights(P::ROUNDED ? fold * span : 0) {}
};

// Query n's `fold` query heads of key/value head h attend to its row's valid positions: the shared prompt's
// [prompt_start, T) when there is one, then the row's own [cache_start, slot], in precision P
// (`Bf16Attention`, `F32Attention`): scores, e^(s - max) kept unnormalised, the weighted sum of the values,
// divided by the softmax's total at the end. Each key is read once for the fold's query heads (decode
// attention is bound by reading the cache).
template <int64_t DIM, typename P>
void attend_head(const Queries<typename P::T, typename P::C>& qs, int64_t n, int64_t h, AttendScratch<P>& s,
                 int64_t span) {
  using T = typename P::T;
  using C = typename P::C;
  const int64_t fold = qs.heads / qs.kv_heads, b = qs.rows[n], slot = qs.slots[n];
  const T* row = qs.qkv + n * (qs.heads + 2 * qs.kv_heads) * DIM;
  for (int64_t f = 0; f < fold; ++f)
    rotate(row + (h * fold + f) * DIM, qs.cos + n * DIM, qs.sin + n * DIM, DIM, s.q.data() + f * DIM);
  const T* q = P::query(s, fold * DIM);
  float* scores = s.scores.data();
  int64_t shared = 0, p_begin = 0;
  const C *pk = nullptr, *pv = nullptr;
  if (qs.prompts) {
    const int64_t p = qs.row_prompt[b], base = (p * qs.kv_heads + h) * qs.prompt_len * DIM;
    pk = qs.prompt_k + base, pv = qs.prompt_v + base, p_begin = qs.prompt_start[p];
    shared = qs.prompt_len - p_begin;
    score_span<DIM>(q, fold, pk, pv, p_begin, qs.prompt_len, qs.scale, scores, span);
  }
  const int64_t cache = (b * qs.kv_heads + h) * qs.cache_slots * DIM, o_begin = qs.cache_start[b];
  const int64_t count = shared + slot + 1 - o_begin;
  score_span<DIM>(q, fold, qs.cache_k + cache, qs.cache_v + cache, o_begin, slot + 1, qs.scale,
                  scores + shared, span);
  float totals[16];  // fold <= 16 (checked by `attend`)
  for (int64_t f = 0; f < fold; ++f) totals[f] = exp_minus_max(scores + f * span, count);
  const T* weights = P::weights(s, fold, count, span);
  float* sums = s.sums.data();
  std::fill(sums, sums + fold * DIM, 0.f);
  const auto groups = std::make_integer_sequence<int, HEADS_IN_REGISTERS<DIM>>();
  if (qs.prompts)
    accumulate_heads<DIM, P::template Accumulate>(weights, fold, span, pv, p_begin, qs.prompt_len, sums,
                                                  groups);
  accumulate_heads<DIM, P::template Accumulate>(weights + shared, fold, span, qs.cache_v + cache, o_begin,
                                                slot + 1, sums, groups);
  P::template write<DIM>(qs.out + (n * qs.heads + h * fold) * DIM, sums, totals, fold);
}

// Grouped-query softmax attention (Vaswani et al. 2017, arXiv 1706.03762) of N queries, with RoPE and the
// cache write: out = softmax(scale RoPE(q) K^T) V over each query's valid positions.
//   qkv (N, (H + 2 H_kv) D), the queries' projections, bf16 or float32; cos, sin (N, D) float32 at their
//   positions;
//   rows, slots (N,): each query's cache row and slot. Its rotated k and v are written there, and it attends
//   to its row's [cache_start[row], slot] (left padding is skipped, not masked). A decode step has one query
//   per row; a prompt pass has one per prompt token, which see each other's keys (they are all written
//   first). cache_k, cache_v (R, H_kv, S, D). prompt_k, prompt_v (P, H_kv, T, D) and prompt_start (P,): a
//   prompt cache shared by the rows of a group (row r reads prompt row_prompt[r], positions [prompt_start,
//   T), before its own); empty when rows hold their prompts. The cache in qkv's dtype, or bf16 under float32
//   queries (computed in float32 over the keys and values as stored: any CPU).
// Returns (N, H D) in qkv's dtype, heads in q's order. bf16 queries need avx512_bf16 (NATIVE_BF16).
torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor rows,
                     torch::Tensor slots, torch::Tensor cache_k, torch::Tensor cache_v,
                     torch::Tensor cache_start, torch::Tensor prompt_k, torch::Tensor prompt_v,
                     torch::Tensor prompt_start, torch::Tensor row_prompt, int64_t heads, double scale) {
  const auto dtype = qkv.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && qkv.is_contiguous(),
              "qkv: contiguous bfloat16 or float32");
  const auto cache_dtype = cache_k.scalar_type();
  TORCH_CHECK((cache_dtype == dtype || cache_dtype == at::kBFloat16) &&
                  cache_v.scalar_type() == cache_dtype &&
                  (!prompt_k.numel() || prompt_k.scalar_type() == cache_dtype),
              "cache: qkv's dtype or bfloat16, keys, values and prompt alike");
  TORCH_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous(), "cache: contiguous");
  TORCH_CHECK(rows.numel() == qkv.size(0) && slots.numel() == qkv.size(0), "rows, slots: one per query");
  const int64_t dim = cache_k.size(3), prompts = prompt_k.numel() ? prompt_k.size(0) : 0;
  TORCH_CHECK(dim == 64 || dim == 128, "attend: head dim ", dim, " (compiled for 64 and 128)");
  TORCH_CHECK(heads % cache_k.size(1) == 0 && heads / cache_k.size(1) <= 16,
              "attend: at most 16 query heads per "
              "key/value head");
  auto out = torch::empty({qkv.size(0), heads * dim}, qkv.options());
  if (qkv.size(0) == 0) return out;
  const int64_t fold = heads / cache_k.size(1);
  auto run = [&](auto precision) {
    using P = decltype(precision);
    using T = typename P::T;
    using C = typename P::C;
    Queries<T, C> qs{qkv.data_ptr<T>(),
                     cos.data_ptr<float>(),
                     sin.data_ptr<float>(),
                     rows.data_ptr<int64_t>(),
                     slots.data_ptr<int64_t>(),
                     cache_k.data_ptr<C>(),
                     cache_v.data_ptr<C>(),
                     cache_start.data_ptr<int64_t>(),
                     prompts ? prompt_k.data_ptr<C>() : nullptr,
                     prompts ? prompt_v.data_ptr<C>() : nullptr,
                     prompts ? prompt_start.data_ptr<int64_t>() : nullptr,
                     prompts ? row_prompt.data_ptr<int64_t>() : nullptr,
                     out.data_ptr<T>(),
                     qkv.size(0),
                     heads,
                     cache_k.size(1),
                     cache_k.size(2),
                     prompts,
                     prompts ? prompt_k.size(2) : 0,
                     float(scale)};
    auto make_head = [&qs, fold](auto dim_constant) {  // each thread's head(n, h), with its own scratch
      constexpr int64_t DIM = decltype(dim_constant)::value;
      return [&qs, fold](int64_t span) {
        return [&qs, span, s = AttendScratch<P>(fold, DIM, span)](int64_t n, int64_t h) mutable {
          attend_head<DIM, P>(qs, n, h, s, span);
        };
      };
    };
    if (dim == 64)
      attend_all<64>(qs, make_head(std::integral_constant<int64_t, 64>()));
    else
      attend_all<128>(qs, make_head(std::integral_constant<int64_t, 128>()));
  };
  if (dtype == at::kFloat) {
    if (cache_dtype == at::kFloat)
      run(F32Attention<float>());
    else
      run(F32Attention<BFloat16>());
    return out;
  }
#if defined(__AVX512BF16__)
  run(Bf16Attention());
#else
  TORCH_CHECK(false, "attend in bfloat16: built without avx512_bf16 (NATIVE_BF16 is false)");
#endif
  return out;
}
