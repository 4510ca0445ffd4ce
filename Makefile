# make demo        set up, make the synthetic data set if missing, train the demo config (GPU if present)
# make test        set up and run the whole test suite (what CI runs), the Slurm and container tests included
# make test-fast   the core of the suite in minutes: pytest alone added to .venv, no system packages
# make test-slurm  only the tests that submit submit_pm.sh to a real two-node Slurm (run as root)
# make figures     remake tutorial_images/ from the committed example_logs/
# make notes       remake benchmarks/results/README.md, the index of every committed result (benchmarks/notes.py)
# make words       how long the tutorial is to read: words, sentences and paragraphs per file (docs/prose.py)
# make data        only the synthetic data set;  make clean   remove the environment, data (data_large too) and runs

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# Where torch comes from on Linux without an NVIDIA driver: PyTorch's CPU wheels (see the venv's rule).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
PY := $(VENV)/bin/python
RUN_NUM ?= $(shell date +%Y%m%d-%H%M%S)
DATA := data/synthetic_train.h5 data/synthetic_valid.h5

# test-fast: no end-to-end runs, compilation or multi-process tests (marked slow), no GPU, none of the tests that need more than
# requirements.txt and pytest (Slurm, containers, the notebook, DALI, Nsight Systems), and none of the modules
# that train or all-reduce on several gloo ranks under torchrun (DDP, FSDP, domain parallelism, the step spread).
FAST_TESTS := -m "not slow and not gpu" --ignore=tests/test_slurm.py --ignore=tests/test_docker.py \
	--ignore=tests/test_notebook.py --ignore=tests/test_data_loader_dali.py --ignore=tests/test_nsight.py \
	--ignore=tests/test_distributed.py --ignore=tests/test_domain_parallel.py --ignore=tests/test_allreduce.py \
	--ignore=tests/test_step_spread.py

.PHONY: demo test test-fast test-slurm figures notes words data clean

# The demo's CPU threads: its losses' last digits depend on the thread count alone (README), and 2
# threads give the README's. DEMO_THREADS=8 is quicker on a larger CPU, with other last digits.
DEMO_THREADS ?= 2

demo: $(VENV)/.installed $(DATA)
	OMP_NUM_THREADS=$(DEMO_THREADS) $(PY) train.py --config=demo --run_num=$(RUN_NUM) $(ARGS)

test: $(VENV)/.installed-test
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-pytest
	$(PY) -m pytest $(FAST_TESTS) $(PYTEST_ARGS)

test-slurm: $(VENV)/.installed-test
	$(PY) -m pytest tests/test_slurm.py $(PYTEST_ARGS)

figures: $(VENV)/.installed-figures
	$(PY) -m figures.tutorial_images

notes: $(VENV)/.installed
	$(PY) -m benchmarks.notes

words:
	$(PYTHON) -m docs.prose

data: $(DATA)

$(DATA): | $(VENV)/.installed
	$(PY) -m utils.generate_data --out_dir data

# torch's index, as pip's option. PyPI's torch for Linux is the CUDA build: with its NVIDIA libraries,
# 2.7 GB of wheels on x86-64, where PyTorch's CPU build is 0.2 GB. So on Linux without an NVIDIA driver
# (no nvidia-smi, no /proc/driver/nvidia) this shell snippet prints "--index-url $(TORCH_INDEX_URL)". It
# prints nothing (pip's default index) on macOS, with a driver, with TORCH_INDEX_URL= (empty), and when
# that index does not answer within 5 s: then it says so in one line.
torch_index_option = if [ -n "$(TORCH_INDEX_URL)" ] && [ "$$(uname -s)" = Linux ] \
	&& [ ! -e /proc/driver/nvidia ] && ! command -v nvidia-smi >/dev/null; then \
	if timeout 5 $(PYTHON) -c 'import sys, urllib.request as r; r.urlopen(r.Request(sys.argv[1], method="HEAD"))' \
		"$(patsubst %/,%,$(TORCH_INDEX_URL))/torch/" 2>/dev/null; then echo "--index-url $(TORCH_INDEX_URL)"; \
	else echo "note: $(TORCH_INDEX_URL) did not answer within 5 s, so torch comes from pip's default index" \
		"(PyPI's torch for Linux is the CUDA build: 2.7 GB on x86-64)." >&2; fi; fi

# The virtual environment. torch comes first, pinned to the tested version unless one is already
# importable (venvs made with VENV_FLAGS=--system-site-packages see a container's torch).
$(VENV)/.installed: requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
		{ echo "error: Python 3.10 or newer is needed (found $$($(PYTHON) --version))."; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV) || { rm -rf $(VENV); echo "error: $(PYTHON) could not \
		make the virtual environment $(VENV): install its venv module (Debian, Ubuntu: apt-get install python3-venv) \
		or name another Python, e.g. make demo PYTHON=python3.12."; exit 1; }
	@$(PY) -c 'import torch' 2>/dev/null || { index=$$($(torch_index_option)); \
		echo "$(PY) -m pip install --quiet $${index:+$$index }$(TORCH)"; $(PY) -m pip install --quiet $$index "$(TORCH)"; }
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# make figures needs Playwright alone (the TensorBoard screenshot; the browser is the system's Chromium),
# not the test set (DALI alone is about 1 GB). make test's set-up includes it.
$(VENV)/.installed-figures: $(VENV)/.installed
	$(PY) -m pip install --quiet playwright
	touch $@

# make test-fast needs pytest alone beside requirements.txt (the test set's DALI is about 1 GB).
$(VENV)/.installed-pytest: $(VENV)/.installed
	$(PY) -m pip install --quiet pytest
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PY) -m pip install --quiet -r requirements-test.txt
	touch $@ $(VENV)/.installed-figures $(VENV)/.installed-pytest

clean:
	rm -rf $(VENV) data data_large runs
