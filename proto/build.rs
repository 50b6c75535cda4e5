//! Compiles `proto/sluice/v1/*.proto` with protox (a pure-Rust protobuf compiler), so no system
//! `protoc` is needed, and writes from the same descriptors the field numbers and wire keys
//! that the hand-written encoders use (`sluice_proto::tags`), with a test per field that holds
//! each key to prost's own encoding. The `.proto` is the one source of truth: a field renumbered
//! there changes the constants (and a writer of one-byte keys, `*_KEY1`, stops building when its
//! field moves past 15), so no encoder can go on writing the old number.

use std::fmt::Write as _;

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/sluice/v1/event.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let (mut tags, mut checks) = (String::new(), String::new());
    for file in &descriptors.file {
        for m in &file.message_type {
            message(m, &mut tags, &mut checks)?;
        }
    }
    std::fs::write(out.join("sluice.v1.tags.rs"), tags)?;
    std::fs::write(
        out.join("sluice.v1.tag_checks.rs"),
        format!("{{\n{checks}}}\n"),
    )?;
    prost_build::Config::new()
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}

fn snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// A Rust identifier for a proto name (prost's raw identifiers for keywords).
fn ident(name: &str) -> String {
    match name {
        "type" | "ref" | "self" | "match" | "fn" | "mod" | "use" | "enum" => format!("r#{name}"),
        _ => name.to_string(),
    }
}

fn repeated(f: &FieldDescriptorProto) -> bool {
    f.label() == Label::Repeated
}

/// The wire type a field is written with (proto3: repeated scalars packed).
fn wire_type(f: &FieldDescriptorProto) -> u8 {
    let t = f.r#type();
    let scalar = !matches!(t, Type::String | Type::Bytes | Type::Message | Type::Group);
    if repeated(f) && scalar {
        return 2;
    }
    match t {
        Type::Double | Type::Fixed64 | Type::Sfixed64 => 1,
        Type::Float | Type::Fixed32 | Type::Sfixed32 => 5,
        Type::String | Type::Bytes | Type::Message | Type::Group => 2,
        _ => 0,
    }
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// A sample value of the field's Rust type, and the bytes of its body as the wire writes it
/// after the key (the hand-written side of the check, worked out here from the wire format's
/// definition, not by prost).
fn sample(f: &FieldDescriptorProto) -> (String, String) {
    let bytes = |b: &[u8]| format!("&{b:?}[..]");
    let (one, body): (&str, Vec<u8>) = match f.r#type() {
        Type::Bool => ("true", vec![1]),
        Type::Int32 | Type::Enum => ("1i32", vec![1]),
        Type::Int64 => ("1i64", vec![1]),
        Type::Uint32 => ("1u32", vec![1]),
        Type::Uint64 => ("1u64", vec![1]),
        Type::Sint32 => ("1i32", vec![2]),
        Type::Sint64 => ("1i64", vec![2]),
        Type::Fixed32 => ("1u32", 1u32.to_le_bytes().to_vec()),
        Type::Sfixed32 => ("1i32", 1i32.to_le_bytes().to_vec()),
        Type::Fixed64 => ("1u64", 1u64.to_le_bytes().to_vec()),
        Type::Sfixed64 => ("1i64", 1i64.to_le_bytes().to_vec()),
        Type::Float => ("1f32", 1f32.to_le_bytes().to_vec()),
        Type::Double => ("1f64", 1f64.to_le_bytes().to_vec()),
        Type::String => ("String::from(\"x\")", vec![1, b'x']),
        Type::Bytes => ("vec![7u8]", vec![1, 7]),
        Type::Message | Type::Group => ("Default::default()", vec![0]),
    };
    if repeated(f) {
        let packed =
            wire_type(f) == 2 && !matches!(f.r#type(), Type::String | Type::Bytes | Type::Message);
        // A packed list of one: its length, then the element.
        let body = if packed {
            let mut b = varint(body.len() as u64);
            b.extend(&body);
            b
        } else {
            body
        };
        return (format!("vec![{one}]"), bytes(&body));
    }
    (one.to_string(), bytes(&body))
}

fn message(
    m: &DescriptorProto,
    tags: &mut String,
    checks: &mut String,
) -> Result<(), std::fmt::Error> {
    let name = m.name();
    let module = snake(name);
    writeln!(tags, "/// The fields of `{name}`: numbers and keys.")?;
    writeln!(tags, "pub mod {module} {{")?;
    for f in &m.field {
        let number = f.number() as u32;
        let wt = wire_type(f);
        let key = varint(u64::from(number) << 3 | u64::from(wt));
        let upper = f.name().to_ascii_uppercase();
        writeln!(tags, "    /// `{}` = {number}", f.name())?;
        writeln!(tags, "    pub const {upper}: u32 = {number};")?;
        writeln!(
            tags,
            "    /// The key of `{}` (field {number}, wire type {wt}).",
            f.name()
        )?;
        writeln!(
            tags,
            "    pub const {upper}_KEY: [u8; {}] = {key:?};",
            key.len()
        )?;
        if let [byte] = key[..] {
            // Only fields 1 to 15 have it: a writer that takes a one-byte key stops building
            // when its field is renumbered past 15.
            writeln!(tags, "    /// `{upper}_KEY` as the one byte it is.")?;
            writeln!(tags, "    pub const {upper}_KEY1: u8 = {byte};")?;
        }
        // The check: prost's encoding of a `{name}` with only this field set must be this
        // key followed by the body the wire format defines.
        let (value, body) = sample(f);
        let field = ident(f.name());
        let construct = match f.oneof_index {
            Some(i) if !f.proto3_optional() => {
                let oneof = m.oneof_decl[i as usize].name();
                // The rest of the message, if the oneof is not all of it.
                let rest = if m.field.iter().any(|o| o.oneof_index != Some(i)) {
                    ", ..Default::default()"
                } else {
                    ""
                };
                format!(
                    "v1::{name} {{ {}: Some(v1::{module}::{}::{}({value})){rest} }}",
                    ident(oneof),
                    camel(oneof),
                    camel(f.name())
                )
            }
            _ => {
                let value = if f.r#type() == Type::Message && !repeated(f) {
                    format!("Some({value})")
                } else {
                    value
                };
                let rest = if m.field.len() > 1 {
                    ", ..Default::default()"
                } else {
                    ""
                };
                format!("v1::{name} {{ {field}: {value}{rest} }}")
            }
        };
        writeln!(
            checks,
            "    check(\"{name}.{}\", &{construct}.encode_to_vec(), &tags::{module}::{upper}_KEY, {body});",
            f.name()
        )?;
    }
    writeln!(tags, "}}")?;
    Ok(())
}
