"""Text as FTS5 sees it: what is stored in ``chunks_fts.body`` and what MATCH is asked.

The FTS table uses ``unicode61 remove_diacritics 2`` (migration m003). Two
things that tokenizer gets wrong are fixed here, in Python, identically on the
indexed side (:func:`index_text`) and the query side (:func:`match_query`):

* **Unspaced CJK.** unicode61 turns a whole Chinese or Japanese sentence into
  one token, so no word inside it can be found. Each CJK run (Han, Hiragana,
  Katakana, Hangul) is rewritten as overlapping character bigrams — the
  classic CJK bigram indexing of Lucene's ``CJKBigramFilter`` — so a
  two-character word such as 语言 is a token of its own (a ``trigram`` table
  could not find it: its shortest term is three characters). The last
  character of every run is also kept as a unigram, so that a one-character
  query, asked as a prefix (``"猫"*``), finds the character in every position.
* **Combining marks.** unicode61 treats Arabic harakat, Hebrew points and
  Indic vowel signs as separators, splitting ``مُحَمَّد`` into four
  one-letter tokens that never match the unvowelled spelling a user types.
  Marks are removed (after NFKC, which also folds full-width Latin and
  half-width Katakana into their usual forms).

A query only ever reaches FTS5 as the output of :func:`match_query`: every
term quoted (quoting is what defeats FTS5's operators), joined with OR, so no
input can make MATCH raise.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import cache

#: More terms than this are dropped: an OR of hundreds of terms is slow and
#: says nothing a long query's first few dozen words do not.
MAX_TERMS = 64
#: Only this much of a query is looked at (normalising megabytes is waste).
MAX_QUERY_CHARS = 4096

# Han (with extensions and compatibility ideographs), the ideographic
# iteration/closing marks 々〆〇, Hiragana, Katakana (without the
# punctuation ゠ and ・), Katakana extensions, Hangul syllables and jamo.
_CJK_CLASS = (
    "\u1100-\u11ff\u3005-\u3007\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff"
    "\u3131-\u318e\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
    "\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\U00020000-\U0003134f"
)
_CJK_RUN = re.compile(f"[{_CJK_CLASS}]+")
# A word as unicode61 keeps it: letters and digits (underscore is a separator there).
_WORD = re.compile(r"[^\W_]+")
_TATWEEL = "\u0640"  # Arabic elongation: a letter to Unicode, typography to a reader


@cache
def _marks() -> re.Pattern[str]:
    """A pattern matching runs of combining marks (Unicode category M*).

    Built once per process from :mod:`unicodedata` so it follows Python's
    Unicode version. Planes 2–13 (CJK extensions, unassigned) hold no marks
    and are skipped, which keeps the build around 20 ms; variation selectors
    (plane 14) are marks and are included.
    """
    ranges: list[tuple[int, int]] = []
    for cp in [*range(0x20000), *range(0xE0000, 0xE1000)]:
        if unicodedata.category(chr(cp)).startswith("M"):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    body = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)
    # Lone surrogates cannot be encoded for SQLite; dropping them keeps any
    # Python string storable.
    return re.compile(f"[{body}{_TATWEEL}\\ud800-\\udfff]+")


def normalise(text: str) -> str:
    """NFKC, then drop combining marks, tatweel and lone surrogates (both sides)."""
    return _marks().sub("", unicodedata.normalize("NFKC", text))


def _bigrams(run: str) -> list[str]:
    """Overlapping character bigrams of a CJK run; a single character stays itself."""
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _index_run(match: re.Match[str]) -> str:
    run = match.group()
    grams = _bigrams(run)
    if len(run) > 1:
        grams.append(run[-1])  # so a one-character prefix query finds the last position too
    return " " + " ".join(grams) + " "


def index_text(text: str) -> str:
    """The string stored in ``chunks_fts.body`` for a chunk whose text is ``text``.

    Non-CJK text is left for unicode61 to split (after :func:`normalise`);
    CJK runs become space-separated bigrams. Only for matching: passages
    and citations always come from ``item_chunks.text``.
    """
    return _CJK_RUN.sub(_index_run, normalise(text))


def _terms(query: str) -> Iterator[str]:
    """FTS5 terms of a query, in order: words, and CJK bigrams (or ``X*`` prefixes)."""
    for word in _WORD.finditer(normalise(query[:MAX_QUERY_CHARS])):
        position = 0
        text = word.group()
        for run in _CJK_RUN.finditer(text):
            if run.start() > position:
                yield _quote(text[position : run.start()])
            grams = _bigrams(run.group())
            if len(grams[0]) == 1:
                yield _quote(grams[0]) + "*"
            else:
                yield from (_quote(gram) for gram in grams)
            position = run.end()
        if position < len(text):
            yield _quote(text[position:])


def _quote(term: str) -> str:
    # Terms hold only letters and digits, so there is never a '"' to double;
    # doubling anyway keeps the function safe on its own.
    return '"' + term.replace('"', '""') + '"'


def match_query(query: str) -> str | None:
    """A safe FTS5 MATCH expression for ``query``, or None when no term is left.

    Letter/digit runs are quoted one by one and joined with OR, so bm25 ranks
    passages matching more, and rarer, terms first. At most
    :data:`MAX_TERMS` distinct terms are kept. None means "no sparse hits",
    not an error.
    """
    seen: dict[str, str] = {}  # casefolded → as written: unicode61 folds case itself
    for term in _terms(query):
        seen.setdefault(term.casefold(), term)
        if len(seen) >= MAX_TERMS:
            break
    return " OR ".join(seen.values()) or None
