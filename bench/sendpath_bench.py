"""How much sender CPU a 150 KB XREAD-sized reply costs over TCP loopback:
one gathering ``sendmsg`` of mapped file slices (what Partita does since the
view read path) against a header ``send(MSG_MORE)`` plus one ``sendfile``
per batch range (the zero-copy alternative).

Run: ``python -m bench.sendpath_bench`` (about 10 s); prints the sending
thread's CPU per reply for each, twice. Results: bench/RESULTS.md.
"""

from __future__ import annotations

import mmap
import os
import socket
import tempfile
import threading
import time

REPLIES = 20_000
RANGES = 7  # batches a 1000-entry read spans
REPLY_BYTES = 150_000
HEADER = b"*1\r\n*2\r\n\r\n"


def run(mode: str, fd: int, view: memoryview) -> float:
    """Sender CPU µs per reply for ``mode`` (``sendmsg`` or ``sendfile``)."""
    step = REPLY_BYTES // RANGES
    ranges = [(i * (step + 500), step) for i in range(RANGES)]  # gaps: batch headers
    total = len(HEADER) + step * RANGES
    with socket.create_server(("127.0.0.1", 0)) as srv:
        cli = socket.create_connection(srv.getsockname())
        sock, _ = srv.accept()

    def reader() -> None:
        need = total * REPLIES
        while need > 0:
            need -= len(cli.recv(1 << 20))

    thread = threading.Thread(target=reader)
    thread.start()
    started = time.thread_time()
    for _ in range(REPLIES):
        if mode == "sendmsg":
            bufs = [HEADER] + [view[o:o + n] for o, n in ranges]
            sent = sock.sendmsg(bufs)
            if sent < total:
                sock.sendall(b"".join(bufs)[sent:])
        else:
            sock.send(HEADER, socket.MSG_MORE)
            for o, n in ranges:
                while n:
                    k = os.sendfile(sock.fileno(), fd, o, n)
                    o, n = o + k, n - k
    cpu = time.thread_time() - started
    thread.join()
    sock.close()
    cli.close()
    return 1e6 * cpu / REPLIES


def main() -> None:
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(REPLY_BYTES + 100_000))
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        view = memoryview(m)
        for mode in ("sendmsg", "sendfile", "sendmsg", "sendfile"):
            print(f"{mode}: {run(mode, fd, view):.1f} µs sender CPU per reply", flush=True)
        view.release()
        m.close()
        os.close(fd)


if __name__ == "__main__":
    main()
