//! Text columns to UTF-8, from their MySQL character set, exactly as the server's own
//! `CONVERT(col USING utf8mb4)` gives it.
//!
//! The mappings differ between tables of the same name (MySQL's `sjis` maps 0x8160 to WAVE
//! DASH U+301C, the WHATWG Shift_JIS to FULLWIDTH TILDE U+FF5E; `cp850`, `tis620`, `macroman`
//! have no WHATWG decoder at all), so the capture asks the server: when a table with a column
//! in a charset is first loaded ([`load`], from `schema::load`), every character of that
//! charset (each byte; for multi-byte charsets every two- and three-byte sequence the server
//! takes for one character) is converted by the server once, and both the binlog and the
//! snapshot path decode through that table. UCS-2, UTF-16 and UTF-32 are decoded here (they
//! are Unicode already). A charset the server was not asked about (a table seen only through
//! the binlog's metadata) falls back to encoding_rs's decoder of the nearest WHATWG encoding.
//! Bytes that are not valid in the column's charset are kept as `RawText`: bytes plus charset,
//! never dropped or replaced.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use encoding_rs::Encoding;
use mysql_async::prelude::Queryable;
use sluice_proto::v1::{value::Kind, RawText};

/// One charset's characters as the server converts them: `single[b]` for one-byte
/// characters, `multi` for two- and three-byte ones (the bytes, big-endian, as the key).
#[derive(Debug, Default)]
pub struct Table {
    single: Vec<Option<Box<str>>>,
    multi: HashMap<u32, Box<str>>,
}

impl Table {
    /// `bytes` as text, or `None` when some sequence is no character of the charset.
    fn decode(&self, bytes: &[u8]) -> Option<String> {
        let mut out = String::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if let Some(Some(c)) = self.single.get(bytes[i] as usize) {
                out.push_str(c);
                i += 1;
                continue;
            }
            let mut key = u32::from(bytes[i]);
            let mut found = false;
            for len in 2..=3 {
                let Some(b) = bytes.get(i + len - 1) else {
                    break;
                };
                key = key << 8 | u32::from(*b);
                if let Some(c) = self.multi.get(&key) {
                    out.push_str(c);
                    i += len;
                    found = true;
                    break;
                }
            }
            if !found {
                return None;
            }
        }
        Some(out)
    }
}

/// The charsets loaded from the server, by name.
static TABLES: LazyLock<RwLock<HashMap<String, Arc<Table>>>> = LazyLock::new(Default::default);

fn loaded(charset: &str) -> Option<Arc<Table>> {
    TABLES.read().ok()?.get(charset).cloned()
}

/// Charsets decoded without the server: UTF-8 and the Unicode encodings.
fn needs_table(charset: &str) -> bool {
    !(is_utf8(charset)
        || matches!(
            charset,
            "binary" | "ucs2" | "utf16" | "utf16le" | "utf32" | "gb18030"
        ))
}

/// Ask the server for the characters of each of `charsets` not loaded yet.
pub async fn load<'a>(
    conn: &mut mysql_async::Conn,
    charsets: impl IntoIterator<Item = &'a str>,
) -> Result<(), mysql_async::Error> {
    for cs in charsets {
        if !needs_table(cs) || loaded(cs).is_some() {
            continue;
        }
        // A name from information_schema: letters and digits only, so safe in the SQL.
        if !cs.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        let maxlen: Option<u32> = conn
            .exec_first(
                "SELECT MAXLEN FROM information_schema.CHARACTER_SETS WHERE CHARACTER_SET_NAME = ?",
                (cs,),
            )
            .await?;
        let Some(maxlen) = maxlen else { continue };
        // Candidates: every byte; for multi-byte charsets every two-byte sequence with a lead
        // byte from 0x80, and for three-byte ones (ujis, eucjpms: 0x8F + two bytes) those.
        // Two 256-row sequences joined: no recursion deeper than MySQL's default 1000.
        let mut candidates = vec!["SELECT lo.n AS c FROM b lo".to_string()];
        if maxlen >= 2 {
            candidates.push("SELECT hi.n * 256 + lo.n FROM b hi, b lo WHERE hi.n >= 128".into());
        }
        if maxlen >= 3 {
            candidates.push(
                "SELECT 0x8F0000 + hi.n * 256 + lo.n FROM b hi, b lo WHERE hi.n >= 128 AND lo.n >= 128"
                    .into(),
            );
        }
        let union = candidates.join(" UNION ALL ");
        let sql = format!(
            "WITH RECURSIVE b(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM b WHERE n < 255),              c(c) AS ({union})              SELECT c, HEX(CONVERT(CHAR(c USING {cs}) USING utf8mb4)) FROM c              WHERE CHAR(c USING {cs}) IS NOT NULL AND CHAR_LENGTH(CHAR(c USING {cs})) = 1              AND LENGTH(CHAR(c USING {cs})) = IF(c < 256, 1, IF(c < 65536, 2, 3))"
        );
        let rows: Vec<(u32, String)> = conn.query(sql).await?;
        let mut table = Table {
            single: vec![None; 256],
            multi: HashMap::new(),
        };
        for (c, hex) in rows {
            let Some(text) = unhex_utf8(&hex) else {
                continue;
            };
            if c < 256 {
                table.single[c as usize] = Some(text.into());
            } else {
                table.multi.insert(c, text.into());
            }
        }
        tracing::debug!(
            charset = cs,
            single = table.single.iter().flatten().count(),
            multi = table.multi.len(),
            "charset loaded from the server"
        );
        if let Ok(mut t) = TABLES.write() {
            t.insert(cs.to_string(), Arc::new(table));
        }
    }
    Ok(())
}

