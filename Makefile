# The two entry points of the README, each doing all set-up first.
.PHONY: setup demo test

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/harvest demo

test: setup
	.venv/bin/python -m pytest -q
