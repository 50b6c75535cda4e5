//! Configuration loading shared by every binary.
//!
//! A binary's configuration is one TOML file (`--config FILE`) deserialized into the binary's
//! own struct, whose sections all refuse unknown keys. Before deserializing, environment
//! variables override single keys: `SLUICE__SECTION__KEY=value` sets `[section] key`; the
//! value is read as a TOML value (`true`, `5000`, `["a","b"]`) and, when it does not parse as
//! one, as a plain string. Errors name the file, the key and the reason.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// The prefix of environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "SLUICE__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config {origin}: key `{key}`: {message}")]
    Key {
        origin: String,
        key: String,
        message: String,
    },
    #[error("config {origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

/// Load a configuration: the file (if any) with environment overrides, then `validate`.
///
/// Without a file every key takes its default; keys without defaults must then come from the
/// environment.
pub fn load<T: DeserializeOwned + Validate>(path: Option<&Path>) -> Result<T, ConfigError> {
    load_with_env(path, std::env::vars())
}

/// [`load`] for a tool that reads the configs of several stages under one environment (`sluice
/// verify`, `sluice status`): an override of a section this config does not have (say
/// `SLUICE__CLICKHOUSE__URL` while reading capture-mysql's) belongs to another stage's and is
/// left to it. Returns the config and the sections it left; the tool checks with
/// [`left_to_none`] that each was taken by one of the configs.
pub fn load_own<T: DeserializeOwned + Validate>(
    path: Option<&Path>,
) -> Result<(T, std::collections::BTreeSet<String>), ConfigError> {
    load_own_with_env(path, std::env::vars().collect())
}

fn load_own_with_env<T: DeserializeOwned + Validate>(
    path: Option<&Path>,
    env: Vec<(String, String)>,
) -> Result<(T, std::collections::BTreeSet<String>), ConfigError> {
    let section = |var: &str| {
        var.strip_prefix(ENV_PREFIX)
            .and_then(|rest| rest.split("__").next())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let mut left = std::collections::BTreeSet::new();
    loop {
        let vars = env
            .iter()
            .filter(|(k, _)| !k.starts_with(ENV_PREFIX) || !left.contains(&section(k)))
            .cloned();
        match load_with_env::<T>(path, vars) {
            Err(ConfigError::Key {
                origin,
                key,
                message,
            }) if !key.contains('.')
                && message.contains("unknown field")
                && origin.starts_with("environment variable")
                && !left.contains(&key) =>
            {
                let _ = origin;
                left.insert(key);
            }
            other => return other.map(|c| (c, left)),
        }
    }
}

/// The sections every config left to another ([`load_own`]): overrides none of them takes, as
/// `SLUICE__SECTION__KEY` names, for the error that says so.
pub fn left_to_none(left: &[&std::collections::BTreeSet<String>]) -> Option<String> {
    let (first, rest) = left.split_first()?;
    let none: Vec<String> = first
        .iter()
        .filter(|s| rest.iter().all(|o| o.contains(*s)))
        .map(|s| format!("{ENV_PREFIX}{}__*", s.to_ascii_uppercase()))
        .collect();
    (!none.is_empty()).then(|| {
        format!(
            "environment variables {}: no config given has that section",
            none.join(", ")
        )
    })
}

/// [`load`] with an explicit environment (for tests).
pub fn load_with_env<T: DeserializeOwned + Validate>(
    path: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let origin = match path {
        Some(p) => format!("file {}", p.display()),
        None => "(defaults)".to_string(),
    };
    let mut table = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })?;
            text.parse::<toml::Table>()
                .map_err(|e| ConfigError::Syntax {
                    path: p.to_path_buf(),
                    message: without_source_lines(&e.to_string()),
                })?
        }
        None => toml::Table::new(),
    };
    let from_env = apply_env(&mut table, env)?;
    // A bad value set by an environment variable is reported as coming from it.
    let origin_of = |key: &str| -> String {
        from_env
            .iter()
            .find(|(k, _)| {
                // The key itself, a key inside it, or the section it made.
                let k = k.strip_suffix(FILE_SUFFIX).unwrap_or(k);
                key == k || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}."))
            })
            .map(|(_, var)| format!("environment variable {var} (over {origin})"))
            .unwrap_or_else(|| origin.clone())
    };
    read_files(&mut table, "", &origin)?;
    let value = toml::Value::Table(table);
    let config: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let key = e.path().to_string();
        let mut message = one_line(&e.into_inner().to_string());
        if crate::secret::is_secret_name(&key) {
            // (the message may quote the value)
            message = "not a valid value (the value is a secret: not shown)".into();
        }
        if key == "." || key.is_empty() {
            ConfigError::Invalid {
                origin: origin.clone(),
                message,
            }
        } else {
            ConfigError::Key {
                origin: origin_of(&key),
                key,
                message,
            }
        }
    })?;
    config
        .validate()
        .map_err(|(key, message)| ConfigError::Key {
            origin: origin_of(&key),
            key,
            message,
        })?;
    Ok(config)
}

