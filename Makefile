# make demo: install everything and run the demo on simulated GPUs (a private bus).
# make test: install everything and run the whole test suite. As root it includes the
#   multi-user tests (tests/system: real polkitd, test users, the daemon as `resourced`);
#   anyone else sees them skipped, with the reason.
# make test-system: only those.
# Each target is the ./dev script's (which needs no make): one way to set up.

.PHONY: demo test test-system bench clean

demo test test-system bench clean:
	./dev $@
