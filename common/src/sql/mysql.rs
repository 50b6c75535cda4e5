//! MySQL's SQL text: identifiers and string literals quoted ([`ident`], [`string`]), and a
//! statement as tokens ([`tokens`]): words and numbers, backquoted names, string literals and
//! punctuation, with comments left out.
//!
//! What MySQL itself reads inside comments is read here too: the body of an executable comment
//! (`/*! ... */`, `/*!50100 ... */`, MariaDB's `/*M!100100 ... */`) is tokenized as if it were
//! not a comment; `/* ... */`, `-- ` (with the space MySQL wants) and `#` comments are dropped.
//! Strings may be single- or double-quoted (a session without `ANSI_QUOTES`, the default), with
//! backslash escapes (as MySQL reads them: `\b` a backspace, `\%` and `\_` with their
//! backslash) and doubled quotes.

/// An identifier: backquoted, a backquote doubled.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A string literal, for a session with `NO_BACKSLASH_ESCAPES` off (the server's default):
/// backslash and quote escaped.
pub fn string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// A keyword, an unquoted name or a number (`12`, `1.5e3`, `.5`).
    Word(String),
    /// A backquoted name, unquoted.
    Name(String),
    /// A string literal: its text, unescaped.
    Str(String),
    /// One punctuation character (`.` between the parts of a qualified name is one too).
    Punct(char),
}

impl Token {
    /// Whether this is the keyword `k` (any case).
    pub fn is(&self, k: &str) -> bool {
        matches!(self, Token::Word(w) if w.eq_ignore_ascii_case(k))
    }

    /// The name this token is, quoted or not.
    pub fn name(&self) -> Option<&str> {
        match self {
            Token::Word(w) | Token::Name(w) => Some(w),
            _ => None,
        }
    }

    /// Whether this is the punctuation `c`.
    pub fn punct(&self, c: char) -> bool {
        matches!(self, Token::Punct(p) if *p == c)
    }
}

/// A name that may be qualified: `db.t`, `` `db`.`t` ``, `` db.`t` ``, or `t` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qualified {
    pub database: Option<String>,
    pub name: String,
}

/// The (possibly qualified) name at `t[i]`, and the index after it.
pub fn qualified_at(t: &[Token], i: usize) -> Option<(Qualified, usize)> {
    let first = t.get(i)?.name()?.to_string();
    if t.get(i + 1).is_some_and(|p| p.punct('.')) {
        if let Some(second) = t.get(i + 2).and_then(Token::name) {
            return Some((
                Qualified {
                    database: Some(first),
                    name: second.to_string(),
                },
                i + 3,
            ));
        }
    }
    Some((
        Qualified {
            database: None,
            name: first,
        },
        i + 1,
    ))
}

/// The tokens of `sql`.
pub fn tokens(sql: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = sql.chars().peekable();
    // Inside an executable comment: its `*/` ends it.
    let mut executable = false;
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '`' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    if c == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            s.push('`');
                            continue;
                        }
                        break;
                    }
                    s.push(c);
                }
                out.push(Token::Name(s));
            }
            '\'' | '"' => {
                let q = c;
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    if c == '\\' {
                        if let Some(e) = chars.next() {
                            // `\%` and `\_` keep their backslash outside a pattern.
                            if matches!(e, '%' | '_') {
                                s.push('\\');
                            }
                            s.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                '0' => '\0',
                                'b' => '\x08',
                                'Z' => '\x1a',
                                other => other,
                            });
                        }
                        continue;
                    }
                    if c == q {
                        if chars.peek() == Some(&q) {
                            chars.next();
                            s.push(q);
                            continue;
                        }
                        break;
                    }
                    s.push(c);
                }
                out.push(Token::Str(s));
            }
            '*' if executable && chars.peek() == Some(&'/') => {
                chars.next();
                executable = false;
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                // `/*!`, `/*!50100`, `/*M!100100`: MySQL (MariaDB) runs the body.
                let mut ahead = chars.clone();
                let mariadb = ahead.peek() == Some(&'M');
                if mariadb {
                    ahead.next();
                }
                if ahead.peek() == Some(&'!') {
                    ahead.next();
                    while ahead.peek().is_some_and(char::is_ascii_digit) {
                        ahead.next();
                    }
                    chars = ahead;
                    executable = true;
                    continue;
                }
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '#' => skip_line(&mut chars),
            '-' if chars.peek() == Some(&'-') && {
                let mut ahead = chars.clone();
                ahead.next();
                ahead.peek().is_none_or(|c| c.is_whitespace())
            } =>
            {
                skip_line(&mut chars)
            }
            c if c.is_alphanumeric()
                || c == '_'
                || c == '$'
                || (c == '.' && chars.peek().is_some_and(char::is_ascii_digit)) =>
            {
                // A number goes on through its decimal point; a name stops at a dot (the one
                // between a database and a table is punctuation).
                let number = c.is_ascii_digit() || c == '.';
                let mut s = c.to_string();
                while let Some(&n) = chars.peek() {
                    let number_so_far = number && s.chars().all(|c| c.is_ascii_digit() || c == '.');
                    if n.is_alphanumeric() || n == '_' || n == '$' || (n == '.' && number_so_far) {
                        s.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Token::Word(s));
            }
            c => out.push(Token::Punct(c)),
        }
    }
    out
}

