"""What can be matched later in a tool result, and matching an argument against it (D-63)."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether._engine.lineage.values import (
    DEFAULT_LIMIT,
    KINDS,
    MAX_WINDOWS,
    Mark,
    find,
    host_of,
    iban_valid,
    is_low_entropy,
    marks,
    normalise,
)

INBOX = [
    {
        "id": "17",
        "sender": "Mark.Black@Example.com",
        "subject": "Invoice",
        "body": (
            "Hi! Please pay the invoice to DE89 3704 0044 0532 0130 00 today. Details at "
            "https://www.secure-systems-252.com/pay?ref=Q7 or call +1 (555) 123-4567. "
            "Order ABC12345 was shipped on 2024-05-12, tracking 123e4567-e89b-12d3-a456-426614174000."
        ),
        "read": False,
        "size": 2048,
    }
]


def kinds(found: list[Mark]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m in found:
        out.setdefault(m.kind, set()).add(m.norm)
    return out


def test_marks_of_a_result_normalised_with_their_paths():
    found = marks(INBOX)
    by = kinds(found)
    assert by["email"] == {"mark.black@example.com"}
    assert by["iban"] == {"DE89370400440532013000"}
    assert by["url"] == {"secure-systems-252.com/pay?ref=q7"}
    assert by["host"] == {"secure-systems-252.com"}
    assert by["phone"] == {"15551234567"}
    assert {"abc12345", "123e4567-e89b-12d3-a456-426614174000"} <= by["id"]
    paths = {m.kind: m.path for m in found}
    assert paths["email"] == "[0].sender" and paths["iban"] == "[0].body"


def test_low_entropy_values_do_not_count():
    # Short numbers, booleans, dates, words without digits, tiny strings: they match anything by chance.
    found = marks({"id": "17", "n": 2048, "ok": True, "when": "2024-05-12", "name": "Alice",
                   "channel": "general", "tiny": "ab1", "amount": 100.5, "nothing": None})
    assert found == []
    for text in ("17", "general", "Alice", "2024-05-12", "100.50", "yes", ""):
        assert is_low_entropy(text), text
    for text in ("bob@example.com", "ABC12345", "https://x.io/a", "GB29NWBK60161331926819"):
        assert not is_low_entropy(text), text


def test_iban_checksum_keeps_noise_out():
    assert iban_valid("GB29NWBK60161331926819") and iban_valid("DE89370400440532013000")
    assert not iban_valid("GB29NWBK60161331926818")  # one digit off
    assert not iban_valid("DE89")
    assert "iban" not in kinds(marks("ref GB29 NWBK 6016 1331 9268 18 is not an IBAN"))
    # A string that fails the checksum is still an identifier a program may copy.
    assert kinds(marks("to US133000000121212121212"))["id"] == {"us133000000121212121212"}


def test_find_matches_across_case_spacing_and_scheme():
    known = {m.norm: m for m in marks(INBOX)}
    for argument in ("mark.black@example.com", "  MARK.BLACK@EXAMPLE.COM ", "de89 3704 0044 0532 0130 00",
                     "http://secure-systems-252.com/pay?ref=Q7", "+15551234567", "abc12345"):
        assert find(argument, known), argument
    assert not find("someone.else@example.com", known)
    # The host alone is a mark: a link to the same host with another path still meets it.
    hits = find("https://secure-systems-252.com/other", known)
    assert {m.kind for m, _ in hits} == {"host"}


def test_a_copied_sentence_matches_by_text_windows():
    text = ("The quarterly planning meeting moves to the large room on the third floor, and everyone should "
            "bring the printed budget summary along with their laptops and chargers for the afternoon session.")
    known = {m.norm: m for m in marks({"body": text})}
    copied = "FYI: everyone should bring the printed budget summary along with their laptops and chargers."
    assert any(m.kind == "text" for m, _ in find(copied, known))
    assert not find("bring your laptop tomorrow please, the meeting is on", known)


def test_paths_name_keys_and_indexes():
    found = marks({"a": [{"to": ["x@y.io"]}], "odd key": "z@y.io"})
    assert {m.path for m in found} == {".a[0].to[0]", "['odd key']"}


def test_normalise_and_host_of():
    assert normalise("  Ｂｏｂ@Example.COM. ") == "bob@example.com"
    assert normalise("a\n\t b") == "a b"
    assert host_of("evil.com/x?y#z") == "evil.com"


def test_marks_are_bounded_on_huge_deep_and_cyclic_values():
    big = "x" * 5_000_000 + " bob@example.com"
    start = time.process_time()
    assert marks(big) == []  # past the characters scanned
    many = [f"user{i}@example.com" for i in range(50_000)]
    assert len(marks(many)) == DEFAULT_LIMIT
    assert len(marks(many, limit=10)) == 10
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert marks(deep) == []
    cyclic: list = ["bob@example.com"]
    cyclic.append(cyclic)
    assert kinds(marks(cyclic))["email"] == {"bob@example.com"}
    words = " ".join(f"w{i % 97}x" for i in range(100_000))
    assert sum(m.kind == "text" for m in marks(words)) <= MAX_WINDOWS
    assert time.process_time() - start < 30  # a hang guard, not a speed target (bench/ measures speed)


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=60),
              st.sampled_from(["bob@x.io", "https://a.b/c", "GB29NWBK60161331926819", "+44 20 7946 0958"])),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON, JSON)
def test_marks_and_find_never_raise_and_stay_in_bounds(result, argument):
    found = marks(result)
    assert len(found) <= DEFAULT_LIMIT
    assert all(m.norm and m.kind in KINDS for m in found)
    known = {m.norm: m for m in found}
    for mark, origin in find(argument, known):
        assert known[mark.norm] is origin
    # A value always meets its own marks; a name only as a destination's whole value (the judge's lookup, D-63).
    if any(m.kind != "name" for m in found):
        assert find(result, known)


def test_wide_nested_values_stay_bounded():
    row = ["x"] * 10_000
    wide = [row] * 10_000  # 100 million leaves by reference
    start = time.process_time()
    assert marks(wide) == []
    assert marks([[f"u{i}@x.example"] * 3 for i in range(20_000)])  # visits the first ones only
    assert time.process_time() - start < 30  # a hang guard, not a speed target


def test_a_value_that_fails_when_read_gives_what_was_found():
    class Hostile(dict):
        def items(self):
            raise RuntimeError("boom")

    assert kinds(marks(["bob@x.example", Hostile(a=1)]))["email"] == {"bob@x.example"}
    assert find(Hostile(a=1), {"x": 1}) == []


def test_a_host_without_a_scheme_needs_an_ending_hosts_have():
    by = kinds(marks("Hello Mr.Smith, etc.Then node.js report.pdf; see bit.ly/abc and shop.example.co.uk today"))
    assert by["host"] == {"bit.ly", "shop.example.co.uk"}
    assert by["url"] == {"bit.ly/abc"}
