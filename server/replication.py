"""The name server/connection.py imports ``AcksFailed`` under.

The replication runtime moved to cluster/runtime/replication.py (issue 29);
this alias stays until connection.py (changed in parallel) imports it from
there, then goes.
"""

from cluster.runtime.replication import AcksFailed

__all__ = ["AcksFailed"]
