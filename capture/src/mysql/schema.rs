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
    let columns: Vec<Column> = rows
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
    let primary_key = key
        .iter()
        .filter_map(|k| columns.iter().position(|c| &c.name == k))
        .map(|i| i as u32)
        .collect();
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
        ColumnType::Binary | ColumnType::Varbinary | ColumnType::Blob => "binary".to_string(),
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
        "binary" | "inet6" | "uuid" => ColumnType::Binary,
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
    }
}
