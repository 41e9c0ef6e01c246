# The two entry points README names. Both install what is missing first (scripts/setup.sh).
.PHONY: setup serve test

setup:
	./scripts/setup.sh

serve: setup
	.venv/bin/lab serve

# make test: the native tests on both cores (pytest-xdist, a file to a worker, so module fixtures load once; the
# engine's files first, the longest, so that the short ones fill in around them), then the page's tests: Playwright's
# sync API leaves an event loop on the main thread that the native tests' asyncio.run cannot share, so they never
# share a process. Both halves run whatever the first's outcome; either failing fails the target.
test:
	LAB_MODELS="smollm2 qwen2.5 gemma3" ./scripts/setup.sh
	OPENBLAS_NUM_THREADS=1 .venv/bin/pytest -q --durations=25 -n 2 --dist loadfile \
	    tests/engine tests/kernels tests/unit tests/server; a=$$?; \
	OPENBLAS_NUM_THREADS=1 .venv/bin/pytest -q --durations=25 tests/browser; b=$$?; \
	exit $$((a || b))
