"""The ``partita`` command: ``partita [path/to/partita.conf] [--name value ...]``.

Owns: turning the command line into a ``Config`` (everything validated
before anything touches the disk), logging set-up, SIGTERM/SIGINT handling,
and the exit code (0 after a clean shutdown, 1 for a bad configuration or a
failed start).

Must not know: anything the server does once running (``server.app``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import trio

from server.config import Config, ConfigError, help_text, parse_command_line

_LEVELS = {"debug": logging.DEBUG, "verbose": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING}


class _RedisStyleFormatter(logging.Formatter):
    """``pid:M 02 Dec 2026 14:19:24.123 * message``, as redis-server logs."""

    _marks = {logging.DEBUG: ".", logging.INFO: "*", logging.WARNING: "#", logging.ERROR: "#", logging.CRITICAL: "#"}

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%d %b %Y %H:%M:%S") + f".{int(record.msecs):03d}"
        text = f"{os.getpid()}:M {stamp} {self._marks.get(record.levelno, '*')} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(config: Config) -> None:
    handler: logging.Handler
    if config.logfile:
        handler = logging.FileHandler(config.logfile)
    else:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_RedisStyleFormatter())
    root = logging.getLogger("partita")
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(config.loglevel, logging.INFO))
    root.propagate = False

    def on_change(name: str, value: object) -> None:
        if name == "loglevel":
            root.setLevel(_LEVELS.get(str(value), logging.INFO))

    config.on_change(on_change)


async def run(config: Config) -> None:
    """Serve until SHUTDOWN, SIGTERM or SIGINT; return after a clean stop."""
    from server import app

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                await app.serve(config, task_status=started)
                nursery.cancel_scope.cancel()

            holder: dict = {}
            ready = trio.Event()

            class _Started:
                def started(self, value=None) -> None:
                    holder["state"] = value
                    ready.set()

            started = _Started()
            nursery.start_soon(serve_then_stop)
            async for signum in signals:
                logging.getLogger("partita").info(
                    "Received %s scheduling shutdown...", signal.Signals(signum).name
                )
                if ready.is_set():
                    holder["state"].shutdown_requested.set()
                else:
                    nursery.cancel_scope.cancel()
                break
            # A second signal while draining forces the exit.
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(help_text(), end="")
        return 0
    if args and args[0] in ("-v", "--version"):
        from server.state import REDIS_VERSION, partita_version

        print(f"Partita v={partita_version()} redis_version={REDIS_VERSION}")
        return 0
    try:
        path, overrides = parse_command_line(args)
        config = Config.load(path, overrides)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        return 1
    # A bad cluster description stops the start before anything is touched.
    from cluster.nodes import ClusterConfigError, Placement, check_single_node, parse_cluster_nodes
    from cluster.runtime.controller_driver import check_controller_config

    try:
        if config.cluster_nodes:
            nodes = parse_cluster_nodes(config.cluster_nodes)
            Placement(nodes, config.node_id, config.replication_factor)
            check_controller_config(config, [n.id for n in nodes])
        else:
            check_single_node(config)
    except ClusterConfigError as e:
        print(f"Fatal: cluster configuration: {e}", file=sys.stderr)
        return 1
    try:
        setup_logging(config)
    except OSError as e:  # as Redis, a log file that can't be opened stops the start
        print(f"*** FATAL CONFIG ERROR ***\nlogfile '{config.logfile}': Can't open the log file: {e.strerror}",
              file=sys.stderr)
        return 1
    try:
        trio.run(run, config)
    except BaseExceptionGroup as group:
        for e in _leaves(group):
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                continue
            logging.getLogger("partita").error("Fatal: %s", e, exc_info=not _explains_itself(e))
        return 1
    except Exception as e:
        logging.getLogger("partita").error("Fatal: %s", e, exc_info=not _explains_itself(e))
        return 1
    return 0


def _leaves(group: BaseExceptionGroup):
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        else:
            yield e


def _explains_itself(e: BaseException) -> bool:
    """A refusal to start that explains itself (busy port, a file or
    directory the system refused, a data directory in use or unusable,
    damaged topic metadata, bad cluster state, a bad aclfile, a TLS
    setting that can't work): logged as one line, no traceback. Any other
    error that ends the server (an ``OSError`` of a socket among them) is
    logged with its traceback: it is a bug to find."""
    from cluster.nodes import ClusterConfigError
    from cluster.topics import TopicMetaError
    from server.acl import AclError
    from server.app import DataDirError
    from server.tls import TlsConfigError
    from cluster.runtime.controller_driver import ControllerHalted

    return (type(e).__name__ == "BindError" or (isinstance(e, OSError) and e.filename is not None)
            or isinstance(e, (TopicMetaError, ClusterConfigError, ControllerHalted, AclError, DataDirError,
                              TlsConfigError)))


if __name__ == "__main__":
    sys.exit(main())
