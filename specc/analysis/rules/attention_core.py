"""Rules of the fused attention core: QKᵀ, softmax, AV (and the rotary embedding it applies)."""

from __future__ import annotations

from ...ir.ops import AttentionAttrs, LatentAttentionAttrs
from .. import constants as C
from .common import Ctx, Dims, Flop, Mem, numel


def _sum_min(first: int, last: int, cap: int) -> int:
    """Σ_{p=first}^{last} min(p + 1, cap): keys seen by queries at positions first..last with a window cap."""

    def s(n: int) -> int:  # Σ_{j=1}^{n} min(j, cap)
        return n * (n + 1) // 2 if n <= cap else cap * (cap + 1) // 2 + (n - cap) * cap

    return s(last + 1) - s(first) if last >= first else 0


def _chunked(n: int, chunk: int) -> int:
    """Σ_{p<n} (p mod chunk + 1): keys seen by the queries at positions 0..n-1 of a chunked mask."""
    whole, r = divmod(n, chunk)
    return whole * chunk * (chunk + 1) // 2 + r * (r + 1) // 2


def visible_pairs(
    mask: str | None, nq: int, nk: int, window: int | None = None, prefix: int | None = None, chunk: int | None = None
) -> int:
    """(query, key) pairs a structural mask lets through; the queries are the last ``nq`` of ``nk`` positions."""
    first, last = nk - nq, nk - 1
    if mask == "causal":
        return _sum_min(first, last, nk)
    if mask == "sliding_window":
        return _sum_min(first, last, window or nk)
    if mask == "local" and window is not None and nq == nk:  # keys within window // 2 either side
        w = window // 2
        m = min(w, nk)
        edge = m * w - m * (m - 1) // 2  # the keys a row near either end misses
        return nk * (2 * w + 1) - 2 * edge
    if mask == "chunked" and chunk:
        return _chunked(last + 1, chunk) - _chunked(first, chunk)
    if mask == "prefix":
        p = min(prefix or 0, nk)
        in_prefix = max(0, p - first)  # queries inside the prefix see the whole prefix
        return in_prefix * p + _sum_min(max(first, p), last, nk)
    return nq * nk  # none | padding (padding masks are data, not structure)


def _lengths(a: AttentionAttrs, ins: list[Dims], ctx: Ctx) -> tuple[int, int, int]:
    """Batch, query length and key length of this evaluation."""
    b, nq = ins[0][0], ins[0][1]
    if a.cross:
        return b, nq, ins[1][1]
    if ctx.kv_len is None:
        return b, nq, nq
    nk = ctx.kv_len
    if a.mask == "sliding_window" and a.window:
        nk = min(nk, a.window)  # a rolling cache keeps only the window
    if a.mask == "chunked" and a.chunk:
        nk = min(nk, a.chunk)  # and a chunked layer only the current chunk
    return b, nq, nk


