"""A test identity provider on loopback: keys generated here with `cryptography`, a JWKS served
by a small HTTP server in a thread (which can be made slow or down), and JWTs signed with them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://idp.test"
AUDIENCE = "ductor-streams"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Key:
    """A signing key: its private half signs, its public JWK is what the provider publishes."""

    def __init__(self, alg: str, kid: str | None = None) -> None:
        self.alg = alg
        self.kid = kid or f"{alg.lower()}-{secrets.token_hex(4)}"
        if alg == "RS256":
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        elif alg == "ES256":
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        elif alg == "EdDSA":
            self.private = ed25519.Ed25519PrivateKey.generate()
            jwk = OKPAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            raise ValueError(alg)
        self.jwk = {**jwk, "kid": self.kid, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: Mapping[str, Any], **header: Any) -> str:
        return jwt.encode(
            dict(claims), self.private, algorithm=self.alg, headers={"kid": self.kid, **header}
        )


def claims(
    tenant: Any = "default",
    sub: Any = "someone",
    scope: Any = "streams:read streams:write streams:admin",
    lifetime: float = 600,
    **extra: Any,
) -> dict[str, Any]:
    now = int(time.time())
    given = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": sub,
        "tenant": tenant,
        "scope": scope,
        "iat": now,
        "exp": now + lifetime,
        "jti": secrets.token_hex(8),  # each JWT its own text: none is verified from memory
        **extra,
    }
    return {k: v for k, v in given.items() if v is not None}


def unsigned(header: Mapping[str, Any], payload: Mapping[str, Any], signature: bytes = b"") -> str:
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(payload).encode())
    return f"{head}.{body}.{b64url(signature)}"


def hs256_with_public_key(key: Key, payload: Mapping[str, Any]) -> str:
    """The key-confusion attack: HS256 with the provider's public key (PEM) as the secret."""
    header = {"alg": "HS256", "typ": "JWT", "kid": key.kid}
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(payload).encode())
    mac = hmac.new(key.public_pem(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(mac)}"


class IdentityProvider:
    """Serves `/jwks.json` with the published keys; `delay` seconds before answering, or 503
    while `down`. Counts the fetches."""

    def __init__(self) -> None:
        self.published: list[Key] = []
        self.delay = 0.0
        self.down = False
        self.fetches = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider.fetches += 1
                if provider.delay:
                    time.sleep(provider.delay)
                if provider.down or self.path != "/jwks.json":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"keys": [k.jwk for k in provider.published]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A client that gave up on a slow answer (the point of `delay`) is no error here.
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> IdentityProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def env(self, **more: str) -> dict[str, str]:
        return {
            "DUCTOR_STREAMS_JWT_JWKS_URL": self.url,
            "DUCTOR_STREAMS_JWT_ISSUER": ISSUER,
            "DUCTOR_STREAMS_JWT_AUDIENCE": AUDIENCE,
            **more,
        }
