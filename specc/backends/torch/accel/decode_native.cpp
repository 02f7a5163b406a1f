// specc's native decoding step: one token through a decoder's whole layer graph in one call, fp32, batch 1.
//
// A decoding step is a chain of one-row GEMVs with small vector ops between them. Run op by op from Python,
// those small ops (norms, activations, adds, cache writes, SDPA on one query, and the dispatch around each)
// cost a quarter of the step and leave the memory idle while they run. Here the step is a program of ops
// (decode_native.py lowers the layer graph to it) run inside one OpenMP region: the linears split their rows
// over the threads (native_gemv.h), attention splits its heads, and the small ops run on one thread, with one
// barrier after each op. The KV cache is the model's own (KVCache tensors), so eager and native steps mix.
#include <omp.h>

#include <cmath>
#include <cstdint>

#include "native_gemv.h"

namespace {
enum Code : int32_t { EMBED, POSITION, LAYERNORM, RMSNORM, SLICE_RMSNORM, LINEAR, ATTENTION, ADD, ACT, GLU, SCALE, SOFTCAP };
enum Fn : int32_t { RELU, GELU, GELU_TANH, SILU, TANH };

// One op. Offsets index the arena (floats); out < 0 writes the step's result instead.
struct Op {
  int32_t code, fn;     // fn: ACT/GLU activation; RMSNORM 1 = (1 + weight); ATTENTION 1 = interleaved RoPE
  int64_t n, k;         // n: output width (LINEAR n_out); k: LINEAR n_in, ATTENTION the cache's max length
  int64_t in0, in1, out;
  const float* w;       // weight / table (embedding, positions, norm, linear)
  const float* b;       // bias or null
  float eps, scale;     // norms: eps; EMBED, SCALE, ATTENTION: the factor; SOFTCAP: the cap
  int32_t heads, kv_heads, head_dim, rope_dims;
  int64_t window, chunk;  // ATTENTION: sliding window / chunk length, 0 = none
  float* kc;              // ATTENTION: the cache [kv_heads, k, head_dim] of keys and of values
  float* vc;
  const float* rope;      // ATTENTION: per position, cos[rope_dims / 2] then sin[rope_dims / 2]; or null
  float softcap;          // ATTENTION: scores capped at softcap · tanh(s / softcap), 0 = none
  int64_t start, span, group;  // SLICE_RMSNORM: features [start, start + span) normalised in groups of `group`
};

float act(int32_t fn, float x) {
  switch (fn) {
    case RELU: return x > 0.f ? x : 0.f;
    case GELU: return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f));
    case GELU_TANH: return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case SILU: return x / (1.f + std::exp(-x));
    default: return std::tanh(x);
  }
}

// LayerNorm or RMSNorm of n features (the weight's n, from w).
void norm(const Op& op, const float* x, float* y, int64_t n) {
  double mean = 0.0, sq = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += x[i], sq += double(x[i]) * x[i];
  mean /= n;
  const double var = op.code == LAYERNORM ? sq / n - mean * mean : sq / n;
  const float inv = float(1.0 / std::sqrt(var + op.eps)), shift = op.code == LAYERNORM ? float(mean) : 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float h = (x[i] - shift) * inv, g = op.fn == 1 ? 1.f + op.w[i] : op.w[i];
    y[i] = op.b ? h * g + op.b[i] : h * g;
  }
}

// RoPE on the first rope_dims of one head: the halves together or (interleaved) adjacent pairs.
void rotate(const Op& op, const float* x, float* y, int64_t pos) {
  const int d = op.rope_dims, half = d / 2;
  const float *cos = op.rope + pos * d, *sin = cos + half;
  for (int i = 0; i < op.head_dim; ++i) y[i] = x[i];
  for (int i = 0; i < half; ++i) {
    const int a = op.fn == 1 ? 2 * i : i, b = op.fn == 1 ? 2 * i + 1 : i + half;
    y[a] = x[a] * cos[i] - x[b] * sin[i];
    y[b] = x[b] * cos[i] + x[a] * sin[i];
  }
}

