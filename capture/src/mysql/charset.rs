//! Text columns to UTF-8, from their MySQL character set.
//!
//! MySQL's `latin1` is Windows-1252 with the five unassigned bytes mapped to the C1 controls,
//! which is exactly the WHATWG `windows-1252` decoder of encoding_rs. Bytes that are not valid
//! in the column's charset (or a charset with no decoder here) are kept as `RawText`: bytes
//! plus charset, never dropped or replaced.

use encoding_rs::Encoding;
use sluice_proto::v1::{value::Kind, RawText};

/// The decoder of a MySQL charset; `None` for UTF-8 family (validated directly) and unknown
/// charsets.
fn encoding(charset: &str) -> Option<&'static Encoding> {
    Some(match charset {
        "latin1" => encoding_rs::WINDOWS_1252,
        "latin2" => encoding_rs::ISO_8859_2,
        "latin5" => encoding_rs::WINDOWS_1254,
        "latin7" => encoding_rs::ISO_8859_13,
        "cp1250" => encoding_rs::WINDOWS_1250,
        "cp1251" => encoding_rs::WINDOWS_1251,
        "cp1256" => encoding_rs::WINDOWS_1256,
        "cp1257" => encoding_rs::WINDOWS_1257,
        "cp866" => encoding_rs::IBM866,
        "greek" => encoding_rs::ISO_8859_7,
        "hebrew" => encoding_rs::ISO_8859_8,
        "koi8r" => encoding_rs::KOI8_R,
        "koi8u" => encoding_rs::KOI8_U,
        "gbk" => encoding_rs::GBK,
        "gb2312" => encoding_rs::GBK,
        "gb18030" => encoding_rs::GB18030,
        "big5" => encoding_rs::BIG5,
        "sjis" | "cp932" => encoding_rs::SHIFT_JIS,
        "ujis" | "eucjpms" => encoding_rs::EUC_JP,
        "euckr" => encoding_rs::EUC_KR,
        "ucs2" | "utf16" => encoding_rs::UTF_16BE,
        "utf16le" => encoding_rs::UTF_16LE,
        _ => return None,
    })
}

/// Whether text in `charset` is UTF-8 already (validated, not converted).
pub fn is_utf8(charset: &str) -> bool {
    matches!(charset, "utf8mb4" | "utf8mb3" | "utf8" | "ascii" | "")
}

/// The contract value of a text column's bytes.
pub fn to_text(bytes: Vec<u8>, charset: &str) -> Kind {
    match charset {
        c if is_utf8(c) => match String::from_utf8(bytes) {
            Ok(s) => Kind::Text(s),
            Err(e) => raw(e.into_bytes(), charset),
        },
        other => match encoding(other) {
            Some(enc) => match enc.decode_without_bom_handling_and_without_replacement(&bytes) {
                Some(text) => Kind::Text(text.into_owned()),
                None => raw(bytes, charset),
            },
            None => raw(bytes, charset),
        },
    }
}

fn raw(data: Vec<u8>, charset: &str) -> Kind {
    Kind::RawText(RawText {
        data,
        charset: charset.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_is_mysqls_cp1252() {
        assert_eq!(
            to_text(vec![0x80, b' ', 0xe9, 0x81], "latin1"),
            Kind::Text("\u{20ac} \u{e9}\u{81}".into())
        );
    }

    #[test]
    fn invalid_utf8_is_kept_as_bytes() {
        assert_eq!(
            to_text(vec![0xff, 0x00], "utf8mb4"),
            Kind::RawText(RawText {
                data: vec![0xff, 0x00],
                charset: "utf8mb4".into()
            })
        );
        assert_eq!(
            to_text("😀".as_bytes().to_vec(), "utf8mb4"),
            Kind::Text("😀".into())
        );
    }

    #[test]
    fn unknown_charsets_are_kept_as_bytes() {
        assert!(matches!(to_text(vec![1, 2], "armscii8"), Kind::RawText(_)));
    }
}
