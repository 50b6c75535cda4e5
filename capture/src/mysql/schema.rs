//! Table schemas read from `information_schema`.
//!
//! The binlog's table map gives column types and storage metadata but, with the default
//! `binlog_row_metadata=MINIMAL`/`NO_LOG`, neither names nor signedness nor ENUM/SET members nor
//! charsets: those come from here. A schema is read when a table is first seen and again after
//! every DDL that touches it.

use mysql_async::prelude::Queryable;
use sluice_proto::v1::{Column, ColumnType, TableSchema};

/// Read the schema of `database`.`table`; `Ok(None)` when the table does not exist.
pub async fn load(
    conn: &mut mysql_async::Conn,
    database: &str,
    table: &str,
) -> Result<Option<TableSchema>, mysql_async::Error> {
    type ColumnRow = (
        String,         // COLUMN_NAME
        String,         // DATA_TYPE
        String,         // COLUMN_TYPE
        String,         // IS_NULLABLE
        Option<u64>,    // CHARACTER_MAXIMUM_LENGTH
        Option<u64>,    // NUMERIC_PRECISION
        Option<u64>,    // NUMERIC_SCALE
        Option<u64>,    // DATETIME_PRECISION
        Option<String>, // CHARACTER_SET_NAME
    );
    let rows: Vec<ColumnRow> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, CHARACTER_MAXIMUM_LENGTH, \
             NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_SET_NAME \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let key: Vec<String> = conn
        .exec(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' \
             ORDER BY SEQ_IN_INDEX",
            (database, table),
        )
        .await?;
    // MariaDB's JSON is LONGTEXT with a json_valid() check: a JSON column all the same.
    let json_checked: Vec<String> = conn
        .exec(
            "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS \
             WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?",
            (database, table),
        )
        .await
        .unwrap_or_default(); // MySQL < 8.0.16 has no such table
    let mut columns: Vec<Column> = rows
        .into_iter()
        .map(
            |(name, data_type, column_type, nullable, char_len, precision, scale, fsp, charset)| {
                column(
                    name,
                    &data_type,
                    column_type,
                    nullable == "YES",
                    char_len,
                    precision,
                    scale,
                    fsp,
                    charset,
                )
            },
        )
        .collect();
    for c in columns.iter_mut() {
        let check = format!("json_valid(`{}`)", c.name);
        if c.r#type() == ColumnType::Text && json_checked.iter().any(|k| k.contains(&check)) {
            c.r#type = ColumnType::Json as i32;
            c.sql_type = "json".into();
        }
    }
    let primary_key = key
        .iter()
        .filter_map(|k| columns.iter().position(|c| &c.name == k))
        .map(|i| i as u32)
        .collect();
    // The server's own conversion of each charset the text columns use (see `charset`).
    let charsets: Vec<String> = columns.iter().map(|c| c.charset.clone()).collect();
    crate::mysql::charset::load(conn, charsets.iter().map(String::as_str)).await?;
    let mut schema = TableSchema {
        database: database.to_string(),
        table: table.to_string(),
        columns,
        primary_key,
        schema_id: 0,
    };
    schema.schema_id = sluice_proto::schema_id(&schema);
    Ok(Some(schema))
}

#[allow(clippy::too_many_arguments)]
fn column(
    name: String,
    data_type: &str,
    sql_type: String,
    nullable: bool,
    char_len: Option<u64>,
    precision: Option<u64>,
    scale: Option<u64>,
    fsp: Option<u64>,
    charset: Option<String>,
) -> Column {
    let ty = column_type(data_type);
    let lower = sql_type.to_ascii_lowercase();
    let unsigned = lower.contains("unsigned");
    let members = match ty {
        ColumnType::Enum | ColumnType::Set => parse_members(&sql_type),
        _ => Vec::new(),
    };
    let length = match ty {
        // Their stored width in bytes.
        ColumnType::Inet4 => 4,
        ColumnType::Inet6 | ColumnType::Uuid => 16,
        ColumnType::Char
        | ColumnType::Varchar
        | ColumnType::Text
        | ColumnType::Binary
        | ColumnType::Varbinary
        | ColumnType::Blob => char_len.unwrap_or(0),
        _ => precision.unwrap_or(0),
    };
    // Binary strings have no charset in information_schema; text types always have one.
    let charset = match ty {
        ColumnType::Binary
        | ColumnType::Varbinary
        | ColumnType::Blob
        | ColumnType::Inet4
        | ColumnType::Inet6
        | ColumnType::Uuid => "binary".to_string(),
        _ => charset.unwrap_or_default(),
    };
    Column {
        name,
        r#type: ty as i32,
        sql_type,
        nullable,
        unsigned,
        length: u32::try_from(length).unwrap_or(u32::MAX),
        scale: scale.unwrap_or(0) as u32,
        fsp: fsp.unwrap_or(0) as u32,
        charset,
        members,
    }
}

