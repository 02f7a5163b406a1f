"""analyze, compare: cost reports from the IR (parameters, FLOPs, memory, sweeps, plots, roofline)."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import SpecError
from . import limits
from .app import Dtype, SetOpt, SpecArg, app, err, load, out, output


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"
    op = "op"


BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="batch size B")]
SeqOpt = Annotated[int | None, typer.Option("--seq", "-n", help="sequence length N (default: the context)")]
DecSeqOpt = Annotated[int | None, typer.Option("--dec-seq", help="decoder length N_dec (default: N)")]
DtypeOpt = Annotated[Dtype | None, typer.Option("--dtype", help="fp32 | fp16 | bf16 (default: the spec's)")]
TrainingOpt = Annotated[bool, typer.Option("--training", help="add gradients, Adam states, training FLOPs")]
RecomputeOpt = Annotated[
    Recompute, typer.Option("--recompute", help="activation recomputation: none | selective | full | op (--parallel)")
]
AttnImplOpt = Annotated[
    str | None, typer.Option("--attention-impl", help="flash | math (with --parallel; default: the device profile's)")
]
ScheduleOpt = Annotated[
    str | None,
    typer.Option("--pipeline-schedule", help="gpipe | 1f1b | interleaved-1f1b | zero-bubble (with --parallel)"),
]
VirtualOpt = Annotated[int | None, typer.Option("--virtual-stages", help="model chunks per device (interleaved-1f1b)")]
AsyncTpOpt = Annotated[bool, typer.Option("--async-tp", help="overlap tensor-parallel collectives with the GEMMs")]
KvOpt = Annotated[int | None, typer.Option("--kv-len", help="cached keys for the decode step (default: N)")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table | json | csv | markdown")]
DeviceOpt = Annotated[str | None, typer.Option("--device", "-d", help="roofline on h100 | h200 | a100 | profile.yaml")]
SweepOpt = Annotated[str | None, typer.Option("--sweep", help="e.g. seq=512,1024,...,131072 (also batch=, dec_seq=)")]
PlotOpt = Annotated[str | None, typer.Option("--plot", help="write FLOPs and memory against N to this image")]
OutputOpt = Annotated[str | None, typer.Option("--output", "-o", help="write the report to this file")]
ParallelOpt = Annotated[
    str | None,
    typer.Option("--parallel", help="per-device costs of a layout: any of tp=T,pp=P,dp=D,ep=E,cp=C (missing: 1)"),
]
ZeroOpt = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0 | 1 | 2 | 3 (with --parallel --training)")]
SeqParOpt = Annotated[bool, typer.Option("--sequence-parallel", help="shard norms and dropout along tp too")]
MicroOpt = Annotated[int | None, typer.Option("--micro-batch", help="sequences per micro-batch (default 1)")]
GlobalOpt = Annotated[int | None, typer.Option("--global-batch", help="sequences per step, all replicas")]
LinkOpt = Annotated[
    str | None,
    typer.Option(
        "--interconnect",
        help="nvlink | nvlink-a100 | pcie | infiniband | .yaml (default: nvlink, nvlink-a100 for a100)",
    ),
]
PlanOpt = Annotated[bool, typer.Option("--plan", help="rank the layouts of --devices N that fit, by step time")]
DevicesOpt = Annotated[int | None, typer.Option("--devices", help="devices for --plan (with --parallel: checked)")]
TopOpt = Annotated[int | None, typer.Option("--top", help="plans to show (default 10)")]


def _options(**kw: Any) -> dict[str, Any]:
    """The analyzer's settings from the flags, each bounded; the outputs checked before any work."""
    for name, flag in (("batch", "--batch"), ("seq", "--seq"), ("dec_seq", "--dec-seq"), ("kv_len", "--kv-len")):
        limits.bounded(kw[name], flag, 1, limits.MAX_SYMBOLIC)
    limits.argument_length(kw["sweep"], "--sweep")
    device = kw["device"]
    inputs = [(device, f"the device profile {device}") if device and Path(device).is_file() else None]
    link = kw.get("interconnect")
    inputs.append((link, f"the interconnect profile {link}") if link and Path(link).is_file() else None)
    if kw["plot"]:
        from ..io import image_format

        image_format(kw["plot"])
        output(kw["plot"], *inputs)
        if kw["output"] and _same_path(kw["plot"], kw["output"]):
            raise SpecError("--plot and --output name the same file", file=str(kw["plot"]))
    if kw["output"]:
        output(kw["output"], *inputs)
    return {
        "batch": kw["batch"],
        "seq": kw["seq"],
        "dtype": kw["dtype"].value if kw["dtype"] else None,
        "dec_seq": kw["dec_seq"],
        "training": kw["training"],
        "recompute": kw["recompute"].value,
        "kv_len": kw["kv_len"],
        "device": kw["device"],
    }


