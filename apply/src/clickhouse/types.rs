//! ClickHouse column types as the apply stage knows them, and the mapping from source columns
//! to the types of the tables it creates.
//!
//! [`ChType::parse`] reads a type as `system.columns` shows it (the target decides how a value
//! is encoded, see [`super::rowbinary`]); [`map_column`] picks the type of a new column, using
//! what the server offers ([`Features`], from its version).

use sluice_proto::v1::{Column, ColumnType};

/// A ClickHouse type, as far as the apply stage writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChType {
    Int(u8),  // bits
    UInt(u8), // bits
    Float32,
    Float64,
    Decimal { precision: u8, scale: u8 },
    String,
    FixedString(usize),
    Date,
    DateTime,
    DateTime64(u8),
    Enum(Vec<(String, i16)>, u8), // members, storage bits
    Nullable(Box<ChType>),
}

impl ChType {
    /// Parse a type as `system.columns.type` shows it.
    pub fn parse(t: &str) -> Result<ChType, String> {
        let t = t.trim();
        let inner = |prefix: &str| {
            t.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(')'))
                .map(str::trim)
        };
        if let Some(i) = inner("Nullable(") {
            return Ok(ChType::Nullable(Box::new(ChType::parse(i)?)));
        }
        if let Some(i) = inner("LowCardinality(") {
            return ChType::parse(i); // same RowBinary as the inner type
        }
        if let Some(i) = inner("FixedString(") {
            return i
                .parse()
                .map(ChType::FixedString)
                .map_err(|_| format!("bad type {t}"));
        }
        if let Some(i) = inner("Decimal(") {
            let (p, s) = i.split_once(',').ok_or_else(|| format!("bad type {t}"))?;
            return Ok(ChType::Decimal {
                precision: p.trim().parse().map_err(|_| format!("bad type {t}"))?,
                scale: s.trim().parse().map_err(|_| format!("bad type {t}"))?,
            });
        }
        for (prefix, precision) in [("Decimal32(", 9), ("Decimal64(", 18), ("Decimal128(", 38)] {
            if let Some(i) = inner(prefix) {
                return Ok(ChType::Decimal {
                    precision,
                    scale: i.parse().map_err(|_| format!("bad type {t}"))?,
                });
            }
        }
        if let Some(i) = inner("DateTime64(") {
            let p = i.split(',').next().unwrap_or("3").trim();
            return Ok(ChType::DateTime64(
                p.parse().map_err(|_| format!("bad type {t}"))?,
            ));
        }
        if t == "DateTime" || t.starts_with("DateTime(") {
            return Ok(ChType::DateTime);
        }
        for (prefix, bits) in [("Enum8(", 8), ("Enum16(", 16)] {
            if let Some(i) = inner(prefix) {
                return Ok(ChType::Enum(parse_enum(i)?, bits));
            }
        }
        Ok(match t {
            "Int8" => ChType::Int(8),
            "Int16" => ChType::Int(16),
            "Int32" => ChType::Int(32),
            "Int64" => ChType::Int(64),
            "UInt8" | "Bool" => ChType::UInt(8),
            "UInt16" => ChType::UInt(16),
            "UInt32" => ChType::UInt(32),
            "UInt64" => ChType::UInt(64),
            "Float32" => ChType::Float32,
            "Float64" => ChType::Float64,
            "String" => ChType::String,
            "Date" => ChType::Date,
            other => return Err(format!("column type {other} is not supported as a target")),
        })
    }

    /// The type as DDL text.
    pub fn sql(&self) -> String {
        match self {
            ChType::Int(b) => format!("Int{b}"),
            ChType::UInt(b) => format!("UInt{b}"),
            ChType::Float32 => "Float32".into(),
            ChType::Float64 => "Float64".into(),
            ChType::Decimal { precision, scale } => format!("Decimal({precision}, {scale})"),
            ChType::String => "String".into(),
            ChType::FixedString(n) => format!("FixedString({n})"),
            ChType::Date => "Date".into(),
            ChType::DateTime => "DateTime('UTC')".into(),
            ChType::DateTime64(p) => format!("DateTime64({p}, 'UTC')"),
            ChType::Enum(members, bits) => format!(
                "Enum{bits}({})",
                members
                    .iter()
                    .map(|(m, v)| format!("'{}' = {v}", m.replace('\'', "\\'")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ChType::Nullable(t) => format!("Nullable({})", t.sql()),
        }
    }
}

impl ChType {
    /// Whether every value of `self` is also a value of `wider`, unchanged: the target column
    /// may go from one to the other (`MODIFY COLUMN`) without losing or altering a value, and a
    /// column of type `wider` holds whatever a `self` column holds.
    pub fn widens_to(&self, wider: &ChType) -> bool {
        use ChType as T;
        match (self, wider) {
            (a, b) if a == b => true,
            (T::Nullable(a), T::Nullable(b)) => a.widens_to(b),
            (a, T::Nullable(b)) => a.widens_to(b),
            (T::Int(a), T::Int(b)) | (T::UInt(a), T::UInt(b)) => b >= a,
            (T::UInt(a), T::Int(b)) => b > a,
            // Every 32-bit integer is an exact Float64; 64-bit ones are not.
            (T::Int(a) | T::UInt(a), T::Float64) => *a <= 32,
            (T::Float32, T::Float64) => true,
            (
                T::Decimal {
                    precision: p1,
                    scale: s1,
                },
                T::Decimal {
                    precision: p2,
                    scale: s2,
                },
            ) => s2 >= s1 && i16::from(*p2) - i16::from(*s2) >= i16::from(*p1) - i16::from(*s1),
            (T::DateTime, T::DateTime64(_)) => true,
            (T::DateTime64(a), T::DateTime64(b)) => b >= a,
            _ => false,
        }
    }
}

fn parse_enum(body: &str) -> Result<Vec<(String, i16)>, String> {
    // 'a' = 1, 'b''c' = 2
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        rest = rest.strip_prefix('\'').ok_or("bad Enum")?;
        let mut name = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => {
                    if let Some((_, c)) = chars.next() {
                        name.push(c);
                    }
                }
                Some((i, '\'')) => break i,
                Some((_, c)) => name.push(c),
                None => return Err("bad Enum".into()),
            }
        };
        rest = rest[end + 1..].trim_start();
        rest = rest.strip_prefix('=').ok_or("bad Enum")?.trim_start();
        let num_end = rest.find(',').unwrap_or(rest.len());
        let v: i16 = rest[..num_end].trim().parse().map_err(|_| "bad Enum")?;
        out.push((name, v));
        rest = rest[num_end..].trim_start_matches(',').trim_start();
    }
    Ok(out)
}

