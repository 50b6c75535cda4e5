//! The binlog reader: from a start position to change events on Kafka, resumable.
//!
//! Progress and resumption:
//! - At start the capture reads its checkpoint (`[publish] checkpoint_topic`, key = connector).
//!   With one, it resumes at the checkpoint's binlog coordinate, after checking that the source
//!   is the same server and still has that binlog file; without one it starts at `[mysql] start`.
//! - Rows are published as they are read (a large transaction streams through in bounded
//!   memory); at each commit (XID, COMMIT, or a DDL statement) the capture queues a mark with the
//!   position after the commit. The publisher stores a mark's position only after Kafka
//!   acknowledged every event before it.
//! - A dropped connection is noticed by the server's heartbeats (`[mysql] heartbeat_ms`) going
//!   silent and re-opened from the last commit: the rows of a transaction cut in half are
//!   published again, with the same versions, which apply ignores.
//! - Schemas come from `information_schema` when a table is first seen and after each DDL that
//!   names it; every schema is published to the schema topic before the first event using it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use mysql_async::binlog::events::{Event, EventData, RowsEventData, TableMapEvent};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn, Opts};
use prometheus::{IntGauge, Registry};
use prost::Message;
use sluice_common::Shutdown;
use sluice_proto::v1::{self, Op, TableSchema};
use sluice_proto::{
    event_key, mysql_version, schema_record_key, EventHeader, TopicTemplate, CONTRACT_VERSION,
};

use super::ddl::{self, Statement, TxControl};
use super::decode::{DecodeError, Image, TableDecoder};
use super::position::{BinlogPos, Checkpoint, Start};
use super::snapshot::{self, Msg, SnapshotMetrics, SnapshotRun};
use super::{schema, Config};
/// Databases never captured.
pub const SYSTEM_DATABASES: &[&str] = &["mysql", "information_schema", "performance_schema", "sys"];

use crate::filter::Filter;
use crate::publish::{read_checkpoint, PublishError, PublishMetrics, Publisher};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("MySQL: {0}")]
    Mysql(#[from] mysql_async::Error),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("{0}")]
    Definite(String),
    #[error("decoding {table} at {pos}: {reason}")]
    Decode {
        table: String,
        pos: String,
        reason: String,
    },
}

impl CaptureError {
    /// Worth reconnecting for: the network or the server went away. Everything else would fail
    /// the same way again.
    fn transient(&self) -> bool {
        match self {
            CaptureError::Mysql(mysql_async::Error::Io(_)) => true,
            CaptureError::Mysql(mysql_async::Error::Driver(d)) => matches!(
                d,
                mysql_async::DriverError::ConnectionClosed
                    | mysql_async::DriverError::PoolDisconnected
            ),
            // Server shutdown in progress, lost connection during query.
            CaptureError::Mysql(mysql_async::Error::Server(e)) => {
                matches!(e.code, 1053 | 2013 | 2006)
            }
            _ => false,
        }
    }
}

/// The capture's own metrics (the publisher has the event counters).
struct StreamMetrics {
    file_number: IntGauge,
    offset: IntGauge,
    reconnects: prometheus::IntCounter,
}

impl StreamMetrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let file_number = IntGauge::new(
            "sluice_capture_binlog_file_number",
            "Numeric suffix of the binlog file being read.",
        )?;
        let offset = IntGauge::new(
            "sluice_capture_binlog_offset_bytes",
            "Offset in the binlog file being read.",
        )?;
        let reconnects = prometheus::IntCounter::new(
            "sluice_capture_reconnects_total",
            "Binlog connections re-opened after a transient failure.",
        )?;
        r.register(Box::new(file_number.clone()))?;
        r.register(Box::new(offset.clone()))?;
        r.register(Box::new(reconnects.clone()))?;
        Ok(Self {
            file_number,
            offset,
            reconnects,
        })
    }
}

struct DecoderEntry {
    database: String,
    table: String,
    schema: std::sync::Arc<TableSchema>,
    decoder: std::sync::Arc<TableDecoder>,
    /// Worked out once per table map, not per row.
    topic: String,
    key_prefix: Vec<u8>,
    counters: [prometheus::IntCounter; 3], // insert, update, delete
    bytes: prometheus::IntCounter,
}

struct TxState {
    id: String,
    gtid: String,
    index: u64,
    commit_time_micros: i64,
}

/// What the server says about itself.
struct ServerInfo {
    server_id: u32,
    server_uuid: String,
    mariadb: bool,
    binlogs: Vec<String>,
}

pub struct Capture {
    config: Config,
    opts: Opts,
    schema_conn: Conn,
    server: ServerInfo,
    filter: Filter,
    topics: TopicTemplate,
    publisher: Publisher<Checkpoint>,
    metrics: StreamMetrics,
    publish_metrics: PublishMetrics,
    schemas: HashMap<(String, String), TableSchema>,
    /// table id -> decoder, rebuilt at each table map whose schema changed.
    decoders: HashMap<u64, DecoderEntry>,
    published_schemas: HashSet<u64>,
    /// Current binlog file and the position to resume from after the last commit.
    file: String,
    resume: BinlogPos,
    last_gtid: String,
    tx: Option<TxState>,
    /// While starting from a timestamp: skip transactions that began before it.
    skip_until: Option<u64>,
    source: v1::Source,
    /// The end of the last event read in `file`.
    read_to: u64,
    snapshot: Option<SnapshotRun>,
    snapshots_done: Vec<String>,
    snapshot_metrics: std::sync::Arc<SnapshotMetrics>,
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

async fn server_info(conn: &mut Conn) -> Result<ServerInfo, CaptureError> {
    let (server_id, version): (u32, String) = conn
        .query_first("SELECT @@server_id, @@version")
        .await?
        .unwrap_or_default();
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let server_uuid: String = if mariadb {
        String::new()
    } else {
        conn.query_first("SELECT @@server_uuid")
            .await?
            .unwrap_or_default()
    };
    let binlogs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await?;
    let binlogs = binlogs
        .into_iter()
        .filter_map(|r| r.get::<String, _>(0))
        .collect();
    Ok(ServerInfo {
        server_id,
        server_uuid,
        mariadb,
        binlogs,
    })
}

impl Capture {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, CaptureError> {
        let opts = Opts::from_url(&config.mysql.url).expect("validated at load");
        let mut schema_conn = Conn::new(opts.clone()).await?;
        let server = server_info(&mut schema_conn).await?;
        let filter = Filter::new(&config.filter, SYSTEM_DATABASES)
            .map_err(|(k, m)| CaptureError::Definite(format!("{k}: {m}")))?;
        let topics = config
            .topics
            .template()
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        let publish_metrics = PublishMetrics::new(registry).expect("metrics register once");
        let metrics = StreamMetrics::new(registry).expect("metrics register once");
        let snapshot_metrics =
            std::sync::Arc::new(SnapshotMetrics::new(registry).expect("metrics register once"));
        let checkpoint: Option<Checkpoint> = read_checkpoint(
            &config.kafka,
            &config.publish.checkpoint_topic,
            &config.connector,
            "capture-mysql",
        )
        .await?;
        let publisher = Publisher::start(
            &config.kafka,
            &config.publish,
            "capture-mysql",
            &config.connector,
            publish_metrics.clone(),
        )
        .await?;
        let source = v1::Source {
            kind: if server.mariadb {
                v1::SourceKind::Mariadb
            } else {
                v1::SourceKind::Mysql
            } as i32,
            connector: config.connector.clone(),
            server_id: server.server_id,
            server_uuid_or_replica_set: server.server_uuid.clone(),
        };
        let mut capture = Self {
            opts,
            schema_conn,
            filter,
            topics,
            publisher,
            metrics,
            publish_metrics,
            schemas: HashMap::new(),
            decoders: HashMap::new(),
            published_schemas: HashSet::new(),
            file: String::new(),
            resume: BinlogPos {
                file: String::new(),
                pos: 4,
            },
            last_gtid: String::new(),
            tx: None,
            skip_until: None,
            source,
            server,
            config,
            read_to: 4,
            snapshot: None,
            snapshots_done: Vec::new(),
            snapshot_metrics,
        };
        let fresh = checkpoint.is_none();
        let (progress, done) = checkpoint
            .as_ref()
            .map(|c| (c.snapshot.clone(), c.snapshots_done.clone()))
            .unwrap_or_default();
        capture.resume = capture.start_position(checkpoint).await?;
        capture.file = capture.resume.file.clone();
        capture.read_to = capture.resume.pos;
        capture.snapshots_done = done;
        capture
            .next_snapshot(progress.map(|p| (*p).clone()))
            .await?;
        if fresh && !capture.resume.file.is_empty() && capture.skip_until.is_none() {
            // A new capture stores where it starts before anything else: killed before its
            // first transaction is checkpointed, it must not start again at a later `end`.
            capture.mark_now().await?;
        }
        Ok(capture)
    }

