//! Where the capture begins, and the checks that make resuming safe.
//!
//! With a checkpoint the capture resumes at its binlog coordinate, after checking that the
//! source is the server the checkpoint was written reading (`server_id`, `server_uuid`) and
//! that it still has that binlog file; either failing stops it with a message saying what to do.
//! Without one it starts at `[mysql] start` (`end`, `earliest`, `FILE:POS`, `gtid:SET`,
//! `time:...`), and stores that position before it publishes anything (waiting for the
//! checkpoint's commit), so that a capture killed before its first checkpointed transaction
//! does not start again at a later `end`: the events it published (snapshot rows among them)
//! would stand on the topics with the changes between the two starts never published. Every (re)connection opens
//! the binlog dump at the position after the last commit.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn};
use prometheus::Registry;
use sluice_proto::v1;

use super::context::{Capture, ServerInfo, StreamMetrics};
use super::SYSTEM_DATABASES;
use crate::checkpoint::mysql::Checkpoint;
use crate::error::{CaptureError, Origin};
use crate::filter::Filter;
use crate::mysql::gtid::GtidSet;
use crate::mysql::position::{BinlogPos, Start};
use crate::mysql::Config;
use crate::publish::{PublishMetrics, Publisher};
use crate::snapshot::SnapshotMetrics;

