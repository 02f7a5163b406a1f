"""train, attention-map."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..errors import SpecError
from . import limits
from .app import SetOpt, TrustPickleOpt, app, err, load, note_spec, out
from .app import output as check_output


class RichReporter:
    """A progress bar on stderr (terminals only) and one log line per interval on stdout."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=not err.is_terminal,
            transient=True,
        )
        self.bar: Any = None

    def start(self, total: int, done: int) -> None:
        self.progress.start()
        self.bar = self.progress.add_task("train", total=total, completed=done, loss=float("nan"))

    def advance(self, step: int, loss: float) -> None:
        self.progress.update(self.bar, completed=step, loss=loss)

    def log(self, text: str) -> None:
        if self.progress.live.is_started and err.is_terminal and out.is_terminal:
            self.progress.console.print(text, highlight=False)  # above the bar
        else:
            out.print(text)

    def stop(self) -> None:
        self.progress.stop()


class Schedule(str, Enum):
    cosine = "cosine"
    constant = "constant"


@app.command()
def train(
    spec: Annotated[str | None, typer.Argument(help="spec file or preset (omit with --resume)")] = None,
    task: Annotated[str | None, typer.Option("--task", "-t", help="reverse | copy | sort | add | lm")] = None,
    steps: Annotated[int | None, typer.Option("--steps", "-n", help="train until this many optimizer steps")] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="checkpoint to write (.safetensors; --parallel: also a folder)"),
    ] = None,
    batch: Annotated[int | None, typer.Option(help="sequences per step [64]")] = None,
    lr: Annotated[float | None, typer.Option(help="peak learning rate (AdamW) [1e-3]")] = None,
    min_len: Annotated[int | None, typer.Option(help="shortest source (add: digits per operand)")] = None,
    max_len: Annotated[int | None, typer.Option(help="longest source; lm: window length")] = None,
    seed: Annotated[int | None, typer.Option(help="data and dropout seed [0]; weights: --set init.seed=N")] = None,
    text: Annotated[Path | None, typer.Option(help="--task lm: UTF-8 text file (character vocabulary)")] = None,
    schedule: Annotated[Schedule | None, typer.Option(help="learning-rate schedule after warmup [cosine]")] = None,
    warmup: Annotated[int | None, typer.Option(help="linear warmup steps [min(100, steps/10)]")] = None,
    eval_every: Annotated[int | None, typer.Option(help="greedy evaluation interval [steps/5]")] = None,
    eval_size: Annotated[int | None, typer.Option(help="held-out sequences per evaluation [512]")] = None,
    save_every: Annotated[int, typer.Option(help="also write the checkpoint every this many steps")] = 0,
    resume: Annotated[Path | None, typer.Option(help="continue from this checkpoint (its spec, task, step)")] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda [cuda if available]")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch [all cores; at most 4 × cores]")] = None,
    parallel: Annotated[
        str | None,
        typer.Option(
            help="dp=D,tp=T,pp=P,ep=E under torchrun (D·T·P processes): FSDP2 over dp, tensor parallel over "
            "tp, pipeline stages over pp, MoE experts sharded over the dp ranks with ep=D; -o DIR writes a "
            "distributed checkpoint folder, -o X.safetensors one gathered file (pp=1)"
        ),
    ] = None,
    pipeline_schedule: Annotated[
        str | None,
        typer.Option("--pipeline-schedule", help="pp > 1: gpipe | 1f1b | interleaved-1f1b | zero-bubble [1f1b]"),
    ] = None,
    virtual_stages: Annotated[
        int | None, typer.Option(help="pp > 1: model chunks per pipeline rank (interleaved-1f1b, zero-bubble) [1]")
    ] = None,
    micro_batch: Annotated[
        int | None, typer.Option(help="pp > 1: sequences per micro-batch [a replica's rows / pp]")
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option(help="sequences per optimizer step over every replica (--batch by another name)")
    ] = None,
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="--parallel: per rank, the analyzer's prediction for the layout and schedule beside what the "
            "last step measured (memory by item, peak, step time, bubble)",
        ),
    ] = False,
    device_profile: Annotated[
        str | None,
        typer.Option(help="--report: a device (h100, ...) or a specc profile-device YAML to predict the step time"),
    ] = None,
    trust_pickled_checkpoint: TrustPickleOpt = False,
    sets: SetOpt = None,
) -> None:
    """Train a seq2seq model on a synthetic task, or a decoder LM on characters; write a checkpoint."""
    import torch

    from ..parallel import launch
    from ..train import default_device, new_run, resume_run, save_run
    from ..train import train as run_training
    from ..train.loop import TrainConfig
    from ..train.training_checkpoint import optimizer_path

    if output is None:
        raise SpecError("missing --output / -o", hint="e.g. -o reverse.safetensors")
    _check_numbers(locals())
    layout = launch.parse_layout(parallel) if parallel is not None else None
    batch = _global_batch(batch, global_batch)
    if (report or device_profile) and layout is None:
        raise SpecError("--report compares a parallel run with its prediction: it needs --parallel")
    if device_profile is not None and not report:
        raise SpecError("--device-profile prices the --report's step time: add --report")
    if device_profile is not None:
        from ..analysis.devices import load_device

        load_device(device_profile)  # a bad name or file is refused before any work
    opts = _pipeline_options(layout, pipeline_schedule, virtual_stages, micro_batch)
    if opts is not None and spec is not None and resume is None:  # the layout against the spec, before any work
        from ..ir.lower import lower
        from ..parallel.pipeline import check_pipeline

        assert layout is not None
        rows = (batch or TrainConfig.batch) // layout["dp"]
        check_pipeline(lower(load(spec, sets)), layout["pp"], opts.schedule, opts.virtual,
                       opts.micro_batches(rows, layout["pp"]), layout["dp"], layout["tp"])  # fmt: skip
    if layout is not None and layout["ep"] > 1 and spec is not None and resume is None:  # experts ep divides
        from ..ir.lower import lower
        from ..parallel.expert_parallel import check_expert_parallel

        check_expert_parallel(lower(load(spec, sets)), layout["ep"], layout["dp"], layout["tp"])
    if layout is not None and spec is not None and resume is None:  # the rest of what the runtime runs (plan's rule)
        from ..ir.lower import lower

        rows = (batch or TrainConfig.batch) // layout["dp"]
        m = opts.micro_batches(rows, layout["pp"]) if opts is not None else None
        launch.check_runnable(lower(load(spec, sets)), layout, m, opts.schedule if opts is not None else "1f1b")
    if layout is not None and not output.name.endswith(".safetensors"):
        _check_folder(output, spec, text, resume)
    else:
        _check_outputs(output, spec, text, resume)  # before any training: refused outputs cost nothing
    flags = {
        "task": task, "steps": steps, "batch": batch, "lr": lr, "min_len": min_len, "max_len": max_len,
        "seed": seed, "text": str(text) if text else None, "schedule": schedule.value if schedule else None,
        "warmup": warmup, "eval_every": eval_every, "eval_size": eval_size,
    }  # fmt: skip
    dev = default_device(device)
    mesh = None
    if layout is not None:
        dev = launch.local_device(dev)
        mesh = launch.init_mesh(layout, dev)
        out.quiet = launch.rank() != 0  # one log: rank 0's
    try:  # from here the process group (if any) is shut down however the command ends
        if threads:
            torch.set_num_threads(threads)  # small models on shared CPUs often run faster on fewer threads
        if resume is not None:
            if sets:
                raise SpecError("--set cannot change the model of a resumed checkpoint", hint="leave out --set")
            run = resume_run(
                resume,
                flags,
                dev,
                spec=load(spec) if spec else None,
                mesh=mesh,
                trust_pickle=trust_pickled_checkpoint,
                pipeline=opts,
                ep=layout["ep"] if layout is not None else 1,
            )
            side = resume if resume.is_dir() else optimizer_path(resume)  # a folder holds its optimizer state
            if run.resumed_optimizer:
                out.print(f"resuming {resume} at step {run.step} (optimizer state from {side})")
            else:
                what = f"{resume} holds no optimizer state" if resume.is_dir() else f"{side} not found"
                err.print(f"warning: {what}: resuming {resume} at step {run.step} with fresh Adam moments")
        else:
            if spec is None:
                raise SpecError("missing SPEC", hint="specc train SPEC --task reverse --steps 2000 -o out.safetensors")
            if task is None:
                raise SpecError("missing --task", hint="reverse | copy | sort | add | lm")
            if steps is None:
                raise SpecError("missing --steps", hint="e.g. --steps 2000")
            cfg = TrainConfig(**{k: v for k, v in flags.items() if v is not None})
            run = new_run(load(spec, sets), cfg, dev, mesh=mesh, pipeline=opts, ep=layout["ep"] if layout else 1)
        _check_config(run.cfg)  # a resumed checkpoint's own settings obey the same bounds
        n_params = run.graph.num_params()  # the whole model (a parallel rank holds a share)
        lo, hi = run.lengths
        lengths = f"window {hi}" if run.task is None else f"lengths {lo}–{hi} ({run.task.length_meaning})"
        where = str(dev)
        if layout is not None:
            n = layout["dp"] * layout["tp"] * layout["pp"]
            where = f"{dev.type} × {n} processes (dp={layout['dp']}, tp={layout['tp']}"
            if run.pipeline is not None:
                p = run.pipeline
                where += f", pp={layout['pp']}: {p.schedule_name}, {p.n_chunks} chunks, {p.micro_batches} micro-batches"
            if layout["ep"] > 1:
                over = "the dp ranks" if layout["ep"] == layout["dp"] else f"groups of {layout['ep']} dp ranks"
                where += f", ep={layout['ep']}: the experts split over {over}"
            where += ")"
        out.print(
            f"{run.graph.meta['name']} ({run.graph.meta['family']}, {n_params:,} parameters) on {run.cfg.task}: "
            f"{lengths}, vocabulary {len(run.vocab)}, batch {run.cfg.batch}, steps {run.step}→{run.cfg.steps}, {where}"
        )
        torch.set_grad_enabled(True)
        if report:
            from ..parallel.rank_report import Measurement

            run.measure = Measurement()
        reporter = RichReporter() if launch.rank() == 0 else None  # None: quiet
        last = run.cfg.steps  # the final checkpoint: once it is in place a signal no longer fails the run
        final = run_training(run, reporter, save=lambda r: save_run(r, output, r.step == last), save_every=save_every)
        _summary(run, final)
        if report:
            _report(run, device_profile)
    finally:
        launch.shutdown()
    out.print(f"wrote {output} (step {run.step})")


