"""Facts about processes and the host, read from the kernel at the edge of the daemon."""
