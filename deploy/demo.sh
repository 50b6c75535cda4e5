#!/usr/bin/env bash
# The pipeline demo on the local test bed: starts the servers (installing what is missing),
# builds the binaries, shows every server answering and every stage's preflight against it.
# As the stages are built, the demo runs them end to end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*"; }

say "Starting the test bed"
deploy/testbed.sh start
eval "$(deploy/testbed.sh env)"
deploy/testbed.sh status

say "Building the binaries"
cargo build --workspace --bins
bin=target/debug

say "Each server, answering"
mariadb --no-defaults -h127.0.0.1 -P"${SLUICE_MYSQL_URL##*:}" -usluice -psluice -e \
  "SELECT @@version AS mariadb, @@binlog_format AS binlog_format, @@binlog_row_image AS row_image, @@gtid_binlog_pos AS gtid_pos"
echo "kafka: $SLUICE_KAFKA_BROKERS (reachability: see the checks below)"
echo "clickhouse: $(curl -fsS "$SLUICE_CLICKHOUSE_URL/" --data-binary 'SELECT version()')"

# The example configs of deploy/config/, pointed at the test bed by environment overrides.
export SLUICE__KAFKA__BROKERS=$SLUICE_KAFKA_BROKERS
check() {
  local b=$1
  shift
  say "$b --check (deploy/config/$b.toml)"
  env "$@" "$bin/$b" -c "deploy/config/$b.toml" --check
}
check capture-mysql SLUICE__MYSQL__URL="$SLUICE_MYSQL_URL"
check capture-mongo SLUICE__MONGODB__URI="$SLUICE_MONGO_SOURCE_URL"
check apply-clickhouse SLUICE__CLICKHOUSE__URL="$SLUICE_CLICKHOUSE_URL"
check apply-mongo SLUICE__MONGODB__URI="$SLUICE_MONGO_TARGET_URL"

say "Stages"
cat <<'TXT'
capture-mysql     checks its source; binlog streaming not built yet
capture-mongo     checks its source; change stream capture not built yet
apply-clickhouse  checks its target; applying not built yet
apply-mongo       checks its target; applying not built yet
TXT
echo
echo "The test bed keeps running: deploy/testbed.sh status | stop | clean"
