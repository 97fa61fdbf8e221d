"""SASL on the Kafka port: who a Kafka connection is, as a Kafka broker's SASL listener decides it.

Owns: ``Authenticator``, one per connection: which requests it may send
before it is authenticated, the SaslHandshake and SaslAuthenticate answers
(and the bare tokens that follow a v0 handshake), the mechanisms PLAIN
(RFC 4616) and SCRAM-SHA-256 (RFC 5802 / 7677), the login of the ACL user it proved to be
(``AclRegistry.login``: the RESP port's users, passwords and rules), the
frame size an unauthenticated client may send, and the log line of a
failed authentication. docs/kafka.md "Authentication" has the whole story.

Must not know: sockets, frames beyond their bytes, what the other APIs do.

What a Kafka broker's SASL listener does (``SaslServerAuthenticator``),
and this does the same:

- Before authentication only ApiVersions and SaslHandshake are served; any
  other request closes the connection without a response ("Unexpected
  Kafka request of type METADATA during SASL handshake."). SaslHandshake
  names a mechanism: an unknown one is answered UNSUPPORTED_SASL_MECHANISM
  with the mechanisms served, then the connection closes.
- After a v1 handshake the client sends SaslAuthenticate requests with the
  mechanism's tokens; anything else closes the connection (Kafka first
  answers it ILLEGAL_SASL_STATE in that request's own response: Partita
  closes without it). After a v0 handshake the tokens come bare: an int32
  size and the token, answered the same way (a failure just closes).
- A failed authentication is answered SASL_AUTHENTICATION_FAILED with
  Kafka's message (PLAIN: "Authentication failed: Invalid username or
  password"; SCRAM: "Authentication failed during authentication due to
  invalid credentials with SASL mechanism SCRAM-SHA-256", which never says
  whether the user exists), then the connection closes 100 ms later
  (Kafka's ``failed.authentication.delay.ms``). The log says why,
  at INFO as Kafka logs it (at most one line a second, with a count of the
  lines left out).
- Once authenticated, SaslHandshake and SaslAuthenticate are answered
  ILLEGAL_SASL_STATE and the connection goes on. No re-authentication
  (KIP-368): the session lifetime answered is 0.

Partita's one listener is open and SASL at once: a connection starts as
the ``default`` user when that user needs no password (``nopass``, as a
RESP connection does), and may still authenticate as another user; when
it needs one, the connection must authenticate before anything else.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import logging
import re
import secrets
import time
from typing import Any, NamedTuple

from server.errors import CommandError
from server.kafka import errors as E

log = logging.getLogger("partita.kafka")

MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
# Kafka's sasl.server.max.receive.size: the largest frame a client that has
# not authenticated may send.
SASL_MAX_RECEIVE_BYTES = 512 * 1024
FAILURE_LOG_S = 1.0  # failed authentications are logged at most this often
# Kafka's failed.authentication.delay.ms: a failed authentication's
# connection closes this long after its answer (it slows a password guesser
# down, and the answer is read before the close: kafka-python drops bytes
# that arrive with the end of the stream).
FAILED_CLOSE_DELAY_S = 0.1

SCRAM_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"


class Phase(enum.Enum):
    OPEN = "open"  # authenticated as the default user (it needs no password); SASL may still start
    HANDSHAKE = "handshake"  # must authenticate: ApiVersions and SaslHandshake only
    AUTHENTICATE = "authenticate"  # after a v1 handshake: SaslAuthenticate only
    RAW = "raw"  # after a v0 handshake: bare tokens
    COMPLETE = "complete"  # authenticated by SASL


class RawToken(NamedTuple):
    """A bare SASL token (a frame after a v0 handshake)."""

    data: bytes


class AuthenticationFailed(Exception):
    """``message``: what the client is told; ``reason``: what the log says
    (defaults to the message); ``warning``: an operator's mistake, logged
    as a warning."""

    def __init__(self, message: str, reason: str | None = None, warning: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or message
        self.warning = warning


class _FailureLog:
    """At most one failed-authentication line a second, counting the others."""

    def __init__(self) -> None:
        self.last_s = -FAILURE_LOG_S
        self.skipped = 0

    def write(self, addr: str, exc: AuthenticationFailed) -> None:
        now = time.monotonic()
        if now - self.last_s < FAILURE_LOG_S:
            self.skipped += 1
            return
        self.last_s = now
        more = f" ({self.skipped} more failed authentications since the last line)" if self.skipped else ""
        self.skipped = 0
        (log.warning if exc.warning else log.info)("Kafka client %s: failed authentication (%s)%s",
                                                   addr, exc.reason, more)


_failures = _FailureLog()


def api_name(name: str) -> str:
    """Kafka's ApiKeys name of an API: ``ListOffsets`` -> ``LIST_OFFSETS``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


