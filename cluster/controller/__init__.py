"""The controller quorum: cluster metadata replicated with Raft among the instances."""