impl Capture {
    /// Connect to the server and to Kafka, read the checkpoint: the state before the start
    /// position is known.
    pub(super) async fn connect(
        config: Config,
        registry: &Registry,
    ) -> Result<(Self, Option<Checkpoint>), CaptureError> {
        let opts = config.mysql.opts().expect("validated at load");
        let mut schema_conn = crate::mysql::connect::connect(opts.clone()).await?;
        let server = server_info(&mut schema_conn).await?;
        let filter = Filter::new(&config.filter, SYSTEM_DATABASES)
            .map_err(|(k, m)| CaptureError::definite(Origin::Config, format!("{k}: {m}")))?;
        let topics = config.topics.template()?;
        let publish_metrics = PublishMetrics::new(registry).expect("metrics register once");
        let metrics = StreamMetrics::new(registry).expect("metrics register once");
        let snapshot_metrics =
            Arc::new(SnapshotMetrics::new(registry).expect("metrics register once"));
        // Starting the publisher fences an earlier capture of this connector, then reads the
        // checkpoint (which that one can no longer overwrite).
        let (publisher, checkpoint): (_, Option<Checkpoint>) = Publisher::start(
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
        let capture = Self {
            opts,
            schema_conn,
            filter,
            topics,
            publisher,
            metrics,
            publish_metrics,
            schemas: HashMap::new(),
            decoders: HashMap::new(),
            unwanted: HashSet::new(),
            published_schemas: HashSet::new(),
            refused: HashSet::new(),
            file: String::new(),
            resume: BinlogPos {
                file: String::new(),
                pos: 4,
            },
            last_gtid: String::new(),
            gtid_set: None,
            history_checked: None,
            tx: None,
            skip_until: None,
            source,
            server,
            config,
            read_to: 4,
            snapshot: None,
            snapshots_done: Vec::new(),
            snapshots_pending: Vec::new(),
            ddl_pending: Vec::new(),
            ddl_brackets: HashMap::new(),
            ddl_schemas: HashMap::new(),
            last_schema: HashMap::new(),
            typed_restored: HashMap::new(),
            snapshot_metrics,
            xa: Default::default(),
            generation: 0,
            health: Default::default(),
        };
        Ok((capture, checkpoint))
    }

    /// Take up the checkpoint (or `[mysql] start`) and the snapshot that is due.
    pub(super) async fn resume_from(
        &mut self,
        checkpoint: Option<Checkpoint>,
    ) -> Result<(), CaptureError> {
        let fresh = checkpoint.is_none();
        self.generation = checkpoint
            .as_ref()
            .map_or(0, |c| c.generation)
            .max(self.config.mysql.generation);
        let (progress, done, pending, mut ddl_pending) = checkpoint
            .as_ref()
            .map(|c| {
                (
                    c.snapshot.clone(),
                    c.snapshots_done.clone(),
                    c.snapshots_pending.clone(),
                    c.ddl_pending.clone(),
                )
            })
            .unwrap_or_default();
        for p in &mut ddl_pending {
            // Read from the server (and generation) the checkpoint was written reading.
            p.generation.get_or_insert(self.generation);
        }
        self.typed_restored = checkpoint
            .as_ref()
            .map(|c| typed_restored(&c.typed_columns))
            .unwrap_or_default();
        self.resume = self.start_position(checkpoint).await?;
        self.log_captured_tables().await?;
        if self.gtid_set.is_none() && !self.resume.file.is_empty() {
            let at = self.resume.clone();
            self.gtid_set = self.gtid_set_at(&at).await?;
        }
        self.file = self.resume.file.clone();
        self.read_to = self.resume.pos;
        self.snapshots_done = done;
        self.snapshots_pending = pending;
        self.ddl_pending = ddl_pending;
        self.next_snapshot(progress.map(|p| (*p).clone())).await?;
        if fresh && !self.resume.file.is_empty() && self.skip_until.is_none() {
            // A new capture stores where it starts before anything else, and waits for it to be
            // committed: killed before its first transaction is checkpointed, it must not start
            // again at a later `end`.
            self.store_now().await?;
        }
        Ok(())
    }

    /// Say at start which tables the filter takes (the first 50 named), or that it takes none
    /// yet (tables created later are captured from their CREATE on).
    async fn log_captured_tables(&mut self) -> Result<(), CaptureError> {
        let filter = &self.filter;
        let tables = crate::mysql::snapshot::list_tables(
            &mut self.schema_conn,
            |db, t| filter.wants(db, t),
            &[],
        )
        .await?;
        if tables.is_empty() {
            tracing::warn!(
                "the filter matches no table of the server yet: tables created later that it \
                 matches are captured from their CREATE on (check [filter] include/exclude)"
            );
            return Ok(());
        }
        let names: Vec<String> = tables
            .iter()
            .take(50)
            .map(|(db, t, _)| format!("{db}.{t}"))
            .collect();
        let more = tables.len().saturating_sub(names.len());
        tracing::info!(
            tables = tables.len(),
            "capturing {}{}",
            names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
        Ok(())
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
                if !c.gtid_set.is_empty() {
                    return self.fail_over(c).await;
                }
                return Err(CaptureError::source(format!(
                    "the checkpoint of connector {:?} was written reading server_id {} ({}), \
                     but the source is server_id {} ({}): binlog coordinates of another server \
                     mean nothing here, and the checkpoint holds no GTID set to resume from \
                     (the old server wrote no GTIDs, or the capture started inside a binlog file \
                     of a MySQL server and has not reached the next). Use a new connector name \
                     with mysql.generation = {} (its versions then stay above those published \
                     so far) and re-snapshot, for a new source or a fail-over.",
                    self.config.connector,
                    c.server_id,
                    c.server_uuid,
                    self.server.server_id,
                    self.server.server_uuid,
                    self.next_generation()?
                )));
            }
            self.check_not_purged(&c.next.file, "the stored checkpoint")?;
            tracing::info!(resume = %c.next, gtid = %c.last_gtid, "resuming from the checkpoint");
            if self.config.mysql.start != "end" {
                tracing::warn!(
                    start = %self.config.mysql.start,
                    resume = %c.next,
                    "mysql.start is set, but connector {:?} has a checkpoint: the start applies \
                     only to a connector without one, so it is not used. To start there, use a \
                     new connector name (and re-snapshot where the target needs it)",
                    self.config.connector
                );
            }
            self.last_gtid = c.last_gtid;
            if !c.gtid_set.is_empty() {
                self.gtid_set = Some(GtidSet::parse(&c.gtid_set, self.server.mariadb).map_err(
                    |e| CaptureError::source(format!("the checkpoint's GTID set: {e}")),
                )?);
            }
            return Ok(c.next);
        }
        let start = Start::parse(&self.config.mysql.start)
            .map_err(|e| CaptureError::definite(Origin::Config, e))?;
        let pos = match start {
            Start::End => {
                let sql = self.server.status_sql;
                let row: Option<mysql_async::Row> = self.schema_conn.query_first(sql).await?;
                let row = row.ok_or_else(|| {
                    CaptureError::source(format!("{sql} is empty: binary logging is off"))
                })?;
                if !self.server.mariadb {
                    // MySQL's status names the executed GTID set at that very position.
                    if let Some(Ok(text)) = row.get_opt::<String, _>(4) {
                        self.gtid_set = GtidSet::parse(&text, false).ok();
                    }
                }
                BinlogPos {
                    file: row.get(0).unwrap_or_default(),
                    pos: row.get(1).unwrap_or(4),
                }
            }
            Start::Earliest => BinlogPos {
                file: self
                    .server
                    .binlogs
                    .first()
                    .cloned()
                    .ok_or_else(|| CaptureError::source("the server lists no binary logs"))?,
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
                // Resolved by the server at dump time; the position comes with the first commit.
                self.gtid_set = Some(GtidSet::parse(&set, self.server.mariadb).map_err(|e| {
                    CaptureError::definite(Origin::Config, format!("mysql.start: {e}"))
                })?);
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

    /// The checkpoint was written reading another server, and holds the GTID set read: resume
    /// from that set here (a replica promoted after a fail-over has the same GTIDs in its own
    /// binlog files), in the next generation, as every position on this server is unrelated to
    /// the old one's. Refused when this server lacks transactions already published.
    async fn fail_over(&mut self, c: Checkpoint) -> Result<BinlogPos, CaptureError> {
        let set = GtidSet::parse(&c.gtid_set, self.server.mariadb).map_err(|e| {
            CaptureError::source(format!(
                "the checkpoint's GTID set {:?} is not of this server's kind ({}): {e}",
                c.gtid_set,
                if self.server.mariadb {
                    "MariaDB"
                } else {
                    "MySQL"
                }
            ))
        })?;
        let sql = if self.server.mariadb {
            "SELECT @@GLOBAL.gtid_binlog_pos"
        } else {
            "SELECT @@GLOBAL.gtid_executed"
        };
        let have: Option<String> = self.schema_conn.query_first(sql).await?;
        let have = GtidSet::parse(&have.unwrap_or_default(), self.server.mariadb)
            .map_err(|e| CaptureError::source(format!("{sql}: {e}")))?;
        let missing = set.missing_from(&have);
        let old = format!("server_id {} ({})", c.server_id, c.server_uuid);
        if !missing.is_empty() {
            return Err(CaptureError::source(format!(
                "connector {:?} read up to GTID set {set} on {old}; this server (server_id {}) \
                 has not got {missing} in its binlog ({sql} = {have}). Those transactions were \
                 published, so the targets hold rows this server does not (a replica promoted \
                 before it had every transaction, or a replica without log_slave_updates / \
                 log_replica_updates). Point the capture at a server that has them, or start a \
                 new connector name with mysql.generation = {} and re-snapshot the tables.",
                self.config.connector,
                self.server.server_id,
                self.next_generation()?
            )));
        }
        self.generation = self.next_generation()?;
        tracing::warn!(
            from = %old,
            to = self.server.server_id,
            gtid_set = %set,
            generation = self.generation,
            "the source is another server than the checkpoint's: resuming from the GTID set \
             read (a fail-over), with versions of the next generation"
        );
        self.last_gtid = set.to_string();
        self.gtid_set = Some(set);
        Ok(BinlogPos {
            file: String::new(),
            pos: 4,
        })
    }

    /// Before reading from the resume point: the server's binlog there is the history the
    /// capture read (MariaDB: the GTID state at that position, `BINLOG_GTID_POS`, has the
    /// capture's last GTID of each domain; MySQL: `gtid_executed` holds every GTID read).
    /// A `RESET MASTER` or a restored server fails this even where a file of the same name
    /// exists again, and stops the capture with the next generation named: its positions, and
    /// the versions made of them, would be lower than those published.
    ///
    /// `live`: the capture is connected and idle at the resume point (a server that deletes
    /// the file under a binlog reader goes on sending heartbeats, and nothing else).
    pub(super) async fn check_history(&mut self, live: bool) -> Result<(), CaptureError> {
        let Some(ours) = self.gtid_set.clone().filter(|s| !s.is_empty()) else {
            return Ok(());
        };
        if self.resume.file.is_empty() {
            return Ok(());
        }
        let at = self.resume.clone();
        if live && self.server.mariadb {
            // The cheap check first: idle, the reader is where the server's binlog ends.
            // (BINLOG_GTID_POS reads the file up to the position.)
            let row: Option<mysql_async::Row> =
                self.schema_conn.query_first(self.server.status_sql).await?;
            let end = row.map(|r| {
                (
                    r.get::<String, _>(0).unwrap_or_default(),
                    r.get::<u64, _>(1).unwrap_or(0),
                )
            });
            if end == Some((self.file.clone(), self.read_to)) {
                return Ok(());
            }
        }
        let why = if self.server.mariadb {
            let pos: Option<Option<String>> = self
                .schema_conn
                .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (at.file.clone(), at.pos))
                .await?;
            match pos.flatten() {
                Some(text) => {
                    let theirs = GtidSet::parse(&text, true)
                        .map_err(|e| CaptureError::source(format!("BINLOG_GTID_POS({at}): {e}")))?;
                    (!ours.agrees_with(&theirs)).then(|| {
                        format!(
                            "the server's GTID state at {at} is {:?}, but the capture had read \
                             up to {ours} there",
                            theirs.to_string()
                        )
                    })
                }
                None => {
                    let files: Vec<mysql_async::Row> =
                        self.schema_conn.query("SHOW BINARY LOGS").await?;
                    let has =
                        |r: &mysql_async::Row| r.get::<String, _>(0).as_ref() == Some(&at.file);
                    if !files.iter().any(has) {
                        if !live {
                            // Purged, or the history began again: the dump's error says which.
                            return Ok(());
                        }
                        let newest = files.last().and_then(|r| r.get::<String, _>(0));
                        return Err(CaptureError::source(format!(
                            "the server no longer has binlog file {} (its newest is {}), which \
                             the capture is reading: its binlog began again (RESET MASTER, or a \
                             restored server). Start a new connector name with \
                             mysql.generation = {} and re-snapshot the tables.",
                            at.file,
                            newest.as_deref().unwrap_or("none"),
                            self.next_generation()?
                        )));
                    }
                    Some(format!(
                        "the server has no event boundary at {at} (BINLOG_GTID_POS is NULL), \
                         where the capture had read up to {ours}"
                    ))
                }
            }
        } else {
            let have: Option<String> = self
                .schema_conn
                .query_first("SELECT @@GLOBAL.gtid_executed")
                .await?;
            let theirs = GtidSet::parse(&have.unwrap_or_default(), false)
                .map_err(|e| CaptureError::source(format!("@@gtid_executed: {e}")))?;
            let missing = ours.missing_from(&theirs);
            (!missing.is_empty())
                .then(|| format!("the server has not executed {missing}, which the capture read"))
        };
        match why {
            None => Ok(()),
            Some(why) => Err(CaptureError::source(format!(
                "{why}: this is not the binlog history the capture was reading; it began again \
                 (RESET MASTER, or a restored server). Start a new connector name with \
                 mysql.generation = {} (so that its versions stay above every one published so \
                 far; the same generation would write lower versions, which the targets would \
                 take for older) and re-snapshot the tables.",
                self.next_generation()?
            ))),
        }
    }

    /// The GTID set of every transaction before `at` (MariaDB's `BINLOG_GTID_POS`), or `None`
    /// where the server cannot say (MySQL: known from the next PREVIOUS_GTIDS event).
    async fn gtid_set_at(&mut self, at: &BinlogPos) -> Result<Option<GtidSet>, CaptureError> {
        if !self.server.mariadb {
            return Ok(None);
        }
        let pos: Option<Option<String>> = self
            .schema_conn
            .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (at.file.clone(), at.pos))
            .await?;
        match pos.flatten().map(|p| GtidSet::parse(&p, true)) {
            Some(Ok(set)) => Ok(Some(set)),
            other => {
                tracing::warn!(at = %at, answer = ?other, "the server gives no GTID position for this binlog position: a fail-over cannot resume by GTID until it is known");
                Ok(None)
            }
        }
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
            .ok_or_else(|| CaptureError::source("the server lists no binary logs"))?;
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
        let mut conn = crate::mysql::connect::connect(self.opts.clone()).await?;
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
                    CaptureError::definite(
                        Origin::Mysql,
                        format!("no event within 30 s reading the start of binlog file {file}"),
                    )
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

    /// `file` (where the checkpoint or `mysql.start` points) is still on the server.
    fn check_not_purged(&self, file: &str, what: &str) -> Result<(), CaptureError> {
        if self.server.binlogs.iter().any(|f| f == file) {
            return Ok(());
        }
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        let newest = self
            .server
            .binlogs
            .last()
            .map(String::as_str)
            .unwrap_or("none");
        if self
            .server
            .binlogs
            .last()
            .is_none_or(|n| seq(n) < seq(file))
        {
            // Every file the server has is older than the checkpoint's: its history began
            // again, and its versions would be lower than those published already.
            return Err(CaptureError::source(format!(
                "{what} points into binlog file {file}, but the server's newest is {newest}: its \
                 binlog began again (RESET MASTER, or a restored server). Start a new connector \
                 name with mysql.generation = {} (so that its versions stay above every one \
                 published so far; the same generation would write lower versions, which the \
                 targets would take for older) and re-snapshot the tables.",
                self.next_generation()?
            )));
        }
        Err(CaptureError::source(format!(
            "{what} points into binlog file {file}, which the server no longer has (it was purged; \
             the oldest is {}). Changes since then are lost to the binlog: re-snapshot the tables \
             and start again from `end`, e.g. with a new connector name (and mysql.generation = \
             {}).",
            self.server.binlogs.first().map(String::as_str).unwrap_or("none"),
            self.generation
        )))
    }

    /// The generation a capture starting over on this source's new history takes.
    fn next_generation(&self) -> Result<u8, CaptureError> {
        self.generation.checked_add(1).ok_or_else(|| {
            CaptureError::definite(
                Origin::Config,
                "mysql.generation is 255 already: no higher generation is left",
            )
        })
    }

    /// Open the binlog dump at the position after the last commit (or at the GTID set, for a
    /// `gtid:` start or a fail-over not yet past its first commit), with heartbeats every
    /// `heartbeat`.
    pub(super) async fn open_binlog(
        &mut self,
        heartbeat: Duration,
    ) -> Result<BinlogStream, CaptureError> {
        self.check_history(false).await?;
        let mut conn = crate::mysql::connect::connect(self.opts.clone()).await?;
        // Both names: MySQL 8.0.26+ reads the `source_` ones first, older servers and MariaDB
        // the `master_` ones (which the driver sets for the checksum).
        conn.query_drop(format!(
            "SET @master_heartbeat_period = {n}, @source_heartbeat_period = {n}, \
             @source_binlog_checksum = 'ALL'",
            n = heartbeat.as_nanos()
        ))
        .await?;
        let gtid_start = self.resume.file.is_empty();
        // The whole set where known (several MariaDB domains, MySQL intervals).
        let gtids = match &self.gtid_set {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => self.last_gtid.clone(),
        };
        if self.server.mariadb {
            // Without this MariaDB rewrites its GTID events into dummy query events.
            conn.query_drop("SET @mariadb_slave_capability = 4").await?;
            if gtid_start {
                conn.exec_drop("SET @slave_connect_state = ?", (gtids.clone(),))
                    .await?;
                conn.query_drop("SET @slave_gtid_strict_mode = 1").await?;
            }
        }
        self.tx = None;
        // An XA transaction cut off before its prepare is read again whole.
        self.xa.reading = None;
        let file = self.resume.file.clone();
        let mut request = BinlogStreamRequest::new(self.config.mysql.server_id)
            .with_filename(file.as_bytes())
            .with_pos(self.resume.pos);
        if gtid_start && !self.server.mariadb {
            let set = parse_mysql_gtid_set(&gtids)
                .map_err(|e| CaptureError::definite(Origin::Config, e))?;
            request = request.with_gtid().with_gtid_set(set);
        }
        let stream = conn.get_binlog_stream(request).await?;
        tracing::info!(from = %self.resume, gtid = %self.last_gtid, "reading the binlog");
        Ok(stream)
    }
}

/// The server's id, uuid (MySQL), flavour and binlog files.
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
    let metadata: Option<mysql_async::Row> = conn
        .query_first("SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")
        .await?;
    let binlogs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await?;
    let binlogs = binlogs
        .into_iter()
        .filter_map(|r| r.get::<String, _>(0))
        .collect();
    Ok(ServerInfo {
        status_sql: crate::mysql::binlog_status_sql(&version),
        server_id,
        server_uuid,
        mariadb,
        binlogs,
        has_row_metadata: metadata.is_some(),
    })
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

/// The checkpoint's typed columns as schemas of those columns only, by table.
fn typed_restored(
    typed: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> HashMap<(String, String), v1::TableSchema> {
    let mut out = HashMap::new();
    for (name, cols) in typed {
        let Some((db, table)) = name.split_once('.') else {
            continue;
        };
        let columns = cols
            .iter()
            .filter_map(|(c, t)| {
                let t = v1::ColumnType::from_str_name(t)?;
                let mut col = v1::Column {
                    name: c.clone(),
                    length: match t {
                        v1::ColumnType::Inet4 => 4,
                        v1::ColumnType::Inet6 | v1::ColumnType::Uuid => 16,
                        _ => 0,
                    },
                    ..Default::default()
                };
                col.set_type(t);
                Some(col)
            })
            .collect();
        out.insert(
            (db.to_string(), table.to_string()),
            v1::TableSchema {
                database: db.to_string(),
                table: table.to_string(),
                columns,
                ..Default::default()
            },
        );
    }
    out
}
