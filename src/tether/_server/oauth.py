"""tether as an OAuth 2.1 resource server: access tokens from the organisation's identity provider.

An agent's MCP client finds the authorization server through tether's
Protected Resource Metadata (RFC 9728), gets an access token for tether's
resource (RFC 8707: the token's ``aud`` is tether's canonical URL) and sends
it as a bearer token. Here such a token is checked as a JWT against the
issuer's published keys (PyJWT does the parsing and the cryptography), or by
introspection (RFC 7662) when it is not a JWT.

The principal is the issuer and subject, so every token of one user (a refresh,
a new sign-in) is the same principal. Rights come from scopes (``tether:run``,
``tether:approve``, ``tether:operate``) and from claims ([auth.rights]).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import httpx
import jwt
from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tether._engine.approvals.rights import ANY, APPROVE, OPERATE, RIGHTS, Grant
from tether._server.credentials import CredentialProblem
from tether.errors import ConfigError

SCOPE_PREFIX = "tether:"
SCOPES = tuple(SCOPE_PREFIX + r for r in RIGHTS)
PRM_PATH = "/.well-known/oauth-protected-resource"
# Keys are refetched at most this often when a token names a key not yet seen
# (rotation): an attacker sending made-up kids cannot make tether hammer the IdP.
UNKNOWN_KID_REFETCH_SECONDS = 30.0
# Keys are refetched anyway after this long, so a key the IdP withdrew stops being accepted.
KEYS_MAX_AGE_SECONDS = 3600.0
FETCH_TIMEOUT_SECONDS = 10.0
# Introspection of opaque tokens (D-62): a token the IdP said is not good here is refused without asking again
# for this long (a flood of made-up tokens costs the IdP one call each, once), at most this many remembered;
# and at most this many introspections are in flight, so a flood queues here instead of opening a connection
# per request. A negative answer may be cached: a token never becomes active later.
REFUSED_CACHE_SECONDS, REFUSED_CACHE_ENTRIES = 60.0, 10_000
MAX_INTROSPECTIONS = 8
# JWT typ values of an access token: RFC 9068's, and plain JWT, which most IdPs still put on theirs (D-62).
ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt", "jwt"})


def principal_for_subject(issuer: str, subject: str, *, client: bool = False) -> str:
    """The principal of a user of an identity provider: the same for every token of theirs.

    A client acting on its own (client credentials: no user, its id is the subject) is another namespace,
    so a client id that equals some user's subject never makes the client that user (D-62).
    """
    return f"oauth-client:{issuer}#{subject}" if client else f"oauth:{issuer}#{subject}"


@dataclass(frozen=True)
class Identity:
    """Who a verified access token (or console sign-in) stands for, and what they may do."""

    issuer: str
    subject: str
    rights: frozenset[str]
    name: str | None = None
    email: str | None = None
    scopes: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)
    # A client's own token (client credentials), not a person's.
    client: bool = False

    @property
    def principal(self) -> str:
        return principal_for_subject(self.issuer, self.subject, client=self.client)

    @property
    def shown(self) -> str:
        """How the timeline and the console name this person: a name, else an e-mail, else the subject."""
        if self.name and self.email:
            return f"{self.name} <{self.email}>"
        return self.name or self.email or self.subject

    def grant(self) -> Grant:
        # An approver from the IdP approves for everyone's runs: the IdP, not
        # tether's config, says who approves (by scope or by claim).
        approves_for = frozenset({ANY}) if APPROVE in self.rights or OPERATE in self.rights else frozenset()
        return Grant(self.principal, self.shown, self.rights, approves_for)


def rights_of(scopes: frozenset[str], claims: Mapping[str, Any], claim_rights: Mapping[str, Any]) -> frozenset[str]:
    """Rights from ``tether:*`` scopes, and from claims as [auth.rights] maps them."""
    rights = {s[len(SCOPE_PREFIX):] for s in scopes if s in SCOPES}
    for right, rule in claim_rights.items():
        value = claims.get(rule.claim)
        held = set(value) if isinstance(value, list) else set(str(value).split()) if isinstance(value, str) else set()
        if held & set(rule.values):
            rights.add(right)
    return frozenset(rights)


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    scope = claims.get("scope", claims.get("scp", ""))
    if isinstance(scope, list):
        return frozenset(str(s) for s in scope)
    # RFC 6749 §3.3: scopes are separated by spaces (0x20) only. str.split() would also split on other
    # Unicode whitespace, so "x\u2003tether:operate" would grant operate where the IdP granted one odd scope.
    return frozenset(s for s in str(scope).split(" ") if s)


def _is_client(claims: Mapping[str, Any]) -> bool:
    """A token a client got for itself (RFC 9068 §2.2: its subject is then the client's id), not a person's."""
    client = claims.get("client_id", claims.get("azp"))
    return claims.get("sub") is None or (isinstance(client, str) and claims.get("sub") == client)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class ResourceServer:
    """The checks of access tokens for ``/mcp``, and the metadata that tells clients where to get them."""

    def __init__(self, *, issuer: str, audience: str, jwks_url: str | None, algorithms: list[str], leeway: int,
                 claim_rights: Mapping[str, Any] | None = None, introspection_url: str | None = None,
                 client_id: str | None = None, client_secret: str | None = None,
                 discovery: Mapping[str, Any] | None = None) -> None:
        self.issuer, self.audience, self.jwks_url = issuer, audience, jwks_url
        self.algorithms, self.leeway = list(algorithms), leeway
        self.claim_rights = dict(claim_rights or {})
        self.introspection_url = introspection_url
        self.client_id, self.client_secret = client_id, client_secret
        self.discovery = dict(discovery or {})
        self.metadata_url = str(build_resource_metadata_url(AnyHttpUrl(audience)))
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()
        self._refused: OrderedDict[bytes, tuple[float, CredentialProblem]] = OrderedDict()
        self._introspecting = asyncio.Semaphore(MAX_INTROSPECTIONS)

    # -- configuration ----------------------------------------------------------------

    @classmethod
    async def from_config(cls, auth: Any, public_url: str | None, env: Mapping[str, str]) -> "ResourceServer":
        """Check ``[auth]`` against the identity provider: discovery reachable, keys loadable; else UsageError."""
        audience = auth.audience or (public_url.rstrip("/") + "/mcp" if public_url else None)
        if audience is None:
            raise ConfigError("[auth] has no audience, and there is no [server] public_url to derive it from; "
                              "nothing was started",
                              next_action="Set [auth] audience to tether's public /mcp URL (what the IdP puts in "
                                          "tokens' aud), or set [server] public_url.")
        secret = None
        if auth.console_client_secret_env:
            secret = (env.get(auth.console_client_secret_env) or "").strip() or None
            if secret is None:
                raise ConfigError(f"[auth] console_client_secret_env names ${auth.console_client_secret_env}, which "
                                  "is not set; nothing was started",
                                  next_action=f"Set {auth.console_client_secret_env} to the console client's secret.")
        discovery = await _discover(auth.issuer.rstrip("/"))
        # Tokens name the issuer exactly as its discovery document does (a trailing slash included).
        issuer = str(discovery["issuer"])
        jwks_url = auth.jwks_url or _text(discovery.get("jwks_uri"))
        if jwks_url is None:
            raise ConfigError(f"[auth] issuer {issuer}'s discovery document names no jwks_uri; nothing was started",
                              next_action="Set [auth] jwks_url to the IdP's JWKS URL.")
        server = cls(issuer=issuer, audience=audience, jwks_url=jwks_url, algorithms=auth.algorithms,
                     leeway=auth.leeway_seconds, claim_rights=auth.rights,
                     introspection_url=auth.introspection_url, client_id=auth.console_client_id,
                     client_secret=secret, discovery=discovery)
        try:
            await server.refresh_keys()
        except Exception as exc:  # noqa: BLE001 - any failure here means the keys cannot be used
            raise ConfigError(f"[auth] jwks_url: the signing keys at {jwks_url} could not be loaded ({exc}); "
                              "nothing was started",
                              next_action="Check that the IdP is reachable from this server and jwks_url is "
                                          "its JWKS.") from None
        if not server._keys:
            raise ConfigError(f"[auth] jwks_url: {jwks_url} holds no signing key for {', '.join(auth.algorithms)}; "
                              "nothing was started",
                              next_action="Check [auth] algorithms against the keys the IdP publishes.")
        return server

    def routes(self) -> list[Route]:
        """RFC 9728 metadata at the well-known path and at its path-suffixed form for ``/mcp``."""
        metadata = ProtectedResourceMetadata(
            # Strings, not AnyHttpUrl: the model keeps an empty path empty, so a client comparing
            # issuers sees exactly the one the IdP names (no added trailing slash).
            resource=self.audience, authorization_servers=[self.issuer],  # type: ignore[arg-type,list-item]
            scopes_supported=list(SCOPES), resource_name="tether",
            resource_signing_alg_values_supported=None)
        handler = ProtectedResourceMetadataHandler(metadata)
        suffixed = PRM_PATH + (httpx.URL(self.audience).path.rstrip("/") or "")
        return [Route(path, handler.handle, methods=["GET"]) for path in dict.fromkeys([PRM_PATH, suffixed])]

    # -- keys -------------------------------------------------------------------------

    async def refresh_keys(self) -> None:
        assert self.jwks_url is not None
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as http:
            response = await http.get(self.jwks_url)
            response.raise_for_status()
            data = response.json()
        keys: dict[str, jwt.PyJWK] = {}
        for entry in data.get("keys", []) if isinstance(data, dict) else []:
            # A private key published by mistake ("d") verifies nothing: PyJWT would build a
            # signing key from it, so it is skipped rather than failing every check.
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or "d" in entry:
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key of a type or algorithm this server does not use
            if key.algorithm_name in self.algorithms and isinstance(entry.get("kid"), str):
                keys[entry["kid"]] = key
        self._keys, self._fetched_at = keys, time.monotonic()

    async def key_for(self, kid: str) -> jwt.PyJWK | None:
        """The issuer's key ``kid``: refetched when unknown (rotation), at most every UNKNOWN_KID_REFETCH_SECONDS."""
        async with self._lock:
            age = time.monotonic() - self._fetched_at
            if (kid not in self._keys and age > UNKNOWN_KID_REFETCH_SECONDS) or age > KEYS_MAX_AGE_SECONDS:
                try:
                    await self.refresh_keys()
                except Exception:  # noqa: BLE001 - the IdP is briefly away: the keys held stay in use
                    self._fetched_at = time.monotonic()
            return self._keys.get(kid)

    # -- tokens -----------------------------------------------------------------------

    def looks_like_jwt(self, token: str) -> bool:
        return token.count(".") == 2

    async def identify(self, token: str) -> Identity:
        """The identity an access token stands for; CredentialProblem(401, invalid_token) if it is not good here."""
        if not self.looks_like_jwt(token):
            if self.introspection_url is None:
                raise _invalid("the bearer token is neither a token this server accepts nor a JWT access token")
            return await self._introspect(token)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _invalid("the access token is not a well-formed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
            # An ID token, a logout token, a signed request: signed by the same keys, not an access token.
            raise _invalid(f"the JWT's typ is {_quoted(str(typ))!r}, not an access token's (at+jwt, RFC 9068)")
        if alg not in self.algorithms:
            raise _invalid(f"the access token is signed with {alg!r}; this server accepts only "
                           f"{', '.join(self.algorithms)}")
        key = await self.key_for(kid) if isinstance(kid, str) else None
        if key is None:
            raise _invalid("the access token names a signing key the issuer does not publish")
        try:
            claims = jwt.decode(token, key, algorithms=self.algorithms, audience=self.audience, issuer=self.issuer,
                                leeway=self.leeway, options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError:
            raise _invalid("the access token has expired") from None
        except jwt.ImmatureSignatureError:
            raise _invalid("the access token is not valid yet (nbf/iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise _invalid(f"the access token is for another audience, not {self.audience}") from None
        except jwt.InvalidIssuerError:
            raise _invalid(f"the access token is from another issuer, not {self.issuer}") from None
        except jwt.PyJWTError as exc:
            raise _invalid(f"the access token is not valid here ({exc})") from None
        except Exception:  # noqa: BLE001 - e.g. a key of another type under the kid: refused, never a 500
            raise _invalid("the access token's signature could not be verified with the issuer's key") from None
        return self.identity(claims)

    def identity(self, claims: Mapping[str, Any], *, client: bool | None = None) -> Identity:
        scopes = _scopes(claims)
        return Identity(issuer=str(claims["iss"]), subject=str(claims["sub"]),
                        rights=rights_of(scopes, claims, self.claim_rights), name=_text(claims.get("name")),
                        email=_text(claims.get("email")), scopes=scopes, claims=dict(claims),
                        client=_is_client(claims) if client is None else client)

    async def _introspect(self, token: str) -> Identity:
        key = hashlib.sha256(token.encode()).digest()  # never the token itself, even in memory's cache
        now = time.monotonic()
        known = self._refused.get(key)
        if known is not None and known[0] > now:
            raise known[1]
        async with self._introspecting:
            try:
                return await self._ask_introspection(token)
            except CredentialProblem as problem:
                if problem.status == 401:  # the IdP's word; an IdP that did not answer is asked again
                    self._refused[key] = (time.monotonic() + REFUSED_CACHE_SECONDS, problem)
                    self._refused.move_to_end(key)
                    while len(self._refused) > REFUSED_CACHE_ENTRIES:
                        self._refused.popitem(last=False)
                raise

    async def _ask_introspection(self, token: str) -> Identity:
        assert self.introspection_url is not None
        try:
            async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as http:
                if self.client_id and self.client_secret:
                    response = await http.post(self.introspection_url, data={"token": token},
                                               auth=(self.client_id, self.client_secret))
                else:
                    response = await http.post(self.introspection_url, data={"token": token})
            data = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            raise CredentialProblem(503, "introspection_unavailable", "the token could not be checked: the "
                                    "identity provider's introspection endpoint did not answer") from None
        if not isinstance(data, dict) or data.get("active") is not True:
            raise _invalid("the access token is not active")
        audiences = data.get("aud")
        audiences = audiences if isinstance(audiences, list) else [audiences]
        if self.audience not in audiences:
            raise _invalid(f"the access token is for another audience, not {self.audience}")
        if data.get("iss", self.issuer) != self.issuer:
            raise _invalid(f"the access token is from another issuer, not {self.issuer}")
        # A client's own token (client credentials) has no user: the client is its subject, as in its JWT
        # form, in the clients' namespace (D-62).
        subject = data.get("sub") or data.get("client_id")
        if not isinstance(subject, str):
            raise _invalid("the introspected token names no subject")
        if isinstance(data.get("exp"), (int, float)) and data["exp"] + self.leeway < time.time():
            raise _invalid("the access token has expired")
        return self.identity({**data, "iss": self.issuer, "sub": subject}, client=_is_client(data))

    async def verify_token(self, token: str) -> AccessToken | None:
        """The MCP SDK's TokenVerifier protocol, for embeddings that use the SDK's own auth middleware."""
        try:
            who = await self.identify(token)
        except CredentialProblem:
            return None
        exp = who.claims.get("exp")
        return AccessToken(token=token, client_id=str(who.claims.get("client_id") or who.subject),
                           scopes=sorted(who.scopes), expires_at=int(exp) if isinstance(exp, (int, float)) else None,
                           resource=self.audience, subject=who.subject, claims=dict(who.claims))

    # -- challenges -------------------------------------------------------------------

    def challenge(self, problem: CredentialProblem | None = None, *, scope: str | None = None) -> bytes:
        """``WWW-Authenticate`` for a refused request (RFC 6750 §3, RFC 9728 §5.1)."""
        parts = []
        if problem is not None and problem.code in ("invalid_token", "insufficient_scope"):
            parts += [f'error="{problem.code}"', f'error_description="{_quoted(problem.message)}"']
        if scope:
            parts.append(f'scope="{scope}"')
        parts.append(f'resource_metadata="{self.metadata_url}"')
        return ("Bearer " + ", ".join(parts)).encode()


class MetadataRoutes:
    """ASGI: the Protected Resource Metadata paths, answered before authentication (a client has no token yet)."""

    def __init__(self, app: ASGIApp, resource: ResourceServer) -> None:
        from starlette.applications import Starlette

        self.app = app
        routes = resource.routes()
        self.paths = frozenset(r.path for r in routes)
        self.metadata = Starlette(routes=routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in self.paths:
            await self.metadata(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _quoted(text: str) -> str:
    # Inside a quoted-string of a header: printable ASCII only (a token's `alg` is the caller's text).
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in text)


def _invalid(message: str) -> CredentialProblem:
    return CredentialProblem(401, "invalid_token", message)


async def _discover(issuer: str) -> dict[str, Any]:
    """The issuer's OpenID / OAuth metadata; UsageError naming [auth] issuer when it cannot be had."""
    urls = [f"{issuer}/.well-known/openid-configuration", f"{issuer}/.well-known/oauth-authorization-server"]
    problems = []
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as http:
        for url in urls:
            try:
                response = await http.get(url)
                data = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError) as exc:
                problems.append(f"{url}: {type(exc).__name__}")
                continue
            if not isinstance(data, dict):
                problems.append(f"{url}: HTTP {response.status_code}")
                continue
            if str(data.get("issuer", "")).rstrip("/") != issuer:
                raise ConfigError(f"[auth] issuer: {url} names issuer {data.get('issuer')!r}, not {issuer!r}; "
                                  "nothing was started",
                                  next_action="Set [auth] issuer to exactly the issuer the IdP names.")
            return data
    raise ConfigError(f"[auth] issuer: the discovery document of {issuer} could not be read ({'; '.join(problems)}); "
                      "nothing was started",
                      next_action="Check [auth] issuer and that the IdP is reachable from this server.")


__all__ = ["SCOPES", "Identity", "MetadataRoutes", "ResourceServer", "principal_for_subject",
           "rights_of"]
