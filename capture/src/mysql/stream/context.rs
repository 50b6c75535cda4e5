//! The state the binlog loop carries from event to event: the [`Capture`] itself, the decoder
//! of each mapped table, the transaction being read, what the server said about itself, and the
//! loop's own metrics.
//!
//! None of it is stored: after a crash or a reconnect everything here is rebuilt from the
//! checkpoint (`resume`, `last_gtid`, the snapshot's progress) and from the server (schemas,
//! table maps, which come again before their rows).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mysql_async::{Conn, Opts};
use prometheus::{IntCounter, IntGauge, Registry};
use sluice_proto::v1::{self, TableSchema};
use sluice_proto::TopicTemplate;

use crate::checkpoint::mysql::Checkpoint;
use crate::filter::Filter;
use crate::mysql::decode::TableDecoder;
use crate::mysql::position::BinlogPos;
use crate::mysql::snapshot::SnapshotRun;
use crate::mysql::Config;
use crate::publish::{PublishMetrics, Publisher};
use crate::snapshot::SnapshotMetrics;

/// A running binlog capture: built by [`Capture::start`], driven by [`Capture::run`].
pub struct Capture {
    pub(super) config: Config,
    pub(super) opts: Opts,
    /// For `information_schema` and the snapshot's table list; re-opened after a reconnect.
    pub(super) schema_conn: Conn,
    pub(super) server: ServerInfo,
    pub(super) filter: Filter,
    pub(super) topics: TopicTemplate,
    pub(super) publisher: Publisher<Checkpoint>,
    pub(super) metrics: StreamMetrics,
    pub(super) publish_metrics: PublishMetrics,
    pub(super) schemas: HashMap<(String, String), TableSchema>,
    /// table id -> decoder, rebuilt at each table map whose schema changed.
    pub(super) decoders: HashMap<u64, DecoderEntry>,
    /// Table ids whose last table map named a table outside the filter: their rows events are
    /// skipped unread, compressed ones included.
    pub(super) unwanted: HashSet<u64>,
    pub(super) published_schemas: HashSet<u64>,
    /// Tables refused since start (`refused` events published), by database and name.
    pub(super) refused: HashSet<(String, String)>,
    /// Current binlog file and the position to resume from after the last commit.
    pub(super) file: String,
    pub(super) resume: BinlogPos,
    pub(super) last_gtid: String,
    /// Every transaction read up to `resume`, as GTIDs (`None`: not known, e.g. a MySQL
    /// capture started mid-file without GTIDs; it becomes known at the next file's
    /// PREVIOUS_GTIDS event).
    pub(super) gtid_set: Option<crate::mysql::gtid::GtidSet>,
    /// When an idle capture last checked the server's history (`check_history`).
    pub(super) history_checked: Option<std::time::Instant>,
    pub(super) tx: Option<TxState>,
    /// While starting from a timestamp: skip transactions that began before it.
    pub(super) skip_until: Option<u64>,
    pub(super) source: v1::Source,
    /// The end of the last event read in `file`.
    pub(super) read_to: u64,
    pub(super) snapshot: Option<SnapshotRun>,
    pub(super) snapshots_done: Vec<String>,
    /// Snapshots asked for by the stream itself (renames), in the checkpoint until done.
    pub(super) snapshots_pending: Vec<crate::checkpoint::mysql::PendingSnapshot>,
    /// DDL read while behind the server, by table: published at the table's next table map,
    /// or once the stream reaches a position information_schema's schema is known to hold at
    /// (in the checkpoint until then).
    pub(super) ddl_pending: Vec<crate::checkpoint::mysql::PendingDdl>,
    /// For tables in `ddl_pending`: information_schema's schema and the binlog position it
    /// holds at (see `Capture::publish_ddl_reached`).
    pub(super) ddl_brackets: HashMap<(String, String), DdlBracket>,
    /// The schema the last DDL event of a table carried, read from information_schema when the
    /// capture was caught up: checked against the table's next table map.
    pub(super) ddl_schemas: HashMap<(String, String), TableSchema>,
    /// The schema of each table's last rows read (or last DDL published) since start: the
    /// "before" of its next DDL event.
    pub(super) last_schema: HashMap<(String, String), TableSchema>,
    /// The columns of a type the binlog logs as another, per table, from the checkpoint
    /// resumed from (as schemas of those columns only): what the capture knew of them before
    /// its restart, for tables it has read no schema of since.
    pub(super) typed_restored: HashMap<(String, String), TableSchema>,
    pub(super) snapshot_metrics: Arc<SnapshotMetrics>,
    /// XA transactions (see `xa`): the rows of the one being read, and those prepared and not
    /// committed or rolled back yet.
    pub(super) xa: super::xa::XaState,
    /// The binlog generation of every version published (`mysql.generation`, or the
    /// checkpoint's if higher).
    pub(super) generation: u8,
    /// What `/healthz` answers: a capture that stops moving while its source moves says so
    /// ([`crate::stall`]).
    pub(super) health: sluice_common::metrics::Health,
}

