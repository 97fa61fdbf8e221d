"""The peer link: what cluster nodes say to each other (``messages``), how a
node reaches another (``link``: the ``PeerLink`` protocol, the links per node
and purpose, an in-memory implementation for tests), and how a node answers
(``service``). No encoding and no sockets here: ``server/peer_resp.py`` is the
RESP implementation over the cluster bus."""
