# Course kit entry points. Everything runs inside a local .venv.
#
# TORCH selects the torch requirement installed before the package itself.
# The default pins the CPU wheel; override on a GPU machine with
# `make TORCH=torch`, or keep an already-installed torch with `make TORCH=`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
# Two workers, one per core (CI has two): the suite waits on processes much of the time.
# A test file stays on one worker, with its module-scoped clusters and gradings.
PYTEST_ARGS ?= -n 2 --dist loadfile
VENV := .venv
VPY := $(VENV)/bin/python
VPIP := $(VENV)/bin/pip
INSTALLED := $(VENV)/.installed

.PHONY: install demo test test-quick bench clean sandbox-tool browser-tool mpi-tool hub-tool hub notebooks site

$(VENV):
	$(PYTHON) -m venv $(VENV)

# Order-only on $(VENV): the directory's mtime changes on every install.
$(INSTALLED): pyproject.toml | $(VENV)
ifneq ($(strip $(TORCH)),)
	$(VPIP) install -q "$(TORCH)"
endif
	$(VPIP) install -q -e ".[dev]"
	touch $@

install: $(INSTALLED)

demo: $(INSTALLED) sandbox-tool
	$(VPY) -m grader demo

test: $(INSTALLED) sandbox-tool browser-tool mpi-tool hub-tool
	$(VPY) -m mypy
	$(VPY) -m pytest $(PYTEST_ARGS)

# Day-to-day: the suite without the tests marked slow (grading, notebooks), browser, hub or
# cluster (engines), in under 5 minutes on 2 cores; `make test` still runs everything.
QUICK := not slow and not browser and not hub and not cluster
test-quick: $(INSTALLED)
	$(VPY) -m mypy
	$(VPY) -m pytest $(PYTEST_ARGS) -m "$(QUICK)"

# $(call apt-tool,COMMANDS,DEBIAN PACKAGES,WHAT FOR): install the packages unless every command
# is already there (with sudo when not root; the package lists are refreshed only if needed).
define apt-tool
	@for c in $(1); do command -v $$c >/dev/null || missing=1; done; [ -z "$$missing" ] || { \
		echo "installing $(2), $(3)"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get install -y -qq $(2) >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(2); }; }
endef

# The grader runs each submission in bubblewrap.
sandbox-tool:
	$(call apt-tool,bwrap,bubblewrap,the grader's sandbox)

# The browser tests (the course website, JupyterLab, the hub) drive Debian's Chromium with
# Playwright: Playwright's own browser download cannot work offline.
browser-tool:
	$(call apt-tool,chromium,chromium,for the browser tests)

# Engines launched by mpiexec and by Slurm (tests/test_engines_beyond_one_machine.py): Debian's
# Open MPI, and Slurm with munge (the test starts its own one-node cluster); mpi4py is a dev extra.
mpi-tool:
	$(call apt-tool,mpiexec slurmctld,openmpi-bin slurm-wlm,for engines launched by mpiexec and sbatch)

# The course hub's proxy (deploy/): configurable-http-proxy from the npm registry, in build/.
HUB_PROXY := build/hub-proxy/node_modules/.bin/configurable-http-proxy
hub-tool: $(HUB_PROXY)
$(HUB_PROXY):
	npm install --silent --no-audit --no-fund --prefix build/hub-proxy configurable-http-proxy@4

# The course hub on this machine (as root: it spawns each user's server as that user).
hub: $(INSTALLED) hub-tool
	$(VPY) deploy/start.py

# The course website, from the stored notebooks (never executed here): build/site/index.html.
site: $(INSTALLED)
	$(VPY) site/build.py

# Re-execute the course/ and solutions/ notebooks and store their outputs (prints the time),
# then release labs/ again: a release carries the solutions' record of execution (not outputs).
# One notebook or a few: `make notebooks NOTEBOOKS=course/03_collectives.ipynb`.
NOTEBOOKS ?=
notebooks: $(INSTALLED)
	$(VPY) -m grader.notebooks $(NOTEBOOKS)
	$(VPY) -m grader release

bench: $(INSTALLED)
	@set -e; for f in $(wildcard benchmarks/*.py); do \
		echo "== $$f"; $(VPY) $$f; \
	done

# On a CUDA machine (CI has none), in a few minutes: NCCL ranks, DataParallel, ZeRO, the
# launcher, the activation formula against CUDA's allocator and LossScaler against GradScaler,
# as a table of pass / fail / skip. Elsewhere the GPU rows are skipped, saying so.
.PHONY: gpu-check
gpu-check: $(INSTALLED)
	$(VPY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
