//! Row images of binlog rows events, decoded straight from their bytes into the contract's
//! encoded values: each image becomes the bytes of a `Row` message without a `Value` being built
//! (an [`Image`]), and the event and its Kafka key are put together from those bytes.
//!
//! mysql_common decodes rows into its own `Value`, losing what the contract must keep: the
//! zero YEAR becomes 1900, negative TIME(1)/TIME(2) come out wrong, TIMESTAMP and DECIMAL arrive
//! as text, signedness is unknown without `binlog_row_metadata=FULL`. So the capture reads the
//! row bytes itself, with the storage formats of MySQL's `Field_*::pack` / `my_*_from_binary`,
//! using the table map for storage metadata and the table's [`TableSchema`] for what the binlog
//! does not say (signedness, charset, ENUM/SET members, BINARY padding).
//!
//! A [`TableDecoder`] is built once per table map (table id + schema) and decodes every row of
//! the events that follow it.
//!
//! This module holds the row images; each column's part is in the children: `layout` (how a
//! column is stored in the binlog, from the table map's type and metadata), `column` (one
//! column's bytes to its encoded `Value`) and `formats` (MySQL's storage formats: integers,
//! temporal types, DECIMAL, binary JSON).

mod column;
mod formats;
mod layout;

use std::ops::Range;

use mysql_async::binlog::events::{RowsEventData, TableMapEvent};
use prost::Message;
use sluice_proto::tags::{event_key, row, value};
use sluice_proto::v1::{self, TableSchema};
use sluice_proto::wire::{patch_len, put_bytes};

use column::ColumnDecoder;
use formats::take;
use formats::ColumnError::{Invalid, Short};
use layout::{compatible, layout};

/// Why a row could not be decoded. Always definite: the same bytes fail the same way.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(
        "{table}: the binlog has {binlog} columns, the schema {schema}: the schema changed \
         without a DDL the capture saw"
    )]
    ColumnCount {
        table: String,
        binlog: usize,
        schema: usize,
    },
    #[error("{table}.{column}: binlog column type {ty} is not supported")]
    Unsupported {
        table: String,
        column: String,
        ty: u8,
    },
    #[error("{table}.{column}: row data ends early (needs {needed} more bytes)")]
    Truncated {
        table: String,
        column: String,
        needed: usize,
    },
    #[error("{table}.{column}: {reason}")]
    Bad {
        table: String,
        column: String,
        reason: String,
    },
}

/// Decodes the rows of one table, as described by one table map and one schema.
#[derive(Debug, Clone)]
pub struct TableDecoder {
    table: String,
    columns: Vec<ColumnDecoder>,
}

/// One row change: the before image (update, delete) and the after image (insert, update).
pub type RowChange = (Option<v1::Row>, Option<v1::Row>);

/// One row image, encoded: the bytes of a `Row` message (every column one `values` entry) and
/// where each column's `Value` message lies in them. Reused from row to row.
#[derive(Debug, Default)]
pub struct Image {
    bytes: Vec<u8>,
    values: Vec<Range<usize>>,
}

impl Image {
    /// The `Row` message.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The `Value` message of column `i` (empty when the image does not hold the column).
    pub fn value(&self, i: usize) -> &[u8] {
        &self.bytes[self.values[i].clone()]
    }

    /// Column `i`'s value, decoded (for messages; the hot path copies the bytes instead).
    pub fn value_of(&self, i: u32) -> sluice_proto::v1::Value {
        prost::Message::decode(self.value(i as usize)).unwrap_or_default()
    }

    /// The `Row` message of the `key` columns' values, into `out` (cleared first).
    pub fn key_row(&self, key: &[u32], out: &mut Vec<u8>) {
        out.clear();
        for &i in key {
            put_bytes(&row::VALUES_KEY, self.value(i as usize), out);
        }
    }

    /// The Kafka record key of this image: `prefix` (from `sluice_proto::event_key_prefix`)
    /// then the `key` columns' values, the bytes of `sluice_proto::append_event_key`.
    pub fn event_key(&self, prefix: &[u8], key: &[u32], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(prefix);
        for &i in key {
            put_bytes(&event_key::KEY_KEY, self.value(i as usize), out);
        }
    }