/// The capture's own metrics (the publisher has the event counters).
pub(super) struct StreamMetrics {
    pub(super) file_number: IntGauge,
    pub(super) offset: IntGauge,
    pub(super) reconnects: IntCounter,
    pub(super) stalled: IntGauge,
}

impl StreamMetrics {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let file_number = IntGauge::new(
            "sluice_capture_binlog_file_number",
            "Numeric suffix of the binlog file being read.",
        )?;
        let offset = IntGauge::new(
            "sluice_capture_binlog_offset_bytes",
            "Offset in the binlog file being read.",
        )?;
        let reconnects = IntCounter::new(
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
            stalled: crate::stall::gauge(r)?,
        })
    }
}

/// A mapped table the filter takes: how its rows decode and where they go.
pub(super) struct DecoderEntry {
    pub(super) database: String,
    pub(super) table: String,
    pub(super) schema: Arc<TableSchema>,
    pub(super) decoder: Arc<TableDecoder>,
    /// Worked out once per table map, not per row.
    pub(super) topic: String,
    pub(super) key_prefix: Vec<u8>,
    pub(super) counters: [IntCounter; 3], // insert, update, delete
    pub(super) bytes: IntCounter,
}

/// The transaction being read.
pub(super) struct TxState {
    pub(super) id: String,
    pub(super) gtid: String,
    /// The index the transaction's next event gets.
    pub(super) index: u64,
    pub(super) commit_time_micros: i64,
}

/// What the server says about itself.
pub(super) struct ServerInfo {
    pub(super) server_id: u32,
    pub(super) server_uuid: String,
    pub(super) mariadb: bool,
    /// The binlog files it has (`SHOW BINARY LOGS`), and those seen rotating to since.
    pub(super) binlogs: Vec<String>,
    /// Whether the server has `binlog_row_metadata` (MySQL 8.0+, MariaDB 10.5+): the start
    /// requires it to be FULL, so a table map without column names means it was changed since.
    pub(super) has_row_metadata: bool,
    /// The statement giving the binlog's current file and position on this server
    /// ([`crate::mysql::binlog_status_sql`]).
    pub(super) status_sql: &'static str,
}

/// information_schema's schema of a table whose statements wait (`schema`, `None`: no such
/// table), read before the server's binlog position `at`; valid while what waits is `waiting`.
pub(super) struct DdlBracket {
    pub(super) at: BinlogPos,
    pub(super) waiting: (String, u64, usize),
    pub(super) schema: Option<TableSchema>,
}

impl DdlBracket {
    /// What identifies the statements waiting: the last one's place and their number.
    pub(super) fn waiting_of(p: &crate::checkpoint::mysql::PendingDdl) -> (String, u64, usize) {
        (p.file.clone(), p.start, p.statements.len())
    }
}
