//! Source DDL applied to the target, in order with the rows of its partition (the batch before
//! it is written first, see [`Sink::apply_event`]).
//!
//! - ALTER: the new schema is remembered; target columns its source no longer has are dropped
//!   (the bookkeeping columns stay); added columns are added when the first row that has them
//!   arrives ([`super::target`]).
//! - DROP, TRUNCATE and RENAME of the source table are logged and not applied: the data in
//!   ClickHouse is the operator's to keep or drop.
//! - A statement ClickHouse refuses stops that table: its later events are dead-lettered with
//!   the statement named, while other tables go on. An unreachable ClickHouse is waited for.
//!   The stop lives in memory only: after a restart the table's events are tried again (and
//!   the DDL itself, if its offset was not committed yet).

use std::collections::HashSet;

use sluice_proto::ChangeEvent;

use super::{Refusal, Sink};
use crate::error::ApplyError;

impl Sink {
    /// Apply a source DDL to its target. A statement ClickHouse refuses stops that table; an
    /// unreachable ClickHouse is waited for.
    pub(super) async fn apply_ddl(&mut self, event: &ChangeEvent) -> Result<(), ApplyError> {
        let Some(ddl) = &event.ddl else {
            return Ok(());
        };
        // Target columns may change: plans are worked out again.
        self.plans.clear();
        let name = self.target_name(&event.database, &event.table);
        let statement = ddl.statement.clone();
        let result: Result<(), Refusal> = async {
            match ddl.kind.as_str() {
                "alter" => {
                    let Some(new) = &ddl.schema else { return Ok(()) };
                    self.schemas.remember(new);
                    let Some(mut target) = self.targets.get(&name).cloned() else {
                        return Ok(()); // made from the schema when its first row arrives
                    };
                    let wanted: HashSet<&str> =
                        new.columns.iter().map(|c| c.name.as_str()).collect();
                    let m = &self.config.tables;
                    let keep: HashSet<&str> = [
                        m.version_column.as_str(),
                        m.deleted_column.as_str(),
                        m.op_column.as_str(),
                    ]
                    .into();
                    for col in target.columns.keys().cloned().collect::<Vec<_>>() {
                        if wanted.contains(col.as_str()) || keep.contains(col.as_str()) {
                            continue;
                        }
                        self.drop_column(&name, &col).await?;
                        target.columns.remove(&col);
                    }
                    // Added columns are added when the first row that has them arrives.
                    self.targets.insert(name.clone(), target);
                    Ok(())
                }
                "drop" | "truncate" | "rename" => {
                    // Data in the target is kept; the operator decides what to do with it.
                    tracing::warn!(table = %name, kind = %ddl.kind, statement = %statement, "source DDL not applied to the target");
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        .await;
        match result {
            Ok(()) => Ok(()),
            Err(Refusal::Stop(e)) => Err(e),
            Err(Refusal::Bad(e)) => {
                tracing::error!(table = %name, statement = %statement, error = %e, "DDL failed: stopping this table");
                let reason = format!("DDL {statement:?} failed: {e}");
                if let Some(t) = self.targets.get_mut(&name) {
                    t.stopped = Some(reason);
                }
                Ok(())
            }
        }
    }
}
