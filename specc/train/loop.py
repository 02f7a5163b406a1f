"""The training loop: one objective (seq2seq cross-entropy or next-character LM), Adam, clipping, evaluation.

A step's batch and dropout come from ``step_seed(seed, step)`` and the learning rate from ``lr_at(step)``,
so training N steps, saving and resuming to 2N gives the same weights as training 2N steps at once.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ..checkpoint_format import TrainConfig
from ..errors import SpecError
from ..ir.graph import LayerGraph
from ..ir.lower import lower
from ..parallel import data as data_parallel
from . import trainable as M
from .evaluate import eval_pairs, evaluate_lm, evaluate_seq2seq
from .metrics import teacher_forced_acc
from .schedule import SCHEDULES, lr_at, step_seed
from .tasks import Pair, Task, make_task
from .text import TextData, check_window, read_text
from .vocab import PAD, Vocab

MAX_STEPS = 10_000_000
MAX_BATCH = 1 << 16


class Reporter(Protocol):
    def start(self, total: int, done: int) -> None: ...
    def advance(self, step: int, loss: float) -> None: ...
    def log(self, text: str) -> None: ...
    def stop(self) -> None: ...


class Quiet:
    def start(self, total: int, done: int) -> None: ...
    def advance(self, step: int, loss: float) -> None: ...
    def log(self, text: str) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Run:
    """Everything a training run holds; ``step`` optimizer updates have been applied."""

    spec: Any
    graph: LayerGraph
    cfg: TrainConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    vocab: Vocab
    device: torch.device
    task: Task | None = None
    text: TextData | None = None
    eval_set: list[Pair] = field(default_factory=list)
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    mesh: Any = None  # a ("dp", "tp") or ("pp", "dp", "tp") DeviceMesh when the model is parallelized
    pipeline: Any = None  # specc.parallel.pipeline.Pipeline when pp > 1 (``model``: this rank's share)
    resumed_optimizer: bool = False  # the optimizer state came from the resumed checkpoint
    measure: Any = None  # specc.parallel.rank_report.Measurement: records the last step (train --report)
    ep: int = 1  # expert parallel degree: MoE experts sharded over the dp ranks (specc.parallel.expert_parallel)

    @property
    def lengths(self) -> tuple[int, int]:
        return self.cfg.min_len or 1, self.cfg.max_len or 1

    @property
    def forward(self) -> Any:
        """What evaluation and sampling call: the model, or the pipeline that runs it across stages."""
        return self.pipeline if self.pipeline is not None else self.model

    @property
    def warmup(self) -> int:
        return self.cfg.warmup if self.cfg.warmup is not None else min(100, self.cfg.steps // 10)


def check_config(cfg: TrainConfig) -> None:
    if not 1 <= cfg.steps <= MAX_STEPS:
        raise SpecError(f"--steps must be between 1 and {MAX_STEPS:,}, got {cfg.steps}")
    if not 1 <= cfg.batch <= MAX_BATCH:
        raise SpecError(f"--batch must be between 1 and {MAX_BATCH}, got {cfg.batch}")
    if not 0 < cfg.lr < 10:
        raise SpecError(f"--lr must be in (0, 10), got {cfg.lr}")
    if cfg.schedule not in SCHEDULES:
        raise SpecError(f"unknown schedule {cfg.schedule!r}", hint=f"choose one of: {', '.join(SCHEDULES)}")
    if cfg.min_len is not None and cfg.min_len < 1:
        raise SpecError(f"--min-len must be at least 1, got {cfg.min_len}")
    if cfg.min_len is not None and cfg.max_len is not None and cfg.max_len < cfg.min_len:
        raise SpecError(f"--max-len {cfg.max_len} is smaller than --min-len {cfg.min_len}")
    if cfg.task == "lm" and not cfg.text:
        raise SpecError("--task lm needs --text FILE", hint="a UTF-8 text file; its characters become the vocabulary")
    if cfg.task != "lm" and cfg.text:
        raise SpecError(f"--text is only read by --task lm (the {cfg.task} task generates its data)")


def resolve_lm_spec(spec: Any, vocab: Vocab) -> Any:
    """Character-level LM: the vocabulary is the text's characters, so the spec's vocab_size becomes its size."""
    from ..spec.schema import SPEC_ADAPTER

    if spec.vocab_size == len(vocab):
        return spec
    # what was written, not every field: a dump's None of a layer kind's override ("heads: null", inherit) does
    # not validate again (Gemma 2/3, GPT-OSS)
    return SPEC_ADAPTER.validate_python({**spec.model_dump(exclude_unset=True), "vocab_size": len(vocab)})


def setup(
    spec: Any,
    cfg: TrainConfig,
    device: torch.device,
    weights: dict[str, torch.Tensor] | None = None,
    vocab: Vocab | None = None,
    mesh: Any = None,
    shards: Any = None,
    pipeline: Any = None,
    ep: int = 1,
) -> Run:
    """Build the task data, the model and the optimizer (``weights`` / ``vocab`` when resuming); with a
    ``mesh`` the model is parallelized over it and each dp rank trains on its rows of every global batch;
    ``shards``: a distributed checkpoint folder (``specc.parallel.sharded_checkpoint.open_folder``, checked) each rank
    reads its shards of the weights and the optimizer state from (``run.resumed_optimizer`` says whether it
    held the latter). A mesh with a ``pp`` dimension pipelines the model (``pipeline``: its
    ``specc.parallel.pipeline.PipelineOptions``)."""
    check_config(cfg)
    if mesh is not None and cfg.batch % mesh["dp"].size():
        raise SpecError(f"--batch {cfg.batch} is not divisible by dp={mesh['dp'].size()}", hint="the global batch")
    graph = lower(spec)
    M.check_task(graph, cfg.task)
    text = task = None
    if cfg.task == "lm":
        assert cfg.text is not None
        text = read_text(cfg.text, vocab)
        spec = resolve_lm_spec(spec, text.vocab)
        graph = lower(spec)
        window = cfg.max_len or min(graph.meta.get("context", 128), 128)
        cfg = replace(cfg, min_len=window, max_len=window)
        check_window(text, window, cfg.text)
        M.check_lengths(graph, {None: window})
        vocab = text.vocab
    else:
        task = make_task(cfg.task, graph.meta["vocab_size"], graph.meta.get("target_vocab_size", 0))
        lo, hi = task.default_lengths
        lo = cfg.min_len or min(lo, cfg.max_len or lo)
        cfg = replace(cfg, min_len=lo, max_len=cfg.max_len or max(hi, lo))
        check_config(cfg)
        M.check_lengths(graph, {"encoder": cfg.max_len, "decoder": task.max_target_len(cfg.max_len) + 1})
        vocab = task.vocab
    pipe = None
    if mesh is None:
        model = M.build(spec, device, weights)
    else:  # built on meta: each rank materializes its shards alone (specc.parallel.materialize)
        from ..parallel import materialize, parallelize

        init = weights is None and shards is None
        if "pp" in (mesh.mesh_dim_names or ()):
            from ..parallel.pipeline import PipelineOptions, build_pipeline

            opts = pipeline or PipelineOptions()
            pp = mesh["pp"].size()
            m = opts.micro_batches(cfg.batch // mesh["dp"].size(), pp)
            pipe = build_pipeline(spec, graph, mesh, schedule=opts.schedule, virtual=opts.virtual, micro_batches=m,
                                  init=init, build=lambda s, d: M.build(s, d))  # fmt: skip
            model = pipe.root
        else:
            model = parallelize(M.build(spec, torch.device("meta")), mesh, init=init, ep=ep)
        if weights is not None:
            materialize.load_full(model, weights)
        elif shards is not None:
            from ..parallel.sharded_checkpoint import load_into

            load_into(model, shards)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    run = Run(spec, graph, cfg, model, optimizer, vocab, device, task=task, text=text, mesh=mesh, pipeline=pipe, ep=ep)
    if shards is not None:
        from ..parallel.sharded_checkpoint import load_optimizer

        run.resumed_optimizer = load_optimizer(model, optimizer, shards)
    if task is not None:
        run.eval_set = eval_pairs(task, cfg.eval_size, cfg.min_len or 1, cfg.max_len or 1, cfg.seed)
    return run


def train_step(run: Run) -> tuple[float, float]:
    """One optimizer update; returns (loss, teacher-forced token accuracy) of its batch. ``run.measure``:
    the run's last step is measured (``specc.parallel.rank_report``)."""
    if run.measure is not None and run.step == run.cfg.steps - 1:
        with run.measure.step(run):
            return _train_step(run)
    return _train_step(run)