def _global_batch(batch: int | None, global_batch: int | None) -> int | None:
    if global_batch is None:
        return batch
    limits.bounded(global_batch, "--global-batch", 1, limits.MAX_BATCH)
    if batch is not None and batch != global_batch:
        raise SpecError(f"--batch {batch} and --global-batch {global_batch} disagree", hint="give one of them")
    return global_batch


def _pipeline_options(
    layout: dict[str, int] | None, schedule: str | None, virtual: int | None, micro: int | None
) -> Any:
    """The pipeline's settings for pp > 1; refused (never ignored) without it."""
    from ..parallel.pipeline import PipelineOptions

    pp = layout["pp"] if layout is not None else 1
    given = [f for f, v in (("--pipeline-schedule", schedule), ("--virtual-stages", virtual),
                            ("--micro-batch", micro)) if v is not None]  # fmt: skip
    if pp == 1:
        if given:
            raise SpecError(f"{given[0]} sets up pipeline stages: it needs --parallel ...,pp=P with P > 1")
        return None
    limits.bounded(virtual, "--virtual-stages", 1, limits.MAX_STEPS)
    limits.bounded(micro, "--micro-batch", 1, limits.MAX_BATCH)
    opts = PipelineOptions(schedule or "1f1b", virtual or 1, micro)
    from ..analysis.layouts.layout import SCHEDULES

    if opts.schedule not in SCHEDULES:
        raise SpecError(f"--pipeline-schedule {opts.schedule} is unknown", hint=f"use one of {', '.join(SCHEDULES)}")
    return opts


