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
    Decimal {
        precision: u8,
        scale: u8,
    },
    String,
    FixedString(usize),
    /// The span is what the column holds and reads back right on this server (see [`Span`]).
    Date(Span),
    Date32(Span),
    DateTime(Span),
    DateTime64(u8, Span),
    IPv4,
    IPv6,
    Uuid,
    Enum(Vec<(String, i16)>, u8), // members, storage bits
    /// `Array(String)`: only the stage's own column of the columns a row does not hold
    /// (`tables.unheld_column`); no source value is written into one.
    Strings,
    Nullable(Box<ChType>),
}

/// The instants a Date/Date32/DateTime/DateTime64 column holds *and reads back unchanged* on
/// a server: seconds since 1970-01-01 00:00:00 UTC, both ends included. A value outside is
/// never written: the server would clamp it, wrap it, or (18.16 past 2106-02-07) store it
/// and print another date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: i64,
    pub last: i64,
}

impl Span {
    const fn days(first: i64, last: i64) -> Span {
        Span {
            first: first * 86_400,
            last: last * 86_400 + 86_399,
        }
    }

    /// `Date` on 20.1+: day 0 .. 65535 (2149-06-06).
    pub const DATE: Span = Span::days(0, 65_535);
    /// `Date` before 20.1: stored up to day 65535, but printed (and read by every date
    /// function) as 1970-01-01 past 2106-02-07 (day 49710): found on 18.16.
    pub const DATE_OLD: Span = Span::days(0, 49_710);
    /// `DateTime` on 20.1+: 0 .. 2^32-1 (2106-02-07 06:28:15).
    pub const DATETIME: Span = Span {
        first: 0,
        last: u32::MAX as i64,
    };
    /// `DateTime` before 20.1: printed as 1970-01-01 from 2106-02-07 00:00:00 on (18.16).
    pub const DATETIME_OLD: Span = Span::days(0, 49_709);
    /// `Date32`/`DateTime64` from 20.1 (DateTime64) and 21.9 (Date32) to 22.7:
    /// 1925-01-01 .. 2283-11-11.
    pub const WIDE_1925: Span = Span::days(-16_436, 114_635);
    /// 22.8 .. 26.7: 1900-01-01 .. 2299-12-31 (values outside are clamped by the server).
    pub const WIDE_1900: Span = Span::days(-25_567, 120_529);
    /// 26.8+: 0000-01-01 .. 9999-12-31, every date MySQL keeps (tested on 26.9).
    pub const FULL: Span = Span::days(-719_528, 2_932_896);

    pub fn holds(&self, secs: i64) -> bool {
        (self.first..=self.last).contains(&secs)
    }

    /// `YYYY-MM-DD .. YYYY-MM-DD` (with times when the ends are not whole days).
    pub fn describe(&self) -> String {
        let at = |s: i64| {
            let (y, m, d) = sluice_common::civil::civil_from_days(s.div_euclid(86_400));
            let r = s.rem_euclid(86_400);
            if r == 0 || r == 86_399 {
                format!("{y:04}-{m:02}-{d:02}")
            } else {
                format!(
                    "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
                    r / 3600,
                    r / 60 % 60,
                    r % 60
                )
            }
        };
        format!("{} .. {}", at(self.first), at(self.last))
    }
}

