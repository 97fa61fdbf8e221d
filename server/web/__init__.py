"""The HTTP front-end: Prometheus metrics (``/metrics``) and the web console
(``/``, polling ``/api/status``), on ``http-port`` (docs/metrics.md).

``http`` owns the listener, h11 and who may read; ``metrics`` the Prometheus
names; ``console`` the page's files and its JSON. All of them read the
broker through ``cluster.broker.status`` and the server's statistics; none
changes anything.
"""

from server.web.http import bind, serve

__all__ = ["bind", "serve"]
