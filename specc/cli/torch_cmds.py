"""generate: autoregressive decoding with the PyTorch backend (KV cache, greedy or sampled)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import SpecError, check_ids
from .app import SetOpt, SpecArg, app, load, out


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise SpecError(f"--prompt-ids must be integers separated by spaces, got {text!r}") from None
    if not ids:
        raise SpecError("--prompt-ids is empty", hint='e.g. --prompt-ids "1 2 3"')
    return ids


@app.command()
def generate(
    spec: SpecArg,
    prompt_ids: Annotated[str, typer.Option("--prompt-ids", "-p", help='prompt token ids, e.g. "1 2 3"')],
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", min=1, help="tokens to generate")] = 20,
    weights: Annotated[Path | None, typer.Option("--weights", "-w", help="safetensors weights")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy")] = 0.0,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, help="sample from the k likeliest")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", min=0.0, max=1.0, help="nucleus sampling mass")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the sampler")] = None,
    eos_id: Annotated[int | None, typer.Option("--eos-id", help="stop once every row produced it")] = None,
    decoder_start_id: Annotated[
        int,
        typer.Option(
            "--decoder-start-id", "--start-id", help="encoder-decoders: first decoder token (specc's <bos> is 1)"
        ),
    ] = 1,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="recompute the whole context each step")] = False,
    sets: SetOpt = None,
) -> None:
    """Generate token ids from a spec (random or given weights) or a `compile --target torch` checkpoint.

    Decoders print the prompt followed by the new ids; encoder-decoders read the prompt as the source and print
    the decoder sequence (start id, then the new ids).
    """
    import torch

    from ..backends.torch import GenerationError, build_torch, load_checkpoint

    ids = _ids(prompt_ids)
    if spec.endswith(".onnx"):
        raise SpecError(
            f"{spec} is an ONNX model; generate runs specs and torch checkpoints",
            hint=f'specc run {spec} --input-ids "{prompt_ids}" --generate {max_new_tokens}',
        )
    if spec.endswith(".safetensors") and Path(spec).is_file():
        if sets:
            raise SpecError("--set does not apply to a checkpoint: its spec is stored in the file")
        model = load_checkpoint(spec)
    else:
        model = build_torch(load(spec, sets), weights=weights)
    if getattr(model, "STEP_INPUT", None) is None:
        meta = model.graph.meta
        raise SpecError(
            f"{meta['name']} is a {meta['family']} model ({meta['task']}): nothing to generate",
            hint="generate works with decoder, encoder_decoder and rnn_seq2seq specs",
        )
    meta = model.graph.meta
    target = meta.get("target_vocab_size") or meta.get("vocab_size")
    check_ids(ids, meta.get("vocab_size"), "prompt id")
    check_ids([decoder_start_id], target, "--decoder-start-id")
    check_ids([] if eos_id is None else [eos_id], target, "--eos-id")
    try:
        tokens = model.generate(
            torch.tensor([ids]),
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            eos_token_id=eos_id,
            decoder_start_token_id=decoder_start_id,
            use_cache=not no_cache,
        )
    except GenerationError as e:
        raise SpecError(str(e), hint="use fewer tokens, or a spec with a longer context") from None
    out.print(" ".join(str(t) for t in tokens[0].tolist()))
