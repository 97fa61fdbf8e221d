"""SASL on the Kafka port without sockets (server/kafka_front/sasl.py): the SCRAM-SHA-256
exchange against RFC 7677's test vector and the ``scramp`` client, PLAIN, which requests a
connection may send in each phase, the log of failed authentications."""

from __future__ import annotations

import base64
import logging

import pytest
import scramp

from server.acl import AclRegistry, hash_password, scram_secret
from server.kafka import errors as E
from server.kafka_front import sasl
from server.kafka_front.sasl import Authenticator, RawToken
from server.state import Client

# RFC 7677, section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")

SCRAM_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"


def new_client(acl: AclRegistry) -> Client:
    client = Client(1, "test:1", "test:0", -1)
    client.authenticated = acl.default_authenticated()
    return client


def authenticator(acl: AclRegistry, mechanism: str, version: int = 1, **kwargs) -> Authenticator:
    auth = Authenticator(acl, new_client(acl), **kwargs)
    assert auth.handshake(mechanism, version) == E.NONE
    return auth


def scram_login(acl: AclRegistry, user: str, password: str) -> tuple[Authenticator, list]:
    """A whole SCRAM exchange driven by ``scramp``'s client; the answers."""
    auth = authenticator(acl, "SCRAM-SHA-256")
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    first = auth.authenticate(client.get_client_first().encode())
    answers = [first]
    if first[0] == E.NONE:
        client.set_server_first(first[2].decode())
        final = auth.authenticate(client.get_client_final().encode())
        answers.append(final)
        if final[0] == E.NONE:
            client.set_server_final(final[2].decode())  # the server proved it knows the secret too
    return auth, answers


# -- SCRAM-SHA-256 ---------------------------------------------------------------------------


def test_scram_sha_256_follows_rfc_7677s_test_vector():
    acl = AclRegistry("secret")
    acl.setuser("user", ["on", "#" + hash_password(b"pencil"), "~*", "+@all"])
    assert acl.users["user"].add_scram_secret(hash_password(b"pencil"), scram_secret(b"pencil", RFC_SALT, 4096))
    auth = authenticator(acl, "SCRAM-SHA-256", scram_nonce=RFC_SERVER_NONCE)
    assert auth.authenticate(RFC_CLIENT_FIRST) == (E.NONE, None, RFC_SERVER_FIRST)
    assert auth.authenticate(RFC_CLIENT_FINAL) == (E.NONE, None, RFC_SERVER_FINAL)
    assert auth.client.authenticated and auth.client.user == "user" and auth.closing is None
    # once authenticated, the SASL APIs answer ILLEGAL_SASL_STATE and the connection goes on
    assert auth.authenticate(RFC_CLIENT_FINAL)[0] == E.ILLEGAL_SASL_STATE
    assert auth.handshake("PLAIN", 1) == E.ILLEGAL_SASL_STATE and auth.closing is None


def test_scram_with_a_password_set_in_clear_and_a_wrong_one():
    acl = AclRegistry("secret")
    acl.setuser("alice", ["on", ">wonderland", "~*", "+@all"])
    auth, answers = scram_login(acl, "alice", "wonderland")
    assert [a[0] for a in answers] == [E.NONE, E.NONE] and auth.client.user == "alice"
    auth, answers = scram_login(acl, "alice", "looking-glass")
    assert answers[-1] == (E.SASL_AUTHENTICATION_FAILED, SCRAM_FAILED, b"")
    assert auth.closing and not auth.client.authenticated
    # an unknown user gets the same answer (the client cannot tell whether the user exists)
    auth, answers = scram_login(acl, "nobody", "x")
    assert answers == [(E.SASL_AUTHENTICATION_FAILED, SCRAM_FAILED, b"")] and auth.closing


def test_scram_checks_every_password_of_a_user():
    """Redis users may have several passwords (rotation); they share a salt, so one exchange
    can check the proof against each."""
    acl = AclRegistry()
    acl.setuser("app", ["on", ">old", ">new", "~*", "+@all"])
    for password in ("old", "new"):
        auth, answers = scram_login(acl, "app", password)
        assert [a[0] for a in answers] == [E.NONE, E.NONE], password
    acl.setuser("app", ["<old"])
    assert scram_login(acl, "app", "old")[1][-1][0] == E.SASL_AUTHENTICATION_FAILED
    assert scram_login(acl, "app", "new")[1][-1][0] == E.NONE


