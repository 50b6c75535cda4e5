//! The snapshot's reader tasks: one consistent-snapshot transaction per chunk, on a pool of
//! `parallel_tables` connections, sending what it read back to the stream loop as [`Msg`]s.
//!
//! A keyed table's chunk is `SELECT`ed whole (`chunk_rows` rows after the last published key,
//! in key order) and sent as one message with the position the snapshot is consistent with
//! (MariaDB). A keyless table is read whole: `Began` with its position first (the stream holds
//! there), then the rows in batches, then `Ended`. A failure is sent as `Failed` with the
//! capture's error: transient ones (the connection went away, a lock wait timeout, the table
//! changed while read) make the loop read the chunk again. A reader keeps nothing: a restart
//! asks for the chunk again from the checkpoint's last key.

use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Value as My};
use sluice_proto::v1::{self, ColumnType, TableSchema};
use tokio::sync::mpsc;

use super::values::{to_param, to_value};
use super::Msg;
use crate::error::{mysql_transient, CaptureError, Origin};
use crate::mysql::position::BinlogPos;
use sluice_common::sql::mysql::ident;

/// One chunk to read.
pub struct ChunkRequest {
    pub chunk: u64,
    pub database: String,
    pub table: String,
    /// The last key published; empty for the first chunk.
    pub after: Vec<v1::Value>,
    pub limit: u64,
    pub mariadb: bool,
}

/// Why a reader ends early.
enum Stop {
    /// A failure, for the stream loop to judge.
    Failed(CaptureError),
    /// The stream loop is gone (the capture stopped): nobody to tell.
    Gone,
}

impl From<CaptureError> for Stop {
    fn from(e: CaptureError) -> Self {
        Stop::Failed(e)
    }
}

/// A server or client error, classified by the crate's rule (`mysql_transient`), its text as
/// the driver gives it.
fn my(e: mysql_async::Error) -> Stop {
    let message = e.to_string();
    Stop::Failed(if mysql_transient(&e) {
        CaptureError::transient(Origin::Mysql, message)
    } else {
        CaptureError::definite(Origin::Mysql, message)
    })
}

