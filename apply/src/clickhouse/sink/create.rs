//! Making a target table from its source schema (`tables.create`): mirror tables as
//! `ReplacingMergeTree(version, deleted)` over the primary key (`ReplacingMergeTree(version)`
//! before ClickHouse 23.2), change logs as `ReplacingMergeTree` over (key, version, op), so
//! replays collapse; from 22.2 with a deduplication window for the INSERTs' tokens; on a cluster
//! `ON CLUSTER`, with the Distributed table over them.

use sluice_proto::v1::TableSchema;

use super::{refused, Refusal, Sink};
use crate::clickhouse::types::{map_column, DEDUP_WINDOW};
use crate::clickhouse::Mode;
use crate::error::{BadEvent, Reason};
use sluice_common::sql::clickhouse::ident;

impl Sink {
    pub(super) async fn create(
        &mut self,
        name: &str,
        mode: Mode,
        s: &TableSchema,
    ) -> Result<(), Refusal> {
        super::target::key_in_range(s)?;
        let m = &self.config.tables;
        let cluster = &self.config.cluster;
        let source = format!("{}.{}", s.database, s.table);
        let f = self.features_for(&s.database, &s.table);
        let mut cols: Vec<String> = s
            .columns
            .iter()
            .map(|c| format!("{} {}", ident(&c.name), map_column(c, f).sql()))
            .collect();
        let key: Vec<String> = s
            .primary_key
            .iter()
            .map(|i| ident(&s.columns[*i as usize].name))
            .collect();
        // `tables.order_by` in place of the key. Rows replace each other by it: a mirror's
        // must name the key columns and nothing else (a version with another value of another
        // column would stay beside the old one); a change log's must keep every key column.
        let order_by = m.order_by.get(&source);
        if let Some(o) = order_by {
            let named = crate::clickhouse::cluster::identifiers(o);
            let keys: Vec<&str> = s
                .primary_key
                .iter()
                .map(|i| s.columns[*i as usize].name.as_str())
                .collect();
            let missing: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| !named.iter().any(|n| n == k))
                .collect();
            let others: Vec<&str> = named
                .iter()
                .map(String::as_str)
                .filter(|n| !keys.contains(n))
                .collect();
            let why = if !missing.is_empty() {
                Some(format!(
                    "leaves out primary key column(s) {}: versions of one row would not replace \
                     each other",
                    missing.join(", ")
                ))
            } else if mode == Mode::Mirror && !others.is_empty() {
                Some(format!(
                    "names column(s) {} besides the primary key: a row whose {} changed would \
                     be kept twice",
                    others.join(", "),
                    others.join(", ")
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(BadEvent::new(
                    Reason::Value,
                    format!(
                        "tables.order_by.\"{source}\" = {o:?} {why}. A mirror's ORDER BY names \
                         the primary key columns ({}), in any order or within expressions",
                        keys.join(", ")
                    ),
                )
                .into());
            }
        }
        // The override without its outer parentheses (a tuple's), ready to join.
        let order_by = order_by.map(|o| crate::clickhouse::cluster::unwrap_parens(o));
        let (engine, order) = match mode {
            Mode::Mirror => {
                cols.push(format!("{} UInt64", ident(&m.version_column)));
                cols.push(format!("{} UInt8", ident(&m.deleted_column)));
                let args = if self.features.is_deleted {
                    format!("{}, {}", ident(&m.version_column), ident(&m.deleted_column))
                } else {
                    ident(&m.version_column)
                };
                let engine = cluster.engine("ReplacingMergeTree", &args, false);
                let order = order_by.map_or_else(|| key.join(", "), str::to_string);
                (engine, order)
            }
            Mode::Changelog => {
                cols.push(format!("{} String", ident(&m.op_column)));
                cols.push(format!("{} UInt64", ident(&m.version_column)));
                let mut order: Vec<String> = match order_by {
                    Some(o) => vec![o.to_string()],
                    None => key.clone(),
                };
                order.push(ident(&m.version_column));
                order.push(ident(&m.op_column));
                if key.is_empty() {
                    // No key: the snapshot's rows of one chunk share a version, and equal
                    // rows must stay apart.
                    cols.push(format!("{} UInt64", ident(&m.row_column)));
                    order.push(ident(&m.row_column));
                }
                (
                    cluster.engine("ReplacingMergeTree", "", false),
                    order.join(", "),
                )
            }
        };
        if m.unheld_of(&source) == crate::clickhouse::OnUnheld::Mark {
            cols.push(format!(
                "{} {}",
                ident(&m.unheld_column),
                crate::clickhouse::types::ChType::Strings.sql()
            ));
        }
        if cluster.distributed && !cluster.shard_column.is_empty() {
            // The Distributed table's sharding key, filled by the stage with each row.
            cols.push(format!("{} UInt64", ident(&cluster.shard_column)));
        }
        let partition = m
            .partition_by
            .get(&source)
            .map(|p| format!(" PARTITION BY {p}"))
            .unwrap_or_default();
        let settings = if self.features.dedup_token && !cluster.enabled() {
            format!(" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}")
        } else {
            String::new()
        };
        let db = &self.config.clickhouse.database;
        let local = cluster.local(name);
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {}.{}{} ({}) ENGINE = {engine}{partition} ORDER BY ({order}){settings}",
            ident(db),
            ident(&local),
            cluster.on(),
            cols.join(", ")
        );
        self.answered(&format!("creating {local}"), || {
            self.client.query(&sql).execute()
        })
        .await?
        .map_err(|e| BadEvent::new(Reason::Value, format!("{sql}: {e}")))?;
        if cluster.distributed {
            let keyless = [ident(&m.version_column), ident(&m.row_column)];
            let sql = cluster.distributed_sql(db, name, &local, &key, &keyless);
            self.answered(&format!("creating {name}"), || {
                self.client.query(&sql).execute()
            })
            .await?
            .map_err(|e| BadEvent::new(Reason::Value, format!("{sql}: {e}")))?;
        }
        tracing::info!(table = name, ?mode, cluster = %cluster.name, distributed = cluster.distributed, "created target table");
        Ok(())
    }

