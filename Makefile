# The two entry points of the README, each doing all set-up first.
.PHONY: setup demo test

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/harvest demo

# Two test processes for everything that asserts no timing (one torch thread each, so two processes on two
# cores do not oversubscribe them); then the timing tests alone on the whole machine. Both always run.
test: setup
	@status=0; \
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not timing" || status=$$?; \
	.venv/bin/python -m pytest -q -m timing || status=$$?; \
	exit $$status