/// `information_schema.COLUMNS.DATA_TYPE` to the contract's type family.
pub fn column_type(data_type: &str) -> ColumnType {
    match data_type.to_ascii_lowercase().as_str() {
        "tinyint" | "bool" | "boolean" => ColumnType::Tinyint,
        "smallint" => ColumnType::Smallint,
        "mediumint" => ColumnType::Mediumint,
        "int" | "integer" => ColumnType::Int,
        "bigint" => ColumnType::Bigint,
        "decimal" | "numeric" => ColumnType::Decimal,
        "float" => ColumnType::Float,
        "double" | "real" | "double precision" => ColumnType::Double,
        "bit" => ColumnType::Bit,
        "enum" => ColumnType::Enum,
        "set" => ColumnType::Set,
        "date" => ColumnType::Date,
        "time" => ColumnType::Time,
        "datetime" => ColumnType::Datetime,
        "timestamp" => ColumnType::Timestamp,
        "year" => ColumnType::Year,
        "char" => ColumnType::Char,
        "varchar" => ColumnType::Varchar,
        "tinytext" | "text" | "mediumtext" | "longtext" => ColumnType::Text,
        "binary" => ColumnType::Binary,
        "inet4" => ColumnType::Inet4,
        "inet6" => ColumnType::Inet6,
        "uuid" => ColumnType::Uuid,
        "varbinary" => ColumnType::Varbinary,
        "tinyblob" | "blob" | "mediumblob" | "longblob" => ColumnType::Blob,
        "json" => ColumnType::Json,
        "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring"
        | "multipolygon" | "geometrycollection" | "geomcollection" => ColumnType::Geometry,
        _ => ColumnType::Unspecified,
    }
}

/// The members of `enum('a','b''c')` / `set(...)`, unquoted (`''` is a quote).
pub fn parse_members(sql_type: &str) -> Vec<String> {
    let Some(open) = sql_type.find('(') else {
        return Vec::new();
    };
    let body = &sql_type[open + 1..];
    let mut members = Vec::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        while let Some(c) = chars.next() {
            if c == '\'' {
                if chars.peek() == Some(&'\'') {
                    chars.next();
                    member.push('\'');
                } else {
                    break;
                }
            } else if c == '\\' {
                // information_schema shows backslashes doubled on some versions.
                match chars.next() {
                    Some('\\') => member.push('\\'),
                    Some(other) => {
                        member.push('\\');
                        member.push(other);
                    }
                    None => member.push('\\'),
                }
            } else {
                member.push(c);
            }
        }
        members.push(member);
    }
    members
}

/// Whether the binlog logs a column of type `t` as another (MariaDB's INET4/INET6/UUID as
/// BINARY, JSON as a BLOB): its type must come from elsewhere.
pub fn logged_as_another(t: ColumnType) -> bool {
    matches!(
        t,
        ColumnType::Inet4 | ColumnType::Inet6 | ColumnType::Uuid | ColumnType::Json
    )
}

