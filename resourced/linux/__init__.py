"""The Linux host: sd_notify and the journal, XDG paths, the private bus, the service installer."""