    /// With Distributed tables: after a change of `table`'s per-shard table, put a Distributed
    /// table with its columns in place of `table` (made beside it, swapped in by one RENAME
    /// on every server, the old one dropped). Done already (by another applier, or before a
    /// restart) when the columns agree.
    pub(super) async fn refresh_distributed(&self, table: &str) -> Result<(), Refusal> {
        let cluster = &self.config.cluster;
        if !cluster.distributed {
            return Ok(());
        }
        let db = ident(&self.config.clickhouse.database);
        let local = cluster.local(table);
        let (new, old) = (
            format!("{table}__sluice_new"),
            format!("{table}__sluice_old"),
        );
        for attempt in 0..3 {
            let shape = |t: String| {
                let this = &self;
                async move {
                    let what = format!("reading the columns of {t}");
                    this.answered(&what, || {
                        this.client
                            .query(
                                "SELECT name, type FROM system.columns \
                                 WHERE database = ? AND table = ? ORDER BY name",
                            )
                            .bind(&this.config.clickhouse.database)
                            .bind(&t)
                            .fetch_all::<(String, String)>()
                    })
                    .await?
                    .map_err(|e| refused(format_args!("{what}: {e}")))
                }
            };
            if shape(table.to_string()).await? == shape(local.clone()).await? {
                return Ok(());
            }
            let what = format!("reading the engine of {table}");
            let engine = self
                .answered(&what, || {
                    self.client
                        .query(
                            "SELECT engine_full FROM system.tables WHERE database = ? AND name = ?",
                        )
                        .bind(&self.config.clickhouse.database)
                        .bind(table)
                        .fetch_optional::<String>()
                })
                .await?
                .map_err(|e| refused(format_args!("{what}: {e}")))?
                .unwrap_or_default();
            if !engine.starts_with("Distributed(") {
                return Err(BadEvent::new(
                    Reason::Ddl,
                    format!("{table} is not a Distributed table ({engine:?}), with cluster.distributed on"),
                )
                .into());
            }
            let on = cluster.on();
            let steps = [
                format!("DROP TABLE IF EXISTS {db}.{}{on}", ident(&new)),
                format!(
                    "CREATE TABLE {db}.{}{on} AS {db}.{} ENGINE = {engine}",
                    ident(&new),
                    ident(&local)
                ),
                format!(
                    "RENAME TABLE {db}.{t} TO {db}.{o}, {db}.{n} TO {db}.{t}{on}",
                    t = ident(table),
                    o = ident(&old),
                    n = ident(&new)
                ),
                format!("DROP TABLE IF EXISTS {db}.{}{on}", ident(&old)),
            ];
            let mut failed = None;
            for sql in &steps {
                let what = format!("replacing the Distributed table {table}");
                if let Err(e) = self
                    .answered(&what, || self.client.query(sql).execute())
                    .await?
                {
                    failed = Some(format!("{sql}: {e}"));
                    break;
                }
            }
            match failed {
                None => {
                    tracing::info!(table, "Distributed table replaced with the new columns");
                    return Ok(());
                }
                // Another applier replacing it at the same time: look again.
                Some(why) if attempt < 2 => {
                    tracing::warn!(table, reason = %why, "replacing the Distributed table failed; looking again");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Some(why) => return Err(BadEvent::new(Reason::Ddl, why).into()),
            }
        }
        Ok(())
    }
}
