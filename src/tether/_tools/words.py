"""Words for tool search: identifiers split, plurals folded, synonyms a person uses.

One normaliser serves both sides, so a query and a tool's name, title and
description meet in the same vocabulary: ``pulls_list`` and "List pull
requests" both become ``pull list`` / ``list pull request``.

Stemming is deliberately light (plurals only, after Harman's S-stemmer):
``repositories → repository``, ``branches → branch``, ``issues → issue``.
A full Porter stemmer folds too much for tool names (``organization`` and
``organ``; ``authenticated`` and ``authentic``) and makes the words a result
is explained with unreadable.
"""

from __future__ import annotations

import functools
import re

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

# Words of a question that say nothing about which tool is meant. Dropped only
# when other words remain, so "get" or "list" alone still searches.
STOPWORDS = frozenset(
    "a an and any are as at be been by can could do does for from how i in into is it its of on or our "
    "please should so some that the their them then there these this those to us use using want was we "
    "what when where which will with would you your am".split()
)

# Words that say whose, not what: "list my files" asks for files first. A tool named for "my" or "me"
# answers them, but the word never weighs more than the commonest other word of the query (search.py).
POSSESSIVES = frozenset({"my", "mine", "myself"})

# Words in a tool's name that do not say what it does (``get_files_id``).
NAME_NOISE = frozenset({"id", "ids", "by", "for", "of", "to", "in", "on", "a", "an", "the", "and", "or", "with"})

# Query word → words a tool may use for the same thing, each with how sure the
# match is. Verbs first: an API says "get", a person says "fetch" or "show".
# Keys and values are normalised forms (see ``stem``).
_GROUPS: list[tuple[tuple[str, ...], tuple[str, ...], float]] = [
    # (query words, tool words they also mean, weight)
    (("get", "fetch", "retrieve", "read", "show", "view", "see", "lookup", "detail", "info", "information",
      "inspect", "describe", "load", "download"), ("get", "retrieve", "fetch", "read"), 0.8),
    (("list", "all", "show", "browse", "enumerate", "every"), ("list", "all"), 0.8),
    (("create", "add", "new", "make", "open", "start", "submit", "post", "insert", "write", "set", "upload",
      "generate", "produce", "compose", "send"),
     ("create", "add", "post", "new", "start"), 0.75),
    (("delete", "remove", "destroy", "drop", "erase", "discard", "trash", "purge", "unset"),
     ("delete", "remove", "destroy"), 0.8),
    (("update", "edit", "modify", "change", "set", "rename", "close", "reopen", "move", "replace", "patch",
      "put", "toggle", "enable", "disable"), ("update", "edit", "put", "patch", "set", "change"), 0.7),
    (("search", "find", "query", "lookup", "look", "filter"), ("search", "find", "query"), 0.8),
    (("cancel", "stop", "abort", "halt"), ("cancel", "stop", "abort"), 0.8),
    (("me", "my", "mine", "myself", "logged", "login", "whoami", "current", "self"),
     ("authenticated", "me", "current", "viewer"), 0.8),
    (("repo", "repository"), ("repo", "repository"), 0.9),
    # Git names a branch or a tag by a reference (GitHub's git_create_ref, "Create a reference").
    (("branch", "tag"), ("ref", "reference"), 0.6),
    (("org", "organization", "organisation", "company"), ("org", "organization"), 0.9),
    (("folder", "directory", "dir"), ("folder", "directory"), 0.9),
    (("file", "document", "doc"), ("file", "content", "document"), 0.6),
    (("user", "person", "people", "member", "account", "who"), ("user", "member", "account"), 0.6),
    (("email", "mail", "e-mail"), ("email", "mail"), 0.9),
    (("message", "msg", "chat"), ("message",), 0.8),
    (("config", "configuration", "setting", "settings", "preference"), ("config", "configuration", "setting"), 0.8),
    (("approve", "approval"), ("approve", "review"), 0.6),
]

# One query word that a tool spells as several.
_PHRASES = {
    "pr": ("pull", "request"),
    "prs": ("pull", "request"),
    "mr": ("merge", "request"),
    "whoami": ("authenticated", "user"),
    "ci": ("workflow", "check"),
}


# Plurals the rules below would get wrong.
_IRREGULAR = {"aliases": "alias", "alias": "alias", "caches": "cache", "statuses": "status", "people": "person", "children": "child", "data": "data"}


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Fold an English plural onto its singular; anything else is left alone."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and not w.endswith(("eies", "aies")):
        return w[:-3] + "y"
    if w.endswith(("ches", "shes", "sses", "xes", "zzes")):
        return w[:-2]
    if w.endswith("es") and not w.endswith(("aes", "ees", "oes")):
        return w[:-1]
    if w.endswith("s") and not w.endswith(("us", "ss", "is", "ous")):
        return w[:-1]
    return w


def split_words(text: str) -> list[str]:
    """Lower-case words of ``text`` with snake_case and camelCase split apart."""
    words: list[str] = []
    for chunk in _WORD.findall(text):
        # Case boundaries mean word boundaries only in ASCII identifiers.
        parts = _CAMEL.findall(chunk) if chunk.isascii() else [chunk]
        words.extend(p.lower() for p in (parts or [chunk]))
    return words


def normalise(text: str | None) -> list[str]:
    """Stemmed words of ``text``, in order, duplicates kept."""
    out: list[str] = []
    if text:
        for chunk in _WORD.findall(text):
            out.extend(_normalised_chunk(chunk))
    return out


@functools.lru_cache(maxsize=65536)
def _normalised_chunk(chunk: str) -> tuple[str, ...]:
    # Index builds normalise every word of every description: the same few
    # thousand words, so each is split and stemmed once.
    if chunk.islower() or not chunk.isascii():
        return (stem(chunk),)
    return tuple(stem(p.lower()) for p in (_CAMEL.findall(chunk) or [chunk]))


# Several query words that an API spells as one (checked before single words).
_MULTI = {
    ("log", "in"): ("login",),
    ("sign", "in"): ("login",),
    ("log", "out"): ("logout",),
    ("sign", "out"): ("logout",),
    ("who", "am", "i"): ("me",),
}


def query_terms(query: str, limit: int) -> list[str]:
    """The distinct words of a query that carry meaning, normalised, at most ``limit``."""
    words: list[str] = []
    split = split_words(query)
    i = 0
    while i < len(split):
        for size in (3, 2):
            joined = _MULTI.get(tuple(split[i:i + size]))
            if joined is not None:
                words.extend(joined)
                i += size
                break
        else:
            words.extend(_PHRASES.get(split[i], (split[i],)))
            i += 1
    terms = list(dict.fromkeys(stem(w) for w in words))
    kept = [t for t in terms if t not in STOPWORDS] or terms
    return kept[:limit]


@functools.lru_cache(maxsize=4096)
def alternatives(term: str) -> dict[str, float]:
    """``{word: weight}`` a tool may use for ``term``: itself at 1.0, synonyms below."""
    out = {term: 1.0}
    for asked, meant, weight in _GROUPS:
        if term in asked:
            for word in meant:
                if out.get(word, 0.0) < weight:
                    out[word] = weight
    return out
