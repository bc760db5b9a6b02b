"""Ranked tool search: SQLite FTS5 finds the candidates, a short rerank puts the obvious tool first.

The index is built lazily on the first query and rebuilt when the catalog's
version changes. Every text is normalised by :mod:`.words` before FTS5 sees
it (identifiers split, plurals folded), so a query in plain words finds tools
named in code. Each query word also matches its synonyms (fetch → get,
remove → delete, my → authenticated), related forms (assign → assignee,
signature → sign), and a word found nowhere is tried as a prefix (``subscr``
→ ``subscription``) or as two words run together (``rerun`` → ``re run``).

Two stages:

1. **Candidates** come from FTS5 in tiers (every word in the tool's identity
   — name, title, namespace; every word anywhere and some in the identity;
   every word anywhere; some in the identity; some anywhere). Within a tier,
   tools with the shortest identity come first (the rowid encodes it, so
   FTS5 streams them in that order and stops after a few dozen: no ranking
   function reads every matching row).
2. **Rerank** of the first ``_WINDOW`` candidates by how well the tool's
   identity answers the query: what share of the query its name and title
   cover, and what share of its name and title the query covers (rare words
   counting more). That second part is what makes ``pulls_list`` ("List pull
   requests") beat ``pull_request_stacks_list`` for "list pull requests":
   long names that merely contain the words lose to the exact match.
   Candidates past the window keep their tier order, so pages of any size
   form one order and never overlap or skip.

User text never reaches FTS5 syntax: each query word becomes quoted indexed
words, so quotes, ``*``, ``-``, ``NEAR`` or unbalanced parentheses are just
words.
"""

from __future__ import annotations

import bisect
import math
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .model import Tool
from .words import NAME_NOISE, STOPWORDS, alternatives, normalise, query_terms, split_words

__all__ = ["MAX_LIMIT", "SearchIndex", "search", "split_words"]

# Column order of the FTS table.
_COLUMNS = ("address", "namespace", "name", "title", "description", "params")
# What a tool is called, as opposed to what its description mentions.
_IDENTITY = ("address", "name", "title")

# Terms shorter than this get no prefix expansion: "a*" would match everything.
_MIN_PREFIX = 3
# A word found nowhere matches the words it starts, at this weight.
_PREFIX = 0.9
# Related forms of a word (a shared start this long) match with these weights.
_MIN_RELATED = 4
_RELATED = 0.7
_RELATED_SHORTER = 0.6
# At most this many indexed words stand for one prefix: the FTS5 query stays small.
_MAX_FORMS = 16
# A query longer than this is someone pasting a document; the head is enough.
_MAX_TERMS = 16
MAX_LIMIT = 100
# How many candidates the rerank orders. On the benchmark catalogs (bench/)
# 40 finds every answer a window of 100 finds; the window's size does not
# depend on the page, so pages of any size form one order.
_WINDOW = 40
# A tool's description is read this far: the summary, not the fine print
# (GitHub's run to kilobytes of notes on tokens and scopes).
_DESCRIPTION_CHARS = 600

# The rerank's weights (see _score). Coverage of the query by the identity
# matters most; how much of the identity the query covers separates an exact
# match from a long name that merely contains the words.
_W_IDENTITY_COVERAGE = 3.0
_W_COVERAGE = 1.0
_W_NAME_PRECISION = 1.5
_W_TITLE_PRECISION = 1.5


@dataclass(frozen=True)
class _Features:
    """What the rerank reads of one tool, normalised once at index build."""

    name: tuple[str, ...]
    title: tuple[str, ...]  # the title, or the description's first sentence
    identity: frozenset[str]
    rest: frozenset[str]  # description head and parameter names


# FTS5 returns matches in rowid order at no cost, while ranking (BM25 or any
# ORDER BY on a stored value) reads every matching row first. So a tool's
# rowid carries its identity's size in the high bits: within a tier the
# tools with the shortest name and title, the likeliest exact matches, come
# first, and a tier of thousands of rows is cut after the first few.
_INDEX_BITS = 24
_INDEX_MASK = (1 << _INDEX_BITS) - 1