// Thread t of n: write this position's keys and values (RoPE'd keys), barrier, then attend its query heads.
void attention(const Op& op, const float* qkv, float* y, float* scores, int64_t pos, int t, int n) {
  const int hd = op.head_dim;
  for (int g = t; g < op.kv_heads; g += n) {
    const float* k = qkv + int64_t(op.heads + g) * hd;
    const float* v = qkv + int64_t(op.heads + op.kv_heads + g) * hd;
    float* kd = op.kc + (g * op.k + pos) * hd;
    float* vd = op.vc + (g * op.k + pos) * hd;
    if (op.rope) rotate(op, k, kd, pos);
    else for (int i = 0; i < hd; ++i) kd[i] = k[i];
    for (int i = 0; i < hd; ++i) vd[i] = v[i];
  }
#pragma omp barrier
  int64_t first = 0;
  if (op.window > 0) first = pos - op.window + 1 > 0 ? pos - op.window + 1 : 0;
  if (op.chunk > 0) first = pos / op.chunk * op.chunk;
  float q[1024], acc[1024];  // head_dim ≤ 1024 (checked by the planner)
  for (int h = t; h < op.heads; h += n) {
    const float* qh = qkv + int64_t(h) * hd;
    if (op.rope) rotate(op, qh, q, pos);
    else for (int i = 0; i < hd; ++i) q[i] = qh[i];
    const int64_t g = h / (op.heads / op.kv_heads);
    const float* kg = op.kc + g * op.k * hd;
    const float* vg = op.vc + g * op.k * hd;
    float* s = scores + int64_t(h) * op.k;
    float top = -INFINITY;
    for (int64_t j = first; j <= pos; ++j) {
      float dot = 0.f;
      for (int i = 0; i < hd; ++i) dot += q[i] * kg[j * hd + i];
      dot *= op.scale;
      if (op.softcap > 0.f) dot = op.softcap * std::tanh(dot / op.softcap);
      s[j] = dot;
      top = dot > top ? dot : top;
    }
    float total = 0.f;
    for (int i = 0; i < hd; ++i) acc[i] = 0.f;
    for (int64_t j = first; j <= pos; ++j) {
      const float p = std::exp(s[j] - top);
      total += p;
      for (int i = 0; i < hd; ++i) acc[i] += p * vg[j * hd + i];
    }
    for (int i = 0; i < hd; ++i) y[int64_t(h) * hd + i] = acc[i] / total;
  }
}

// The small ops, on one thread: a few thousand floats each.
void vector_op(const Op& op, const float* a, const float* b2, float* y, int64_t token, int64_t pos) {
  switch (op.code) {
    case EMBED: for (int64_t i = 0; i < op.n; ++i) y[i] = op.w[token * op.n + i] * op.scale; break;
    case POSITION: for (int64_t i = 0; i < op.n; ++i) y[i] = a[i] + op.w[pos * op.n + i]; break;
    case LAYERNORM:
    case RMSNORM: norm(op, a, y, op.n); break;
    case SLICE_RMSNORM:  // QK-norm on a packed projection: the other features pass through
      for (int64_t i = 0; i < op.n; ++i) y[i] = a[i];
      for (int64_t s = op.start; s < op.start + op.span; s += op.group) norm(op, a + s, y + s, op.group);
      break;
    case ADD: for (int64_t i = 0; i < op.n; ++i) y[i] = a[i] + b2[i]; break;
    case ACT: for (int64_t i = 0; i < op.n; ++i) y[i] = act(op.fn, a[i]); break;
    case GLU: for (int64_t i = 0; i < op.n; ++i) y[i] = act(op.fn, a[i]) * b2[i]; break;
    case SCALE: for (int64_t i = 0; i < op.n; ++i) y[i] = a[i] * op.scale; break;
    case SOFTCAP: for (int64_t i = 0; i < op.n; ++i) y[i] = op.scale * std::tanh(a[i] / op.scale); break;
  }
}
}  // namespace

// Runs ops[0..n_ops) for `token` at position `pos` (the cache holds positions < pos). scores: heads × max_len
// floats of scratch for the largest attention op; result: where the op with out < 0 writes (the logits).
extern "C" void specc_decode_step(const Op* ops, int n_ops, float* arena, float* scores, float* result,
                                  int64_t token, int64_t pos, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    for (int i = 0; i < n_ops; ++i) {
      const Op& op = ops[i];
      const float* a = op.in0 >= 0 ? arena + op.in0 : nullptr;
      const float* b2 = op.in1 >= 0 ? arena + op.in1 : nullptr;
      float* y = op.out >= 0 ? arena + op.out : result;
      if (op.code == LINEAR) specc_native::gemv_share(a, op.w, op.b, y, 1, op.k, op.n, t, n);
      else if (op.code == ATTENTION) attention(op, a, y, scores, pos, t, n);
      else if (t == 0) vector_op(op, a, b2, y, token, pos);
#pragma omp barrier
    }
  }
}

extern "C" int specc_decode_op_size() { return sizeof(Op); }  // the loader checks its ctypes layout against it
