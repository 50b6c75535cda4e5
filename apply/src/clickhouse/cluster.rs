//! `[cluster]`: target tables on a ClickHouse cluster.
//!
//! With `cluster.name` set, every statement that makes or changes a table runs `ON CLUSTER`,
//! and tables are made with the Replicated engines: `ReplicatedReplacingMergeTree` (mirrors and
//! change logs) and `ReplicatedMergeTree` (the applied DDL's table), at `zookeeper_path` with
//! replica name `replica` (server macros such as `{shard}` and `{replica}` are expanded by each
//! server). The stage's own tables (stopped tables, applied DDL) live at `meta_zookeeper_path`,
//! one copy on every server of the cluster, so that every applier, whichever server it writes
//! to, sees the same ones.
//!
//! With `distributed`, a target table `t` is two: `t_local` (the Replicated table, on every
//! shard) and `t`, a `Distributed` table over them sharded by a hash of the primary key, so
//! that every version of a row lands on one shard and `FINAL` (which merges per shard) stays
//! right. Rows are written into `t` with `insert_distributed_sync`: the INSERT returns once
//! every shard has its rows. A schema change alters `t_local` `ON CLUSTER`, then puts a new
//! `t` in place (made `AS t_local`, swapped in by one RENAME): ClickHouse 18.16 refuses an ALTER
//! of a Distributed table `ON CLUSTER` where the shards replicate internally.
//!
//! The Distributed tables the stage makes are sharded by a column of its own, `shard_column`
//! (`_shard`, UInt64): a hash of the row's key columns as ClickHouse stores them ([`shard_hash`]),
//! written with every row. ClickHouse sends a row to shard `slots[_shard % total weight]` (each
//! shard holding as many slots as its weight, in `remote_servers` order); the stage computes the
//! same ([`Slots`]), so it can write straight into the per-shard tables (`write = "shards"`)
//! and a row lands where the Distributed table would have put it: every version of a row on
//! one shard whichever way it was written, and a replayed row of a table without a key on the
//! shard it went to the first time (it collapses there).

use serde::{Deserialize, Serialize};

use sluice_common::sql::clickhouse::ident;

/// `[cluster]`: a ClickHouse cluster as the target.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The cluster's name (`remote_servers` of the servers' config); empty: one server, plain
    /// MergeTree engines. Default "".
    pub name: String,
    /// The ZooKeeper (Keeper) path of target tables' replicas. Default
    /// `/clickhouse/tables/{shard}/{database}/{table}`.
    pub zookeeper_path: String,
    /// The replica name. Default `{replica}`.
    pub replica: String,
    /// The ZooKeeper path of the stage's own tables (stopped tables, applied DDL): one copy on
    /// every server, so no `{shard}` in it. Default `/clickhouse/tables/sluice/{database}/{table}`.
    pub meta_zookeeper_path: String,
    /// A `Distributed` table over per-shard tables, for clusters of several shards; written
    /// into, read from. Default false (one shard: every server holds every row).
    pub distributed: bool,
    /// The per-shard tables' suffix, with `distributed`. Default `_local`.
    pub local_suffix: String,
    /// With `distributed`: where rows are written. `"distributed"`: into the Distributed
    /// table, which forwards each row to its shard (`insert_distributed_sync`: the INSERT
    /// returns once every shard has them). `"shards"`: straight into the per-shard tables, each
    /// shard's rows to one of its `shards` URLs (the next one when a replica does not answer):
    /// no second hop through the server written to. Default `"distributed"`.
    pub write: WriteTo,
    /// With `write = "shards"`: per shard, in the order of the cluster's `remote_servers`
    /// (shard_num 1, 2, ...), the HTTP URLs of its replicas (user, password and TLS as in
    /// `[clickhouse]`). Checked at start against `system.clusters` of each server.
    pub shards: Vec<Vec<String>>,
    /// The Distributed tables' sharding column, which the stage fills with the hash of each
    /// row's key. Empty: tables are made sharded by `cityHash64` of the key (they cannot be
    /// written with `write = "shards"`). Default `_shard`.
    pub shard_column: String,
}