    /// Whether the `key` columns hold the same values here and in `other`.
    pub fn same_key(&self, other: &Image, key: &[u32]) -> bool {
        key.iter()
            .all(|&i| self.value(i as usize) == other.value(i as usize))
    }

    /// The image as a message.
    pub fn to_row(&self) -> v1::Row {
        v1::Row::decode(self.bytes.as_slice())
            .expect("an image holds only valid UTF-8 where the contract has strings")
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.values.clear();
    }
}

/// The rows of one rows event, decoded one at a time ([`Rows::next_into`]).
pub struct Rows<'a> {
    decoder: &'a TableDecoder,
    data: &'a [u8],
    before: Option<Vec<bool>>,
    after: Option<Vec<bool>>,
}

impl Rows<'_> {
    /// Which image of this event lacks columns (`"before"` or `"after"`), if one does: the
    /// writing session's `binlog_row_image` was MINIMAL or NOBLOB, and the columns left out
    /// would read as absent.
    pub fn partial_image(&self) -> Option<&'static str> {
        let partial = |p: &Option<Vec<bool>>| p.as_ref().is_some_and(|p| p.iter().any(|c| !c));
        if partial(&self.before) {
            Some("before")
        } else if partial(&self.after) {
            Some("after")
        } else {
            None
        }
    }

    /// Decode the next row change into `before` and `after`: which of the two images it has,
    /// or `None` after the last row.
    pub fn next_into(
        &mut self,
        before: &mut Image,
        after: &mut Image,
    ) -> Result<Option<(bool, bool)>, DecodeError> {
        if self.data.is_empty() {
            return Ok(None);
        }
        if let Some(present) = &self.before {
            self.decoder.decode_image(&mut self.data, present, before)?;
        }
        if let Some(present) = &self.after {
            self.decoder.decode_image(&mut self.data, present, after)?;
        }
        Ok(Some((self.before.is_some(), self.after.is_some())))
    }
}

impl TableDecoder {
    pub fn new(tme: &TableMapEvent<'_>, schema: &TableSchema) -> Result<Self, DecodeError> {
        let table = format!("{}.{}", schema.database, schema.table);
        let n = tme.columns_count() as usize;
        if n != schema.columns.len() {
            return Err(DecodeError::ColumnCount {
                table,
                binlog: n,
                schema: schema.columns.len(),
            });
        }
        let mut columns = Vec::with_capacity(n);
        for (i, col) in schema.columns.iter().enumerate() {
            let raw = tme.get_raw_column_type(i).ok().flatten();
            let meta = tme.get_column_metadata(i).unwrap_or(&[]);
            let unsupported = |ty: u8| DecodeError::Unsupported {
                table: table.clone(),
                column: col.name.clone(),
                ty,
            };
            let raw = raw.ok_or_else(|| unsupported(0))?;
            let layout = layout(raw, meta, col).ok_or_else(|| unsupported(raw as u8))?;
            if !compatible(&layout, col.r#type()) {
                return Err(DecodeError::Bad {
                    table: table.clone(),
                    column: col.name.clone(),
                    reason: format!(
                        "the binlog stores it as {layout:?}, the schema says {:?} ({}): the \
                         table changed after these rows were written. With \
                         binlog_row_metadata=FULL the binlog carries its own column metadata",
                        col.r#type(),
                        col.sql_type
                    ),
                });
            }
            columns.push(ColumnDecoder::new(col, layout));
        }
        Ok(Self { table, columns })
    }

