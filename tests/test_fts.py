"""fts: CJK bigram indexing, mark folding and the MATCH sanitiser."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rinwa_index.fts import MAX_TERMS, index_text, match_query

TOKENIZER = "unicode61 remove_diacritics 2"  # as created by db.m003_create_chunks_fts

PASSAGES = [
    "Python是一种广泛使用的编程语言，由Guido创建。",  # 0 zh + en
    "我们明天去北京看长城。",  # 1 zh
    "東京タワーに行きました。景色がとても綺麗でした。",  # 2 ja
    "猫が好きです。",  # 3 ja, 猫 at the start of a run
    "今天我看到一只小猫",  # 4 zh, 猫 at the end of a run
    "The Rust compiler checks borrowing rules at compile time.",  # 5 en
    "حمزة بن عبد المطلب عمُّه",  # 6 ar with harakat
    "SQLite数据库支持FTS5全文检索",  # 7 zh/en without spaces
    "서울에서 한국어를 공부합니다",  # 8 ko
]


@pytest.fixture
def fts() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE f USING fts5(body, tokenize = '{TOKENIZER}')")
    conn.executemany(
        "INSERT INTO f (rowid, body) VALUES (?, ?)",
        [(i, index_text(text)) for i, text in enumerate(PASSAGES)],
    )
    yield conn
    conn.close()


def hits(conn: sqlite3.Connection, query: str) -> list[int]:
    expression = match_query(query)
    if expression is None:
        return []
    rows = conn.execute(
        "SELECT rowid FROM f WHERE f MATCH ? ORDER BY bm25(f), rowid", (expression,)
    ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("编程语言", 0),  # four characters inside a longer unspaced sentence
        ("语言", 0),  # a two-character word
        ("长城", 1),
        ("北京", 1),
        ("東京タワー", 2),
        ("綺麗", 2),  # a two-character Japanese word
        ("行きました", 2),
        ("数据库", 7),
        ("全文检索", 7),
        ("sqlite", 7),  # Latin glued to CJK still splits off
        ("FTS5", 7),
        ("guido", 0),
        ("한국어", 8),
        ("محمد المطلب", 6),
        ("عمه", 6),  # unvowelled query finds the vowelled text
    ],
)
def test_unspaced_cjk_and_mixed_queries_find_their_passage(
    fts: sqlite3.Connection, query: str, expected: int
) -> None:
    assert hits(fts, query)[:1] == [expected]


def test_single_cjk_character_found_at_start_and_end_of_runs(fts: sqlite3.Connection) -> None:
    assert set(hits(fts, "猫")) == {3, 4}


@pytest.mark.parametrize("tokenizer", ["unicode61 remove_diacritics 2", "trigram"])
def test_plain_tokenizers_miss_what_bigrams_find(tokenizer: str) -> None:
    """The reason fts.py exists: measured against the two built-in alternatives."""
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE f USING fts5(body, tokenize = '{tokenizer}')")
    conn.executemany("INSERT INTO f (rowid, body) VALUES (?, ?)", enumerate(PASSAGES))
    found = conn.execute("SELECT rowid FROM f WHERE f MATCH ?", ('"语言"',)).fetchall()
    assert found == []  # unicode61: one token per sentence; trigram: terms of 3+ chars
    conn.close()


def test_unrelated_cjk_query_matches_nothing(fts: sqlite3.Connection) -> None:
    assert hits(fts, "飞机场") == []


def test_index_text_bigrams_and_unigrams() -> None:
    assert index_text("猫").split() == ["猫"]
    assert index_text("语言").split() == ["语言", "言"]
    assert index_text("Python是语言").split() == ["Python", "是语", "语言", "言"]
    assert index_text("café") == "café"  # unicode61 removes the diacritic itself


def test_match_query_quotes_operators_and_joins_with_or() -> None:
    assert match_query('pricing AND (Q3 OR "Q4")') == '"pricing" OR "AND" OR "Q3" OR "OR" OR "Q4"'
    assert match_query("Nord-Vest") == '"Nord" OR "Vest"'
    assert match_query("编程语言") == '"编程" OR "程语" OR "语言"'
    assert match_query("猫") == '"猫"*'


@pytest.mark.parametrize("query", ["", "   ", "***", '"', "()", "-:^", "\x00", "\ud800", "_"])
def test_nothing_left_is_none(query: str) -> None:
    assert match_query(query) is None


def test_terms_are_capped_and_deduplicated() -> None:
    expression = match_query(" ".join(f"w{i}" for i in range(1000)))
    assert expression is not None
    assert expression.count(" OR ") == MAX_TERMS - 1
    assert match_query("Cat cat CAT dog") == '"Cat" OR "dog"'


FTS_NOISE = st.sampled_from(
    ["AND", "OR", "NOT", "NEAR", "NEAR(", "NEAR/2", "*", "^", ":", "(", ")", '"', "'", "-", "+",
     "{", "}", "body:", "\x00", "\x1f", "\ud800", "\udfff", " ", "\t\n", "语言", "é", "١٢", "_"]
)  # fmt: skip
QUERIES = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(FTS_NOISE, st.text(max_size=8)), max_size=60).map("".join),
    st.lists(FTS_NOISE, min_size=1, max_size=40).map(" ".join),
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=QUERIES)
def test_no_input_makes_fts5_raise(query: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE f USING fts5(body, tokenize = '{TOKENIZER}')")
    conn.execute("INSERT INTO f (body) VALUES (?)", (index_text("some body text 语言 AND"),))
    expression = match_query(query)
    if expression is not None:
        conn.execute("SELECT rowid FROM f WHERE f MATCH ? ORDER BY bm25(f)", (expression,))
    conn.close()


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_index_text_always_storable(text: str) -> None:
    """Any chunk text, lone surrogates included, becomes a storable FTS body."""
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE f USING fts5(body, tokenize = '{TOKENIZER}')")
    conn.execute("INSERT INTO f (body) VALUES (?)", (index_text(text),))
    conn.close()


def test_very_long_query_is_cheap_and_safe() -> None:
    query = ('(" ^' * 200_000) + "x" * 1_000_000
    assert match_query(query) is None  # only the first MAX_QUERY_CHARS are read
    assert match_query("x" * 1_000_000) == '"' + "x" * 4096 + '"'
