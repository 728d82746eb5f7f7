"""Where a text's structure lies: paragraphs, Markdown headings, sentences, as spans.

Everything here works on character offsets into the source, never on copies,
so a chunk built from these spans is always an exact slice of the source:

* paragraphs are blank-line separated blocks;
* headings are ATX lines (``# Title``) or setext underlines (``Title`` over
  ``===`` or ``---``), never inside fenced code; each opens a section, and the
  path of enclosing headings travels with every span;
* sentences end at Latin terminators before white space, at CJK terminators
  (``。！？；``), or at line breaks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_BLANK_LINES = re.compile(r"\n(?:[^\S\n]*\n)+")
_STRUCTURE_HINT = re.compile(r"(?m)^ {0,3}(?:#|=|-|```|~~~)")
_FENCE = re.compile(r" {0,3}(?:```|~~~)")
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*))?")
_ATX_CLOSE = re.compile(r"(?:^|[ \t]+)#+$")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*")
_SENTENCE_END = re.compile(
    r"(?:[.!?]+[\"')\]’”»]*(?=\s)|[。！？；]+[」』”’）〕】]*|(?=[^\S\n]*\n))(\s*)"
)
_NON_SPACE = re.compile(r"\S")

#: (start, end, paragraph, heading path, is_heading) of a segment of the source.
Span = tuple[int, int, int, tuple[str, ...], bool]


def structure(text: str) -> Iterator[Span]:
    """(start, end, paragraph, heading path, is_heading) of each non-blank segment."""
    para, in_fence = -1, False
    stack: list[tuple[int, str]] = []
    path: tuple[str, ...] = ()
    for block_start, block_end in _blocks(text):
        span = _strip(text, block_start, block_end)
        if span is None:
            continue
        para += 1
        if not _STRUCTURE_HINT.search(text, block_start, span[1]):
            yield span[0], span[1], para, path, False
            continue
        # Scan from the block's first line start so indentation rules see the real line.
        segments, in_fence = _block_segments(text, block_start, span[1], in_fence)
        for start, end, level, title in segments:
            if level:
                stack = [entry for entry in stack if entry[0] < level] + [(level, title)]
                path = tuple(entry[1] for entry in stack)
            stripped = _strip(text, start, end)
            if stripped is not None:
                yield stripped[0], stripped[1], para, path, bool(level)


def _blocks(text: str) -> Iterator[tuple[int, int]]:
    """Spans between blank lines (not yet stripped)."""
    start = 0
    for match in _BLANK_LINES.finditer(text):
        yield start, match.start()
        start = match.end()
    yield start, len(text)


def _block_segments(
    text: str, start: int, end: int, in_fence: bool
) -> tuple[list[tuple[int, int, int, str]], bool]:
    """Split one block into (start, end, heading level or 0, title) segments by line."""
    segments: list[tuple[int, int, int, str]] = []
    body = -1  # start of the pending body lines, -1 when none
    plain = True  # the pending body lines could form a setext heading
    pos = start
    while pos < end:
        line_end = text.find("\n", pos, end)
        line_end = end if line_end < 0 else line_end
        line = text[pos:line_end].rstrip()
        atx = None if in_fence else _ATX.fullmatch(line)
        setext = None if in_fence or body < 0 or not plain else _SETEXT.fullmatch(line)
        if atx or setext:
            if atx and body >= 0:
                segments.append((body, pos, 0, ""))
            first = pos if atx else body
            segments.append((first, line_end, *_heading_of(text, first, pos, atx, setext)))
            body, plain = -1, True
        else:
            if _FENCE.match(line):
                in_fence, plain = not in_fence, False
            body = pos if body < 0 else body
        pos = line_end + 1
    if body >= 0:
        segments.append((body, end, 0, ""))
    return segments, in_fence


def _heading_of(
    text: str, first: int, underline: int, atx: re.Match | None, setext: re.Match | None
) -> tuple[int, str]:
    """The level and title of an ATX line or of setext lines above an underline."""
    if atx:
        title = _ATX_CLOSE.sub("", (atx.group(2) or "").strip())
        return len(atx.group(1)), " ".join(title.split())
    assert setext is not None
    return (1 if setext.group(1)[0] == "=" else 2), " ".join(text[first:underline].split())


def sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Stripped, non-empty sentence spans of ``text[start:end]``."""
    cuts = [(m.start(1), m.end()) for m in _SENTENCE_END.finditer(text, start, end)]
    return _between(text, start, end, cuts)


def char_pieces(text: str, start: int, end: int, size: int) -> list[tuple[int, int]]:
    """Cut a long span into pieces of at most ``size`` characters.

    Prefer the last sentence end, else the last white space, in the second half of
    each window; a run with neither (one huge "word") is cut anywhere.
    """
    cuts, pos = [], start
    while end - pos > size:
        limit, half = pos + size, pos + size // 2
        ends = [m.end() for m in _SENTENCE_END.finditer(text, half, limit) if m.end() < limit]
        cut = ends[-1] if ends else max(text.rfind(ch, half, limit) for ch in " \n\t\u3000")
        pos = cut if cut > pos else limit
        cuts.append((pos, pos))
    return _between(text, start, end, cuts)


def _between(text: str, start: int, end: int, cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Stripped non-empty spans between cuts, each cut being (end of one, start of next)."""
    spans = []
    for stop, resume in [*cuts, (end, end)]:
        span = _strip(text, start, stop)
        if span is not None:
            spans.append(span)
        start = resume
    return spans


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    """``(start, end)`` without surrounding white space, or None if nothing is left."""
    first = _NON_SPACE.search(text, start, end)
    if first is None:
        return None
    while text[end - 1].isspace():
        end -= 1
    return first.start(), end