/// `cluster.write`: where rows go with Distributed tables.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum WriteTo {
    #[default]
    Distributed,
    Shards,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            zookeeper_path: "/clickhouse/tables/{shard}/{database}/{table}".into(),
            replica: "{replica}".into(),
            meta_zookeeper_path: "/clickhouse/tables/sluice/{database}/{table}".into(),
            distributed: false,
            local_suffix: "_local".into(),
            write: WriteTo::Distributed,
            shards: Vec::new(),
            shard_column: "_shard".into(),
        }
    }
}

impl ClusterConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.name.is_empty() {
            if self.distributed {
                return Err((
                    "cluster.distributed".into(),
                    "needs cluster.name (the Distributed tables' cluster)".into(),
                ));
            }
            return Ok(());
        }
        for (key, v) in [
            ("cluster.zookeeper_path", &self.zookeeper_path),
            ("cluster.replica", &self.replica),
            ("cluster.meta_zookeeper_path", &self.meta_zookeeper_path),
        ] {
            if v.is_empty() {
                return Err((key.into(), "must not be empty with cluster.name".into()));
            }
            if v.contains('\'') || v.contains('\\') {
                return Err((key.into(), format!("{v:?}: no quotes or backslashes")));
            }
        }
        if self.meta_zookeeper_path.contains("{shard}") && self.distributed {
            return Err((
                "cluster.meta_zookeeper_path".into(),
                "must not depend on {shard}: the stage's own tables have one copy on every \
                 server"
                    .into(),
            ));
        }
        if self.distributed && self.local_suffix.is_empty() {
            return Err((
                "cluster.local_suffix".into(),
                "must not be empty with cluster.distributed".into(),
            ));
        }
        if self.write == WriteTo::Shards {
            if !self.distributed {
                return Err((
                    "cluster.write".into(),
                    "\"shards\" needs cluster.distributed = true (per-shard tables)".into(),
                ));
            }
            if self.shard_column.is_empty() {
                return Err((
                    "cluster.shard_column".into(),
                    "must not be empty with write = \"shards\": it is how a row's shard is \
                     known to the Distributed table too"
                        .into(),
                ));
            }
            if self.shards.is_empty() {
                return Err((
                    "cluster.shards".into(),
                    "write = \"shards\" needs the URLs of every shard's replicas, e.g. \
                     [[\"http://ch1:8123\"], [\"http://ch2:8123\"]]"
                        .into(),
                ));
            }
            for (i, replicas) in self.shards.iter().enumerate() {
                if replicas.is_empty() {
                    return Err((
                        format!("cluster.shards[{i}]"),
                        "a shard without a URL".into(),
                    ));
                }
                for u in replicas {
                    if !(u.starts_with("http://") || u.starts_with("https://")) {
                        return Err((
                            format!("cluster.shards[{i}]"),
                            format!(
                                "{:?}: an http:// or https:// URL",
                                sluice_common::secret::redact_uri(u)
                            ),
                        ));
                    }
                }
            }
        } else if !self.shards.is_empty() {
            return Err((
                "cluster.shards".into(),
                "is only read with write = \"shards\"".into(),
            ));
        }
        Ok(())
    }

    /// Whether rows go straight into the per-shard tables.
    pub fn to_shards(&self) -> bool {
        self.distributed && self.write == WriteTo::Shards
    }

    pub fn enabled(&self) -> bool {
        !self.name.is_empty()
    }

    /// ` ON CLUSTER name`, or nothing.
    pub fn on(&self) -> String {
        if self.enabled() {
            format!(" ON CLUSTER {}", ident(&self.name))
        } else {
            String::new()
        }
    }

    /// The engine clause of a table of engine `family` (`ReplacingMergeTree`, `MergeTree`)
    /// with `args` (may be empty): Replicated on a cluster; `meta` for the stage's own tables.
    pub fn engine(&self, family: &str, args: &str, meta: bool) -> String {
        if !self.enabled() {
            return if args.is_empty() {
                family.to_string()
            } else {
                format!("{family}({args})")
            };
        }
        let path = if meta {
            &self.meta_zookeeper_path
        } else {
            &self.zookeeper_path
        };
        let args = if args.is_empty() {
            String::new()
        } else {
            format!(", {args}")
        };
        format!("Replicated{family}('{path}', '{}'{args})", self.replica)
    }

    /// The table rows are stored in, for target table `name`: `name` itself, or its per-shard
    /// table.
    pub fn local(&self, name: &str) -> String {
        if self.distributed {
            format!("{name}{}", self.local_suffix)
        } else {
            name.to_string()
        }
    }

    /// The Distributed table `name` over `local` in `database`, sharded by the shard column,
    /// or (without one) by `cityHash64` of `key` (quoted column names), or of `keyless` (the
    /// columns that tell a keyless table's records apart: the same record, replayed, goes to
    /// the same shard).
    pub fn distributed_sql(
        &self,
        database: &str,
        name: &str,
        local: &str,
        key: &[String],
        keyless: &[String],
    ) -> String {
        let sharding = if !self.shard_column.is_empty() {
            ident(&self.shard_column)
        } else if key.is_empty() {
            format!("cityHash64({})", keyless.join(", "))
        } else {
            format!("cityHash64({})", key.join(", "))
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.{t}{on} AS {db}.{l} ENGINE = Distributed({c}, {dbs}, {ls}, {sharding})",
            db = ident(database),
            t = ident(name),
            on = self.on(),
            l = ident(local),
            c = ident(&self.name),
            dbs = ident(database),
            ls = ident(local),
        )
    }
}

