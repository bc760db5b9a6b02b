"""Why a request's credentials cannot be used: shared by the bearer check (auth.py) and OAuth (oauth.py).

Its own module so that oauth.py needs nothing of auth.py, which holds an OAuth
resource server: neither imports the other back (tests/shape/test_layout.py).
"""

from __future__ import annotations


class CredentialProblem(Exception):
    """Why a request's credentials cannot be used: an HTTP status and a code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
