//! The stopped tables and collections of the apply stages whose configs `sluice status` was
//! given (`--apply-config`): read from their targets (apply-clickhouse's
//! `tables.stopped_table`, apply-mongo's `<meta_database>.stopped_collections`), each with
//! when it was stopped, why, and the steps that take it up again.

use serde::Serialize;
use sluice_common::sql::clickhouse::{ident, string};

/// One stopped table (or collection).
#[derive(Debug, Serialize, PartialEq)]
pub struct Stopped {
    /// The stage that keeps it stopped, and its consumer group.
    pub stage: &'static str,
    pub group: String,
    /// The target table (ClickHouse) or namespace (MongoDB).
    pub target: String,
    /// When it was stopped (the server's time), as the server prints it.
    pub since: String,
    pub reason: String,
    /// What an operator does to take it up again, in order.
    pub resume: Vec<String>,
}

/// The stopped tables of the apply-clickhouse stage configured by `config`.
pub async fn clickhouse(config: &sluice_apply::clickhouse::Config) -> Result<Vec<Stopped>, String> {
    let client = config.clickhouse.client()?;
    let db = &config.clickhouse.database;
    let stopped = &config.tables.stopped_table;
    let exists: u8 = client
        .query(&format!(
            "SELECT count() > 0 FROM system.tables WHERE database = {} AND name = {}",
            string(db),
            string(stopped)
        ))
        .fetch_one()
        .await
        .map_err(|e| format!("ClickHouse {}: {e}", config.clickhouse.url))?;
    if exists == 0 {
        return Ok(Vec::new()); // no table was ever stopped
    }
    let select = format!(
        "SELECT target, argMax(reason, at), toString(max(at)) FROM {}.{} GROUP BY target \
         ORDER BY target",
        ident(db),
        ident(stopped)
    );
    let rows: Vec<(String, String, String)> = client
        .query(&select)
        .fetch_all()
        .await
        .map_err(|e| format!("{select}: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(target, reason, since)| Stopped {
            stage: "apply-clickhouse",
            group: config.consumer.group_id.clone(),
            resume: vec![
                format!("bring {db}.{target} to the source's state as the reason says, or drop it to copy the table again (the stage makes it again from the copy's schema)"),
                format!(
                    "ALTER TABLE {}.{}{} DELETE WHERE target = {}",
                    ident(db),
                    ident(stopped),
                    config.cluster.on(),
                    string(&target)
                ),
                "running instances take it up within 5 s (the log says `table taken up again`)".into(),
                "sluice dead-letters replay --table <its source database.table>, or copy it again (the capture's snapshot.tables and a new snapshot.request_id)".into(),
            ],
            target,
            since,
            reason,
        })
        .collect())
}

/// The stopped collections of the apply-mongo stage configured by `config`.
pub async fn mongo(config: &sluice_apply::mongo::Config) -> Result<Vec<Stopped>, String> {
    use futures::TryStreamExt;
    let client = mongodb::Client::with_uri_str(config.mongodb.uri.expose())
        .await
        .map_err(|e| format!("MongoDB: {e}"))?;
    let meta = &config.mongodb.meta_database;
    let docs: Vec<mongodb::bson::Document> = client
        .database(meta)
        .collection::<mongodb::bson::Document>("stopped_collections")
        .find(mongodb::bson::doc! {})
        .sort(mongodb::bson::doc! { "_id": 1 })
        .await
        .map_err(|e| format!("{meta}.stopped_collections: {e}"))?
        .try_collect()
        .await
        .map_err(|e| format!("{meta}.stopped_collections: {e}"))?;
    Ok(docs
        .into_iter()
        .filter_map(|d| {
            let ns = d.get_str("_id").ok()?.to_string();
            let since = d
                .get_datetime("at")
                .ok()
                .and_then(|t| t.try_to_rfc3339_string().ok())
                .unwrap_or_else(|| "-".into());
            Some(Stopped {
                stage: "apply-mongo",
                group: config.consumer.group_id.clone(),
                resume: vec![
                    "fix the cause the reason names".into(),
                    format!(
                        "db.getSiblingDB({meta:?}).stopped_collections.deleteOne({{_id: {ns:?}}})"
                    ),
                    "restart the apply-mongo instances".into(),
                    "copy the collection again (the capture's snapshot.tables and a new snapshot.request_id)".into(),
                ],
                reason: d.get_str("reason").unwrap_or("-").to_string(),
                target: ns,
                since,
            })
        })
        .collect())
}

/// The stopped tables of the apply stage configured by the file at `path` (with the
/// environment's overrides of its own sections: `sluice_common::config::load_own`), an
/// apply-clickhouse config or an apply-mongo one; and the sections it left to other configs.
pub async fn of_config(
    path: &std::path::Path,
) -> Result<(Vec<Stopped>, std::collections::BTreeSet<String>), String> {
    use sluice_common::config::load_own;
    let named = |e: String| format!("{}: {e}", path.display());
    match load_own::<sluice_apply::clickhouse::Config>(Some(path)) {
        Ok((c, left)) => Ok((clickhouse(&c).await.map_err(named)?, left)),
        Err(ch) => match load_own::<sluice_apply::mongo::Config>(Some(path)) {
            Ok((c, left)) => Ok((mongo(&c).await.map_err(named)?, left)),
            Err(mongo) => Err(format!(
                "{}: neither an apply-clickhouse config ({ch}) nor an apply-mongo one ({mongo})",
                path.display()
            )),
        },
    }
}
