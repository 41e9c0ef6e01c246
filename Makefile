# The entry points README names. Each installs what is missing first (scripts/setup.sh).
.PHONY: setup serve test test-all

setup:
	./scripts/setup.sh

serve: setup
	.venv/bin/lab serve

# make test: the native tests on both cores (pytest-xdist, a file to a worker, so module fixtures load once), then the
# page's tests, also a file to a worker (each worker's Chromium leaves a quarter of the two cores idle alone: 4:11
# against 5:00): Playwright's sync API leaves an event loop on the main thread that the native tests' asyncio.run
# cannot share, so the halves never share a process. Both run whatever the first's outcome; either failing fails it.
# make test-all: the same with --slow, the deep set (every model x every fixture, the long parity runs, the big load
# test, the quantized-reference checks on the real models: tests/conftest.py `slow`).
PYTEST = OPENBLAS_NUM_THREADS=1 .venv/bin/pytest -q --durations=25 $(ARGS)

test:
	LAB_MODELS="smollm2 qwen2.5 gemma3" ./scripts/setup.sh
	$(PYTEST) -n 2 --dist loadfile tests/engine tests/kernels tests/unit tests/server; a=$$?; \
	$(PYTEST) -n 2 --dist loadfile tests/browser; b=$$?; \
	exit $$((a || b))

test-all:
	$(MAKE) test ARGS=--slow
