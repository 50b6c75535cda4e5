#!/usr/bin/env bash
# The pipeline demo on the local test bed: starts the servers (installing what is missing),
# builds the binaries, shows every server answering and every stage's preflight against it.
# Then both pipelines end to end: MariaDB -> Kafka -> ClickHouse (into ClickHouse 18.16, then into
# the current ClickHouse) and MongoDB -> Kafka -> MongoDB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*"; }

say "Starting the test bed"
deploy/testbed.sh start mariadb kafka clickhouse clickhouse-current mongo
eval "$(deploy/testbed.sh env)"
deploy/testbed.sh status

say "Building the binaries"
build_log=$(mktemp)
if ! cargo build --workspace --bins >"$build_log" 2>&1; then
  cat "$build_log"
  exit 1
fi
rm -f "$build_log"
echo "built: target/debug/{capture-mysql,capture-mongo,apply-clickhouse,apply-mongo,sluice}"
bin=target/debug

say "Each server, answering"
mariadb --no-defaults -h127.0.0.1 -P"${SLUICE_MYSQL_URL##*:}" -usluice -psluice -e \
  "SELECT @@version AS mariadb, @@binlog_format AS binlog_format, @@binlog_row_image AS row_image, @@gtid_binlog_pos AS gtid_pos"
echo "kafka: $SLUICE_KAFKA_BROKERS (reachability: see the checks below)"
echo "clickhouse: $(curl -fsS "$SLUICE_CLICKHOUSE_URL/" --data-binary 'SELECT version()')"
echo "clickhouse (current): $(curl -fsS "$SLUICE_CLICKHOUSE_CURRENT_URL/" --data-binary 'SELECT version()')"

# The example configs of deploy/config/, pointed at the test bed by environment overrides.
export SLUICE__KAFKA__BROKERS=$SLUICE_KAFKA_BROKERS
check() {
  local b=$1
  shift
  say "$b --check (deploy/config/$b.toml)"
  env "$@" "$bin/$b" -c "deploy/config/$b.toml" --check
}
# The test bed's MariaDB serves TLS with a certificate of the test bed's CA.
check capture-mysql SLUICE__MYSQL__URL="$SLUICE_MYSQL_URL" SLUICE__MYSQL__SSL_CA="$SLUICE_TLS_DIR/ca.pem"
check capture-mongo SLUICE__MONGODB__URI="$SLUICE_MONGO_SOURCE_URL"
check apply-clickhouse SLUICE__CLICKHOUSE__URL="$SLUICE_CLICKHOUSE_URL"
check apply-mongo SLUICE__MONGODB__URI="$SLUICE_MONGO_TARGET_URL"

