"""The onnxruntime-genai side of bench/bench_peers.py, run by the peer environment's python (torch, transformers,
plain onnxruntime, onnxruntime-genai: bench/requirements-peers.txt); it imports nothing of specc.

    python bench/peers_worker.py twin OUT --arch llama --config '{...}'        random-weight twin + char tokenizer
    python bench/peers_worker.py train OUT --text FILE --steps N               a trained char-level Llama twin
    python bench/peers_worker.py decode FOLDER --prompt 32 --new 64 --threads T   genai greedy: ids, tok/s
    python bench/peers_worker.py prefill FOLDER --tokens 512 --threads T       genai: one 512-token forward
    python bench/peers_worker.py hf-ids HF --prompt 32 --new 64                HF greedy ids (the reference)
    python bench/peers_worker.py kl HF ONNX_FOLDER... --text FILE --windows W  mean KL(HF fp32 ‖ graph)
Each prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

VOCAB_CHARS = 128  # the char tokenizer: byte values below 128, one id each
LM_VOCAB = 256  # the char LM's vocabulary (ids ≥ 128 unused). Not 128: with vocabulary = width = 128 the builder's
# fp32 graph disagrees with HF (max |Δlogit| 14.6 at 16 tokens, tied or not; at 256 it agrees to 2e-5), 0.18.0


def char_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer whose ids are character codes (enough for the builder, which saves one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = {chr(i): i for i in range(min(vocab, VOCAB_CHARS))}
    table.update({f"<t{i}>": i for i in range(len(table), vocab)})
    tok = Tokenizer(models.WordLevel(table, unk_token=chr(0)))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=chr(1), eos_token=chr(2), unk_token=chr(0))
    fast.save_pretrained(folder)


def twin(args: argparse.Namespace) -> dict:
    import torch
    import transformers

    cfg = json.loads(args.config)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[args.arch]
    config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**cfg, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config).eval()
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.out)
    char_tokenizer(Path(args.out), config.vocab_size)
    return {"params": params}


def train(args: argparse.Namespace) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    data = np.frombuffer(Path(args.text).read_bytes(), np.uint8).astype(np.int64) % VOCAB_CHARS
    split = int(0.9 * len(data))
    config = LlamaConfig(vocab_size=LM_VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        starts = gen.integers(0, split - 65, 32)
        batch = torch.from_numpy(np.stack([data[s : s + 65] for s in starts]))
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(args.out)
    char_tokenizer(Path(args.out), LM_VOCAB)
    return {"loss": float(loss), "seconds": time.perf_counter() - t0, "steps": args.steps}


def _model(folder: str, threads: int):
    import onnxruntime_genai as og

    path = Path(folder) / "genai_config.json"  # the same thread settings for every graph (CPU provider)
    data = json.loads(path.read_text())
    data["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    data["model"]["decoder"]["session_options"]["inter_op_num_threads"] = 1
    path.write_text(json.dumps(data, indent=4))
    return og.Model(folder)


def _prompt(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(1).integers(3, 100, n)]


def decode(args: argparse.Namespace) -> dict:
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    model = _model(args.folder, args.threads)
    load = time.perf_counter() - t0
    prompt, best, ids = _prompt(args.prompt), float("inf"), []
    for _ in range(args.reps):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=args.prompt + args.new)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        t = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        best = min(best, time.perf_counter() - t)
        ids = [int(x) for x in gen.get_sequence(0)][args.prompt :]
    return {"ids": ids, "tok_s": (len(ids) - 1) / best, "load_s": load}


def prefill(args: argparse.Namespace) -> dict:
    import onnxruntime_genai as og

    model = _model(args.folder, args.threads)
    prompt, best = _prompt(args.tokens), float("inf")
    for _ in range(args.reps):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=args.tokens + 1)
        gen = og.Generator(model, params)
        t = time.perf_counter()
        gen.append_tokens(prompt)  # one forward over the whole prompt
        best = min(best, time.perf_counter() - t)
    return {"seconds": best}


def hf_ids(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    prompt = torch.tensor([_prompt(args.prompt)])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=args.new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return {"ids": [int(t) for t in out[0, args.prompt :]]}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _onnx_logits(folder: Path, ids: np.ndarray, threads: int) -> np.ndarray:
    """Logits of a KV-cache graph (specc's or the builder's) on a batch, from an empty cache."""
    import onnxruntime as ort

    model = next(p for p in sorted(folder.glob("*.onnx")))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    b, n = ids.shape
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name == "input_ids":
            feeds[inp.name] = ids
        elif inp.name == "attention_mask":
            feeds[inp.name] = np.ones((b, n), np.int64)
        elif inp.name == "position_ids":
            feeds[inp.name] = np.broadcast_to(np.arange(n, dtype=np.int64), (b, n)).copy()
        elif inp.name.startswith("past_key_values"):
            decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
            feeds[inp.name] = np.zeros((b, decoder["num_key_value_heads"], 0, decoder["head_size"]), np.float32)
    return sess.run(["logits"], feeds)[0]


def kl(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    data = np.frombuffer(Path(args.text).read_bytes(), np.uint8).astype(np.int64) % VOCAB_CHARS
    val = data[int(0.9 * len(data)) :]
    starts = np.linspace(0, len(val) - 129, args.windows).astype(int)
    ids = np.stack([val[s : s + 128] for s in starts])
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = _log_softmax(model(input_ids=torch.from_numpy(ids)).logits.numpy())
    labels = np.stack([val[s + 1 : s + 129] for s in starts])
    out = {"hf_ppl": float(np.exp(-np.take_along_axis(ref, labels[..., None], -1).mean()))}
    for folder in args.graphs:
        lp = _log_softmax(_onnx_logits(Path(folder), ids, args.threads))
        out[Path(folder).name] = {
            "kl": float((np.exp(ref) * (ref - lp)).sum(-1).mean()),
            "ppl": float(np.exp(-np.take_along_axis(lp, labels[..., None], -1).mean())),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("twin")
    s.add_argument("out")
    s.add_argument("--arch", default="llama")
    s.add_argument("--config", required=True)
    s = sub.add_parser("train")
    s.add_argument("out")
    s.add_argument("--text", required=True)
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--threads", type=int, default=2)
    for name in ("decode", "prefill"):
        s = sub.add_parser(name)
        s.add_argument("folder")
        s.add_argument("--prompt", type=int, default=32)
        s.add_argument("--new", type=int, default=64)
        s.add_argument("--tokens", type=int, default=512)
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--reps", type=int, default=2)
    s = sub.add_parser("hf-ids")
    s.add_argument("hf")
    s.add_argument("--prompt", type=int, default=32)
    s.add_argument("--new", type=int, default=64)
    s.add_argument("--threads", type=int, default=2)
    s = sub.add_parser("kl")
    s.add_argument("hf")
    s.add_argument("graphs", nargs="+")
    s.add_argument("--text", required=True)
    s.add_argument("--windows", type=int, default=16)
    s.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    fn = {"twin": twin, "train": train, "decode": decode, "prefill": prefill, "hf-ids": hf_ids, "kl": kl}
    print(json.dumps(fn[args.cmd](args)))


if __name__ == "__main__":
    main()
