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

say "The pipeline: rows written in MariaDB arrive in Kafka, then in ClickHouse"
mysql_port=${SLUICE_MYSQL_URL##*:}
sqlq() { mariadb --no-defaults --default-character-set=utf8mb4 -h127.0.0.1 -P"$mysql_port" -usluice -psluice -e "$1"; }
run=$(date +%s)
db=demo_$run
demo_config=$(mktemp)
cat >"$demo_config" <<TOML
connector = "demo-$run"
[mysql]
url = "$SLUICE_MYSQL_URL"
start = "end"
[filter]
include = ['$db\..*']
[topics]
prefix = "demo"
[publish]
partitions = 3
replication_factor = 1
[kafka]
brokers = "$SLUICE_KAFKA_BROKERS"
[metrics]
listen = "127.0.0.1:0"
TOML
"$bin/capture-mysql" -c "$demo_config" 2>"$demo_config.log" &
capture_pid=$!
chq() { curl -fsS "$SLUICE_CLICKHOUSE_URL/" --data-binary "$1"; }
chq "CREATE DATABASE IF NOT EXISTS demo"
apply_config=$(mktemp)
cat >"$apply_config" <<TOML
[clickhouse]
url = "$SLUICE_CLICKHOUSE_URL"
database = "demo"
[consumer]
group_id = "demo-$run"
topics = ['^demo\.$db\..*']
[batch]
max_wait_ms = 200
[kafka]
brokers = "$SLUICE_KAFKA_BROKERS"
[metrics]
listen = "127.0.0.1:0"
TOML
"$bin/apply-clickhouse" -c "$apply_config" 2>"$apply_config.log" &
apply_pid=$!
trap 'kill $capture_pid $apply_pid 2>/dev/null || true; rm -f "$demo_config" "$demo_config.log" "$apply_config" "$apply_config.log"' EXIT
for _ in $(seq 1 100); do grep -q "reading the binlog" "$demo_config.log" && break; sleep 0.1; done
sqlq "CREATE DATABASE $db;
      CREATE TABLE $db.orders (id BIGINT UNSIGNED PRIMARY KEY, item VARCHAR(40),
        price DECIMAL(10,2), placed DATETIME(6));
      INSERT INTO $db.orders VALUES (1, 'tea 🍵', 3.50, NOW(6)), (2, 'cake', 12.00, NOW(6));
      UPDATE $db.orders SET price = 3.75 WHERE id = 1;
      DELETE FROM $db.orders WHERE id = 2;"
echo "(4 row changes and a CREATE TABLE in $db.orders; the events on topic demo.$db.orders:)"
sleep 1
"$bin/sluice-events" --brokers "$SLUICE_KAFKA_BROKERS" --topic "demo.$db.orders" --count 8 ||
  { echo "capture-mysql said:"; cat "$demo_config.log"; exit 1; }
echo
echo "(and the mirror table demo.orders in ClickHouse, SELECT ... FINAL WHERE _deleted = 0:)"
for _ in $(seq 1 50); do
  [ "$(chq "SELECT count() FROM demo.orders FINAL WHERE _deleted = 0" 2>/dev/null)" = "1" ] && break
  sleep 0.2
done
chq "SELECT id, item, price, placed, _version FROM demo.orders FINAL WHERE _deleted = 0 FORMAT PrettyCompactNoEscapes"
kill -TERM $capture_pid $apply_pid
wait $capture_pid $apply_pid || true
sqlq "DROP DATABASE $db"
chq "DROP TABLE IF EXISTS demo.orders"

say "Stages"
cat <<'TXT'
capture-mysql     built: MariaDB/MySQL binlog -> Kafka (shown above)
capture-mongo     checks its source; change stream capture not built yet
apply-clickhouse  built: Kafka -> ClickHouse mirror and change-log tables (shown above)
apply-mongo       checks its target; applying not built yet
TXT
echo
echo "The test bed keeps running: deploy/testbed.sh status | stop | clean"
