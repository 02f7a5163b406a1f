"""Encoder-decoder greedy generation: the ONNX encoder + decoder pair (``--kv-cache``) vs HF ``generate``.

    python bench/onnx_encdec.py            # BART-base-sized twin (6 + 6 layers, d 768, vocab 50265)
    python bench/onnx_encdec.py --quick    # 2 + 2 layers
    (also run by bench/bench_onnx.py --encdec)

Same random weights everywhere (HF's BartForConditionalGeneration initialisation, saved with save_pretrained and
imported by ``specc.import_hf``), B=1, a source of 64 tokens, greedy with no EOS stop, same thread count;
timed round-robin with idle gaps (bench_onnx.interleaved): the ORT pair (the encoder once, the decoder with
self and cross caches: cross K/V projected on the first step only), the specc torch backend's generate
(KV cache), and HF ``generate`` (KV cache, sdpa, eval, inference mode). Tokens are compared with HF's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def bart(layers: int):
    import torch
    import transformers

    config = transformers.BartConfig(
        vocab_size=50265, d_model=768, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=12,
        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
        attn_implementation="sdpa",
    )  # fmt: skip
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's shard bar would land in the table
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    model.generation_config.update(eos_token_id=None, forced_eos_token_id=None, forced_bos_token_id=None,
                                   pad_token_id=1, do_sample=False, num_beams=1)  # fmt: skip
    return model


def run(quick: bool, threads: int, source: int, new_tokens: int) -> list[tuple[str, str, str]]:
    import torch
    from bench_onnx import interleaved

    import specc
    from specc.interop import import_hf
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    hf = bart(2 if quick else 6)
    start = hf.config.decoder_start_token_id
    ids = torch.randint(3, 50000, (1, source), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "bart"
        hf.save_pretrained(folder)
        imported = import_hf(folder)
        weights = str(folder / "model.safetensors")
        path = specc.export_onnx(imported.spec, Path(d) / "bart.onnx", weights=weights, kv_cache=True)
        om = OrtModel.open(path, "cpu", threads)
        ours = specc.build_torch(imported.spec, weights=weights).eval()
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, attention_mask=mask, use_cache=True)
        with torch.inference_mode():
            want = hf.generate(ids, **kw)[:, 1:].numpy()
            got = greedy(om, feeds, new_tokens, start_id=start)
            mine = ours.generate(ids, new_tokens, attention_mask=mask, decoder_start_token_id=start)[:, -new_tokens:]
            t = interleaved(
                {
                    "ort": lambda: greedy(om, feeds, new_tokens, start_id=start),
                    "ours": lambda: ours.generate(ids, new_tokens, attention_mask=mask, decoder_start_token_id=start),
                    "hf": lambda: hf.generate(ids, **kw),
                },
                2 if quick else 3,
                1,
            )
    name = f"BART {'2+2' if quick else '6+6'} layers, source {source}, {new_tokens} new"
    return [
        (f"greedy {name}: ORT encoder + decoder pair", f"{new_tokens / t['ort']:.1f} tok/s",
         f"{t['hf'] / t['ort']:.2f}× HF; ids equal to HF: {int((got == want).sum())}/{new_tokens}"),
        (f"greedy {name}: specc torch backend", f"{new_tokens / t['ours']:.1f} tok/s",
         f"{t['hf'] / t['ours']:.2f}× HF; ids equal to HF: {int((mine.numpy() == want).sum())}/{new_tokens}"),
        (f"greedy {name}: HF generate (KV cache)", f"{new_tokens / t['hf']:.1f} tok/s", "1.00× HF"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 + 2 layers, 8 new tokens")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: usable cores)")
    ap.add_argument("--source", type=int, default=64, help="source tokens")
    ap.add_argument("--new-tokens", type=int, default=None, help="generated tokens (default 64; quick 8)")
    args = ap.parse_args(argv)

    import torch
    from cpu_info import cpu_model

    from specc.runtime.ort_session import default_threads

    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    rows = run(args.quick, threads, args.source, args.new_tokens or (8 if args.quick else 64))
    print(f"command: python bench/onnx_encdec.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"machine: {cpu_model()}, {threads} threads; onnxruntime {__import__('onnxruntime').__version__}, "
          f"torch {torch.__version__}, transformers {__import__('transformers').__version__}; "
          "other load on the machine adds noise\n")  # fmt: skip
    print("| measurement | value | ratio |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