_BOUNDS = {  # option: (TrainConfig field, low, high)
    "--steps": ("steps", 1, limits.MAX_STEPS),
    "--batch": ("batch", 1, limits.MAX_BATCH),
    "--min-len": ("min_len", 1, limits.MAX_TRAIN_LEN),
    "--max-len": ("max_len", 1, limits.MAX_TRAIN_LEN),
    "--warmup": ("warmup", 0, limits.MAX_STEPS),
    "--eval-every": ("eval_every", 1, limits.MAX_STEPS),
    "--eval-size": ("eval_size", 1, limits.MAX_EVAL_SIZE),
}


def _check_numbers(flags: dict[str, Any]) -> None:
    for option, (name, lo, hi) in _BOUNDS.items():
        limits.bounded(flags[name], option, lo, hi)
    limits.bounded(flags["save_every"], "--save-every", 0, limits.MAX_STEPS)
    limits.bounded(flags["lr"], "--lr", 1e-12, limits.MAX_LR)
    limits.seed(flags["seed"])
    limits.threads(flags["threads"])


def _check_config(cfg: Any) -> None:
    for option, (name, lo, hi) in _BOUNDS.items():
        limits.bounded(getattr(cfg, name), option, lo, hi)
    limits.bounded(cfg.lr, "--lr", 1e-12, limits.MAX_LR)
    limits.seed(cfg.seed)


