"""The cluster runtime of a node: replication's tasks and waits
(``replication``), the controller quorum's driver (``controller_driver``),
the forwarded XADD (``forwarding``) and topic reads across nodes
(``fanout``). Trio, no sockets, no protocol: nodes reach each other through
``cluster.peer`` links a front-end injects."""
