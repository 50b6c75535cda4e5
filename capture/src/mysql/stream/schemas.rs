//! The schema cache and the schema topic.
//!
//! A table's schema is read from `information_schema` when the table is first met (a table
//! map, a snapshot, a DDL statement) and kept until a DDL statement naming the table (or its
//! database) drops it. Every schema is published to the schema topic, acknowledged, before the
//! first event naming its `schema_id`; each id once per run (the topic is compacted by id, so
//! publishing again after a restart is harmless).

use prost::Message;
use sluice_proto::schema_record_key;
use sluice_proto::v1::{self, TableSchema};

use super::context::Capture;
use crate::error::CaptureError;
use crate::mysql::schema;

impl Capture {
    /// The table's schema now (cached), published; `None` when the table does not exist.
    pub(super) async fn schema_of(
        &mut self,
        db: &str,
        table: &str,
    ) -> Result<Option<TableSchema>, CaptureError> {
        let key = (db.to_string(), table.to_string());
        if let Some(s) = self.schemas.get(&key) {
            return Ok(Some(s.clone()));
        }
        let loaded = schema::load(&mut self.schema_conn, db, table).await?;
        if let Some(s) = &loaded {
            self.publish_schema(s).await?;
            self.schemas.insert(key, s.clone());
        }
        Ok(loaded)
    }

    /// Publish a schema record unless this run already did, and wait for its acknowledgement.
    pub(super) async fn publish_schema(&mut self, s: &TableSchema) -> Result<(), CaptureError> {
        if !self.published_schemas.insert(s.schema_id) {
            return Ok(());
        }
        let record = v1::SchemaRecord {
            schema: Some(s.clone()),
            position: Some(self.position(self.resume.pos, 0)),
        };
        self.publisher
            .send_and_wait(
                &self.config.publish.schema_topic,
                schema_record_key(s.schema_id).as_bytes(),
                &record.encode_to_vec(),
            )
            .await?;
        Ok(())
    }
}
