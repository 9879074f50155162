"""What runs only inside ``resourced``, the daemon: its start (``python -m
resourced.daemon``), engine, bus interfaces, stores and health monitor."""
