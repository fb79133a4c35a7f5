"""Find the fenced code blocks of a docs page and turn them into a program (docs/writing-docs.md).

- a ``python`` block without attributes runs: the page's such blocks, in order, are one program;
- a block of any language with ``title="NAME"`` is a file written as NAME beside that program;
- a block whose previous non-blank line is ``<!-- skip -->`` is neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SKIP_MARKER = "<!-- skip -->"
_OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_TITLE = re.compile(r"""title=["']([^"']+)["']""")


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block: its language, title (if any), first code line (1-based) and code."""

    language: str
    title: str | None
    line: int
    code: str
    skipped: bool

    @property
    def runs(self) -> bool:
        return self.language == "python" and self.title is None and not self.skipped

    @property
    def is_file(self) -> bool:
        return self.title is not None and not self.skipped


def code_blocks(text: str, where: str = "<page>") -> list[CodeBlock]:
    """Every fenced block of ``text``, in order; an unclosed fence is a ``ValueError`` naming its line."""
    lines = text.splitlines()
    found: list[CodeBlock] = []
    previous = ""
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index])
        if opening is None:
            if lines[index].strip():
                previous = lines[index].strip()
            index += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = index + 1
        while end < len(lines) and closing.match(lines[end]) is None:
            end += 1
        if end == len(lines):
            raise ValueError(f"{where}:{index + 1}: the code block opened here is never closed")
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[index + 1 : end]]
        title = _TITLE.search(info)
        found.append(
            CodeBlock(
                language=info.split()[0].lstrip("{.").rstrip("}") if info else "",
                title=title.group(1) if title else None,
                line=index + 2,
                code="\n".join(body),
                skipped=previous == SKIP_MARKER,
            )
        )
        previous = lines[end].strip()
        index = end + 1
    return found


def page_program(blocks: list[CodeBlock]) -> str:
    """The running blocks as one script whose line numbers are the page's (blank lines fill the gaps)."""
    lines: list[str] = []
    for block in blocks:
        if not block.runs:
            continue
        lines += [""] * (block.line - 1 - len(lines))
        lines += block.code.splitlines()
    return "\n".join(lines) + "\n"


def write_page_files(blocks: list[CodeBlock], folder: Path) -> list[Path]:
    """Write the titled blocks into ``folder``; return their paths."""
    written = []
    for block in blocks:
        if block.is_file:
            path = folder / block.title  # type: ignore[operator]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code + "\n")
            written.append(path)
    return written
