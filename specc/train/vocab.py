"""Token vocabularies of the training tasks: a list of symbols indexed by token id.

Seq2seq tasks reserve ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2; data symbols follow. Character-level LM
vocabularies are the sorted characters of the text (no specials: windows never need padding). A checkpoint
stores the symbol list, so ``attention-map`` and ``run`` can read and label tokens without the task code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")


@dataclass(frozen=True)
class Vocab:
    symbols: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.symbols)

    @property
    def has_specials(self) -> bool:
        return self.symbols[: len(SPECIALS)] == SPECIALS

    def label(self, token: int) -> str:
        return self.symbols[token] if 0 <= token < len(self.symbols) else f"#{token}"

    def encode_words(self, text: str) -> list[int]:
        """Whitespace-separated data symbols → ids (``"3 1 4"`` → ``[6, 4, 7]``); specials are not data."""
        index = {s: i for i, s in enumerate(self.symbols) if s not in SPECIALS}
        words = text.split()
        if not words:
            raise SpecError("--input is empty", hint='give whitespace-separated tokens, e.g. --input "3 1 4 1 5"')
        bad = [w for w in words if w not in index]
        if bad:
            data = [s for s in self.symbols if s not in SPECIALS]
            shown = f"{data[0]} … {data[-1]}" if len(data) > 12 else " ".join(data)
            raise SpecError(
                f"input token {bad[0]!r} is outside the vocabulary ({len(data)} symbols: {shown})",
                hint="tokens are the task's symbols, separated by spaces",
            )
        return [index[w] for w in words]

    def decode(self, ids: list[int], sep: str = " ") -> str:
        return sep.join(self.label(i) for i in ids)


def symbol_vocab(symbols: list[str]) -> Vocab:
    return Vocab((*SPECIALS, *symbols))


def char_vocab(text: str) -> Vocab:
    return Vocab(tuple(sorted(set(text))))
