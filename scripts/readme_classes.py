"""Rewrite README.md's list of Hugging Face classes from the importer's registry (specc.interop.catalog).

python scripts/readme_classes.py          # rewrite the block
python scripts/readme_classes.py --check  # exit 1 if the README's block is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from specc.interop.catalog import replace_block

README = Path(__file__).resolve().parent.parent / "README.md"


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = replace_block(text)
    if "--check" in argv:
        if new != text:
            print("README.md's class list is stale: run python scripts/readme_classes.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        tmp = README.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(README)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
