//! The column types a scenario draws: each type's SQL, a random value of it, and the DEFAULTs a
//! statement may give it (literals MariaDB converts, expressions, `CURRENT_TIMESTAMP`).

use crate::Rng;

/// A column type drawn: its SQL, a value of it, and the DEFAULTs a statement may give it.
pub struct Ty {
    pub sql: &'static str,
    pub value: fn(&mut Rng) -> String,
    pub defaults: &'static [&'static str],
}

pub fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

fn signed(rng: &mut Rng, below: u64) -> i64 {
    rng.below(2 * below) as i64 - below as i64
}

fn text(rng: &mut Rng, max: u64) -> String {
    const PIECES: &[&str] = &[
        "a", "b", "Z", " ", "é", "日", "\\\\", "%", "''", "_", "0", "x y",
    ];
    let n = rng.below(max + 1);
    let mut s = String::new();
    let mut chars = 0;
    while chars < n {
        let p = *pick(rng, PIECES);
        let len = if p == "\\\\" || p == "''" {
            1
        } else {
            p.chars().count() as u64
        };
        if chars + len > max {
            break;
        }
        s.push_str(p);
        chars += len;
    }
    format!("'{s}'")
}

fn bytes(rng: &mut Rng, max: u64) -> String {
    let n = rng.below(max + 1);
    let hex: String = (0..n).map(|_| format!("{:02x}", rng.below(256))).collect();
    if hex.is_empty() {
        "''".into()
    } else {
        format!("X'{hex}'")
    }
}

fn date(rng: &mut Rng) -> String {
    if rng.chance(3) {
        return "'0000-00-00'".into();
    }
    // Years every ClickHouse server's Date and DateTime hold (a value outside stops its table,
    // tested with the types).
    format!(
        "'{:04}-{:02}-{:02}'",
        1971 + rng.below(130),
        1 + rng.below(12),
        1 + rng.below(28)
    )
}

/// `H:MM:SS` with `hours` below the bound, and `fsp` fractional digits.
fn hms(rng: &mut Rng, hours: u64, fsp: usize) -> String {
    let mut s = format!(
        "{:02}:{:02}:{:02}",
        rng.below(hours),
        rng.below(60),
        rng.below(60)
    );
    if fsp > 0 {
        let f = format!("{:06}", rng.below(1_000_000));
        s.push('.');
        s.push_str(&f[..fsp]);
    }
    s
}

fn clock(rng: &mut Rng, fsp: usize) -> String {
    hms(rng, 24, fsp)
}

fn datetime(rng: &mut Rng, fsp: usize, first_year: u64, years: u64) -> String {
    format!(
        "'{:04}-{:02}-{:02} {}'",
        first_year + rng.below(years),
        1 + rng.below(12),
        1 + rng.below(28),
        clock(rng, fsp)
    )
}

fn time(rng: &mut Rng, fsp: usize) -> String {
    let sign = if rng.chance(30) { "-" } else { "" };
    format!("'{sign}{}'", hms(rng, 839, fsp))
}

