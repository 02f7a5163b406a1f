"""A renderer-neutral table: title, columns, rows of strings, notes under it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    left: int = 1  # leading columns aligned left; the rest (numbers) right
    text_last: bool = False  # the last column is text (aligned left)

    def is_left(self, i: int) -> bool:
        return i < self.left or (self.text_last and i == len(self.columns) - 1)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])


def to_markdown(title: str, sections: list[Section]) -> str:
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        if s.columns:
            lines.append("| " + " | ".join(s.columns) + " |")
            lines.append("|" + "|".join(":---" if s.is_left(i) else "---:" for i in range(len(s.columns))) + "|")
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in s.rows]
            lines.append("")
        lines += [f"- {n}" for n in s.notes]
        if s.notes:
            lines.append("")
    return "\n".join(lines)


def to_rich(title: str, sections: list[Section]) -> list[object]:
    from rich.table import Table
    from rich.text import Text

    out: list[object] = [Text(title, style="bold")]
    for s in sections:
        if s.columns:
            t = Table(title=s.title, title_justify="left", title_style="bold", box=None, pad_edge=False)
            for i, c in enumerate(s.columns):
                t.add_column(c, justify="left" if s.is_left(i) else "right", no_wrap=i < s.left)
            for row in s.rows:
                t.add_row(*row)
            out.append(t)
        else:
            out.append(Text(s.title, style="bold"))
        for n in s.notes:
            out.append(Text(f"  {n}", style="dim"))
        out.append(Text(""))
    return out
