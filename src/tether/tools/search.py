"""Ranked tool search: SQLite FTS5 with BM25 over an in-memory index.

The index is built lazily on the first query and rebuilt when the catalog's
version changes. Identifiers are split (``get_ticket``, ``getTicket`` →
``get ticket``) and the porter stemmer folds ``tickets``/``ticket``, so a
query in plain words finds tools named in code; a word found nowhere is also
tried as a prefix (``subscr`` → ``subscription``).

Results come in tiers (every word in the tool's name; every word anywhere and
some in the name; every word anywhere; some word in the name; some word
anywhere), BM25-ranked within each tier with
column weights that favour the name. User text never reaches FTS5 syntax:
each word becomes a quoted term, so quotes, ``*``, ``-``, ``NEAR`` or
unbalanced parentheses are just words.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any

from .catalog import Catalog
from .model import Tool

# Column order of the FTS table, and the BM25 weight of each: the name is what
# a tool *is*; descriptions are long and mention many things in passing.
_COLUMNS = ("address", "namespace", "name", "title", "description", "params")
_WEIGHTS = (4.0, 2.0, 10.0, 5.0, 1.0, 1.5)
# What a tool is called, as opposed to what its description mentions.
_IDENTITY = ("address", "name", "title")

# Words that appear in most questions and in no tool's identity. Dropped only
# when other words remain, so "get" or "list" alone still searches.
_STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i in into is it me my of on or "
    "please show that the this to use want what which with you".split()
)

# Terms shorter than this get no prefix expansion: "a*" would match everything.
_MIN_PREFIX = 3
# A query longer than this is someone pasting a document; the head is enough.
_MAX_TERMS = 16
MAX_LIMIT = 100

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def split_words(text: str) -> list[str]:
    """Lower-case words of ``text`` with snake_case and camelCase split apart."""
    words: list[str] = []
    for chunk in _WORD.findall(text):
        # Case boundaries mean word boundaries only in ASCII identifiers.
        parts = _CAMEL.findall(chunk) if chunk.isascii() else [chunk]
        words.extend(p.lower() for p in (parts or [chunk]))
    return words


def _indexed(text: str | None) -> str:
    # Keep the original spelling too, so an exact identifier still matches as one token.
    if not text:
        return ""
    return f"{text} {' '.join(split_words(text))}"


def _terms(query: str) -> list[str]:
    terms = list(dict.fromkeys(split_words(query)))
    kept = [t for t in terms if t not in _STOPWORDS] or terms
    return kept[:_MAX_TERMS]


def _tiers(terms: list[str], prefixed: set[str]) -> list[tuple[int, str]]:
    """FTS5 expressions for each match tier, best first, each excluding the ones above.

    5: every word in the tool's identity (name, address, title); 4: every word
    somewhere and some in the identity; 3: every word somewhere; 2: some word
    in the identity; 1: some word anywhere. Besides ordering by what matters,
    tiers keep ranking cheap on big catalogs: BM25 costs ~2 µs per matching
    row and a common word can match thousands, so only the tiers a page
    reaches are ranked.
    """
    groups = [f'("{t}" OR "{t}"*)' if t in prefixed else f'"{t}"' for t in terms]
    every = "(" + " AND ".join(groups) + ")"
    some = "(" + " OR ".join(groups) + ")"
    ident = "{" + " ".join(_IDENTITY) + "}"
    ident_every = f"{ident} : {every}"
    if len(groups) == 1:
        return [(5, ident_every), (3, f"{every} NOT {ident_every}")]
    ident_some = f"{ident} : {some}"
    return [
        (5, ident_every),
        (4, f"({every} AND {ident_some}) NOT {ident_every}"),
        (3, f"{every} NOT {ident_some}"),
        (2, f"{ident_some} NOT {every}"),
        (1, f"{some} NOT ({every} OR {ident_some})"),
    ]


class SearchIndex:
    """An FTS5 index over one catalog, rebuilt when the catalog changes."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._tools: list[Tool] = []
        self._version = -1

    def _ensure(self) -> sqlite3.Connection:
        if self._db is not None and self._version == self._catalog.version:
            return self._db
        version = self._catalog.version
        tools = self._catalog.tools()
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute(
            "CREATE VIRTUAL TABLE tools USING fts5("
            + ", ".join(_COLUMNS)
            + ", ns UNINDEXED, tokenize='porter unicode61', prefix='3')"
        )
        db.execute("INSERT INTO tools(tools, rank) VALUES('rank', ?)", (f"bm25({', '.join(map(str, _WEIGHTS))})",))
        rows = (
            (
                i,
                _indexed(t.address),
                _indexed(t.namespace),
                _indexed(t.name),
                t.title or "",
                t.description or "",
                _indexed(" ".join((t.input_schema.get("properties") or {}).keys())),
                t.namespace,
            )
            for i, t in enumerate(tools)
        )
        with db:
            db.executemany("INSERT INTO tools(rowid, " + ", ".join(_COLUMNS) + ", ns) VALUES (?,?,?,?,?,?,?,?)", rows)
        if self._db is not None:
            self._db.close()
        self._db, self._tools, self._version = db, tools, version
        return db

    def search(
        self, query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0
    ) -> dict[str, Any]:
        """Rank tools for ``query``; see :func:`search` for the result shape."""
        limit = max(1, min(int(12 if limit is None else limit), MAX_LIMIT))
        offset = max(0, int(offset or 0))
        terms = _terms(query or "")
        with self._lock:
            if not terms:
                return self._listing(namespace, limit, offset)
            db = self._ensure()
            scope = " AND ns = ?" if namespace else ""
            extra: tuple[Any, ...] = (namespace,) if namespace else ()
            # A word found as typed needs no prefix expansion (the stemmer already
            # folds its inflections); expanding every word doubles the doclists merged.
            prefixed = {
                t
                for t in terms
                if len(t) >= _MIN_PREFIX
                and db.execute("SELECT 1 FROM tools WHERE tools MATCH ? LIMIT 1", (f'"{t}"',)).fetchone() is None
            }
            tiers = _tiers(terms, prefixed)
            results: list[dict[str, Any]] = []
            skip = offset
            for tier, expression in tiers:
                if len(results) == limit:
                    break
                params = (expression, *extra)
                if skip:
                    size = db.execute(f"SELECT count(*) FROM tools WHERE tools MATCH ?{scope}", params).fetchone()[0]
                    if skip >= size:
                        skip -= size
                        continue
                rows = db.execute(
                    f"SELECT rowid, rank FROM tools WHERE tools MATCH ?{scope} ORDER BY rank, rowid LIMIT ? OFFSET ?",
                    (*params, limit - len(results), skip),
                ).fetchall()
                skip = 0
                for rowid, rank in rows:
                    # Integer part: the tier; fraction: BM25 within it, squashed into [0, 1).
                    bm25 = max(0.0, -rank)
                    results.append({**self._tools[rowid].summary(), "score": round(tier + bm25 / (1 + bm25), 4)})
            anywhere = " OR ".join(f'"{t}"' + (f' OR "{t}"*' if t in prefixed else "") for t in terms)
            total = db.execute(f"SELECT count(*) FROM tools WHERE tools MATCH ?{scope}", (anywhere, *extra)).fetchone()[0]
        return _page(results, total, offset)

    def _listing(self, namespace: str | None, limit: int, offset: int) -> dict[str, Any]:
        tools = self._catalog.tools()
        if namespace:
            tools = [t for t in tools if t.namespace == namespace]
        results = [{**t.summary(), "score": 0.0} for t in tools[offset : offset + limit]]
        return _page(results, len(tools), offset)


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