@app.command()
def analyze(
    spec: SpecArg,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="batch size B (default 1)")] = None,
    seq: SeqOpt = None,
    dec_seq: DecSeqOpt = None,
    dtype: DtypeOpt = None,
    training: TrainingOpt = False,
    recompute: RecomputeOpt = Recompute.none,
    kv_len: KvOpt = None,
    format: FormatOpt = Format.table,
    device: DeviceOpt = None,
    sweep: SweepOpt = None,
    plot: PlotOpt = None,
    output: OutputOpt = None,
    sets: SetOpt = None,
    parallel: ParallelOpt = None,
    zero: ZeroOpt = None,
    sequence_parallel: SeqParOpt = False,
    micro_batch: MicroOpt = None,
    global_batch: GlobalOpt = None,
    interconnect: LinkOpt = None,
    plan: PlanOpt = False,
    devices: DevicesOpt = None,
    top: TopOpt = None,
    attention_impl: AttnImplOpt = None,
    pipeline_schedule: ScheduleOpt = None,
    virtual_stages: VirtualOpt = None,
    async_tp: AsyncTpOpt = False,
) -> None:
    """Parameters, FLOPs per category and layer, memory, and (with --device) a roofline, from the IR; with
    --parallel the per-device costs of a layout, with --plan the layouts of N devices ranked by step time."""
    from ..analysis import output as o
    from ..analysis.report import analyze as run
    from ..analysis.report_json import flatten
    from ..analysis.report_views import report_sections, title
    from ..analysis.sweep import DEFAULT, parse_sweep, run_sweep, sweep_csv_rows, sweep_section
    from .parallel_cmds import refuse_stray, run_parallel

    s = load(spec, sets)  # first: its file is an input no output may replace
    refuse_stray(parallel, plan, **{"--zero": zero, "--sequence-parallel": sequence_parallel,
                 "--micro-batch": micro_batch, "--global-batch": global_batch, "--interconnect": interconnect,
                 "--devices": devices, "--top": top, "--attention-impl": attention_impl,
                 "--pipeline-schedule": pipeline_schedule, "--virtual-stages": virtual_stages,
                 "--async-tp": async_tp})  # fmt: skip
    if recompute == Recompute.op and parallel is None and not plan:
        raise SpecError("--recompute op is priced per layout: add --parallel")
    if parallel is not None or plan:
        for flag, value in (("--batch", batch), ("--kv-len", kv_len), ("--sweep", sweep), ("--plot", plot)):
            if value is not None:
                hint = "the batch is --global-batch, split by dp and --micro-batch" if flag == "--batch" else None
                raise SpecError(f"{flag} does not apply to {'--plan' if plan else '--parallel'}", hint=hint)
    batch = 1 if batch is None else batch
    opts = _options(**locals())
    g = _lower(s)
    if parallel is not None or plan:
        head, sections, doc, rows = run_parallel(spec, sets, g, opts, locals())
        o.emit(format.value, head, sections, doc, rows, output, out)
        return
    if sweep or plot:
        var, values = parse_sweep(sweep or DEFAULT)
        sw = run_sweep(g, var, values, **opts)
        if plot:
            from ..analysis.cost_plot import plot_sweep

            err.print(f"wrote {plot_sweep(sw, plot)}")
        if sweep:
            head = title(sw.reports[0]).split(" · ")[0] + f" · sweep over {var}"
            o.emit(format.value, head, [sweep_section(sw)], sw.to_dict(), sweep_csv_rows(sw), output, out)
            return
    rep = run(g, **opts)
    rows: list[list[Any]] = [["key", "value"], *map(list, flatten(rep.to_dict()))]
    o.emit(format.value, title(rep), report_sections(rep), rep.to_dict(), rows, output, out)