/// What the server offers: the features newer than 18.16 the mapping may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// DateTime64 (20.1+).
    pub datetime64: bool,
    /// `insert_deduplication_token` (22.2+); the tables the stage creates then keep a window
    /// of recent inserts (`non_replicated_deduplication_window`), without which a
    /// non-replicated table ignores the token.
    pub dedup_token: bool,
    /// `ReplacingMergeTree(version, is_deleted)` (23.2+): `FINAL` alone hides deleted rows.
    pub is_deleted: bool,
    /// The `async_insert` setting (21.11+; on by default from 26.2): the stage turns it off
    /// for its INSERTs, which are batches already and must be acknowledged when written.
    pub async_insert: bool,
    /// Servers before 20.1 answer both "the column exists" and "no such column" with
    /// ILLEGAL_COLUMN (44), a code current servers give other refusals too.
    pub illegal_column_means_done: bool,
    /// `ALTER TABLE ... RENAME COLUMN` (20.4+).
    pub rename_column: bool,
}

impl Features {
    pub fn of_version(version: &str) -> Self {
        let mut parts = version.split('.').filter_map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Self {
            datetime64: (major, minor) >= (20, 1),
            dedup_token: (major, minor) >= (22, 2),
            is_deleted: (major, minor) >= (23, 2),
            async_insert: (major, minor) >= (21, 11),
            illegal_column_means_done: (major, minor) < (20, 1),
            rename_column: (major, minor) >= (20, 4),
        }
    }
}

/// Recent inserts a created table remembers for `insert_deduplication_token`: as many as
/// ReplicatedMergeTree's default window, far more than the batches a crash can replay.
pub const DEDUP_WINDOW: u32 = 1000;

/// The ClickHouse type a source column gets in tables the apply stage creates.
pub fn map_column(c: &Column, f: Features) -> ChType {
    use ColumnType as T;
    let base = match c.r#type() {
        T::Tinyint => int(8, c.unsigned),
        T::Smallint => int(16, c.unsigned),
        T::Mediumint | T::Int => int(32, c.unsigned),
        T::Bigint => int(64, c.unsigned),
        // ClickHouse decimals hold 38 digits: wider ones travel as exact text.
        T::Decimal if c.length <= 38 => ChType::Decimal {
            precision: c.length.max(1) as u8,
            scale: c.scale as u8,
        },
        T::Decimal => ChType::String,
        T::Float => ChType::Float32,
        T::Double => ChType::Float64,
        T::Bit => ChType::UInt(64),
        T::Year => ChType::UInt(16),
        T::Date => ChType::Date,
        // Fractional seconds are kept: DateTime64 where the server has it, exact text otherwise.
        T::Datetime | T::Timestamp if c.fsp == 0 => ChType::DateTime,
        T::Datetime | T::Timestamp if f.datetime64 => ChType::DateTime64(c.fsp as u8),
        T::Datetime | T::Timestamp => ChType::String,
        // TIME spans -838..838 hours: text, as MySQL prints it.
        T::Time => ChType::String,
        _ => ChType::String,
    };
    if c.nullable {
        ChType::Nullable(Box::new(base))
    } else {
        base
    }
}

