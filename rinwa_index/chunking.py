"""The tokenizer-based structural chunker: text → chunks with offsets, paragraphs, headings.

Structure first: blank-line separated blocks are paragraphs; Markdown headings (ATX
``# …``, setext underlines; not inside fenced code) are units of their own and open
a section. A block that fits the target stays whole, a longer one is split into
sentences (Latin terminators before white space, CJK terminators, line breaks), a
sentence over the hard limit into token windows. Units are packed greedily:

* up to ``params.target`` tokens, never above ``min(params.maximum, max_tokens)``; a
  chunk below ``params.minimum`` may grow to that maximum (a heading is never alone);
* a heading starts a new chunk unless the section so far is below the minimum (a
  title straight above a sub-heading): that is carried into the next section's chunk,
  whose heading path is then what the two share;
* a cut inside a paragraph repeats ``params.overlap`` tokens: whole trailing sentences
  when they fit, else a token window of the last one;
* a last piece of a section or text below the minimum merges into the previous chunk
  when the result fits under the maximum;
* a chunk spans at most ``MAX_CHARS_PER_TOKEN`` characters per token of the limit, so
  text the model sees as one ``[UNK]`` (a megabyte without spaces) stays bounded.

Sizes count the *formatted* input (document prefix + text + special tokens) with the
model's tokenizer. Text is tokenised once, in batches; offsets are read only where a
block must be split. With a BERT pipeline (WordPiece encodes pre-tokens independently)
a chunk whose internal cuts all fall on pre-token boundaries, as the tokenizer's own
normaliser and pre-tokeniser decide, has an exact count by construction; any other
chunk (other tokenizers, mid-word cuts, special-token strings in the text) is
re-encoded, and split again if over the limit.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .config import ChunkParams
from .errors import ChunkingError
from .models import Manifest, load_tokenizer
from .structure import Span, char_pieces, sentences, structure

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

#: A chunk spans at most this many characters per token of the hard limit.
MAX_CHARS_PER_TOKEN = 16
_BATCH_CHARS = 1 << 18  # text per encode_batch call: bounds tokenizer memory, keeps threads busy
_ADDITIVE = ("BertNormalizer", "BertPreTokenizer", "WordPiece")
_POST = {"NoneType", "TemplateProcessing", "BertProcessing", "RobertaProcessing"}

_SURROGATE = re.compile("[\ud800-\udfff]")

_Ints = np.ndarray  # token offsets (int64)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: an exact slice ``source[char_start:char_end]`` and where it sits."""

    ord: int
    text: str
    token_count: int  # of the formatted input (doc prefix + text) incl. special tokens
    char_start: int
    char_end: int
    paragraph_start: int
    paragraph_end: int
    heading_path: tuple[str, ...]


def chunk_key(item_id: int, source_kind: str, source_hash: str, signature: str, ord: int) -> str:
    """A deterministic key for one chunk row: 32 hex digits of SHA-256 over the fields."""
    fields = json.dumps([item_id, source_kind, source_hash, signature, ord], separators=(",", ":"))
    return hashlib.sha256(fields.encode("utf-8")).hexdigest()[:32]


def chunker_for(manifest: Manifest, params: ChunkParams, model_dir: Path) -> Chunker:
    """The chunker for ``manifest``'s tokenizer, hard limit and document prefix."""
    tokenizer = load_tokenizer(manifest, model_dir)
    return Chunker(
        tokenizer, params, max_tokens=manifest.max_tokens, doc_prefix=manifest.doc_prefix
    )


@dataclass(slots=True)
class _Unit:
    """A span that is packed whole: a heading, a block, a sentence or a token window."""

    start: int
    end: int
    tokens: int
    para: int
    path: tuple[str, ...]
    _: KW_ONLY  # the flags below are easy to mix up positionally
    heading: bool = False
    exact: bool = True  # ``tokens`` equals the standalone count of the span
    joins: bool = True  # the cut before it (from the previous unit) is a pre-token boundary
    toks: tuple[_Ints, _Ints, int, int] | None = None  # token starts, ends; range lo:hi