pub const TYPES: &[Ty] = &[
    Ty {
        sql: "TINYINT",
        value: |r| signed(r, 128).to_string(),
        defaults: &["5", "'7'", "2.7", "-3", "TRUE", "(id % 100)"],
    },
    Ty {
        sql: "SMALLINT UNSIGNED",
        value: |r| r.below(65536).to_string(),
        defaults: &["65535", "'12'", "1e2", "(id + 1)"],
    },
    Ty {
        sql: "INT",
        value: |r| signed(r, 2_000_000_000).to_string(),
        defaults: &["2.7", "'-4'", "0", "(id * 3)", "-2147483648"],
    },
    Ty {
        sql: "BIGINT",
        value: |r| (r.next() as i64 / 3).to_string(),
        defaults: &["9007199254740993", "'-1'", "(id - 7)"],
    },
    Ty {
        sql: "BIGINT UNSIGNED",
        value: |r| r.next().to_string(),
        defaults: &["18446744073709551615", "'3'"],
    },
    Ty {
        sql: "DECIMAL(6,2)",
        value: |r| format!("{}.{:02}", signed(r, 10_000), r.below(100)),
        defaults: &["1.555", "'3.1'", "-0.005", "12", "(id / 3)"],
    },
    Ty {
        sql: "DECIMAL(25,3)",
        value: |r| format!("{}.{:03}", signed(r, 1_000_000_000_000_000), r.below(1000)),
        defaults: &["12.5", "'1e3'", "-99999999999999999999.999"],
    },
    Ty {
        sql: "FLOAT",
        value: |r| format!("{}", signed(r, 1_000_000) as f64 / 64.0),
        defaults: &["1.5", "'0.1'", "-3e10"],
    },
    Ty {
        sql: "DOUBLE",
        value: |r| format!("{:e}", signed(r, 1 << 52) as f64 * 1e-7),
        defaults: &["2.5e300", "'-0.25'", "(id / 7)"],
    },
    Ty {
        sql: "BIT(5)",
        value: |r| format!("b'{:b}'", r.below(32)),
        defaults: &["b'101'", "5"],
    },
    Ty {
        sql: "CHAR(5)",
        value: |r| text(r, 5),
        defaults: &["'ab  '", "'x'", "''", "7"],
    },
    Ty {
        sql: "VARCHAR(20)",
        value: |r| text(r, 20),
        defaults: &[
            r"'a\%b'",
            r"'a\bc'",
            "'it''s'",
            "'é'",
            "(CONCAT('d', id))",
            "12.50",
        ],
    },
    Ty {
        sql: "TEXT",
        value: |r| text(r, 60),
        defaults: &["'t'", "(REPEAT('x', id % 5))"],
    },
    Ty {
        sql: "BINARY(4)",
        value: |r| bytes(r, 4),
        defaults: &["'ab'", "0x6162", "''"],
    },
    Ty {
        sql: "VARBINARY(8)",
        value: |r| bytes(r, 8),
        defaults: &["'xyz'", "X'00ff'"],
    },
    Ty {
        sql: "BLOB",
        value: |r| bytes(r, 20),
        defaults: &["'b'"],
    },
    Ty {
        sql: "DATE",
        value: date,
        defaults: &[
            "'20240102'",
            "'2024-1-2'",
            "20240102",
            "(CURRENT_DATE)",
            "'0000-00-00'",
        ],
    },
    Ty {
        sql: "TIME",
        value: |r| time(r, 0),
        defaults: &["'10:00'", "'1 02:03'", "100", "'-01:00:00'", "'838:59:59'"],
    },
    Ty {
        sql: "TIME(3)",
        value: |r| time(r, 3),
        defaults: &["'10:00:00.5'", "'-00:00:01.25'", "'12:34:56.7891'"],
    },
    Ty {
        sql: "DATETIME",
        value: |r| datetime(r, 0, 1971, 130),
        defaults: &[
            "'2024-01-02 03:04:05'",
            "'20240102030405'",
            "CURRENT_TIMESTAMP",
        ],
    },
    Ty {
        sql: "DATETIME(6)",
        value: |r| datetime(r, 6, 1971, 130),
        defaults: &[
            "'2024-01-02 03:04:05.5'",
            "CURRENT_TIMESTAMP(6)",
            "'2024-01-02'",
        ],
    },
    Ty {
        sql: "TIMESTAMP(3)",
        value: |r| datetime(r, 3, 1971, 60),
        defaults: &["'2024-01-02 03:04:05.123'", "CURRENT_TIMESTAMP(3)"],
    },
    Ty {
        sql: "YEAR",
        value: |r| {
            if r.chance(5) {
                "0".into()
            } else {
                (1901 + r.below(255)).to_string()
            }
        },
        defaults: &["99", "'5'", "2024", "0"],
    },
    Ty {
        sql: "ENUM('low','mid','high')",
        value: |r| pick(r, &["'low'", "'mid'", "'high'"]).to_string(),
        defaults: &["'MID'", "'high'", "2"],
    },
    Ty {
        sql: "SET('r','g','b')",
        value: |r| pick(r, &["''", "'r'", "'g,r'", "'b,g,r'", "'b'"]).to_string(),
        defaults: &["'g,r'", "'b'", "3", "''"],
    },
    Ty {
        sql: "JSON",
        value: |r| format!("'{{\"a\": {}, \"b\": [true, null, \"s\"]}}'", r.below(1000)),
        defaults: &["'{\"a\": 1}'", "'[]'"],
    },
    Ty {
        sql: "UUID",
        value: |r| {
            // RFC 4122 (MariaDB refuses other versions and variants): version 4, variant 10.
            let h = format!("{:016x}{:016x}", r.next(), r.next());
            format!(
                "'{}-{}-4{}-{:x}{}-{}'",
                &h[0..8],
                &h[8..12],
                &h[13..16],
                8 + r.below(4),
                &h[17..20],
                &h[20..32]
            )
        },
        defaults: &["'6ccd780c-baba-1026-9564-5b8c656024db'"],
    },
    Ty {
        sql: "INET6",
        value: |r| {
            if r.chance(30) {
                format!(
                    "'::ffff:{}.{}.{}.{}'",
                    r.below(256),
                    r.below(256),
                    r.below(256),
                    r.below(256)
                )
            } else {
                format!(
                    "'{:x}::{:x}:{:x}'",
                    r.below(65536),
                    r.below(65536),
                    r.below(65536)
                )
            }
        },
        defaults: &["'::1'", "'::ffff:1.2.3.4'"],
    },
    Ty {
        sql: "INET4",
        value: |r| {
            format!(
                "'{}.{}.{}.{}'",
                r.below(256),
                r.below(256),
                r.below(256),
                r.below(256)
            )
        },
        defaults: &["'10.0.0.1'"],
    },
    Ty {
        sql: "BOOLEAN",
        value: |r| pick(r, &["TRUE", "FALSE", "1", "0"]).to_string(),
        defaults: &["TRUE", "FALSE", "1"],
    },
];

/// The generated columns drawn: type and expression (of the fixed columns only, which no
/// statement drops).
pub const GENERATED: &[(&str, &str)] = &[
    ("INT", "id * 2"),
    ("VARCHAR(40)", "CONCAT('g', id, '-', k)"),
    ("BIGINT", "id * k - 5"),
    ("DOUBLE", "id / 7"),
];
