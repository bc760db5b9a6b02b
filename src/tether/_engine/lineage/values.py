"""What can be matched later in a value, and matching (D-63).

A tool result is scanned once for the things a later write could carry to a destination: e-mail
addresses, URLs and their hosts, IBANs (checksum valid), phone numbers, identifiers (long alphanumeric
ids, UUIDs) and windows of long text. Each is kept as a :class:`Mark` in a normalised form (NFKC,
case folded, surrounding punctuation and spacing dropped), so the same value written in another case or
with other spacing still meets it. Values that would match by chance do not count: short numbers,
booleans, dates, plain words, strings shorter than an identifier — unless a text quotes one as a value
("delete the file with ID '13'"), which is what an injected instruction does.

The work is bounded whatever the value: at most ``MAX_CHARS`` characters of strings are read in all (and
``MAX_STRING`` of one string), ``MAX_NODES`` containers and leaves visited, ``MAX_DEPTH`` levels deep,
and at most ``limit`` marks returned. Every pattern is precompiled and linear in its input.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar
from urllib.parse import unquote

T = TypeVar("T")

# A tool result in tether is a journaled JSON value (a few KiB typically); 64 KiB of its strings is well past
# what a copied address or sentence needs, and keeps a hostile 60 MB answer from costing more than a small one.
MAX_CHARS = 65_536
# One long string (a whole file, a page) stops counting here; what a model copies is near its start in practice
# and the other strings of the value still get their share of MAX_CHARS.
MAX_STRING = 16_384
# Containers and leaves visited: a list of 100,000 tiny items says nothing more after the first 10,000.
MAX_NODES = 10_000
# Items read of one list or object, so a wide first level leaves room for what its items hold.
MAX_ITEMS = 1_000
# JSON nesting this deep is data shaped to hurt, not a result.
MAX_DEPTH = 32
# Marks kept per value: enough for a page of e-mails (addresses, links, sentence windows), small to journal.
DEFAULT_LIMIT = 256
# Words in a text window: a copied sentence (15+ words) always holds a whole window at a multiple of the
# stride, while 8 words in a row are rarely shared by chance.
WINDOW = 8
# Windows kept per string of a result (the first 256 words); an argument is searched with every window.
MAX_WINDOWS = 32
MAX_QUERY_WINDOWS = 512

# Proper names kept per string of a result: a review or a page names a few places; a list of names past this
# is a catalogue, whose later names a model copies no more often than its first.
MAX_NAMES = 16

KINDS = ("email", "url", "host", "iban", "phone", "id", "text", "name")


@dataclass(frozen=True)
class Mark:
    """One matchable thing found in a value."""

    kind: str  # one of KINDS
    norm: str  # normalised form: the key values are matched by
    path: str  # where in the value: "" for the whole value, "[2].body", ".to[0]"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "norm": self.norm, "path": self.path}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> "Mark":
        return cls(str(data.get("kind", "")), str(data.get("norm", "")), str(data.get("path", "")))


# -- patterns (all linear: no nested unbounded repetition) ---------------------------------------------------

_EMAIL = re.compile(r"(?<![\w.+%-])[\w.+%-]{1,64}@(?:[^\W_][\w-]{0,62}\.){1,8}[^\W\d_]{2,24}(?![\w-])")
_URL = re.compile(r"(?:\b[a-z][a-z0-9+.-]{1,15}://|\bwww\.)[^\s<>\"'`{}|\\^]{1,2048}", re.IGNORECASE)
# A bare host (``evil.com``, ``www.x.io/path``): labels of letters, digits and hyphens, an alphabetic TLD.
_HOST = re.compile(r"(?<![\w@./:-])(?:[^\W_][\w-]{0,62}\.){1,8}[^\W\d_]{2,24}(?:/[^\s<>\"'`{}|\\^]{0,2048})?"
                   r"(?![\w@-])")
# Printed in groups of four or compact; the checksum (iban_valid) is what makes a match an IBAN.
# Groups of four, run together or parted by a space, a dash or a dot (a payee form strips any of them).
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ .-]?[A-Z0-9]{4}){2,7}(?:[ .-]?[A-Z0-9]{1,4})?\b", re.IGNORECASE)
_IBAN_SEP = re.compile(r"[ .-]")
_IBAN_HINT = re.compile(r"[A-Z]{2}\d{2}", re.IGNORECASE)
_PHONE = re.compile(r"(?<![\w+])\+?\d[\d \-().]{6,24}\d(?!\w)")
_UUID = re.compile(r"(?i:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_TOKEN = re.compile(r"[^\W_][\w-]{5,127}")
_WORD = re.compile(r"[^\W_]+")
# A word (from a space to a space) with an "@" or a "." that something follows: where addresses and links are.
_CANDIDATE = re.compile(r"(?<!\S)\S*[@.]\S+")
# A quoted value: opened after a space or a bracket (never inside a word, as an apostrophe is), closed before one.
_QUOTED = re.compile(r"(?<![\w'\"])(?:'([^'\n]{1,64})'|\"([^\"\n]{1,64})\"|\u2018([^\u2019\n]{1,64})\u2019|"
                     r"\u201c([^\u201d\n]{1,64})\u201d)(?![\w'\"])")
# A proper name written out in prose: 2 to 5 capitalised words in a row ("Riverside View Hotel"), kept from
# results only and matched against a destination's whole value (a hotel, a restaurant, a company booked).
_NAME = re.compile(r"(?<![\w'\u2019-])[^\W\d_a-z][^\W\d_A-Z]{1,30}(?: [^\W\d_a-z][^\W\d_A-Z]{1,30}){1,4}(?![\w'\u2019-])")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}$")
_SPACE = re.compile(r"\s+")
# Characters that print as nothing (zero-width spaces and joiners, the soft hyphen, direction marks, the BOM):
# inside an address or a link they change the text, not where it goes (IDNA drops them from a host), so they
# are dropped before anything is compared.
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
                        "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]")
_NO_DIGITS = str.maketrans("", "", "0123456789")
# Trailing characters a sentence puts after a link or an address, never part of it.
_TRAIL = ".,;:!?)]}'\"*_>"
# Endings that make ``name.ext`` a file, not a host (a bare host is only guessed, never required).
# Generic endings of hosts written without a scheme (every two-letter country ending counts too).
_GENERIC_TLDS = frozenset(
    "com net org edu gov mil int info biz name pro io ai app dev co xyz site online tech store shop blog page "
    "cloud email link live news world today space website web digital agency company services global group "
    "network systems solutions media club top icu vip onion local internal corp home lan example test invalid "
    "localhost".split()
)
_FILE_ENDINGS = frozenset(
    "txt pdf doc docx xls xlsx ppt pptx csv json md py js ts html htm xml png jpg jpeg gif svg zip gz tar "
    "log ini cfg toml yaml yml sh exe dll bin dat eml msg rtf odt ods mp3 mp4 wav mov avi sql db".split()
)


def normalise(text: str) -> str:
    """The form values are compared in: NFKC, case folded, inner spacing collapsed, outer spacing and
    punctuation dropped."""
    text = unicodedata.normalize("NFKC", _INVISIBLE.sub("", text[:MAX_STRING])).casefold()
    return _SPACE.sub(" ", text).strip().strip(_TRAIL + "([{<'\" ").strip()


def marks(value: object, *, limit: int = DEFAULT_LIMIT) -> list[Mark]:
    """Every matchable thing in a JSON-like value (a tool result), low-entropy values dropped, bounded."""
    return _Scanner(limit, query=False).run(value)


def find(value: object, known: Mapping[str, T]) -> list[tuple[Mark, T]]:
    """The marks of ``value`` (an argument value) whose norm is a key of ``known``.

    The argument is scanned like a result, except that a long text is cut into a window at every word
    (a result keeps one every ``WINDOW`` words), so a sentence copied from anywhere in a result meets one
    of its windows. Case and spacing changes are normalised away; transformations a program computes
    are the static pass's part (flow.py).
    """
    if not known:
        return []
    found = []
    for mark in _query_marks(value):
        hit = known.get(mark.norm)
        if hit is not None:
            found.append((mark, hit))
    return found


def query_norms(value: object) -> list[str]:
    """Exactly the norms :func:`find` looks up for ``value`` (an index can be asked for these alone)."""
    return list(dict.fromkeys(m.norm for m in _query_marks(value)))


def _query_marks(value: object) -> list[Mark]:
    return _Scanner(MAX_QUERY_WINDOWS + DEFAULT_LIMIT, query=True).run(value)


def host_of(url_norm: str) -> str:
    """The host part of a normalised URL (``evil.com/x?y`` -> ``evil.com``)."""
    end = len(url_norm)
    for sep in "/?#":
        i = url_norm.find(sep)
        if i != -1:
            end = min(end, i)
    return url_norm[:end]


def iban_valid(text: str) -> bool:
    """Whether ``text`` (letters and digits, no spaces) passes the IBAN mod-97 check (ISO 13616)."""
    if not 15 <= len(text) <= 34 or not text[:2].isalpha() or not text[2:4].isdigit() or not text.isalnum():
        return False
    moved = (text[4:] + text[:4]).upper()
    remainder = 0
    for ch in moved:
        if not ch.isascii():
            return False
        digits = str(ord(ch) - 55) if ch.isalpha() else ch
        for d in digits:
            remainder = (remainder * 10 + ord(d) - 48) % 97
    return remainder == 1


def is_low_entropy(text: str) -> bool:
    """Whether a whole scalar value says too little to be matched: no mark found in it and short."""
    return not _Scanner(4, query=True).run(text)


# -- scanning -------------------------------------------------------------------------------------------------


class _Scanner:
    __slots__ = ("limit", "query", "chars", "nodes", "out", "seen")

    def __init__(self, limit: int, *, query: bool) -> None:
        self.limit = max(0, limit)
        self.query = query
        self.chars = MAX_CHARS
        self.nodes = MAX_NODES
        self.out: list[Mark] = []
        self.seen: set[tuple[str, str]] = set()

    def run(self, value: object) -> list[Mark]:
        try:
            self._walk(value)
        except Exception:  # a container that fails when read (not JSON): what was found so far
            pass
        return self.out

    def _walk(self, value: object) -> None:
        # An explicit stack: a value nested 100,000 deep costs no Python recursion.
        stack: list[tuple[object, str, int]] = [(value, "", 0)]
        # Nodes are counted when pushed, so the stack never holds more than MAX_NODES whatever the shape.
        self.nodes -= 1
        while stack and self.chars > 0 and len(self.out) < self.limit:
            item, path, depth = stack.pop()
            if isinstance(item, str):
                self._string(item, path)
            elif isinstance(item, bool) or item is None or isinstance(item, float):
                continue
            elif isinstance(item, int):
                self._number(item, path)
            elif depth >= MAX_DEPTH:
                continue
            elif isinstance(item, Mapping):
                pairs = list(islice(item.items(), min(self.nodes, MAX_ITEMS)))
                self.nodes -= len(pairs)
                # Leaves that cannot hold a mark are dropped here, before a path is built for them.
                stack.extend(reversed([(child, _key_path(path, key), depth + 1) for key, child in pairs
                                       if not _barren(child)]))
            elif isinstance(item, (list, tuple)):
                items = list(islice(item, min(self.nodes, MAX_ITEMS)))
                self.nodes -= len(items)
                stack.extend(reversed([(child, f"{path}[{i}]", depth + 1) for i, child in enumerate(items)
                                       if not _barren(child)]))
            elif isinstance(item, (bytes, bytearray)):
                self._string(bytes(item[:MAX_STRING]).decode("utf-8", "ignore"), path)

    def _add(self, kind: str, norm: str, path: str) -> None:
        if not norm or len(self.out) >= self.limit or (kind, norm) in self.seen:
            return
        self.seen.add((kind, norm))
        self.out.append(Mark(kind, norm, path))

    def _number(self, number: int, path: str) -> None:
        # An account or phone number stored as a number; short numbers (counts, amounts, small ids) match by chance.
        text = str(abs(number)) if -10**40 < number < 10**40 else ""
        if len(text) >= 8:
            self._add("id", text, path)

    def _string(self, raw: str, path: str) -> None:
        take = min(len(raw), MAX_STRING, self.chars)
        self.chars -= take
        text = unicodedata.normalize("NFKC", _INVISIBLE.sub("", raw[:take]))
        if len(text) < 6:
            return
        masked = text
        if "@" in text or "." in text:
            # Addresses and links hold no spaces: only the words with an "@" or an inner "." are looked at (found
            # by one pass in C), and each is blanked once used, so it counts once.
            masked = _CANDIDATE.sub(lambda m: " " if self._word(m.group(), path) else m.group(), text)
        digits = len(masked) - len(masked.translate(_NO_DIGITS))
        if digits >= 2:
            if "-" in masked:
                masked = self._sub(_UUID, masked, lambda m: self._add("id", m.casefold(), path))
            if digits >= 6 and _IBAN_HINT.search(masked):
                masked = self._sub(_IBAN, masked, lambda m: self._iban(m, path))
            if digits >= 8:
                masked = self._sub(_PHONE, masked, lambda m: self._phone(m, path))
        if digits >= 2 or "_" in masked:
            self._ids(masked, path)
        if "'" in text or '"' in text or "\u2018" in text or "\u201c" in text:
            self._quoted(text, path)
        if not self.query:
            self._names(text, path)
        self._windows(text, path)

    def _word(self, word: str, path: str) -> bool:
        """Whether ``word`` holds an address, a link or a host (kept as marks)."""
        # A link first: "https://x@evil.com/" goes to evil.com, whatever address its user part looks like.
        return bool((("://" in word or "www." in word.lower()) and self._each(_URL, word,
                                                                            lambda m: self._url(m, path)))
                    or ("@" in word and self._each(_EMAIL, word, lambda m: self._add("email", _email(m), path)))
                    or self._each(_HOST, word, lambda m: self._bare_host(m, path)))

    def _each(self, pattern: re.Pattern[str], word: str, keep: Callable[[str], object]) -> bool:
        """Calls ``keep(match)`` for each match in ``word``; whether any was kept (the word is then used up)."""
        used = False
        for m in pattern.finditer(word):
            if len(self.out) >= self.limit:
                break
            if keep(m.group()) is not False:
                used = True
        return used

    def _sub(self, pattern: re.Pattern[str], text: str, keep: Callable[[str], object]) -> str:
        """Calls ``keep(match)`` for each match; the text with kept matches blanked, so they count once."""
        spans: list[tuple[int, int]] = []
        for m in pattern.finditer(text):
            if len(self.out) >= self.limit:
                break
            if keep(m.group()) is not False:
                spans.append(m.span())
        if not spans:
            return text
        parts, last = [], 0
        for start, end in spans:
            parts.append(text[last:start])
            parts.append(" " * (end - start))
            last = end
        parts.append(text[last:])
        return "".join(parts)

    def _url(self, raw: str, path: str) -> bool:
        url = _strip_url(raw)
        if not url:
            return False
        host = host_of(url)
        if "." not in host and ":" not in host:
            return False
        self._add("url", url, path)
        self._add("host", host, path)
        return True

    def _bare_host(self, raw: str, path: str) -> bool:
        url = _strip_url(raw)
        host = host_of(url)
        tld = host.rsplit(".", 1)[-1]
        # Without a scheme or "www." a host is a guess: only endings hosts have ("Mr.Smith", "etc.Then" are not).
        if not host or len(host) < 4 or tld in _FILE_ENDINGS or not (len(tld) == 2 or tld in _GENERIC_TLDS):
            return False
        labels = host.split(".")
        if any(not label for label in labels) or all(label.isdigit() for label in labels[:-1]):
            return False
        if url != host:
            self._add("url", url, path)
        self._add("host", host, path)
        return True

    def _iban(self, raw: str, path: str) -> bool:
        groups = _IBAN_SEP.split(raw.upper())
        # A printed IBAN followed by a short word ("... 0130 00 OR") matches one group too far: drop it.
        for end in range(len(groups), 0, -1):
            compact = "".join(groups[:end])
            if iban_valid(compact):
                self._add("iban", compact, path)
                return True
        return False

    def _phone(self, raw: str, path: str) -> bool:
        digits = "".join(ch for ch in raw if ch.isdigit())
        if not 8 <= len(digits) <= 15 or _DATE.match(raw.strip()):
            return False
        # A price or a decimal ("1234567.50"), a version, a range of years: not a number anyone dials.
        if re.fullmatch(r"\d+\.\d{1,2}", raw.strip()) or (not raw.startswith("+") and len(digits) < 9):
            return False
        self._add("phone", digits, path)
        return True

    def _ids(self, text: str, path: str) -> None:
        for m in _TOKEN.finditer(text):
            if len(self.out) >= self.limit:
                return
            token = m.group().strip("-").casefold()
            size = len(token)
            digits = size - len(token.translate(_NO_DIGITS))
            if size < 6 or (digits < 2 and "_" not in token):
                continue
            if _UUID.fullmatch(token):
                self._add("id", token, path)
                continue
            letters = size - digits - token.count("-") - token.count("_")
            # Letters and at least two digits (order ids, user handles, tokens), a long number, or words joined
            # by "_" (new_password, ext_channel_7): values a person does not produce by chance. Words without
            # digits (names, common words) never count.
            if ((digits >= 2 and letters >= 1) or (digits >= 8 and letters == 0)
                    or ("_" in token.strip("_") and letters >= 4)) and not _DATE.match(token):
                self._add("id", token, path)

    def _quoted(self, text: str, path: str) -> None:
        """A short value quoted in prose ("delete the file with ID '13'"): text hands it to its reader as a
        value, so even a short one is kept, and matched against a destination's whole value."""
        for m in _QUOTED.finditer(text):
            if len(self.out) >= self.limit:
                return
            inner = next(g for g in m.groups() if g is not None)
            norm = normalise(inner)
            if norm and len(norm) <= 64:
                self._add("id", norm, path)

    def _names(self, text: str, path: str) -> None:
        """Proper names in a result's text, for a destination whose whole value is a name (D-63): a booking's
        hotel or company is who gets the user's money, and an injected review names it without quotes."""
        for m in islice(_NAME.finditer(text), MAX_NAMES):
            if len(self.out) >= self.limit:
                return
            self._add("name", normalise(m.group()), path)

    def _windows(self, text: str, path: str) -> None:
        if len(text) < 40:
            return
        words = _WORD.findall(text.casefold())
        if len(words) < WINDOW:
            return
        stride = 1 if self.query else WINDOW
        cap = MAX_QUERY_WINDOWS if self.query else MAX_WINDOWS
        last = len(words) - WINDOW
        # The last window too, so the end of a result is matched as surely as its start.
        starts = list(range(0, last + 1, stride))[:cap]
        if not self.query and starts[-1] != last and len(starts) < cap:
            starts.append(last)
        for i in starts:
            window = words[i:i + WINDOW]
            # Eight words of which fewer than four differ ("no no no ...") match anything of the kind.
            if len(set(window)) >= 4:
                self._add("text", " ".join(window), path)


