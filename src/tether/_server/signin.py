"""Console sign-in with OpenID Connect: authorization code + PKCE against [auth]'s issuer.

The browser goes to the IdP's own sign-in page and comes back to
``/console/oidc/callback`` with a code; tether exchanges it (authlib's OAuth
client, PKCE S256), checks the ID token with the issuer's keys (PyJWT, the same
keys access tokens are checked with) and reads the user's claims. Who approves
is said by a claim ([auth.rights], e.g. a group); the person signed in is who
the timeline records as deciding.

What the browser carries between leaving and coming back (state, nonce, the
PKCE verifier, the page to return to) is a cookie signed with a key derived
from the store's secret, so the callback may land on any replica.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Mapping

import jwt
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import AsyncOAuth2Client

from tether._engine.approvals.capabilities import SIGN_IN_FLOW, Keyring
from tether._server.oauth import FETCH_TIMEOUT_SECONDS, Identity, ResourceServer, rights_of

FLOW_COOKIE = "tether_oidc"
# Long enough to type a password and answer a second factor; a flow left longer starts again.
FLOW_SECONDS = 600
SCOPE = "openid profile email groups"


class SignInFailed(Exception):
    """Why a sign-in did not complete (shown to the person, who then starts again)."""


@dataclass(frozen=True)
class Flow:
    state: str
    nonce: str
    verifier: str
    after: str | None


class OidcSignIn:
    """One OpenID Connect client (the console's) of the issuer a ResourceServer trusts."""

    def __init__(self, resource: ResourceServer, *, client_id: str, client_secret: str | None,
                 redirect_uri: str) -> None:
        self.resource = resource
        self.client_id, self.client_secret, self.redirect_uri = client_id, client_secret, redirect_uri
        meta = resource.discovery
        self.authorization_endpoint = meta.get("authorization_endpoint")
        self.token_endpoint = meta.get("token_endpoint")
        self.userinfo_endpoint = meta.get("userinfo_endpoint")
        self._keyring: Keyring | None = None

    def bind(self, keyring: Keyring) -> None:
        """The keyring (from the store's secret) that signs the flow cookie."""
        self._keyring = keyring

    @property
    def ready(self) -> bool:
        return bool(self.authorization_endpoint and self.token_endpoint and self._keyring)

    def _client(self) -> AsyncOAuth2Client:
        return AsyncOAuth2Client(client_id=self.client_id, client_secret=self.client_secret,
                                 redirect_uri=self.redirect_uri, scope=SCOPE, code_challenge_method="S256",
                                 token_endpoint_auth_method="client_secret_basic" if self.client_secret else "none",
                                 timeout=FETCH_TIMEOUT_SECONDS)

    # -- leaving for the IdP ----------------------------------------------------------

    async def start(self, after: str | None) -> tuple[str, str]:
        """(the IdP URL to send the browser to, the flow cookie to set)."""
        flow = Flow(state=generate_token(32), nonce=generate_token(32), verifier=generate_token(64), after=after)
        async with self._client() as client:
            url, _ = client.create_authorization_url(self.authorization_endpoint, state=flow.state, nonce=flow.nonce,
                                                     code_verifier=flow.verifier)
        return url, self._seal(flow)

    def _seal(self, flow: Flow) -> str:
        if self._keyring is None:  # the console offers sign-in only once bound (``ready``)
            raise RuntimeError("the sign-in flow is not bound to the store's keyring")
        return SIGN_IN_FLOW.mint(self._keyring, {"s": flow.state, "o": flow.nonce, "v": flow.verifier,
                                                 "a": flow.after, "e": int(time.time() + FLOW_SECONDS)})

    def open_flow(self, value: str | None) -> Flow | None:
        if self._keyring is None:
            return None
        data = SIGN_IN_FLOW.open(self._keyring, value or "")
        if not isinstance(data, dict) or data.get("e", 0) < time.time():
            return None
        return Flow(str(data["s"]), str(data["o"]), str(data["v"]), data.get("a"))

    # -- coming back ------------------------------------------------------------------

    async def finish(self, query: Mapping[str, str], flow: Flow | None) -> Identity:
        """The person the IdP signed in, from the callback's query; SignInFailed saying why not."""
        if flow is None:
            raise SignInFailed("the sign-in started too long ago, or in another browser")
        if "error" in query:
            raise SignInFailed(f"the identity provider said {query.get('error')}: "
                               f"{query.get('error_description') or 'no reason given'}")
        state, code = query.get("state"), query.get("code")
        if not state or not code or not secrets.compare_digest(state, flow.state):
            raise SignInFailed("the identity provider's answer does not belong to this sign-in")
        if query.get("iss") and query["iss"] != self.resource.issuer:
            # RFC 9207: an answer from another issuer is a mix-up attack.
            raise SignInFailed("the answer came from another identity provider")
        async with self._client() as client:
            try:
                token = await client.fetch_token(self.token_endpoint, code=code, code_verifier=flow.verifier,
                                                 grant_type="authorization_code")
            except Exception as exc:  # noqa: BLE001 - authlib raises several types; the person needs one story
                raise SignInFailed(f"the identity provider did not exchange the code ({exc})") from None
            claims = await self._id_claims(token.get("id_token"), flow.nonce)
            if self.userinfo_endpoint:
                # Names and groups often live in userinfo rather than the ID token.
                response = await client.get(self.userinfo_endpoint)
                info = response.json() if response.status_code == 200 else {}
                if isinstance(info, dict) and info.get("sub") == claims["sub"]:
                    claims = {**info, **claims}
        scopes: frozenset[str] = frozenset()
        return Identity(issuer=self.resource.issuer, subject=str(claims["sub"]),
                        rights=rights_of(scopes, claims, self.resource.claim_rights),
                        name=_text(claims.get("name")), email=_text(claims.get("email")), claims=claims)

    async def _id_claims(self, id_token: Any, nonce: str) -> dict[str, Any]:
        if not isinstance(id_token, str):
            raise SignInFailed("the identity provider sent no ID token")
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise SignInFailed("the ID token is not a JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        key = await self.resource.key_for(kid) if isinstance(kid, str) and alg in self.resource.algorithms else None
        if key is None:
            raise SignInFailed("the ID token is not signed with a key and algorithm the issuer publishes")
        try:
            claims = jwt.decode(id_token, key, algorithms=self.resource.algorithms, audience=self.client_id,
                                issuer=self.resource.issuer, leeway=self.resource.leeway,
                                options={"require": ["exp", "iat", "iss", "aud", "sub"]})
        except jwt.PyJWTError as exc:
            raise SignInFailed(f"the ID token is not valid ({exc})") from None
        if not isinstance(claims.get("nonce"), str) or not secrets.compare_digest(claims["nonce"], nonce):
            raise SignInFailed("the ID token was not issued for this sign-in (nonce)")
        return claims


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


__all__ = ["FLOW_COOKIE", "OidcSignIn", "SignInFailed"]
