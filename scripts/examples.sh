#!/usr/bin/env bash
# scripts/examples.sh [examples|pgbouncer]: the examples tier prepares the four external workers
# of examples/ and runs them against a test cluster (pg_test/tests/examples.rs); the pgbouncer
# tier runs the Python and Node ones through pgbouncer (pg_test/tests/pgbouncer.rs). Installs
# what each needs, from the package registries, where it is missing:
#   Python: psycopg 3 (binary) from PyPI, into a venv;
#   Node:   pg from npm (examples/node/package-lock.json), with Debian's nodejs and npm;
#   Go:     Debian's golang-go and golang-github-lib-pq-dev (scripts/setup.sh), built without
#           modules (they cannot be downloaded on these machines);
#   Rust:   tokio-postgres from crates.io (the workspace member examples/rust).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
out=target/examples
mkdir -p "$out"

venv=${PG_TIDE_EXAMPLES_VENV:-$HOME/.cache/pg_tide/examples-venv}
if ! "$venv/bin/python" -c 'import psycopg' 2>/dev/null; then
    echo "==> installing psycopg 3 into $venv"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'psycopg[binary]>=3.2,<4'
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "==> installing Debian's nodejs and npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm
fi
(cd examples/node && npm ci --no-audit --no-fund --silent)

echo "==> building the Go worker (lib/pq from Debian)"
(cd examples/go && GO111MODULE=off GOPATH=/usr/share/gocode go build -o "../../$out/go-worker" .)

echo "==> building the Rust worker"
cargo build -q -p pg_tide_example_worker

export PG_TIDE_EXAMPLE_PYTHON="$venv/bin/python"
export PG_TIDE_EXAMPLE_NODE="$(command -v node)"
export PG_TIDE_EXAMPLE_GO="$PWD/$out/go-worker"
export PG_TIDE_EXAMPLE_RUST="$PWD/target/debug/pg_tide_example_worker"
# The tier: examples (the workers connected to the server), or pgbouncer (the same workers
# through pgbouncer in transaction pooling mode, pg_test/tests/pgbouncer.rs).
tier=${1:-examples}
shift || true
exec cargo test -p pg_tide_pg_test --test "$tier" "$@"