    /// The rows of a rows event, to be decoded one by one.
    pub fn rows<'a>(&'a self, ev: &'a RowsEventData<'_>) -> Rows<'a> {
        Rows {
            decoder: self,
            data: ev.rows_data(),
            before: ev
                .columns_before_image()
                .map(|b| b.iter().by_vals().collect()),
            after: ev
                .columns_after_image()
                .map(|b| b.iter().by_vals().collect()),
        }
    }

    /// Decode every row of a rows event into messages.
    pub fn decode_event(&self, ev: &RowsEventData<'_>) -> Result<Vec<RowChange>, DecodeError> {
        let mut rows = self.rows(ev);
        let (mut before, mut after) = (Image::default(), Image::default());
        let mut changes = Vec::new();
        while let Some((b, a)) = rows.next_into(&mut before, &mut after)? {
            changes.push((b.then(|| before.to_row()), a.then(|| after.to_row())));
        }
        Ok(changes)
    }

    /// Decode one image: `present` says which columns it holds (the event's column bitmap).
    fn decode_image(
        &self,
        data: &mut &[u8],
        present: &[bool],
        image: &mut Image,
    ) -> Result<(), DecodeError> {
        image.clear();
        let n_present = present.iter().filter(|p| **p).count();
        let bitmap = take(data, n_present.div_ceil(8)).ok_or_else(|| DecodeError::Truncated {
            table: self.table.clone(),
            column: "(null bitmap)".into(),
            needed: n_present.div_ceil(8),
        })?;
        let out = &mut image.bytes;
        let mut k = 0; // index among present columns
        for (i, col) in self.columns.iter().enumerate() {
            // Each column is one `values` entry holding a `Value` message (its length patched
            // in after it).
            out.extend_from_slice(&row::VALUES_KEY);
            out.push(0);
            let start = out.len();
            if !present.get(i).copied().unwrap_or(false) {
                // An empty `Value`: the image does not hold the column.
                image.values.push(start..start);
                continue;
            }
            let is_null = bitmap[k / 8] & (1 << (k % 8)) != 0;
            k += 1;
            if is_null {
                out.extend_from_slice(&value::NULL_KEY);
                out.push(1); // null = true
            } else {
                col.encode(data, out).map_err(|e| match e {
                    Short(needed) => DecodeError::Truncated {
                        table: self.table.clone(),
                        column: col.name.clone(),
                        needed,
                    },
                    Invalid(reason) => DecodeError::Bad {
                        table: self.table.clone(),
                        column: col.name.clone(),
                        reason,
                    },
                })?;
            }
            image.values.push(patch_len(out, start));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::value::Kind;

    #[test]
    fn an_images_key_is_the_keys_of_its_row() {
        // An image of three columns, the key being the third and the first (a long text, so
        // that its length prefix widens).
        let row = v1::Row {
            values: vec![
                sluice_proto::value::text("k".repeat(200)),
                sluice_proto::value::null(),
                sluice_proto::value::of(Kind::Int(-5)),
            ],
        };
        let mut image = Image {
            bytes: row.encode_to_vec(),
            values: Vec::new(),
        };
        // Where each value lies, read back from the bytes.
        let mut at = 0;
        while at < image.bytes.len() {
            let (len, n) = {
                let mut b = &image.bytes[at + 1..];
                let before = b.len();
                let len = prost::encoding::decode_varint(&mut b).unwrap() as usize;
                (len, before - b.len())
            };
            let start = at + 1 + n;
            image.values.push(start..start + len);
            at = start + len;
        }
        assert_eq!(image.to_row(), row);
        let key = [2u32, 0];
        let key_values = vec![row.values[2].clone(), row.values[0].clone()];
        let mut got = Vec::new();
        image.key_row(&key, &mut got);
        assert_eq!(
            got,
            v1::Row {
                values: key_values.clone()
            }
            .encode_to_vec()
        );
        let prefix = sluice_proto::event_key_prefix("db", "t");
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        image.event_key(&prefix, &key, &mut ours);
        sluice_proto::append_event_key(&prefix, &key_values, &mut theirs);
        assert_eq!(ours, theirs);
        assert!(image.same_key(&image, &key));
        let mut other = Image {
            bytes: image.bytes.clone(),
            values: image.values.clone(),
        };
        let last = other.values[2].end - 1;
        other.bytes[last] ^= 1; // -5 becomes another number
        assert!(!image.same_key(&other, &key));
        assert!(image.same_key(&other, &[0]));
    }
}