# -- mechanisms ----------------------------------------------------------------------


class _Plain:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``, checked as the RESP
    port's AUTH checks it (``AclRegistry.authenticate``); Kafka's messages."""

    name = "PLAIN"

    def __init__(self, acl: Any) -> None:
        self.acl = acl

    def step(self, token: bytes) -> tuple[bytes, Any]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, username, password = parts
        if not username:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        if authzid and authzid != username:
            raise AuthenticationFailed(
                "Authentication failed: Client requested an authorization id that is different from username")
        try:
            user = self.acl.authenticate(username, password)
        except CommandError:  # WRONGPASS: unknown user, wrong password, user off
            raise AuthenticationFailed(
                "Authentication failed: Invalid username or password",
                f"PLAIN as '{username.decode('utf-8', 'replace')}': invalid username or password, or the user "
                "is off") from None
        return b"", user


class _Scram:
    """SCRAM-SHA-256 (RFC 5802 / 7677) over the users' secrets (``ScramSecret``):
    client-first -> server-first, client-final -> server-final; the
    stdlib's HMAC and SHA-256 (``server.acl.scram_secret`` derives them).

    Not the ``scramp`` library: it takes only a client-final nonce equal to
    the server's, and librdkafka before 2.7 (Debian's kcat among its users)
    sends its own nonce again in front of it, which Kafka brokers accept
    (no check before 3.8.1, ``endsWith`` since); this takes exactly those
    two forms. What Kafka's server does and this does too: "n" or "y"
    channel-binding flags (no channel binding), an authzid only equal to
    the user name, the user name unescaped (``=2C``, ``=3D``) but not
    SASLprep'ed, extensions ignored (``tokenauth=true`` refused: no
    delegation tokens). A user may have several passwords sharing one salt
    (``User.scram_secrets``): the proof is checked against each.
    ``nonce``: the server's part of the nonce (tests)."""

    name = "SCRAM-SHA-256"

    def __init__(self, acl: Any, nonce: str | None = None) -> None:
        self.acl = acl
        self.server_nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        self.user: Any = None
        self.secrets: list = []
        self.gs2_header = self.first_bare = self.client_nonce = self.nonce = ""
        self.server_first: str | None = None

    def _failed(self, reason: str, warning: bool = False) -> AuthenticationFailed:
        shown = f" as '{self.user.name}'" if self.user is not None else ""
        return AuthenticationFailed(SCRAM_FAILED.format(self.name), f"SCRAM-SHA-256{shown}: {reason}", warning)

    def step(self, token: bytes) -> tuple[bytes, Any]:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._failed("the message is not UTF-8") from None
        if self.server_first is None:
            return self._first(text).encode(), None
        return self._final(text), self.user

    def _first(self, text: str) -> str:
        parts = text.split(",")
        if len(parts) < 4 or parts[0] not in ("n", "y") or not parts[2].startswith("n=") \
                or not parts[3].startswith("r="):
            if parts[0].startswith("p="):
                raise self._failed("the client asks for channel binding, which is not supported")
            if len(parts) > 2 and parts[2].startswith("m="):
                raise self._failed("the client-first message has a mandatory extension (m=), not supported")
            raise self._failed("malformed client-first message")
        name = _sasl_name(parts[2][2:])
        if name is None:
            raise self._failed("malformed user name (an '=' not followed by 2C or 3D)")
        if parts[1] and (not parts[1].startswith("a=") or _sasl_name(parts[1][2:]) != name):
            raise self._failed("the authorization id differs from the user name")
        self.client_nonce = parts[3][2:]
        if not _NONCE.fullmatch(self.client_nonce):
            raise self._failed("malformed client nonce")
        extensions = dict(p.split("=", 1) for p in parts[4:] if "=" in p)
        if extensions.get("tokenauth", "").lower() == "true":
            raise self._failed("delegation tokens (tokenauth) are not supported")
        user = self.acl.users.get(name)
        if user is None or not user.enabled:
            raise self._failed(f"as '{name}': no such user, or it is off")
        self.user = user
        self.secrets = user.scram_secrets()
        if not self.secrets:
            raise self._failed(
                f"the user has no SCRAM credentials (its passwords were given as #<sha256> hashes, or it is "
                f"nopass): give its password in clear once (ACL SETUSER {name} >password, or requirepass; "
                "ACL SAVE keeps the secret), or use PLAIN", warning=True)
        self.gs2_header = parts[0] + "," + parts[1] + ","
        self.first_bare = ",".join(parts[2:])
        self.nonce = self.client_nonce + self.server_nonce
        first = self.secrets[0]
        self.server_first = f"r={self.nonce},s={base64.b64encode(first.salt).decode()},i={first.iterations}"
        return self.server_first

    def _final(self, text: str) -> bytes:
        without_proof, _, proof_attr = text.rpartition(",")
        attrs = without_proof.split(",")
        if len(attrs) < 2 or not attrs[0].startswith("c=") or not attrs[1].startswith("r=") \
                or not proof_attr.startswith("p="):
            raise self._failed("malformed client-final message")
        try:
            binding = base64.b64decode(attrs[0][2:], validate=True)
            proof = base64.b64decode(proof_attr[2:], validate=True)
        except ValueError:
            raise self._failed("malformed base64 in the client-final message") from None
        if binding != self.gs2_header.encode():
            raise self._failed("the channel binding differs from the client-first message's header")
        if attrs[1][2:] not in (self.nonce, self.client_nonce + self.nonce):
            raise self._failed("the client-final message's nonce is not the server's")
        auth_message = ",".join((self.first_bare, self.server_first or "", without_proof)).encode()
        if len(proof) == hashlib.sha256().digest_size:
            for secret in self.secrets:
                signature = hmac.digest(secret.stored_key, auth_message, "sha256")
                client_key = (int.from_bytes(proof, "big") ^ int.from_bytes(signature, "big")).to_bytes(len(proof), "big")
                if hmac.compare_digest(hashlib.sha256(client_key).digest(), secret.stored_key):
                    verifier = hmac.digest(secret.server_key, auth_message, "sha256")
                    return b"v=" + base64.b64encode(verifier)
        raise self._failed("invalid client proof (a wrong password)")


