//! `[filter]`: which tables (MySQL) or collections (MongoDB) are captured, as regular
//! expressions matched against the whole `database.table` name.

use serde::{Deserialize, Serialize};

/// `[filter]` of a capture's config.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Capture only names (`database.table`) matching one of these; empty captures all.
    /// Default empty.
    pub include: Vec<String>,
    /// Leave out names matching one of these. Default empty.
    pub exclude: Vec<String>,
}

/// The compiled filter. Patterns are anchored: `shop\..*` matches every table of `shop`.
pub struct Filter {
    include: Vec<regex::Regex>,
    exclude: Vec<regex::Regex>,
    system: &'static [&'static str],
}

impl Filter {
    /// `system`: databases never captured, whatever the patterns say.
    pub fn new(
        config: &FilterConfig,
        system: &'static [&'static str],
    ) -> Result<Self, (String, String)> {
        let compile = |key: &str, pats: &[String]| {
            pats.iter()
                .map(|p| {
                    regex::Regex::new(&format!("^(?:{p})$"))
                        .map_err(|e| (format!("filter.{key}"), format!("{p:?}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            include: compile("include", &config.include)?,
            exclude: compile("exclude", &config.exclude)?,
            system,
        })
    }

    pub fn wants(&self, database: &str, table: &str) -> bool {
        if self.system.contains(&database) {
            return false;
        }
        let name = format!("{database}.{table}");
        (self.include.is_empty() || self.include.iter().any(|r| r.is_match(&name)))
            && !self.exclude.iter().any(|r| r.is_match(&name))
    }

    /// True when every collection of `database` may be wanted (a database-level event such as
    /// dropDatabase is then passed on).
    pub fn wants_database(&self, database: &str) -> bool {
        !self.system.contains(&database)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_patterns_and_system_databases() {
        let f = Filter::new(
            &FilterConfig {
                include: vec![r"shop\..*".into()],
                exclude: vec![r"shop\.tmp_.*".into()],
            },
            &["mysql"],
        )
        .unwrap();
        assert!(f.wants("shop", "orders"));
        assert!(!f.wants("shop", "tmp_x"));
        assert!(!f.wants("shopping", "orders"));
        assert!(!f.wants("mysql", "user"));
        let bad = Filter::new(
            &FilterConfig {
                include: vec!["(".into()],
                exclude: vec![],
            },
            &[],
        );
        assert_eq!(bad.err().unwrap().0, "filter.include");
    }
}
