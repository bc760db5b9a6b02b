"""Ranked tool search: an inverted index finds the candidates, a short rerank puts the obvious tool first.

The index is built lazily on the first query and rebuilt when the catalog's
version changes. Every text is normalised by :mod:`.words` (identifiers
split, plurals folded), so a query in plain words finds tools named in code.
Each query word also matches its synonyms (fetch → get, remove → delete, my →
authenticated), related forms (assign → assignee, signature → sign), and a
word found nowhere is tried as a prefix (``subscr`` → ``subscription``) or as
two words run together (``rerun`` → ``re run``).

Three stages:

1. **Candidates** come in tiers (every word in the tool's identity — name,
   title, namespace; some in the identity; some anywhere), computed with set
   operations on per-word postings. In the first tier the tools with the
   shortest identity come first; in the partial tiers the tools that say the
   most of the query's weight (rare words weighing more, a word only in the
   description 0.3 of one in the name or title) come first, so a name with two
   rare words of the query is not buried under hundreds of titles with one
   common word. Only the tiers a page reaches are ordered.
2. **Rerank** of the first ``_WINDOW`` candidates by how well the tool's
   identity answers the query: what share of the query its name and title
   cover, and what share of its name and title the query covers (rare words
   counting more). That second part is what makes ``pulls_list`` ("List pull
   requests") beat ``pull_request_stacks_list`` for "list pull requests":
   long names that merely contain the words lose to the exact match.
   Candidates past the window keep their tier order, so pages of any size
   form one order and never overlap or skip.
3. **Across namespaces** (no ``namespace=``, none named in the query), the
   k-th tool of a namespace keeps ``0.95 ** k`` of its score, so one API's
   near-duplicates do not hide another API's answer.

A title is its first sentence (OpenAI's summaries are paragraphs; the rest is
read as description) and a Markdown link's address is not a word. "my" never
weighs more than the commonest other word of the query: it says whose.

No query text is syntax: every word is looked up as a word. See D-20 for why
this is not SQLite FTS5 with BM25 any more, and D-44 for the rules for several
APIs in one catalog.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tether._tools.catalog import Catalog
from tether._tools.model import Tool
from tether._tools.words import NAME_NOISE, POSSESSIVES, STOPWORDS, alternatives, normalise, query_terms

__all__ = ["MAX_LIMIT", "SearchIndex", "search"]

# Terms shorter than this get no prefix expansion: "a*" would match everything.
_MIN_PREFIX = 3
# A word found nowhere matches the words it starts, at this weight.
_PREFIX = 0.9
# Related forms of a word (a shared start this long) match with these weights.
_MIN_RELATED = 4
_RELATED = 0.7
_RELATED_SHORTER = 0.6
# Endings whose stem names the same thing: collaborator, collaboration, collaborating.
_AGENT_SUFFIXES = ("or", "er", "ion", "ing")
_MIN_STEM = 6
# At most this many indexed words stand for one prefix.
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
# A Markdown link's target: "[Responses](/docs/api-reference/responses)" says "Responses", not "doc api".
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")

# The rerank's weights (see _score). Coverage of the query by the identity
# matters most; how much of the identity the query covers separates an exact
# match from a long name that merely contains the words.
_W_IDENTITY_COVERAGE = 3.0
_W_COVERAGE = 1.0
_W_NAME_PRECISION = 1.5
_W_TITLE_PRECISION = 1.5
# Across namespaces, each tool already placed from the same namespace discounts the next one's score by
# this share. 0.05 on the combined bench catalog (D-44): 0.02 changed nothing, 0.10 pushed
# single-API answers ("assign an issue to someone") out of the first three.
_DIVERSE = 0.05
_KEEP = tuple((1.0 - _DIVERSE) ** k for k in range(_WINDOW))
# In the candidate order, a query word found only outside the identity (the description, a parameter)
# counts this much of one found in the name or title.
_ELSEWHERE = 0.3
# A query word said by more than this many times the places wanted is counted lazily (see _heaviest).
_MANY = 4


@dataclass(frozen=True)
class _Features:
    """What the rerank reads of one tool, normalised once at index build."""

    name: tuple[str, ...]
    title: tuple[str, ...]  # the title, or the description's first sentence
    identity: frozenset[str]
    rest: frozenset[str]  # description head and parameter names


def _features(tool: Tool) -> tuple[_Features, set[str], frozenset[str]]:
    """The rerank's view of a tool, and the words it is found by: in its identity, and anywhere else."""
    name_words = normalise(tool.name)
    name = tuple(dict.fromkeys(t for t in name_words if t not in NAME_NOISE)) or tuple(name_words)
    # A title is a line; some APIs put a whole description in it (OpenAI's summaries run to paragraphs).
    # Only its first sentence names the tool: the rest is read like a description.
    title_words = normalise(_first_sentence(tool.title or ""))
    title_text_words = title_words or normalise(_first_sentence(tool.description or ""))
    title = tuple(dict.fromkeys(t for t in title_text_words if t not in STOPWORDS))
    namespace = _namespace_words(tool.namespace)
    description = normalise(_LINK_TARGET.sub("]", (tool.description or "")[:_DESCRIPTION_CHARS]))
    params = normalise(" ".join((tool.input_schema.get("properties") or {}).keys()))
    title_rest = normalise(_LINK_TARGET.sub("]", (tool.title or "")[:_DESCRIPTION_CHARS]))
    rest = frozenset((*description, *params, *title_rest))
    features = _Features(name, title, frozenset((*name, *title, *namespace)), rest)
    identity = {*namespace, *name_words, *title_words}
    return features, identity, rest - identity


