"""A Griffe extension that makes the docstrings' reStructuredText habits render in the API reference.

drivetrain's docstrings are Google style, with some Sphinx and doctest habits that editors and
``help()`` show well but Markdown does not. While the API reference is built, each docstring's text
is rewritten (the source stays as it is):

* Sphinx roles (``:class:`~drivetrain.Trainer```, ``:meth:`fit```, ``:func:``, ``:attr:``,
  ``:mod:``, ``:data:``, ``:exc:``, ``:obj:``) become cross-references. A name without a package
  is looked up from the docstring's own scope (its class, module and their imports). A target the
  site does not document (a private module, torch) shows as code, without a link.
* Doctest examples (``>>>`` lines) become Python code blocks, without ``# doctest:`` directives.
* reStructuredText literal blocks (a paragraph ending in ``::`` and an indented block) become
  fenced code blocks.

It also drops instance attributes that have no docstring (what ``__init__`` stores, such as a
callback's arguments), which would otherwise be listed as ``attr name = name``; undocumented
methods, such as a base class's hooks, and dataclass fields stay listed.

Loaded by mkdocstrings (``extensions`` in mkdocs.yml); see docs/writing-docs.md.
"""

from __future__ import annotations

import ast
import html
import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?P<role>class|meth|func|attr|mod|data|exc|obj|const):`(?P<target>[^`]+)`")
DOCTEST_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")
FENCE = re.compile(r"^\s*(```|~~~)")
CALLABLE_ROLES = {"meth", "func"}


class SphinxHabits(griffe.Extension):
    """Rewrites each loaded object's docstring (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in list(_walk(pkg)):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
            if obj.is_class:
                for name, member in list(obj.members.items()):
                    if (
                        not member.is_alias
                        and member.is_attribute
                        and "instance-attribute" in member.labels
                        and "class-attribute" not in member.labels  # a dataclass field
                        and member.docstring is None
                    ):
                        del obj.members[name]


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


def rewrite(text: str, obj: Any = None) -> str:
    """The docstring ``text`` of ``obj`` with roles, doctests and literal blocks in Markdown."""
    lines = _fence_literal_blocks(_fence_doctests(text.splitlines()))
    out: list[str] = []
    fenced = False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else ROLE.sub(lambda m: _reference(m, obj), line))
    return "\n".join(out)


def _reference(match: re.Match[str], obj: Any) -> str:
    role, target = match["role"], match["target"].strip()
    short = target.startswith("~")
    name = target.lstrip("~").lstrip(".")
    if "<" in name and name.endswith(">"):  # :class:`text <target>`
        shown, name = name[: name.index("<")].strip(), name[name.index("<") + 1 : -1].strip()
    else:
        shown = name.rsplit(".", 1)[-1] if short else name
    if role in CALLABLE_ROLES and not shown.endswith(")"):
        shown += "()"
    identifier = _resolve(name, obj)
    return (
        f'<autoref identifier="{html.escape(identifier, quote=True)}" optional>'
        f"<code>{html.escape(shown, quote=False)}</code></autoref>"
    )


def _resolve(name: str, obj: Any) -> str:
    """The full dotted path ``name`` means in the scope of ``obj`` (``name`` itself if not found there)."""
    if obj is None or name.startswith("drivetrain."):
        return name
    first, _, rest = name.partition(".")
    scope = obj
    while scope is not None:
        try:
            base = scope.resolve(first)
        except Exception:  # griffe's NameResolutionError, or a scope that cannot resolve
            scope = scope.parent
            continue
        return f"{base}.{rest}" if rest else base
    return name


def _fence_doctests(lines: list[str]) -> list[str]:
    """Turn runs of ``>>>`` lines (with their ``...`` continuations and output) into fenced Python code."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(stripped)]
        block: list[str] = []
        while i < len(lines) and lines[i].strip():
            text = lines[i].strip()
            if text.startswith((">>>", "...")):
                code = text[4:] if len(text) > 3 and text[3] == " " else text[3:]
                block.append(DOCTEST_DIRECTIVE.sub("", code))
            else:
                block.append(f"# {text}")  # printed output, shown as a comment
            i += 1
        out.append(f"{indent}```python")
        out.extend(f"{indent}{line}" if line else "" for line in block)
        out.append(f"{indent}```")
    return out


def _fence_literal_blocks(lines: list[str]) -> list[str]:
    """Turn ``paragraph::`` + blank line + indented block into the paragraph and a fenced block."""
    out: list[str] = []
    i = 0
    fenced = False
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.rstrip().endswith("::"):
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        k = j
        while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) > indent):
            k += 1
        while k > j and not lines[k - 1].strip():
            k -= 1
        if k == j:  # no indented block follows: not a literal block
            out.append(line)
            i += 1
            continue
        paragraph = line.rstrip()[:-2].rstrip()
        if paragraph.strip():
            out.append(paragraph + ":")
        out.append("")
        body = textwrap.dedent("\n".join(lines[j:k]))
        pad = " " * indent
        out.append(f"{pad}```{_language(body)}")
        out.extend(f"{pad}{text}" if text else "" for text in body.splitlines())
        out.append(f"{pad}```")
        i = k
    return out


def _language(code: str) -> str:
    try:
        ast.parse(code)
    except SyntaxError:
        return "bash" if re.match(r"\s*(python|drivetrain|torchrun|srun|pip|\$)\b", code) else "text"
    return "python"
