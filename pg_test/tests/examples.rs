//! The external workers of examples/ (Python, Node, Go, Rust), each run as its own process
//! against a real cluster (issue 18), connected to the server directly: the scenario is
//! pg_test/src/example_workers.rs (the pgbouncer tier runs it through a pooler).

use pg_tide_pg_test::example_workers::worker_runs_every_kind;
use pg_tide_pg_test::{run_tests, Cluster, Failed, TestFn, WORKERS_DB};

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("python_worker", |c| direct(c, "python")),
        ("node_worker", |c| direct(c, "node")),
        ("go_worker", |c| direct(c, "go")),
        ("rust_worker", |c| direct(c, "rust")),
    ];
    run_tests("examples", tests)
}

fn direct(cluster: &Cluster, lang: &str) -> Result<(), Failed> {
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/{WORKERS_DB}?sslmode=disable",
        cluster.port
    );
    worker_runs_every_kind(cluster, lang, &url, &[])
}
