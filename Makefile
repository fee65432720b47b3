# The two entry points (see README): `make bench` and `make test`. Both set up .venv first.
.PHONY: setup bench test
ARGS ?=

setup:
	./scripts/setup.sh

# warpforge bench on a GPU; on a machine without one, the interpreter correctness run.
bench: setup
	.venv/bin/warpforge bench $(ARGS)

test: setup
	.venv/bin/python -m pytest -q -n 2 $(ARGS)