def _check_outputs(output: Path, spec: str | None, text: Path | None, resume: Path | None) -> None:
    """The checkpoint and its optimizer sidecar: writable, and neither the spec, the text nor (unless it is the
    checkpoint being continued in place, ``--resume CK -o CK``) a resumed run's files."""
    from ..train.training_checkpoint import optimizer_path

    if spec is not None:
        note_spec(spec)
    inputs = [(text, f"the --text file {text}") if text else None]
    replaces: tuple[Path, ...] = ()
    if resume is not None:
        side = optimizer_path(resume)
        inputs += [(resume, f"the checkpoint --resume {resume}"), (side, f"the resumed optimizer state {side}")]
        replaces = (resume, optimizer_path(resume)) if _same(output, resume) else ()
    check_output(output, *inputs, replaces=replaces)
    check_output(optimizer_path(output), *inputs, replaces=replaces)
    if text is not None and text.is_file() and text.stat().st_size == 0:
        raise SpecError("the text is empty: there is nothing to train on", file=str(text))


def _check_folder(output: Path, spec: str | None, text: Path | None, resume: Path | None) -> None:
    """A distributed checkpoint folder: a new name, or a folder that holds one already (replaced whole) other
    than the one resumed (read shard by shard while the run goes on), in a folder specc can write in."""
    from ..io import folder_target
    from ..parallel.sharded_checkpoint import is_checkpoint, is_legacy

    if spec is not None:
        note_spec(spec)
    if resume is not None and _same(output, resume):
        raise SpecError(
            f"-o {output} is the checkpoint --resume reads; specc never overwrites an input",
            file=str(output),
            hint=f"write the resumed run to a new folder, e.g. -o {output.name}-2",
        )
    if output.exists() and not (
        output.is_dir() and (is_checkpoint(output) or is_legacy(output) or not any(output.iterdir()))
    ):
        raise SpecError(
            f"{output} exists and is not a specc distributed checkpoint folder",
            hint="-o a new folder name, or -o X.safetensors for one gathered file",
        )
    folder_target(output)
    if text is not None and text.is_file() and text.stat().st_size == 0:
        raise SpecError("the text is empty: there is nothing to train on", file=str(text))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def _report(run: Any, device_profile: str | None) -> None:
    """Per rank, predicted / measured (``specc.parallel.rank_report``); rank 0 prints every rank's row."""
    from ..parallel import rank_report as R

    if run.measure is None or not run.measure.values:
        raise SpecError("--report measures the run's last step: this run took none", hint="raise --steps")
    measured = R.gather(run.measure.values)
    predicted = R.predict(run, device_profile)
    t = Table("rank", "stage", *R.ITEMS, box=None, pad_edge=False)
    for cells in R.rows(predicted, measured, R.stage_of_rank(run.mesh)):
        t.add_row(*cells)
    out.print(f"report, each cell predicted / measured (the last step; peak: {run.measure.peak_how})")
    out.print(t)


