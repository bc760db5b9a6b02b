"""Tools from an OpenAPI 3.0/3.1 document: one tool per operation, called over HTTP.

An operation becomes a tool whose keyword arguments are its path, query and
header parameters plus its request body (see ``_openapi_bodies`` for the one
flattening rule and how multipart, text and binary bodies are passed). Anything
this module cannot call faithfully (cookie parameters, callbacks, external
``$ref``s) is reported in ``source.problems`` and that operation alone is skipped: a
half-understood operation sending the wrong request would be worse than none.

Credentials come from the ``auth`` config and the environment at call time.
They are never part of a tool's schema, and parameters the spec declares for
them are dropped, so a program can neither see nor override them.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urljoin, urlsplit

from tether._hostwork import in_thread
from tether._sources import _openapi_bodies as bodies
from tether._sources._names import unique as _unique
from tether._sources._openapi_auth import Auth as _Auth
from tether._sources._openapi_compiled import (
    FORMAT,
    CompiledCache,
    Outputs,
    Parts,
    compile_catalog,
    compiled_key,
    no_gc,
    read_and_hash,
    record_digest,
    recorded_digest,
    remember,
)
from tether._sources._openapi_http import (
    RESPONSE_LIMIT,
    cookieless,
    excerpt,
    http_error,
    read_answer,
    redact,
    same_origin,
)
from tether._sources._openapi_operations import READ_METHODS as _READ_METHODS
from tether._sources._openapi_operations import Operation as _Operation
from tether._sources._openapi_operations import Param as _Param
from tether._sources._openapi_operations import arg_name as _arg_name
from tether._sources._openapi_operations import description as _description
from tether._sources._openapi_operations import info_summary as _info_summary
from tether._sources._openapi_operations import is_json as _is_json
from tether._sources._openapi_operations import operation_name as _operation_name
from tether._sources._openapi_operations import output_schema as _output_schema
from tether._sources._openapi_operations import query as _query
from tether._sources._openapi_operations import restore_operation
from tether._sources._openapi_operations import server_url as _server_url
from tether._sources._openapi_operations import simple as _simple
from tether._sources._openapi_operations import tool_annotations as _annotations
from tether._sources._openapi_schema import Refs as _Refs
from tether._sources._openapi_schema import Unsupported as _Unsupported
from tether._sources._openapi_schema import json_schema as _json_schema
from tether._sources._openapi_text import decode_spec, parse_spec
from tether._sources.base import expand_env
from tether._sources.kinds import SourceContext
from tether._tools.context import current_call
from tether._tools.model import IDEMPOTENCY_MODES, Tool, check_identifier
from tether.errors import ConfigError, InvalidArguments, SourceNotStarted, ToolError, UsageError

if TYPE_CHECKING:
    import httpx

__all__ = ["OpenAPISource"]

DEFAULT_TIMEOUT = 30.0


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# RFC 9110 safe methods: every other request carries the idempotency key (P-25).
_SAFE_METHODS = {"get", "head", "options", "trace"}
DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
# OpenAPI says these header parameters are ignored: the client owns them.
_RESERVED_HEADERS = {"accept", "content-type", "authorization"}
# --- operations -----------------------------------------------------------------


class _Restored:
    """A tool restored from a compiled catalog: its handler, and the loaders of what it reads at first use.

    One object rather than three closures: a start restores 1,759 of them, and
    each object is built, walked by the collector and freed at exit (D-47).
    The operation is rebuilt at the first call (most tools are never called).
    """

    __slots__ = ("end", "name", "operation", "outputs", "parts", "source", "start")

    def __init__(self, source: OpenAPISource, parts: Parts, outputs: Outputs, name: str, start: int, end: int) -> None:
        self.source, self.parts, self.outputs, self.name, self.start, self.end = source, parts, outputs, name, start, end
        self.operation: _Operation | None = None

    async def __call__(self, args: dict[str, Any]) -> Any:
        if self.operation is None:
            self.operation = restore_operation(self.parts.part(self.start, self.end)[2])
        return await self.source._call(self.operation, args)  # noqa: SLF001 - the source's own tool

    def __repr__(self) -> str:
        return f"<openapi:{self.source.namespace}.{self.name}>"

    def load(self) -> tuple[str, dict[str, Any]]:
        description, schema, _ = self.parts.part(self.start, self.end)
        return description, schema

    def output(self) -> dict[str, Any] | None:
        return self.outputs.schema(self.name)


class OpenAPISource:
    """Tools generated from an OpenAPI 3.0/3.1 document, one per operation.

    ``spec`` is a path, an http(s) URL or an already-parsed dict (JSON, or
    YAML when PyYAML is installed). ``base_url`` defaults to the spec's first
    ``servers`` entry. ``auth`` is one of ``{"type": "bearer", "token_env":
    ...}``, ``{"type": "header", "name": ..., "value_env": ...}`` or ``{"type":
    "query", "name": ..., "value_env": ...}`` (or a list of them); each variable
    must be set at start, and its value is read again at each call. ``headers`` are sent on every
    request (``${NAME}`` is replaced from the environment at start).

    A request whose method is not safe carries the call's idempotency key in
    the ``idempotency_header`` (``None`` sends none). ``idempotency="key"``
    says the API dedupes by that key, so tether may re-send a write whose
    outcome it lost (P-31).

    ``cache`` keeps the compiled catalog (see ``_openapi_compiled``), keyed by
    the spec's digest and this compiler: a later start skips parsing.

    ``await start()`` loads the spec; ``problems`` then lists the operations
    skipped and why; ``tools()``; ``await close()``.
    """

    def __init__(
        self,
        namespace: str,
        spec: str | os.PathLike[str] | Mapping[str, Any],
        *,
        base_url: str | None = None,
        auth: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        idempotency: str = "none",
        idempotency_header: str | None = DEFAULT_IDEMPOTENCY_HEADER,
        cache: CompiledCache | None = None,
    ) -> None:
        try:
            check_identifier(namespace, "namespace")
        except UsageError as exc:
            raise ConfigError(exc.message) from None
        self.namespace = namespace
        self.problems: list[dict[str, str]] = []
        self._spec = spec
        self._base_url = str(base_url) if base_url is not None else None  # may be a pydantic URL
        raw_auth = [] if auth is None else [auth] if isinstance(auth, Mapping) else list(auth)
        self._auth = [_Auth.parse(a, namespace) for a in raw_auth]
        self._headers = dict(headers or {})
        self._timeout = timeout
        if idempotency not in IDEMPOTENCY_MODES:
            raise ConfigError(f"OpenAPI source {namespace!r}: 'idempotency' must be 'none' or 'key', not {idempotency!r}")
        if idempotency == "key" and not idempotency_header:
            raise ConfigError(
                f"OpenAPI source {namespace!r}: idempotency = 'key' needs the key sent; "
                "idempotency_header is off",
                next_action="Name the header the API reads the key from, or drop idempotency = 'key'.",
            )
        self._idempotency = idempotency
        self._idempotency_header = idempotency_header or None
        self._tools: list[Tool] | None = None
        self._operations: dict[str, _Operation] = {}
        self._cache = cache
        self._key: str | None = None  # the compiled catalog's, once start() has the spec's digest
        self._client: httpx.AsyncClient | None = None  # made at the first call
        self._client_args: dict[str, Any] | None = None  # set by start(), cleared by close()
        self._sent_headers: dict[str, str] = {}
        # The namespace's one line for sources() and the prompt: the document's info.title.
        self.summary: str | None = None

    def __repr__(self) -> str:
        spec = "<dict>" if isinstance(self._spec, Mapping) else repr(os.fspath(self._spec))
        return f"OpenAPISource(namespace={self.namespace!r}, spec={spec})"

    async def __aenter__(self) -> OpenAPISource:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # -- lifecycle --

    async def start(self) -> None:
        """Load the spec, check auth is configured, and build one tool per operation."""
        for a in self._auth:
            a.value()  # a missing variable is a load error, not a first-call surprise
        where = f"of OpenAPI source {self.namespace!r}"
        headers = {k: expand_env(v, f"header {k!r} {where}") for k, v in self._headers.items()}
        restored, text, spec_url = await self._from_cache()
        if restored is not None:
            base_url = restored
        else:
            spec = self._spec
            if isinstance(spec, Mapping):
                doc = self._check(copy.deepcopy(dict(spec)))
            else:
                where = f"OpenAPI source {self.namespace!r}: spec {os.fspath(spec)}"
                # Parsing a large description is CPU work: off the event loop, so the loader's
                # start_timeout can end it and nothing else waits on it.
                doc = self._check(await in_thread(parse_spec, decode_spec(text or b"", where), where))
            base_url = self._base_url or self._default_base_url(doc, spec_url)
            self._operations = {}
            # Building thousands of operations with deep schemas is CPU work too: off the loop as well.
            self._tools = await in_thread(self._build, doc, base_url)
            self.summary = _info_summary(doc.get("info"))
            if self._cache is not None and self._key and not isinstance(spec, Mapping):
                remember(self._cache, self._compile_inputs(), os.fspath(spec), self._key,
                         compile_catalog(self._tools, self._operations, self.problems, self.summary,
                                         doc.get("servers") or []))
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        why = "it needs http(s)://host"
        try:
            parts = urlsplit(base_url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
        except ValueError as exc:  # a bad port, an unbalanced [
            valid, why = False, str(exc)
        if not valid:
            raise ConfigError(f"OpenAPI source {self.namespace!r}: invalid base URL {base_url!r}: {why}",
                              next_action="Give base_url as http(s)://host[:port]/path.")
        # The client is made at the first call: loading its TLS roots costs ~0.1 s a
        # source, which a run that never calls this API should not pay.
        # The configured headers are added per request, like auth: only a request to base_url's origin gets them.
        self._client_args = {"base_url": base_url, "timeout": self._timeout, "cookies": cookieless()}
        self._sent_headers = headers

    @property
    def started(self) -> bool:
        return self._tools is not None

    async def ensure_live(self) -> None:
        """Nothing to connect: each call opens its own request."""

    def tools(self) -> list[Tool]:
        """The tools built at :meth:`start`."""
        if self._tools is None:
            raise SourceNotStarted(
                f"OpenAPI source {self.namespace!r} is not started",
                next_action="Call and await start() before tools().",
            )
        return list(self._tools)

    async def close(self) -> None:
        """Close the HTTP client."""
        self._client_args = None
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- loading --

    def _compile_inputs(self) -> dict[str, Any]:
        """Everything besides the spec's text that the tools built from it depend on."""
        return {"namespace": self.namespace, "base_url": self._base_url,
                "auth": [[a.kind, a.name] for a in self._auth], "headers": sorted(self._static_headers()),
                "idempotency": self._idempotency, "idempotency_header": self._idempotency_header}

    async def _from_cache(self) -> tuple[str | None, bytes | None, str | None]:
        """The base URL of a catalog restored from the cache (else None), the spec's bytes if read, its URL.

        A local spec whose stat matches its signed record is not even read
        (D-47); otherwise it is read and hashed on a thread, and its stat
        recorded for the next start.
        """
        cache, self._key = self._cache, None
        location = None if isinstance(self._spec, Mapping) else os.fspath(self._spec)
        if cache is None or location is None:
            return None, *(await self._read())
        if location.startswith(("http://", "https://")):
            text, spec_url = await self._read()
            self._key = compiled_key(self._compile_inputs(), hashlib.sha256(text or b"").hexdigest())
            return self._restore(self._key, spec_url), text, spec_url
        path, known = recorded_digest(cache, location)
        if known is not None:
            self._key = compiled_key(self._compile_inputs(), known)
            restored = self._restore(self._key, None)
            if restored is not None:
                return restored, None, None
        try:
            text, digest, before, began = await asyncio.to_thread(read_and_hash, path)
        except OSError as exc:
            raise ConfigError(f"OpenAPI source {self.namespace!r}: cannot read the spec {location}: "
                              f"{exc.strerror}") from None
        if digest != known:  # the same record again would be a write on every start of a spec that fails
            record_digest(cache, path, before, began, digest)
        self._key = compiled_key(self._compile_inputs(), digest)
        return self._restore(self._key, None), text, None

    def _restore(self, key: str, spec_url: str | None) -> str | None:
        """Tools from a compiled catalog; the base URL, or None when there is nothing usable."""
        cache = self._cache
        head = cache.get(key) if cache is not None else None
        if cache is None or head is None or head.get("format") != FORMAT:
            return None
        text = cache.get_text(f"{key}:parts")
        if not text:
            return None
        parts, outputs, ns, idempotency = Parts(text), Outputs(cache, key), self.namespace, self._idempotency
        try:
            base_url = self._base_url or self._default_base_url({"servers": head["servers"]}, spec_url)
            tools = []
            with no_gc():
                for name, title, method, server, path, has_output, start, end in head["tools"]:
                    if not isinstance(method, str) or method.lower() not in _METHODS:
                        raise ValueError("not a compiled operation")
                    restored = _Restored(self, parts, outputs, name, start, end)
                    tools.append(Tool.deferred(
                        restored.load, namespace=ns, name=name, title=title, handler=restored,
                        output_schema_loader=restored.output if has_output else None,
                        # From the (signed) method, never from a stored flag: the policy reads read_only.
                        annotations=_annotations(method.lower()), source="openapi", idempotency=idempotency,
                        # Where the call goes, for approvers (tools.model.Tool.target), as a fresh build sets it.
                        target=(method, (server or base_url).rstrip("/") + "/" + str(path).lstrip("/"))))
        except (KeyError, TypeError, ValueError, UsageError):
            return None  # a cache from another shape: build afresh
        self._operations, self._tools = {}, tools
        self.problems, self.summary = list(head["problems"]), head["summary"]
        return base_url

    async def _read(self) -> tuple[bytes | None, str | None]:
        """The spec's bytes and the URL it came from (None, None for a spec given as a dict)."""
        where = f"OpenAPI source {self.namespace!r}"
        if isinstance(self._spec, Mapping):
            return None, None
        location = os.fspath(self._spec)
        if location.startswith(("http://", "https://")):
            spec_url = location
            import httpx

            try:
                async with httpx.AsyncClient(timeout=self._timeout, follow_redirects=True) as client:
                    response = await client.get(location)
            except httpx.HTTPError as exc:
                raise ConfigError(f"{where}: cannot fetch the spec {location}: {exc}") from None
            if response.status_code != 200:
                raise ConfigError(f"{where}: fetching the spec {location} returned HTTP {response.status_code}")
            text = response.content
        else:
            spec_url = None
            try:
                text = await asyncio.to_thread(Path(location).read_bytes)
            except OSError as exc:
                raise ConfigError(f"{where}: cannot read the spec {location}: {exc.strerror}") from None
        return text, spec_url

    def _check(self, doc: Any) -> dict[str, Any]:
        where = f"OpenAPI source {self.namespace!r}"
        if not isinstance(doc, dict):
            raise ConfigError(f"{where}: the spec is not a JSON/YAML object")
        version = str(doc.get("openapi", ""))
        if not (version.startswith("3.0") or version.startswith("3.1")):
            found = f"swagger {doc['swagger']}" if "swagger" in doc else f"openapi {version or '(missing)'}"
            raise ConfigError(
                f"{where}: only OpenAPI 3.0 and 3.1 are supported, the spec is {found}",
                next_action="Convert the spec to OpenAPI 3 (e.g. with swagger2openapi).",
            )
        return doc

    def _default_base_url(self, doc: Mapping[str, Any], spec_url: str | None) -> str:
        servers = doc.get("servers") or []
        url = _server_url(servers[0]) if servers and isinstance(servers[0], Mapping) else None
        if url is None:
            raise ConfigError(
                f"OpenAPI source {self.namespace!r}: the spec has no servers entry",
                next_action="Pass base_url.",
            )
        if "{" in url:
            raise ConfigError(
                f"OpenAPI source {self.namespace!r}: the spec's server URL {url!r} has variables without defaults",
                next_action="Pass base_url.",
            )
        if not urlsplit(url).scheme:
            if spec_url is None:
                raise ConfigError(
                    f"OpenAPI source {self.namespace!r}: the spec's server URL {url!r} is relative",
                    next_action="Pass base_url, or load the spec from its URL.",
                )
            url = urljoin(spec_url, url)
        return url

    # -- building tools --

    def _build(self, doc: dict[str, Any], base_url: str) -> list[Tool]:
        refs = _Refs(doc)
        self.problems = []
        tools: list[Tool] = []
        taken: set[str] = set()
        paths = doc.get("paths") or {}
        if not isinstance(paths, Mapping):
            raise ConfigError(f"OpenAPI source {self.namespace!r}: 'paths' is not an object")
        for path, item in paths.items():
            try:
                item = refs.deref(item)
            except _Unsupported as exc:
                self.problems.append({"operation": str(path), "problem": str(exc)})
                continue
            if not isinstance(item, Mapping):
                continue
            for method in _METHODS:
                op = item.get(method)
                if not isinstance(op, Mapping):
                    continue
                label = f"{method.upper()} {path}"
                try:
                    tool = self._tool(refs, str(path), method, item, op, taken, base_url)
                    taken.add(tool.name)
                    tools.append(tool)
                except _Unsupported as exc:
                    self.problems.append({"operation": label, "problem": str(exc)})
                except UsageError as exc:
                    self.problems.append({"operation": label, "problem": exc.message})
                except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
                    # A malformed definition costs that operation, not the source.
                    self.problems.append({"operation": label, "problem": f"malformed operation ({exc!r})"})
        return tools

    def _tool(
        self,
        refs: _Refs,
        path: str,
        method: str,
        item: Mapping[str, Any],
        op: Mapping[str, Any],
        taken: set[str],
        base_url: str,
    ) -> Tool:
        if op.get("callbacks"):
            raise _Unsupported("callbacks are not supported")
        name = _unique(_operation_name(op.get("operationId"), method, path), taken)
        operation = _Operation(name=name, method=method.upper(), path=path)
        self._operations[name] = operation
        servers = op.get("servers") or item.get("servers")
        if servers and isinstance(servers[0], Mapping) and (url := _server_url(servers[0])):
            operation.server = urljoin(base_url.rstrip("/") + "/", url)

        properties: dict[str, Any] = {}
        required: list[str] = []
        # Operation parameters override path-level ones with the same (in, name).
        declared: dict[tuple[str, str], Mapping[str, Any]] = {}
        for raw in [*(item.get("parameters") or []), *(op.get("parameters") or [])]:
            param = refs.deref(raw)
            if not isinstance(param, Mapping) or not isinstance(param.get("name"), str):
                raise _Unsupported("a parameter has no name")
            declared[(str(param.get("in")), param["name"])] = param
        for (location, wire), param in declared.items():
            if location == "cookie":
                raise _Unsupported(f"cookie parameter {wire!r} is not supported")
            if location not in ("path", "query", "header"):
                raise _Unsupported(f"parameter {wire!r} has unknown location {location!r}")
            if location == "header" and (wire.lower() in _RESERVED_HEADERS or wire.lower() in self._static_headers()
                                         or wire.lower() == (self._idempotency_header or "").lower()):
                # The idempotency key is tether's to set (P-25), never the program's.
                continue
            if any(a.covers(location, wire) for a in self._auth):
                continue  # auth supplies it; a program must not see or set it
            as_json = False
            if "schema" not in param:
                # `content:` instead of `schema:` (Directus's filters): one media type says how it is encoded.
                content = param.get("content")
                if not isinstance(content, Mapping) or len(content) != 1:
                    raise _Unsupported(f"parameter {wire!r} has neither 'schema' nor one 'content' entry")
                media_type, media = next(iter(content.items()))
                as_json = _is_json(str(media_type))
                param = {**param, "schema": (media or {}).get("schema") or {}}
                if as_json and isinstance(param["schema"], Mapping) and param.get("description") is None:
                    param["description"] = "sent as JSON text"
            style = param.get("style") or ("form" if location == "query" else "simple")
            allowed = {"query": {"form", "spaceDelimited", "pipeDelimited", "deepObject"}}.get(location, {"simple"})
            if style not in allowed:
                raise _Unsupported(f"{location} parameter {wire!r} uses style {style!r}")
            schema = _json_schema(refs.inline(param["schema"]), request=True)
            if param.get("description") and isinstance(schema, dict) and "description" not in schema:
                schema = {**schema, "description": param["description"]}
            arg = _arg_name(wire, location, properties)
            properties[arg] = schema
            if param.get("required") or location == "path":
                required.append(arg)
            explode = param.get("explode", style == "form")
            operation.params.append(_Param(arg, location, wire, style, bool(explode), as_json=as_json))

        in_path = {p.wire for p in operation.params if p.location == "path"}
        for wire in re.findall(r"\{([^}]+)\}", path):
            if wire not in in_path:
                raise _Unsupported(f"path parameter {wire!r} is not declared")

        if op.get("requestBody") is not None:
            self._body(refs, refs.deref(op["requestBody"]), operation, properties, required)

        return Tool(
            namespace=self.namespace,
            name=name,
            description=_description(op, operation),
            input_schema={
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
            handler=self._handler(operation),
            title=op.get("summary") if isinstance(op.get("summary"), str) else None,
            output_schema=_output_schema(refs, op),
            annotations=_annotations(method),
            source="openapi",
            idempotency=self._idempotency,
            target=(operation.method, (operation.server or base_url).rstrip("/") + "/" + path.lstrip("/")),
        )

    def _body(
        self,
        refs: _Refs,
        body: Any,
        operation: _Operation,
        properties: dict[str, Any],
        required: list[str],
    ) -> None:
        content = body.get("content") if isinstance(body, Mapping) else None
        if not content or not isinstance(content, Mapping):
            return
        media_type = bodies.pick_media_type(dict(content))
        kind = bodies.body_kind(media_type)
        operation.media_type, operation.body_kind = media_type, kind
        operation.body_required = bool(body.get("required"))
        schema = _json_schema(refs.inline((content[media_type] or {}).get("schema") or {}), request=True)
        view = bodies.object_view(schema) if kind in ("json", "form", "multipart") else None
        if view is not None and view[0]:
            props, names = view
            args = {wire: _arg_name(wire, "body", {}) for wire in props}
            clash = sorted(set(args.values()) & properties.keys())
            if len(set(args.values())) == len(args) and not clash:
                for wire, arg in args.items():
                    binary = kind == "multipart" and bodies.is_file_schema(props[wire])
                    properties[arg] = bodies.file_schema(props[wire]) if binary else props[wire]
                    operation.params.append(_Param(arg, "body", wire, binary=binary))
                if operation.body_required:
                    required.extend(args[w] for w in names if w in args)
                return
            why = (f"one object, not separate arguments: its {', '.join(map(repr, clash))} has the name of a "
                   "path, query or header parameter") if clash else "one object"
        elif view is not None:
            why = "one object whose keys are free-form"
        else:
            why = {"text": "text", "binary": "binary content: base64 text or bytes"}.get(kind, "one value")
        arg = _unique("body", set(properties))
        if kind == "binary":
            schema = dict(bodies.BINARY_ARG)
        elif kind == "text" and not (isinstance(schema, dict) and schema.get("type") == "string"):
            schema = {"type": "string"}
        text = body.get("description") if isinstance(body.get("description"), str) else ""
        if isinstance(schema, dict):
            # describe() shows why the body is one argument here.
            schema = {**schema, "description": f"The request body ({media_type}), {why}." + (f" {text}" if text else "")}
        properties[arg] = schema
        if operation.body_required:
            required.append(arg)
        operation.params.append(_Param(arg, "body*", "body"))

    def _static_headers(self) -> set[str]:
        return {k.lower() for k in self._headers}

    # -- calling --

    def _handler(self, operation: _Operation) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        async def handler(args: dict[str, Any]) -> Any:
            return await self._call(operation, args)

        handler.__qualname__ = f"openapi:{self.namespace}.{operation.name}"
        return handler

    async def _call(self, op: _Operation, args: dict[str, Any]) -> Any:
        client = self._client
        if client is None and self._client_args is not None:
            # No redirects: httpx strips only Authorization when a redirect leaves
            # the origin, so an API-key header would follow it to another host.
            import httpx

            client = self._client = httpx.AsyncClient(**self._client_args)
        if client is None:
            raise ToolError(
                f"OpenAPI source {self.namespace!r} is closed",
                details={"source": self.namespace, "code": "source_closed"},
            )
        path = op.path
        # httpx's own item type: a list of plain (str, str) pairs would not match it (lists are invariant).
        query: list[tuple[str, str | int | float | bool | None]] = []
        # An operation's own servers entry may name another origin: what the operator configured
        # for this API (auth, headers) is not sent there (httpx would not strip it either).
        trusted = op.server is None or same_origin(op.server, str(client.base_url))
        headers: dict[str, str] = dict(self._sent_headers) if trusted else {}
        body: Any = None
        has_body = False
        for p in op.params:
            if p.arg not in args:
                continue
            value = args[p.arg]
            if p.location == "body":
                body = body if has_body else {}
                body[p.wire] = value
                has_body = True
            elif p.location == "body*":
                body, has_body = value, True
            elif value is None:
                continue
            elif p.as_json:
                value = json.dumps(value)
                if p.location == "query":
                    query.append((p.wire, value))
                    continue
                if p.location == "header":
                    headers[p.wire] = value
                    continue
            if p.location in ("body", "body*"):
                pass
            elif p.location == "path":
                segment = quote(_simple(value, p.explode), safe="")
                if segment in (".", ".."):
                    # A dot segment would be normalised away and hit another endpoint.
                    raise InvalidArguments(f"{op.name}: path parameter {p.arg!r} cannot be {segment!r}")
                path = path.replace("{" + p.wire + "}", segment)
            elif p.location == "header":
                headers[p.wire] = _simple(value, p.explode)
            else:
                query.extend(_query(p, value))
        if op.body_required and not has_body and op.media_type is not None:
            body, has_body = {}, True
        secrets: list[str] = []
        for a in self._auth if trusted else ():
            value = a.value()
            secrets.append(value)
            if a.kind == "query":
                query.append((a.name, value))
            else:
                headers[a.name] = value
        call = current_call()
        if call is not None and self._idempotency_header and op.method.lower() not in _SAFE_METHODS:
            headers[self._idempotency_header] = call.key
        content, files, form = (bodies.encode_body(op.name, op.body_kind, op.media_type,
                                                   {p.wire for p in op.params if p.binary}, body)
                                if has_body else (None, None, None))
        if has_body and op.body_kind != "multipart":
            headers["Content-Type"] = op.media_type or "application/json"
        url = op.server.rstrip("/") + "/" + path.lstrip("/") if op.server else path.lstrip("/")
        label = f"{op.method} {op.path}"
        details: dict[str, Any] = {"source": self.namespace, "tool": op.name}
        import httpx  # imported when a call is made: a run that never calls the API does not pay for it

        try:
            response, whole = await read_answer(client, client.build_request(
                op.method, url, params=query, headers=headers, content=content, data=form, files=files))
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise ToolError(
                f"{label}: could not reach the API ({type(exc).__name__}); the request was not sent",
                details={**details, "code": "transport_error", "sent": False, "outcome": "not_sent"},
            ) from None
        except httpx.HTTPError as exc:
            unknown = "" if op.method.lower() in _READ_METHODS else "; whether it took effect is unknown"
            raise ToolError(
                f"{label}: the request failed ({type(exc).__name__}: {redact(str(exc), secrets)}){unknown}",
                details={**details, "code": "transport_error", "sent": True, "outcome": "unknown"},
            ) from None
        if not 200 <= response.status_code < 300:
            raise http_error(response, label, details, secrets,
                              in_progress=response.status_code == 409 and call is not None and call.send > 1
                              and bool(self._idempotency_header) and op.method.lower() not in _SAFE_METHODS)
        if not whole:
            raise ToolError(
                f"{label} answered HTTP {response.status_code} with a body over {RESPONSE_LIMIT >> 20} MiB; the "
                "request was sent and succeeded, its answer was not read",
                details={**details, "code": "response_too_large", "sent": True, "status": response.status_code},
                next_action="Ask the API for less (a page, a filter, fewer fields).",
            )
        if response.status_code == 204 or not response.content:
            return None
        if _is_json(response.headers.get("content-type", "")):
            try:
                return response.json()
            except ValueError as exc:
                # Labelled JSON but not JSON: a proxy's error page, a truncated answer. Saying so beats a string
                # the program would take for the API's data.
                raise ToolError(
                    f"{label} answered HTTP {response.status_code} with a body labelled JSON that is not JSON "
                    f"({exc}); the request was sent",
                    details={**details, "code": "malformed_json", "status": response.status_code,
                             "body": excerpt(redact(response.text, secrets))},
                ) from None
        return response.text


# --- helpers --------------------------------------------------------------------


def from_definition(definition: dict[str, Any], context: SourceContext) -> OpenAPISource:
    """An ``openapi`` source (tether._sources.kinds) from its recorded definition, not started yet."""
    return OpenAPISource(namespace=definition["namespace"], spec=definition["spec"],
                         base_url=definition.get("base_url"), auth=definition.get("auth"),
                         headers=definition.get("headers") or None,
                         idempotency=definition.get("idempotency", "none"),
                         idempotency_header=definition.get("idempotency_header", "Idempotency-Key") or None,
                         cache=context.catalogs,
                         **({"timeout": definition["call_timeout"]} if definition.get("call_timeout") else {}))
