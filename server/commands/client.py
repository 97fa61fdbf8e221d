"""CLIENT ID / SETNAME / GETNAME / LIST / INFO / KILL / SETINFO / NO-EVICT / NO-TOUCH / HELP.

Owns: these handlers, the CLIENT LIST line format (Redis 7.0 fields plus
7.2's ``lib-name``/``lib-ver``) and Redis's error texts.

Must not know: sockets (a killed client is closed through ``Client.kill``).
"""

from __future__ import annotations

from server.args import parse_int
from server.errors import BAD_CLIENT_NAME, err, syntax_error
from server.registry import command, container
from server.reply import OK, Verbatim
from server.state import valid_client_name

_FLAGS_CONN = "noscript loading stale"
_FLAGS_ADMIN = "admin noscript loading stale"
_ACL = ("@slow", "@connection")
_ACL_ADMIN = ("@admin", "@slow", "@dangerous", "@connection")

container("client", group="connection", since="2.4.0",
          summary="A container for client connection commands.", acl_categories=("@slow",))


@command("client|id", arity=2, flags=_FLAGS_CONN, group="connection", since="5.0.0",
         acl_categories=_ACL, summary="Returns the unique client ID of the connection.",
         syntax="CLIENT ID")
def client_id(ctx, argv):
    """CLIENT ID"""
    return ctx.client.id


@command("client|setname", arity=3, flags=_FLAGS_CONN, group="connection", since="2.6.9",
         acl_categories=_ACL, summary="Sets the connection name.",
         syntax="CLIENT SETNAME connection-name")
def client_setname(ctx, argv):
    """CLIENT SETNAME connection-name"""
    name = argv[2]
    if not valid_client_name(name):
        raise BAD_CLIENT_NAME
    ctx.client.name = name
    return OK


@command("client|getname", arity=2, flags=_FLAGS_CONN, group="connection", since="2.6.9",
         acl_categories=_ACL, summary="Returns the name of the connection.",
         syntax="CLIENT GETNAME")
def client_getname(ctx, argv):
    """CLIENT GETNAME"""
    return ctx.client.name or None


@command("client|setinfo", arity=4, flags="noscript loading stale", group="connection", since="7.2.0",
         acl_categories=_ACL, summary="Sets information specific to the client or connection.",
         syntax="CLIENT SETINFO <LIB-NAME libname | LIB-VER libver>")
def client_setinfo(ctx, argv):
    """CLIENT SETINFO <LIB-NAME libname | LIB-VER libver>"""
    attr = argv[2].lower()
    value = argv[3]
    if attr not in (b"lib-name", b"lib-ver"):
        raise err(f"Unrecognized option '{argv[2].decode('utf-8', 'replace')}'")
    if not all(33 <= b <= 126 for b in value):
        raise err(f"{attr.decode()} cannot contain spaces, newlines or special characters.")
    if attr == b"lib-name":
        ctx.client.lib_name = value
    else:
        ctx.client.lib_ver = value
    return OK


def _on_off(argv) -> bool:
    word = argv[2].lower()
    if word == b"on":
        return True
    if word == b"off":
        return False
    raise syntax_error()


@command("client|no-evict", arity=3, flags=_FLAGS_ADMIN, group="connection", since="7.0.0",
         acl_categories=_ACL_ADMIN, summary="Sets the client eviction mode of the connection.",
         syntax="CLIENT NO-EVICT <ON | OFF>")
def client_no_evict(ctx, argv):
    """CLIENT NO-EVICT <ON | OFF>"""
    ctx.client.no_evict = _on_off(argv)
    return OK


@command("client|no-touch", arity=3, flags="noscript loading stale", group="connection", since="7.2.0",
         acl_categories=_ACL, summary="Controls whether commands sent by the client affect the LRU/LFU of accessed keys.",
         syntax="CLIENT NO-TOUCH <ON | OFF>")
def client_no_touch(ctx, argv):
    """CLIENT NO-TOUCH <ON | OFF>"""
    ctx.client.no_touch = _on_off(argv)
    return OK


@command("client|info", arity=2, flags=_FLAGS_CONN, group="connection", since="6.2.0",
         acl_categories=_ACL, summary="Returns information about the connection.",
         syntax="CLIENT INFO")
def client_info(ctx, argv):
    """CLIENT INFO"""
    return Verbatim(ctx.client.info_line() + "\n")


@command("client|list", arity=-2, flags=_FLAGS_ADMIN, group="connection", since="2.4.0",
         acl_categories=_ACL_ADMIN, summary="Lists open connections.",
         syntax="CLIENT LIST [TYPE <NORMAL | MASTER | REPLICA | PUBSUB>] [ID client-id [client-id ...]]")
def client_list(ctx, argv):
    """CLIENT LIST [TYPE <NORMAL | MASTER | REPLICA | PUBSUB>] [ID client-id [client-id ...]]"""
    clients = list(ctx.server.clients.values())
    if len(argv) == 4 and argv[2].lower() == b"type":
        kind = argv[3].lower()
        if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
            raise err(f"Unknown client type '{argv[3].decode('utf-8', 'replace')}'")
        if kind != b"normal":
            clients = []
    elif len(argv) >= 4 and argv[2].lower() == b"id":
        wanted = set()
        for raw in argv[3:]:
            try:
                cid = parse_int(raw)
            except Exception:
                raise err("Invalid client ID") from None
            if cid <= 0:
                raise err("Invalid client ID")
            wanted.add(cid)
        clients = [c for c in clients if c.id in wanted]
    elif len(argv) != 2:
        raise syntax_error()
    return Verbatim("".join(c.info_line() + "\n" for c in clients))


