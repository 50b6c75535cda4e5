#!/usr/bin/env bash
# The whole test suite, from a fresh machine: starts the local test bed (installing what is
# missing), builds the workspace, runs every test.
#
# A server whose URL is given in the environment is used instead of the test bed's:
#   SLUICE_MYSQL_URL, SLUICE_KAFKA_BROKERS, SLUICE_CLICKHOUSE_URL,
#   SLUICE_CLICKHOUSE_CURRENT_URL, SLUICE_MONGO_SOURCE_URL and SLUICE_MONGO_TARGET_URL (both,
#   for MongoDB), SLUICE_CLICKHOUSE_CLUSTER_URLS (two servers of a cluster, with
#   SLUICE_CLICKHOUSE_CLUSTER_REPLICATED, _SHARDED and _PATH: tests/tests/clickhouse_cluster.rs).
# The ClickHouse tests run twice: against SLUICE_CLICKHOUSE_URL (the test bed's 18.16) and
# against SLUICE_CLICKHOUSE_CURRENT_URL (the test bed's ClickHouse 26.9, clickhouse-current).
# The test bed servers this script started are stopped at the end, unless
# SLUICE_KEEP_TESTBED=1. A Kafka broker it starts begins with no topics. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

services=()
[ -n "${SLUICE_MYSQL_URL:-}" ] || services+=(mariadb)
[ -n "${SLUICE_KAFKA_BROKERS:-}" ] || services+=(kafka)
[ -n "${SLUICE_CLICKHOUSE_URL:-}" ] || services+=(clickhouse)
[ -n "${SLUICE_CLICKHOUSE_CURRENT_URL:-}" ] || services+=(clickhouse-current)
[ -n "${SLUICE_MONGO_SOURCE_URL:-}" ] && [ -n "${SLUICE_MONGO_TARGET_URL:-}" ] || services+=(mongo)
[ -n "${SLUICE_CLICKHOUSE_CLUSTER_URLS:-}" ] || services+=(clickhouse-cluster)

started=()
if [ ${#services[@]} -gt 0 ]; then
  # Remember which were already running: those are left alone at the end.
  status=$(deploy/testbed.sh status)
  for s in "${services[@]}"; do
    grep -q "^$s *running" <<<"$status" || started+=("$s")
  done
  # mongo-java-server keeps every document and oplog entry in its heap, which a long-lived one
  # fills until it slows down: each run gets a fresh one (it holds nothing worth keeping).
  if [[ " ${services[*]} " == *" mongo "* ]] && grep -q "^mongo *running" <<<"$status"; then
    deploy/testbed.sh stop mongo
  fi
  # Every test names its topics afresh, so a kept broker only piles up old ones (thousands of
  # partitions after a day of runs, minutes to load at each start): a broker this run starts
  # begins empty. One that is already running is left as it is.
  if [[ " ${started[*]} " == *" kafka "* ]]; then
    deploy/testbed.sh reset kafka
  fi
fi
# Set before the start: servers started by a start that fails halfway are stopped too.
stop_started() {
  if [ ${#started[@]} -gt 0 ] && [ "${SLUICE_KEEP_TESTBED:-0}" != 1 ]; then
    deploy/testbed.sh stop "${started[@]}" || true
  fi
}
trap stop_started EXIT
[ ${#services[@]} -eq 0 ] || deploy/testbed.sh start "${services[@]}"
# The test bed's TLS and authentication (tests/tests/tls.rs; the MySQL tests verify its CA),
# for the servers it runs here.
bed_env=$(deploy/testbed.sh env)
pick() { sed -n "s/^export $1=//p" <<<"$bed_env"; }
if [[ " ${services[*]} " == *" mariadb "* ]]; then export SLUICE_TLS_DIR; SLUICE_TLS_DIR=$(pick SLUICE_TLS_DIR); fi
if [[ " ${services[*]} " == *" kafka "* ]]; then export SLUICE_KAFKA_SASL_BROKERS; SLUICE_KAFKA_SASL_BROKERS=$(pick SLUICE_KAFKA_SASL_BROKERS); fi
if [[ " ${services[*]} " == *" clickhouse "* ]]; then export SLUICE_CLICKHOUSE_HTTPS_URL; SLUICE_CLICKHOUSE_HTTPS_URL=$(pick SLUICE_CLICKHOUSE_HTTPS_URL); fi

# The randomized whole-pipeline test (tests/tests/pipeline_random.rs): by default 100 steps
# of a random seed (printed) drawn from the actions whose findings are all fixed (rows, schema
# changes, stages stopped or killed); SLUICE_SCENARIO_FULL=1 draws from the whole registry
# for 120 s (XA, bulk transactions, pauses, appliers joining, outages, snapshots, tables
# stopped and taken up again, broker restarts, partitions added: open findings in
# docs/apply-clickhouse.md).
scenario() {
  if [ "${SLUICE_SCENARIO_FULL:-0}" = 1 ]; then
    "$@"
  else
    env SLUICE_SCENARIO_STEPS="${SLUICE_SCENARIO_STEPS:-100}" \
      SLUICE_TEST_ACTIONS="${SLUICE_TEST_ACTIONS:-upsert,update,delete,alter,key_type,primary_key,truncate,recreate,swap,copy,index,partitions,unheld,capture_halt,apply_halt}" \
      "$@"
  fi
}
# A CI checkout is built once: no incremental-compilation cache (several GB on disk).
[ -z "${CI:-}" ] || export CARGO_INCREMENTAL=0
cargo build --workspace --bins --tests
# One closing line for the whole run: cargo prints a result per test binary.
log=$(mktemp)
rc=0
# --no-fail-fast: every test binary runs (and is counted) even when an earlier one fails.
scenario cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || rc=$?
# The ClickHouse tests again, against the current server.
current=${SLUICE_CLICKHOUSE_CURRENT_URL:-http://127.0.0.1:${SLUICE_CLICKHOUSE_CURRENT_PORT:-18124}}
echo "== the ClickHouse tests against $current"
ch_tests=(--test apply_clickhouse --test clickhouse --test clickhouse_types --test exact_values --test clickhouse_schema
  --test clickhouse_rebuild
  --test pipeline_random --test faults
  --test binaries)
scenario env SLUICE_CLICKHOUSE_URL="$current" cargo test -p sluice-tests --no-fail-fast "${ch_tests[@]}" "$@" 2>&1 |
  tee -a "$log" || rc=$?
if [ $# -eq 0 ]; then
  SLUICE_CLICKHOUSE_URL=$current cargo test -p sluice-tests --test deploy \
    the_example_configs_run_the_pipeline 2>&1 | tee -a "$log" || rc=$?
  # The operator's tools against a ClickHouse mirror (their MongoDB files are left out).
  SLUICE_CLICKHOUSE_URL=$current cargo test -p sluice-tests --test tools -- status:: position:: \
    verify:: 2>&1 | tee -a "$log" || rc=$?
fi
# (A test binary that dies without its result line counts as one failure, so that the line
# never says 0 failed for a run that failed.)
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     /^error: test failed, to rerun/ { died++ }
     /^test result: FAILED/ { failed_bins++ }
     END { if (died > failed_bins) f += died - failed_bins; printf "tests: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit $rc
