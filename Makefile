# The two commands of the set-up promise:
#   make demo   the sidecar doing its job against a local control plane
#   make test   every test (builds the test bed on first use, then cached)
.PHONY: test demo testbed build lint chaos bench bench-quick

testbed:
	@bash testbed/build.sh

build:
	cargo build --workspace --bins

test:
	@bash scripts/test.sh

demo:
	@bash scripts/demo.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

# Chaos soak (`make test` already runs a bounded chaos run): every fault kind against our
# sidecar (SIDECAR=upstream or both for the comparison), then the invariant table; fails on
# any violation. SCENARIO=issue-486|issue-1469 replays a named upstream failure instead.
#   make chaos CLAIMS=2000 DURATION=15m SEED=1 SIDECAR=ours
chaos:
	@CLAIMS=$(CLAIMS) DURATION=$(DURATION) RATE=$(RATE) SEED=$(SEED) SIDECAR=$(SIDECAR) SCENARIO=$(SCENARIO) bash scripts/chaos.sh
