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
