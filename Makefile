# The two commands of the README: `make demo` (the main job) and `make test` (every tier).
# Both install what is missing first (scripts/setup.sh), so a fresh Debian 12 needs only Rust.

.PHONY: demo test setup demo-stop bench bench-versions package

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

setup:
	bash scripts/setup.sh

demo-stop:
	bash scripts/demo-stop.sh

# Benchmarks (figures beside a baseline measured in the same run; see docs/performance.md).
bench:
	bash bench/bench.sh

# The previous release's SQL beside the current one's, on the same library: what a change of the
# SQL costs the hot paths (bench/versions.sh).
bench-versions:
	bash bench/versions.sh

# Debian packages: target/postgresql-{15,17,18}-pg-tide_<version>-1_<arch>.deb (pg_tide for
# PostgreSQL 15 on Debian 12, 17 on Debian 13 and 18 on Debian forky, the last two built in
# chroots of their release) and target/pg-tide-console_<version>-1_<arch>.deb (the console, a
# systemd service).
package: setup
	bash scripts/package.sh
