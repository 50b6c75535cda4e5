//! The protobuf wire format, written straight into a byte buffer: for stages that produce the
//! contract's messages from their source bytes without building the message structs first.
//!
//! Everything here writes exactly what prost writes for the same message (proto3: fields in
//! tag order, scalar fields at their default value omitted, oneof members always written), so
//! the bytes are interchangeable with `Message::encode`; the capture's tests check that by
//! decoding and re-encoding.

/// Append `v` as a base-128 varint.
#[inline]
pub fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The length of `v` as a varint.
#[inline]
pub fn varint_len(v: u64) -> usize {
    // 1 byte per started 7 bits; 0 takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// `sint64`'s zigzag mapping.
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

// Field keys come from the `.proto`: [`crate::tags`] has every field's, of the right length.

/// Append a length-delimited field: `key` (already encoded), the body's length, then the body
/// `body` writes. The length is patched in afterwards; a body of 128 bytes or more is moved up by
/// the extra length bytes. Returns where the body lies in `out`.
#[inline]
pub fn put_delimited<E>(
    key: &[u8],
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<std::ops::Range<usize>, E> {
    out.extend_from_slice(key);
    out.push(0);
    let start = out.len();
    body(out)?;
    Ok(patch_len(out, start))
}

/// Write the length of the body that runs from `start` to the end of `out` into the one byte
/// reserved before it (widening it when the body is 128 bytes or more). Returns the body's
/// range.
#[inline]
pub fn patch_len(out: &mut Vec<u8>, start: usize) -> std::ops::Range<usize> {
    let end = out.len();
    let len = end - start;
    if len < 0x80 {
        out[start - 1] = len as u8;
        return start..end;
    }
    widen_len(out, start)
}

#[cold]
fn widen_len(out: &mut Vec<u8>, start: usize) -> std::ops::Range<usize> {
    let end = out.len();
    let len = end - start;
    let extra = varint_len(len as u64) - 1;
    out.resize(end + extra, 0);
    out.copy_within(start..end, start + extra);
    let mut v = len as u64;
    let mut i = start - 1;
    while v >= 0x80 {
        out[i] = v as u8 | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    start + extra..end + extra
}

/// Append a length-delimited field whose body is `bytes`.
#[inline]
pub fn put_bytes(key: &[u8], bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(key);
    put_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Append a varint field unless it is 0 (a proto3 scalar outside a oneof).
#[inline]
pub fn put_uint_field(key: u8, v: u64, out: &mut Vec<u8>) {
    if v != 0 {
        out.push(key);
        put_varint(v, out);
    }
}

/// Append an `int32` field unless it is 0: negative values take ten bytes, as in protobuf.
#[inline]
pub fn put_int32_field(key: u8, v: i32, out: &mut Vec<u8>) {
    put_uint_field(key, i64::from(v) as u64, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn varints_match_prost() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut ours = Vec::new();
            put_varint(v, &mut ours);
            let mut theirs = Vec::new();
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs, "{v}");
            assert_eq!(varint_len(v), theirs.len(), "{v}");
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            let mut theirs = Vec::new();
            prost::encoding::sint64::encode(1, &v, &mut theirs);
            // Field 1 as a varint: the key `Value.null` has.
            let mut ours = crate::tags::value::NULL_KEY.to_vec();
            put_varint(zigzag(v), &mut ours);
            assert_eq!(ours, theirs, "{v}");
        }
    }

    #[test]
    fn delimited_bodies_of_every_length_class() {
        // Short bodies keep the reserved byte; longer ones are moved up by the extra bytes.
        for n in [0usize, 1, 127, 128, 200, 16_383, 16_384, 70_000] {
            let text = "x".repeat(n);
            let ours = {
                let mut out = vec![0xAA];
                let range = put_delimited::<()>(&crate::tags::value::TEXT_KEY, &mut out, |o| {
                    o.extend_from_slice(text.as_bytes());
                    Ok(())
                })
                .unwrap();
                assert_eq!(&out[range], text.as_bytes());
                out
            };
            let value = crate::v1::Value {
                kind: Some(crate::v1::value::Kind::Text(text)),
            };
            let mut theirs = vec![0xAA];
            value.encode_raw(&mut theirs);
            assert_eq!(ours, theirs, "{n}");
        }
    }
}
