"""The resourced-runner service: a booking's command, started at the booking's start."""
