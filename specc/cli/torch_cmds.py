"""generate: autoregressive decoding with the PyTorch backend (KV cache, greedy or sampled)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import SpecError, check_ids
from . import limits
from .app import SetOpt, SpecArg, TrustPickleOpt, app, load, out


def _ids(text: str) -> list[int]:
    limits.argument_length(text, "--prompt-ids", 16 * limits.MAX_NEW_TOKENS)
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        bad = next(t for t in text.replace(",", " ").split() if not t.lstrip("-").isdigit())
        raise SpecError(f"--prompt-ids must be integers separated by spaces, got {bad[:40]!r}") from None
    if not ids:
        raise SpecError("--prompt-ids is empty", hint='e.g. --prompt-ids "1 2 3"')
    return ids


@app.command()
def generate(
    spec: SpecArg,
    prompt_ids: Annotated[str, typer.Option("--prompt-ids", "-p", help='prompt token ids, e.g. "1 2 3"')],
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", "-n", help="tokens to generate (at most the model's context)")
    ] = 20,
    weights: Annotated[
        Path | None, typer.Option("--weights", "-w", help="safetensors weights (with a checkpoint: instead of its own)")
    ] = None,
    temperature: Annotated[float, typer.Option(help="0 = greedy; else 0.001..100")] = 0.0,
    top_k: Annotated[int | None, typer.Option("--top-k", help="sample from the k likeliest")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="nucleus sampling mass, 0..1")] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the sampler")] = None,
    eos_id: Annotated[int | None, typer.Option("--eos-id", help="stop once every row produced it")] = None,
    decoder_start_id: Annotated[
        int | None,
        typer.Option(
            "--decoder-start-id",
            "--start-id",
            help="encoder-decoders' first decoder token (default: the spec's decoder_start_token, else 1, <bos>)",
        ),
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="recompute the whole context each step")] = False,
    compile_: Annotated[
        bool,
        typer.Option("--compile", help="decode through torch.compile over a static cache (compiles first: seconds)"),
    ] = False,
    trust_pickled_checkpoint: TrustPickleOpt = False,
    sets: SetOpt = None,
) -> None:
    """Generate token ids from a spec (random or given weights) or a `compile --target torch` checkpoint.

    Decoders print the prompt followed by the new ids; encoder-decoders read the prompt as the source and print
    the decoder sequence (start id, then the new ids).
    """
    import torch

    from ..backends.torch import GenerationError, build_torch, load_checkpoint

    limits.bounded(max_new_tokens, "--max-new-tokens", 1, limits.MAX_NEW_TOKENS)
    limits.temperature(temperature)
    limits.bounded(top_k, "--top-k", 1, limits.MAX_TOP_K)
    limits.bounded(top_p, "--top-p", 0.0, 1.0)
    limits.seed(seed)
    ids = _ids(prompt_ids)
    if compile_ and no_cache:
        raise SpecError("--compile decodes through the KV cache; --no-cache recomputes: choose one")
    if spec.endswith(".onnx"):
        raise SpecError(
            f"{spec} is an ONNX model; generate runs specs and torch checkpoints",
            hint=f'specc run {spec} --input-ids "{prompt_ids}" --generate {max_new_tokens}',
        )
    if Path(spec).is_dir():  # specc train --parallel -o DIR
        from ..parallel.sharded_checkpoint import load as load_distributed

        if sets:
            raise SpecError("--set does not apply to a checkpoint: its spec is stored in the folder")
        ck = load_distributed(spec, trust_pickle=trust_pickled_checkpoint)
        model = build_torch(ck.spec, weights=weights or ck.weights)
    elif spec.endswith(".safetensors") and Path(spec).is_file():
        if sets:
            raise SpecError("--set does not apply to a checkpoint: its spec is stored in the file")
        if weights is not None:  # the checkpoint's spec with these weights instead of its own
            from ..backends.torch.checkpoint import read_spec

            model = build_torch(read_spec(spec), weights=weights)
        else:
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
    if "input_features" in model.graph.inputs:  # Whisper: the source is audio features, not prompt ids
        raise SpecError(
            f"{meta['name']} reads input_features (audio), not prompt ids: generate takes token prompts only",
            hint="generate from features in Python: specc.build_torch(spec).generate(input_features, n)",
        )
    context = meta.get("context")
    if context and not meta.get("max_positions"):  # learned tables bound prompt + new: the model checks that
        limits.bounded(max_new_tokens, "--max-new-tokens", 1, min(int(context), limits.MAX_NEW_TOKENS),
                       "the model's context")  # fmt: skip
    target = meta.get("target_vocab_size") or meta.get("vocab_size")
    check_ids(ids, meta.get("vocab_size"), "prompt id")
    if decoder_start_id is None:
        decoder_start_id = meta.get("decoder_start_token_id", 1)
    check_ids([decoder_start_id], target, "--decoder-start-id")
    check_ids([] if eos_id is None else [eos_id], target, "--eos-id")
    seq2seq = {"decoder_start_token_id": decoder_start_id} if model.STEP_INPUT == "decoder_input_ids" else {}
    try:
        tokens = model.generate(
            torch.tensor([ids]),
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            eos_token_id=eos_id,
            use_cache=not no_cache,
            compile=compile_,
            **seq2seq,
        )
    except GenerationError as e:
        raise SpecError(str(e), hint="use fewer tokens, or a spec with a longer context") from None
    except torch._dynamo.exc.BackendCompilerFailed as e:  # --compile: inductor could not build the step
        raise SpecError(
            f"--compile: torch.compile failed: {str(e).strip().splitlines()[-1][:200]}",
            hint="run without --compile (on the CPU inductor needs a C++ compiler)",
        ) from None
    except RuntimeError as e:  # torch.multinomial on NaN / Inf probabilities
        if "probability tensor" not in str(e):
            raise
        raise SpecError(
            "sampling failed: the model's next-token probabilities are not finite numbers",
            hint="check the weights for NaN / Inf values, or use --temperature 0 (greedy)",
        ) from None
    out.print(" ".join(str(t) for t in tokens[0].tolist()))
