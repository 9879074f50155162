"""What the daemon and its clients agree on: bus names, amounts, times. No bus library, no I/O."""
