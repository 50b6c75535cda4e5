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

use serde::{Deserialize, Serialize};

use super::sink::quote;

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
        Ok(())
    }

    pub fn enabled(&self) -> bool {
        !self.name.is_empty()
    }

    /// ` ON CLUSTER name`, or nothing.
    pub fn on(&self) -> String {
        if self.enabled() {
            format!(" ON CLUSTER {}", quote(&self.name))
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

    /// The Distributed table `name` over `local` in `database`, sharded by `key` (quoted
    /// column names; none: at random, for tables without a key).
    pub fn distributed_sql(
        &self,
        database: &str,
        name: &str,
        local: &str,
        key: &[String],
    ) -> String {
        let sharding = if key.is_empty() {
            "rand()".to_string()
        } else {
            format!("cityHash64({})", key.join(", "))
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.{t}{on} AS {db}.{l} ENGINE = Distributed({c}, {dbs}, {ls}, {sharding})",
            db = quote(database),
            t = quote(name),
            on = self.on(),
            l = quote(local),
            c = quote(&self.name),
            dbs = quote(database),
            ls = quote(local),
        )
    }
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
        assert_eq!(
            d.distributed_sql("db", "t", "t_local", &["`a`".into(), "`b`".into()]),
            "CREATE TABLE IF NOT EXISTS `db`.`t` ON CLUSTER `c1` AS `db`.`t_local` \
             ENGINE = Distributed(`c1`, `db`, `t_local`, cityHash64(`a`, `b`))"
        );
        assert!(d
            .distributed_sql("db", "t", "t_local", &[])
            .ends_with("rand())"));
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
