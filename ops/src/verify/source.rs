//! The MySQL side: a pool of sessions in UTC and REPEATABLE READ, the tables the capture's
//! filter takes, and consistent snapshots with the binlog positions they lie between.

use mysql_async::prelude::Queryable;
use sluice_capture::mysql::position::BinlogPos;

use super::render::abbreviated;

/// The source side.
pub(super) struct Source {
    pub(super) pool: mysql_async::Pool,
    pub(super) mariadb: bool,
    pub(super) status_sql: &'static str,
}

impl Source {
    pub(super) async fn open(config: &sluice_capture::mysql::MysqlConfig) -> Result<Self, String> {
        let opts = config.opts()?;
        let opts = mysql_async::OptsBuilder::from_opts(opts).setup(vec![
            "SET SESSION time_zone = '+00:00', NAMES utf8mb4".to_string(),
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_string(),
        ]);
        let pool = mysql_async::Pool::new(opts);
        let mut conn = sluice_capture::mysql::connect::from_pool(&pool)
            .await
            .map_err(|e| sluice_capture::mysql::connect_error(&e, config))?;
        let version: Option<String> = conn
            .query_first("SELECT @@version")
            .await
            .map_err(|e| format!("{}: {e}", config.describe()))?;
        let version = version.unwrap_or_default();
        Ok(Self {
            pool,
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            status_sql: sluice_capture::mysql::binlog_status_sql(&version),
        })
    }

    pub(super) async fn conn(&self) -> Result<mysql_async::Conn, String> {
        sluice_capture::mysql::connect::from_pool(&self.pool)
            .await
            .map_err(|e| format!("the source: {e}"))
    }

    /// Every base table of the databases the capture's filter takes.
    pub(super) async fn tables(
        &self,
        filter: &sluice_capture::filter::Filter,
    ) -> Result<Vec<(String, String)>, String> {
        let mut conn = self.conn().await?;
        let all: Vec<(String, String)> = conn
            .query(
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
                 WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME",
            )
            .await
            .map_err(|e| format!("listing the source's tables: {e}"))?;
        Ok(all
            .into_iter()
            .filter(|(d, t)| filter.wants(d, t))
            .collect())
    }

    pub(super) async fn query<T: mysql_async::prelude::FromRow + Send + 'static>(
        conn: &mut mysql_async::Conn,
        sql: &str,
    ) -> Result<Vec<T>, String> {
        conn.query(sql)
            .await
            .map_err(|e| format!("the source refused the query {}: {e}", abbreviated(sql)))
    }

    pub(super) async fn position(&self, conn: &mut mysql_async::Conn) -> Result<BinlogPos, String> {
        let row: Option<mysql_async::Row> = conn
            .query_first(self.status_sql)
            .await
            .map_err(|e| format!("{}: {e}", self.status_sql))?;
        let row = row.ok_or_else(|| {
            "the source writes no binlog (SHOW MASTER STATUS is empty)".to_string()
        })?;
        Ok(BinlogPos {
            file: row.get(0).unwrap_or_default(),
            pos: row.get(1).unwrap_or(4),
        })
    }

    /// Opens a consistent snapshot on `conn`: the binlog positions it lies between (one
    /// position on MariaDB, which reports it; on MySQL the positions before and after).
    pub(super) async fn snapshot(
        &self,
        conn: &mut mysql_async::Conn,
    ) -> Result<(BinlogPos, BinlogPos), String> {
        let before = if self.mariadb {
            None
        } else {
            Some(self.position(conn).await?)
        };
        let at = sluice_capture::mysql::snapshot::begin_snapshot(conn, self.mariadb)
            .await
            .map_err(|e| format!("START TRANSACTION WITH CONSISTENT SNAPSHOT: {e}"))?;
        if let Some(p) = at {
            return Ok((p.clone(), p));
        }
        if self.mariadb {
            return Err("the source reports no binlog_snapshot_position".into());
        }
        let after = self.position(conn).await?;
        Ok((before.expect("read before"), after))
    }
}