def _summary(run: Any, final: dict[str, Any]) -> None:
    from ..train.loop import describe, length_buckets
    from ..train.samples import lm_sample, seq2seq_samples

    out.print(f"final  {describe(final)}")
    rows = length_buckets(final)
    if rows:
        t = Table("source length", "sequences", "exact-sequence accuracy", box=None, pad_edge=False)
        for label, count, acc in rows:
            t.add_row(label, str(count), f"{acc:.1%}")
        out.print(t)
    if run.task is not None:
        for src, want, got in seq2seq_samples(run, 3):
            mark = "ok" if want == got else "WRONG"
            out.print(f"  {src}  →  {got}  [{mark}]")
    else:
        out.print(f"  sample: {lm_sample(run, 120)!r}")


@app.command("attention-map")
def attention_map(
    checkpoint: Annotated[Path, typer.Argument(help="a seq2seq checkpoint from specc train")],
    input: Annotated[str, typer.Option("--input", "-i", help='input tokens separated by spaces, e.g. "3 1 4 1 5"')],
    output: Annotated[Path, typer.Option("--output", "-o", help="image to write (.png, .svg or .pdf)")],
    layer: Annotated[int | None, typer.Option(help="cross-attention layer (0-based) [last]")] = None,
    head: Annotated[int | None, typer.Option(help="attention head [mean over heads]")] = None,
    average: Annotated[bool, typer.Option("--average", help="mean over every layer and head")] = False,
    trust_pickled_checkpoint: TrustPickleOpt = False,
) -> None:
    """Heat-map of cross-attention weights: rows = output tokens (greedy), columns = input tokens."""
    from ..io import image_format
    from ..ir.lower import lower
    from ..train import training_checkpoint as C
    from ..train.attention_maps import attention_map as compute
    from ..train.plot import save_heatmap
    from ..train.session import default_device
    from ..train.trainable import SEQ2SEQ, build, objective, position_limits

    image_format(output)
    check_output(output, (checkpoint, f"the checkpoint {checkpoint}"))
    limits.argument_length(input, "--input", 16 * limits.MAX_TRAIN_LEN)
    ck = C.load(checkpoint, trust_pickle=trust_pickled_checkpoint)
    graph = lower(ck.spec)
    if objective(graph) != SEQ2SEQ:
        raise SpecError(f"{graph.meta['name']} is a decoder LM: it has no cross-attention", file=str(checkpoint))
    model = build(ck.spec, default_device("cpu"), ck.weights)
    n_words = len(input.split())
    limit = min(position_limits(graph).values(), default=None)
    max_new = 2 * n_words + 4 if limit is None else min(2 * n_words + 4, limit - 1)
    m = compute(model, graph, C.vocab_of(ck), input, max_new, layer, head, average)
    save_heatmap(m, output, graph.meta["name"])
    argmax = m.weights.argmax(1).tolist()
    out.print(f"input:  {' '.join(m.cols)}")
    out.print(f"output: {' '.join(m.rows)}")
    out.print(f"argmax input position per output token: {' '.join(map(str, argmax))}")
    out.print(f"wrote {output} ({len(m.rows)}×{len(m.cols)}, {m.title})")
