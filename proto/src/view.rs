//! Reading encoded events without building their messages: an event's row images found in its
//! bytes ([`images`]), and an image's values as views borrowing those bytes ([`values`],
//! [`ValueRef`]). For sinks that write every value somewhere else at once and keep none, this
//! spares an allocation per value and per string.
//!
//! Protobuf's reading rules hold: fields in any order, unknown fields skipped, the last of a
//! repeated scalar or oneof member wins, strings must be UTF-8. Two simplifications, which no
//! writer of the contract produces: a message field given twice is read from its last
//! occurrence (protobuf would merge the two), and groups (wire types 3 and 4) are refused.

use crate::tags::{
    change_event as ce, enum_value, geometry, mongo_change as mc, raw_text, row, set_value,
    transaction as tx, value as val,
};
use crate::v1::{self, value::Kind, Value};

/// Why bytes are not a valid encoding. Always definite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ViewError(pub &'static str);

/// One value of a row image, borrowing the encoded bytes (or a [`Value`], see `From`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    /// The image does not hold the column (an empty `Value`).
    Absent,
    Null,
    Int(i64),
    Uint(u64),
    Float32(f32),
    Float64(f64),
    Decimal(&'a str),
    Text(&'a str),
    Bytes(&'a [u8]),
    Bits(u64),
    Enum {
        index: u32,
        label: &'a str,
    },
    Set {
        bits: u64,
        members: Members<'a>,
    },
    Date(v1::Date),
    TimeMicros(i64),
    Datetime(v1::DateTime),
    TimestampMicros(i64),
    Geometry {
        srid: u32,
        wkb: &'a [u8],
    },
    Json(&'a str),
    Bson(&'a [u8]),
    RawText {
        data: &'a [u8],
        charset: &'a str,
    },
}

/// The members of a SET value.
#[derive(Debug, Clone, Copy)]
pub enum Members<'a> {
    /// A `SetValue` message's bytes (its members checked to be UTF-8).
    Encoded(&'a [u8]),
    List(&'a [String]),
}

impl<'a> Members<'a> {
    pub fn iter(&self) -> impl Iterator<Item = &'a str> + 'a {
        let (encoded, list) = match *self {
            Members::Encoded(b) => (Some(Reader(b)), None),
            Members::List(l) => (None, Some(l.iter().map(String::as_str))),
        };
        let encoded = encoded.into_iter().flat_map(|mut r| {
            std::iter::from_fn(move || loop {
                match r.field().ok()?? {
                    (set_value::MEMBERS, Field::Len(b)) => return std::str::from_utf8(b).ok(),
                    _ => continue,
                }
            })
        });
        encoded.chain(list.into_iter().flatten())
    }
}

impl PartialEq for Members<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<'a> From<&'a Value> for ValueRef<'a> {
    fn from(v: &'a Value) -> Self {
        let Some(k) = &v.kind else {
            return ValueRef::Absent;
        };
        match k {
            Kind::Null(_) => ValueRef::Null,
            Kind::Int(i) => ValueRef::Int(*i),
            Kind::Uint(u) => ValueRef::Uint(*u),
            Kind::Float32(f) => ValueRef::Float32(*f),
            Kind::Float64(f) => ValueRef::Float64(*f),
            Kind::Decimal(d) => ValueRef::Decimal(d),
            Kind::Text(t) => ValueRef::Text(t),
            Kind::Bytes(b) => ValueRef::Bytes(b),
            Kind::Bits(b) => ValueRef::Bits(*b),
            Kind::EnumValue(e) => ValueRef::Enum {
                index: e.index,
                label: &e.label,
            },
            Kind::SetValue(s) => ValueRef::Set {
                bits: s.bits,
                members: Members::List(&s.members),
            },
            Kind::Date(d) => ValueRef::Date(*d),
            Kind::TimeMicros(t) => ValueRef::TimeMicros(*t),
            Kind::Datetime(d) => ValueRef::Datetime(*d),
            Kind::TimestampMicros(t) => ValueRef::TimestampMicros(*t),
            Kind::Geometry(g) => ValueRef::Geometry {
                srid: g.srid,
                wkb: &g.wkb,
            },
            Kind::Json(j) => ValueRef::Json(j),
            Kind::Bson(b) => ValueRef::Bson(b),
            Kind::RawText(r) => ValueRef::RawText {
                data: &r.data,
                charset: &r.charset,
            },
        }
    }
}

/// What writing the row of an encoded row event takes, borrowed from its bytes: one pass over
/// the event, nothing allocated. The other fields (source, position, transaction, key, DDL) are
/// skipped unread. Fields as in `ChangeEvent`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RowEvent<'a> {
    pub contract: u32,
    pub op: i32,
    pub database: &'a str,
    pub table: &'a str,
    pub version: u64,
    pub commit_time_micros: i64,
    pub schema_id: u64,
    /// The `TableSchema` message, when the event carries it.
    pub schema: Option<&'a [u8]>,
    /// The images: encoded `Row` messages.
    pub before: Option<&'a [u8]>,
    pub after: Option<&'a [u8]>,
    /// The `MongoChange` message, when the event carries it ([`MongoChangeRef::parse`]).
    pub mongo: Option<&'a [u8]>,
    /// `transaction.index`: the event's place in its transaction (or, for the snapshot rows
    /// of a table without a primary key, in the table's snapshot); 0 without a transaction.
    pub transaction_index: u64,
}

impl<'a> RowEvent<'a> {
    pub fn parse(event: &'a [u8]) -> Result<Self, ViewError> {
        let mut r = Reader(event);
        let mut e = RowEvent::default();
        while let Some((tag, f)) = r.field()? {
            match (tag, f) {
                (ce::CONTRACT, Field::Varint(x)) => e.contract = x as u32,
                (ce::OP, Field::Varint(x)) => e.op = x as i32,
                (ce::DATABASE, Field::Len(b)) => e.database = utf8(b)?,
                (ce::TABLE, Field::Len(b)) => e.table = utf8(b)?,
                (ce::VERSION, Field::Varint(x)) => e.version = x,
                (ce::COMMIT_TIME_MICROS, Field::Varint(x)) => e.commit_time_micros = x as i64,
                (ce::SCHEMA_ID, Field::Varint(x)) => e.schema_id = x,
                (ce::SCHEMA, Field::Len(b)) => e.schema = Some(b),
                (ce::BEFORE, Field::Len(b)) => e.before = Some(b),
                (ce::AFTER, Field::Len(b)) => e.after = Some(b),
                (ce::MONGO, Field::Len(b)) => e.mongo = Some(b),
                (ce::TRANSACTION, Field::Len(b)) => {
                    let mut t = Reader(b);
                    while let Some((tag, f)) = t.field()? {
                        match (tag, f) {
                            (tx::INDEX, Field::Varint(x)) => e.transaction_index = x,
                            (tx::INDEX, _) => {
                                return Err(ViewError(
                                    "a transaction's index has the wrong wire type",
                                ))
                            }
                            _ => {}
                        }
                    }
                }
                (
                    ce::CONTRACT
                    | ce::OP
                    | ce::DATABASE
                    | ce::TABLE
                    | ce::VERSION
                    | ce::COMMIT_TIME_MICROS
                    | ce::SCHEMA_ID
                    | ce::SCHEMA
                    | ce::BEFORE
                    | ce::AFTER
                    | ce::MONGO
                    | ce::TRANSACTION,
                    _,
                ) => return Err(ViewError("an event's field has the wrong wire type")),
                _ => {}
            }
        }
        Ok(e)
    }

    /// The operation (`Op::Unspecified` for a value this build does not know).
    pub fn op(&self) -> v1::Op {
        v1::Op::try_from(self.op).unwrap_or_default()
    }
}

/// What writing a MongoDB change takes, borrowed from an encoded `MongoChange`: the documents
/// stay BSON bytes; the before-image, session and transaction number are skipped unread.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MongoChangeRef<'a> {
    pub document_key: &'a [u8],
    pub full_document: &'a [u8],
    /// The `UpdateDescription` message, when there is one.
    pub update_description: Option<&'a [u8]>,
    pub operation_type: &'a str,
}

impl<'a> MongoChangeRef<'a> {
    pub fn parse(change: &'a [u8]) -> Result<Self, ViewError> {
        let mut r = Reader(change);
        let mut m = MongoChangeRef::default();
        while let Some((tag, f)) = r.field()? {
            match (tag, f) {
                (mc::DOCUMENT_KEY, Field::Len(b)) => m.document_key = b,
                (mc::FULL_DOCUMENT, Field::Len(b)) => m.full_document = b,
                (mc::UPDATE_DESCRIPTION, Field::Len(b)) => m.update_description = Some(b),
                (mc::OPERATION_TYPE, Field::Len(b)) => m.operation_type = utf8(b)?,
                (
                    mc::DOCUMENT_KEY
                    | mc::FULL_DOCUMENT
                    | mc::UPDATE_DESCRIPTION
                    | mc::OPERATION_TYPE,
                    _,
                ) => {
                    return Err(ViewError(
                        "a MongoDB change's field has the wrong wire type",
                    ))
                }
                _ => {}
            }
        }
        Ok(m)
    }
}

/// The values of an encoded `Row` message, in order.
pub fn values(row: &[u8]) -> impl Iterator<Item = Result<ValueRef<'_>, ViewError>> {
    let mut r = Reader(row);
    std::iter::from_fn(move || loop {
        match r.field() {
            Err(e) => {
                r = Reader(&[]);
                return Some(Err(e));
            }
            Ok(None) => return None,
            Ok(Some((row::VALUES, Field::Len(b)))) => return Some(value(b)),
            Ok(Some((row::VALUES, _))) => {
                return Some(Err(ViewError("a row value is not a message")))
            }
            Ok(Some(_)) => continue,
        }
    })
}

/// A `Value` message.
pub fn value(body: &[u8]) -> Result<ValueRef<'_>, ViewError> {
    let mut r = Reader(body);
    let mut v = ValueRef::Absent;
    while let Some((tag, f)) = r.field()? {
        v = match (tag, f) {
            (val::NULL, Field::Varint(_)) => ValueRef::Null,
            (val::INT, Field::Varint(x)) => ValueRef::Int(unzigzag(x)),
            (val::UINT, Field::Varint(x)) => ValueRef::Uint(x),
            (val::FLOAT32, Field::Fixed32(b)) => ValueRef::Float32(f32::from_le_bytes(b)),
            (val::FLOAT64, Field::Fixed64(b)) => ValueRef::Float64(f64::from_le_bytes(b)),
            (val::DECIMAL, Field::Len(b)) => ValueRef::Decimal(utf8(b)?),
            (val::TEXT, Field::Len(b)) => ValueRef::Text(utf8(b)?),
            (val::BYTES, Field::Len(b)) => ValueRef::Bytes(b),
            (val::BITS, Field::Varint(x)) => ValueRef::Bits(x),
            (val::ENUM_VALUE, Field::Len(b)) => {
                let (mut index, mut label) = (0, "");
                let mut m = Reader(b);
                while let Some(f) = m.field()? {
                    match f {
                        (enum_value::INDEX, Field::Varint(x)) => index = x as u32,
                        (enum_value::LABEL, Field::Len(b)) => label = utf8(b)?,
                        (enum_value::INDEX | enum_value::LABEL, _) => return Err(WIRE),
                        _ => {}
                    }
                }
                ValueRef::Enum { index, label }
            }
            (val::SET_VALUE, Field::Len(b)) => {
                let mut bits = 0;
                let mut m = Reader(b);
                while let Some(f) = m.field()? {
                    match f {
                        (set_value::BITS, Field::Varint(x)) => bits = x,
                        (set_value::MEMBERS, Field::Len(b)) => {
                            utf8(b)?;
                        }
                        (set_value::BITS | set_value::MEMBERS, _) => return Err(WIRE),
                        _ => {}
                    }
                }
                ValueRef::Set {
                    bits,
                    members: Members::Encoded(b),
                }
            }
            (val::DATE, Field::Len(b)) => ValueRef::Date(message(b)?),
            (val::TIME_MICROS, Field::Varint(x)) => ValueRef::TimeMicros(unzigzag(x)),
            (val::DATETIME, Field::Len(b)) => ValueRef::Datetime(message(b)?),
            (val::TIMESTAMP_MICROS, Field::Varint(x)) => ValueRef::TimestampMicros(unzigzag(x)),
            (val::GEOMETRY, Field::Len(b)) => {
                let (mut srid, mut wkb) = (0, &[][..]);
                let mut m = Reader(b);
                while let Some(f) = m.field()? {
                    match f {
                        (geometry::SRID, Field::Varint(x)) => srid = x as u32,
                        (geometry::WKB, Field::Len(b)) => wkb = b,
                        (geometry::SRID | geometry::WKB, _) => return Err(WIRE),
                        _ => {}
                    }
                }
                ValueRef::Geometry { srid, wkb }
            }
            (val::JSON, Field::Len(b)) => ValueRef::Json(utf8(b)?),
            (val::BSON, Field::Len(b)) => ValueRef::Bson(b),
            (val::RAW_TEXT, Field::Len(b)) => {
                let (mut data, mut charset) = (&[][..], "");
                let mut m = Reader(b);
                while let Some(f) = m.field()? {
                    match f {
                        (raw_text::DATA, Field::Len(b)) => data = b,
                        (raw_text::CHARSET, Field::Len(b)) => charset = utf8(b)?,
                        (raw_text::DATA | raw_text::CHARSET, _) => return Err(WIRE),
                        _ => {}
                    }
                }
                ValueRef::RawText { data, charset }
            }
            (val::NULL..=val::RAW_TEXT, _) => return Err(WIRE),
            _ => v, // an unknown field
        };
    }
    Ok(v)
}

