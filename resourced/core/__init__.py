"""The pure allocator: what exists, who holds what, and the decisions. No I/O, no clock."""
