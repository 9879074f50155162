"""Slurm's side: the prolog and epilog hooks, and the export of what Slurm booked."""