/// A row's shard hash: FNV-1a 64 of `key` (the row's key columns in key order, each as
/// ClickHouse's RowBinary of its target column; for a table without a key, its version and its
/// index in the transaction as two little-endian u64), finished by MurmurHash3's 64-bit mixer
/// so that the low bits, which the modulo reads, depend on every byte.
pub fn shard_hash(key: &[u8]) -> u64 {
    let mut h = sluice_proto::fnv1a(sluice_proto::FNV_START, key);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Which shard a sharding value goes to, as a Distributed table decides it: each shard owns as
/// many slots as its weight, in the order of `remote_servers`; value `v` goes to the owner of
/// slot `v % total weight`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slots(Vec<usize>);

impl Slots {
    /// From the shards' weights in shard order; `None` if they add up to 0.
    pub fn from_weights(weights: &[u32]) -> Option<Self> {
        let mut slots = Vec::new();
        for (i, w) in weights.iter().enumerate() {
            slots.extend(std::iter::repeat_n(i, *w as usize));
        }
        (!slots.is_empty()).then_some(Self(slots))
    }

    /// The shard (0-based, in `remote_servers` order) of sharding value `v`.
    pub fn shard(&self, v: u64) -> usize {
        self.0[(v % self.0.len() as u64) as usize]
    }
}

/// The arguments of an engine clause `Name(a, 'b', f(c, d)) ...`, split at its top-level
/// commas, quotes and backquotes taken off: `["a", "b", "f(c, d)"]`. Empty without arguments.
pub fn engine_args(engine: &str) -> Vec<String> {
    let Some(open) = engine.find('(') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut quoted: Option<char> = None;
    let mut escaped = false;
    let mut cur = String::new();
    for c in engine[open + 1..].chars() {
        if escaped {
            escaped = false;
            cur.push(c);
            continue;
        }
        match (quoted, c) {
            (Some(_), '\\') => {
                escaped = true;
                cur.push(c);
            }
            (Some(q), c) if c == q => {
                quoted = None;
                cur.push(c);
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '`' | '"') => {
                quoted = Some(c);
                cur.push(c);
            }
            (None, '(') => {
                depth += 1;
                cur.push(c);
            }
            (None, ')') if depth == 0 => break,
            (None, ')') => {
                depth -= 1;
                cur.push(c);
            }
            (None, ',') if depth == 0 => out.push(std::mem::take(&mut cur)),
            (None, c) => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|a| {
            let a = a.trim();
            let unq = a
                .strip_prefix('\'')
                .and_then(|x| x.strip_suffix('\''))
                .or_else(|| a.strip_prefix('`').and_then(|x| x.strip_suffix('`')))
                .or_else(|| a.strip_prefix('"').and_then(|x| x.strip_suffix('"')));
            unq.unwrap_or(a).to_string()
        })
        .filter(|a| !a.is_empty())
        .collect()
}

/// `expr` without the parentheses around the whole of it, if any (`(a, b)` -> `a, b`;
/// `f(a)` and `(a) + (b)` stay as they are): an ORDER BY list to join with more columns.
pub fn unwrap_parens(expr: &str) -> &str {
    let e = expr.trim();
    if !e.starts_with('(') {
        return e;
    }
    // Where the first parenthesis closes (outside string literals).
    let mut depth = 0usize;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in e.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return if i == e.len() - 1 { e[1..i].trim() } else { e };
                }
            }
            _ => {}
        }
    }
    e
}

