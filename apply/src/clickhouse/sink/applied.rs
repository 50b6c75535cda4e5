//! What the stage recorded of the statements it applied (`tables.ddl_table`: per target, each
//! ALTER's version with what it renamed and dropped, and whether it made the name another
//! table's or is followed by a rebuild), read at start and when another instance may have
//! applied one; and the rows older than a statement, counted, deleted or marked.

use sluice_proto::v1::TableSchema;

use super::ddl::ColumnChanges;
use super::{refused, Refusal, Sink};
use crate::clickhouse::Mode;
use crate::error::{ApplyError, BadEvent, Origin, Reason};
use sluice_common::sql::clickhouse::{ident, string};

/// Among a recorded statement's dropped columns: every column (the statement made the name
/// another table's). No column is named so (MySQL names hold no NUL).
const BORN: &str = "\0every column";

/// Among a recorded statement's dropped columns: the statement is followed by a rebuild.
const REBUILT: &str = "\0rebuilt";

impl Sink {
    /// The ALTERs applied to each target, kept in ClickHouse (`tables.ddl_table`, made if
    /// missing): an ALTER applied before a restart, or by another instance, is not applied
    /// again.
    pub(super) async fn read_applied_ddl(&mut self) -> Result<(), ApplyError> {
        let t = format!(
            "{}.{}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.ddl_table)
        );
        let cluster = &self.config.cluster;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t}{} (target String, version UInt64, renamed String, \
             dropped String, at DateTime) ENGINE = {} ORDER BY (target, version)",
            cluster.on(),
            cluster.engine("MergeTree", "", true)
        );
        self.answered("creating the applied DDL's table", || {
            self.client.query(&create).execute()
        })
        .await?
        .map_err(|e| refused(format_args!("{create}: {e}")))?;
        self.read_applied_where("1").await
    }

    /// What `tables.ddl_table` says of target `name` now (another instance may have applied
    /// ALTERs to it since this one started).
    pub(super) async fn read_applied(&mut self, name: &str) -> Result<(), ApplyError> {
        let before = self.applied.get(name).map_or(0, |s| s.version);
        self.read_applied_where(&format!("target = {}", string(name)))
            .await?;
        if let Some(s) = self.applied.get_mut(name) {
            if s.version > before {
                s.seen_elsewhere = true;
            }
        }
        Ok(())
    }

    pub(super) async fn read_applied_where(&mut self, filter: &str) -> Result<(), ApplyError> {
        let t = format!(
            "{}.{}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.ddl_table)
        );
        let select = format!(
            "SELECT target, version, renamed, dropped FROM {t} WHERE {filter} \
             ORDER BY target, version"
        );
        let rows = self
            .answered("reading the applied DDL", || {
                self.client
                    .query(&select)
                    .fetch_all::<(String, u64, String, String)>()
            })
            .await?
            .map_err(|e| refused(format_args!("{select}: {e}")))?;
        // Each target's records folded afresh, in version order: a statement that made the
        // name another table's starts its history over (what was renamed and dropped before
        // was of the table before, which its rows, older than that statement, do not need).
        let mut read: std::collections::HashSet<String> = std::collections::HashSet::new();
        for (target, version, renamed, dropped) in rows {
            if read.insert(target.clone()) {
                let seen = self.applied.get(&target).is_some_and(|a| a.seen_elsewhere);
                self.applied.insert(
                    target.clone(),
                    super::Applied {
                        seen_elsewhere: seen,
                        ..Default::default()
                    },
                );
            }
            let s = self.applied.entry(target).or_default();
            s.version = s.version.max(version);
            if dropped.lines().any(|d| d == BORN) {
                s.renamed.clear();
                s.dropped.clear();
            }
            for pair in renamed.lines() {
                if let Some((a, b)) = pair.split_once('\t') {
                    s.renamed.insert(a.to_string(), b.to_string());
                }
            }
            for d in dropped.lines() {
                if d == BORN {
                    s.born = s.born.max(version);
                } else if d == REBUILT {
                    s.rebuilt = s.rebuilt.max(version);
                } else {
                    s.dropped.insert(d.to_string());
                }
            }
        }
        Ok(())
    }

    /// Record ALTER `version` of target `name` as applied, with what it renamed and dropped.
    pub(super) async fn record_applied(
        &mut self,
        name: &str,
        version: u64,
        change: &ColumnChanges,
    ) -> Result<(), ApplyError> {
        let renamed: Vec<String> = change
            .renamed
            .iter()
            .map(|(a, b)| format!("{a}\t{b}"))
            .collect();
        let sql = format!(
            "INSERT INTO {}.{} (target, version, renamed, dropped, at) VALUES (?, ?, ?, ?, now())",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.ddl_table)
        );
        let mut dropped = change.dropped.clone();
        if change.born {
            dropped.push(BORN.to_string());
        }
        if change.rebuilt {
            dropped.push(REBUILT.to_string());
        }
        let (renamed, dropped) = (renamed.join("\n"), dropped.join("\n"));
        self.answered("recording an applied ALTER", || {
            self.client
                .query(&sql)
                .bind(name)
                .bind(version)
                .bind(&renamed)
                .bind(&dropped)
                .execute()
        })
        .await?
        .map_err(|e| refused(format_args!("{sql}: {e}")))?;
        let s = self.applied.entry(name.to_string()).or_default();
        if change.born && version >= s.version {
            // (the history before it is of the table that had the name before)
            s.renamed.clear();
            s.dropped.clear();
        }
        s.version = s.version.max(version);
        for (a, b) in &change.renamed {
            s.renamed.insert(a.clone(), b.clone());
        }
        s.dropped.extend(change.dropped.iter().cloned());
        if change.born {
            s.born = s.born.max(version);
        }
        if change.rebuilt {
            s.rebuilt = s.rebuilt.max(version);
        }
        Ok(())
    }

    /// A TRUNCATE (or a DROP under `tables.drop = "delete"`) at `version`: in a mirror every row
    /// older than it is deleted, and the mutation waited for; a change log gets one row with op
    /// `kind` at that version. The statement reaches every partition of the table's topic, and
    /// each copy deletes the rows older than the same version: rows of another partition
    /// written after the first copy are deleted by their own partition's copy, and a replay
    /// (a restart before the offsets were committed) reads the rows again before the
    /// statement again. Rows after the statement have higher versions and are never touched.
    ///
    /// `mirrors_only`: a change log is left as it is.
    pub(super) async fn remove_rows_before(
        &mut self,
        name: &str,
        kind: &str,
        version: u64,
        mirrors_only: bool,
    ) -> Result<(), Refusal> {
        let columns = match self.targets.get(name) {
            Some(t) => t.columns.clone(),
            None => self.describe(name).await?,
        };
        if columns.is_empty() {
            return Ok(()); // no target yet: nothing to remove
        }
        let m = &self.config.tables;
        let db = ident(&self.config.clickhouse.database);
        if mirrors_only && !columns.contains_key(&m.deleted_column) {
            return Ok(());
        }
        if !columns.contains_key(&m.version_column) {
            return Err(Refusal::Bad(BadEvent::new(
                Reason::Ddl,
                format!(
                    "target {name} has no version column {}, so the rows before the statement \
                     cannot be told from those after it. Empty it by hand, then restart \
                     apply-clickhouse",
                    m.version_column
                ),
            )));
        }
        let (sql, what) = if columns.contains_key(&m.deleted_column) {
            (
                format!(
                    "ALTER TABLE {db}.{}{} DELETE WHERE {} < {version}",
                    ident(&self.config.cluster.local(name)),
                    self.config.cluster.on(),
                    ident(&m.version_column)
                ),
                format!("deleting the rows of {name} before a {kind}"),
            )
        } else {
            (
                format!(
                    "INSERT INTO {db}.{} ({}, {}) VALUES ({version}, '{kind}')",
                    ident(name),
                    ident(&m.version_column),
                    ident(&m.op_column)
                ),
                format!("logging a {kind} in {name}"),
            )
        };
        self.answered(&what, || self.client.query(&sql).execute())
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        if columns.contains_key(&m.deleted_column) {
            self.wait_for_mutations(name).await?;
        }
        tracing::info!(table = %name, kind, version, "rows before the statement removed");
        Ok(())
    }

    /// How many rows of target `name` are older than `version` (every row, when it has no
    /// version column).
    pub(super) async fn rows_before(&mut self, name: &str, version: u64) -> Result<u64, Refusal> {
        let columns = match self.targets.get(name) {
            Some(t) => t.columns.clone(),
            None => self.describe(name).await?,
        };
        let m = &self.config.tables;
        let filter = if columns.contains_key(&m.version_column) {
            format!(" WHERE {} < {version}", ident(&m.version_column))
        } else {
            String::new()
        };
        let sql = format!(
            "SELECT count() FROM {}.{}{filter}",
            ident(&self.config.clickhouse.database),
            ident(name)
        );
        let what = format!("counting the rows of {name} before a CREATE");
        let n = self
            .answered(&what, || self.client.query(&sql).fetch_one::<u64>())
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        Ok(n)
    }

    /// Whether target `name` is of the kind (mirror, change log) table `new` is written into
    /// and sorted so that its rows replace each other as `new`'s key says: a mirror by exactly
    /// the key's columns, a change log by every one of them.
    pub(super) async fn orders_as(
        &mut self,
        name: &str,
        new: &TableSchema,
    ) -> Result<bool, Refusal> {
        let columns = match self.targets.get(name) {
            Some(t) => t.columns.clone(),
            None => self.describe(name).await?,
        };
        let m = &self.config.tables;
        let source = format!("{}.{}", new.database, new.table);
        let mirror = !new.primary_key.is_empty() && m.mode_of(&source) == Mode::Mirror;
        if mirror != columns.contains_key(&m.deleted_column) {
            return Ok(false);
        }
        let what = format!("reading the sorting key of {name}");
        let sorting_key = self
            .answered(&what, || {
                self.client
                    .query("SELECT sorting_key FROM system.tables WHERE database = ? AND name = ?")
                    .bind(&self.config.clickhouse.database)
                    .bind(self.config.cluster.local(name))
                    .fetch_one::<String>()
            })
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{what}: {e}")))?;
        let named = crate::clickhouse::cluster::identifiers(&sorting_key);
        let key: Vec<&str> = new
            .primary_key
            .iter()
            .filter_map(|i| new.columns.get(*i as usize).map(|c| c.name.as_str()))
            .collect();
        let has_every_key = key.iter().all(|k| named.iter().any(|n| n == k));
        Ok(if mirror {
            has_every_key && named.iter().all(|n| key.contains(&n.as_str()))
        } else {
            has_every_key
        })
    }

    /// Wait until no mutation of target `name` is left to run.
    pub(super) async fn wait_for_mutations(&self, name: &str) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let mut said = started;
        loop {
            let what = format!("reading the mutations of {name}");
            let left: u64 = self
                .answered(&what, || {
                    self.client
                        .query(
                            "SELECT count() FROM system.mutations \
                             WHERE database = ? AND table = ? AND is_done = 0",
                        )
                        .bind(&self.config.clickhouse.database)
                        .bind(self.config.cluster.local(name))
                        .fetch_one::<u64>()
                })
                .await?
                .map_err(|e| BadEvent::new(Reason::Ddl, format!("{what}: {e}")))?;
            if left == 0 {
                return Ok(());
            }
            if self.shutdown.is_triggered() {
                return Err(Refusal::Stop(ApplyError::definite(
                    Origin::Sink,
                    format!("stopped while a mutation of {name} ran; the statement is read again"),
                )));
            }
            if said.elapsed() > std::time::Duration::from_secs(30) {
                tracing::warn!(table = %name, waited_s = started.elapsed().as_secs(), "waiting for a mutation to finish (see system.mutations)");
                said = std::time::Instant::now();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}
