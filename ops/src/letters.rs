//! A dead letter as `sluice dead-letters list` and `show` print it: a line, the whole of it,
//! or JSON.

use prost::Message as _;
use sluice_proto::v1::{value::Kind, EventKey};

use crate::events::time_text;
use crate::replay::DeadLetter;

/// Its key as text: the values of the row's key (`-` without one, `?` when it does not
/// decode).
pub fn key_text(d: &DeadLetter) -> String {
    let Some(k) = d.key.as_deref() else {
        return "-".into();
    };
    let Ok(k) = EventKey::decode(k) else {
        return "?".into();
    };
    if k.key.is_empty() {
        return "-".into();
    }
    k.key
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::Int(i)) | Some(Kind::TimeMicros(i)) | Some(Kind::TimestampMicros(i)) => {
                i.to_string()
            }
            Some(Kind::Uint(u)) | Some(Kind::Bits(u)) => u.to_string(),
            Some(Kind::Text(s)) | Some(Kind::Decimal(s)) | Some(Kind::Json(s)) => format!("{s:?}"),
            Some(Kind::Bytes(b)) => format!("0x{}", sluice_common::hex::encode(b)),
            Some(Kind::Bson(b)) => mongodb::bson::RawDocument::from_bytes(b)
                .ok()
                .and_then(|d| d.get("v").ok().flatten())
                .and_then(|v| mongodb::bson::Bson::try_from(v.to_raw_bson()).ok())
                .map(|v| v.to_string())
                .unwrap_or_else(|| "bson".into()),
            Some(Kind::Null(_)) | None => "NULL".into(),
            Some(other) => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A dead letter as `list --json` and `show --json` print it.
pub fn json(d: &DeadLetter) -> serde_json::Value {
    serde_json::json!({
        "partition": d.at.0,
        "offset": d.at.1,
        "time_ms": d.timestamp_ms,
        "table": d.event.table,
        "op": d.event.op_label(),
        "key": key_text(d),
        "kind": d.kind,
        "reason": d.reason,
        "source": format!("{}/{}@{}", d.topic, d.partition, d.offset),
        "replayed": d.replayed,
    })
}

/// Its table, or `?` when its bytes are no change event.
fn table(d: &DeadLetter) -> &str {
    if d.event.table.is_empty() {
        "?"
    } else {
        &d.event.table
    }
}

/// One line of `list`.
pub fn line(d: &DeadLetter) -> String {
    format!(
        "{}@{}  {}  {}  {} key={}  [{}] {}  (read at {}/{}@{}){}",
        d.at.0,
        d.at.1,
        time_text(d.timestamp_ms),
        table(d),
        d.event.op_label(),
        key_text(d),
        d.kind.as_deref().unwrap_or("-"),
        d.reason,
        d.topic,
        d.partition,
        d.offset,
        if d.replayed { "  replayed" } else { "" }
    )
}

/// `show`: the whole dead letter of topic `topic`, with its event as one line when it is a
/// change event.
pub fn text(d: &DeadLetter, topic: &str, event: Option<String>) -> String {
    let event = event.unwrap_or_else(|| format!("({} bytes, not a change event)", d.payload.len()));
    format!(
        "dead letter {}@{} of {topic}\n  written:  {}\n  read at:  {}/{}@{}\n  table:    {}\n  \
         key:      {}\n  reason:   [{}] {}\n  replayed: {}\n  event:    {event}\n",
        d.at.0,
        d.at.1,
        time_text(d.timestamp_ms),
        d.topic,
        d.partition,
        d.offset,
        table(d),
        key_text(d),
        d.kind.as_deref().unwrap_or("-"),
        d.reason,
        if d.replayed { "yes" } else { "no" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::EventInfo;
    use sluice_proto::v1::{self, Op};

    fn letter(key: Option<Vec<u8>>) -> DeadLetter {
        DeadLetter {
            at: (0, 7),
            topic: "cdc.shop.orders".into(),
            partition: 2,
            offset: 41,
            reason: "a value out of range".into(),
            kind: Some("value".into()),
            timestamp_ms: Some(0),
            key,
            payload: vec![1, 2, 3],
            event: EventInfo {
                table: "shop.orders".into(),
                op: Some(Op::Insert),
                ..Default::default()
            },
            replayed: false,
        }
    }

    #[test]
    fn a_dead_letter_reads_as_its_place_table_key_and_reason() {
        let key = v1::EventKey {
            key: vec![
                v1::Value {
                    kind: Some(Kind::Int(42)),
                },
                v1::Value {
                    kind: Some(Kind::Text("a\"b".into())),
                },
            ],
            ..Default::default()
        };
        let d = letter(Some(key.encode_to_vec()));
        assert_eq!(key_text(&d), r#"42,"a\"b""#);
        let l = line(&d);
        assert!(
            l.starts_with("0@7  1970-01-01T00:00:00")
                && l.ends_with("(read at cdc.shop.orders/2@41)"),
            "{l}"
        );
        assert!(
            l.contains("shop.orders  insert key=42,") && l.contains("[value] a value out of range"),
            "{l}"
        );
        let t = text(&d, "_dl", None);
        assert!(t.contains("dead letter 0@7 of _dl\n"), "{t}");
        assert!(
            t.contains("  event:    (3 bytes, not a change event)\n"),
            "{t}"
        );
        assert_eq!(json(&d)["key"], r#"42,"a\"b""#);
        assert_eq!(key_text(&letter(None)), "-");
        assert_eq!(key_text(&letter(Some(vec![0xff]))), "?");
    }
}
