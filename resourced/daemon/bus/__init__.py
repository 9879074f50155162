"""The D-Bus adapter (dbus-fast): identity, error mapping, one module per interface."""
