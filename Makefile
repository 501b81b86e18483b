# The two commands of the set-up promise:
#   make demo   the sidecar doing its job against a local control plane
#   make test   every test (builds the test bed on first use, then cached)
.PHONY: test demo testbed build lint chaos bench bench-quick bench-scale image model model-deep

testbed:
	@bash testbed/build.sh

build:
	cargo build --workspace --bins

test:
	@bash scripts/test.sh

demo:
	@bash scripts/demo.sh

# The container image: static musl binaries for amd64 and arm64 (arm64
# cross-built with zig) on upstream's base (FROM scratch when that base is not
# in local storage), one manifest list, a CycloneDX SBOM in each image and
# beside it. ARCHES=all for upstream's five (amd64 arm64 arm ppc64le s390x);
# IMAGE=, ARCHES=, BASE=, ENGINE=docker: see scripts/image.sh.
image:
	@bash scripts/image.sh

# cargo-deny is installed on first use (scripts/cargo-deny.sh) and reads deny.toml; offline,
# on the crates of the host's target that the build downloaded (see deny.toml).
HOST_TARGET = $(shell rustc -vV | sed -n 's/^host: //p')

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	bash scripts/cargo-deny.sh --workspace --offline --locked --target $(HOST_TARGET) check --hide-inclusion-graph licenses bans

# Benchmarks (not tests): our sidecar against the upstream Go sidecar and a
# minimal floor client on one local control plane; updates docs/benchmarks.md.
#   make bench-quick   CI-sized, under 10 minutes once built
#   make bench         the full sizes of the benchmark issue (hours at default client limits)
#   make bench-scale   the cluster's size (issue 41): 1,000 to 50,000 bound PV/PVC pairs,
#                      every contender at each (hours; BENCH_ARGS="--pairs 1000 --burst 100
#                      --idle-secs 10" is the small version `make test` runs)
BENCH_BUILD = cargo build --release -p csi-provisioner -p csi-test-driver -p bench

bench:
	@bash testbed/build.sh >/dev/null
	$(BENCH_BUILD)
	target/release/bench run --profile full $(BENCH_ARGS)

bench-quick:
	@bash testbed/build.sh >/dev/null
	$(BENCH_BUILD)
	target/release/bench run --profile quick $(BENCH_ARGS)

bench-scale:
	@bash testbed/build.sh >/dev/null
	$(BENCH_BUILD)
	target/release/bench run --profile scale $(BENCH_ARGS)

# Chaos soak (`make test` already runs a bounded chaos run): every fault kind against our
# sidecar (SIDECAR=upstream or both for the comparison), then the invariant table; fails on
# any violation. SCENARIO=issue-486|issue-1469|issue-1469-pv-gone|restart-during-cleanup|time-travel
# replays a named failure instead.
#   make chaos CLAIMS=2000 DURATION=15m SEED=1 SIDECAR=ours
#   make chaos NODES=3 CLAIMS=500 SEED=1   (a node deployment: a sidecar and a driver per node;
#                                          NODE_DEPLOYMENT=1 is NODES=3)
#   make chaos POLICIES=1 SEED=1           (policy mode: the intent policies installed for the run
#                                          and removed mid-run, our sidecar with --admission-intent)
#   make chaos SWEEP=all SIDECAR=both      (the crash sweep: a kill at every API write and CSI call
#                                          of every flow, before and after, with and without a
#                                          deletion while down; CHAOS_ARGS=--sweep-events adds events)
#   make chaos PROFILE=release SEED=1      (our sidecar from an optimized build, as shipped)
chaos:
	@CLAIMS=$(CLAIMS) DURATION=$(DURATION) RATE=$(RATE) SEED=$(SEED) SIDECAR=$(SIDECAR) SCENARIO=$(SCENARIO) RESTORES=$(RESTORES) CLONES=$(CLONES) NODES=$(NODES) NODE_DEPLOYMENT=$(NODE_DEPLOYMENT) POLICIES=$(POLICIES) SWEEP=$(SWEEP) PROFILE=$(PROFILE) bash scripts/chaos.sh

# The provisioning protocol, model-checked (tools/model, issue 39): every mode and freshness
# answer, then the known-wrong variants, each with its state count, time and any counterexample
# (docs/reliability.md, "The protocol, model-checked"). `make test` runs the small configuration
# (cargo test -p model); `make model-deep` the deeper ones (a lost answer, a crash and a takeover
# at once; a re-creation under the claim's name that may be deleted too), on THREADS threads. The
# dev profile, which builds the model crate optimised: no release build of the product needed.
model:
	cargo run -p model -- --threads $(or $(THREADS),1)

model-deep:
	cargo run -p model -- --deep --threads $(or $(THREADS),2)