def attention_flops(a: AttentionAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    b, nq, nk = _lengths(a, ins, ctx)
    h, kv, hd = a.heads, a.kv_heads, a.head_dim
    mask = None if a.cross else a.mask
    pairs = visible_pairs(mask, nq, nk, a.window, a.prefix, a.chunk)
    if mask == "chunked" and ctx.kv_len is not None:  # the new token sees its own chunk so far
        pairs = nq * ((ctx.kv_len - 1) % a.chunk + 1)
    full, useful = 2 * b * h * nq * nk * hd, 2 * b * h * pairs * hd
    per_score = C.SOFTMAX + C.SCORE_SCALE + (C.SOFTCAP if a.softcap else 0)
    per_score += C.ALIBI if a.alibi_max_bias is not None or a.position_bias else 0  # the bias added per score
    sinks = C.SINK * b * h * nq if a.sinks else 0  # one more softmax column per row
    parts = [
        Flop("qk", matmul=full, matmul_useful=useful),
        Flop("softmax", other=per_score * b * h * nq * nk + sinks, other_useful=per_score * b * h * pairs + sinks),
        Flop("av", matmul=full, matmul_useful=useful),
    ]
    if a.rope_dims:
        parts.append(Flop("pos", other=C.ROPE * b * nq * (h + kv) * a.rope_dims))
    if a.temperature_floor is not None:  # q × its position's factor (Llama 4): one multiply per q element
        parts.append(Flop("pos", other=C.TEMPERATURE * b * nq * h * hd))
    return parts


def attention_memory(a: AttentionAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    b, nq, nk = _lengths(a, ins, ctx)
    h, kv, hd = a.heads, a.kv_heads, a.head_dim
    q, k_v = b * nq * h * hd, 2 * b * nk * kv * hd
    scores = b * h * nq * nk
    saved = (q + k_v + scores) * ctx.bytes  # Q, K, V and the softmax output
    if a.dropout > 0:
        saved += scores * C.MASK_BYTES + scores * ctx.bytes  # dropout mask and dropped probabilities
    stats = b * h * nq * C.STAT_BYTES
    cached = nk
    if not a.cross and a.mask == "sliding_window" and a.window:
        cached = min(nk, a.window)
    if not a.cross and a.mask == "chunked" and a.chunk:
        cached = min(nk, a.chunk)
    # Soft-capped scores and sinks have no fused kernel (torch runs them on the explicit softmax): always
    # materialised. ALiBi's fused kernel reads its bias as a [B | 1, H, N_q, N_k] mask, itself that large.
    capped = bool(a.softcap) or a.sinks
    bias = scores * ctx.bytes if a.alibi_max_bias is not None or a.position_bias else 0  # (T5's bias too)
    # torch's rotary makes new q and k while V stays a view of the packed q|k|v: that whole buffer is kept too
    rotated = (q + b * nk * kv * hd) * ctx.bytes if a.rope_dims and not a.cross else 0
    # … and the rotated q is dense [B, H, N, D], so SDPA's output is too (kept for its backward) and the output
    # projection keeps its own [B, N, H·D] copy; off a view of q|k|v the two are one tensor
    rotated += numel(out) * ctx.bytes if rotated else 0
    rotated += q * ctx.bytes if a.temperature_floor is not None else 0  # the scaled q is a new tensor too
    if capped and not a.cross:
        rotated = _explicit_softmax_kept(a, b, nq, nk, ctx.bytes) - saved
    return Mem(
        saved=saved,
        saved_fused=saved if capped else (q + k_v) * ctx.bytes + stats,
        saved_torch=rotated,
        saved_cpu_math=_cpu_math_kept(q + k_v, scores, a.dropout) if cpu_sdpa_unfused(a, training=True) else 0,
        io=(q + k_v + numel(out)) * ctx.bytes,
        scores=scores * ctx.bytes,
        scores_fused=scores * ctx.bytes if capped else stats + bias,
        kv_cache=2 * b * cached * kv * hd * ctx.bytes,
    )


def cpu_sdpa_unfused(a: AttentionAttrs | LatentAttentionAttrs, training: bool) -> bool:
    """Whether torch's CPU SDPA runs this core on its math path although a fused kernel is asked for: its flash
    kernel has no dropout (active in training only) and no V of another width than Q/K. Soft-capped scores and
    sinks never reach SDPA (an explicit softmax on every device)."""
    if isinstance(a, AttentionAttrs) and (a.softcap or a.sinks):
        return False
    return (training and a.dropout > 0) or (isinstance(a, LatentAttentionAttrs) and a.v_head_dim != a.head_dim)


def _cpu_math_kept(tensors: int, scores: int, dropout: float) -> int:
    """What torch's CPU SDPA keeps on its math path (taken for dropout, which its fused kernel lacks, and for V
    of another width than Q/K): Q, K, V (and the rest of ``tensors``), the softmax output and dropout's mask and
    output, every one in fp32 whatever the dtype."""
    return (tensors + scores + (2 * scores if dropout > 0 else 0)) * C.STAT_BYTES


def _explicit_softmax_kept(a: AttentionAttrs, b: int, nq: int, nk: int, elem: int) -> int:
    """What autograd keeps of torch's explicit softmax (``math_attention``: soft-capped scores, sinks) in a
    self-attention fed by a packed q|k|v: q (a view of the buffer unless rotated or scaled), K and V (repeated to
    the query heads under GQA; else the rotated k, V a view of the buffer), the tanh of soft-capped scores, the
    fp32 softmax output (with the sinks' column) and, below fp32, its cast; dropout's mask and output as ``saved``.
    The boolean [N_q, N_k] mask, one per layer and call whatever the batch, is the layout profile's (``mask_kept``)."""
    h, kv, hd, scores = a.heads, a.kv_heads, a.head_dim, b * a.heads * nq * nk
    new_q, gqa = bool(a.rope_dims) or a.temperature_floor is not None, kv != h
    tensors = b * nq * h * hd if new_q else 0
    tensors += 2 * b * nk * h * hd if gqa else b * nk * h * hd if a.rope_dims else 0
    tensors += b * nq * (h + 2 * kv) * hd if not (gqa and new_q) else 0  # the buffer a kept view holds
    probs = b * h * nq * (nk + a.sinks) * C.STAT_BYTES + (scores * elem if elem != C.STAT_BYTES else 0)
    dropped = scores * (C.MASK_BYTES + elem) if a.dropout > 0 else 0
    return tensors * elem + probs + (scores * elem if a.softcap else 0) + dropped


def _latent_lengths(a: LatentAttentionAttrs, ins: list[Dims], ctx: Ctx) -> tuple[int, int, int]:
    b, nq = ins[0][0], ins[0][1]
    return b, nq, nq if ctx.kv_len is None else ctx.kv_len


def latent_attention_flops(a: LatentAttentionAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    """The torch layer's forms. A whole sequence: every key's latent expanded to its heads' [k_nope | v] by kv_b,
    then attention with q/k heads of nope + rope and v heads of v_head_dim. A decoding step (``kv_len``): the
    weight-absorbed form, kv_b's halves applied to the new queries (q_nope · W_ukᵀ) and outputs (y · W_uv) and
    attention over the cached latent (q/k width kv_rank + rope, v width kv_rank)."""
    b, nq, nk = _latent_lengths(a, ins, ctx)
    h, qk, v, r = a.heads, a.head_dim, a.v_head_dim, a.kv_rank
    if ctx.kv_len is not None:
        proj, qk, v = 2 * b * h * nq * r * (a.nope_head_dim + v), r + a.rope_head_dim, r
    else:
        proj = 2 * b * nk * r * h * (a.nope_head_dim + v)
    pairs = visible_pairs(a.mask, nq, nk, a.window, a.prefix, a.chunk)
    per_score = C.SOFTMAX + C.SCORE_SCALE
    parts = [
        Flop("qkv_proj", matmul=proj),
        Flop("qk", matmul=2 * b * h * nq * nk * qk, matmul_useful=2 * b * h * pairs * qk),
        Flop("softmax", other=per_score * b * h * nq * nk, other_useful=per_score * b * h * pairs),
        Flop("av", matmul=2 * b * h * nq * nk * v, matmul_useful=2 * b * h * pairs * v),
    ]
    if a.rope_dims:
        parts.append(Flop("pos", other=C.ROPE * b * nq * (h + 1) * a.rope_dims))  # q heads and the one shared key
    return parts


def latent_attention_memory(a: LatentAttentionAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """The KV cache is the latent and the rotary key per token (kv_rank + rope_head_dim), not per head."""
    b, nq, nk = _latent_lengths(a, ins, ctx)
    h, qk, v = a.heads, a.head_dim, a.v_head_dim
    q, k_v, latent = b * nq * h * qk, b * nk * h * (qk + v), b * nk * (a.kv_rank + a.rope_head_dim)
    scores = b * h * nq * nk
    saved = (q + k_v + latent + scores) * ctx.bytes
    if a.dropout > 0:
        saved += scores * C.MASK_BYTES + scores * ctx.bytes
    stats = b * h * nq * C.STAT_BYTES
    # torch's layer: V views kv_b's [k_nope | v] output, so its k half stays too; q is a new dense [B, H, N, D]
    # tensor, so SDPA's output is one as well, apart from the output projection's [B, N, H·v] copy
    torch_extra = (b * nk * h * a.nope_head_dim + numel(out)) * ctx.bytes
    return Mem(
        saved=saved,
        saved_fused=(q + k_v + latent) * ctx.bytes + stats,
        saved_torch=torch_extra,
        # the math path's fp32 copies are of Q, K, V and the scores; kv_b keeps its latent input in the dtype
        saved_cpu_math=_cpu_math_kept(q + k_v, scores, a.dropout) + latent * ctx.bytes
        if cpu_sdpa_unfused(a, training=True)
        else 0,
        io=(q + latent + k_v + numel(out)) * ctx.bytes,
        scores=scores * ctx.bytes,
        scores_fused=stats,
        kv_cache=latent * ctx.bytes,
    )


RULES = {
    "attention": (attention_flops, attention_memory),
    "latent_attention": (latent_attention_flops, latent_attention_memory),
}
