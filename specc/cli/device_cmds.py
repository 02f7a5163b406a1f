"""``specc calibrate`` (fit a device profile to measured runs) and ``specc profile-device`` (measure this machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import SpecError
from .app import app, out


@app.command()
def calibrate(
    runs: Annotated[str, typer.Argument(help="measured runs: .json ({rows: [...]}) or .csv")],
    output: Annotated[str, typer.Option("--output", "-o", help="the fitted device profile (YAML)")],
    device: Annotated[str, typer.Option("--device", "-d", help="the profile to start from: a100 | h100 | .yaml")],
    interconnect: Annotated[
        str | None, typer.Option("--interconnect", help="the runs' interconnect (default: as --parallel's)")
    ] = None,
    fit: Annotated[
        str | None,
        typer.Option("--fit", help="parameters to fit, comma-separated (default matmul.max,matmul.knee,memory.max)"),
    ] = None,
    link_output: Annotated[
        str | None, typer.Option("--link-output", help="write the fitted interconnect here (to fit link.*)")
    ] = None,
) -> None:
    """Fit a profile's efficiency parameters to measured runs; print each run's residual before and after."""
    from ..analysis.devices import device_yaml
    from ..analysis.layouts.calibrate import PARAMETERS
    from ..analysis.layouts.calibrate import fit as run_fit
    from ..analysis.layouts.links import interconnect_yaml
    from ..analysis.layouts.run import devices_and_links
    from ..analysis.layouts.runs import read_runs
    from ..io import atomic_write, note_input

    names = tuple(n.strip() for n in (fit or "matmul.max,matmul.knee,memory.max").split(",") if n.strip())
    for n in names:
        if n not in PARAMETERS:
            raise SpecError(f"--fit: cannot fit '{n}'", hint=f"fit any of {', '.join(PARAMETERS)}")
    if any(n.startswith("link.") for n in names) and link_output is None:
        raise SpecError("--fit link.* changes the interconnect profile: give --link-output PATH")
    note_input(runs)
    for ref in (device, interconnect):
        if ref and Path(ref).is_file():
            note_input(ref)
    data = read_runs(runs)
    dev, link = devices_and_links(device, interconnect)
    assert dev is not None and link is not None
    result = run_fit(data, dev, link, names)
    header = f"fitted by `specc calibrate {runs}` from {dev.name}: " + ", ".join(
        f"{k} = {v:.4g}" for k, v in result.values.items()
    )
    fitted = result.device
    sources = dict(fitted.sources) | {f"efficiency.{k}": f"fitted to {runs}" for k in names if "." in k}
    from dataclasses import replace

    atomic_write(output, device_yaml(replace(fitted, sources=sources), header), inputs=[runs])
    if link_output is not None:
        atomic_write(link_output, interconnect_yaml(result.link, header), inputs=[runs])
    out.print(f"fit of {len(names)} parameters to {len(data)} runs ({result.iterations} iterations):")
    for k, v in result.values.items():
        out.print(f"  {k} = {v:.4g}")
    out.print(f"{'run':30s} {'measured s':>11s} {'before s':>10s} {'after s':>10s} {'residual':>9s}")
    for b, a in zip(result.before, result.after, strict=True):
        out.print(
            f"{a.name[:30]:30s} {a.measured:11.4g} {b.predicted:10.4g} {a.predicted:10.4g} {100 * a.error:+8.1f}%"
        )
    errs = [abs(a.error) for a in result.after]
    out.print(f"mean |residual| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}%; wrote {output}")


@app.command("profile-device")
def profile_device(
    output: Annotated[str, typer.Option("--output", "-o", help="the device profile to write (YAML)")],
    device: Annotated[str, typer.Option("--device", "-d", help="cpu | cuda (default: cpu)")] = "cpu",
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: all)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="shorter timings (noisier)")] = False,
) -> None:
    """Measure this machine (GEMM rate by size and shape, memory bandwidth by size, launch overhead, runtime
    memory) into a device profile for ``specc analyze --device``."""
    import torch

    from ..analysis.devices import device_yaml
    from ..analysis.measure import measure
    from ..io import atomic_write
    from ..train import loop as _loop  # noqa: F401  (loaded as `specc train` loads it: the runtime context)
    from . import limits

    limits.bounded(threads, "--threads", 1, 4096)
    if device not in ("cpu", "cuda"):
        raise SpecError(f"--device {device} is unknown", hint="cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda: no CUDA GPU is visible to torch", hint="use --device cpu")
    m = measure(device, quick=quick, threads=threads)
    d = m.device
    atomic_write(output, device_yaml(d, f"{d.name}: {d.source}"))
    eff = d.efficiency
    out.print(f"{d.name}: {d.source}")
    for dt, p in d.peak_flops.items():
        out.print(f"  peak {dt}: {p / 1e9:.1f} GFLOP/s")
    out.print(f"  matmul efficiency {eff.matmul.max:.2f} · F/(F + {eff.matmul.knee:.3g}); dim_knee {eff.dim_knee:.1f}")
    out.print(f"  memory bandwidth {d.bandwidth / 1e9:.1f} GB/s, knee {eff.memory.knee:.3g} B")
    out.print(f"  vector {d.vector_flops / 1e9:.1f} GFLOP/s, kernel overhead {eff.kernel_overhead * 1e6:.1f} us")
    out.print(f"  runtime context {d.runtime.context / 2**20:.0f} MiB; wrote {output}")