    /// Where to begin: the checkpoint, or `[mysql] start`.
    async fn start_position(
        &mut self,
        checkpoint: Option<Checkpoint>,
    ) -> Result<BinlogPos, CaptureError> {
        if let Some(c) = checkpoint {
            if c.server_id != self.server.server_id
                || (!c.server_uuid.is_empty() && c.server_uuid != self.server.server_uuid)
            {
                return Err(CaptureError::Definite(format!(
                    "the checkpoint of connector {:?} was written reading server_id {} ({}), \
                     but the source is server_id {} ({}): binlog coordinates of another server \
                     mean nothing here. Use a new connector name (and re-snapshot) for a new \
                     source.",
                    self.config.connector,
                    c.server_id,
                    c.server_uuid,
                    self.server.server_id,
                    self.server.server_uuid
                )));
            }
            self.check_not_purged(&c.next.file, "the stored checkpoint")?;
            tracing::info!(resume = %c.next, gtid = %c.last_gtid, "resuming from the checkpoint");
            self.last_gtid = c.last_gtid;
            return Ok(c.next);
        }
        let start = Start::parse(&self.config.mysql.start).map_err(CaptureError::Definite)?;
        let pos = match start {
            Start::End => {
                let row: Option<mysql_async::Row> =
                    self.schema_conn.query_first("SHOW MASTER STATUS").await?;
                let row = row.ok_or_else(|| {
                    CaptureError::Definite(
                        "SHOW MASTER STATUS is empty: binary logging is off".into(),
                    )
                })?;
                BinlogPos {
                    file: row.get(0).unwrap_or_default(),
                    pos: row.get(1).unwrap_or(4),
                }
            }
            Start::Earliest => BinlogPos {
                file: self.server.binlogs.first().cloned().ok_or_else(|| {
                    CaptureError::Definite("the server lists no binary logs".into())
                })?,
                pos: 4,
            },
            Start::Timestamp(t) => {
                self.skip_until = Some(t);
                BinlogPos {
                    file: self.file_before(t).await?,
                    pos: 4,
                }
            }
            Start::At(p) => {
                self.check_not_purged(&p.file, "mysql.start")?;
                p
            }
            Start::Gtid(set) => {
                // Resolved by the server at dump time; the file comes with the first rotate.
                self.last_gtid = set;
                BinlogPos {
                    file: String::new(),
                    pos: 4,
                }
            }
        };
        tracing::info!(start = %pos, mode = %self.config.mysql.start, "starting without a checkpoint");
        Ok(pos)
    }

    /// The newest binlog file created before `t` (UNIX seconds): every event of the files
    /// before it is older than `t`, so reading for `time:` starts there instead of at the
    /// oldest file. A file's creation time is the timestamp of its first events (the format
    /// description); events inside a file are then skipped up to `t`.
    async fn file_before(&self, t: u64) -> Result<String, CaptureError> {
        let files = &self.server.binlogs;
        let first = files
            .first()
            .cloned()
            .ok_or_else(|| CaptureError::Definite("the server lists no binary logs".into()))?;
        for file in files.iter().rev() {
            match self.file_created(file).await? {
                Some(created) if u64::from(created) < t => {
                    tracing::info!(file = %file, created, start_time = t, "the start time is in or after this binlog file");
                    return Ok(file.clone());
                }
                _ => {}
            }
        }
        Ok(first)
    }