@dataclass(slots=True)
class _Draft:
    """A chunk being built: its units, content tokens, and its exact count once known."""

    units: list[_Unit]
    tokens: int
    count: int | None = None


class Chunker:
    """Splits text into chunks that fit the model's hard limit, structure first."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        params: ChunkParams,
        *,
        max_tokens: int,
        doc_prefix: str = "",
    ) -> None:
        if tokenizer.truncation is not None or tokenizer.padding is not None:
            # Truncation or padding would make counts wrong; never change the caller's object.
            from tokenizers import Tokenizer as _Tokenizer

            tokenizer = _Tokenizer.from_str(tokenizer.to_str())
            tokenizer.no_truncation()
            tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.params = params
        self.doc_prefix = doc_prefix
        self.limit = min(params.maximum, max_tokens)
        self.overhead = self.count_tokens("")
        self.budget = self.limit - self.overhead
        if self.budget < 1:
            raise ChunkingError(
                f"The document prefix and special tokens take {self.overhead} tokens, leaving no "
                f"room under the limit of {self.limit}; use a shorter prefix or a larger maximum."
            )
        self.target = max(1, min(params.target - self.overhead, self.budget))
        self.minimum = max(0, min(params.minimum - self.overhead, self.target))
        self.overlap = min(params.overlap, self.target // 2)
        self.window = max(1, min(self.target, self.overlap or self.target // 4))
        self.max_chars = MAX_CHARS_PER_TOKEN * self.limit
        self.additive, self.added = _pipeline(tokenizer)
        self._splits: dict[str, bool] = {}
        self.prefix_clean = not doc_prefix or self.splits(doc_prefix[-1])

    def splits(self, ch: str) -> bool:
        """Whether ``ch`` always ends the pre-token before it and starts a new one after it."""
        known = self._splits.get(ch)
        if known is None:
            tok, probe = self.tokenizer, f"a{ch}a"
            if tok.normalizer is not None:
                probe = tok.normalizer.normalize_str(probe)
            pieces = [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(probe)]
            known = len(pieces) >= 2 and pieces[0] == "a" and pieces[-1] == "a"
            if len(self._splits) > 1 << 16:
                self._splits.clear()  # a cache, bounded
            self._splits[ch] = known
        return known

    def count_tokens(self, text: str) -> int:
        """The exact token count of ``doc_prefix + text`` with special tokens."""
        return len(self.tokenizer.encode(_for_tokenizer(self.doc_prefix + text)))

    def chunk(self, text: str) -> list[Chunk]:
        """The chunks of ``text`` in order; ``[]`` for empty or white-space-only text."""
        if not isinstance(text, str):
            raise ChunkingError(f"Only text can be chunked, not {type(text).__name__}.")
        if not text or text.isspace():
            return []
        return _Run(self, text).chunks()


class _Run:
    """The state of chunking one text (so a Chunker can be shared)."""

    def __init__(self, chunker: Chunker, text: str) -> None:
        self.c = chunker
        self.text = text
        # The Rust tokenizer rejects lone surrogates; U+FFFD keeps every offset equal.
        self.tok_text = _for_tokenizer(text)
        special = chunker.added is not None and chunker.added.search(self.tok_text)
        self.additive = chunker.additive and chunker.prefix_clean and not special

    def chunks(self) -> list[Chunk]:
        """Structure → units → packed drafts → exact counts → chunks."""
        packer = _Packer(self.c, self._tail)
        chunks: list[Chunk] = []
        for unit in self._units():
            packer.add(unit)
            if len(packer.out) > 256:
                # Settle all but the last draft (a small trailing piece may still merge into
                # it), so units and offsets of a long text are not all held at once.
                ready, packer.out = packer.out[:-1], packer.out[-1:]
                self._emit(ready, chunks)
        self._emit(packer.finish(), chunks)
        return chunks

    def _emit(self, drafts: list[_Draft], chunks: list[Chunk]) -> None:
        """Settle ``drafts`` and append them to ``chunks`` as numbered chunks."""
        for draft in self._settle(drafts):
            chunks.append(self._chunk(len(chunks), draft))

    def clean(self, end: int, start: int) -> bool:
        """Whether text before ``end`` and text from ``start`` tokenise independently."""
        if not self.additive:
            return False
        splits, text = self.c.splits, self.tok_text
        if any(splits(ch) for ch in text[end:start]):
            return True
        return splits(text[end - 1]) or splits(text[start])

    def _units(self) -> Iterator[_Unit]:
        """Units in document order, encoded in bounded batches."""
        batch: list[Span] = []
        size, prev_end = 0, -1
        for item in self._pieces():
            batch.append(item)
            size += item[1] - item[0]
            if size >= _BATCH_CHARS:
                prev_end = yield from self._encode(batch, prev_end)
                batch, size = [], 0
        yield from self._encode(batch, prev_end)

    def _pieces(self) -> Iterator[Span]:
        """Heading and body spans, bodies cut to at most ``max_chars`` characters."""
        for start, end, para, path, heading in structure(self.text):
            if heading or end - start <= self.c.max_chars:
                yield start, end, para, path, heading
                continue
            for piece_start, piece_end in char_pieces(self.text, start, end, self.c.max_chars):
                yield piece_start, piece_end, para, path, False

    def _encode(self, batch: list[Span], prev_end: int) -> Generator[_Unit, None, int]:
        """Encode a batch of spans once; returns the end of the last unit yielded."""
        texts = [self.tok_text[start:end] for start, end, *_ in batch]
        encodings = self.c.tokenizer.encode_batch(texts, add_special_tokens=False)
        for (start, end, para, path, heading), enc in zip(batch, encodings, strict=True):
            n = len(enc)
            if n == 0:
                continue  # only characters the tokenizer drops (controls): nothing to embed
            whole = n <= (self.c.budget if heading else self.c.target)
            units = [_Unit(start, end, n, para, path, heading=heading)] if whole else None
            for unit in units or self._split(start, end, para, path, enc):
                unit.joins = prev_end < 0 or self.clean(prev_end, unit.start)
                prev_end = unit.end
                yield unit
        return prev_end

    def _split(
        self, start: int, end: int, para: int, path: tuple[str, ...], enc: Encoding
    ) -> list[_Unit]:
        """Sentences of an over-long piece, counted from its offsets; windows for long ones."""
        starts, ends = _offsets(enc, start)
        spans = sentences(self.text, start, end)
        bounds = [*np.searchsorted(starts, [s for s, _ in spans]).tolist(), len(starts)]
        bounds[0] = 0
        clean = [True] + [self.clean(spans[i - 1][1], spans[i][0]) for i in range(1, len(spans))]
        clean.append(True)
        units: list[_Unit] = []
        for i, (s, e) in enumerate(spans):
            lo, hi = bounds[i], bounds[i + 1]
            unit = _Unit(s, e, hi - lo, para, path, exact=clean[i] and clean[i + 1])
            unit.toks = (starts, ends, lo, hi)
            if hi - lo > self.c.budget:
                units.extend(self._windows(unit, clean[i], clean[i + 1]))
            elif hi > lo:
                units.append(unit)
        return units

    def _windows(self, sentence: _Unit, clean_start: bool, clean_end: bool) -> list[_Unit]:
        """Token windows of ``window`` tokens or fewer, cut between words where possible."""
        assert sentence.toks is not None
        starts, ends, k, hi = sentence.toks
        units, size, k_clean = [], self.c.window, clean_start
        while k < hi:
            j, j_clean = hi, clean_end
            if k + size < hi:
                j, j_clean = self._cut_near(starts, ends, k + size, k + (size - 1) // 2, -1)
            unit = _Unit(int(starts[k]), int(ends[j - 1]), j - k, sentence.para, sentence.path)
            unit.exact, unit.toks = k_clean and j_clean, (starts, ends, k, j)
            units.append(unit)
            k, k_clean = j, j_clean
        return units

    def _cut_near(
        self, starts: _Ints, ends: _Ints, at: int, stop: int, step: int
    ) -> tuple[int, bool]:
        """The first token index from ``at`` towards ``stop`` with a clean cut before it."""
        for i in range(at, stop, step):
            if self.clean(int(ends[i - 1]), int(starts[i])):
                return i, True
        return at, False

    def _tail(self, unit: _Unit, n: int) -> _Unit | None:
        """A unit for the last ``n`` tokens of ``unit`` (down to n/2, to cut between words)."""
        if unit.toks is None:
            return None
        starts, ends, _, hi = unit.toks
        at, clean = self._cut_near(starts, ends, hi - n, hi - n + max(1, n // 2), 1)
        tail = _Unit(
            int(starts[at]), unit.end, hi - at, unit.para, unit.path, exact=clean and unit.exact
        )
        tail.toks = (starts, ends, at, hi)
        return tail

    def _settle(self, drafts: list[_Draft]) -> list[_Draft]:
        """Give every draft its exact formatted count, splitting any that is over the limit."""
        c = self.c
        for draft in drafts:
            units = draft.units
            if self.additive and all(u.exact for u in units) and all(u.joins for u in units[1:]):
                draft.count = c.overhead + draft.tokens
        todo = [draft for draft in drafts if draft.count is None]
        for first in range(0, len(todo), 256):
            group = todo[first : first + 256]
            texts = [c.doc_prefix + self.tok_text[_start(d) : _end(d)] for d in group]
            for draft, enc in zip(group, c.tokenizer.encode_batch(texts), strict=True):
                draft.count = len(enc)
        settled: list[_Draft] = []
        for draft in drafts:
            over = draft.count is not None and draft.count > c.limit
            settled.extend(self._settle(self._halve(draft)) if over else [draft])
        return settled

    def _halve(self, draft: _Draft) -> list[_Draft]:
        """Two drafts out of one that was over the limit (subword effects at its cuts)."""
        units = draft.units if len(draft.units) > 1 else self._bisect(draft.units[0])
        halves = units[: len(units) // 2], units[len(units) // 2 :]
        return [_Draft(half, sum(u.tokens for u in half)) for half in halves]

    def _bisect(self, unit: _Unit) -> list[_Unit]:
        """Cut one unit near its middle token, cleanly if possible (both halves get verified)."""
        text = self.tok_text[unit.start : unit.end]
        starts, ends = _offsets(self.c.tokenizer.encode(text, add_special_tokens=False), unit.start)
        n = len(starts)
        at = self._cut_near(starts, ends, n // 2, n // 4, -1)[0] if n > 1 else 0
        if at < 1 or int(starts[at]) <= unit.start or int(ends[at - 1]) >= unit.end:
            raise ChunkingError(  # e.g. one character that alone is over a tiny limit
                f"The text at characters {unit.start}-{unit.end} cannot be made to fit the "
                f"model's limit of {self.c.limit} tokens; shorten the document prefix."
            )
        first = _Unit(unit.start, int(ends[at - 1]), at, unit.para, unit.path, exact=False)
        return [first, _Unit(int(starts[at]), unit.end, n - at, unit.para, unit.path, exact=False)]

    def _chunk(self, index: int, draft: _Draft) -> Chunk:
        """The public record of a settled draft."""
        start, end, units = _start(draft), _end(draft), draft.units
        assert draft.count is not None
        text, path = self.text[start:end], _heading_path(units)
        return Chunk(index, text, draft.count, start, end, units[0].para, units[-1].para, path)


class _Packer:
    """Greedy packing of units into drafts (the rules are in the module docstring)."""

    def __init__(self, c: Chunker, tail: Callable[[_Unit, int], _Unit | None]) -> None:
        self.target, self.budget, self.minimum = c.target, c.budget, c.minimum
        self.overlap, self.max_chars, self._tail_of = c.overlap, c.max_chars, tail
        self.out: list[_Draft] = []
        self.cur: list[_Unit] = []
        self.total = 0  # tokens in ``cur``, overlap included
        self.new = 0  # tokens in ``cur`` not repeated from the previous chunk
        self.repeated = 0  # how many leading units of ``cur`` are overlap
        self.section_first = True  # ``cur`` is the first chunk of its section

    def add(self, unit: _Unit) -> None:
        """Add the next unit, cutting first when it does not fit."""
        if unit.heading:
            self._heading()
        if self.cur and not self._fits(unit):
            self._cut(unit)
        self.cur.append(unit)
        self.total += unit.tokens
        self.new += unit.tokens

    def finish(self) -> list[_Draft]:
        """All drafts, once every unit was added."""
        if self.cur:
            self._close()
        return self.out

    def _heading(self) -> None:
        if self.cur and not (self.section_first and self.new < self.minimum):
            self._close()  # a heading starts a new chunk, unless the section so far is tiny
        if not self.cur:
            self.section_first = True

    def _fits(self, unit: _Unit) -> bool:
        cap = self.target if self.total >= self.minimum else self.budget
        chars = unit.end - self.cur[0].start
        return self.total + unit.tokens <= cap and chars <= self.max_chars

    def _cut(self, unit: _Unit) -> None:
        tail = self._overlap(unit)
        for done in self.cur:
            done.toks = None  # offsets are only needed for windows inside the open chunk
        self.out.append(_Draft(self.cur, self.total))
        self.cur, self.repeated = tail, len(tail)
        self.total, self.new = sum(u.tokens for u in tail), 0
        self.section_first = False

    def _overlap(self, unit: _Unit) -> list[_Unit]:
        """Trailing units (or a window of the last) to repeat; only for cuts inside a paragraph."""
        last = self.cur[-1]
        if self.overlap <= 0 or unit.heading or last.heading or last.para != unit.para:
            return []
        tail: list[_Unit] = []
        size = 0
        for prior in reversed(self.cur[1:]):
            if prior.heading or prior.para != unit.para or size + prior.tokens > self.overlap:
                break
            tail.insert(0, prior)
            size += prior.tokens
        if not tail and last.tokens > self.overlap:
            window = self._tail_of(last, self.overlap)
            tail, size = ([window], window.tokens) if window else ([], 0)
        if tail and (size + unit.tokens > self.target or unit.end - tail[0].start > self.max_chars):
            return []
        return tail

    def _close(self) -> None:
        """End of a section or of the text: keep ``cur``, or merge a small piece back."""
        if not self._merge_back():
            self.out.append(_Draft(self.cur, self.total))
        self.cur, self.total, self.new, self.repeated = [], 0, 0, 0

    def _merge_back(self) -> bool:
        if self.new >= self.minimum or not self.out:
            return False
        prev, fresh = self.out[-1], self.cur[self.repeated :]
        if prev.tokens + self.new > self.budget or fresh[-1].end - _start(prev) > self.max_chars:
            return False
        prev.units.extend(fresh)
        prev.tokens += self.new
        return True


def _pipeline(tokenizer: Tokenizer) -> tuple[bool, re.Pattern[str] | None]:
    """Whether counts add up across pre-token boundaries; a pattern of added-token strings."""
    parts = (tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.model)
    added = list(tokenizer.get_added_tokens_decoder().values())
    additive = (
        tuple(type(part).__name__ for part in parts) == _ADDITIVE
        and type(tokenizer.post_processor).__name__ in _POST
        and not any(token.normalized for token in added)
    )
    contents = sorted((re.escape(token.content) for token in added), key=len, reverse=True)
    return additive, re.compile("|".join(contents)) if contents else None


def _for_tokenizer(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (same length, same offsets)."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


def _heading_path(units: list[_Unit]) -> tuple[str, ...]:
    """The headings shared by a chunk's content units (by its headings if it has no content)."""
    paths = [u.path for u in units if not u.heading] or [u.path for u in units]
    first, last = min(paths), max(paths)  # their common prefix is everyone's
    size = len(first)
    while first[:size] != last[:size]:
        size -= 1
    return first[:size]


def _offsets(enc: Encoding, base: int) -> tuple[_Ints, _Ints]:
    """Token start and end offsets of ``enc`` (Python string indices), shifted by ``base``."""
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2) + base
    return offsets[:, 0], offsets[:, 1]


def _start(draft: _Draft) -> int:
    return draft.units[0].start


def _end(draft: _Draft) -> int:
    return draft.units[-1].end