fn int(bits: u8, unsigned: bool) -> ChType {
    if unsigned {
        ChType::UInt(bits)
    } else {
        ChType::Int(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(ty: ColumnType) -> Column {
        Column {
            name: "c".into(),
            r#type: ty as i32,
            ..Default::default()
        }
    }

    #[test]
    fn types_parse_and_print() {
        for t in [
            "Int8",
            "UInt64",
            "Nullable(Decimal(65, 30))",
            "String",
            "FixedString(16)",
            "Date",
            "DateTime('UTC')",
            "DateTime64(6, 'UTC')",
        ] {
            let parsed = ChType::parse(t).unwrap();
            assert_eq!(ChType::parse(&parsed.sql()).unwrap(), parsed, "{t}");
        }
        assert_eq!(
            ChType::parse("Enum8('a' = 1, 'b\\'c' = 2)").unwrap(),
            ChType::Enum(vec![("a".into(), 1), ("b'c".into(), 2)], 8)
        );
        assert_eq!(
            ChType::parse("Decimal64(4)").unwrap(),
            ChType::Decimal {
                precision: 18,
                scale: 4
            }
        );
        assert!(ChType::parse("Array(Int8)").is_err());
    }

    #[test]
    fn widening_keeps_every_value() {
        use ChType as T;
        let n = |t: ChType| T::Nullable(Box::new(t));
        assert!(T::Int(32).widens_to(&T::Int(64)));
        assert!(n(T::Int(32)).widens_to(&n(T::Int(64))));
        assert!(T::Int(32).widens_to(&n(T::Int(32))), "NOT NULL to NULL");
        assert!(!n(T::Int(32)).widens_to(&T::Int(64)), "NULL to NOT NULL");
        assert!(!T::Int(64).widens_to(&T::Int(32)));
        assert!(T::UInt(32).widens_to(&T::Int(64)) && !T::UInt(64).widens_to(&T::Int(64)));
        assert!(!T::Int(8).widens_to(&T::UInt(64)), "negative values");
        assert!(T::Int(32).widens_to(&T::Float64) && !T::Int(64).widens_to(&T::Float64));
        let d = |precision, scale| T::Decimal { precision, scale };
        assert!(d(10, 2).widens_to(&d(12, 2)) && d(10, 2).widens_to(&d(12, 4)));
        assert!(!d(10, 2).widens_to(&d(12, 1)) && !d(10, 2).widens_to(&d(10, 4)));
        assert!(
            T::DateTime.widens_to(&T::DateTime64(6))
                && !T::DateTime64(6).widens_to(&T::DateTime64(3))
        );
        assert!(!T::String.widens_to(&T::Int(64)) && !T::Date.widens_to(&T::DateTime));
        assert!(T::String.widens_to(&T::String));
    }

    #[test]
    fn features_follow_the_version() {
        let f = |v| Features::of_version(v);
        let old = f("18.16.1");
        assert!(!old.datetime64 && !old.dedup_token && !old.is_deleted);
        let mid = f("22.8.5.29");
        assert!(mid.datetime64 && mid.dedup_token && !mid.is_deleted);
        assert!(!f("22.1.3").dedup_token && f("22.2.1").dedup_token);
        assert!(!f("23.1.9").is_deleted && f("23.2.1").is_deleted);
        let now = f("26.9.2.1");
        assert!(now.datetime64 && now.dedup_token && now.is_deleted && now.async_insert);
        assert!(old.illegal_column_means_done && !now.illegal_column_means_done);
        assert!(!f("21.10.1").async_insert && f("21.11.2").async_insert);
        // A version that does not parse gets the oldest path, which every server takes.
        assert_eq!(
            f("unknown"),
            Features {
                illegal_column_means_done: true,
                ..Features::default()
            }
        );
    }

    #[test]
    fn mapping_follows_the_server() {
        let mut c = col(ColumnType::Timestamp);
        c.fsp = 6;
        assert_eq!(
            map_column(&c, Features::of_version("18.16.1")),
            ChType::String
        );
        assert_eq!(
            map_column(&c, Features::of_version("24.8.1.1")),
            ChType::DateTime64(6)
        );
        let mut d = col(ColumnType::Decimal);
        d.length = 65;
        d.scale = 30;
        assert_eq!(map_column(&d, Features::default()), ChType::String);
        d.length = 10;
        d.scale = 2;
        d.nullable = true;
        assert_eq!(
            map_column(&d, Features::default()),
            ChType::Nullable(Box::new(ChType::Decimal {
                precision: 10,
                scale: 2
            }))
        );
    }
}