@app.command()
def compare(
    specs: Annotated[
        list[str], typer.Argument(help="specs or presets; per-spec overrides as NAME@key=value@key=value")
    ],
    batch: BatchOpt = 1,
    seq: SeqOpt = None,
    dec_seq: DecSeqOpt = None,
    dtype: DtypeOpt = None,
    training: TrainingOpt = False,
    recompute: RecomputeOpt = Recompute.none,
    kv_len: KvOpt = None,
    format: FormatOpt = Format.table,
    device: DeviceOpt = None,
    sweep: SweepOpt = None,
    plot: PlotOpt = None,
    output: OutputOpt = None,
    sets: SetOpt = None,
) -> None:
    """Specs side by side (classic vs SwiGLU, MHA vs GQA, dense vs MoE, RNN vs Transformer against N)."""
    from ..analysis import compare as c
    from ..analysis import output as o
    from ..analysis.report import analyze as run
    from ..analysis.sweep import DEFAULT, parse_sweep, run_sweep

    graphs = [(label, _lower(load(ref, [*(sets or []), *extra]))) for label, ref, extra in _split_refs(specs)]
    opts = _options(**locals())
    if sweep or plot:
        var, values = parse_sweep(sweep or DEFAULT)
        sweeps = [run_sweep(g, var, values, **opts) for _, g in graphs]
        for (label, _), sw in zip(graphs, sweeps, strict=True):
            for r in sw.reports:
                r.name = label
        if plot:
            from ..analysis.cost_plot import plot_compare

            err.print(f"wrote {plot_compare(sweeps, plot)}")
        if sweep:
            head = f"compare: {', '.join(lb for lb, _ in graphs)} · sweep over {var}"
            o.emit(format.value, head, c.compare_sweep_sections(sweeps), c.compare_sweep_dict(sweeps),
                   c.compare_sweep_csv_rows(sweeps), output, out)  # fmt: skip
            return
    reports = []
    for label, g in graphs:
        r = run(g, **opts)
        r.name = label
        reports.append(r)
    s0 = reports[0].settings
    head = (
        f"compare · B={s0.batch}"
        + (f", N={seq}" if seq else ", N=context")
        + f" · {s0.dtype if dtype else 'spec dtypes'}"
    )
    o.emit(
        format.value,
        head,
        c.compare_sections(reports),
        c.compare_dict(reports),
        c.compare_csv_rows(reports),
        output,
        out,
    )


def _lower(spec: Any) -> Any:
    """The layer graph, carrying the spec's ``source`` (parameter counts follow an imported model's reference
    implementation: see specc/analysis/params.py)."""
    from ..ir.lower import lower

    g = lower(spec)
    g.meta.setdefault("source", getattr(spec, "source", None))
    return g


def _split_refs(specs: list[str]) -> list[tuple[str, str, list[str]]]:
    """``llama2-7b@attention.kv_heads=8`` → (label, "llama2-7b", ["attention.kv_heads=8"]); labels unique."""
    if not specs:
        raise SpecError("compare needs at least one spec", hint="e.g. specc compare gpt2 llama2-7b")
    out = []
    for ref in specs:
        base, *extra = ref.split("@")
        out.append((ref, base, extra))
    names = [_stem(b) for _, b, _ in out]
    return [
        (ref if names.count(names[i]) > 1 or extra else names[i], base, extra)
        for i, (ref, base, extra) in enumerate(out)
    ]


def _same_path(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or (
        os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    )


def _stem(ref: str) -> str:
    return Path(ref).stem if ref.endswith((".yaml", ".yml")) else ref