def _rowid(index: int, features: _Features) -> int:
    return ((len(features.name) + len(features.title)) << _INDEX_BITS) | index


def _features(tool: Tool) -> tuple[_Features, tuple[str, ...]]:
    """The rerank's view of a tool, and its FTS5 row (normalised columns)."""
    name_words = normalise(tool.name)
    name = tuple(dict.fromkeys(t for t in name_words if t not in NAME_NOISE)) or tuple(name_words)
    title_words = normalise(tool.title)
    title_text_words = title_words or normalise(_first_sentence(tool.description or ""))
    title = tuple(dict.fromkeys(t for t in title_text_words if t not in STOPWORDS))
    namespace = normalise(tool.namespace)
    description = normalise((tool.description or "")[:_DESCRIPTION_CHARS])
    params = normalise(" ".join((tool.input_schema.get("properties") or {}).keys()))
    features = _Features(name, title, frozenset((*name, *title, *namespace)), frozenset((*description, *params)))
    row = (
        " ".join((*namespace, *name_words)),
        " ".join(namespace),
        " ".join(name_words),
        " ".join(title_words),
        " ".join(description),
        " ".join(params),
    )
    return features, row


def _first_sentence(text: str) -> str:
    head = text.strip().split("\n", 1)[0][:160]
    cut = head.find(". ")
    return head[: cut + 1] if cut > 0 else head


@dataclass(frozen=True)
class _Term:
    """One query word and every indexed word that counts as it, with how much."""

    word: str
    forms: dict[str, float]  # indexed word -> weight: the word itself 1.0, synonyms and related forms below
    idf: float

    def fts(self) -> str:
        return "(" + " OR ".join(f'"{w}"' for w in self.forms) + ")"


