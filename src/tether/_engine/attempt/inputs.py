"""What the host accepts from a caller or a program before it records anything.

Each check raises a named error and says that nothing was run or stored, so
a value the store could not keep (too long, a NUL for Postgres text, a lone
surrogate for UTF-8) is refused at the door rather than failing a write later.
"""

from __future__ import annotations

from typing import Any

from tether.errors import CodeTooLarge, InvalidArguments, ProgramSyntaxError


def check_code_size(code: str, limit: int) -> None:
    # UTF-8 takes 1-4 bytes per character, so the length alone often decides
    # without encoding a huge string.
    if not isinstance(code, str):
        raise InvalidArguments("code must be a string")
    if len(code) > limit:
        raise CodeTooLarge(f"the program is over the {limit}-byte limit ({len(code)} characters); nothing was run",
                           details={"limit": limit})
    if len(code) * 4 > limit:
        size = len(code.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise CodeTooLarge(f"the program is {size} bytes, over the {limit}-byte limit; nothing was run",
                               details={"limit": limit, "bytes": size})
    # Python refuses both in source too; the store could not keep them either
    # (Postgres text holds no NUL, UTF-8 no lone surrogate).
    if "\x00" in code:
        raise ProgramSyntaxError("the program contains a NUL character (\\x00); nothing was run",
                                 next_action="Remove the NUL; write '\\x00' in a string literal if you need one.")
    if not code.isascii():
        try:
            code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProgramSyntaxError(f"the program is not valid Unicode (an unpaired surrogate at character "
                                     f"{exc.start}); nothing was run",
                                     next_action="Send the program as valid UTF-8 text.") from None


# A session name is a label a model picks, stored and signed with its state:
# long enough for a UUID plus a prefix, short enough not to carry data.
MAX_SESSION_NAME_CHARS = 128


def check_session_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_SESSION_NAME_CHARS or not name.isprintable():
        shown = f"{len(name)} characters" if isinstance(name, str) else type(name).__name__
        raise InvalidArguments(f"a session name is 1 to {MAX_SESSION_NAME_CHARS} printable characters (got {shown}); "
                               "nothing was run",
                               next_action="Pick a short name such as 'notebook' or 'analysis-1'.")


# A wait's name is stored and shown as is; 200 characters name anything.
MAX_WAIT_NAME_CHARS = 200


def wait_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a wait, or None."""
    if len(name) > MAX_WAIT_NAME_CHARS or not name.isprintable():
        return f"a wait's name is at most {MAX_WAIT_NAME_CHARS} printable characters"
    return None
