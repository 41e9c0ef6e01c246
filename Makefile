# The two entry points README names. Both install what is missing first (scripts/setup.sh).
.PHONY: setup serve test

setup:
	./scripts/setup.sh

serve: setup
	.venv/bin/lab serve

test:
	LAB_MODELS="smollm2 qwen2.5 gemma3" ./scripts/setup.sh
	OPENBLAS_NUM_THREADS=1 .venv/bin/pytest -q --durations=25