def _train_step(run: Run) -> tuple[float, float]:
    cfg, dev = run.cfg, run.device
    seed = step_seed(cfg.seed, run.step)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed + 1)  # dropout
    lo, hi = run.lengths
    shard = (lambda *t: t) if run.mesh is None else functools.partial(data_parallel.shard_rows, run.mesh)
    if run.task is not None:
        b = run.task.batch(cfg.batch, lo, hi, gen)
        src, src_mask, dec_in, labels = shard(b.src, b.src_mask, b.dec_in, b.labels)
        logits = M.seq2seq_logits(run.model, src.to(dev), src_mask.to(dev), dec_in.to(dev))
        labels, ignore = labels.to(dev), PAD
    elif run.pipeline is not None:
        assert run.text is not None
        x, y = run.text.batch("train", cfg.batch, hi, gen)
        return _pipeline_step(run, x, y)
    else:
        assert run.text is not None
        x, y = shard(*run.text.batch("train", cfg.batch, hi, gen))
        logits = M.lm_logits(run.model, x.to(dev))
        labels, ignore = y.to(dev), -100
    if run.mesh is None:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=ignore)
        value = float(loss.detach())  # reported: the task loss alone
        acc = teacher_forced_acc(logits.detach(), labels, None if ignore == -100 else ignore)
    else:  # the global batch's mean, whichever rows this rank holds
        loss, value, acc = data_parallel.cross_entropy(run.mesh, logits, labels, ignore)
    aux = run.model.aux_loss()  # MoE load balancing (mlp.router.aux_loss_coef), from this training forward
    if aux is not None:
        loss = loss + aux
    if not math.isfinite(value):
        raise SpecError(f"loss became {value} at step {run.step}", hint="lower --lr")
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.clip > 0 and 1 < run.ep < run.mesh["dp"].size():  # expert gradients on their groups' mesh
        from ..parallel.expert_parallel import clip_grad_norm

        clip_grad_norm(run.model.parameters(), cfg.clip)
    elif cfg.clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip)
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(run.step, cfg.lr, cfg.steps, run.warmup, cfg.schedule)
    run.optimizer.step()
    run.step += 1
    return value, acc