/// Checks beyond types: ranges, formats, combinations. Returns the key and the reason.
pub trait Validate {
    fn validate(&self) -> Result<(), (String, String)> {
        Ok(())
    }
}

/// Set the keys the environment overrides; returns each key set (dotted) with its variable.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut set = Vec::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect();
    vars.sort();
    for (var, raw) in vars {
        let path: Vec<String> = var[ENV_PREFIX.len()..]
            .split("__")
            .map(|p| p.to_ascii_lowercase())
            .collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::Env {
                var,
                message: "expected SLUICE__SECTION__KEY (double underscores between parts)".into(),
            });
        }
        let value = parse_env_value(&raw);
        let mut node = &mut *table;
        for part in &path[..path.len() - 1] {
            let entry = node
                .entry(part.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            node = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Env {
                        var,
                        message: format!("`{part}` is a value in the config, not a section"),
                    })
                }
            };
        }
        node.insert(path[path.len() - 1].clone(), value);
        set.push((path.join("."), var));
    }
    Ok(set)
}

/// The suffix of a key whose value is read from a file: `password_file = "/run/secrets/pw"`
/// sets `password` to the file's content (one trailing newline dropped), as Kubernetes and
/// Docker mount secrets. Any key takes it, in any section (`[kafka.properties]`
/// `"sasl.password_file"` too), from the file or the environment
/// (`SLUICE__MYSQL__PASSWORD_FILE`).
pub const FILE_SUFFIX: &str = "_file";

fn read_files(table: &mut toml::Table, at: &str, origin: &str) -> Result<(), ConfigError> {
    let keys: Vec<String> = table.keys().cloned().collect();
    for key in keys {
        let path = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        if let Some(toml::Value::Table(t)) = table.get_mut(&key) {
            read_files(t, &path, origin)?;
            continue;
        }
        let Some(target) = key.strip_suffix(FILE_SUFFIX).filter(|t| !t.is_empty()) else {
            continue;
        };
        let err = |message: String| ConfigError::Key {
            origin: origin.to_string(),
            key: path.clone(),
            message,
        };
        let file = match table.get(&key) {
            Some(toml::Value::String(f)) => f.clone(),
            _ => return Err(err("expected the path of a file (a string)".into())),
        };
        if table
            .get(target)
            .is_some_and(|v| v.as_str().is_none_or(|s| !s.is_empty()))
        {
            return Err(err(format!(
                "`{target}` is set too: give the value or the file that holds it, not both"
            )));
        }
        let mut text =
            std::fs::read_to_string(&file).map_err(|e| err(format!("cannot read {file}: {e}")))?;
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        table.remove(&key);
        table.insert(target.to_string(), toml::Value::String(text));
    }
    Ok(())
}

