"""A real OpenID provider for tests: npm ``oidc-provider`` (tests/idp/idp.mjs) on 127.0.0.1.

The test owns the IdP's signing keys (it writes them into the IdP's config), so
it can also sign tokens the IdP would never issue (expired, a foreign key) with
the same library any attacker would use.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from helpers import free_port, npm_ci, start_until, stop_process

HERE = Path(__file__).parent
USERS = {
    # alice runs programs; bob approves (the "approvers" group).
    "alice": {"name": "Alice Agent-Owner", "email": "alice@example.test", "groups": ["engineering"]},
    "bob": {"name": "Bob Approver", "email": "bob@example.test", "groups": ["approvers"]},
}


def new_key(kid: str) -> tuple[Any, dict]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    jwk.update(kid=kid, alg="RS256", use="sig")
    return key, jwk


@dataclass
class IdP:
    issuer: str
    key: Any
    kid: str
    proc: subprocess.Popen
    clients: dict[str, dict] = field(default_factory=dict)

    def sign(self, claims: dict, *, key: Any = None, kid: str | None = None, alg: str = "RS256") -> str:
        """A JWT as if from this IdP (its own key unless ``key`` says otherwise)."""
        if alg == "none":
            return jwt.encode(claims, None, algorithm="none", headers={"kid": kid or self.kid})
        return jwt.encode(claims, key or self.key, algorithm=alg, headers={"kid": kid or self.kid, "typ": "at+jwt"})

    def client_token(self, resource: str, scope: str, client_id: str = "agent-cc") -> dict:
        """A real access token from the IdP's token endpoint (client credentials grant)."""
        import httpx

        secret = self.clients[client_id]["client_secret"]
        r = httpx.post(f"{self.issuer}/token", auth=(client_id, secret),
                       data={"grant_type": "client_credentials", "resource": resource, "scope": scope}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> None:
        stop_process(self.proc)


def ensure_installed() -> None:
    npm_ci(HERE, installed=(HERE / "node_modules" / "oidc-provider").is_dir(), need="the OAuth tests")


def start_idp(workdir: Path, *, resources: list[str], clients: list[dict], port: int | None = None,
              users: dict[str, dict] | None = None) -> IdP:
    ensure_installed()
    port = port or free_port()
    issuer = f"http://127.0.0.1:{port}"
    key, jwk = new_key("idp-key-1")
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"issuer": issuer, "port": port, "jwks": {"keys": [jwk]}, "resources": resources,
              "clients": clients, "users": USERS if users is None else users}
    path = workdir / "idp.json"
    path.write_text(json.dumps(config))
    proc = start_until(["node", str(HERE / "idp.mjs"), str(path)], workdir / "idp.log", b"ready", "the IdP",
                       timeout=60, cwd=HERE)
    return IdP(issuer, key, "idp-key-1", proc, {c["client_id"]: c for c in clients})


def log_in(authorize_url: str, user: str) -> str:
    """Sign ``user`` in on the IdP's own login and consent pages (no browser); the redirect URL it ends on."""
    import re

    import httpx

    with httpx.Client(follow_redirects=False, timeout=30) as http:
        r = http.get(authorize_url)
        for _ in range(12):
            if r.status_code in (302, 303):
                location = str(r.url.join(r.headers["location"]))
                if not location.startswith(authorize_url.split("/auth")[0]):
                    return location
                r = http.get(location)
                continue
            assert r.status_code == 200, r.text
            action = re.search(r'<form[^>]*action="([^"]+)"', r.text)
            assert action, r.text
            target = str(r.url.join(action.group(1)))
            if 'name="login"' in r.text:
                r = http.post(target, data={"prompt": "login", "login": user, "password": "any"})
            else:
                r = http.post(target, data={"prompt": "consent"})
        raise AssertionError("the IdP's sign-in did not end in a redirect")