const WIRE: ViewError = ViewError("a value's field has the wrong wire type");

fn utf8(b: &[u8]) -> Result<&str, ViewError> {
    std::str::from_utf8(b).map_err(|_| ViewError("a string is not valid UTF-8"))
}

fn message<M: prost::Message + Default>(b: &[u8]) -> Result<M, ViewError> {
    M::decode(b).map_err(|_| ViewError("a nested value does not decode"))
}

fn unzigzag(x: u64) -> i64 {
    ((x >> 1) as i64) ^ -((x & 1) as i64)
}

/// One field's payload.
enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Len(&'a [u8]),
    Fixed32([u8; 4]),
}

/// Reads fields off a message's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    #[inline]
    fn varint(&mut self) -> Result<u64, ViewError> {
        // Most varints here (keys, lengths, small values) are one byte.
        if let Some((&b, rest)) = self.0.split_first() {
            if b < 0x80 {
                self.0 = rest;
                return Ok(u64::from(b));
            }
        }
        self.varint_long()
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Result<u64, ViewError> {
        let mut v = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            if i == 9 && b > 1 {
                break; // more than 64 bits
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.0 = &self.0[i + 1..];
                return Ok(v);
            }
        }
        Err(ViewError("a varint is cut off or too long"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ViewError> {
        if self.0.len() < n {
            return Err(ViewError("a field is cut off"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    /// The next field (tag and payload), or `None` at the end. Groups are refused.
    #[inline]
    fn field(&mut self) -> Result<Option<(u32, Field<'a>)>, ViewError> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let tag = u32::try_from(key >> 3).map_err(|_| ViewError("a field number is too large"))?;
        let f = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Fixed64(self.take(8)?.try_into().expect("8 bytes")),
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| ViewError("a field is cut off"))?;
                Field::Len(self.take(n)?)
            }
            5 => Field::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            _ => return Err(ViewError("an unsupported wire type")),
        };
        if tag == 0 {
            return Err(ViewError("field number 0"));
        }
        Ok(Some((tag, f)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value;
    use prost::Message;

    #[test]
    fn every_kind_reads_as_its_message_says() {
        let mut all: Vec<Value> = crate::tests::every_value_kind()
            .into_iter()
            .map(value::of)
            .collect();
        all.push(Value { kind: None });
        let row = v1::Row {
            values: all.clone(),
        };
        let bytes = row.encode_to_vec();
        let read: Vec<ValueRef<'_>> = values(&bytes).collect::<Result<_, _>>().unwrap();
        let want: Vec<ValueRef<'_>> = all.iter().map(ValueRef::from).collect();
        assert_eq!(read, want);
    }

    #[test]
    fn a_row_event_reads_the_fields_of_an_event() {
        let mut e = crate::tests::sample_event();
        e.schema = Some(v1::TableSchema {
            schema_id: e.schema_id,
            ..Default::default()
        });
        e.commit_time_micros = -5; // negative int64: ten varint bytes
        let bytes = e.encode_to_vec();
        let r = RowEvent::parse(&bytes).unwrap();
        assert_eq!(r.contract, e.contract);
        assert_eq!(r.op(), e.op());
        assert_eq!(
            (r.database, r.table),
            (e.database.as_str(), e.table.as_str())
        );
        assert_eq!(r.version, e.version);
        assert_eq!(r.commit_time_micros, e.commit_time_micros);
        assert_eq!(r.schema_id, e.schema_id);
        let decode = |b: Option<&[u8]>| b.map(|b| v1::Row::decode(b).unwrap());
        assert_eq!(
            r.schema.map(|b| v1::TableSchema::decode(b).unwrap()),
            e.schema
        );
        assert_eq!(decode(r.before), e.before);
        assert_eq!(decode(r.after), e.after);
        assert!(r.after.is_some(), "the sample has an after image");
        assert_eq!(
            r.transaction_index,
            e.transaction.as_ref().map_or(0, |t| t.index)
        );
        let with_index = v1::ChangeEvent {
            transaction: Some(v1::Transaction {
                id: "snapshot x".into(),
                index: 300,
                last: true,
            }),
            ..Default::default()
        };
        let bytes = with_index.encode_to_vec();
        assert_eq!(RowEvent::parse(&bytes).unwrap().transaction_index, 300);
        let e = v1::ChangeEvent {
            op: 99,
            ..Default::default()
        };
        let bytes = e.encode_to_vec();
        let r = RowEvent::parse(&bytes).unwrap();
        assert_eq!(
            (r.op(), r.before, r.schema),
            (v1::Op::Unspecified, None, None)
        );
        // The database name with a varint's wire type.
        assert!(RowEvent::parse(&[4 << 3, 1]).is_err());
    }

    #[test]
    fn a_mongo_change_reads_as_its_message_says() {
        let change = v1::MongoChange {
            document_key: vec![5, 0, 0, 0, 0],
            full_document: vec![12, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0, 0, 0],
            full_document_before_change: vec![9],
            update_description: Some(v1::UpdateDescription {
                updated_fields: vec![5, 0, 0, 0, 0],
                removed_fields: vec!["gone".into()],
                truncated_arrays: vec![],
            }),
            operation_type: "update".into(),
            lsid: vec![1, 2],
            txn_number: 7,
        };
        let e = v1::ChangeEvent {
            op: v1::Op::Update as i32,
            database: "shop".into(),
            table: "orders".into(),
            mongo: Some(change.clone()),
            ..crate::tests::sample_event()
        };
        let bytes = e.encode_to_vec();
        let r = RowEvent::parse(&bytes).unwrap();
        assert_eq!(
            (r.database, r.table, r.op()),
            ("shop", "orders", v1::Op::Update)
        );
        let m = MongoChangeRef::parse(r.mongo.expect("the event's MongoDB part")).unwrap();
        assert_eq!(m.document_key, &change.document_key[..]);
        assert_eq!(m.full_document, &change.full_document[..]);
        assert_eq!(m.operation_type, "update");
        assert_eq!(
            m.update_description
                .map(|b| v1::UpdateDescription::decode(b).unwrap()),
            change.update_description
        );
        // Absent parts read as empty, as prost reads them.
        let m = MongoChangeRef::parse(&[]).unwrap();
        assert_eq!(m, MongoChangeRef::default());
        assert_eq!(RowEvent::parse(&[]).unwrap().mongo, None);
        // The full document with a varint's wire type; the operation type not UTF-8.
        assert!(MongoChangeRef::parse(&[2 << 3, 1]).is_err());
        assert!(MongoChangeRef::parse(&[(5 << 3) | 2, 1, 0xff]).is_err());
        // The MongoDB part (field 17: a two-byte key) with a varint's wire type.
        assert_eq!(
            RowEvent::parse(&[0x88, 0x01, 0x01]).unwrap_err(),
            ViewError("an event's field has the wrong wire type")
        );
    }

    #[test]
    fn broken_bytes_are_refused_not_misread() {
        let text = value::of(Kind::Text("abc".into())).encode_to_vec();
        // Cut off.
        assert!(value(&text[..text.len() - 1]).is_err());
        // Not UTF-8.
        let mut bad = text.clone();
        *bad.last_mut().unwrap() = 0xff;
        assert!(value(&bad).is_err());
        // The text field with a varint's wire type.
        assert!(value(&[7 << 3, 1]).is_err());
        // A varint that never ends, and one of more than 64 bits.
        assert!(value(&[2 << 3, 0x80, 0x80]).is_err());
        let mut long = vec![2 << 3];
        long.extend([0xff; 9]);
        long.push(0x02);
        assert!(value(&long).is_err());
        // A field number past 2^32 - 1 (it would alias field 14 if cut to 32 bits).
        let mut key = Vec::new();
        crate::wire::put_varint((1u64 << 35 | 14) << 3 | 2, &mut key);
        key.push(0);
        assert!(RowEvent::parse(&key).is_err());
        // A row whose value is not a message.
        assert!(values(&[1 << 3, 5]).next().unwrap().is_err());
        // Unknown fields are skipped.
        // (Field 100 as a varint: key bytes 0xa0 0x06.)
        assert_eq!(value(&[0xa0, 0x06, 1, 2 << 3, 4]), Ok(ValueRef::Int(2)));
    }
}