/// A TOML error without the lines of the file it quotes (one may hold a password).
fn without_source_lines(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('|')
                && !l
                    .split_once(" |")
                    .is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
        })
        .collect::<Vec<_>>()
        .join(": ")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn parse_env_value(raw: &str) -> toml::Value {
    // Parse "x = <raw>" so that numbers, booleans, arrays and quoted strings keep their type.
    match format!("x = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("x")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        #[serde(default)]
        kafka: Kafka,
        #[serde(default)]
        batch: Batch,
    }
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Kafka {
        brokers: String,
        linger_ms: u64,
    }
    impl Default for Kafka {
        fn default() -> Self {
            Self {
                brokers: "127.0.0.1:9092".into(),
                linger_ms: 5,
            }
        }
    }
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Batch {
        max_rows: u32,
    }
    impl Default for Batch {
        fn default() -> Self {
            Self { max_rows: 1000 }
        }
    }
    impl Validate for Cfg {
        fn validate(&self) -> Result<(), (String, String)> {
            if self.batch.max_rows == 0 {
                return Err(("batch.max_rows".into(), "must be at least 1".into()));
            }
            Ok(())
        }
    }

    #[test]
    fn a_tool_reading_several_configs_leaves_each_the_overrides_of_its_own_sections() {
        let f = file("[kafka]\nbrokers = \"k:1\"\n");
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let (c, left) = load_own_with_env::<Cfg>(
            Some(f.path()),
            env(&[
                ("SLUICE__CLICKHOUSE__URL", "http://x"),
                ("SLUICE__BATCH__MAX_ROWS", "7"),
                ("SLUICE__MYSQL__URL", "mysql://y"),
            ]),
        )
        .unwrap();
        assert_eq!(c.batch.max_rows, 7);
        assert_eq!(
            left.iter().map(String::as_str).collect::<Vec<_>>(),
            ["clickhouse", "mysql"]
        );
        // A key this config's section does not have is still an error.
        let e = load_own_with_env::<Cfg>(Some(f.path()), env(&[("SLUICE__KAFKA__BROKER", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLUICE__KAFKA__BROKER"), "{e}");
        // A section no config takes is named.
        let other: std::collections::BTreeSet<String> = ["mysql".to_string()].into();
        assert_eq!(
            left_to_none(&[&left, &other]).as_deref(),
            Some("environment variables SLUICE__MYSQL__*: no config given has that section")
        );
        let took_all: std::collections::BTreeSet<String> = Default::default();
        assert_eq!(left_to_none(&[&left, &took_all]), None);
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn load_text(text: &str, env: &[(&str, &str)]) -> Result<Cfg, ConfigError> {
        let f = file(text);
        load_with_env(
            Some(f.path()),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable() {
        let e = load_text(
            "[kafka]\nbrokers = \"k:1\"\n",
            &[("SLUICE__KAFKA__LINGER_MS", "soon")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("environment variable SLUICE__KAFKA__LINGER_MS (over file ")
                && e.contains("key `kafka.linger_ms`"),
            "{e}"
        );
        let e = load_text("", &[("SLUICE__BATCH__MAX_ROWS", "0")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("environment variable SLUICE__BATCH__MAX_ROWS")
                && e.contains("must be at least 1"),
            "{e}"
        );
        // A section the binary does not have, made by a variable.
        let e = load_text("", &[("SLUICE__CLICKHOUSE__URL", "http://x")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("environment variable SLUICE__CLICKHOUSE__URL")
                && e.contains("`clickhouse`"),
            "{e}"
        );
        // A bad value of the file itself names the file only.
        let e = load_text(
            "[batch]\nmax_rows = 0\n",
            &[("SLUICE__KAFKA__BROKERS", "x:1")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("config file ") && !e.contains("environment"),
            "{e}"
        );
    }

    #[test]
    fn defaults_and_values() {
        let c = load_text("[kafka]\nbrokers = \"k:1\"\n", &[]).unwrap();
        assert_eq!(c.kafka.brokers, "k:1");
        assert_eq!(c.kafka.linger_ms, 5);
        assert_eq!(c.batch.max_rows, 1000);
        let c: Cfg = load_with_env(None, Vec::new()).unwrap();
        assert_eq!(c.kafka.brokers, "127.0.0.1:9092");
    }

    #[test]
    fn unknown_key_is_named() {
        let e = load_text("[kafka]\nlinger = 5\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `kafka.linger`"), "{e}");
        assert!(e.contains("unknown field `linger`"), "{e}");
        let e = load_text("[kafak]\n", &[]).unwrap_err().to_string();
        assert!(e.contains("unknown field `kafak`"), "{e}");
    }

    #[test]
    fn bad_value_is_named() {
        let e = load_text("[kafka]\nlinger_ms = \"soon\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `kafka.linger_ms`"), "{e}");
        assert!(e.contains("expected u64"), "{e}");
        let e = load_text("[batch]\nmax_rows = 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `batch.max_rows`: must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn syntax_error_names_the_file() {
        let f = file("[kafka\n");
        let e = load_with_env::<Cfg>(Some(f.path()), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&f.path().display().to_string()), "{e}");
        assert!(e.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn a_key_is_read_from_the_file_its_file_key_names() {
        let dir = std::env::temp_dir().join(format!("sluice-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("brokers");
        std::fs::write(&f, "from-file:9092\n").unwrap();
        let text = format!("[kafka]\nbrokers_file = {:?}\n", f.display().to_string());
        let c = load_text(&text, &[]).unwrap();
        assert_eq!(
            c.kafka.brokers, "from-file:9092",
            "one trailing newline dropped"
        );
        // From the environment too.
        let c = load_text("", &[("SLUICE__KAFKA__BROKERS_FILE", f.to_str().unwrap())]).unwrap();
        assert_eq!(c.kafka.brokers, "from-file:9092");
        // Both: refused, naming the key.
        let both = format!(
            "[kafka]\nbrokers = \"x\"\nbrokers_file = {:?}\n",
            f.display().to_string()
        );
        let e = load_text(&both, &[]).unwrap_err().to_string();
        assert!(
            e.contains("kafka.brokers_file") && e.contains("not both"),
            "{e}"
        );
        // A missing file: named, and nothing else read.
        let e = load_text("[kafka]\nbrokers_file = \"/nonexistent/pw\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kafka.brokers_file") && e.contains("/nonexistent/pw"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_syntax_error_does_not_quote_the_file() {
        let dir = std::env::temp_dir().join(format!("sluice-config-syntax-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "[kafka]\nbrokers = \"hunter2\nlinger_ms = 1\n").unwrap();
        let e = load::<Cfg>(Some(&f)).unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("line 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn env_overrides_keys() {
        let c = load_text(
            "[kafka]\nbrokers = \"k:1\"\n",
            &[
                ("SLUICE__KAFKA__BROKERS", "a:1,b:2"),
                ("SLUICE__KAFKA__LINGER_MS", "50"),
                ("SLUICE__BATCH__MAX_ROWS", "7"),
                ("OTHER", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "a:1,b:2");
        assert_eq!(c.kafka.linger_ms, 50);
        assert_eq!(c.batch.max_rows, 7);
    }

    #[test]
    fn bad_env_override_is_named() {
        let e = load_text("", &[("SLUICE__KAFKA__LINGER_MS", "soon")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("kafka.linger_ms"), "{e}");
        let e = load_text("", &[("SLUICE__KAFKA____X", "1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLUICE__KAFKA____X"), "{e}");
        let e = load_text(
            "[kafka]\nbrokers = \"k\"\n",
            &[("SLUICE__KAFKA__BROKERS__X", "1")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a section"), "{e}");
    }

    #[test]
    fn missing_file_is_named() {
        let e = load_with_env::<Cfg>(Some(Path::new("/nonexistent/x.toml")), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/x.toml"), "{e}");
    }
}
