//! One instance changes a target for a statement. A statement that makes a target again (a
//! table made again in the source, another table renamed to its name, a new key, a partition
//! statement), and an ALTER, reaches every instance of the group, one copy per partition; each copy is checked against
//! what `tables.ddl_table` records as applied, but two instances that read that record before
//! either wrote it would both drop the target: the second would drop rows the first already
//! wrote into the new one, and two applying one ALTER undo each other's steps (one drops a
//! column the other has just added again in its new type). So the instance that does it
//! first creates a claim table `<target>__remaking_<version>` (or `__altering_`, an empty
//! `Log` table): creating a table of a name that
//! exists fails, so one instance wins; the others wait until the winner records the statement
//! as applied, then go on as later copies do.
//!
//! A claim whose winner died before recording (older than [`STALE`], with no record) is
//! renamed away by whichever waiter gets there first (a rename of a missing table fails, so
//! one does), and the claim is contested again. Claims of older statements of the target are
//! dropped when it is made again, once ten minutes old (an instance deciding about one of
//! those later reads its record; one that read before the record was written still waits on
//! the claim). A waiter also stops waiting at the record of a later statement of the target.
//! Not on a cluster (`cluster.enabled`), where tables are made `ON CLUSTER`.

use std::time::{Duration, Instant};

use super::{Refusal, Sink};
use crate::error::{clickhouse_code, BadEvent, Reason};
use sluice_common::sql::clickhouse::{ident, string};

/// What a claim is for: its table's name is `<target>__<word>_<version>`.
#[derive(Clone, Copy)]
enum Work {
    Remaking,
    Altering,
}

impl Work {
    fn word(self) -> &'static str {
        match self {
            Work::Remaking => "remaking",
            Work::Altering => "altering",
        }
    }
}

/// TABLE_ALREADY_EXISTS (`src/Common/ErrorCodes.cpp`).
const TABLE_ALREADY_EXISTS: i32 = 57;

/// A claim this old without a record: its winner died.
const STALE: Duration = Duration::from_secs(60);

/// Claims of older statements are dropped once this old.
const KEEP: Duration = Duration::from_secs(600);

impl Sink {
    /// Whether this instance makes target `name` again for the statement at `version` (it
    /// holds the claim), or another one did (its record read: the target is forgotten, to be
    /// read again as it is now).
    pub(super) async fn claim_remake(&mut self, name: &str, version: u64) -> Result<bool, Refusal> {
        self.claim(name, Work::Remaking, version).await
    }

    /// Whether this instance applies the ALTER at `version` to target `name` (it holds the
    /// claim), or another one did (as [`Self::claim_remake`]): two instances applying one
    /// ALTER at once undo each other's steps (one drops a column the other has just added
    /// again in its new type).
    pub(super) async fn claim_alter(&mut self, name: &str, version: u64) -> Result<bool, Refusal> {
        self.claim(name, Work::Altering, version).await
    }