class SearchIndex:
    """An FTS5 index over one catalog, rebuilt when the catalog changes."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._tools: list[Tool] = []
        self._features: list[_Features] = []
        self._vocab: frozenset[str] = frozenset()
        self._sorted_vocab: list[str] = []
        self._idf: dict[str, float] = {}
        self._weights: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
        self._idf_max = 1.0
        self._version = -1

    def _ensure(self) -> sqlite3.Connection:
        if self._db is not None and self._version == self._catalog.version:
            return self._db
        version = self._catalog.version
        tools = self._catalog.tools()
        db = sqlite3.connect(":memory:", check_same_thread=False)
        # The text is normalised already: no stemmer here, or the two would disagree.
        db.execute(
            "CREATE VIRTUAL TABLE tools USING fts5("
            + ", ".join(_COLUMNS)
            + ", ns UNINDEXED, tokenize='unicode61')"
        )
        built = [_features(t) for t in tools]
        features = [f for f, _ in built]
        rows = ((_rowid(i, f), *row, tools[i].namespace) for i, (f, row) in enumerate(built))
        with db:
            db.executemany("INSERT INTO tools(rowid, " + ", ".join(_COLUMNS) + ", ns) VALUES (?,?,?,?,?,?,?,?)", rows)
        vocab: set[str] = set()
        df: dict[str, int] = {}
        for f in features:
            vocab.update(f.identity)
            vocab.update(f.rest)
            for word in {*f.name, *f.title}:
                df[word] = df.get(word, 0) + 1
        if self._db is not None:
            self._db.close()
        n = max(1, len(tools))
        self._idf = idf = {word: math.log(1 + n / count) for word, count in df.items()}
        self._idf_max = math.log(1 + n)
        self._weights = [
            (tuple(idf[w] for w in f.name), tuple(idf[w] for w in (f.title or f.name))) for f in features
        ]
        self._db, self._tools, self._features, self._version = db, tools, features, version
        self._vocab = frozenset(vocab)
        self._sorted_vocab = sorted(vocab)
        return db

    def _terms(self, query: str) -> list[_Term]:
        words: list[str] = []
        for word in query_terms(query, _MAX_TERMS):
            if not any(a in self._vocab for a in alternatives(word)) and len(word) >= _MIN_PREFIX:
                halves = self._split(word)
                if halves:
                    words.extend(halves)
                    continue
            words.append(word)
        terms = [self._term(w) for w in dict.fromkeys(words)]
        return terms

    def _term(self, word: str) -> _Term:
        vocab = self._vocab
        forms = {w: weight for w, weight in alternatives(word).items() if w in vocab}
        if not forms and len(word) >= _MIN_PREFIX:
            # Found nowhere as typed: the start of a word (``subscr``).
            self._add_prefixed(forms, word, _PREFIX)
        elif len(word) >= _MIN_RELATED:
            # Related forms: ``assign`` → ``assignee``, ``collaborate`` → ``collaboration``.
            self._add_prefixed(forms, word[:-1] if word.endswith("e") else word, _RELATED)
        # And the other way: ``signature`` → ``sign``, ``recently`` → ``recent``.
        for cut in range(_MIN_RELATED, len(word) - 1):
            head = word[:cut]
            if head in vocab and forms.get(head, 0.0) < _RELATED_SHORTER:
                forms[head] = _RELATED_SHORTER
        idf = max((self._idf.get(w, 0.0) for w, weight in forms.items() if weight >= 0.75), default=0.0)
        return _Term(word, forms, idf or self._idf_max)

    def _add_prefixed(self, forms: dict[str, float], prefix: str, weight: float) -> None:
        """Indexed words starting with ``prefix`` (the shortest few) into ``forms``."""
        words = self._sorted_vocab
        start = bisect.bisect_left(words, prefix)
        found: list[str] = []
        for i in range(start, len(words)):
            if not words[i].startswith(prefix):
                break
            found.append(words[i])
        for w in sorted(found, key=len)[:_MAX_FORMS]:
            if forms.get(w, 0.0) < weight:
                forms[w] = weight

    def _split(self, word: str) -> tuple[str, str] | None:
        """Two known words run together (``rerun``, ``webhook``), else None."""
        for i in range(2, len(word) - 1):
            head, tail = word[:i], word[i:]
            if head in self._vocab and tail in self._vocab and head not in STOPWORDS and tail not in STOPWORDS:
                return head, tail
        return None

    def search(
        self, query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0
    ) -> dict[str, Any]:
        """Rank tools for ``query``; see :func:`search` for the result shape."""
        limit = max(1, min(int(12 if limit is None else limit), MAX_LIMIT))
        offset = max(0, int(offset or 0))
        if not query_terms(query or "", _MAX_TERMS):
            with self._lock:
                return self._listing(namespace, limit, offset)
        with self._lock:
            db = self._ensure()
            terms = self._terms(query)
            scope = " AND ns = ?" if namespace else ""
            extra: tuple[Any, ...] = (namespace,) if namespace else ()
            # The namespace inside the MATCH too: FTS5 then ranks only that
            # namespace's rows instead of every match before the filter.
            ns_words = " ".join(normalise(namespace)) if namespace else ""
            within = f' AND namespace : "{ns_words}"' if ns_words else ""
            # A word no tool uses cannot narrow or widen the candidates.
            groups = [t.fts() for t in terms if t.forms]
            if not groups:
                return _page([], 0, offset)
            # Candidates in tier order, as far as the page (and the rerank window) reach.
            need = max(_WINDOW, offset + limit)
            found: list[int] = []
            for expression in _tiers(groups):
                if len(found) >= need:
                    break
                found += (
                    rowid & _INDEX_MASK
                    for (rowid,) in db.execute(
                        f"SELECT rowid FROM tools WHERE tools MATCH ?{scope} ORDER BY rowid LIMIT ?",
                        (f"({expression}){within}", *extra, need - len(found)),
                    )
                )
            anywhere = "(" + " OR ".join(groups) + ")" + within
            total = db.execute(f"SELECT count(*) FROM tools WHERE tools MATCH ?{scope}", (anywhere, *extra)).fetchone()[0]
            merged = _merged(terms)
            idf_total = sum(t.idf for t in terms)
            window = sorted(
                ((self._score(i, terms, merged, idf_total), n, i) for n, i in enumerate(found[:_WINDOW])),
                key=lambda x: (-x[0], x[1]),
            )
            ordered = [(score, i) for score, _, i in window]
            floor = ordered[-1][0] if ordered else 0.0
            for i in found[_WINDOW : offset + limit]:
                # Past the window the tier order stands; a score never rises down the list.
                floor = min(floor, self._score(i, terms, merged, idf_total))
                ordered.append((floor, i))
            results = [
                {**self._tools[i].summary(), "score": round(score, 4)} for score, i in ordered[offset : offset + limit]
            ]
        return _page(results, total, offset)

    def _score(self, i: int, terms: list[_Term], merged: dict[str, float], idf_total: float) -> float:
        """How well one candidate answers the query; see the module docstring."""
        f = self._features[i]
        identity_hits = hits = 0.0
        for term in terms:
            in_identity = _best(term, f.identity)
            identity_hits += in_identity * term.idf
            hits += max(in_identity, _best(term, f.rest)) * term.idf
        name_idf, title_idf = self._weights[i]
        return (
            _W_IDENTITY_COVERAGE * identity_hits / idf_total
            + _W_COVERAGE * hits / idf_total
            + _W_NAME_PRECISION * _precision(f.name, name_idf, merged)
            + _W_TITLE_PRECISION * _precision(f.title or f.name, title_idf, merged)
        )

    def _listing(self, namespace: str | None, limit: int, offset: int) -> dict[str, Any]:
        tools = self._catalog.tools()
        if namespace:
            tools = [t for t in tools if t.namespace == namespace]
        results = [{**t.summary(), "score": 0.0} for t in tools[offset : offset + limit]]
        return _page(results, len(tools), offset)


def _merged(terms: list[_Term]) -> dict[str, float]:
    """Every indexed word the query stands for, with its best weight."""
    out: dict[str, float] = {}
    for term in terms:
        for word, weight in term.forms.items():
            if out.get(word, 0.0) < weight:
                out[word] = weight
    return out


def _precision(words: tuple[str, ...], idfs: tuple[float, ...], merged: dict[str, float]) -> float:
    """How much of a name or title the query accounts for, 0..1, rare words counting more.

    An unmatched rare word (``unpin`` in ``issues_unpin_comment``) says the
    tool does something specific that was not asked for; an unmatched common
    one (``create``) says little.
    """
    whole = matched = 0.0
    for w, idf in zip(words, idfs):
        whole += idf
        matched += idf * merged.get(w, 0.0)
    return matched / whole if whole else 0.0


def _best(term: _Term, words: frozenset[str]) -> float:
    best = 0.0
    for word, weight in term.forms.items():
        if weight > best and word in words:
            best = weight
    return best


def _tiers(groups: list[str]) -> list[str]:
    """FTS5 expressions for each match tier, best first, each excluding the ones above."""
    every = "(" + " AND ".join(groups) + ")"
    some = "(" + " OR ".join(groups) + ")"
    ident = "{" + " ".join(_IDENTITY) + "}"
    ident_every = f"{ident} : {every}"
    if len(groups) == 1:
        return [ident_every, f"{every} NOT {ident_every}"]
    ident_some = f"{ident} : {some}"
    return [
        ident_every,
        f"({every} AND {ident_some}) NOT {ident_every}",
        f"{every} NOT {ident_some}",
        f"{ident_some} NOT {every}",
        f"{some} NOT ({every} OR {ident_some})",
    ]


def _page(results: list[dict[str, Any]], total: int, offset: int) -> dict[str, Any]:
    end = offset + len(results)
    return {"results": results, "total": total, "next_offset": end if end < total else None}


def search(
    catalog: Catalog, query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0
) -> dict[str, Any]:
    """Search ``catalog`` for tools matching ``query``, best first.

    Returns ``{"results": [tool summary + "score"], "total", "next_offset"}``
    where ``next_offset`` is the offset of the next page or ``None`` after the
    last one. ``namespace`` restricts the search to one namespace; an empty
    query lists the tools (of that namespace) alphabetically. ``limit`` is
    clamped to 1..100. No query text raises.
    """
    index = catalog.memo("search.index", lambda: SearchIndex(catalog))
    return index.search(query, namespace=namespace, limit=limit, offset=offset)
