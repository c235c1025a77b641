"""What counts as a measured figure in a page's own text (outside its generated blocks).

Measured figures live in ``docs/benchmarks/*.json`` and reach a page only through a generated
block. In the text around the blocks, a *measured figure* is a number written as a result:

- a rate: a number followed by a per-second unit (``81.2 samples/s``, ``3 GB/s``, ``120 tokens/s``);
- a ratio: a number followed by ``×`` or ``x`` (``1.5×``, ``2x``), but not a product of two numbers
  (``8 × 1024-token groups``);
- a percentage: a number followed by ``%``;
- a change: a number, an arrow and a number (``0.007 → 0.995``).

Not figures: anything in code (fences and inline code: settings, defaults, commands), bounds and
targets written after ``≥``, ``≤``, ``<`` or ``>`` (``speedup ≥ 2×``), and plain numbers such as
counts, sizes of a preset or a default in words. A page that needs a measured number puts it in a
figures file and a block.
"""

from __future__ import annotations

import re

from docs.gen.blocks import outside_blocks

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_URL = re.compile(r"\]\([^)]*\)")
_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_BOUND = r"(?<![≥≤<>]\s)(?<![≥≤<>])"
FIGURE = re.compile(
    _BOUND
    + _NUMBER
    + r"(?:\s?(?:[kKMGT]i?B|[kKMG]?bit|samples|tokens|groups|requests|calls|steps|episodes|versions|TFLOP|it)/s\b"
    + r"|\s?[×x](?![\w])(?!\s?\d)"
    + r"|\s?%"
    + r"|\s?(?:→|->)\s?\d)"
)


def text_of(page_text: str) -> str:
    """The page's own prose: blocks, code, comments and link targets left out."""
    text = outside_blocks(page_text)
    for pattern in (_FENCE, _COMMENT, _CODE, _URL):
        text = pattern.sub(" ", text)
    return text


def measured_figures(page_text: str) -> list[str]:
    """Every measured figure typed into the page's own text, with a little context."""
    text = text_of(page_text)
    found = []
    for match in FIGURE.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        found.append(text[start : end if end >= 0 else len(text)].strip())
    return found
