"""The main job end to end on a preset: validate → lower → graph summary."""

from __future__ import annotations

import sys

from .cli import run


def main(argv: list[str]) -> int:
    spec = argv[0] if argv else "gpt2"
    steps = [["validate", spec], ["graph", spec]]
    for step in steps:
        print(f"\n$ specc {' '.join(step)}", flush=True)
        code = run(step)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
