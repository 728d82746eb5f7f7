"""The structural chunker, run with the real default tokenizer (MiniLM WordPiece)."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

import rinwa_index.chunking as chunking
from rinwa_index.chunking import Chunk, Chunker, chunk_key, chunker_for
from rinwa_index.cli import cli
from rinwa_index.config import ChunkParams
from rinwa_index.errors import ChunkingError
from rinwa_index.models import MINILM, load_tokenizer

PREFIX = "title: none | text: "
SMALL = ChunkParams(target=24, minimum=8, maximum=40, overlap=6)
WORDS = ["search", "index", "vector", "model", "query", "local", "private", "worker", "durable"]
# fmt: off
FRAGMENTS = [  # mixed scripts, structure, controls, surrogates, special tokens
    "word ", "Chunk", ". ", "! ", "? ", "。", "！", "？", "；", "，", "中文", "検索", "한국어 ", "שלום ",
    "مرحبا ", "😀", "👩\u200d👩\u200d👧", "\u200b", "\x00", "\x1c", "\x0b", "\ud800", "\xa0",
    "\u3000", "\n", "\n\n", "\t", "# ", "\n## H\n", "===\n", "```\n", "[MASK]", "e\u0301",
    "x" * 101, "unaffable ", "1999 ", "-", "#",
]
# fmt: on
HANZI = "检索向量数据库分块模型句子段落标题文档本地私有后台嵌入排序融合的一是在不了有和人这中大为"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return load_tokenizer(MINILM, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def default(tokenizer: Tokenizer) -> Chunker:
    return Chunker(tokenizer, ChunkParams(), max_tokens=MINILM.max_tokens)


@pytest.fixture(scope="module")
def small(tokenizer: Tokenizer) -> Chunker:
    return Chunker(tokenizer, SMALL, max_tokens=MINILM.max_tokens, doc_prefix=PREFIX)


@pytest.fixture(scope="module")
def tight(tokenizer: Tokenizer) -> Chunker:
    """A model limit below ``maximum`` and a prefix without a trailing space."""
    return Chunker(tokenizer, ChunkParams(12, 4, 16, 3), max_tokens=14, doc_prefix="q:")


def exact_count(chunker: Chunker, text: str) -> int:
    """The reference count: encode the formatted chunk (lone surrogates as U+FFFD)."""
    safe = re.sub("[\ud800-\udfff]", "\ufffd", chunker.doc_prefix + text)
    return len(chunker.tokenizer.encode(safe))


def checked(chunker: Chunker, text: str, *, every: int = 1) -> list[Chunk]:
    """Chunk ``text`` and assert the invariants every chunk list must satisfy."""
    chunks = chunker.chunk(text)
    for index, c in enumerate(chunks):
        assert c.ord == index
        assert c.text == text[c.char_start : c.char_end]
        assert c.text and c.text == c.text.strip()
        assert c.paragraph_start <= c.paragraph_end
        if index % every == 0:
            assert c.token_count == exact_count(chunker, c.text)
        assert c.token_count <= chunker.limit
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.char_start < nxt.char_start and prev.char_end < nxt.char_end
    return chunks


def sentences(count: int, seed: int = 0, length: tuple[int, int] = (6, 12)) -> str:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(*length))]
        out.append(f"Sentence {i} " + " ".join(words) + ".")
    return " ".join(out)


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    return [
        (m.start(), m.end()) for m in re.finditer(r"\S(?:.*?\S)??(?=\s*\n\s*\n|\s*\Z)", text, re.S)
    ]


# -- structure ---------------------------------------------------------------------------


def test_empty_and_whitespace_only_give_no_chunks(default: Chunker) -> None:
    for text in ["", " ", "\n\n\t \n", "\u3000\u2028\xa0"]:
        assert default.chunk(text) == []


def test_each_heading_starts_a_chunk(default: Chunker) -> None:
    sections = [f"# Part {n}\n\n{sentences(1, n)}\n\n{sentences(1, n + 10)}" for n in range(3)]
    text = "\n\n".join(sections)
    assert default.count_tokens(text) < default.params.target  # only headings force cuts
    chunks = checked(default, text)
    assert [c.text[:8] for c in chunks] == ["# Part 0", "# Part 1", "# Part 2"]
    assert [c.heading_path for c in chunks] == [("Part 0",), ("Part 1",), ("Part 2",)]


def test_heading_paths_atx_setext_and_nested(default: Chunker) -> None:
    body = sentences(4, 1)
    text = (
        f"Top Title\n=========\n\n{body}\n\nSub Part\n--------\n\n{body}\n\n"
        f"### Deep ###\n\n{body}\n\n## Sibling\n{body}\n\n# Other\n\n{body}"
    )
    chunks = checked(default, text)
    assert [c.heading_path for c in chunks] == [
        ("Top Title",),
        ("Top Title", "Sub Part"),
        ("Top Title", "Sub Part", "Deep"),
        ("Top Title", "Sibling"),
        ("Other",),
    ]
    assert chunks[0].text.startswith("Top Title\n===")  # the heading lines belong to the chunk
    assert chunks[3].text.startswith("## Sibling\nSentence")


def test_fenced_code_and_hashtags_are_not_headings(default: Chunker) -> None:
    text = f"# Real\n\n{sentences(4)}\n\n```\n# a comment\nx = 1\n```\n\n#hashtag {sentences(3)}"
    chunks = checked(default, text)
    assert len(chunks) == 1
    assert chunks[0].heading_path == ("Real",)


def test_a_tiny_section_is_carried_into_the_next(default: Chunker) -> None:
    text = f"# Guide\n\n## Install\n\n{sentences(5)}\n\n## Use\n\n{sentences(5, 2)}"
    chunks = checked(default, text)
    assert len(chunks) == 2
    assert chunks[0].text.startswith("# Guide\n\n## Install\n\nSentence 0")
    assert chunks[0].heading_path == ("Guide", "Install")
    assert chunks[1].heading_path == ("Guide", "Use")


def test_paragraphs_that_fit_are_never_split(default: Chunker) -> None:
    paragraphs = [sentences(random.Random(n).randint(1, 6), n) for n in range(40)]
    text = "\n\n".join(paragraphs)
    chunks = checked(default, text)
    spans = paragraph_spans(text)
    starts, ends = {s for s, _ in spans}, {e for _, e in spans}
    assert len(chunks) > 5
    for c in chunks:
        assert c.char_start in starts and c.char_end in ends
        assert c.token_count <= default.params.target
    assert chunks[-1].paragraph_end == len(paragraphs) - 1


def test_long_paragraph_is_cut_between_sentences(default: Chunker) -> None:
    text = sentences(80)
    chunks = checked(default, text)
    assert len(chunks) > 3
    for c in chunks:
        assert c.text.startswith("Sentence ") and c.text.endswith(".")
        assert c.token_count <= default.params.target
        assert c.paragraph_start == c.paragraph_end == 0


def test_cjk_sentences_and_token_density(default: Chunker) -> None:
    rng = random.Random(3)
    chinese = "".join("".join(rng.choices(HANZI, k=rng.randint(8, 20))) + "。" for _ in range(400))
    english = sentences(2000)[: len(chinese)].rstrip()
    cn, en = checked(default, chinese), checked(default, english)
    assert len(cn) >= 3 * len(en)  # one token per character, not one per ~5 characters
    assert all(c.text.endswith("。") for c in cn)


# -- sizes and overlap -----------------------------------------------------------------------


def test_overlap_repeats_whole_sentences_inside_a_paragraph(small: Chunker) -> None:
    text = " ".join(f"Point {i} is here." for i in range(60))
    chunks = checked(small, text)
    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.char_start < prev.char_end
        shared = text[nxt.char_start : prev.char_end]
        assert shared.startswith("Point ") and shared.endswith(".")
        assert small.count_tokens(shared) - small.overhead <= SMALL.overlap


def test_overlap_falls_back_to_a_token_window(default: Chunker) -> None:
    text = sentences(30, 5, length=(28, 34))  # every sentence is longer than the overlap
    chunks = checked(default, text)
    shared = [text[n.char_start : p.char_end] for p, n in itertools.pairwise(chunks)]
    assert len(shared) > 3
    overlap = default.params.overlap
    assert all(0 < default.count_tokens(s) - default.overhead <= overlap for s in shared)
    assert not any(s.startswith("Sentence") for s in shared)  # a window, not a sentence


def test_overlap_window_cut_inside_a_word_is_counted_exactly(default: Chunker) -> None:
    rng = random.Random(8)
    syllables = "가나다라마바사아자하한국어"  # each one becomes 2-3 jamo tokens
    words = ["".join(rng.choices(syllables, k=rng.randint(14, 20))) for _ in range(60)]
    text = " ".join(f"Some {word}." for word in words)  # tails start inside a syllable
    chunks = checked(default, text)
    overlapping = [p.char_end > n.char_start for p, n in itertools.pairwise(chunks)]
    assert sum(overlapping) > 5


def test_no_overlap_across_paragraphs_or_when_disabled(tokenizer: Tokenizer) -> None:
    params = ChunkParams(target=24, minimum=8, maximum=40, overlap=0)
    chunker = Chunker(tokenizer, params, max_tokens=256)
    chunks = checked(chunker, " ".join(f"Point {i} is here." for i in range(60)))
    assert all(p.char_end < n.char_start for p, n in itertools.pairwise(chunks))
    chunked = checked(Chunker(tokenizer, SMALL, max_tokens=256), "\n\n".join(WORDS * 5))
    assert all(p.char_end < n.char_start for p, n in itertools.pairwise(chunked))


def test_small_trailing_piece_merges_into_the_previous_chunk(tokenizer: Tokenizer) -> None:
    params = ChunkParams(target=40, minimum=20, maximum=60, overlap=0)
    chunker = Chunker(tokenizer, params, max_tokens=256)
    body = ""
    for sentence in re.findall(r"Sentence .*?\.", sentences(20, 7)):
        if chunker.count_tokens(f"{body} {sentence}") > params.target:
            break
        body = f"{body} {sentence}".strip()
    tail = "Tail"
    while chunker.count_tokens(f"{body} {tail}.") <= params.target:
        tail += " end"
    text = f"{body} {tail}."
    assert chunker.count_tokens(f"{tail}.") < params.minimum  # a small trailing piece
    assert chunker.count_tokens(text) <= params.maximum
    chunks = checked(chunker, text)
    assert len(chunks) == 1 and chunks[0].text == text


def test_runs_without_spaces_cut_mid_word_keep_exact_counts(small: Chunker) -> None:
    rng = random.Random(4)
    run = ".".join(
        "".join(rng.choices("abcdefghijklmnop", k=rng.randint(3, 9))) for _ in range(900)
    )
    assert len(run) > 3 * small.max_chars and " " not in run  # forces cuts inside words
    checked(small, run)


def test_special_token_text_across_a_cut_is_counted_exactly(small: Chunker) -> None:
    head = "ab." * (small.max_chars // 3)
    text = head[: small.max_chars - 1] + "[MASK]" + "cd." * 300  # a cut right after "["
    chunks = checked(small, text)
    assert any("[MASK]" in c.text for c in chunks)


def test_heading_is_never_left_alone(default: Chunker) -> None:
    target, body = default.params.target, ""
    for sentence in re.findall(r"Sentence .*?\.", sentences(40, 4)):
        if default.count_tokens(f"{body} {sentence}") > target:
            break
        body = f"{body} {sentence}".strip()
    assert target - 15 < default.count_tokens(body) <= target  # the heading does not fit too
    chunks = checked(default, f"# A rather long heading line here\n\n{body}")
    assert len(chunks) == 1


def test_hard_limit_respects_model_limit_below_maximum(tokenizer: Tokenizer) -> None:
    chunker = Chunker(tokenizer, ChunkParams(), max_tokens=64, doc_prefix=PREFIX)
    chunks = checked(chunker, sentences(50) + "\n\n" + "中" * 3000)
    assert max(c.token_count for c in chunks) <= 64


def test_sentence_over_the_limit_becomes_token_windows(default: Chunker) -> None:
    rng = random.Random(2)
    text = " ".join(rng.choice(WORDS) for _ in range(2000))  # no terminator
    chunks = checked(default, text)
    assert len(chunks) > 10
    covered = " ".join(c.text for c in chunks)
    assert all(word in covered for word in WORDS)
    assert chunks[-1].char_end == len(text)


def test_counts_over_the_limit_after_subword_cuts_are_split_again(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    halved = []
    real = chunking._Run._halve
    monkeypatch.setattr(chunking._Run, "_halve", lambda run, d: halved.append(d) or real(run, d))
    chunker = Chunker(tokenizer, ChunkParams(16, 4, 16, 0), max_tokens=16)
    for seed in range(5, 12):
        rng = random.Random(seed)
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(20, 60)))]
        text = " ".join(words * 3 + [w[::-1] for w in words] * 3)
        checked(chunker, text)
    assert halved  # the mid-word windows above really did come out over the limit


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(FRAGMENTS) | st.text(max_size=4),
        max_size=120,
    ).map("".join)
)
def test_property_every_chunk_fits_with_the_prefix(
    small: Chunker, tight: Chunker, text: str
) -> None:
    for chunker in (small, tight):
        covered: set[int] = set()
        for c in checked(chunker, text):
            covered.update(range(c.char_start, c.char_end))
        for index, ch in enumerate(text):
            if (ch.isascii() and ch.isalnum()) or "\u4e00" <= ch <= "\u9fff":
                assert index in covered, (index, ch)  # nothing with tokens is dropped


def test_other_tokenizers_are_verified_chunk_by_chunk(tokenizer: Tokenizer) -> None:
    other = Tokenizer.from_str(tokenizer.to_str())
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    chunker = Chunker(other, SMALL, max_tokens=32, doc_prefix="p:")
    assert not chunker.additive
    text = f"# Head\n\n{sentences(30)}\n\n中文句子。第二句！" + "abc" * 200
    checked(chunker, text)


def test_truncating_tokenizer_is_copied_not_trusted(tokenizer: Tokenizer) -> None:
    truncating = Tokenizer.from_str(tokenizer.to_str())
    truncating.enable_truncation(8)
    chunker = Chunker(truncating, ChunkParams(), max_tokens=256)
    assert truncating.truncation is not None  # the caller's object is untouched
    text = sentences(3)
    assert chunker.count_tokens(text) == len(tokenizer.encode(text)) > 8


def test_prefix_that_leaves_no_room_is_an_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(ChunkingError, match="prefix"):
        Chunker(tokenizer, ChunkParams(8, 4, 8, 0), max_tokens=8, doc_prefix=PREFIX)


def test_count_tokens_is_the_formatted_count(small: Chunker, tokenizer: Tokenizer) -> None:
    assert small.count_tokens("hello world") == len(tokenizer.encode(PREFIX + "hello world"))
    assert small.overhead == len(tokenizer.encode(PREFIX))


def test_deterministic(tokenizer: Tokenizer, default: Chunker) -> None:
    text = f"# T\n\n{sentences(70)}\n\n" + "混合 mixed 文本。" * 200
    first = default.chunk(text)
    assert first == default.chunk(text)
    assert first == Chunker(tokenizer, ChunkParams(), max_tokens=256).chunk(text)


# -- pathological input ------------------------------------------------------------------


def test_offsets_are_python_string_indices(tokenizer: Tokenizer) -> None:
    text = "😀 cat 👩\u200d👩\u200d👧 dog 𝐱𝐲 sun"
    enc = tokenizer.encode(text, add_special_tokens=False)
    spans = [text[a:b] for a, b in enc.offsets]
    assert spans == ["😀", "cat", "👩\u200d👩\u200d👧", "dog", "𝐱𝐲", "sun"]
    para = " ".join(f"Emoji 😀👍🏽 {i} and 𝐱 here." for i in range(40))
    no_overlap = Chunker(tokenizer, ChunkParams(24, 8, 40, 0), max_tokens=256, doc_prefix=PREFIX)
    chunks = checked(no_overlap, para)  # counts from offsets past non-BMP characters are exact
    assert len(chunks) > 3 and all(c.text.startswith("Emoji") for c in chunks)


@pytest.mark.timeout(60)
def test_megabyte_line_without_spaces(default: Chunker) -> None:
    text = "".join(random.Random(1).choices("abcdefghij", k=1_000_000))
    chunks = checked(default, text)
    assert "".join(c.text for c in chunks) == text  # contiguous, nothing lost or repeated
    assert max(len(c.text) for c in chunks) <= chunking.MAX_CHARS_PER_TOKEN * default.limit


@pytest.mark.timeout(60)
def test_megabyte_cjk_line_without_punctuation_uses_token_windows(default: Chunker) -> None:
    text = "".join(random.Random(2).choices(HANZI, k=1_000_000))
    chunks = checked(default, text, every=97)
    assert len(chunks) > 1_000_000 // default.params.target
    assert chunks[0].char_start == 0 and chunks[-1].char_end == len(text)
    assert all(p.char_end >= n.char_start for p, n in itertools.pairwise(chunks))


@pytest.mark.timeout(60)
def test_hundred_thousand_one_word_paragraphs(default: Chunker) -> None:
    text = "\n\n".join(f"w{i % 10}" for i in range(100_000))
    chunks = checked(default, text, every=50)
    assert chunks[-1].paragraph_end == 99_999
    assert all(n.paragraph_start == p.paragraph_end + 1 for p, n in itertools.pairwise(chunks))


def test_control_characters(default: Chunker) -> None:
    chunks = checked(default, "a\x00b\x01c d\x7fe\n\n\x00\x00\x1b\n\nend\x0b")
    assert [c.text for c in chunks] == ["a\x00b\x01c d\x7fe\n\n\x00\x00\x1b\n\nend"]
    assert default.chunk("\x00\x01\x02") == []  # the tokenizer sees nothing to embed


def test_lone_surrogates_stay_in_the_slice(small: Chunker) -> None:
    text = "before \ud800 after. " * 30 + "\udfff"
    chunks = checked(small, text)
    assert len(chunks) > 1 and any("\ud800" in c.text for c in chunks)


def test_emoji_rtl_and_mixed_scripts(small: Chunker) -> None:
    cases = [
        "👩\u200d👩\u200d👧\u200d👦 family 🏳️\u200d🌈 flag. " * 20,
        "שלום עולם, זה מבחן. مرحبا بالعالم، هذا اختبار. " * 20,
        "我们用 SQLite 做检索。Hybrid search 很快！混合 English 和中文；再来一句。" * 20,
    ]
    for text in cases:
        chunks = checked(small, text)
        assert len(chunks) > 2


def test_non_text_is_a_typed_error(default: Chunker) -> None:
    with pytest.raises(ChunkingError, match="bytes"):
        default.chunk(b"abc")  # type: ignore[arg-type]


# -- keys and entry points -------------------------------------------------------------------


def test_chunk_key_is_deterministic_and_covers_every_field() -> None:
    base = (7, "content", "ab" * 32, "sig", 3)
    key = chunk_key(*base)
    assert key == chunk_key(*base) and re.fullmatch("[0-9a-f]{32}", key)
    changed = [(8, *base[1:]), (*base[:1], "source", *base[2:]), (*base[:2], "cd" * 32, *base[3:])]
    changed += [(*base[:3], "sig2", base[4]), (*base[:4], 4)]
    assert len({chunk_key(*fields) for fields in changed} | {key}) == 6


def test_chunker_for_uses_the_manifest(tmp_path: Path) -> None:
    chunker = chunker_for(MINILM, ChunkParams(), tmp_path)
    assert chunker.limit == MINILM.max_tokens and chunker.doc_prefix == MINILM.doc_prefix


def test_cli_chunk_json_and_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINWA_MODEL_DIR", str(tmp_path / "models"))
    source = tmp_path / "doc.md"
    source.write_text(
        f"# Guide\n\n{sentences(30)}\n\n## 中文\n\n{'检索很快。' * 9}", encoding="utf-8"
    )
    runner = CliRunner()
    result = runner.invoke(cli, ["chunk", str(source), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] == MINILM.name and data["limit"] == MINILM.max_tokens
    keys = ["ord", "text", "token_count", "char_start", "char_end"]
    keys += ["paragraph_start", "paragraph_end", "heading_path"]
    assert all(list(row) == keys for row in data["chunks"])
    assert data["chunks"][-1]["heading_path"] == ["Guide", "中文"]
    listing = runner.invoke(cli, ["chunk", str(source)])
    assert listing.exit_code == 0 and "[Guide > 中文]" in listing.output
    assert f"{len(data['chunks'])} chunks for {MINILM.name}" in listing.output


def test_cli_chunk_rejects_invalid_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINWA_MODEL_DIR", str(tmp_path / "models"))
    source = tmp_path / "latin1.txt"
    source.write_bytes("caf\xe9".encode("latin-1"))
    result = CliRunner().invoke(cli, ["chunk", str(source)])
    assert result.exit_code == 1
    assert "not valid UTF-8" in result.output