fn skip_line(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for c in chars.by_ref() {
        if c == '\n' {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Token {
        Token::Word(s.into())
    }
    fn n(s: &str) -> Token {
        Token::Name(s.into())
    }
    fn p(c: char) -> Token {
        Token::Punct(c)
    }

    #[test]
    fn quoted_names_double_their_backquote_and_strings_escape() {
        assert_eq!(ident("a`b\\c"), "`a``b\\c`", "no escapes in names");
        assert_eq!(string("it's a\\b"), "'it\\'s a\\\\b'");
        // What is quoted reads back as it was.
        for s in ["it's", "a\\b", "x'y\\'z"] {
            assert_eq!(tokens(&string(s)), vec![Token::Str(s.into())]);
        }
        assert_eq!(tokens(&ident("a`b")), vec![Token::Name("a`b".into())]);
    }

    #[test]
    fn names_strings_numbers_and_punctuation() {
        assert_eq!(
            tokens("ALTER TABLE `d``b`.t1 ADD c DECIMAL(5,2) DEFAULT '1.5' -- note\n, x INT"),
            vec![
                w("ALTER"),
                w("TABLE"),
                n("d`b"),
                p('.'),
                w("t1"),
                w("ADD"),
                w("c"),
                w("DECIMAL"),
                p('('),
                w("5"),
                p(','),
                w("2"),
                p(')'),
                w("DEFAULT"),
                Token::Str("1.5".into()),
                p(','),
                w("x"),
                w("INT"),
            ]
        );
        assert_eq!(
            tokens("1.5e3 .5 -2 db.t"),
            vec![w("1.5e3"), w(".5"), p('-'), w("2"), w("db"), p('.'), w("t")]
        );
        assert_eq!(
            tokens(r#"'it''s \'ok\'' "a\\b\bc" 'a\%b'"#),
            vec![
                Token::Str("it's 'ok'".into()),
                Token::Str("a\\b\x08c".into()),
                Token::Str("a\\%b".into())
            ]
        );
        // `--` without a space after it is two minus signs.
        assert_eq!(tokens("a--1"), vec![w("a"), p('-'), p('-'), w("1")]);
    }

    #[test]
    fn executable_comments_are_read_and_others_left_out() {
        assert_eq!(
            tokens("CREATE /*!32312 IF NOT EXISTS*/ t /* x */ # y\n (a INT)"),
            tokens("CREATE IF NOT EXISTS t (a INT)")
        );
        assert_eq!(
            tokens("ALTER TABLE t /*M!100301 ADD COLUMN b INT */"),
            tokens("ALTER TABLE t ADD COLUMN b INT")
        );
        assert_eq!(tokens("/*! DROP TABLE t*/"), tokens("DROP TABLE t"));
        assert_eq!(tokens("/* DROP TABLE t */ SELECT 1"), tokens("SELECT 1"));
    }

    #[test]
    fn qualified_names_are_read_whichever_way_they_are_quoted() {
        for sql in ["db.t x", "`db`.`t` x", "db.`t` x", "`db`.t x"] {
            let t = tokens(sql);
            let (q, next) = qualified_at(&t, 0).unwrap();
            assert_eq!(q.database.as_deref(), Some("db"), "{sql}");
            assert_eq!((q.name.as_str(), next), ("t", 3), "{sql}");
        }
        let t = tokens("t, u");
        assert_eq!(qualified_at(&t, 0).unwrap().0.database, None);
        assert_eq!(qualified_at(&t, 1), None, "a comma is no name");
    }
}