@command("client|kill", arity=-3, flags=_FLAGS_ADMIN, group="connection", since="2.4.0",
         acl_categories=_ACL_ADMIN, summary="Terminates open connections.",
         syntax="CLIENT KILL <ip:port | <[ID client-id] | [TYPE <NORMAL | MASTER | SLAVE | REPLICA | PUBSUB>] "
                "| [USER username] | [ADDR ip:port] | [LADDR ip:port] | [SKIPME <YES | NO>]> [...]>")
def client_kill(ctx, argv):
    """CLIENT KILL <ip:port | <[ID client-id] | [TYPE ...] | [USER username] | [ADDR ip:port] | [LADDR ip:port] | [SKIPME <YES | NO>]> [...]>"""
    me = ctx.client
    clients = list(ctx.server.clients.values())
    if len(argv) == 3:  # old form: CLIENT KILL ip:port
        addr = argv[2].decode("utf-8", "replace")
        targets = [c for c in clients if c.addr == addr]
        if not targets:
            raise err("No such client")
        _kill(ctx, targets)
        return OK
    if len(argv) % 2 != 0:
        raise syntax_error()
    skipme = True
    filters = []
    for i in range(2, len(argv), 2):
        option = argv[i].lower()
        value = argv[i + 1]
        if option == b"id":
            try:
                cid = parse_int(value)
            except Exception:
                raise err("client-id should be greater than 0") from None
            if cid <= 0:
                raise err("client-id should be greater than 0")
            filters.append(lambda c, cid=cid: c.id == cid)
        elif option == b"type":
            kind = value.lower()
            if kind not in (b"normal", b"master", b"replica", b"slave", b"pubsub"):
                raise err(f"Unknown client type '{value.decode('utf-8', 'replace')}'")
            normal = kind == b"normal"
            filters.append(lambda c, normal=normal: normal)
        elif option == b"user":
            user = value.decode("utf-8", "replace")
            if user != "default":
                raise err(f"No such user '{user}'")
            filters.append(lambda c, user=user: c.user == user)
        elif option == b"addr":
            addr = value.decode("utf-8", "replace")
            filters.append(lambda c, addr=addr: c.addr == addr)
        elif option == b"laddr":
            laddr = value.decode("utf-8", "replace")
            filters.append(lambda c, laddr=laddr: c.laddr == laddr)
        elif option == b"skipme":
            word = value.lower()
            if word == b"yes":
                skipme = True
            elif word == b"no":
                skipme = False
            else:
                raise syntax_error()
        else:
            raise syntax_error()
    targets = [c for c in clients if all(f(c) for f in filters) and not (skipme and c is me)]
    _kill(ctx, targets)
    return len(targets)


def _kill(ctx, targets) -> None:
    for client in targets:
        if client is ctx.client:
            client.close_after_reply = True  # reply first, then close (Redis does the same)
        else:
            client.kill()


@command("client|help", arity=2, flags="loading stale", group="connection", since="5.0.0",
         acl_categories=_ACL, summary="Returns helpful text about the different subcommands.",
         syntax="CLIENT HELP")
def client_help(ctx, argv):
    """CLIENT HELP"""
    from server.reply import Simple

    lines = [
        "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GETNAME",
        "    Return the name of the current connection.",
        "ID",
        "    Return the ID of the current connection.",
        "INFO",
        "    Return information about the current client connection.",
        "KILL <ip:port>",
        "    Kill connection made from <ip:port>.",
        "KILL <option> <value> [<option> <value> [...]]",
        "    Kill connections. Options are:",
        "    * ADDR (<ip:port>|<unixsocket>:0)",
        "      Kill connections made from the specified address",
        "    * LADDR (<ip:port>|<unixsocket>:0)",
        "      Kill connections made to specified local address",
        "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
        "      Kill connections by type.",
        "    * USER <username>",
        "      Kill connections authenticated by <username>.",
        "    * SKIPME (YES|NO)",
        "      Skip killing current connection (default: yes).",
        "    * ID <client-id>",
        "      Kill connections by client id.",
        "LIST [options ...]",
        "    Return information about client connections. Options:",
        "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)",
        "      Return clients of specified type.",
        "    * ID <client-id> [<client-id> ...]",
        "      Return clients with the given ids.",
        "SETNAME <name>",
        "    Assign the name <name> to the current connection.",
        "SETINFO <LIB-NAME|LIB-VER> <value>",
        "    Set client library name or version.",
        "NO-EVICT (ON|OFF)",
        "    Protect current client connection from eviction.",
        "NO-TOUCH (ON|OFF)",
        "    Will not touch LRU/LFU stats when this mode is on.",
        "HELP",
        "    Prints this help.",
    ]
    return [Simple(line) for line in lines]