/// The names of columns an SQL expression refers to: its identifiers (bare or in backquotes),
/// without function names (an identifier followed by `(`) and string literals.
pub fn identifiers(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\'' {
            // A string literal: skip it (with its escapes).
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == b'`' {
            let start = i + 1;
            i = start;
            while i < b.len() && b[i] != b'`' {
                i += 1;
            }
            out.push(expr[start..i.min(b.len())].to_string());
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let mut j = i;
            while j < b.len() && b[j] == b' ' {
                j += 1;
            }
            if j >= b.len() || b[j] != b'(' {
                out.push(expr[start..i].to_string());
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterConfig {
        ClusterConfig {
            name: "c1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn engines_on_one_server_and_on_a_cluster() {
        let one = ClusterConfig::default();
        assert_eq!(one.on(), "");
        assert_eq!(
            one.engine("ReplacingMergeTree", "`_version`", false),
            "ReplacingMergeTree(`_version`)"
        );
        assert_eq!(one.engine("MergeTree", "", true), "MergeTree");
        assert_eq!(one.local("t"), "t");
        let c = cluster();
        assert_eq!(c.on(), " ON CLUSTER `c1`");
        assert_eq!(
            c.engine("ReplacingMergeTree", "`_version`, `_deleted`", false),
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', \
             '{replica}', `_version`, `_deleted`)"
        );
        assert_eq!(
            c.engine("MergeTree", "", true),
            "ReplicatedMergeTree('/clickhouse/tables/sluice/{database}/{table}', '{replica}')"
        );
        let d = ClusterConfig {
            distributed: true,
            ..cluster()
        };
        assert_eq!(d.local("t"), "t_local");
        let key = ["`a`".to_string(), "`b`".to_string()];
        let keyless = ["`_version`".to_string(), "`_row`".to_string()];
        assert_eq!(
            d.distributed_sql("db", "t", "t_local", &key, &keyless),
            "CREATE TABLE IF NOT EXISTS `db`.`t` ON CLUSTER `c1` AS `db`.`t_local` \
             ENGINE = Distributed(`c1`, `db`, `t_local`, `_shard`)"
        );
        let old = ClusterConfig {
            shard_column: String::new(),
            ..d.clone()
        };
        assert!(old
            .distributed_sql("db", "t", "t_local", &key, &keyless)
            .ends_with("cityHash64(`a`, `b`))"));
        // A keyless table's record, replayed, goes where it went: never rand().
        assert!(old
            .distributed_sql("db", "t", "t_local", &[], &keyless)
            .ends_with("cityHash64(`_version`, `_row`))"));
    }

    #[test]
    fn shards_are_picked_as_a_distributed_table_picks_them() {
        // Weights 1, 2: slots [0, 1, 1].
        let s = Slots::from_weights(&[1, 2]).unwrap();
        assert_eq!(
            (0..6).map(|v| s.shard(v)).collect::<Vec<_>>(),
            [0, 1, 1, 0, 1, 1]
        );
        // A shard of weight 0 gets nothing; values past i64::MAX too (taken unsigned).
        let s = Slots::from_weights(&[0, 1, 1]).unwrap();
        assert_eq!(s.shard(u64::MAX), 1 + (u64::MAX % 2) as usize);
        assert!((0..100).all(|v| s.shard(v) != 0));
        assert_eq!(Slots::from_weights(&[0, 0]), None);
        // The hash is pinned: changing it moves rows already written to another shard.
        assert_eq!(shard_hash(&1i32.to_le_bytes()), 0xdc07_7c17_952d_9c36);
        // Both shards get rows of consecutive keys.
        let s = Slots::from_weights(&[1, 1]).unwrap();
        let first: usize = (0i32..1000)
            .filter(|k| s.shard(shard_hash(&k.to_le_bytes())) == 0)
            .count();
        assert!((400..600).contains(&first), "{first} of 1000 on shard 1");
    }

    #[test]
    fn an_engines_arguments() {
        assert_eq!(
            engine_args("Distributed('c1', 'db', 't_local', _shard)"),
            ["c1", "db", "t_local", "_shard"]
        );
        assert_eq!(
            engine_args("Distributed(`c1`, `db`, `t_local`, cityHash64(`a`, `b`)) SETTINGS x = 1"),
            ["c1", "db", "t_local", "cityHash64(`a`, `b`)"]
        );
        assert_eq!(
            engine_args("Distributed('c,1', 'd\\'b', t)"),
            ["c,1", "d\\'b", "t"]
        );
        assert!(engine_args("Memory").is_empty());
    }

    #[test]
    fn bad_cluster_settings_are_named() {
        let e = ClusterConfig {
            distributed: true,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.0, "cluster.distributed");
        let e = ClusterConfig {
            zookeeper_path: "/a'b".into(),
            ..cluster()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.0, "cluster.zookeeper_path");
        let e = ClusterConfig {
            distributed: true,
            meta_zookeeper_path: "/x/{shard}/{table}".into(),
            ..cluster()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.0, "cluster.meta_zookeeper_path");
        assert!(cluster().validate().is_ok());
        let shards = ClusterConfig {
            distributed: true,
            write: WriteTo::Shards,
            shards: vec![vec!["http://a:8123".into()], vec!["http://b:8123".into()]],
            ..cluster()
        };
        assert!(shards.validate().is_ok());
        for (bad, key) in [
            (
                ClusterConfig {
                    distributed: false,
                    ..shards.clone()
                },
                "cluster.write",
            ),
            (
                ClusterConfig {
                    shards: vec![],
                    ..shards.clone()
                },
                "cluster.shards",
            ),
            (
                ClusterConfig {
                    shards: vec![vec!["http://a:8123".into()], vec![]],
                    ..shards.clone()
                },
                "cluster.shards[1]",
            ),
            (
                ClusterConfig {
                    shards: vec![vec!["a:8123".into()]],
                    ..shards.clone()
                },
                "cluster.shards[0]",
            ),
            (
                ClusterConfig {
                    shard_column: String::new(),
                    ..shards.clone()
                },
                "cluster.shard_column",
            ),
            (
                ClusterConfig {
                    write: WriteTo::Distributed,
                    ..shards.clone()
                },
                "cluster.shards",
            ),
        ] {
            assert_eq!(bad.validate().unwrap_err().0, key, "{bad:?}");
        }
    }

    #[test]
    fn only_parentheses_around_the_whole_expression_go() {
        assert_eq!(
            unwrap_parens(" (intDiv(id, 100), id) "),
            "intDiv(id, 100), id"
        );
        assert_eq!(unwrap_parens("cityHash64(id)"), "cityHash64(id)");
        assert_eq!(unwrap_parens("(a) + (b)"), "(a) + (b)");
        assert_eq!(unwrap_parens("(tenant, ')', id)"), "tenant, ')', id");
        assert_eq!(unwrap_parens("id"), "id");
    }

    #[test]
    fn the_columns_an_expression_names() {
        assert_eq!(identifiers("toYYYYMM(created_at)"), ["created_at"]);
        assert_eq!(
            identifiers("(id, `order id`, intHash32(user) % 8, 'lit_x', 3.5e2)"),
            ["id", "order id", "user"]
        );
        assert_eq!(identifiers("tuple()"), Vec::<String>::new());
    }
}
