//! The ClickHouse side: queries of the mirror, its columns, and the tables the apply stage
//! stopped.

use std::collections::BTreeMap;

use sluice_common::sql::clickhouse as ch;

use super::render::abbreviated;

/// The target side.
pub(super) struct Target {
    pub(super) client: clickhouse::Client,
    pub(super) database: String,
}

impl Target {
    pub(super) async fn query<T>(&self, sql: &str) -> Result<Vec<T>, String>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        self.client.query(sql).fetch_all::<T>().await.map_err(|e| {
            format!(
                "ClickHouse refused the query {}: {}",
                abbreviated(sql),
                sluice_apply::clickhouse::explain(&e)
            )
        })
    }

    pub(super) async fn columns(&self, target: &str) -> Result<Vec<(String, String)>, String> {
        let (db, t) = target.split_once('.').unwrap_or((&self.database, target));
        self.query(&format!(
            "SELECT name, type FROM system.columns WHERE database = {} AND table = {}",
            ch::string(db),
            ch::string(t)
        ))
        .await
    }

    /// Stopped target tables and why.
    pub(super) async fn stopped(&self, table: &str) -> BTreeMap<String, String> {
        let sql = format!(
            "SELECT target, reason FROM {}.{} FINAL",
            ch::ident(&self.database),
            ch::ident(table)
        );
        self.query::<(String, String)>(&sql)
            .await
            .map(|v| v.into_iter().collect())
            .unwrap_or_default()
    }
}