impl ChType {
    /// Parse a type as `system.columns.type` shows it, on a server with features `f`.
    pub fn parse(t: &str, f: Features) -> Result<ChType, String> {
        let t = t.trim();
        let inner = |prefix: &str| {
            t.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix(')'))
                .map(str::trim)
        };
        if let Some(i) = inner("Nullable(") {
            return Ok(ChType::Nullable(Box::new(ChType::parse(i, f)?)));
        }
        if let Some(i) = inner("LowCardinality(") {
            return ChType::parse(i, f); // same RowBinary as the inner type
        }
        if t == "Array(String)" {
            return Ok(ChType::Strings);
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
        for (prefix, precision) in [
            ("Decimal32(", 9),
            ("Decimal64(", 18),
            ("Decimal128(", 38),
            ("Decimal256(", 76),
        ] {
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
                f.wide_span,
            ));
        }
        if t == "DateTime" || t.starts_with("DateTime(") {
            return Ok(ChType::DateTime(f.datetime_span));
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
            "Date" => ChType::Date(f.date_span),
            "Date32" => ChType::Date32(f.wide_span),
            "IPv4" => ChType::IPv4,
            "IPv6" => ChType::IPv6,
            "UUID" => ChType::Uuid,
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
            ChType::Date(_) => "Date".into(),
            ChType::Date32(_) => "Date32".into(),
            ChType::DateTime(_) => "DateTime('UTC')".into(),
            ChType::DateTime64(p, _) => format!("DateTime64({p}, 'UTC')"),
            ChType::IPv4 => "IPv4".into(),
            ChType::IPv6 => "IPv6".into(),
            ChType::Uuid => "UUID".into(),
            ChType::Enum(members, bits) => format!(
                "Enum{bits}({})",
                members
                    .iter()
                    .map(|(m, v)| format!("{} = {v}", sluice_common::sql::clickhouse::string(m)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ChType::Strings => "Array(String)".into(),
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
            (T::Date(a), T::Date32(b)) | (T::DateTime(a), T::DateTime64(_, b)) => {
                b.first <= a.first && a.last <= b.last
            }
            (T::DateTime64(a, _), T::DateTime64(b, _)) => b >= a,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// DateTime64 (20.1+).
    pub datetime64: bool,
    /// Date32 (21.9+).
    pub date32: bool,
    /// What `Date`, `DateTime` and `Date32`/`DateTime64` hold and read back ([`Span`]).
    pub date_span: Span,
    pub datetime_span: Span,
    pub wide_span: Span,
    /// Decimal(19..38): 128-bit decimals read back right (20.1+; 18.16 prints them with NUL
    /// bytes and has crashed reading them).
    pub decimal128: bool,
    /// Decimal(39..76) (22.8+; experimental before).
    pub decimal256: bool,
    /// The IPv4 and IPv6 types (19.3+).
    pub ip_types: bool,
    /// The UUID type, written in RowBinary as two little-endian 64-bit halves (20.1+ tested
    /// on 26.9; 18.16 gets text).
    pub uuid: bool,
    /// Not the server's: the table's `tables.temporal`, which [`map_column`] follows
    /// ([`Features::with_temporal`]).
    pub temporal: Temporal,
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
    /// `ALTER TABLE ... MODIFY COLUMN` converts every part. 18.16 fails on a part that lacks
    /// the column's file and was rewritten by a mutation (a column added after the part was
    /// written, then an `ALTER ... DELETE`), and leaves the table unreadable ("Type mismatch
    /// for column"): there the stage changes a column's type by a copy of the table.
    pub modify_in_place: bool,
}

impl Features {
    pub fn of_version(version: &str) -> Self {
        let mut parts = version.split('.').filter_map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let v = (major, minor);
        Self {
            datetime64: v >= (20, 1),
            date32: v >= (21, 9),
            date_span: if v >= (20, 1) {
                Span::DATE
            } else {
                Span::DATE_OLD
            },
            datetime_span: if v >= (20, 1) {
                Span::DATETIME
            } else {
                Span::DATETIME_OLD
            },
            wide_span: if v >= (26, 8) {
                Span::FULL
            } else if v >= (22, 8) {
                Span::WIDE_1900
            } else {
                Span::WIDE_1925
            },
            decimal128: v >= (20, 1),
            decimal256: v >= (22, 8),
            ip_types: v >= (19, 3),
            uuid: v >= (20, 1),
            temporal: Temporal::Native,
            dedup_token: (major, minor) >= (22, 2),
            is_deleted: (major, minor) >= (23, 2),
            async_insert: (major, minor) >= (21, 11),
            illegal_column_means_done: (major, minor) < (20, 1),
            rename_column: (major, minor) >= (20, 4),
            modify_in_place: (major, minor) >= (19, 1),
        }
    }
}

/// Recent inserts a created table remembers for `insert_deduplication_token`: as many as
/// ReplicatedMergeTree's default window, far more than the batches a crash can replay.
pub const DEDUP_WINDOW: u32 = 1000;

impl Features {
    /// The features with a table's `tables.temporal`.
    pub fn with_temporal(self, temporal: Temporal) -> Features {
        Features { temporal, ..self }
    }
}

impl Default for Features {
    /// The oldest path, which every server takes (a version that does not parse).
    fn default() -> Self {
        Features::of_version("0.0")
    }
}

/// How a table's DATE, DATETIME and TIMESTAMP columns are kept (`tables.temporal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Temporal {
    /// The server's date and time types, the widest it has (`Date32`, `DateTime64`); a value
    /// they cannot hold on this server (out of range, a zero-in-date or invalid date) is
    /// refused, naming the row, and its table stops.
    #[default]
    Native,
    /// String columns with the value as MySQL prints it: every value is kept exactly, zero,
    /// partial and invalid dates included.
    Text,
}

/// The ClickHouse type a source column gets in tables the apply stage creates.
pub fn map_column(c: &Column, f: Features) -> ChType {
    use ColumnType as T;
    let text_dates = f.temporal == Temporal::Text;
    let base = match c.r#type() {
        // MariaDB's own types (their values travel as text): the server's types, else text.
        T::Inet4 if f.ip_types => ChType::IPv4,
        T::Inet6 if f.ip_types => ChType::IPv6,
        T::Uuid if f.uuid => ChType::Uuid,
        T::Date | T::Datetime | T::Timestamp if text_dates => ChType::String,
        T::Tinyint => int(8, c.unsigned),
        T::Smallint => int(16, c.unsigned),
        T::Mediumint | T::Int => int(32, c.unsigned),
        T::Bigint => int(64, c.unsigned),
        // Decimals as wide as the server reads back right; wider ones as exact text.
        T::Decimal
            if c.length <= 18
                || (c.length <= 38 && f.decimal128)
                || (c.length <= 76 && f.decimal256) =>
        {
            ChType::Decimal {
                precision: c.length.max(1) as u8,
                scale: c.scale as u8,
            }
        }
        T::Decimal => ChType::String,
        T::Float => ChType::Float32,
        T::Double => ChType::Float64,
        T::Bit => ChType::UInt(64),
        T::Year => ChType::UInt(16),
        // The widest date type: Date32 reaches 1900 (22.8+) or every date MySQL keeps (26.8+).
        T::Date if f.date32 => ChType::Date32(f.wide_span),
        T::Date => ChType::Date(f.date_span),
        // A TIMESTAMP (1970 .. 2038) fits DateTime; a DATETIME (1000 .. 9999) gets DateTime64
        // where the server has it, for its range. Fractional seconds are kept: DateTime64, or
        // exact text on servers without it.
        T::Timestamp if c.fsp == 0 => ChType::DateTime(f.datetime_span),
        T::Datetime | T::Timestamp if f.datetime64 => ChType::DateTime64(c.fsp as u8, f.wide_span),
        T::Datetime if c.fsp == 0 => ChType::DateTime(f.datetime_span),
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

impl Features {
    /// The server's features as the log says them: what it has of those the stage uses.
    pub fn summary(&self) -> String {
        let has = [
            ("DateTime64", self.datetime64),
            ("Date32", self.date32),
            ("Decimal128", self.decimal128),
            ("Decimal256", self.decimal256),
            ("IPv4/IPv6", self.ip_types),
            ("UUID", self.uuid),
            ("insert_deduplication_token", self.dedup_token),
            ("ReplacingMergeTree is_deleted", self.is_deleted),
            ("async_insert", self.async_insert),
        ];
        let (yes, no): (Vec<_>, Vec<_>) = has.iter().partition(|(_, h)| *h);
        let names = |v: Vec<&(&str, bool)>| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            }
        };
        format!("has {}; lacks {}", names(yes), names(no))
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
            "Date32",
            "IPv4",
            "IPv6",
            "UUID",
            "Decimal(76, 30)",
        ] {
            let f = Features::of_version("26.9.2.1");
            let parsed = ChType::parse(t, f).unwrap();
            assert_eq!(ChType::parse(&parsed.sql(), f).unwrap(), parsed, "{t}");
        }
        let f = Features::default();
        assert_eq!(
            ChType::parse("Enum8('a' = 1, 'b\\'c' = 2)", f).unwrap(),
            ChType::Enum(vec![("a".into(), 1), ("b'c".into(), 2)], 8)
        );
        assert_eq!(
            ChType::parse("Decimal64(4)", f).unwrap(),
            ChType::Decimal {
                precision: 18,
                scale: 4
            }
        );
        assert!(ChType::parse("Array(Int8)", f).is_err());
        // The span is the server's.
        assert_eq!(
            ChType::parse("Date", Features::of_version("18.16.1")).unwrap(),
            ChType::Date(Span::DATE_OLD)
        );
        assert_eq!(
            ChType::parse("DateTime64(3, 'UTC')", Features::of_version("24.8.1")).unwrap(),
            ChType::DateTime64(3, Span::WIDE_1900)
        );
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
        let (dt, dt64) = (T::DateTime(Span::DATETIME), |p| {
            T::DateTime64(p, Span::FULL)
        });
        assert!(dt.widens_to(&dt64(6)) && !dt64(6).widens_to(&dt64(3)));
        assert!(dt.widens_to(&T::DateTime64(0, Span::WIDE_1900)));
        assert!(T::Date(Span::DATE).widens_to(&T::Date32(Span::FULL)));
        assert!(!T::Date32(Span::FULL).widens_to(&T::Date32(Span::WIDE_1925)));
        assert!(
            !T::String.widens_to(&T::Int(64))
                && !T::Date(Span::DATE).widens_to(&T::DateTime(Span::DATETIME))
        );
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
        assert_eq!(f("unknown"), Features::default());
        assert!(f("unknown").illegal_column_means_done && !f("unknown").date32);
        // What the date types hold, per version.
        assert_eq!(old.date_span, Span::DATE_OLD);
        assert_eq!(old.datetime_span, Span::DATETIME_OLD);
        assert_eq!(f("22.3.1").wide_span, Span::WIDE_1925);
        assert_eq!(f("24.8.1").wide_span, Span::WIDE_1900);
        assert_eq!(f("26.7.1").wide_span, Span::WIDE_1900);
        assert_eq!(now.wide_span, Span::FULL);
        assert!(!old.decimal128 && now.decimal128 && now.decimal256);
        assert_eq!(Span::DATE_OLD.describe(), "1970-01-01 .. 2106-02-07");
        assert_eq!(
            Span::DATETIME.describe(),
            "1970-01-01 .. 2106-02-07 06:28:15"
        );
        assert_eq!(Span::FULL.describe(), "0000-01-01 .. 9999-12-31");
        assert_eq!(Span::WIDE_1925.describe(), "1925-01-01 .. 2283-11-11");
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
            ChType::DateTime64(6, Span::WIDE_1900)
        );
        let (old, now) = (
            Features::of_version("18.16.1"),
            Features::of_version("26.9.2.1"),
        );
        // DATE and DATETIME get the widest types the server has; TIMESTAMP fits DateTime.
        let date = col(ColumnType::Date);
        assert_eq!(map_column(&date, old), ChType::Date(Span::DATE_OLD));
        assert_eq!(map_column(&date, now), ChType::Date32(Span::FULL));
        let dt = col(ColumnType::Datetime);
        assert_eq!(map_column(&dt, old), ChType::DateTime(Span::DATETIME_OLD));
        assert_eq!(map_column(&dt, now), ChType::DateTime64(0, Span::FULL));
        let ts = col(ColumnType::Timestamp);
        assert_eq!(map_column(&ts, now), ChType::DateTime(Span::DATETIME));
        // Dates as text, per table.
        let text = now.with_temporal(Temporal::Text);
        for c in [&date, &dt, &ts] {
            assert_eq!(map_column(c, text), ChType::String);
        }
        // MariaDB's INET4/INET6/UUID: the server's types, text before them.
        let ip = col(ColumnType::Inet6);
        assert_eq!(map_column(&ip, now), ChType::IPv6);
        assert_eq!(map_column(&ip, old), ChType::String);
        assert_eq!(map_column(&col(ColumnType::Inet4), now), ChType::IPv4);
        assert_eq!(map_column(&col(ColumnType::Uuid), now), ChType::Uuid);
        assert_eq!(map_column(&col(ColumnType::Uuid), old), ChType::String);
        // Decimals as wide as the server reads back right.
        let mut d = col(ColumnType::Decimal);
        d.length = 65;
        d.scale = 30;
        assert_eq!(map_column(&d, old), ChType::String);
        assert_eq!(
            map_column(&d, now),
            ChType::Decimal {
                precision: 65,
                scale: 30
            }
        );
        d.length = 20;
        assert_eq!(map_column(&d, old), ChType::String);
        d.length = 18;
        assert!(matches!(map_column(&d, old), ChType::Decimal { .. }));
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
