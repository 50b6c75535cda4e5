#!/usr/bin/env bash
# The local test bed: real servers on 127.0.0.1 for the tests, the demo and the benchmarks.
#
#   deploy/testbed.sh start [SERVICE...]   install what is missing, start, wait until each answers
#   deploy/testbed.sh stop  [SERVICE...]   stop (data is kept until `clean`; default: all,
#                                          clickhouse-cluster included)
#   deploy/testbed.sh status               what runs where
#   deploy/testbed.sh env                  the environment variables the tests and tools read
#   deploy/testbed.sh reset SERVICE...     stop those and delete their data: the next start
#                                          begins empty
#   deploy/testbed.sh clean                stop everything and delete the test bed's data
#   deploy/testbed.sh tools                install the deployment files' checkers (hadolint,
#                                          check-jsonschema, kubernetes-validate) in a
#                                          virtualenv under the cache, and promtool (built
#                                          with Go); print their bin folder
#
# SERVICE is one of: mariadb kafka clickhouse clickhouse-current mongo (default: all), or
# clickhouse-cluster, which `start` starts only when named.
#
# Servers:
#   mariadb     MariaDB from Debian's packages, binlog ROW/FULL, server_id 1, GTIDs
#   kafka       Apache Kafka (KRaft, one node) from the official jars on Maven Central,
#               topic auto-creation off
#   clickhouse  clickhouse-server from Debian's packages
#   clickhouse-current
#               the current ClickHouse engine (chdb-core from PyPI, in process) behind a small
#               HTTP front (testbed/clickhouse_current.py), in a virtualenv under the cache
#   mongo       mongo-java-server (Maven Central) with its oplog: a source and a target server
#   clickhouse-cluster
#               two more clickhouse-server processes (the same Debian binary) and Apache
#               ZooKeeper (standalone, Maven Central's jars): cluster sluice_cluster (2 shards
#               of 1 replica) and sluice_replicated (1 shard of 2 replicas), ON CLUSTER DDL
#
# Where things go (all overridable):
#   SLUICE_TESTBED_DIR  data, logs, pids      (default: /var/tmp/sluice-testbed; one test bed
#                       per machine, shared by every checkout, as its ports are)
#   SLUICE_CACHE_DIR    downloaded jars, virtualenvs (default: ~/.cache/sluice)
#   ports: SLUICE_MARIADB_PORT 13306, SLUICE_KAFKA_PORT 19092 (controller +1),
#          SLUICE_CLICKHOUSE_HTTP_PORT 18123, SLUICE_CLICKHOUSE_TCP_PORT 19000,
#          SLUICE_CLICKHOUSE_CURRENT_PORT 18124,
#          SLUICE_MONGO_SOURCE_PORT 27117, SLUICE_MONGO_TARGET_PORT 27118,
#          SLUICE_ZOOKEEPER_PORT 12181, and for the cluster's node 1 (node 2: each +1)
#          SLUICE_CLICKHOUSE_CLUSTER_HTTP_PORT 18125, SLUICE_CLICKHOUSE_CLUSTER_TCP_PORT 19001,
#          SLUICE_CLICKHOUSE_CLUSTER_INTERSERVER_PORT 19009
#   SLUICE_CLICKHOUSE_CURRENT_PASSWORD  the password of clickhouse-current's user `default`
#                       (default: empty)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

state=${SLUICE_TESTBED_DIR:-/var/tmp/sluice-testbed}
cache=${SLUICE_CACHE_DIR:-$HOME/.cache/sluice}

mariadb_port=${SLUICE_MARIADB_PORT:-13306}
kafka_port=${SLUICE_KAFKA_PORT:-19092}
kafka_controller_port=$((kafka_port + 1))
kafka_sasl_port=${SLUICE_KAFKA_SASL_PORT:-$((kafka_port + 2))}
ch_http_port=${SLUICE_CLICKHOUSE_HTTP_PORT:-18123}
ch_tcp_port=${SLUICE_CLICKHOUSE_TCP_PORT:-19000}
ch_https_port=${SLUICE_CLICKHOUSE_HTTPS_PORT:-18443}
chc_port=${SLUICE_CLICKHOUSE_CURRENT_PORT:-18124}
mongo_source_port=${SLUICE_MONGO_SOURCE_PORT:-27117}
mongo_target_port=${SLUICE_MONGO_TARGET_PORT:-27118}
zk_port=${SLUICE_ZOOKEEPER_PORT:-12181}
# The cluster's node N (1 or 2) listens on these + N - 1.
chx_http_port=${SLUICE_CLICKHOUSE_CLUSTER_HTTP_PORT:-18125}
chx_tcp_port=${SLUICE_CLICKHOUSE_CLUSTER_TCP_PORT:-19001}
chx_interserver_port=${SLUICE_CLICKHOUSE_CLUSTER_INTERSERVER_PORT:-19009}

kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/testbed/kafka-pom.xml")
zk_version=$(sed -n 's:.*<zookeeper.version>\(.*\)</zookeeper.version>.*:\1:p' "$here/testbed/zookeeper-pom.xml")
# What `start` starts when no service is named; clickhouse-cluster (three more processes) only
# when named: nothing uses it by default.
all_services=(mariadb kafka clickhouse clickhouse-current mongo)
known_services=("${all_services[@]}" clickhouse-cluster)

log() { printf '[testbed] %s\n' "$*" >&2; }
die() { printf '[testbed] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# helpers

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for NAME PIDFILE SECONDS LOG COMMAND...: run COMMAND until it succeeds. Fails with the
# log's tail when the time is up, or at once when the process in PIDFILE has exited.
wait_for() {
  local name=$1 pidfile=$2 secs=$3 logf=$4
  shift 4
  local i
  for ((i = 0; i < secs * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! pid_alive "$pidfile"; then
      log "$name exited while starting; last lines of $logf:"
      tail -n 30 "$logf" >&2 || true
      die "$name failed to start"
    fi
    sleep 0.25
  done
  log "$name did not answer within ${secs}s; last lines of $logf:"
  tail -n 30 "$logf" >&2 || true
  die "$name failed to start"
}

# log_since FILE OFFSET PATTERN: PATTERN occurs in FILE past byte OFFSET (what this start wrote,
# not an earlier run's lines). Not `grep -q`: it would stop reading, and `tail`'s SIGPIPE would
# fail the pipeline under pipefail.
log_since() { tail -c +"$(($2 + 1))" "$1" | grep -F "$3" >/dev/null; }

# Start a command detached from this shell (its own session, output to a log file), without
# the descriptors this shell was handed (a lock the caller holds must not stay held by a server
# started here).
spawn() {
  local pidfile=$1 logf=$2
  shift 2
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid nohup "$@" >>"$logf" 2>&1 </dev/null
  ) &
  echo $! >"$pidfile"
}

stop_pidfile() {
  local name=$1 pidfile=$2
  if pid_alive "$pidfile"; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 120; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not stop in 30s; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
    log "$name stopped"
  fi
  rm -f "$pidfile"
}

apt_updated=0
apt_install() {
  # Install Debian packages that are missing. Services must not be started by the packages'
  # scripts: the test bed starts its own instances.
  local missing=()
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "need Debian packages ${missing[*]} but apt-get is not available"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  if [ $apt_updated -eq 0 ]; then
    $sudo apt-get update -qq >"$state/apt.log" 2>&1 || { tail -n 20 "$state/apt.log" >&2; die "apt-get update failed"; }
    apt_updated=1
  fi
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee $policy >/dev/null
    $sudo chmod +x $policy
    created_policy=1
  fi
  local rc=0 aptlog=$state/apt.log
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >"$aptlog" 2>&1 || rc=$?
  [ $created_policy -eq 1 ] && $sudo rm -f $policy
  if [ $rc -ne 0 ]; then
    tail -n 20 "$aptlog" >&2
    die "apt-get install ${missing[*]} failed (exit $rc; full output in $aptlog)"
  fi
}

# Fetch the runtime jars of a pom into a cache folder (once).
maven_fetch() {
  local pom=$1 dest=$2
  [ -f "$dest/.complete" ] && return 0
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch $(basename "$pom")'s jars from Maven Central"
  log "fetching jars of $(basename "$pom") from Maven Central into $dest"
  rm -rf "$dest"
  mkdir -p "$dest"
  local mvnlog=$state/maven.log
  mvn -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$dest" \
    -DincludeScope=runtime >"$mvnlog" 2>&1 ||
    { tail -n 30 "$mvnlog" >&2; die "Maven could not fetch the jars of $pom (full output in $mvnlog)"; }
  touch "$dest/.complete"
}

need_java() { command -v java >/dev/null || die "Java 17+ is needed (java not found)"; }

# venv_install VENV REQUIREMENTS WHAT [MINOR]: a virtualenv holding the pinned packages of
# REQUIREMENTS (from PyPI), made anew only when that file has changed since the last install;
# it needs Python 3.MINOR or later (default 3.9).
# Two callers at once (tests run in parallel) take turns: the second finds the first's venv.
venv_install() {
  mkdir -p "$(dirname "$1")"
  command -v flock >/dev/null || apt_install util-linux
  (
    flock 9
    venv_install_locked "$@"
  ) 9>"$1.lock" || exit 1
}

venv_install_locked() {
  local venv=$1 req=$2 what=$3 minor=${4:-9}
  local want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  [ "$(cat "$venv/.installed" 2>/dev/null)" = "$want" ] && return 0
  command -v python3 >/dev/null || apt_install python3
  python3 -c "import sys; sys.exit(sys.version_info < (3, $minor))" ||
    die "$what needs Python 3.$minor or later (python3 is $(python3 -V 2>&1))"
  # Debian keeps venv's pip bootstrap in a package of its own.
  python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
  log "installing $what into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "cannot create a virtualenv in $venv (python3 -m venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2 ||
    die "cannot install $req from PyPI"
  echo "$want" >"$venv/.installed"
}

# ---------------------------------------------------------------------------------------------
# MariaDB

# ---------------------------------------------------------------------------------------------
# TLS: a CA of the test bed's own, made once with openssl, and a certificate for the servers
# (names localhost and 127.0.0.1), one for a client, and a second CA that signed nothing the
# servers show (to test a wrong CA).

tls_dir=$state/tls

tls_certs() {
  if [ -f "$tls_dir/server.pem" ] && [ -f "$tls_dir/other-ca.pem" ]; then return 0; fi
  command -v openssl >/dev/null || apt_install openssl
  mkdir -p "$tls_dir"
  log "making the test bed's CA and certificates in $tls_dir"
  (
    cd "$tls_dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sluice test bed CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=another CA" \
      -keyout other-ca.key -out other-ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=sluice" -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out client.pem 2>/dev/null
    # Kafka's PEM key store: the private key (PKCS#8, unencrypted) and the chain in one file.
    cat server.key server.pem >kafka-keystore.pem
    rm -f ./*.csr ./*.ext
    chmod 644 ./*.pem ./*.key
  ) || die "making the test bed's certificates failed"
}

mariadb_dir=$state/mariadb
mariadb_sock=$mariadb_dir/mysqld.sock

mariadb_start() {
  apt_install mariadb-server mariadb-client
  if pid_alive "$mariadb_dir/pid"; then log "mariadb already running"; return 0; fi
  tls_certs
  mkdir -p "$mariadb_dir"
  if [ ! -d "$mariadb_dir/data/mysql" ]; then
    log "initialising MariaDB data directory"
    mkdir -p "$mariadb_dir/data"
    chown -R mysql:mysql "$mariadb_dir"
    mariadb-install-db --no-defaults --user=mysql --datadir="$mariadb_dir/data" \
      --auth-root-authentication-method=socket >"$mariadb_dir/install.log" 2>&1 ||
      { tail -n 20 "$mariadb_dir/install.log" >&2; die "mariadb-install-db failed"; }
  fi
  chown -R mysql:mysql "$mariadb_dir"
  # The binlog settings a capture needs; the durability settings are relaxed: test bed only.
  spawn "$mariadb_dir/pid" "$mariadb_dir/server.log" \
    mariadbd --no-defaults --user=mysql \
    --datadir="$mariadb_dir/data" --socket="$mariadb_sock" --pid-file="$mariadb_dir/data/mariadbd.pid" \
    --bind-address=127.0.0.1,127.0.0.2 --port="$mariadb_port" --skip-name-resolve \
    --server-id=1 --log-bin=mysql-bin --binlog-format=ROW --binlog-row-image=FULL \
    --binlog-row-metadata=FULL --max-binlog-size=64M --binlog-expire-logs-seconds=86400 \
    --gtid-strict-mode=1 --log-slave-updates=1 \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
    --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2 --sync-binlog=0 \
    --max-connections=500 --max-allowed-packet=256M \
    --ssl-ca="$tls_dir/ca.pem" --ssl-cert="$tls_dir/server.pem" --ssl-key="$tls_dir/server.key"
  wait_for mariadb "$mariadb_dir/pid" 60 "$mariadb_dir/server.log" \
    mariadb --no-defaults --socket="$mariadb_sock" -uroot -e "SELECT 1"
  # A TCP user for the tests and tools (root uses socket authentication).
  mariadb --no-defaults --socket="$mariadb_sock" -uroot <<'SQL'
CREATE USER IF NOT EXISTS 'sluice'@'%' IDENTIFIED BY 'sluice';
GRANT ALL PRIVILEGES ON *.* TO 'sluice'@'%' WITH GRANT OPTION;
-- A capture's user as production has it: over TLS only, with the privileges a capture needs.
CREATE USER IF NOT EXISTS 'sluice_tls'@'%' IDENTIFIED BY 'tls-Secret#1@x' REQUIRE SSL;
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT, RELOAD ON *.* TO 'sluice_tls'@'%';
-- One that lacks REPLICATION SLAVE (a --check must name it).
CREATE USER IF NOT EXISTS 'sluice_norepl'@'%' IDENTIFIED BY 'norepl-secret';
GRANT REPLICATION CLIENT, SELECT ON *.* TO 'sluice_norepl'@'%';
SQL
  log "mariadb up on 127.0.0.1:$mariadb_port"
}

mariadb_stop() { stop_pidfile mariadb "$mariadb_dir/pid"; }

# ---------------------------------------------------------------------------------------------
# Kafka (KRaft, one node acting as broker and controller)

kafka_dir=$state/kafka
kafka_libs=$cache/kafka-$kafka_version

kafka_java=(java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$here/testbed/log4j2.properties"
  -Dkafka.logs.file="$kafka_dir/server.log" -cp "$kafka_libs/*")

kafka_start() {
  need_java
  maven_fetch "$here/testbed/kafka-pom.xml" "$kafka_libs"
  if pid_alive "$kafka_dir/pid"; then log "kafka already running"; return 0; fi
  tls_certs
  mkdir -p "$kafka_dir/data"
  cat >"$kafka_dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$kafka_controller_port
listeners=PLAINTEXT://127.0.0.1:$kafka_port,CONTROLLER://127.0.0.1:$kafka_controller_port,SASL_SSL://127.0.0.1:$kafka_sasl_port
advertised.listeners=PLAINTEXT://127.0.0.1:$kafka_port,SASL_SSL://127.0.0.1:$kafka_sasl_port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_plainuser="plain-Secret#2";
ssl.keystore.type=PEM
ssl.keystore.location=$tls_dir/kafka-keystore.pem
log.dirs=$kafka_dir/data
auto.create.topics.enable=false
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
EOF
  if [ ! -f "$kafka_dir/data/meta.properties" ]; then
    local cluster_id
    # An id that starts with '-' would be read as an option by the storage tool
    # (1 in 64 random ids), so the first character is never '-'.
    cluster_id=$(python3 -c 'import base64,uuid
while True:
    i = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not i.startswith("-"):
        print(i)
        break')
    log "formatting Kafka storage (cluster $cluster_id)"
    "${kafka_java[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$kafka_dir/server.properties" \
      >"$kafka_dir/format.log" 2>&1 || { cat "$kafka_dir/format.log" >&2; die "kafka storage format failed"; }
  fi
  : >>"$kafka_dir/server.log"
  local log_start
  log_start=$(stat -c %s "$kafka_dir/server.log")
  spawn "$kafka_dir/pid" "$kafka_dir/stdout.log" "${kafka_java[@]}" kafka.Kafka "$kafka_dir/server.properties"
  # The broker loads every partition before it listens: thousands of them take minutes.
  wait_for kafka "$kafka_dir/pid" 600 "$kafka_dir/server.log" \
    log_since "$kafka_dir/server.log" "$log_start" "Kafka Server started"
  wait_for kafka "$kafka_dir/pid" 60 "$kafka_dir/server.log" port_open "$kafka_port"
  # SCRAM users, stored in the cluster's metadata: once per data folder.
  local mech
  [ -f "$kafka_dir/data/.scram-users" ] || for mech in SCRAM-SHA-256 SCRAM-SHA-512; do
    "${kafka_java[@]}" kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$kafka_port" --alter \
      --add-config "$mech=[iterations=4096,password=scram-Secret#3]" \
      --entity-type users --entity-name scramuser >>"$kafka_dir/scram.log" 2>&1 ||
      { tail -n 20 "$kafka_dir/scram.log" >&2; die "adding the SCRAM user failed"; }
  done
  touch "$kafka_dir/data/.scram-users"
  log "kafka $kafka_version up on 127.0.0.1:$kafka_port (SASL_SSL with SCRAM and PLAIN on $kafka_sasl_port)"
}

kafka_stop() { stop_pidfile kafka "$kafka_dir/pid"; }

# ---------------------------------------------------------------------------------------------
# ClickHouse

ch_dir=$state/clickhouse

ch_start() {
  apt_install clickhouse-server clickhouse-client curl
  if pid_alive "$ch_dir/pid"; then log "clickhouse already running"; return 0; fi
  tls_certs
  mkdir -p "$ch_dir/data" "$ch_dir/tmp" "$ch_dir/user_files" "$ch_dir/format_schemas"
  cat >"$ch_dir/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
  <logger>
    <level>information</level>
    <log>$ch_dir/server.log</log>
    <errorlog>$ch_dir/error.log</errorlog>
    <size>100M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <listen_host>127.0.0.2</listen_host>
  <http_port>$ch_http_port</http_port>
  <https_port>$ch_https_port</https_port>
  <openSSL>
    <server>
      <certificateFile>$tls_dir/server.pem</certificateFile>
      <privateKeyFile>$tls_dir/server.key</privateKeyFile>
      <verificationMode>none</verificationMode>
      <loadDefaultCAFile>false</loadDefaultCAFile>
      <cacheSessions>true</cacheSessions>
      <disableProtocols>sslv2,sslv3</disableProtocols>
      <preferServerCiphers>true</preferServerCiphers>
    </server>
  </openSSL>
  <tcp_port>$ch_tcp_port</tcp_port>
  <path>$ch_dir/data/</path>
  <tmp_path>$ch_dir/tmp/</tmp_path>
  <user_files_path>$ch_dir/user_files/</user_files_path>
  <format_schema_path>$ch_dir/format_schemas/</format_schema_path>
  <users_config>$ch_dir/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <max_concurrent_queries>100</max_concurrent_queries>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>
  <mlock_executable>false</mlock_executable>
</yandex>
EOF
  cat >"$ch_dir/users.xml" <<'EOF'
<?xml version="1.0"?>
<yandex>
  <profiles>
    <default>
      <max_memory_usage>4000000000</max_memory_usage>
      <load_balancing>random</load_balancing>
    </default>
  </profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>::/0</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
    <sluice_tls>
      <password>ch-Secret#4</password>
      <networks><ip>::/0</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </sluice_tls>
  </users>
  <quotas>
    <default>
      <interval>
        <duration>3600</duration>
        <queries>0</queries>
        <errors>0</errors>
        <result_rows>0</result_rows>
        <read_rows>0</read_rows>
        <execution_time>0</execution_time>
      </interval>
    </default>
  </quotas>
</yandex>
EOF
  local bin
  bin=$(command -v clickhouse-server || echo /usr/bin/clickhouse-server)
  spawn "$ch_dir/pid" "$ch_dir/stdout.log" "$bin" --config-file="$ch_dir/config.xml"
  wait_for clickhouse "$ch_dir/pid" 60 "$ch_dir/stdout.log" ch_ping
  log "clickhouse $(ch_query 'SELECT version()') up on 127.0.0.1:$ch_http_port (native $ch_tcp_port)"
}

ch_ping() { [ "$(curl -fsS "http://127.0.0.1:$ch_http_port/ping")" = "Ok." ]; }
ch_query() { curl -fsS "http://127.0.0.1:$ch_http_port/" --data-binary "$1"; }

ch_stop() { stop_pidfile clickhouse "$ch_dir/pid"; }

# ---------------------------------------------------------------------------------------------
# ClickHouse cluster: two more clickhouse-server processes (the Debian binary above), each with
# its own config, data and ports, and a standalone ZooKeeper for replication and ON CLUSTER DDL.
# Clusters (both on both nodes): sluice_cluster, 2 shards of 1 replica (node 1 is shard 01,
# node 2 shard 02); sluice_replicated, 1 shard of 2 replicas. Macros: {shard} 01/02 and
# {replica} ch1/ch2 for sluice_cluster's paths; {replicated_shard} r01 on both nodes for
# sluice_replicated's (its replicas must share a path; {shard} would split them).

chx_dir=$state/clickhouse-cluster
zk_dir=$chx_dir/zookeeper
zk_libs=$cache/zookeeper-$zk_version

# zk_ok: ZooKeeper answers the `srvr` four-letter word as a standalone server.
zk_ok() {
  local out
  out=$(exec 3<>"/dev/tcp/127.0.0.1/$zk_port" && printf srvr >&3 && timeout 5 cat <&3) 2>/dev/null || return 1
  grep -F "Mode: standalone" >/dev/null <<<"$out"
}

zk_start() {
  need_java
  maven_fetch "$here/testbed/zookeeper-pom.xml" "$zk_libs"
  if pid_alive "$zk_dir/pid"; then log "zookeeper already running"; return 0; fi
  mkdir -p "$zk_dir/data"
  cat >"$zk_dir/zoo.cfg" <<EOC
tickTime=2000
dataDir=$zk_dir/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr,stat,cons
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOC
  spawn "$zk_dir/pid" "$zk_dir/server.log" \
    java -Xms32m -Xmx256m -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd HH:mm:ss.SSS" \
    -cp "$zk_libs/*" org.apache.zookeeper.server.ZooKeeperServerMain "$zk_dir/zoo.cfg"
  wait_for zookeeper "$zk_dir/pid" 60 "$zk_dir/server.log" zk_ok
  log "zookeeper $zk_version up on 127.0.0.1:$zk_port"
}

# chx_node_start N: node N (1 or 2) of the cluster.
chx_node_start() {
  local n=$1
  local dir=$chx_dir/node$n
  local http=$((chx_http_port + n - 1))
  if pid_alive "$dir/pid"; then log "clickhouse-cluster node $n already running"; return 0; fi
  mkdir -p "$dir/data" "$dir/tmp" "$dir/user_files" "$dir/format_schemas"
  local replicas="" i
  for i in 1 2; do
    replicas+="<replica><host>127.0.0.1</host><port>$((chx_tcp_port + i - 1))</port></replica>"
  done
  cat >"$dir/config.xml" <<EOC
<?xml version="1.0"?>
<yandex>
  <logger>
    <level>information</level>
    <log>$dir/server.log</log>
    <errorlog>$dir/error.log</errorlog>
    <size>100M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>$http</http_port>
  <tcp_port>$((chx_tcp_port + n - 1))</tcp_port>
  <interserver_http_port>$((chx_interserver_port + n - 1))</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>$dir/data/</path>
  <tmp_path>$dir/tmp/</tmp_path>
  <user_files_path>$dir/user_files/</user_files_path>
  <format_schema_path>$dir/format_schemas/</format_schema_path>
  <users_config>$dir/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <max_concurrent_queries>100</max_concurrent_queries>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <mlock_executable>false</mlock_executable>
  <zookeeper>
    <node><host>127.0.0.1</host><port>$zk_port</port></node>
    <session_timeout_ms>30000</session_timeout_ms>
  </zookeeper>
  <!-- Both nodes on 127.0.0.1: a node knows itself in a cluster by host and native port.
       internal_replication is true, as for Replicated tables: 18.16 refuses an ALTER ... ON
       CLUSTER of a Replicated table where it is false, and of any other table (a Distributed
       one) where it is true (code 371). -->
  <remote_servers>
    <sluice_cluster>
      <shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>$chx_tcp_port</port></replica></shard>
      <shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>$((chx_tcp_port + 1))</port></replica></shard>
    </sluice_cluster>
    <sluice_replicated>
      <shard><internal_replication>true</internal_replication>$replicas</shard>
    </sluice_replicated>
  </remote_servers>
  <macros>
    <shard>0$n</shard>
    <replica>ch$n</replica>
    <replicated_shard>r01</replicated_shard>
  </macros>
  <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
</yandex>
EOC
  cat >"$dir/users.xml" <<'EOC'
<?xml version="1.0"?>
<yandex>
  <profiles>
    <default>
      <max_memory_usage>2000000000</max_memory_usage>
      <load_balancing>random</load_balancing>
    </default>
  </profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>::/0</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <quotas>
    <default>
      <interval>
        <duration>3600</duration>
        <queries>0</queries>
        <errors>0</errors>
        <result_rows>0</result_rows>
        <read_rows>0</read_rows>
        <execution_time>0</execution_time>
      </interval>
    </default>
  </quotas>
</yandex>
EOC
  local bin
  bin=$(command -v clickhouse-server || echo /usr/bin/clickhouse-server)
  spawn "$dir/pid" "$dir/stdout.log" "$bin" --config-file="$dir/config.xml"
  wait_for "clickhouse-cluster node $n" "$dir/pid" 60 "$dir/stdout.log" chx_ping "$n"
}

chx_ping() { [ "$(curl -fsS "http://127.0.0.1:$((chx_http_port + $1 - 1))/ping")" = "Ok." ]; }
chx_query() { curl -fsS "http://127.0.0.1:$((chx_http_port + $1 - 1))/" --data-binary "$2"; }

chx_start() {
  apt_install clickhouse-server clickhouse-client curl
  zk_start
  chx_node_start 1
  chx_node_start 2
  # Each node sees ZooKeeper and both nodes in its clusters.
  local n
  for n in 1 2; do
    wait_for "clickhouse-cluster node $n" "$chx_dir/node$n/pid" 30 "$chx_dir/node$n/server.log" \
      chx_query "$n" "SELECT count() FROM system.zookeeper WHERE path = '/'"
  done
  log "clickhouse-cluster $(chx_query 1 'SELECT version()') up: http://127.0.0.1:$chx_http_port and" \
    ":$((chx_http_port + 1)) (native $chx_tcp_port, $((chx_tcp_port + 1))), zookeeper 127.0.0.1:$zk_port"
}

chx_stop() {
  stop_pidfile "clickhouse-cluster node 1" "$chx_dir/node1/pid"
  stop_pidfile "clickhouse-cluster node 2" "$chx_dir/node2/pid"
  stop_pidfile zookeeper "$zk_dir/pid"
}

# ---------------------------------------------------------------------------------------------
# ClickHouse current: chdb (the ClickHouse engine as a Python module) behind an HTTP front

chc_dir=$state/clickhouse-current
chc_venv=$cache/clickhouse-current

chc_start() {
  # The pins (numpy 2.4, pandas 3) want Python 3.11: Debian 12's.
  venv_install "$chc_venv" "$here/testbed/clickhouse-current-requirements.txt" "chdb (ClickHouse in process)" 11
  command -v curl >/dev/null || apt_install curl
  if pid_alive "$chc_dir/pid"; then log "clickhouse-current already running"; return 0; fi
  mkdir -p "$chc_dir/data"
  spawn "$chc_dir/pid" "$chc_dir/server.log" \
    env CLICKHOUSE_PASSWORD="${SLUICE_CLICKHOUSE_CURRENT_PASSWORD:-}" \
    "$chc_venv/bin/python" "$here/testbed/clickhouse_current.py" \
    --host 127.0.0.1 --port "$chc_port" --path "$chc_dir/data"
  wait_for clickhouse-current "$chc_dir/pid" 60 "$chc_dir/server.log" chc_ping
  log "clickhouse-current $(chc_query 'SELECT version()') (chdb) up on 127.0.0.1:$chc_port"
}

chc_ping() { [ "$(curl -fsS "http://127.0.0.1:$chc_port/ping")" = "Ok." ]; }
chc_query() {
  curl -fsS -u "default:${SLUICE_CLICKHOUSE_CURRENT_PASSWORD:-}" "http://127.0.0.1:$chc_port/" --data-binary "$1"
}

chc_stop() { stop_pidfile clickhouse-current "$chc_dir/pid"; }

# ---------------------------------------------------------------------------------------------
# mongo-java-server: two in-memory servers (source, target) in one JVM

mongo_dir=$state/mongo
mongo_libs=$cache/mongo-java-server

mongo_start() {
  need_java
  command -v javac >/dev/null || die "javac (JDK 17) is needed to compile the mongo-java-server launcher"
  maven_fetch "$here/testbed/mongo-pom.xml" "$mongo_libs"
  if pid_alive "$mongo_dir/pid"; then log "mongo already running"; return 0; fi
  mkdir -p "$mongo_dir/classes"
  if [ ! -f "$mongo_dir/classes/MongoLauncher.class" ] ||
    [ "$here/testbed/MongoLauncher.java" -nt "$mongo_dir/classes/MongoLauncher.class" ]; then
    javac -d "$mongo_dir/classes" -cp "$mongo_libs/*" "$here/testbed/MongoLauncher.java" ||
      die "could not compile MongoLauncher.java"
  fi
  # Everything, the oplog included, lives in the heap and is never trimmed: the benchmarks'
  # hundreds of thousands of documents need room.
  spawn "$mongo_dir/pid" "$mongo_dir/server.log" \
    java -Xmx6g -XX:+UseParallelGC -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -cp "$mongo_libs/*:$mongo_dir/classes" MongoLauncher "$mongo_source_port" "$mongo_target_port"
  wait_for mongo "$mongo_dir/pid" 60 "$mongo_dir/server.log" port_open "$mongo_source_port"
  wait_for mongo "$mongo_dir/pid" 30 "$mongo_dir/server.log" port_open "$mongo_target_port"
  log "mongo-java-server up on 127.0.0.1:$mongo_source_port (source) and :$mongo_target_port (target)"
}

mongo_stop() { stop_pidfile mongo "$mongo_dir/pid"; }

# ---------------------------------------------------------------------------------------------
# The checkers of the deployment files, pinned in testbed/tools-requirements.txt; reinstalled
# when that file changes.

tools() {
  venv_install "$cache/tools" "$here/testbed/tools-requirements.txt" "the deployment checkers"
  (
    flock 9
    promtool_install
  ) 9>"$cache/promtool.lock" || exit 1
  echo "$cache/tools/bin"
}

# promtool (Prometheus's rule tester, for deploy/prometheus/alerts_test.yml): built once with Go
# from the Go module proxy (Prometheus 3.x's module version), into the checkers' bin folder.
promtool_version=v0.316.0
promtool_install() {
  local bin=$cache/tools/bin/promtool
  [ -x "$bin" ] && [ "$(cat "$cache/tools/.promtool" 2>/dev/null)" = "$promtool_version" ] && return 0
  command -v go >/dev/null || die "promtool is built with Go, which is not installed"
  log "building promtool $promtool_version from the Go module proxy (once; a few minutes)"
  GOPATH=$cache/go GOBIN=$cache/tools/bin GOFLAGS=-mod=mod \
    go install "github.com/prometheus/prometheus/cmd/promtool@$promtool_version" \
    >"$cache/promtool-build.log" 2>&1 ||
    { tail -n 20 "$cache/promtool-build.log" >&2; die "cannot build promtool (log: $cache/promtool-build.log)"; }
  echo "$promtool_version" >"$cache/tools/.promtool"
}

print_env() {
  cat <<EOF
export SLUICE_MYSQL_URL=mysql://sluice:sluice@127.0.0.1:$mariadb_port
export SLUICE_TLS_DIR=$tls_dir
export SLUICE_KAFKA_SASL_BROKERS=127.0.0.1:$kafka_sasl_port
export SLUICE_CLICKHOUSE_HTTPS_URL=https://127.0.0.1:$ch_https_port
export SLUICE_KAFKA_BROKERS=127.0.0.1:$kafka_port
export SLUICE_CLICKHOUSE_URL=http://127.0.0.1:$ch_http_port
export SLUICE_CLICKHOUSE_CURRENT_URL=http://127.0.0.1:$chc_port
export SLUICE_MONGO_SOURCE_URL=mongodb://127.0.0.1:$mongo_source_port/?directConnection=true
export SLUICE_MONGO_TARGET_URL=mongodb://127.0.0.1:$mongo_target_port/?directConnection=true
export SLUICE_CLICKHOUSE_CLUSTER_URLS=http://127.0.0.1:$chx_http_port,http://127.0.0.1:$((chx_http_port + 1))
export SLUICE_CLICKHOUSE_CLUSTER_SHARDED=sluice_cluster
export SLUICE_CLICKHOUSE_CLUSTER_REPLICATED=sluice_replicated
export SLUICE_ZOOKEEPER=127.0.0.1:$zk_port
EOF
}

status_line() {
  local name=$1 pidfile=$2 where=$3
  if pid_alive "$pidfile"; then
    printf '%-18s running   pid %-8s %s\n' "$name" "$(cat "$pidfile")" "$where"
  else
    printf '%-18s stopped\n' "$name"
  fi
}

status() {
  status_line mariadb "$mariadb_dir/pid" "mysql://127.0.0.1:$mariadb_port (binlog ROW, server_id 1)"
  status_line kafka "$kafka_dir/pid" "127.0.0.1:$kafka_port (Kafka $kafka_version, KRaft)"
  status_line clickhouse "$ch_dir/pid" "http://127.0.0.1:$ch_http_port, native :$ch_tcp_port"
  status_line clickhouse-current "$chc_dir/pid" "http://127.0.0.1:$chc_port (ClickHouse in process: chdb, HTTP only)"
  status_line mongo "$mongo_dir/pid" "mongodb://127.0.0.1:$mongo_source_port (source), :$mongo_target_port (target)"
  # The cluster: its three processes, each named with its pid.
  local up=() down=() part
  for part in zookeeper node1 node2; do
    if pid_alive "$chx_dir/$part/pid"; then up+=("$part=$(cat "$chx_dir/$part/pid")"); else down+=("$part"); fi
  done
  if [ ${#down[@]} -eq 0 ]; then
    printf '%-18s running   %s\n' clickhouse-cluster "http://127.0.0.1:$chx_http_port and :$((chx_http_port + 1)) (native $chx_tcp_port, $((chx_tcp_port + 1))), zookeeper :$zk_port; pids ${up[*]}"
  elif [ ${#up[@]} -eq 0 ]; then
    printf '%-18s stopped\n' clickhouse-cluster
  else
    printf '%-18s partly    running: %s; stopped: %s\n' clickhouse-cluster "${up[*]}" "${down[*]}"
  fi
  echo "data and logs: $state"
}

# services_of DEFAULT SERVICE...: the services named, checked, or those of the array DEFAULT.
# Assign its output (list=$(...)): a `for` over $(...) would go on after its `die`.
services_of() {
  local -n default=$1
  shift
  if [ $# -eq 0 ]; then
    echo "${default[@]}"
    return
  fi
  local s
  for s in "$@"; do
    case $s in
      mariadb | kafka | clickhouse | clickhouse-current | mongo | clickhouse-cluster) echo "$s" ;;
      *) die "unknown service '$s' (known: ${known_services[*]})" ;;
    esac
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  start)
    mkdir -p "$state" "$cache"
    list=$(services_of all_services "$@")
    for s in $list; do
      case $s in
        mariadb) mariadb_start ;; kafka) kafka_start ;; clickhouse) ch_start ;;
        clickhouse-current) chc_start ;; mongo) mongo_start ;; clickhouse-cluster) chx_start ;;
      esac
    done
    ;;
  stop)
    list=$(services_of known_services "$@")
    for s in $list; do
      case $s in
        mariadb) mariadb_stop ;; kafka) kafka_stop ;; clickhouse) ch_stop ;;
        clickhouse-current) chc_stop ;; mongo) mongo_stop ;; clickhouse-cluster) chx_stop ;;
      esac
    done
    ;;
  status) status ;;
  env) print_env ;;
  tools)
    mkdir -p "$cache"
    tools
    ;;
  reset)
    [ $# -gt 0 ] || die "reset: name the services whose data goes (known: ${known_services[*]})"
    list=$(services_of known_services "$@")
    for s in $list; do
      case $s in
        mariadb) mariadb_stop; rm -rf "$mariadb_dir" ;;
        kafka) kafka_stop; rm -rf "$kafka_dir" ;;
        clickhouse) ch_stop; rm -rf "$ch_dir" ;;
        clickhouse-current) chc_stop; rm -rf "$chc_dir" ;;
        mongo) mongo_stop; rm -rf "$mongo_dir" ;;
        clickhouse-cluster) chx_stop; rm -rf "$chx_dir" ;;
      esac
      log "$s reset: its data is gone"
    done
    ;;
  clean)
    "$0" stop
    rm -rf "$state"
    log "removed $state"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
