"""What the daemon keeps on disk: the claims log, the calendar log, the usage database."""
