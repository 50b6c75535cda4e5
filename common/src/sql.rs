//! SQL text, written once for the whole project: identifiers and string literals quoted for
//! ClickHouse ([`clickhouse`]) and MySQL ([`mysql`]), and MySQL statements split into tokens
//! ([`mysql::tokens`]), which the capture reads to tell what a statement does; what an ALTER
//! says beyond the schema after it ([`alter`]: renames, drops, what an added column gives the
//! rows already there).

pub mod alter;
pub mod mysql;

/// ClickHouse's quoting.
pub mod clickhouse {
    /// An identifier: backquoted, backslash and backquote escaped.
    pub fn ident(name: &str) -> String {
        format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
    }

    /// A string literal: backslash and quote escaped.
    pub fn string(s: &str) -> String {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn backslashes_and_quotes_are_escaped() {
            assert_eq!(super::ident("a`b\\c"), "`a\\`b\\\\c`");
            assert_eq!(super::string("it's a\\b"), "'it\\'s a\\\\b'");
        }
    }
}