def _pipeline_step(run: Run, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """One optimizer update through the pipeline: this replica's rows in micro-batches, the loss the global
    batch's mean (as the single process computes it), clipping over every stage."""
    cfg, ignore = run.cfg, -100
    count = float((y != ignore).sum())  # the global batch's tokens, before the rows are split over dp
    x, y = data_parallel.shard_rows(run.mesh, x, y)
    run.optimizer.zero_grad(set_to_none=True)
    value, acc = run.pipeline.train_step(x.to(run.device), y.to(run.device), ignore, count, run.mesh["dp"].size())
    if not math.isfinite(value):
        raise SpecError(f"loss became {value} at step {run.step}", hint="lower --lr")
    if cfg.clip > 0:
        run.pipeline.clip_grad_norm(cfg.clip)
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(run.step, cfg.lr, cfg.steps, run.warmup, cfg.schedule)
    run.optimizer.step()
    run.step += 1
    return value, acc


def evaluate(run: Run) -> dict[str, Any]:
    """One history record: greedy token / exact-sequence accuracy, or held-out LM loss and accuracy."""
    if run.task is not None:
        s = evaluate_seq2seq(run.model, run.eval_set, run.device)
        by_len = sorted(s.by_length.items())
        return {
            "step": run.step,
            "token_acc": s.token_acc,
            "exact_acc": s.exact_acc,
            "exact_by_length": {str(n): round(right / count, 4) for n, (count, right) in by_len},
            "sequences_by_length": {str(n): count for n, (count, _) in by_len},
        }
    assert run.text is not None
    lm = evaluate_lm(run.forward, run.text, run.lengths[1], run.device, 8, min(run.cfg.batch, 64), run.cfg.seed)
    return {"step": run.step, "val_loss": lm.loss, "token_acc": lm.token_acc, "bits_per_char": lm.bits_per_char}


def length_buckets(record: dict[str, Any], most: int = 8) -> list[tuple[str, int, float]]:
    """(source lengths, sequences, exact accuracy) rows, merging neighbouring lengths into at most ``most`` rows."""
    acc, counts = record.get("exact_by_length", {}), record.get("sequences_by_length", {})
    lengths = sorted(int(n) for n in acc)
    if not lengths:
        return []
    size = -(-len(lengths) // most)
    rows = []
    for i in range(0, len(lengths), size):
        group = lengths[i : i + size]
        n = sum(counts.get(str(k), 1) for k in group)
        right = sum(acc[str(k)] * counts.get(str(k), 1) for k in group)
        label = str(group[0]) if len(group) == 1 else f"{group[0]}–{group[-1]}"
        rows.append((label, n, right / n))
    return rows


def describe(record: dict[str, Any]) -> str:
    if "exact_acc" in record:
        return f"token acc {record['token_acc']:.1%}  exact {record['exact_acc']:.1%} (greedy)"
    bpc, acc = record["bits_per_char"], record["token_acc"]
    return f"val loss {record['val_loss']:.3f}  {bpc:.2f} bits/char  next-char acc {acc:.1%}"


def train(run: Run, reporter: Reporter | None = None, save: Any = None, save_every: int = 0) -> dict[str, Any]:
    """Train until ``cfg.steps``; evaluate every ``eval_every`` steps and at the end; returns the last record."""
    rep = reporter or Quiet()
    cfg = run.cfg
    every = cfg.eval_every or max(cfg.steps // 5, 1)
    log_every = max(min(every, cfg.steps // 20), 1)
    rep.start(cfg.steps, run.step)
    t0, losses, accs = time.perf_counter(), [], []
    try:
        while run.step < cfg.steps:
            loss, acc = train_step(run)
            losses.append(loss)
            accs.append(acc)
            rep.advance(run.step, loss)
            if run.step % log_every == 0 or run.step == cfg.steps:
                lr = run.optimizer.param_groups[0]["lr"]
                rep.log(
                    f"step {run.step:>6}  loss {sum(losses) / len(losses):.4f}  "
                    f"tf-acc {sum(accs) / len(accs):.1%}  lr {lr:.2e}  {time.perf_counter() - t0:.0f}s"
                )
                losses, accs = [], []
            if run.step % every == 0 or run.step == cfg.steps:
                record = {**evaluate(run), "elapsed_s": round(time.perf_counter() - t0, 2)}
                run.history.append(record)
                rep.log(f"eval {run.step:>6}  {describe(record)}")
            if save is not None and save_every and run.step % save_every == 0 and run.step < cfg.steps:
                save(run)
    finally:
        rep.stop()
    if not run.history or run.history[-1]["step"] != run.step:
        run.history.append(evaluate(run))
    if save is not None:
        save(run)
    return run.history[-1]