def _email(raw: str) -> str:
    """An address as compared: case folded, a ``+tag`` of its mailbox dropped (``a+x@d`` is delivered to ``a@d``)."""
    local, _, domain = raw.casefold().rpartition("@")
    mailbox = local.split("+", 1)[0]
    return f"{mailbox or local}@{domain}"


def _strip_url(raw: str) -> str:
    url = raw.casefold().rstrip(_TRAIL)
    scheme = url.find("://")
    if scheme != -1:
        url = url[scheme + 3:]
    at = url.find("@", 0, max(0, min((url.find(c) for c in "/?#" if c in url), default=len(url))))
    if at != -1:
        url = url[at + 1:]  # user:password@host
    if url.startswith("www."):
        url = url[4:]
    host = host_of(url)
    if ":" in host:
        bare, _, port = host.partition(":")
        if port.isdigit():
            url = bare + url[len(host):]
            host = bare
    # A host is reached the same percent-decoded (URL parsers decode it) and without its root's trailing dot.
    plain = (unquote(host) if "%" in host else host).rstrip(".")
    if plain != host and plain:
        url = plain + url[len(host):]
    return url.rstrip("/")


# How much of a key a mark's path keeps: a path says where, it does not store the result's keys (trust.label_at).
KEY_CHARS = 64


def _key_path(path: str, key: object) -> str:
    text = str(key)[:KEY_CHARS]
    return f"{path}.{text}" if text.isidentifier() else f"{path}[{text!r}]"


def _barren(value: object) -> bool:
    """A leaf no mark can come from: nothing, a boolean, a float, a short number, a short string."""
    kind = type(value)
    if kind is str:
        return len(value) < 2  # type: ignore[arg-type]  # a quoted value of one character is still a mark
    return value is None or kind is bool or kind is float or (kind is int and -10_000_000 < value < 10_000_000)  # type: ignore[operator]