fn unhex_utf8(hex: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// UCS-2, UTF-16 (big- or little-endian) and UTF-32 (big-endian), as MySQL stores them.
fn unicode(bytes: &[u8], charset: &str) -> Option<Option<String>> {
    let units = |le: bool| {
        if !bytes.len().is_multiple_of(2) {
            return None;
        }
        Some(
            bytes
                .chunks(2)
                .map(|u| {
                    if le {
                        u16::from_le_bytes([u[0], u[1]])
                    } else {
                        u16::from_be_bytes([u[0], u[1]])
                    }
                })
                .collect::<Vec<u16>>(),
        )
    };
    Some(match charset {
        "ucs2" => units(false).and_then(|u| {
            u.iter()
                .map(|x| char::from_u32(u32::from(*x)))
                .collect::<Option<String>>()
        }),
        "utf16" | "utf16le" => units(charset == "utf16le")
            .and_then(|u| char::decode_utf16(u).collect::<Result<String, _>>().ok()),
        "utf32" => {
            if !bytes.len().is_multiple_of(4) {
                None
            } else {
                bytes
                    .chunks(4)
                    .map(|u| char::from_u32(u32::from_be_bytes([u[0], u[1], u[2], u[3]])))
                    .collect::<Option<String>>()
            }
        }
        _ => return None,
    })
}

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
        _ => return None,
    })
}

/// Whether text in `charset` is UTF-8 already (validated, not converted).
pub fn is_utf8(charset: &str) -> bool {
    matches!(charset, "utf8mb4" | "utf8mb3" | "utf8" | "")
}

/// The contract value of a text column's bytes.
pub fn to_text(bytes: Vec<u8>, charset: &str) -> Kind {
    match charset {
        c if is_utf8(c) => match String::from_utf8(bytes) {
            Ok(s) => Kind::Text(s),
            Err(e) => raw(e.into_bytes(), charset),
        },
        // ASCII is UTF-8 as long as no byte is past 0x7F (the server's table says what is).
        "ascii" if bytes.is_ascii() => Kind::Text(String::from_utf8(bytes).expect("ASCII")),
        other => {
            // One lookup of the server's table per value.
            let text = match (loaded(other), unicode(&bytes, other)) {
                (Some(table), _) => table.decode(&bytes),
                (None, Some(text)) => text,
                (None, None) => encoding(other).and_then(|enc| {
                    enc.decode_without_bom_handling_and_without_replacement(&bytes)
                        .map(|t| t.into_owned())
                }),
            };
            match text {
                Some(text) => Kind::Text(text),
                None => raw(bytes, charset),
            }
        }
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
    fn unicode_charsets_are_decoded_here() {
        assert_eq!(
            to_text(vec![0, 0, 0, 0x63, 0, 1, 0xf6, 0], "utf32"),
            Kind::Text("c\u{1f600}".into())
        );
        assert_eq!(
            to_text(vec![0xd8, 0x3d, 0xde, 0x00, 0, 0x41], "utf16"),
            Kind::Text("\u{1f600}A".into())
        );
        assert_eq!(
            to_text(vec![0x41, 0, 0xe9, 0], "utf16le"),
            Kind::Text("A\u{e9}".into())
        );
        assert_eq!(
            to_text(vec![0x30, 0x1c], "ucs2"),
            Kind::Text("\u{301c}".into())
        );
        // A lone surrogate, a code point past U+10FFFF, an odd length: kept as bytes.
        assert!(matches!(
            to_text(vec![0xd8, 0x3d], "utf16"),
            Kind::RawText(_)
        ));
        assert!(matches!(
            to_text(vec![0, 0x11, 0, 0], "utf32"),
            Kind::RawText(_)
        ));
        assert!(matches!(to_text(vec![0x41], "ucs2"), Kind::RawText(_)));
    }

    #[test]
    fn a_server_table_decodes_one_two_and_three_byte_characters() {
        let mut t = Table {
            single: vec![None; 256],
            multi: HashMap::new(),
        };
        t.single[b'a' as usize] = Some("a".into());
        t.single[0xa1] = Some("\u{ff61}".into());
        t.multi.insert(0x8160, "\u{301c}".into());
        t.multi.insert(0x8fa2b7, "\u{ff5e}".into());
        assert_eq!(
            t.decode(&[b'a', 0x81, 0x60, 0xa1, 0x8f, 0xa2, 0xb7])
                .as_deref(),
            Some("a\u{301c}\u{ff61}\u{ff5e}")
        );
        assert_eq!(t.decode(&[0x81]), None, "a lead byte alone");
        assert_eq!(t.decode(&[0x81, 0x61]), None, "no such pair");
        assert_eq!(unhex_utf8("E3809C").as_deref(), Some("\u{301c}"));
    }

    #[test]
    fn unknown_charsets_are_kept_as_bytes() {
        assert!(matches!(to_text(vec![1, 2], "armscii8"), Kind::RawText(_)));
    }
}