# MariaDB -> Kafka -> the ClickHouse at $1 ($2 names it), with sluice status and verify at the end.
mysql_to_clickhouse() {
local ch_url=$1
say "The pipeline: rows written in MariaDB arrive in Kafka, then in $2"
mysql_port=${SLUICE_MYSQL_URL##*:}
sqlq() { mariadb --no-defaults --default-character-set=utf8mb4 -h127.0.0.1 -P"$mysql_port" -usluice -psluice -e "$1"; }
run=$(date +%s%N)
db=demo_$run
demo_config=$(mktemp)
if [ -n "${SLUICE_TLS_DIR:-}" ]; then mysql_tls="ssl_ca = \"$SLUICE_TLS_DIR/ca.pem\""; else mysql_tls='ssl_mode = "disabled"'; fi
cat >"$demo_config" <<TOML
connector = "demo-$run"
[mysql]
url = "$SLUICE_MYSQL_URL"
$mysql_tls
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
chq() { curl -fsS "$ch_url/" --data-binary "$1"; }
chq "CREATE DATABASE IF NOT EXISTS demo"
apply_config=$(mktemp)
cat >"$apply_config" <<TOML
[clickhouse]
url = "$ch_url"
database = "demo"
[consumer]
group_id = "demo-$run"
topics = ['^demo\.$db\..*']
[batch]
max_wait_ms = 200
[errors]
dead_letter_topic = "demo.dead-letters"
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
echo "(4 row changes and a CREATE TABLE in $db.orders; the events on topic demo.$db.orders, in the source's order, the CREATE once:)"
sleep 1
"$bin/sluice" events --brokers "$SLUICE_KAFKA_BROKERS" --topic "demo.$db.orders" --merge --count 5 --wait 30 ||
  { echo "capture-mysql said:"; cat "$demo_config.log"; exit 1; }
echo
echo "(and the mirror table demo.orders in $2, SELECT ... FINAL WHERE _deleted = 0:)"
for _ in $(seq 1 50); do
  [ "$(chq "SELECT count() FROM demo.orders FINAL WHERE _deleted = 0" 2>/dev/null)" = "1" ] && break
  sleep 0.2
done
chq "SELECT id, item, price, placed, _version FROM demo.orders FINAL WHERE _deleted = 0 FORMAT PrettyCompactNoEscapes"
echo
echo "(where the capture and the applier stand, and the tables the applier stopped: sluice status)"
"$bin/sluice" status --brokers "$SLUICE_KAFKA_BROKERS" --connector "demo-$run" --group "demo-$run" \
  --topic demo.dead-letters --apply-config "$apply_config"
echo
echo "(the mirror against its source, row by row: sluice verify)"
"$bin/sluice" verify --capture-config "$demo_config" --apply-config "$apply_config" --quiet \
  --wait-secs 60 || { echo "sluice verify found the mirror different (exit $?)"; exit 1; }
kill -TERM $capture_pid $apply_pid
wait $capture_pid $apply_pid || true
rm -f "$demo_config" "$demo_config.log" "$apply_config" "$apply_config.log"
trap - EXIT
sqlq "DROP DATABASE $db"
chq "DROP TABLE IF EXISTS demo.orders"
}
mysql_to_clickhouse "$SLUICE_CLICKHOUSE_URL" "ClickHouse 18.16"
mysql_to_clickhouse "$SLUICE_CLICKHOUSE_CURRENT_URL" "the current ClickHouse ($(curl -fsS "$SLUICE_CLICKHOUSE_CURRENT_URL/" --data-binary 'SELECT version()'))"

say "The pipeline: documents written in MongoDB arrive in Kafka, then in the target MongoDB"
run=$(date +%s)
mdb=mongo_demo_$run
mongo() { "$bin/sluice" mongo --uri "$1" --db "$mdb" "$2"; }
mcap_config=$(mktemp)
cat >"$mcap_config" <<TOML
connector = "demo-mongo-$run"
[mongodb]
uri = "$SLUICE_MONGO_SOURCE_URL"
mode = "oplog"
max_await_ms = 200
[filter]
include = ['$mdb\..*']
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
"$bin/capture-mongo" -c "$mcap_config" 2>"$mcap_config.log" &
mcapture_pid=$!
mapp_config=$(mktemp)
cat >"$mapp_config" <<TOML
[mongodb]
uri = "$SLUICE_MONGO_TARGET_URL"
[consumer]
group_id = "demo-mongo-$run"
topics = ['^demo\.$mdb\..*']
[batch]
max_wait_ms = 200
[kafka]
brokers = "$SLUICE_KAFKA_BROKERS"
[metrics]
listen = "127.0.0.1:0"
TOML
"$bin/apply-mongo" -c "$mapp_config" 2>"$mapp_config.log" &
mapply_pid=$!
trap 'kill $mcapture_pid $mapply_pid 2>/dev/null || true; rm -f "$mcap_config" "$mcap_config.log" "$mapp_config" "$mapp_config.log"' EXIT
for _ in $(seq 1 100); do grep -q "tailing local.oplog.rs" "$mcap_config.log" && break; sleep 0.1; done
mongo "$SLUICE_MONGO_SOURCE_URL" '{"insert": "orders", "documents": [
  {"_id": 1, "item": "tea 🍵", "price": {"$numberDecimal": "3.50"}, "tags": ["hot", "green"]},
  {"_id": 2, "item": "cake", "price": {"$numberDecimal": "12.00"}}]}' >/dev/null
mongo "$SLUICE_MONGO_SOURCE_URL" '{"update": "orders", "updates": [
  {"q": {"_id": 1}, "u": {"$set": {"price": {"$numberDecimal": "3.75"}}, "$unset": {"tags": ""}}}]}' >/dev/null
mongo "$SLUICE_MONGO_SOURCE_URL" '{"delete": "orders", "deletes": [{"q": {"_id": 2}, "limit": 1}]}' >/dev/null
echo "(2 inserts, an update and a delete in $mdb.orders; the events on topic demo.$mdb.orders:)"
"$bin/sluice" events --brokers "$SLUICE_KAFKA_BROKERS" --topic "demo.$mdb.orders" --count 4 --wait 30 ||
  { echo "capture-mongo said:"; cat "$mcap_config.log"; exit 1; }
echo
echo "(and $mdb.orders in the target MongoDB:)"
for _ in $(seq 1 50); do
  [ "$(mongo "$SLUICE_MONGO_TARGET_URL" '{"count": "orders"}')" = '{"n":1,"ok":1.0}' ] && break
  sleep 0.2
done
mongo "$SLUICE_MONGO_TARGET_URL" '{"find": "orders"}'
kill -TERM $mcapture_pid $mapply_pid
wait $mcapture_pid $mapply_pid || true
mongo "$SLUICE_MONGO_SOURCE_URL" '{"dropDatabase": 1}' >/dev/null
mongo "$SLUICE_MONGO_TARGET_URL" '{"dropDatabase": 1}' >/dev/null
echo
echo "The test bed keeps running: deploy/testbed.sh status | stop | clean"