    /// The timestamp of the first timed event of a binlog file, read with a short dump.
    async fn file_created(&self, file: &str) -> Result<Option<u32>, CaptureError> {
        let mut conn = Conn::new(self.opts.clone()).await?;
        if self.server.mariadb {
            conn.query_drop("SET @mariadb_slave_capability = 4").await?;
        }
        let request = BinlogStreamRequest::new(self.config.mysql.server_id)
            .with_filename(file.as_bytes())
            .with_pos(4u64);
        let mut stream = conn.get_binlog_stream(request).await?;
        // The dump begins with a rotate event stamped 0, then the file's own events.
        for _ in 0..4 {
            let next = tokio::time::timeout(Duration::from_secs(30), stream.next())
                .await
                .map_err(|_| {
                    CaptureError::Definite(format!(
                        "no event within 30 s reading the start of binlog file {file}"
                    ))
                })?;
            match next {
                Some(Ok(event)) if event.header().timestamp() != 0 => {
                    return Ok(Some(event.header().timestamp()))
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break,
            }
        }
        Ok(None)
    }

    /// Start the snapshot that is due: an unfinished one from the checkpoint, the initial one,
    /// or a re-snapshot request not yet served.
    async fn next_snapshot(
        &mut self,
        resume: Option<snapshot::SnapshotProgress>,
    ) -> Result<(), CaptureError> {
        let config = self.config.snapshot.clone();
        let (id, only, progress) = if let Some(p) = resume {
            let names: Vec<String> = p.tables.keys().cloned().collect();
            (p.id.clone(), names, Some(p))
        } else if config.initial() && !self.snapshots_done.iter().any(|d| d == snapshot::INITIAL) {
            (snapshot::INITIAL.to_string(), Vec::new(), None)
        } else if !config.request_id.is_empty() && !self.snapshots_done.contains(&config.request_id)
        {
            (config.request_id.clone(), config.tables.clone(), None)
        } else {
            return Ok(());
        };
        let filter = &self.filter;
        let listed =
            snapshot::list_tables(&mut self.schema_conn, |db, t| filter.wants(db, t), &only)
                .await?;
        let mut tables = Vec::new();
        match &progress {
            Some(p) => {
                for (name, tp) in &p.tables {
                    let Some((db, table)) = name.split_once('.') else {
                        continue;
                    };
                    let estimate = listed
                        .iter()
                        .find(|(d, t, _)| d == db && t == table)
                        .map(|x| x.2)
                        .unwrap_or(0);
                    let mut run = snapshot::new_table_run(db.into(), table.into(), estimate);
                    snapshot::decode_key(&tp.after).map_err(CaptureError::Definite)?;
                    run.progress = tp.clone();
                    run.rows_at_start = tp.rows;
                    tables.push(run);
                }
            }
            None => {
                for (db, table, estimate) in listed {
                    tables.push(snapshot::new_table_run(db, table, estimate));
                }
            }
        }
        tracing::info!(
            snapshot = %id,
            tables = tables.len(),
            resumed = progress.is_some(),
            "snapshot starts; streaming goes on meanwhile"
        );
        self.snapshot = Some(SnapshotRun::new(
            id,
            tables,
            &config,
            &self.opts,
            self.server.mariadb,
            self.snapshot_metrics.clone(),
        ));
        Ok(())
    }

    /// The stream's position as a version: every event read so far is below it.
    fn stream_version(&self) -> u64 {
        let seq = sluice_proto::binlog_file_seq(&self.file).unwrap_or(0);
        seq << 32 | self.read_to
    }

    fn before_pos(&self, a: &BinlogPos, b: &BinlogPos) -> bool {
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        (seq(&a.file), a.pos) < (seq(&b.file), b.pos)
    }

    fn before(&self, p: &BinlogPos) -> bool {
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        (seq(&self.file), self.read_to) < (seq(&p.file), p.pos)
    }

    /// Between two transactions: publish the chunks read, ask for the next ones, finish the
    /// snapshot when every table is done. Returns true when a snapshot just finished.
    async fn snapshot_step(&mut self) -> Result<bool, CaptureError> {
        let due = self
            .snapshot
            .as_ref()
            .is_some_and(|r| r.dirty || r.wait_for.as_ref().is_some_and(|p| !self.before(p)));
        if !due {
            return Ok(false);
        }
        let Some(mut run) = self.snapshot.take() else {
            return Ok(false);
        };
        run.dirty = false;
        run.wait_for = None;
        let result = self.snapshot_work(&mut run).await;
        let finished = match result {
            Ok(()) => run.done(),
            Err(e) => {
                self.snapshot = Some(run);
                return Err(e);
            }
        };
        if !finished {
            self.snapshot = Some(run);
            return Ok(false);
        }
        tracing::info!(snapshot = %run.id, "snapshot finished");
        run.update_metrics();
        self.snapshots_done.push(run.id.clone());
        drop(run);
        self.mark_now().await?;
        self.next_snapshot(None).await?;
        Ok(true)
    }

    async fn snapshot_work(&mut self, run: &mut SnapshotRun) -> Result<(), CaptureError> {
        let mut progressed = false;
        for i in 0..run.tables.len() {
            // Keyed chunk read: publish what the stream did not touch since it was asked for.
            // ... once the stream has read as far as the chunk's snapshot.
            let reached = |f: &snapshot::InFlight| match &f.ready {
                Some((_, _, Some(p))) => !self.before(p),
                Some((_, _, None)) => true,
                None => false,
            };
            let ready = run.tables[i]
                .in_flight
                .as_mut()
                .filter(|f| reached(f))
                .and_then(|f| f.ready.take().map(|r| (r, std::mem::take(&mut f.touched))));
            if let Some(Some((_, _, Some(p)))) = run.tables[i].in_flight.as_ref().map(|f| &f.ready)
            {
                // Still ahead of the stream: look again when the stream gets there.
                if run.wait_for.as_ref().is_none_or(|w| self.before_pos(p, w)) {
                    run.wait_for = Some(p.clone());
                }
            }
            if let Some(((schema, rows, _), touched)) = ready {
                let full = rows.len() as u64 >= run.chunk_rows;
                let last = rows.last().map(|r| snapshot::key_of(&schema, r));
                let t = &mut run.tables[i];
                let sent = self
                    .publish_snapshot_rows(t, &schema, rows, Some(&touched))
                    .await?;
                t.in_flight = None;
                if let Some(k) = last {
                    t.progress.after = snapshot::encode_key(&k);
                }
                t.progress.rows += sent;
                t.progress.done = !full;
                run.metrics.chunks.with_label_values(&["published"]).inc();
                SnapshotRun::log_progress(t, t.progress.done);
                progressed = true;
            }
            // Keyless table: publish its rows once the stream holds at the snapshot's position.
            let at_hold = match run.tables[i]
                .in_flight
                .as_ref()
                .and_then(|f| f.hold.clone())
            {
                Some(Some(p)) if self.before(&p) => {
                    // The stream has still to get there: look again when it does (its rows
                    // may all have come already, and no message would wake us).
                    if run.wait_for.as_ref().is_none_or(|w| self.before_pos(&p, w)) {
                        run.wait_for = Some(p);
                    }
                    false
                }
                Some(Some(_)) => true,
                _ => false,
            };
            if at_hold {
                let t = &mut run.tables[i];
                let f = t.in_flight.as_mut().expect("checked");
                let rows = std::mem::take(&mut f.pending);
                let schema = f.schema.clone().expect("set with the hold");
                let ended = f.ended;
                if !rows.is_empty() {
                    let sent = self.publish_snapshot_rows(t, &schema, rows, None).await?;
                    t.progress.rows += sent;
                    SnapshotRun::log_progress(t, false);
                }
                if ended {
                    t.in_flight = None;
                    t.progress.done = true;
                    run.metrics.chunks.with_label_values(&["published"]).inc();
                    SnapshotRun::log_progress(t, true);
                    progressed = true;
                }
            }
        }
        // Ask for more: one chunk per table, `parallel_tables` tables at a time, one keyless
        // table at a time (it holds the stream).
        let mut busy = run.tables.iter().filter(|t| t.in_flight.is_some()).count();
        for i in 0..run.tables.len() {
            if busy >= run.parallel {
                break;
            }
            if run.tables[i].progress.done || run.tables[i].in_flight.is_some() {
                continue;
            }
            let (db, table) = (run.tables[i].database.clone(), run.tables[i].table.clone());
            let Some(schema) = self.schema_of(&db, &table).await? else {
                tracing::info!(table = %run.tables[i].name, "table gone: nothing to snapshot");
                run.tables[i].progress.done = true;
                progressed = true;
                continue;
            };
            let keyless = schema.primary_key.is_empty();
            if keyless && run.hold().is_some() {
                continue;
            }
            let after = snapshot::decode_key(&run.tables[i].progress.after)
                .map_err(CaptureError::Definite)?;
            let chunk = run.next_chunk;
            run.next_chunk += 1;
            let t = &mut run.tables[i];
            if t.started.is_none() {
                t.started = Some(std::time::Instant::now());
                SnapshotRun::log_progress(t, true);
            }
            t.in_flight = Some(snapshot::InFlight {
                chunk,
                asked_at: self.stream_version(),
                touched: Default::default(),
                ready: None,
                hold: keyless.then_some(None),
                schema: None,
                pending: Vec::new(),
                ended: false,
            });
            tokio::spawn(snapshot::read_chunk(
                run.pool.clone(),
                run.tx.clone(),
                snapshot::ChunkRequest {
                    chunk,
                    database: db,
                    table,
                    after,
                    limit: run.chunk_rows,
                    mariadb: run.mariadb,
                },
            ));
            busy += 1;
        }
        run.refresh_watch();
        if progressed {
            run.update_metrics();
            // The checkpoint carries the progress: a restart goes on from here.
            run.refresh_progress();
            let progress = Some(run.progress());
            self.mark_with(progress).await?;
        }
        Ok(())
    }

    /// A message of a snapshot reader.
    async fn on_snapshot_msg(&mut self, msg: Msg) -> Result<(), CaptureError> {
        let file = self.file.clone();
        let read_to = self.read_to;
        let Some(run) = self.snapshot.as_mut() else {
            return Ok(());
        };
        run.dirty = true;
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        let retry = |run: &mut SnapshotRun, chunk: u64, why: &str| {
            if let Some(t) = run.table_of(chunk) {
                tracing::info!(table = %t.name, why, "snapshot chunk read again");
                t.in_flight = None;
            }
            run.metrics.chunks.with_label_values(&["retried"]).inc();
            run.refresh_watch();
        };
        match msg {
            Msg::Chunk {
                chunk,
                schema,
                rows,
                at,
            } => {
                let Some(t) = run.table_of(chunk) else {
                    return Ok(());
                };
                let f = t.in_flight.as_mut().expect("found by chunk");
                if let Some(p) = &at {
                    // The snapshot must include everything the stream read before asking.
                    if (seq(&p.file) << 32 | p.pos) < f.asked_at {
                        retry(run, chunk, "the snapshot is older than the stream position");
                        return Ok(());
                    }
                }
                f.ready = Some((schema, rows, at));
                f.hold = None;
            }
            Msg::Began { chunk, schema, at } => {
                let Some(t) = run.table_of(chunk) else {
                    return Ok(());
                };
                let f = t.in_flight.as_mut().expect("found by chunk");
                if (seq(&file), read_to) > (seq(&at.file), at.pos) {
                    // The stream already read past the snapshot: it cannot hold there.
                    retry(run, chunk, "the stream is past the snapshot position");
                    return Ok(());
                }
                f.hold = Some(Some(at));
                f.schema = Some(schema);
            }
            Msg::Batch { chunk, rows } => {
                if let Some(t) = run.table_of(chunk) {
                    let f = t.in_flight.as_mut().expect("found by chunk");
                    f.pending.extend(rows);
                }
            }
            Msg::Ended { chunk } => {
                if let Some(t) = run.table_of(chunk) {
                    t.in_flight.as_mut().expect("found by chunk").ended = true;
                }
            }
            Msg::Failed {
                chunk,
                error,
                transient,
            } => {
                if !transient {
                    return Err(CaptureError::Definite(error));
                }
                tracing::warn!(%error, "snapshot read failed; it is read again");
                retry(run, chunk, "a transient failure");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    /// Publish snapshot rows as SNAPSHOT_READ events at the stream's position, leaving out the
    /// keys in `touched`. Returns how many were published.
    async fn publish_snapshot_rows(
        &mut self,
        t: &snapshot::TableRun,
        schema: &TableSchema,
        rows: Vec<v1::Row>,
        touched: Option<&std::collections::HashSet<Vec<u8>>>,
    ) -> Result<u64, CaptureError> {
        self.publish_schema(schema).await?;
        let topic = self
            .topics
            .topic(&t.database, &t.table)
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        self.publisher.ensure_topic(&topic, false).await?;
        let at = self.read_to.max(4) - 1;
        let version =
            mysql_version(&self.file, at, 0).map_err(|e| CaptureError::Definite(e.to_string()))?;
        let now = now_micros();
        let mut event = v1::ChangeEvent {
            contract: CONTRACT_VERSION,
            source: Some(self.source.clone()),
            op: Op::SnapshotRead as i32,
            database: t.database.clone(),
            table: t.table.clone(),
            version,
            position: Some(self.position(at, 0)),
            commit_time_micros: now,
            capture_time_micros: now,
            transaction: None,
            schema_id: schema.schema_id,
            schema: None,
            key: None,
            before: None,
            after: None,
            ddl: None,
            mongo: None,
        };
        let counter = self.publish_metrics.events.with_label_values(&[
            &t.database,
            &t.table,
            "snapshot_read",
        ]);
        let bytes = self
            .publish_metrics
            .bytes
            .with_label_values(&[&t.database, &t.table]);
        let rows_counter = self
            .snapshot_metrics
            .rows
            .with_label_values(&[&t.database, &t.table]);
        let mut key_bytes = Vec::with_capacity(64);
        let mut payload = Vec::with_capacity(512);
        let mut sent = 0u64;
        let mut skipped = 0u64;
        for row in rows {
            let key = snapshot::key_of(schema, &row);
            sluice_proto::append_event_key(&t.key_prefix, &key, &mut key_bytes);
            if touched.is_some_and(|k| k.contains(&key_bytes)) {
                skipped += 1;
                continue;
            }
            event.key = Some(v1::Row { values: key });
            event.after = Some(row);
            payload.clear();
            sluice_proto::encode_event(&mut event, &mut payload);
            self.publisher
                .send(&topic, &key_bytes, &payload, None)
                .await?;
            counter.inc();
            bytes.inc_by(payload.len() as u64);
            sent += 1;
        }
        rows_counter.inc_by(sent);
        if skipped > 0 {
            self.snapshot_metrics
                .left_to_stream
                .with_label_values(&[&t.database, &t.table])
                .inc_by(skipped);
        }
        Ok(sent)
    }

    /// Queue a checkpoint at the current position (between transactions).
    async fn mark_now(&mut self) -> Result<(), CaptureError> {
        let progress = self.snapshot.as_ref().map(|s| s.progress());
        self.mark_with(progress).await
    }

    async fn mark_with(
        &mut self,
        snapshot: Option<std::sync::Arc<snapshot::SnapshotProgress>>,
    ) -> Result<(), CaptureError> {
        let checkpoint = Checkpoint {
            next: self.resume.clone(),
            last_gtid: self.last_gtid.clone(),
            server_id: self.server.server_id,
            server_uuid: self.server.server_uuid.clone(),
            written_at: (now_micros() / 1_000_000) as u64,
            snapshot,
            snapshots_done: self.snapshots_done.clone(),
        };
        self.publisher.mark(checkpoint).await?;
        Ok(())
    }

    fn check_not_purged(&self, file: &str, what: &str) -> Result<(), CaptureError> {
        if self.server.binlogs.iter().any(|f| f == file) {
            return Ok(());
        }
        Err(CaptureError::Definite(format!(
            "{what} points into binlog file {file}, which the server no longer has (it was purged; \
             the oldest is {}). Changes since then are lost to the binlog: re-snapshot the tables \
             and start again from `end`, e.g. with a new connector name.",
            self.server.binlogs.first().map(String::as_str).unwrap_or("none")
        )))
    }

    /// Read until shutdown. Transient failures reconnect from the last commit.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), CaptureError> {
        let mut backoff = Duration::from_millis(500);
        let result = loop {
            match self.read_binlog(&shutdown).await {
                Ok(()) => break Ok(()),
                Err(e) if e.transient() && !shutdown.is_triggered() => {
                    self.publish_metrics
                        .errors
                        .with_label_values(&["connection"])
                        .inc();
                    self.metrics.reconnects.inc();
                    tracing::warn!(error = %e, resume = %self.resume, retry_in = ?backoff, "binlog connection lost; reconnecting");
                    tokio::select! {
                        _ = shutdown.wait() => break Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    // The schema connection may be gone too.
                    if let Ok(c) = Conn::new(self.opts.clone()).await {
                        self.schema_conn = c;
                    }
                }
                Err(e) => {
                    self.publish_metrics
                        .errors
                        .with_label_values(&[error_type(&e)])
                        .inc();
                    break Err(e);
                }
            }
        };
        let last = self.publisher.finish().await;
        match (&result, last) {
            (_, Ok(Some(c))) => tracing::info!(checkpoint = %c.next, "last checkpoint stored"),
            (_, Ok(None)) => {}
            (Ok(()), Err(e)) => return Err(e.into()),
            (Err(_), Err(e)) => tracing::error!(error = %e, "storing the last checkpoint failed"),
        }
        result
    }

    async fn read_binlog(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let mut conn = Conn::new(self.opts.clone()).await?;
        let heartbeat = Duration::from_millis(self.config.mysql.heartbeat_ms);
        conn.query_drop(format!(
            "SET @master_heartbeat_period = {}",
            heartbeat.as_nanos()
        ))
        .await?;
        let gtid_start = self.resume.file.is_empty();
        if self.server.mariadb {
            // Without this MariaDB rewrites its GTID events into dummy query events.
            conn.query_drop("SET @mariadb_slave_capability = 4").await?;
            if gtid_start {
                conn.exec_drop("SET @slave_connect_state = ?", (self.last_gtid.clone(),))
                    .await?;
                conn.query_drop("SET @slave_gtid_strict_mode = 1").await?;
            }
        }
        self.tx = None;
        let file = self.resume.file.clone();
        let mut request = BinlogStreamRequest::new(self.config.mysql.server_id)
            .with_filename(file.as_bytes())
            .with_pos(self.resume.pos);
        if gtid_start && !self.server.mariadb {
            let set = parse_mysql_gtid_set(&self.last_gtid).map_err(CaptureError::Definite)?;
            request = request.with_gtid().with_gtid_set(set);
        }
        let mut stream = conn.get_binlog_stream(request).await?;
        tracing::info!(from = %self.resume, gtid = %self.last_gtid, "reading the binlog");
        loop {
            // A stop, or a broken delivery (the acker ended), ends reading; checked between
            // events, which keep coming at least as heartbeats.
            if shutdown.is_triggered() || self.publisher.failed() {
                return Ok(());
            }
            if self.tx.is_none() {
                if self.snapshot_step().await? && self.config.snapshot.stop_after() {
                    tracing::info!("snapshot published: stopping (snapshot.mode = \"snapshot\")");
                    return Ok(());
                }
                if self.snapshot.is_none() && self.config.snapshot.stop_after() {
                    tracing::info!("no snapshot left to take (snapshot.mode = \"snapshot\")");
                    return Ok(());
                }
            }
            // Snapshot messages first: a busy binlog always has an event buffered, and would
            // otherwise starve them.
            let message = self.snapshot.as_mut().and_then(|r| r.rx.try_recv().ok());
            if let Some(m) = message {
                self.on_snapshot_msg(m).await?;
                continue;
            }
            // A keyless table's snapshot holds the stream at its position.
            let reading = match self.snapshot.as_ref().and_then(|s| s.hold()) {
                None => true,
                Some(None) => false,
                Some(Some(p)) => self.before(&p),
            };
            enum Next<E> {
                Event(E),
                Snapshot(Option<Msg>),
            }
            let next = if !reading {
                tokio::select! {
                    biased;
                    _ = shutdown.wait() => return Ok(()),
                    m = recv_snapshot(&mut self.snapshot) => Next::Snapshot(m),
                }
            } else {
                // An event already buffered is taken without arming a timer.
                match futures::FutureExt::now_or_never(stream.next()) {
                    Some(n) => Next::Event(Ok(n)),
                    None => tokio::select! {
                        biased;
                        _ = shutdown.wait() => return Ok(()),
                        m = recv_snapshot(&mut self.snapshot) => Next::Snapshot(m),
                        n = tokio::time::timeout(heartbeat * 3, stream.next()) => Next::Event(n),
                    },
                }
            };
            let next = match next {
                Next::Snapshot(m) => {
                    if let Some(m) = m {
                        self.on_snapshot_msg(m).await?;
                    }
                    continue;
                }
                Next::Event(n) => n,
            };
            let event = match next {
                Err(_) => {
                    return Err(CaptureError::Mysql(mysql_async::Error::Io(
                        mysql_async::IoError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no binlog event nor heartbeat for {:?}", heartbeat * 3),
                        )),
                    )))
                }
                Ok(None) => {
                    return Err(CaptureError::Mysql(mysql_async::Error::Driver(
                        mysql_async::DriverError::ConnectionClosed,
                    )))
                }
                Ok(Some(Err(mysql_async::Error::Server(e)))) if e.code == 1236 => {
                    return Err(CaptureError::Definite(format!(
                        "the server cannot send the binlog from {} (error 1236: {}). If the file \
                         was purged, re-snapshot and start from `end`.",
                        self.resume, e.message
                    )))
                }
                Ok(Some(r)) => r?,
            };
            let tables = stream_tables(&stream, &event);
            self.handle(&event, tables).await?;
        }
    }

    async fn handle(
        &mut self,
        event: &Event,
        table_map: Option<TableMapEvent<'static>>,
    ) -> Result<(), CaptureError> {
        let header = event.header();
        let end = u64::from(header.log_pos());
        let start = end.saturating_sub(u64::from(header.event_size()));
        let ts = header.timestamp();
        if ts != 0 {
            let lag = (now_micros() / 1_000_000 - i64::from(ts)).max(0);
            self.publish_metrics.lag_seconds.set(lag);
        }
        if end != 0 {
            self.metrics.offset.set(end as i64);
            self.read_to = end;
        }
        match header.event_type_raw() {
            // MariaDB GTID: seq_no u64, domain u32, flags u8 (MariaDB-specific, raw bytes).
            0xa2 => {
                let d = event.data();
                if d.len() >= 13 {
                    let seq = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
                    let domain = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
                    let gtid = format!("{domain}-{}-{seq}", header.server_id());
                    self.begin(gtid.clone(), gtid, i64::from(ts) * 1_000_000);
                }
                return Ok(());
            }
            0xa0 | 0xa1 | 0xa3 => return Ok(()),
            // MariaDB's compressed query and rows events: never skip rows silently.
            0xa4..=0xa9 => {
                return Err(CaptureError::Definite(format!(
                    "{}:{start}: a compressed MariaDB binlog event (type {:#x}); binlog \
                     compression is not supported: set log_bin_compress=OFF on the source",
                    self.file,
                    header.event_type_raw()
                )))
            }
            _ => {}
        }
        let data = match event.read_data() {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(()),
            Err(e) => {
                return Err(CaptureError::Definite(format!(
                    "cannot parse binlog event type {} at {}:{start}: {e}",
                    header.event_type_raw(),
                    self.file
                )))
            }
        };
        match data {
            EventData::RotateEvent(r) => {
                let mut name = r.name().to_string();
                if !self.server.binlogs.contains(&name) && name.len() > 4 {
                    // The fake rotate's name may carry the checksum bytes at its end.
                    let trimmed = String::from_utf8_lossy(&r.name_raw()[..r.name_raw().len() - 4])
                        .to_string();
                    if self.server.binlogs.contains(&trimmed)
                        || sluice_proto::binlog_file_seq(&name).is_err()
                    {
                        name = trimmed;
                    }
                }
                if !self.server.binlogs.contains(&name) {
                    self.server.binlogs.push(name.clone());
                }
                if let Ok(seq) = sluice_proto::binlog_file_seq(&name) {
                    self.metrics.file_number.set(seq as i64);
                }
                self.file = name;
                self.read_to = r.position().max(4);
                if self.tx.is_none() {
                    self.resume = BinlogPos {
                        file: self.file.clone(),
                        pos: r.position().max(4),
                    };
                }
            }
            EventData::GtidEvent(g) => {
                let gtid = format!("{}:{}", uuid_text(&g.sid()), g.gno());
                let commit = g.immediate_commit_timestamp();
                let micros = if commit > 0 {
                    commit as i64
                } else {
                    i64::from(ts) * 1_000_000
                };
                self.begin(gtid.clone(), gtid, micros);
            }
            EventData::AnonymousGtidEvent(_) => {
                self.begin(
                    format!("{}:{start}", self.file),
                    String::new(),
                    i64::from(ts) * 1_000_000,
                );
            }
            EventData::QueryEvent(q) => {
                let sql = q.query().to_string();
                let default_db = q.schema().to_string();
                match ddl::classify(&sql) {
                    Statement::Transaction(TxControl::Begin) => {
                        if self.tx.is_none() {
                            self.begin(
                                format!("{}:{start}", self.file),
                                String::new(),
                                i64::from(ts) * 1_000_000,
                            );
                        }
                    }
                    Statement::Transaction(TxControl::Commit | TxControl::Rollback) => {
                        self.commit(end).await?
                    }
                    Statement::Transaction(TxControl::Other) => {}
                    Statement::Ddl {
                        kind,
                        tables,
                        renamed_to,
                    } => {
                        if self.skip_until.is_none() {
                            self.apply_ddl(kind, &sql, &default_db, tables, renamed_to, start, ts)
                                .await?;
                        }
                        self.commit(end).await?;
                    }
                    Statement::Database { kind, name } => {
                        tracing::info!(kind, database = %name, "database statement");
                        self.schemas.retain(|(db, _), _| db != &name);
                        self.commit(end).await?;
                    }
                    Statement::Other => {
                        if self.tx.is_none() {
                            self.commit(end).await?;
                        }
                    }
                }
            }
            EventData::XidEvent(_) => self.commit(end).await?,
            // While skipping to a start time, a table map is not needed: a transaction
            // begins (ending the skip) before its own table maps.
            EventData::TableMapEvent(_) if self.skip_until.is_none() => {
                if let Some(tme) = table_map {
                    self.on_table_map(tme).await?;
                }
            }
            EventData::RowsEvent(rows) if self.skip_until.is_none() => {
                self.on_rows(&rows, start, ts).await?;
            }
            EventData::HeartbeatEvent if self.tx.is_none() => {
                self.publish_metrics.lag_seconds.set(0);
            }
            _ => {}
        }
        Ok(())
    }

    fn begin(&mut self, id: String, gtid: String, commit_time_micros: i64) {
        if let Some(t) = self.skip_until {
            if commit_time_micros / 1_000_000 >= t as i64 {
                tracing::info!(from = %id, "reached the start time");
                self.skip_until = None;
            }
        }
        self.tx = Some(TxState {
            id,
            gtid,
            index: 0,
            commit_time_micros,
        });
    }

    async fn commit(&mut self, end: u64) -> Result<(), CaptureError> {
        let tx = self.tx.take();
        if let Some(tx) = &tx {
            if !tx.gtid.is_empty() {
                self.last_gtid = tx.gtid.clone();
            }
        }
        self.resume = BinlogPos {
            file: self.file.clone(),
            pos: end,
        };
        self.mark_now().await
    }

    async fn schema_of(
        &mut self,
        db: &str,
        table: &str,
    ) -> Result<Option<TableSchema>, CaptureError> {
        let key = (db.to_string(), table.to_string());
        if let Some(s) = self.schemas.get(&key) {
            return Ok(Some(s.clone()));
        }
        let loaded = schema::load(&mut self.schema_conn, db, table).await?;
        if let Some(s) = &loaded {
            self.publish_schema(s).await?;
            self.schemas.insert(key, s.clone());
        }
        Ok(loaded)
    }

    async fn publish_schema(&mut self, s: &TableSchema) -> Result<(), CaptureError> {
        if !self.published_schemas.insert(s.schema_id) {
            return Ok(());
        }
        let record = v1::SchemaRecord {
            schema: Some(s.clone()),
            position: Some(self.position(self.resume.pos, 0)),
        };
        self.publisher
            .send_and_wait(
                &self.config.publish.schema_topic,
                schema_record_key(s.schema_id).as_bytes(),
                &record.encode_to_vec(),
            )
            .await?;
        Ok(())
    }

    async fn on_table_map(&mut self, tme: TableMapEvent<'static>) -> Result<(), CaptureError> {
        let table_id = tme.table_id();
        let (database, table) = (
            tme.database_name().to_string(),
            tme.table_name().to_string(),
        );
        if !self.filter.wants(&database, &table) {
            self.decoders.remove(&table_id);
            return Ok(());
        }
        let current = self.schema_of(&database, &table).await?;
        // With binlog_row_metadata=FULL the table map says what the columns were when the rows
        // were written; information_schema says what they are now.
        let schema = match schema::from_table_map(&tme, current.as_ref()) {
            Some(s) => {
                self.publish_schema(&s).await?;
                s
            }
            None => current.ok_or_else(|| {
                CaptureError::Definite(format!(
                    "{database}.{table} is in the binlog at {}:{} but not in information_schema \
                     (dropped since?), and the binlog carries no column metadata \
                     (binlog_row_metadata is not FULL): its rows cannot be decoded",
                    self.file, self.resume.pos
                ))
            })?,
        };
        if let Some(d) = self.decoders.get(&table_id) {
            if d.schema.schema_id == schema.schema_id {
                return Ok(());
            }
        }
        let decoder = TableDecoder::new(&tme, &schema).map_err(|e| CaptureError::Decode {
            table: format!("{database}.{table}"),
            pos: format!("{}:{}", self.file, self.resume.pos),
            reason: e.to_string(),
        })?;
        let topic = self
            .topics
            .topic(&database, &table)
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        let counter = |op: &str| {
            self.publish_metrics
                .events
                .with_label_values(&[&database, &table, op])
        };
        let counters = [counter("insert"), counter("update"), counter("delete")];
        let bytes = self
            .publish_metrics
            .bytes
            .with_label_values(&[&database, &table]);
        self.decoders.insert(
            table_id,
            DecoderEntry {
                key_prefix: sluice_proto::event_key_prefix(&database, &table),
                database,
                table,
                schema: std::sync::Arc::new(schema),
                decoder: std::sync::Arc::new(decoder),
                topic,
                counters,
                bytes,
            },
        );
        Ok(())
    }

    fn position(&self, pos: u64, row: u32) -> v1::Position {
        v1::Position {
            kind: Some(v1::position::Kind::Binlog(v1::BinlogPosition {
                file: self.file.clone(),
                pos,
                commit_pos: 0,
                gtid: self.tx.as_ref().map(|t| t.gtid.clone()).unwrap_or_default(),
                gtid_set: String::new(),
                row,
            })),
        }
    }

    async fn on_rows(
        &mut self,
        rows: &RowsEventData<'_>,
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let Some(entry) = self.decoders.get(&rows.table_id()) else {
            return Ok(()); // a table the filter leaves out
        };
        if entry.schema.primary_key.is_empty()
            && self
                .snapshot
                .as_ref()
                .is_some_and(|r| r.pending_table(&entry.key_prefix))
        {
            // A keyless table waiting for its snapshot: the snapshot, taken at a later
            // position, holds these rows; published here too they would be there twice.
            return Ok(());
        }
        let decoder = entry.decoder.clone();
        let schema = entry.schema.clone();
        let topic = entry.topic.clone();
        let key_prefix = entry.key_prefix.clone();
        let counters = entry.counters.clone();
        let bytes = entry.bytes.clone();
        self.publisher.ensure_topic(&topic, false).await?;
        let commit_time = self
            .tx
            .as_ref()
            .map(|t| t.commit_time_micros)
            .unwrap_or(i64::from(ts) * 1_000_000);
        // Everything but the row's own fields (op, version, row, transaction index, key and
        // images) is the same for every row of this event: encoded once, in `header`.
        let event = v1::ChangeEvent {
            contract: CONTRACT_VERSION,
            source: Some(self.source.clone()),
            op: 0,
            database: schema.database.clone(),
            table: schema.table.clone(),
            version: 0,
            position: Some(self.position(start, 0)),
            commit_time_micros: commit_time,
            capture_time_micros: now_micros(),
            transaction: self.tx.as_ref().map(|t| v1::Transaction {
                id: t.id.clone(),
                index: 0,
                last: false,
            }),
            schema_id: schema.schema_id,
            schema: None,
            key: None,
            before: None,
            after: None,
            ddl: None,
            mongo: None,
        };
        let header = EventHeader::new(&event);
        // The first row's version; row `r`'s is `r` more (checked for overflow per row).
        let base_version = mysql_version(&self.file, start, 0)
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        let pk = &schema.primary_key;
        let mut payload = Vec::with_capacity(1024);
        let mut key_bytes = Vec::with_capacity(64);
        let mut key_row = Vec::with_capacity(32);
        let (mut before, mut after) = (Image::default(), Image::default());
        let mut changes = decoder.rows(rows);
        let decode_error = |e: DecodeError| CaptureError::Decode {
            table: format!("{}.{}", schema.database, schema.table),
            pos: format!("{}:{start}", self.file),
            reason: e.to_string(),
        };
        let mut row = 0u32;
        while let Some(images) = changes
            .next_into(&mut before, &mut after)
            .map_err(decode_error)?
        {
            let version = if start + u64::from(row) < 1 << 32 {
                base_version + u64::from(row)
            } else {
                mysql_version(&self.file, start, row)
                    .map_err(|e| CaptureError::Definite(e.to_string()))?
            };
            // (op, the image the key comes from, before, after)
            let out: [Option<RowOut>; 2] = match images {
                (false, true) => [Some((Op::Insert, &after, None, Some(&after))), None],
                (true, false) => [Some((Op::Delete, &before, Some(&before), None)), None],
                (true, true) if !pk.is_empty() && !before.same_key(&after, pk) => [
                    // A moved row: delete the old key, insert the new one, each on its own
                    // key's partition.
                    Some((Op::Delete, &before, Some(&before), None)),
                    Some((Op::Insert, &after, None, Some(&after))),
                ],
                (true, true) => [
                    Some((Op::Update, &after, Some(&before), Some(&after))),
                    None,
                ],
                (false, false) => [None, None],
            };
            for (op, keyed, b, a) in out.into_iter().flatten() {
                let index = match self.tx.as_mut() {
                    Some(t) => {
                        t.index += 1;
                        t.index - 1
                    }
                    None => 0,
                };
                keyed.event_key(&key_prefix, pk, &mut key_bytes);
                if let Some(s) = self.snapshot.as_mut() {
                    s.touch(&key_prefix, &key_bytes);
                }
                keyed.key_row(pk, &mut key_row);
                payload.clear();
                header.encode(
                    op,
                    version,
                    row,
                    index,
                    &key_row,
                    b.map(Image::bytes),
                    a.map(Image::bytes),
                    &mut payload,
                );
                counters[match op {
                    Op::Insert => 0,
                    Op::Update => 1,
                    _ => 2,
                }]
                .inc();
                bytes.inc_by(payload.len() as u64);
                self.publisher
                    .send(&topic, &key_bytes, &payload, None)
                    .await?;
            }
            row += 1;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn apply_ddl(
        &mut self,
        kind: &'static str,
        sql: &str,
        default_db: &str,
        tables: Vec<ddl::TableRef>,
        renamed_to: Vec<ddl::TableRef>,
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let resolve = |t: &ddl::TableRef| {
            (
                t.database.clone().unwrap_or_else(|| default_db.to_string()),
                t.table.clone(),
            )
        };
        for (i, t) in tables.iter().enumerate() {
            let (db, table) = resolve(t);
            let new_name = renamed_to.get(i).map(resolve);
            self.schemas.remove(&(db.clone(), table.clone()));
            self.decoders
                .retain(|_, d| !(d.database == db && d.table == table));
            if let Some(s) = self.snapshot.as_mut() {
                s.on_ddl(&db, &table, kind == "drop" || new_name.is_some());
            }
            if !self.filter.wants(&db, &table) {
                continue;
            }
            // The schema after the statement: of the new name for renames, none for drops.
            let after = match (&new_name, kind) {
                (_, "drop") => None,
                (Some((ndb, nt)), _) => {
                    self.schemas.remove(&(ndb.clone(), nt.clone()));
                    self.schema_of(ndb, nt).await?
                }
                (None, _) => self.schema_of(&db, &table).await?,
            };
            let op = if kind == "truncate" {
                Op::Truncate
            } else {
                Op::Ddl
            };
            let event = v1::ChangeEvent {
                contract: CONTRACT_VERSION,
                source: Some(self.source.clone()),
                op: op as i32,
                database: db.clone(),
                table: table.clone(),
                version: mysql_version(&self.file, start, 0)
                    .map_err(|e| CaptureError::Definite(e.to_string()))?,
                position: Some(self.position(start, 0)),
                commit_time_micros: i64::from(ts) * 1_000_000,
                capture_time_micros: now_micros(),
                transaction: self.tx.as_ref().map(|t| v1::Transaction {
                    id: t.id.clone(),
                    index: 0,
                    last: true,
                }),
                schema_id: after.as_ref().map(|s| s.schema_id).unwrap_or(0),
                schema: after.clone(),
                key: None,
                before: None,
                after: None,
                ddl: Some(v1::Ddl {
                    statement: sql.to_string(),
                    schema: after.clone(),
                    new_database: new_name.as_ref().map(|n| n.0.clone()).unwrap_or_default(),
                    new_table: new_name.as_ref().map(|n| n.1.clone()).unwrap_or_default(),
                    kind: kind.to_string(),
                }),
                mongo: None,
            };
            let topic = self
                .topics
                .topic(&db, &table)
                .map_err(|e| CaptureError::Definite(e.to_string()))?;
            let partitions = self.publisher.ensure_topic(&topic, false).await?;
            let payload = event.encode_to_vec();
            let key = event_key(&db, &table, &[]);
            // Every partition gets the DDL, so each apply instance sees it in order with the
            // rows of its partitions.
            for p in 0..partitions {
                self.publisher.send(&topic, &key, &payload, Some(p)).await?;
            }
            self.publish_metrics
                .events
                .with_label_values(&[&db, &table, op_label(op)])
                .inc();
            tracing::info!(database = %db, table = %table, kind, "DDL published");
        }
        Ok(())
    }
}

/// The next message of the running snapshot's readers; never, without a snapshot.
async fn recv_snapshot(run: &mut Option<SnapshotRun>) -> Option<Msg> {
    match run {
        Some(r) => r.rx.recv().await,
        None => std::future::pending().await,
    }
}

/// One event a row change becomes: op, the image its key comes from, before, after.
type RowOut<'a> = (Op, &'a Image, Option<&'a Image>, Option<&'a Image>);

fn op_label(op: Op) -> &'static str {
    match op {
        Op::Insert => "insert",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::SnapshotRead => "snapshot_read",
        Op::Ddl => "ddl",
        Op::Truncate => "truncate",
        _ => "other",
    }
}

fn error_type(e: &CaptureError) -> &'static str {
    match e {
        CaptureError::Mysql(_) => "mysql",
        CaptureError::Publish(_) => "kafka",
        CaptureError::Definite(_) => "definite",
        CaptureError::Decode { .. } => "decode",
    }
}

/// The parsed table map of a TABLE_MAP event, owned (the stream keeps its own copy).
fn stream_tables(
    stream: &mysql_async::BinlogStream,
    event: &Event,
) -> Option<TableMapEvent<'static>> {
    if event.header().event_type_raw() != 19 {
        return None; // not TABLE_MAP_EVENT
    }
    let Ok(Some(EventData::TableMapEvent(tme))) = event.read_data() else {
        return None;
    };
    stream.get_tme(tme.table_id()).cloned()
}

fn uuid_text(sid: &[u8; 16]) -> String {
    let h: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A MySQL GTID set `uuid:1-5:7,uuid2:1-3` for COM_BINLOG_DUMP_GTID.
fn parse_mysql_gtid_set(set: &str) -> Result<Vec<mysql_async::Sid<'static>>, String> {
    let mut out = Vec::new();
    for part in set.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let sid: mysql_async::Sid<'static> = part
            .parse()
            .map_err(|e| format!("GTID set {part:?}: {e:?}"))?;
        out.push(sid);
    }
    Ok(out)
}
