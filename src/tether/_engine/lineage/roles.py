"""Destination or content: which arguments of a call say where data goes (D-63).

A destination names who or what receives the call's effect: a recipient, a URL, an account, a channel, a
path, an id of the thing changed. Content is what is sent or written there: a subject, a body, an amount.
An argument's role comes, in order, from a configured override, its schema (``format: email``, ``uri``,
``hostname``..., or the same on an array's items) and its name (split at ``_``, ``-`` and camel case: a
content word last — ``email_body``, ``recipient_note`` — makes it content; else any destination word —
``to``, ``user_email``, ``file_id`` — makes it a destination). A link, an address or an IBAN inside
content is a destination too: :func:`destinations_in` finds them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tether._engine.lineage.values import Mark, marks

DESTINATION = "destination"
CONTENT = "content"
ROLES = (DESTINATION, CONTENT)

# JSON Schema formats (draft 2020-12) whose values are places.
_DESTINATION_FORMATS = frozenset({
    "email", "idn-email", "uri", "iri", "uri-reference", "iri-reference", "uri-template", "hostname",
    "idn-hostname", "ipv4", "ipv6",
})
# Name words that make an argument a destination.
_DESTINATION_WORDS = frozenset({
    "to", "cc", "bcc", "recipient", "recipients", "receiver", "receivers", "addressee", "addressees",
    "url", "urls", "uri", "uris", "link", "links", "href", "endpoint", "webhook", "host", "hostname", "domain",
    "iban", "ibans", "account", "accounts", "bic", "swift", "payee", "beneficiary", "routing",
    "channel", "channels", "user", "users", "username", "usernames", "member", "members", "participant",
    "participants", "attendee", "attendees", "invitee", "invitees", "guest", "guests", "assignee",
    "assignees", "reviewer", "reviewers", "owner", "owners", "email", "emails", "mail", "phone", "phones",
    "address", "addresses", "destination", "destinations", "dest", "target", "targets", "path", "paths",
    "file", "filename", "filepath", "folder", "directory", "dir", "repo", "repository", "id", "ids",
    "uuid", "key", "room", "chat", "thread", "group", "team", "contact", "contacts", "number",
    # Who holds access, and where post goes: changing them redirects what follows as surely as a recipient.
    "password", "passphrase", "secret", "credential", "credentials", "token", "street", "city", "zip",
    "postcode", "postal",
    # Who else gets it, or where it is posted back: a share's grantee, a chat handle, a hook.
    "who", "handle", "login", "person", "customer", "client", "counterparty", "creditor", "merchant", "grantee",
    "principal", "share", "dm", "wallet", "callback", "notify", "hook", "sink", "server", "site", "mailbox",
    "inbox", "forward", "redirect", "upstream", "remote",
})
# Name words that, last, make an argument content whatever came before (``email_body``, ``recipient_name``
# stays a destination: a name is how a recipient is chosen).
_CONTENT_WORDS = frozenset({
    "body", "text", "content", "contents", "message", "messages", "subject", "title", "description",
    "summary", "note", "notes", "comment", "comments", "amount", "sum", "total", "price", "currency",
    "date", "time", "datetime", "start", "end", "duration", "location", "query", "q", "search", "filter",
    "reason", "status", "priority", "label", "labels", "tag", "tags", "count", "limit", "offset", "page",
    "format", "type", "kind", "language", "lang", "html", "markdown", "data", "payload", "value",
})
_SPLIT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# Marks that carry data somewhere when they sit inside content.
_CARRIERS = ("email", "url", "host", "iban")


def roles(input_schema: Mapping[str, Any] | None, args: Mapping[str, object],
          overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """``"destination"`` or ``"content"`` for each argument in ``args``.

    ``overrides`` maps an argument name to its role (from configuration) and wins over schema and name.
    """
    props = (input_schema or {}).get("properties") if isinstance(input_schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    out: dict[str, str] = {}
    for name in args:
        override = (overrides or {}).get(name)
        if override in ROLES:
            out[name] = str(override)
            continue
        schema = props.get(name)
        out[name] = DESTINATION if _schema_says(schema) or _name_says(str(name)) else CONTENT
    return out


def role_of_name(name: str) -> str:
    """The role a name alone gives (no schema, no override)."""
    return DESTINATION if _name_says(name) else CONTENT


def destinations_in(value: object, *, limit: int = 256) -> list[Mark]:
    """Links, e-mail addresses, hosts and IBANs inside a content value (a body that carries a link)."""
    return [m for m in marks(value, limit=limit) if m.kind in _CARRIERS]


def _schema_says(schema: object, depth: int = 0) -> bool:
    if not isinstance(schema, Mapping) or depth > 4:
        return False
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt.lower() in _DESTINATION_FORMATS:
        return True
    items = schema.get("items")
    if isinstance(items, Mapping) and _schema_says(items, depth + 1):
        return True
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and any(_schema_says(o, depth + 1) for o in options[:16]):
            return True
    return False


def _name_says(name: str) -> bool:
    words = [w.lower() for w in _SPLIT.findall(name[:128])]
    if not words:
        return False
    if words[-1] in _CONTENT_WORDS:
        return False
    return any(w in _DESTINATION_WORDS for w in words)
