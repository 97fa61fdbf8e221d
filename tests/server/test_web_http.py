"""Who may read the HTTP port (server/web/http.py ``authorize``), against real
ACL users: no password, ``requirepass``, users with and without @read."""

from __future__ import annotations

import base64

from server.acl import AclRegistry
from server.web.http import authorize


def _basic(name: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{name}:{password}".encode())


def test_no_password_reads_as_default():
    user, refused = authorize(AclRegistry(), None)
    assert refused is None and user.name == "default"


def test_requirepass_needs_the_password():
    acl = AclRegistry(requirepass="pw")
    assert authorize(acl, None)[1].status == 401
    assert authorize(acl, _basic("default", "nope"))[1].status == 401
    assert authorize(acl, _basic("default", "pw"))[0].name == "default"
    assert authorize(acl, _basic("", "pw"))[0].name == "default"  # AUTH <password>
    for bad in (b"Basic !!!", b"Basic " + base64.b64encode(b"no-colon"), b"Digest x", b"Basic"):
        user, refused = authorize(acl, bad)
        assert user is None and refused.status == 401, bad
        assert dict(refused.headers)[b"WWW-Authenticate"].startswith(b"Basic realm=")


def test_users_need_every_read_command():
    acl = AclRegistry(requirepass="pw")
    acl.setuser("prom", ["on", ">p", "~orders*", "-@all", "+@read"])
    acl.setuser("writer", ["on", ">w", "~*", "-@all", "+xadd"])
    acl.setuser("almost", ["on", ">a", "~*", "+@read", "-xinfo|groups"])
    acl.setuser("off", ["off", ">o", "~*", "+@all"])
    user, refused = authorize(acl, _basic("prom", "p"))
    assert refused is None and user.may_access_key(b"orders") and not user.may_access_key(b"secrets")
    assert authorize(acl, _basic("writer", "w"))[1].status == 403
    assert authorize(acl, _basic("almost", "a"))[1].status == 403
    assert authorize(acl, _basic("off", "o"))[1].status == 401
