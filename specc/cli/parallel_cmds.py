"""``specc analyze --parallel`` and ``--plan``: one layout's per-device costs, or the ranked layouts of N devices.

Called by ``analyze`` (analyze_cmds.py) when either flag is given. A layout the spec cannot take is an error
located at the spec key in the way (``specs/llama2-7b.yaml:12:13: error: attention heads 32 are not divisible
by tp=3``); flags that only make sense with these modes are refused without them.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from . import limits


def refuse_stray(parallel: str | None, plan: bool, **given: Any) -> None:
    """Options of the parallel modes given without them (or with the wrong one) are errors, not ignored."""
    single = {"--zero", "--sequence-parallel", "--micro-batch", "--interconnect", "--global-batch", "--devices"}
    single |= {"--attention-impl", "--pipeline-schedule", "--virtual-stages", "--async-tp"}
    search = {"--devices", "--top", "--global-batch", "--interconnect"}
    layout = parallel is not None  # an empty --parallel "" is a layout to read (and refuse), not no layout
    if layout and plan:
        raise SpecError("--parallel and --plan exclude each other", hint="--plan searches the layouts itself")
    allowed = single if layout else search if plan else set()
    for flag, value in given.items():
        if value not in (None, False) and flag not in allowed:
            mode = "--parallel" if layout else "--plan" if plan else "--parallel or --plan"
            raise SpecError(f"{flag} needs {mode}" if not (layout or plan) else f"{flag} does not apply to {mode}")


def run_parallel(spec: str, sets: list[str] | None, g: Any, opts: dict[str, Any], kw: dict[str, Any]) -> tuple:
    """(title, sections, document, csv rows) for ``--parallel`` or ``--plan``."""
    from ..analysis.layouts import LayoutError, Training, layout_views, parse_layout
    from ..analysis.layouts.run import analyze_layout, devices_and_links, settings
    from ..analysis.layouts.search import plan
    from ..analysis.params import count_params
    from ..analysis.report_json import flatten

    for name in ("micro_batch", "global_batch", "top"):
        limits.bounded(kw[name], f"--{name.replace('_', '-')}", 1, limits.MAX_SYMBOLIC)
    limits.argument_length(kw["parallel"], "--parallel")
    try:
        seq, dtype = settings(g, opts["seq"], opts["dtype"])
        head = {
            "spec": {"name": g.meta.get("name", "?"), "family": g.meta.get("family"), "task": g.meta.get("task")},
            "settings": {"seq": seq, "dtype": dtype, "training": opts["training"]},
            "params": count_params(g).to_dict(),
        }
        name = str(g.meta.get("name", "?"))
        if kw["plan"]:
            if kw["devices"] is None:
                raise LayoutError("--plan needs --devices N", hint="e.g. --plan --devices 64")
            r = plan(g, kw["devices"], training=opts["training"], global_batch=kw["global_batch"], seq=seq,
                     dec_seq=opts["dec_seq"], dtype=dtype, device=opts["device"] or "h100",
                     interconnect=kw["interconnect"], top=kw["top"] or 10)  # fmt: skip
            mode = "training" if opts["training"] else "inference"
            text = f"{name} · plan for {kw['devices']} devices · N={seq} · G={r.global_batch} · {dtype} · {mode}"
            return text, layout_views.plan_sections(r), layout_views.plan_document(head, r), layout_views.plan_rows(r)
        lay = parse_layout(kw["parallel"])
        if kw["devices"] is not None and kw["devices"] != lay.devices:
            raise LayoutError(
                f"--parallel {lay.text()} lays out tp × pp × cp × dp = {lay.devices} devices, not --devices "
                f"{kw['devices']}",
                hint="make the product of the degrees equal the devices, or leave --devices out",
            )
        t = Training(
            zero=kw["zero"] or 0,
            sequence_parallel=bool(kw["sequence_parallel"]),
            recompute=opts["recompute"],
            micro_batch=kw["micro_batch"] or 1,
            global_batch=kw["global_batch"] or (kw["micro_batch"] or 1) * lay.dp,
            schedule=kw["pipeline_schedule"] or ("interleaved-1f1b" if (kw["virtual_stages"] or 1) > 1 else "1f1b"),
            virtual_stages=kw["virtual_stages"] or 1,
            attention=kw["attention_impl"],
            async_tp=bool(kw["async_tp"]),
        )
        c = analyze_layout(g, lay, training=t, is_training=opts["training"], seq=seq, dec_seq=opts["dec_seq"],
                           dtype=dtype, device=opts["device"], interconnect=kw["interconnect"])  # fmt: skip
        dev, link = devices_and_links(opts["device"], kw["interconnect"])
        doc = layout_views.layout_document(head, c, dev, link)
        rows: list[list[Any]] = [["key", "value"], *map(list, flatten(doc))]
        return layout_views.title(name, lay, c, seq, dtype), layout_views.layout_sections(c, dev, link), doc, rows
    except LayoutError as e:
        raise _located(e, spec, sets) from None


def _located(e: Any, spec: str, sets: list[str] | None) -> SpecError:
    """The error at the spec key it conflicts with (the file's line and column), else as it is."""
    if e.key is None:
        return e
    from ..spec.loader import apply_overrides, load_document

    doc = load_document(spec)
    apply_overrides(doc, sets or None)
    return SpecError([doc.loc(e.key).diag(e.message, e.hint)])