    async fn claim(&mut self, name: &str, work: Work, version: u64) -> Result<bool, Refusal> {
        if self.config.cluster.enabled() {
            return Ok(true);
        }
        let db = ident(&self.config.clickhouse.database);
        let prefix = format!("{name}__{}_", work.word());
        let claim = format!("{prefix}{version}");
        if self.claims_held.contains(&claim) {
            // (its own, from a first try of the statement: read again since)
            return Ok(true);
        }
        let create = format!(
            "CREATE TABLE {db}.{} (at DateTime DEFAULT now()) ENGINE = Log",
            ident(&claim)
        );
        let started = Instant::now();
        let mut said = false;
        loop {
            let created = self
                .answered(&format!("claiming {name}"), || {
                    self.client.query(&create).execute()
                })
                .await?;
            match created {
                Ok(()) => {
                    self.claims_held.insert(claim.clone());
                    self.drop_old_claims(&prefix, version).await;
                    return Ok(true);
                }
                Err(e) if clickhouse_code(&e) == Some(TABLE_ALREADY_EXISTS) => {}
                Err(e) => {
                    return Err(BadEvent::new(Reason::Ddl, format!("{create}: {e}")).into());
                }
            }
            if !said {
                tracing::info!(table = %name, version, claim = %claim, "another instance changes this target for the statement: waiting for it to record the statement as applied");
                said = true;
            }
            self.read_applied(name).await?;
            if self.applied.get(name).is_some_and(|s| s.version >= version) {
                self.targets.remove(name);
                self.plans.clear();
                return Ok(false);
            }
            if self
                .claim_age(&claim)
                .await?
                .is_some_and(|age| age >= STALE)
            {
                // Its winner died before recording: renamed away (by one waiter), contested
                // again.
                let aside = format!("{claim}__stale_{}", started.elapsed().as_nanos());
                let sql = format!(
                    "RENAME TABLE {db}.{} TO {db}.{}",
                    ident(&claim),
                    ident(&aside)
                );
                let _ = self.client.query(&sql).execute().await;
                tracing::warn!(table = %name, version, claim = %claim, "a claim to make this target again was not finished within {STALE:?} (its instance stopped?): taken over");
                continue;
            }
            if self.shutdown.is_triggered() {
                return Err(Refusal::Stop(crate::error::ApplyError::definite(
                    crate::error::Origin::Sink,
                    format!("stopped while another instance made {name} again; the statement is read again"),
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether another instance is changing target `name` (making it again, or applying an
    /// ALTER: a claim of it, not this process's own, with no record of its statement yet):
    /// then wait until it has recorded it ([`STALE`] at most). (This process's own claim of a
    /// statement that failed is no reason to wait: the table stops as for any refusal.)
    pub(super) async fn waited_for_remake(&mut self, name: &str) -> bool {
        let mut newest: Option<u64> = None;
        for work in [Work::Remaking, Work::Altering] {
            let prefix = format!("{name}__{}_", work.word());
            let sql = format!(
                "SELECT name FROM system.tables WHERE database = {} AND startsWith(name, {})",
                string(&self.config.clickhouse.database),
                string(&prefix)
            );
            let Ok(names) = self.client.query(&sql).fetch_all::<String>().await else {
                return false;
            };
            let v = names
                .iter()
                .filter(|n| !n.contains("__stale_") && !self.claims_held.contains(*n))
                .filter_map(|n| n[prefix.len()..].parse::<u64>().ok())
                .max();
            newest = newest.max(v);
        }
        let Some(version) = newest else {
            return false;
        };
        let started = Instant::now();
        let mut waited = false;
        while started.elapsed() < STALE && !self.shutdown.is_triggered() {
            if self.read_applied(name).await.is_err() {
                return waited;
            }
            if self.applied.get(name).is_some_and(|s| s.version >= version) {
                return waited;
            }
            waited = true;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        waited
    }

    /// How long ago claim table `claim` was made (`None`: it is not there).
    async fn claim_age(&self, claim: &str) -> Result<Option<Duration>, Refusal> {
        let sql = format!(
            "SELECT toUInt64(greatest(0, toInt64(now()) - toInt64(toUnixTimestamp(\
             metadata_modification_time)))) FROM system.tables WHERE database = {} AND name = {}",
            string(&self.config.clickhouse.database),
            string(claim)
        );
        let rows: Vec<u64> = self
            .answered("reading a claim's age", || {
                self.client.query(&sql).fetch_all::<u64>()
            })
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        Ok(rows.first().map(|s| Duration::from_secs(*s)))
    }

    /// Drop the claims (and claims taken over) of statements older than `version` made more
    /// than [`KEEP`] ago. (A claim younger than that may still be waited on by an instance that
    /// read the statement's record before it was written: dropped, that instance would win it
    /// and make the target again over this one.)
    async fn drop_old_claims(&self, prefix: &str, version: u64) {
        let db = &self.config.clickhouse.database;
        let sql = format!(
            "SELECT name FROM system.tables WHERE database = {} AND startsWith(name, {}) \
             AND metadata_modification_time < now() - {}",
            string(db),
            string(prefix),
            KEEP.as_secs()
        );
        let Ok(names) = self.client.query(&sql).fetch_all::<String>().await else {
            return;
        };
        for n in names {
            let v: Option<u64> = n[prefix.len()..]
                .split("__")
                .next()
                .and_then(|v| v.parse().ok());
            if v.is_some_and(|v| v < version) || (v == Some(version) && n.contains("__stale_")) {
                let drop = format!("DROP TABLE IF EXISTS {}.{}", ident(db), ident(&n));
                let _ = self.client.query(&drop).execute().await;
            }
        }
    }
}