_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")


def _sasl_name(escaped: str) -> str | None:
    """RFC 5802's saslname: ``=2C`` is ',' and ``=3D`` is '='; any other '=' is malformed (None)."""
    if re.search(r"=(?!2C|3D)", escaped):
        return None
    return escaped.replace("=2C", ",").replace("=3D", "=")


def _mechanism(name: str, acl: Any, scram_nonce: str | None) -> Any:
    return _Plain(acl) if name == "PLAIN" else _Scram(acl, scram_nonce)


# -- one connection ------------------------------------------------------------------------


class Authenticator:
    """One Kafka connection's authentication (module docstring). ``closing``
    is set (the reason) when the connection must close once the response
    due is sent. ``scram_nonce``: the server's part of SCRAM's nonce
    (tests; random otherwise)."""

    def __init__(self, acl: Any, client: Any, scram_nonce: str | None = None) -> None:
        self.acl = acl
        self.client = client
        self.scram_nonce = scram_nonce
        self.phase = Phase.OPEN if client.authenticated else Phase.HANDSHAKE
        self.mechanism: Any = None
        self.closing: str | None = None

    @property
    def raw_tokens(self) -> bool:
        """The next frame is a bare token (after a v0 handshake)."""
        return self.phase is Phase.RAW

    def frame_limit(self, normal_bytes: int) -> int:
        """The largest frame the client may send now."""
        if self.phase in (Phase.OPEN, Phase.COMPLETE):
            return normal_bytes
        return min(normal_bytes, SASL_MAX_RECEIVE_BYTES)

    def refusal(self, api_key: int, name: str) -> str | None:
        """Why a request of ``api_key`` (API ``name``) closes the connection
        now, without a response; None: handle it."""
        phase = self.phase
        if phase in (Phase.OPEN, Phase.COMPLETE):
            return None
        if phase is Phase.HANDSHAKE:
            if api_key in (API_VERSIONS, SASL_HANDSHAKE):
                return None
            return (f"Unexpected Kafka request of type {api_name(name)} during SASL handshake. (The server needs "
                    "a password, requirepass / ACL users: the client must authenticate with SASL, "
                    "security.protocol SASL_PLAINTEXT or SASL_SSL, sasl.mechanism PLAIN or SCRAM-SHA-256)")
        if phase is Phase.AUTHENTICATE and api_key == SASL_AUTHENTICATE:
            return None
        return f"Unexpected Kafka request of type {api_name(name)} during SASL authentication."

    def handshake(self, mechanism: str, version: int) -> int:
        """SaslHandshake: its error code (the mechanisms are ``MECHANISMS``)."""
        if self.phase is Phase.COMPLETE:
            return E.ILLEGAL_SASL_STATE
        assert self.phase in (Phase.OPEN, Phase.HANDSHAKE)
        if mechanism not in MECHANISMS:
            self.closing = f"Unsupported SASL mechanism {mechanism}"
            return E.UNSUPPORTED_SASL_MECHANISM
        self.mechanism = _mechanism(mechanism, self.acl, self.scram_nonce)
        self.phase = Phase.AUTHENTICATE if version >= 1 else Phase.RAW
        return E.NONE

    def authenticate(self, token: bytes) -> tuple[int, str | None, bytes]:
        """SaslAuthenticate: ``(error code, error message, token)``."""
        if self.phase is not Phase.AUTHENTICATE:  # OPEN or COMPLETE: nothing to authenticate
            return (E.ILLEGAL_SASL_STATE, "SaslAuthenticate request received after successful authentication"
                    if self.phase is Phase.COMPLETE else "SaslAuthenticate request received before SaslHandshake",
                    b"")
        try:
            return E.NONE, None, self._step(token)
        except AuthenticationFailed as e:
            return E.SASL_AUTHENTICATION_FAILED, e.message, b""

    def raw_token(self, token: RawToken) -> bytes:
        """A bare token's answer, framed (a failure: nothing, and ``closing``)."""
        assert self.phase is Phase.RAW
        try:
            reply = self._step(token.data)
        except AuthenticationFailed:
            return b""
        return len(reply).to_bytes(4, "big") + reply

    def _step(self, token: bytes) -> bytes:
        try:
            reply, user = self.mechanism.step(token)
        except AuthenticationFailed as e:
            _failures.write(self.client.addr, e)
            self.closing = f"failed authentication with {self.mechanism.name}"
            raise
        if user is not None:
            self.acl.login(self.client, user)
            self.phase = Phase.COMPLETE
            self.mechanism = None
            log.debug("Kafka client %s authenticated as '%s'", self.client.addr, user.name)
        return reply