@functools.lru_cache(maxsize=1024)
def _namespace_words(namespace: str) -> tuple[str, ...]:
    return tuple(normalise(namespace))


def _first_sentence(text: str) -> str:
    head = _LINK_TARGET.sub("]", text.strip().split("\n", 1)[0][:160])
    cut = head.find(". ")
    return head[: cut + 1] if cut > 0 else head


@dataclass(frozen=True)
class _Term:
    """One query word and every indexed word that counts as it, with how much."""

    word: str
    forms: dict[str, float]  # indexed word -> weight: the word itself 1.0, synonyms and related forms below
    idf: float


class SearchIndex:
    """An inverted index over one catalog, rebuilt when the catalog changes."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()
        self._tools: list[Tool] = []
        self._features: list[_Features] = []
        # word -> the tools that have it in their identity / only elsewhere
        self._identity: dict[str, set[int]] = {}
        self._elsewhere: dict[str, set[int]] = {}
        self._namespaces: dict[str, set[int]] = {}
        # A tool's place within a tier: shortest identity first, then catalog order.
        self._order: list[tuple[int, int]] = []
        self._vocab: frozenset[str] = frozenset()
        self._sorted_vocab: list[str] = []
        self._idf: dict[str, float] = {}
        self._weights: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
        self._idf_max = 1.0
        self._version = -1
        self._namespace_of: dict[str, str] = {}

    def _ensure(self) -> None:
        if self._version == self._catalog.version:
            return
        version = self._catalog.version
        tools = self._catalog.tools()
        features: list[_Features] = []
        identity: dict[str, set[int]] = {}
        elsewhere: dict[str, set[int]] = {}
        namespaces: dict[str, set[int]] = {}
        df: dict[str, int] = {}
        for i, tool in enumerate(tools):
            f, found_by, also = _features(tool)
            features.append(f)
            for word in found_by:
                identity.setdefault(word, set()).add(i)
            for word in also:
                elsewhere.setdefault(word, set()).add(i)
            namespaces.setdefault(tool.namespace, set()).add(i)
            for word in {*f.name, *f.title}:
                df[word] = df.get(word, 0) + 1
        n = max(1, len(tools))
        self._idf = idf = {word: math.log(1 + n / count) for word, count in df.items()}
        self._idf_max = math.log(1 + n)
        self._weights = [
            (tuple(idf[w] for w in f.name), tuple(idf[w] for w in (f.title or f.name))) for f in features
        ]
        self._order = [(len(f.name) + len(f.title), i) for i, f in enumerate(features)]
        self._identity, self._elsewhere, self._namespaces = identity, elsewhere, namespaces
        # A namespace whose name is one word: that word, said in a query, names it.
        self._namespace_of = {words[0]: ns for ns in namespaces if len(words := _namespace_words(ns)) == 1}
        self._tools, self._features = tools, features
        self._vocab = frozenset(identity.keys() | elsewhere.keys())
        self._sorted_vocab = sorted(self._vocab)
        self._version = version

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
        # "my" says whose, not what: it never tells tools apart more than the commonest other word asked
        # ("list my files" is a search for files, not for directus.get_my_permissions).
        others = [t.idf for t in terms if t.word not in POSSESSIVES and t.forms]
        if others and len(others) < len(terms):
            floor = min(others)
            terms = [_Term(t.word, t.forms, min(t.idf, floor)) if t.word in POSSESSIVES else t for t in terms]
        return terms

    def _term(self, word: str) -> _Term:
        vocab = self._vocab
        forms = {w: weight for w, weight in alternatives(word).items() if w in vocab}
        if not forms and len(word) >= _MIN_PREFIX:
            # Found nowhere as typed: the start of a word (``subscr``).
            self._add_prefixed(forms, word, _PREFIX)
        elif len(word) >= _MIN_RELATED:
            # Related forms: ``assign`` → ``assignee``, ``collaborate`` → ``collaboration``,
            # ``collaborator`` → ``collaboration`` (an agent noun's stem).
            self._add_prefixed(forms, word[:-1] if word.endswith("e") else word, _RELATED)
            for suffix in _AGENT_SUFFIXES:
                if word.endswith(suffix) and len(word) - len(suffix) >= _MIN_STEM:
                    self._add_prefixed(forms, word[:-len(suffix)], _RELATED)
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
            self._ensure()
            terms = [t for t in self._terms(query) if t.forms]
            if not terms:
                # No word of the query is in any tool.
                return _page([], 0, offset)
            if namespace is None:
                # "log in to directus": a word naming one of several namespaces says where to look
                # (a person names the product), and is not itself something the tool must say.
                named = [t for t in terms if t.word in self._namespace_of]
                rest = [t for t in terms if t.word not in self._namespace_of]
                if named and rest and len(self._namespaces) > 1:
                    there = self._namespaces[self._namespace_of[named[0].word]]
                    # Only when the rest of the query is found there: "ticket email" with a namespace
                    # called email and no ticket in it is a search for both words.
                    if all(_union(self._identity.get(w) for w in t.forms) & there
                           or _union(self._elsewhere.get(w) for w in t.forms) & there for t in rest):
                        namespace, terms = self._namespace_of[named[0].word], rest
            scope = self._namespaces.get(namespace, set()) if namespace else None
            in_identity: list[set[int]] = []
            anywhere: list[set[int]] = []
            for term in terms:
                ident = _union(self._identity.get(w) for w in term.forms)
                other = _union(self._elsewhere.get(w) for w in term.forms)
                if scope is not None:
                    ident, other = ident & scope, other & scope
                in_identity.append(ident)
                anywhere.append(ident | other)
            # Candidates in tier order, as far as the page (and the rerank window) reach.
            need = max(_WINDOW, offset + limit)
            found: list[int] = []
            for tier, partial in _tiers(in_identity, anywhere):
                if len(found) >= need:
                    break
                if partial:
                    found += self._heaviest(tier, terms, in_identity, anywhere, need - len(found))
                else:
                    found += self._first(tier, need - len(found))
            total = len(set().union(*anywhere))
            merged = _merged(terms)
            idf_total = sum(t.idf for t in terms)
            window = sorted(
                ((self._score(i, terms, merged, idf_total), n, i) for n, i in enumerate(found[:_WINDOW])),
                key=lambda x: (-x[0], x[1]),
            )
            ordered = [(score, i) for score, _, i in window]
            if namespace is None and len(self._namespaces) > 1:
                ordered = self._diverse(ordered)
            floor = ordered[-1][0] if ordered else 0.0
            for i in found[_WINDOW : offset + limit]:
                # Past the window the tier order stands; a score never rises down the list.
                floor = min(floor, self._score(i, terms, merged, idf_total))
                ordered.append((floor, i))
            results = [
                _result(self._tools[i], round(score, 4)) for score, i in ordered[offset : offset + limit]
            ]
        return _page(results, total, offset)

    def _diverse(self, ordered: list[tuple[float, int]]) -> list[tuple[float, int]]:
        """The window reordered so a namespace's second answer yields to a near-equal first one of another.

        A query that names no API is often answered by several, and one API's near-duplicates must not
        hide another's answer: for "send a document for signature" GitHub's get / create / delete
        commit-signature-protection filled the first three places ahead of Box's sign request. The k-th
        tool of a namespace (in score order) is discounted by ``(1 - _DIVERSE) ** k`` -- the same order as
        placing tools one at a time, each discounted per tool of its namespace already placed -- and the
        reported scores are the discounted ones, so they never rise down the page.
        """
        tools = self._tools
        seen: dict[str, int] = {}
        out: list[tuple[float, int, int]] = []
        for n, (score, i) in enumerate(ordered):
            ns = tools[i].namespace
            k = seen.get(ns, 0)
            seen[ns] = k + 1
            out.append((score * _KEEP[k] if k < len(_KEEP) else 0.0, n, i))
        out.sort(key=lambda x: (-x[0], x[1]))
        return [(score, i) for score, _, i in out]

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

    def _heaviest(self, tier: set[int], terms: list[_Term], in_identity: list[set[int]],
                  anywhere: list[set[int]], count: int) -> list[int]:
        """The first ``count`` tools of a partial tier: most of the query's weight in the identity first.

        A tool that says two rare words of the query in its name (``post_zip_downloads`` for "download
        several files as a zip") must reach the rerank before the hundreds whose title says only a
        common one (``get_file``); shortest-identity order alone let those fill the window.
        """
        spare = _ELSEWHERE * sum(t.idf for t in terms)
        # Rarest word first. A word many tools say ("list" in a catalog of list_*) is counted one tool at a
        # time only while it could still lift a tool not yet counted past the count-th counted one;
        # after that it is added only to the tools already counted.
        hits = sorted(((ident & tier, term.idf) for term, ident in zip(terms, in_identity)), key=lambda h: len(h[0]))
        weight: dict[int, float] = {}
        for n, (found_here, idf) in enumerate(hits):
            if len(found_here) > _MANY * count and len(weight) >= count:
                # An uncounted tool has at most every remaining word in its identity and the counted
                # ones in its description.
                rest = sum(h[1] for h in hits[n:]) + _ELSEWHERE * sum(h[1] for h in hits[:n])
                if heapq.nlargest(count, weight.values())[-1] >= rest:
                    for later, later_idf in hits[n:]:
                        for i in weight.keys() & later:
                            weight[i] += later_idf
                    break
            for i in found_here:
                weight[i] = weight.get(i, 0.0) + idf
        if len(weight) >= count:
            # Only a tool within reach of the count-th heaviest can still get there from its description.
            reach = heapq.nlargest(count, weight.values())[-1] - spare
            within: set[int] = {i for i, w in weight.items() if w >= reach}
        else:
            within = tier
        for term, ident, found in zip(terms, in_identity, anywhere):
            idf = _ELSEWHERE * term.idf
            for i in (found & within) - ident:
                weight[i] = weight.get(i, 0.0) + idf
        order = self._order
        return [i for _, _, i in heapq.nsmallest(count, ((-weight.get(i, 0.0), order[i], i) for i in within))]

    def _first(self, tier: set[int], count: int) -> list[int]:
        """The first ``count`` tools of a tier in its order (shortest identity first)."""
        order = self._order
        if len(tier) > 4 * count:
            return [i for _, i in heapq.nsmallest(count, (order[i] for i in tier))]
        return [i for _, i in sorted(order[i] for i in tier)[:count]]

    def _listing(self, namespace: str | None, limit: int, offset: int) -> dict[str, Any]:
        tools = self._catalog.tools()
        if namespace:
            by_namespace: dict[str, list[Tool]] = self._catalog.memo("search.by_namespace", dict)
            if not by_namespace and tools:
                for t in tools:
                    by_namespace.setdefault(t.namespace, []).append(t)
            tools = by_namespace.get(namespace, [])
        results = [_result(t, 0.0) for t in tools[offset : offset + limit]]
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


def _union(sets: Any) -> set[int]:
    out: set[int] = set()
    for found in sets:
        if found:
            out |= found
    return out


def _tiers(in_identity: list[set[int]], anywhere: list[set[int]]) -> Iterator[tuple[set[int], bool]]:
    """The candidate tiers, best first, each without the tools of the tiers above; computed as reached.

    Each comes with whether it is partial: its tools match only part of the query, so they are ordered by
    the weight they match (``_heaviest``) rather than by size.

    Every word in the identity first; then the tools that say some word of the query in their identity,
    heaviest first (a rare word in the name outweighs every common word somewhere in the description);
    then the rest.
    """
    every_identity = set.intersection(*in_identity)
    yield every_identity, False
    if len(in_identity) == 1:
        yield set.intersection(*anywhere) - every_identity, False
        return
    some_identity = set().union(*in_identity)
    yield some_identity - every_identity, True
    yield set().union(*anywhere) - some_identity, True


# A result's text is the upstream's own: bounded, so a page of 100 results fits a journaled value (1 MiB by
# default) even when every character is one JSON escapes in six bytes. Real descriptions rarely reach it.
_RESULT_DESCRIPTION_CHARS = 1000
_RESULT_TITLE_CHARS = 200


def _result(tool: Tool, score: float) -> dict[str, Any]:
    entry = {**tool.summary(), "score": score}
    description, title = entry["description"] or "", entry["title"]
    if len(description) > _RESULT_DESCRIPTION_CHARS:
        entry["description"] = (f"{description[:_RESULT_DESCRIPTION_CHARS]} … (cut: "
                                f"describe({tool.address!r}, detail='description') shows all of it)")
    if title and len(title) > _RESULT_TITLE_CHARS:
        entry["title"] = title[:_RESULT_TITLE_CHARS] + " …"
    return entry


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