def test_scram_is_refused_with_a_clear_log_for_a_user_known_only_by_its_hash(caplog, monkeypatch):
    monkeypatch.setattr(sasl, "FAILURE_LOG_S", 0)  # (other tests' failures are not in the way)
    acl = AclRegistry()
    acl.setuser("hashed", ["on", "#" + hash_password(b"pw"), "~*", "+@all"])
    with caplog.at_level(logging.INFO, "partita.kafka"):
        auth, answers = scram_login(acl, "hashed", "pw")
    assert answers == [(E.SASL_AUTHENTICATION_FAILED, SCRAM_FAILED, b"")]
    [record] = [r for r in caplog.records if "failed authentication" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "'hashed': the user has no SCRAM credentials" in record.getMessage()
    assert "ACL SETUSER hashed >password" in record.getMessage()
    # PLAIN checks the hash
    auth = authenticator(acl, "PLAIN")
    assert auth.authenticate(b"\0hashed\0pw") == (E.NONE, None, b"") and auth.client.user == "hashed"


def test_scram_refuses_a_disabled_user_and_a_nopass_one():
    acl = AclRegistry()
    acl.setuser("off", ["off", ">pw", "~*", "+@all"])
    acl.setuser("free", ["on", "nopass", "~*", "+@all"])
    assert scram_login(acl, "off", "pw")[1][-1][0] == E.SASL_AUTHENTICATION_FAILED
    assert scram_login(acl, "free", "anything")[1][-1][0] == E.SASL_AUTHENTICATION_FAILED


# -- PLAIN ------------------------------------------------------------------------------------


@pytest.mark.parametrize("token,message", [
    (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
    (b"\0nobody\0pw", "Authentication failed: Invalid username or password"),
    (b"\0off\0pw", "Authentication failed: Invalid username or password"),
    (b"alice\0pw", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\0\0pw", "Authentication failed: username not specified"),
    (b"\0alice\0", "Authentication failed: password not specified"),
    (b"bob\0alice\0pw", "Authentication failed: Client requested an authorization id that is different from username"),
])
def test_plain_refusals_are_kafkas(token, message):
    acl = AclRegistry("secret")
    acl.setuser("alice", ["on", ">pw", "~*", "+@all"])
    acl.setuser("off", ["off", ">pw"])
    auth = authenticator(acl, "PLAIN")
    assert auth.authenticate(token) == (E.SASL_AUTHENTICATION_FAILED, message, b"")
    assert auth.closing and not auth.client.authenticated


def test_plain_logs_in_as_the_acl_user_with_its_rules():
    acl = AclRegistry("secret")
    acl.setuser("reader", ["on", ">pw", "~orders*", "-@all", "+@read"])
    auth = authenticator(acl, "PLAIN")
    assert auth.authenticate(b"reader\0reader\0pw") == (E.NONE, None, b"")
    assert auth.client.user == "reader" and auth.client.acl is acl.users["reader"]
    auth = authenticator(acl, "PLAIN")
    assert auth.authenticate(b"\0default\0secret")[0] == E.NONE
    assert auth.client.user == "default" and auth.client.acl is None  # unrestricted: no checks at all


# -- phases -----------------------------------------------------------------------------------


def test_what_a_connection_may_send_before_it_authenticated():
    acl = AclRegistry("secret")
    acl.setuser("alice", ["on", ">pw", "~*", "+@all"])
    auth = Authenticator(acl, new_client(acl))
    assert auth.refusal(18, "ApiVersions") is None and auth.refusal(17, "SaslHandshake") is None
    assert auth.refusal(3, "Metadata").startswith("Unexpected Kafka request of type METADATA during SASL handshake.")
    assert auth.refusal(36, "SaslAuthenticate").startswith("Unexpected Kafka request of type SASL_AUTHENTICATE")
    assert auth.frame_limit(100 << 20) == 512 * 1024
    assert auth.handshake("PLAIN", 1) == E.NONE
    assert auth.refusal(36, "SaslAuthenticate") is None
    assert auth.refusal(2, "ListOffsets") == "Unexpected Kafka request of type LIST_OFFSETS during SASL authentication."
    assert auth.refusal(18, "ApiVersions") is not None
    assert auth.authenticate(b"\0alice\0pw")[0] == E.NONE
    assert auth.refusal(3, "Metadata") is None and auth.frame_limit(100 << 20) == 100 << 20


def test_an_unknown_mechanism_is_answered_then_closes():
    acl = AclRegistry("secret")
    auth = Authenticator(acl, new_client(acl))
    assert auth.handshake("GSSAPI", 1) == E.UNSUPPORTED_SASL_MECHANISM
    assert auth.closing == "Unsupported SASL mechanism GSSAPI"


def test_a_connection_of_a_default_user_without_password_is_open_and_may_still_authenticate():
    acl = AclRegistry()
    acl.setuser("alice", ["on", ">pw", "~a*", "+@all"])
    auth = Authenticator(acl, new_client(acl))
    assert auth.refusal(0, "Produce") is None and auth.frame_limit(100 << 20) == 100 << 20
    assert auth.authenticate(b"\0alice\0pw")[0] == E.ILLEGAL_SASL_STATE  # no handshake yet
    assert auth.handshake("SCRAM-SHA-256", 1) == E.NONE
    assert auth.refusal(0, "Produce") is not None  # mid-exchange: SaslAuthenticate only


def test_v0_handshake_takes_bare_tokens():
    acl = AclRegistry("secret")
    auth = authenticator(acl, "PLAIN", version=0)
    assert auth.raw_tokens
    assert auth.raw_token(RawToken(b"\0default\0secret")) == b"\0\0\0\0"  # an empty token, framed
    assert not auth.raw_tokens and auth.client.authenticated
    auth = authenticator(acl, "PLAIN", version=0)
    assert auth.raw_token(RawToken(b"\0default\0wrong")) == b"" and auth.closing  # a failure just closes


def test_failed_authentications_are_logged_at_most_once_a_second(caplog, monkeypatch):
    now_s = [1e12]
    monkeypatch.setattr(sasl.time, "monotonic", lambda: now_s[0])
    acl = AclRegistry("pw")
    with caplog.at_level(logging.INFO, "partita.kafka"):
        for _ in range(3):
            authenticator(acl, "PLAIN").authenticate(b"\0default\0wrong")
        now_s[0] += 1.0
        authenticator(acl, "PLAIN").authenticate(b"\0default\0wrong")
    lines = [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]
    first = ("Kafka client test:1: failed authentication (PLAIN as 'default': invalid username or password, or "
             "the user is off)")
    # (the first line may count failures of the tests before this one)
    assert len(lines) == 2 and lines[0].startswith(first)
    assert lines[1] == first + " (2 more failed authentications since the last line)"