/// Read one chunk of a keyed table (in a task), or a whole keyless table, and send it back.
pub async fn read_chunk(pool: Pool, tx: mpsc::Sender<Msg>, r: ChunkRequest) {
    let ChunkRequest {
        chunk,
        database,
        table,
        after,
        limit,
        mariadb,
    } = r;
    let result = read_inner(&pool, &tx, chunk, &database, &table, &after, limit, mariadb).await;
    if let Err(Stop::Failed(e)) = result {
        // Named after the table, kept transient or definite, with its origin.
        let prefix = |m: String| format!("snapshot of {database}.{table}: {m}");
        let error = match e {
            CaptureError::Transient(o, m) => CaptureError::Transient(o, prefix(m)),
            CaptureError::Definite(o, m) => CaptureError::Definite(o, prefix(m)),
        };
        let _ = tx.send(Msg::Failed { chunk, error }).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_inner(
    pool: &Pool,
    tx: &mpsc::Sender<Msg>,
    chunk: u64,
    database: &str,
    table: &str,
    after: &[v1::Value],
    limit: u64,
    mariadb: bool,
) -> Result<(), Stop> {
    let mut conn = crate::mysql::connect::from_pool(pool).await.map_err(my)?;
    prepare(&mut conn).await.map_err(my)?;
    let mut at = begin_snapshot(&mut conn, mariadb).await.map_err(my)?;
    // Inside the transaction: the statement below holds the table's metadata lock, so the
    // schema read here is the one it sees (checked against the result's columns).
    let schema = crate::mysql::schema::load(&mut conn, database, table)
        .await
        .map_err(my)?
        .ok_or_else(|| CaptureError::source(format!("{database}.{table} no longer exists")))?;
    let list = select_list(&schema);
    let from = format!("{}.{}", ident(database), ident(table));
    let keyed = !schema.primary_key.is_empty();
    let channel_gone = |_| Stop::Gone;
    let columns_match = |cols: &[mysql_async::Column]| -> Result<(), Stop> {
        if cols.len() != schema.columns.len() {
            return Err(CaptureError::transient(
                Origin::Source,
                format!(
                    "the table changed while it was read ({} columns, {} expected); retrying",
                    cols.len(),
                    schema.columns.len()
                ),
            )
            .into());
        }
        Ok(())
    };
    let value_error = |e: String| Stop::Failed(CaptureError::definite(Origin::Decode, e));
    if keyed {
        let order: Vec<String> = schema
            .primary_key
            .iter()
            .map(|i| ident(&schema.columns[*i as usize].name))
            .collect();
        let (clause, params) = if after.is_empty() {
            (String::new(), Vec::new())
        } else {
            let (c, p) = after_clause(&schema, after);
            (format!(" WHERE {c}"), p)
        };
        let sql = format!(
            "SELECT {list} FROM {from}{clause} ORDER BY {} LIMIT {limit}",
            order.join(", ")
        );
        let mut result = conn
            .exec_iter(sql, mysql_async::Params::Positional(params))
            .await
            .map_err(my)?;
        columns_match(result.columns_ref())?;
        let mut rows = Vec::with_capacity(limit.min(100_000) as usize);
        while let Some(row) = result.next().await.map_err(my)? {
            rows.push(row_of(&schema, row).map_err(value_error)?);
        }
        drop(result);
        conn.query_drop("COMMIT").await.map_err(my)?;
        tx.send(Msg::Chunk {
            chunk,
            schema,
            rows,
            at,
        })
        .await
        .map_err(channel_gone)?;
        return Ok(());
    }
    if at.is_none() {
        at = crate::mysql::binlog_position(&mut conn).await.map_err(my)?;
    }
    let at = at.ok_or_else(|| CaptureError::source("binary logging is off"))?;
    tx.send(Msg::Began {
        chunk,
        schema: schema.clone(),
        at,
    })
    .await
    .map_err(channel_gone)?;
    // A prepared statement, as for keyed chunks: the binary protocol, in which every value
    // arrives as `to_value` reads it (the text protocol sends a DATETIME as text bytes).
    let mut result = conn
        .exec_iter(format!("SELECT {list} FROM {from}"), ())
        .await
        .map_err(my)?;
    columns_match(result.columns_ref())?;
    let mut batch = Vec::with_capacity(1000);
    while let Some(row) = result.next().await.map_err(my)? {
        batch.push(row_of(&schema, row).map_err(value_error)?);
        if batch.len() == 1000 {
            tx.send(Msg::Batch {
                chunk,
                rows: std::mem::take(&mut batch),
            })
            .await
            .map_err(channel_gone)?;
        }
    }
    drop(result);
    conn.query_drop("COMMIT").await.map_err(my)?;
    if !batch.is_empty() {
        tx.send(Msg::Batch { chunk, rows: batch })
            .await
            .map_err(channel_gone)?;
    }
    tx.send(Msg::Ended { chunk }).await.map_err(channel_gone)?;
    Ok(())
}

fn row_of(schema: &TableSchema, row: mysql_async::Row) -> Result<v1::Row, String> {
    let values = row.unwrap();
    let mut out = Vec::with_capacity(values.len());
    for (col, v) in schema.columns.iter().zip(values) {
        out.push(to_value(col, v)?);
    }
    Ok(v1::Row { values: out })
}

/// Settings of every snapshot connection: results as stored (no charset conversion), times
/// in UTC (TIMESTAMP values then read as what the binlog holds).
async fn prepare(conn: &mut mysql_async::Conn) -> Result<(), mysql_async::Error> {
    conn.query_drop("SET SESSION time_zone = '+00:00', character_set_results = binary")
        .await?;
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
}

/// `START TRANSACTION WITH CONSISTENT SNAPSHOT` on `conn`, and the binlog position it is
/// consistent with where the server reports one (MariaDB's `binlog_snapshot_*`; `None` on
/// MySQL).
pub async fn begin_snapshot(
    conn: &mut mysql_async::Conn,
    mariadb: bool,
) -> Result<Option<BinlogPos>, mysql_async::Error> {
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await?;
    if mariadb {
        let rows: Vec<(String, String)> =
            conn.query("SHOW STATUS LIKE 'binlog_snapshot_%'").await?;
        let get = |n: &str| {
            rows.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        if let (Some(file), Some(pos)) =
            (get("Binlog_snapshot_file"), get("Binlog_snapshot_position"))
        {
            if let Ok(pos) = pos.parse() {
                return Ok(Some(BinlogPos { file, pos }));
            }
        }
    }
    Ok(None)
}

/// The `SELECT` list: ENUM and SET as their numbers (index, bitmap), the rest as stored.
pub(super) fn select_list(schema: &TableSchema) -> String {
    schema
        .columns
        .iter()
        .map(|c| match c.r#type() {
            ColumnType::Enum | ColumnType::Set => format!("{}+0", ident(&c.name)),
            _ => ident(&c.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `WHERE` for the rows after `after` in key order: `a > ? OR (a = ? AND b > ?) ...`.
pub(super) fn after_clause(schema: &TableSchema, after: &[v1::Value]) -> (String, Vec<My>) {
    let names: Vec<String> = schema
        .primary_key
        .iter()
        .map(|i| ident(&schema.columns[*i as usize].name))
        .collect();
    let mut ors = Vec::new();
    let mut params = Vec::new();
    for i in 0..names.len() {
        let mut ands = Vec::new();
        for (j, name) in names.iter().enumerate().take(i) {
            ands.push(format!("{name} = ?"));
            params.push(to_param(&after[j]));
        }
        ands.push(format!("{} > ?", names[i]));
        params.push(to_param(&after[i]));
        ors.push(format!("({})", ands.join(" AND ")));
    }
    (ors.join(" OR "), params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::value::Kind;

    #[test]
    fn the_after_clause_walks_a_composite_key_in_order() {
        let col = |n: &str| v1::Column {
            name: n.into(),
            r#type: ColumnType::Int as i32,
            ..Default::default()
        };
        let schema = TableSchema {
            columns: vec![col("a"), col("x"), col("b")],
            primary_key: vec![0, 2],
            ..Default::default()
        };
        let v = |i| v1::Value {
            kind: Some(Kind::Int(i)),
        };
        let (sql, params) = after_clause(&schema, &[v(1), v(2)]);
        assert_eq!(sql, "(`a` > ?) OR (`a` = ? AND `b` > ?)");
        assert_eq!(params, vec![My::Int(1), My::Int(1), My::Int(2)]);
    }
}
