//! How a column is stored in a rows event: its [`Layout`], from the table map's binlog type and
//! metadata and the column's schema, and whether that layout can be the schema's type at all
//! (a guard against decoding rows with a schema of another time).

use mysql_async::consts::ColumnType as My;
use sluice_proto::v1::{Column, ColumnType};

/// How one column's bytes are laid out and what they become.
#[derive(Debug, Clone)]
pub(super) enum Layout {
    Int {
        bytes: usize,
        unsigned: bool,
    },
    Year,
    Float,
    Double,
    Decimal {
        precision: usize,
        scale: usize,
    },
    Bit {
        bytes: usize,
    },
    Enum {
        bytes: usize,
    },
    Set {
        bytes: usize,
    },
    Date,
    /// The pre-5.6 formats.
    OldTime,
    OldDatetime,
    OldTimestamp,
    Time2 {
        fsp: u8,
    },
    Datetime2 {
        fsp: u8,
    },
    Timestamp2 {
        fsp: u8,
    },
    /// CHAR/BINARY (fixed): length prefix of 1 or 2 bytes; BINARY is re-padded with NULs.
    Fixed {
        prefix: usize,
        pad_to: Option<usize>,
    },
    /// VARCHAR/VARBINARY: length prefix of 1 or 2 bytes.
    Var {
        prefix: usize,
    },
    /// BLOB/TEXT/GEOMETRY/JSON: length prefix of 1..4 bytes.
    Blob {
        prefix: usize,
    },
    /// MySQL's binary JSON: length prefix of 1..4 bytes.
    BinaryJson {
        prefix: usize,
    },
}

/// The layout of a column from its binlog type and metadata, and its schema.
pub(super) fn layout(raw: My, meta: &[u8], col: &Column) -> Option<Layout> {
    let m = |i: usize| meta.get(i).copied().unwrap_or(0);
    Some(match raw {
        My::MYSQL_TYPE_TINY => Layout::Int {
            bytes: 1,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_SHORT => Layout::Int {
            bytes: 2,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_INT24 => Layout::Int {
            bytes: 3,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_LONG => Layout::Int {
            bytes: 4,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_LONGLONG => Layout::Int {
            bytes: 8,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_YEAR => Layout::Year,
        My::MYSQL_TYPE_FLOAT => Layout::Float,
        My::MYSQL_TYPE_DOUBLE => Layout::Double,
        My::MYSQL_TYPE_NEWDECIMAL => Layout::Decimal {
            precision: m(0) as usize,
            scale: m(1) as usize,
        },
        My::MYSQL_TYPE_BIT => Layout::Bit {
            bytes: (m(1) as usize * 8 + m(0) as usize).div_ceil(8),
        },
        My::MYSQL_TYPE_DATE | My::MYSQL_TYPE_NEWDATE => Layout::Date,
        My::MYSQL_TYPE_TIME => Layout::OldTime,
        My::MYSQL_TYPE_DATETIME => Layout::OldDatetime,
        My::MYSQL_TYPE_TIMESTAMP => Layout::OldTimestamp,
        My::MYSQL_TYPE_TIME2 => Layout::Time2 { fsp: m(0) },
        My::MYSQL_TYPE_DATETIME2 => Layout::Datetime2 { fsp: m(0) },
        My::MYSQL_TYPE_TIMESTAMP2 => Layout::Timestamp2 { fsp: m(0) },
        My::MYSQL_TYPE_VARCHAR | My::MYSQL_TYPE_VAR_STRING => {
            let max = u16::from_le_bytes([m(0), m(1)]) as usize;
            Layout::Var {
                prefix: if max < 256 { 1 } else { 2 },
            }
        }
        My::MYSQL_TYPE_STRING | My::MYSQL_TYPE_ENUM | My::MYSQL_TYPE_SET => {
            // Metadata: real type and the high bits of the maximum length folded together.
            let (b0, b1) = (m(0), m(1));
            let (real, max) = if b0 & 0x30 != 0x30 {
                (
                    b0 | 0x30,
                    b1 as usize | ((((b0 & 0x30) ^ 0x30) as usize) << 4),
                )
            } else {
                (b0, b1 as usize)
            };
            match real {
                0xf7 => Layout::Enum { bytes: b1 as usize },
                0xf8 => Layout::Set { bytes: b1 as usize },
                _ => Layout::Fixed {
                    prefix: if max < 256 { 1 } else { 2 },
                    pad_to: matches!(
                        col.r#type(),
                        ColumnType::Binary
                            | ColumnType::Inet4
                            | ColumnType::Inet6
                            | ColumnType::Uuid
                    )
                    .then_some(col.length as usize),
                },
            }
        }
        My::MYSQL_TYPE_BLOB
        | My::MYSQL_TYPE_TINY_BLOB
        | My::MYSQL_TYPE_MEDIUM_BLOB
        | My::MYSQL_TYPE_LONG_BLOB
        | My::MYSQL_TYPE_GEOMETRY => Layout::Blob {
            prefix: m(0) as usize,
        },
        My::MYSQL_TYPE_JSON => Layout::BinaryJson {
            prefix: m(0) as usize,
        },
        _ => return None,
    })
}

/// Whether a binlog storage layout can be a column of schema type `ty`: a guard against
/// decoding rows with a schema of another time.
pub(super) fn compatible(layout: &Layout, ty: ColumnType) -> bool {
    use ColumnType as T;
    match layout {
        Layout::Int { bytes: 1, .. } => ty == T::Tinyint,
        Layout::Int { bytes: 2, .. } => ty == T::Smallint,
        Layout::Int { bytes: 3, .. } => ty == T::Mediumint,
        Layout::Int { bytes: 4, .. } => ty == T::Int,
        Layout::Int { .. } => ty == T::Bigint,
        Layout::Year => ty == T::Year,
        Layout::Float => ty == T::Float,
        Layout::Double => ty == T::Double,
        Layout::Decimal { .. } => ty == T::Decimal,
        Layout::Bit { .. } => ty == T::Bit,
        Layout::Enum { .. } => ty == T::Enum,
        Layout::Set { .. } => ty == T::Set,
        Layout::Date => ty == T::Date,
        Layout::OldTime | Layout::Time2 { .. } => ty == T::Time,
        Layout::OldDatetime | Layout::Datetime2 { .. } => ty == T::Datetime,
        Layout::OldTimestamp | Layout::Timestamp2 { .. } => ty == T::Timestamp,
        Layout::Fixed { .. } => matches!(ty, T::Char | T::Binary | T::Inet4 | T::Inet6 | T::Uuid),
        Layout::Var { .. } => matches!(ty, T::Varchar | T::Varbinary),
        Layout::Blob { .. } => matches!(ty, T::Text | T::Blob | T::Json | T::Geometry),
        Layout::BinaryJson { .. } => ty == T::Json,
    }
}
