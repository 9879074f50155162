"""The engine: the daemon's state, the core's decisions applied to it, and what it tracks."""
