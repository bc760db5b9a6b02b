"""A real OpenID provider for tests: npm ``oidc-provider`` (tests/idp/idp.mjs) on 127.0.0.1.

The test owns the IdP's signing keys (it writes them into the IdP's config), so
it can also sign tokens the IdP would never issue (expired, a foreign key) with
the same library any attacker would use.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

HERE = Path(__file__).parent
USERS = {
    # alice runs programs; bob approves (the "approvers" group).
    "alice": {"name": "Alice Agent-Owner", "email": "alice@example.test", "groups": ["engineering"]},
    "bob": {"name": "Bob Approver", "email": "bob@example.test", "groups": ["approvers"]},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def ensure_installed() -> None:
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        # `make test` runs `npm ci` first; this covers running pytest directly on a fresh clone.
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, capture_output=True,
                       timeout=300)


def start_idp(workdir: Path, *, resources: list[str], clients: list[dict], port: int | None = None,
              users: dict[str, dict] | None = None) -> IdP:
    if shutil.which("node") is None:
        raise RuntimeError("node is not installed; the OAuth tests need Node.js 20+ for oidc-provider")
    ensure_installed()
    port = port or free_port()
    issuer = f"http://127.0.0.1:{port}"
    key, jwk = new_key("idp-key-1")
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"issuer": issuer, "port": port, "jwks": {"keys": [jwk]}, "resources": resources,
              "clients": clients, "users": USERS if users is None else users}
    path = workdir / "idp.json"
    path.write_text(json.dumps(config))
    log = workdir / "idp.log"
    out = open(log, "wb")
    proc = subprocess.Popen(["node", str(HERE / "idp.mjs"), str(path)], cwd=HERE, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while b"ready" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the IdP did not start: {log.read_text()}")
        time.sleep(0.05)
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
