//! A TABLE_MAP event: the decoder of the rows that follow it (the table's schema, topic and
//! counters, worked out once per schema), and the check that the schema the binlog gives the
//! rows is the one a DDL event published for them.

use mysql_async::binlog::events::{Event, EventData, TableMapEvent};
use sluice_proto::v1;

use super::context::{Capture, DecoderEntry};
use crate::error::{CaptureError, Origin};
use crate::mysql::decode::TableDecoder;
use crate::mysql::schema;

/// TABLE_MAP_EVENT's type code.
const TABLE_MAP_EVENT: u8 = 19;

impl Capture {
    /// A table map: the decoder of its table's rows, rebuilt when the schema changed.
    pub(super) async fn on_table_map(
        &mut self,
        tme: TableMapEvent<'static>,
    ) -> Result<(), CaptureError> {
        let table_id = tme.table_id();
        let (database, table) = (
            tme.database_name().to_string(),
            tme.table_name().to_string(),
        );
        if !self.filter.wants(&database, &table) {
            self.decoders.remove(&table_id);
            self.unwanted.insert(table_id);
            return Ok(());
        }
        self.unwanted.remove(&table_id);
        let current = self.schema_of(&database, &table).await?;
        // With binlog_row_metadata=FULL the table map says what the columns were when the rows
        // were written; information_schema says what they are now.
        let from_binlog = self.server.has_row_metadata;
        let here = (database.clone(), table.clone());
        let waiting: &[String] = self
            .ddl_pending
            .iter()
            .find(|p| p.database == database && p.table == table)
            .map_or(&[], |p| p.statements.as_slice());
        // A table made by `CREATE TABLE ... LIKE src` read behind the server, not known yet:
        // its columns are src's as last known (the statement declares no type).
        let like = waiting
            .iter()
            .find_map(|s| crate::mysql::ddl::created_like(s))
            .map(|t| (t.database.unwrap_or_else(|| database.clone()), t.table));
        let known = self
            .last_schema
            .get(&here)
            .or_else(|| self.typed_restored.get(&here))
            .or_else(|| {
                let src = like.as_ref()?;
                self.last_schema
                    .get(src)
                    .or_else(|| self.typed_restored.get(src))
            });
        let schema = match schema::from_table_map(&tme, current.as_ref(), known, waiting) {
            Some(s) => {
                // Its charsets may be ones no table has now (a column changed since).
                let charsets: Vec<&str> = s.columns.iter().map(|c| c.charset.as_str()).collect();
                crate::mysql::charset::load(&mut self.schema_conn, charsets).await?;
                self.publish_schema(&s).await?;
                s
            }
            None if self.server.has_row_metadata => {
                return Err(CaptureError::definite(
                    Origin::Decode,
                    format!(
                        "the table map of {database}.{table} at {}:{} has no column names: \
                         binlog_row_metadata was set to other than FULL while the capture ran, \
                         and its rows cannot be told to have today's columns. Set it back (SET \
                         GLOBAL binlog_row_metadata = 'FULL'); the events logged meanwhile \
                         cannot be read exactly, so re-snapshot the tables written since \
                         (a new connector name with snapshot.mode = \"snapshot+stream\")",
                        self.file, self.resume.pos
                    ),
                ))
            }
            None => current.ok_or_else(|| {
                CaptureError::definite(
                    Origin::Decode,
                    format!(
                        "{database}.{table} is in the binlog at {}:{} but not in \
                         information_schema (dropped since?), and the binlog carries no column \
                         metadata (binlog_row_metadata is not FULL): its rows cannot be decoded",
                        self.file, self.resume.pos
                    ),
                )
            })?,
        };
        if let Some(d) = self.decoders.get(&table_id) {
            if d.schema.schema_id == schema.schema_id {
                return Ok(());
            }
        }
        // A new decoder: the table's first rows since start or since a DDL (which drops its
        // decoders), so what waits for them is done here, off the path of every other table map.
        let here = (database.clone(), table.clone());
        if from_binlog {
            if self
                .ddl_pending
                .iter()
                .any(|p| (&p.database, &p.table) == (&here.0, &here.1))
            {
                self.publish_pending_ddl(&database, &table, Some(schema.clone()))
                    .await?;
            } else if let Some(published) = self.ddl_schemas.remove(&here) {
                // The schema a DDL event carried, against the binlog's own.
                if let Some(why) = disagreement(&published, &schema) {
                    let at = self.resume.pos;
                    self.refuse_table(
                        &database,
                        &table,
                        "(the table's last DDL)",
                        &format!(
                            "the schema published with the table's last DDL (read from \
                             information_schema) disagrees with the binlog's for the rows \
                             after it: {why}. Re-snapshot the table"
                        ),
                        at,
                        0,
                    )
                    .await?;
                }
            }
        }
        self.last_schema.insert(here, schema.clone());
        let decoder = TableDecoder::new(&tme, &schema).map_err(|e| {
            CaptureError::decode(
                &format!("{database}.{table}"),
                &format!("{}:{}", self.file, self.resume.pos),
                e,
            )
        })?;
        let topic = self.topics.topic(&database, &table)?;
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
}

/// The parsed table map of a TABLE_MAP event, owned (the stream keeps its own copy).
pub(super) fn stream_tables(
    stream: &mysql_async::BinlogStream,
    event: &Event,
) -> Option<TableMapEvent<'static>> {
    if event.header().event_type_raw() != TABLE_MAP_EVENT {
        return None;
    }
    let Ok(Some(EventData::TableMapEvent(tme))) = event.read_data() else {
        return None;
    };
    stream.get_tme(tme.table_id()).cloned()
}

/// How a DDL event's schema and the table map's after it differ (names, types, signedness,
/// order), if they do.
fn disagreement(published: &v1::TableSchema, binlog: &v1::TableSchema) -> Option<String> {
    let cols = |s: &v1::TableSchema| -> Vec<(String, i32, bool)> {
        s.columns
            .iter()
            .map(|c| (c.name.clone(), c.r#type, c.unsigned))
            .collect()
    };
    let (a, b) = (cols(published), cols(binlog));
    if a == b {
        return None;
    }
    let names = |v: &[(String, i32, bool)]| v.iter().map(|c| c.0.clone()).collect::<Vec<_>>();
    if names(&a) != names(&b) {
        return Some(format!(
            "published columns {:?}, binlog columns {:?}",
            names(&a),
            names(&b)
        ));
    }
    let ty = |t: i32, unsigned: bool| {
        let name = v1::ColumnType::try_from(t)
            .map(|t| t.as_str_name().to_string())
            .unwrap_or_else(|_| t.to_string());
        if unsigned {
            format!("{name} UNSIGNED")
        } else {
            name
        }
    };
    let differ: Vec<String> = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .map(|(x, y)| {
            format!(
                "{}: published {}, binlog {}",
                x.0,
                ty(x.1, x.2),
                ty(y.1, y.2)
            )
        })
        .collect();
    Some(format!("columns of another type: {}", differ.join("; ")))
}