/// The schema a table map carries when the server logs `binlog_row_metadata=FULL` (MySQL 8,
/// MariaDB 10.5+): names, signedness, charsets, ENUM/SET members and the primary key, exactly
/// as they were when the rows were written. `None` without column names (MINIMAL/NO_LOG).
///
/// `current` (from information_schema, if the table still has the same columns) contributes
/// the declared SQL types and any charset the binlog names by an id this build does not know.
/// The types the binlog logs as others (INET4/INET6/UUID as BINARY, JSON as a BLOB) are taken,
/// column by column of the same name, from `current`, else from `statements` (the table's
/// ALTERs read since `known`, waiting for these rows: the type the last one declares), else
/// from `known` (the schema last published for the table), else from `current` even when its
/// columns differ: a table whose columns changed since its rows were written (read behind the
/// server) keeps them.
pub fn from_table_map(
    tme: &mysql_async::binlog::events::TableMapEvent<'_>,
    current: Option<&TableSchema>,
    known: Option<&TableSchema>,
    statements: &[String],
) -> Option<TableSchema> {
    use mysql_async::binlog::events::OptionalMetadataField as F;
    use mysql_async::consts::ColumnType as My;

    let n = tme.columns_count() as usize;
    let mut names: Option<Vec<String>> = None;
    let mut unsigned_bits: Vec<bool> = Vec::new();
    let mut char_charsets: Vec<u16> = Vec::new();
    let mut enum_set_charsets: Vec<u16> = Vec::new();
    let mut enums: Vec<Vec<String>> = Vec::new();
    let mut sets: Vec<Vec<String>> = Vec::new();
    let mut pk: Vec<u32> = Vec::new();
    // Charsets come as a default plus exceptions, or as one per column; expand both.
    let count_of = |pred: &dyn Fn(My) -> bool| {
        (0..n)
            .filter(|i| tme.get_column_type(*i).ok().flatten().is_some_and(pred))
            .count()
    };
    let n_char = count_of(&|t: My| t.is_character_type());
    let n_enum_set = count_of(&|t: My| t.is_enum_or_set_type());
    for field in tme.iter_optional_meta() {
        match field.ok()? {
            F::ColumnName(c) => {
                names = Some(
                    c.iter_names()
                        .map(|n| n.map(|n| n.name().to_string()))
                        .collect::<Result<_, _>>()
                        .ok()?,
                )
            }
            F::Signedness(bits) => unsigned_bits = bits.iter().by_vals().collect(),
            F::DefaultCharset(d) => {
                char_charsets = vec![d.default_charset(); n_char];
                for nd in d.iter_non_default() {
                    let nd = nd.ok()?;
                    if let Some(c) = char_charsets.get_mut(nd.column_index() as usize) {
                        *c = nd.charset();
                    }
                }
            }
            F::ColumnCharset(c) => {
                char_charsets = c.iter_charsets().collect::<Result<_, _>>().ok()?
            }
            F::EnumAndSetDefaultCharset(d) => {
                enum_set_charsets = vec![d.default_charset(); n_enum_set];
            }
            F::EnumAndSetColumnCharset(c) => {
                enum_set_charsets = c.iter_charsets().collect::<Result<_, _>>().ok()?
            }
            F::EnumStrValue(v) => {
                for e in v.iter_values() {
                    let e = e.ok()?;
                    enums.push(e.values().iter().map(|s| s.value().to_string()).collect());
                }
            }
            F::SetStrValue(v) => {
                for s in v.iter_values() {
                    let s = s.ok()?;
                    sets.push(s.values().iter().map(|s| s.value().to_string()).collect());
                }
            }
            F::SimplePrimaryKey(k) => {
                pk = k
                    .iter_indexes()
                    .map(|i| i.map(|i| i as u32))
                    .collect::<Result<_, _>>()
                    .ok()?
            }
            F::PrimaryKeyWithPrefix(k) => {
                pk = k
                    .iter_keys()
                    .map(|i| i.map(|k| k.column_index() as u32))
                    .collect::<Result<_, _>>()
                    .ok()?
            }
            _ => {}
        }
    }
    let names = names?;
    if names.len() != n {
        return None;
    }
    let _ = enum_set_charsets;
    let by_name = |s: Option<&TableSchema>, name: &str| -> Option<Column> {
        s.and_then(|s| s.columns.iter().find(|c| c.name == name).cloned())
    };
    let declared = |name: &str| -> Option<Column> {
        let ty = match sluice_common::sql::alter::declared_type_in(statements, name)?.as_str() {
            "INET4" => ColumnType::Inet4,
            "INET6" => ColumnType::Inet6,
            "UUID" => ColumnType::Uuid,
            "JSON" => ColumnType::Json,
            _ => ColumnType::Unspecified,
        };
        let mut c = Column {
            name: name.to_string(),
            length: match ty {
                ColumnType::Inet4 => 4,
                ColumnType::Inet6 | ColumnType::Uuid => 16,
                _ => 0,
            },
            ..Default::default()
        };
        c.set_type(ty);
        Some(c)
    };
    let hints: Vec<Option<Column>> = names
        .iter()
        .map(|n| {
            declared(n)
                .or_else(|| by_name(known, n))
                .or_else(|| by_name(current, n))
        })
        .collect();
    let current = current.filter(|c| {
        c.columns.len() == n && c.columns.iter().zip(&names).all(|(c, n)| &c.name == n)
    });
    let nulls = tme.null_bitmask();
    let (mut num_i, mut char_i, mut enum_i, mut set_i) = (0, 0, 0, 0);
    let mut columns = Vec::with_capacity(n);
    for (i, name) in names.into_iter().enumerate() {
        let real = tme.get_column_type(i).ok().flatten()?;
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        let m = |k: usize| u32::from(meta.get(k).copied().unwrap_or(0));
        // (YEAR takes a signedness bit, set, but has no sign: information_schema gives it none,
        // and a schema read there after a CREATE must agree with this one)
        let unsigned = if real.is_numeric_type() {
            num_i += 1;
            unsigned_bits.get(num_i - 1).copied().unwrap_or(false) && real != My::MYSQL_TYPE_YEAR
        } else {
            false
        };
        let mut charset = if real.is_character_type() {
            char_i += 1;
            let id = char_charsets.get(char_i - 1).copied().unwrap_or(0);
            charset_name(id)
        } else {
            String::new()
        };
        let now = current.map(|c| &c.columns[i]);
        if charset == "?" {
            charset = now.map(|c| c.charset.clone()).unwrap_or_default();
        }
        let binary = charset == "binary";
        let (ty, length, scale, fsp) = match real {
            My::MYSQL_TYPE_TINY => (ColumnType::Tinyint, 0, 0, 0),
            My::MYSQL_TYPE_SHORT => (ColumnType::Smallint, 0, 0, 0),
            My::MYSQL_TYPE_INT24 => (ColumnType::Mediumint, 0, 0, 0),
            My::MYSQL_TYPE_LONG => (ColumnType::Int, 0, 0, 0),
            My::MYSQL_TYPE_LONGLONG => (ColumnType::Bigint, 0, 0, 0),
            My::MYSQL_TYPE_NEWDECIMAL | My::MYSQL_TYPE_DECIMAL => {
                (ColumnType::Decimal, m(0), m(1), 0)
            }
            My::MYSQL_TYPE_FLOAT => (ColumnType::Float, 0, 0, 0),
            My::MYSQL_TYPE_DOUBLE => (ColumnType::Double, 0, 0, 0),
            My::MYSQL_TYPE_BIT => (ColumnType::Bit, m(1) * 8 + m(0), 0, 0),
            My::MYSQL_TYPE_ENUM => (ColumnType::Enum, 0, 0, 0),
            My::MYSQL_TYPE_SET => (ColumnType::Set, 0, 0, 0),
            My::MYSQL_TYPE_DATE | My::MYSQL_TYPE_NEWDATE => (ColumnType::Date, 0, 0, 0),
            My::MYSQL_TYPE_TIME | My::MYSQL_TYPE_TIME2 => (ColumnType::Time, 0, 0, m(0)),
            My::MYSQL_TYPE_DATETIME | My::MYSQL_TYPE_DATETIME2 => {
                (ColumnType::Datetime, 0, 0, m(0))
            }
            My::MYSQL_TYPE_TIMESTAMP | My::MYSQL_TYPE_TIMESTAMP2 => {
                (ColumnType::Timestamp, 0, 0, m(0))
            }
            My::MYSQL_TYPE_YEAR => (ColumnType::Year, 0, 0, 0),
            My::MYSQL_TYPE_STRING => {
                let (b0, b1) = (m(0), m(1));
                let max = if b0 & 0x30 != 0x30 {
                    b1 | (((b0 & 0x30) ^ 0x30) << 4)
                } else {
                    b1
                };
                let ty = if binary {
                    ColumnType::Binary
                } else {
                    ColumnType::Char
                };
                (ty, max, 0, 0)
            }
            My::MYSQL_TYPE_VARCHAR | My::MYSQL_TYPE_VAR_STRING => {
                let ty = if binary {
                    ColumnType::Varbinary
                } else {
                    ColumnType::Varchar
                };
                (ty, m(0) | (m(1) << 8), 0, 0)
            }
            My::MYSQL_TYPE_BLOB
            | My::MYSQL_TYPE_TINY_BLOB
            | My::MYSQL_TYPE_MEDIUM_BLOB
            | My::MYSQL_TYPE_LONG_BLOB => {
                let ty = if binary {
                    ColumnType::Blob
                } else {
                    ColumnType::Text
                };
                (ty, 0, 0, 0)
            }
            My::MYSQL_TYPE_JSON => (ColumnType::Json, 0, 0, 0),
            My::MYSQL_TYPE_GEOMETRY => (ColumnType::Geometry, 0, 0, 0),
            _ => (ColumnType::Unspecified, 0, 0, 0),
        };
        // MariaDB logs INET4/INET6/UUID as BINARY(4/16); information_schema knows the type.
        let hint = now.or(hints[i].as_ref());
        let (ty, length) = match hint {
            Some(c)
                if matches!(
                    c.r#type(),
                    ColumnType::Inet4 | ColumnType::Inet6 | ColumnType::Uuid
                ) && ty == ColumnType::Binary
                    && c.length == length =>
            {
                (c.r#type(), length)
            }
            _ => (ty, length),
        };
        // MariaDB logs JSON as a text BLOB; information_schema knows it is JSON.
        let (ty, charset) = match hint {
            Some(c)
                if c.r#type() == ColumnType::Json
                    && matches!(ty, ColumnType::Text | ColumnType::Blob) =>
            {
                (ColumnType::Json, c.charset.clone())
            }
            _ => (ty, charset),
        };
        let members = match ty {
            ColumnType::Enum => {
                enum_i += 1;
                enums.get(enum_i - 1).cloned().unwrap_or_default()
            }
            ColumnType::Set => {
                set_i += 1;
                sets.get(set_i - 1).cloned().unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // The declared type text comes from information_schema when it still describes the
        // same column; otherwise a rendering of what the binlog says.
        let sql_type = match now {
            Some(c) if c.r#type() == ty => c.sql_type.clone(),
            _ => render_sql_type(ty, length, scale, fsp, unsigned, &members),
        };
        columns.push(Column {
            name,
            r#type: ty as i32,
            sql_type,
            nullable: nulls.get(i).map(|b| *b).unwrap_or(true),
            unsigned,
            length: match now {
                Some(c) if c.r#type() == ty && ty != ColumnType::Binary => c.length,
                _ => length,
            },
            scale,
            fsp,
            charset,
            members,
        });
    }
    let database = tme.database_name().to_string();
    let table = tme.table_name().to_string();
    let mut schema = TableSchema {
        database,
        table,
        columns,
        primary_key: pk,
        schema_id: 0,
    };
    schema.schema_id = sluice_proto::schema_id(&schema);
    Some(schema)
}

/// Charset name of a collation id; "?" when this build does not know the id.
fn charset_name(id: u16) -> String {
    use mysql_common::collations::{Collation, CollationId};
    let cid = CollationId::from(id);
    if cid == CollationId::UNKNOWN_COLLATION_ID {
        return "?".into();
    }
    Collation::from(cid).charset().to_string()
}

fn render_sql_type(
    ty: ColumnType,
    length: u32,
    scale: u32,
    fsp: u32,
    unsigned: bool,
    members: &[String],
) -> String {
    let u = if unsigned { " unsigned" } else { "" };
    let list = || {
        members
            .iter()
            .map(|m| format!("'{}'", m.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(",")
    };
    let frac = |base: &str| {
        if fsp > 0 {
            format!("{base}({fsp})")
        } else {
            base.to_string()
        }
    };
    match ty {
        ColumnType::Tinyint => format!("tinyint{u}"),
        ColumnType::Smallint => format!("smallint{u}"),
        ColumnType::Mediumint => format!("mediumint{u}"),
        ColumnType::Int => format!("int{u}"),
        ColumnType::Bigint => format!("bigint{u}"),
        ColumnType::Decimal => format!("decimal({length},{scale}){u}"),
        ColumnType::Float => format!("float{u}"),
        ColumnType::Double => format!("double{u}"),
        ColumnType::Bit => format!("bit({length})"),
        ColumnType::Enum => format!("enum({})", list()),
        ColumnType::Set => format!("set({})", list()),
        ColumnType::Date => "date".into(),
        ColumnType::Time => frac("time"),
        ColumnType::Datetime => frac("datetime"),
        ColumnType::Timestamp => frac("timestamp"),
        ColumnType::Year => "year".into(),
        ColumnType::Char => format!("char({length} bytes)"),
        ColumnType::Varchar => format!("varchar({length} bytes)"),
        ColumnType::Text => "text".into(),
        ColumnType::Binary => format!("binary({length})"),
        ColumnType::Varbinary => format!("varbinary({length})"),
        ColumnType::Blob => "blob".into(),
        ColumnType::Json => "json".into(),
        ColumnType::Geometry => "geometry".into(),
        _ => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_unquoted() {
        assert_eq!(
            parse_members("enum('en1','en2','en3')"),
            vec!["en1", "en2", "en3"]
        );
        assert_eq!(
            parse_members("set('a,b','it''s','')"),
            vec!["a,b", "it's", ""]
        );
        assert!(parse_members("int(11)").is_empty());
    }

    #[test]
    fn data_types_map() {
        assert_eq!(column_type("BIGINT"), ColumnType::Bigint);
        assert_eq!(column_type("longblob"), ColumnType::Blob);
        assert_eq!(column_type("point"), ColumnType::Geometry);
        assert_eq!(column_type("something"), ColumnType::Unspecified);
        assert_eq!(column_type("inet4"), ColumnType::Inet4);
        assert_eq!(column_type("INET6"), ColumnType::Inet6);
        assert_eq!(column_type("uuid"), ColumnType::Uuid);
    }
}
