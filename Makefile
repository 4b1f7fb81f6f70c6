# The two entry points of the README, each doing all set-up first, and the developer's check.
.PHONY: setup demo test check

# Two test processes, one torch thread each, so two processes on two cores do not oversubscribe them. No
# test asserts a duration or a share of steps (those are `harvest bench`'s), so nothing needs the host alone.
PYTEST = OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -n 2 --dist loadfile $(PYTEST_FLAGS)

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/harvest demo

# Everything: the CPU tier with real SGLang workers, trainers and the bundle's CPU twin (`-m gpu` is skipped
# without a GPU).
test: setup
	$(PYTEST)

# The loop after every change: everything that starts no SGLang worker, no trainer and no bundle build.
check: setup
	$(PYTEST) -m "not sglang and not trainer and not bundle"
