//! Secrets in configurations: passwords, keys and the password part of connection URIs never
//! leave the process in clear, neither in `--print-config` nor in a log line, an error message,
//! a `--check` line or a panic. They are read from the file, from the environment
//! (`SLUICE__SECTION__KEY`), or from a file named by the key with `_file` appended (as
//! Kubernetes and Docker mount secrets; see [`crate::config`]).

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

/// What a secret shows instead of itself.
pub const MASK: &str = "***";

/// A password or a key: `***` wherever it is shown (`Debug`, `Display`, serialized).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself, for the driver that needs it, never for a message.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "" } else { MASK })
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { MASK })
    }
}

/// A connection URI (`mysql://user:password@host:port/db?options`, `mongodb://…`) whose
/// password is shown as `***` (`Debug`, `Display`, serialized); [`Uri::expose`] gives it whole
/// to the driver.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Uri(String);

impl Uri {
    pub fn new(s: impl Into<String>) -> Self {
        Uri(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URI with its password (if any) masked.
    pub fn redacted(&self) -> String {
        redact_uri(&self.0)
    }
}

impl fmt::Debug for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for Uri {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// `scheme://user:password@host…` with the password masked: from the first `:` after `//`
/// to the last `@` (a password that is not percent-encoded may hold `@`, `:`, `/` or `?`, so
/// the last `@` counts: at worst more than the password is masked, never less). Query
/// parameters that carry secrets (`password=`, `tlsCertificateKeyFilePassword=`, …) are masked
/// too.
pub fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://") else {
        return redact_query(uri);
    };
    let (scheme, rest) = uri.split_at(scheme_end + 3);
    let userinfo_end = rest.rfind('@').filter(|&at| rest[..at].contains(':'));
    match userinfo_end {
        Some(at) => {
            let colon = rest.find(':').expect("a ':' before the '@'");
            format!(
                "{scheme}{}:{MASK}{}",
                &rest[..colon],
                redact_query(&rest[at..])
            )
        }
        None => format!("{scheme}{}", redact_query(rest)),
    }
}

/// Query parameters whose name says they hold a secret, masked.
fn redact_query(s: &str) -> String {
    let Some(q) = s.find('?') else {
        return s.to_string();
    };
    let (head, query) = s.split_at(q + 1);
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, v)) if is_secret_name(k) && !v.is_empty() => format!("{k}={MASK}"),
            // MongoDB's `KEY:value,KEY:value` list (`AWS_SESSION_TOKEN:...`): the values of
            // the keys that name a secret.
            Some((k, v)) if k.eq_ignore_ascii_case("authMechanismProperties") => {
                format!("{k}={}", redact_properties(v))
            }
            _ => p.to_string(),
        })
        .collect();
    format!("{head}{}", params.join("&"))
}

/// `KEY:value,KEY:value` (the `:` maybe percent-encoded) with the values of secret keys masked.
fn redact_properties(v: &str) -> String {
    v.split(',')
        .map(|kv| {
            let split = kv.split_once(':').map(|(k, v)| (k, ":", v)).or_else(|| {
                let i = kv.to_ascii_lowercase().find("%3a")?;
                Some((&kv[..i], &kv[i..i + 3], &kv[i + 3..]))
            });
            match split {
                Some((k, sep, v)) if is_secret_name(k) && !v.is_empty() => {
                    format!("{k}{sep}{MASK}")
                }
                _ => kv.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A key or parameter name that holds a secret: a password, a secret, a private key or a
/// token (`sasl.password`, `ssl.key.password`, `ssl.key.pem`, `sasl.jaas.config`,
/// `sasl.oauthbearer.client.secret`, `tlsCertificateKeyFilePassword`, …).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password")
        || n.contains("secret")
        || n.contains("passwd")
        || n.contains("token")
        || n.ends_with("key.pem")
        || n.contains("jaas")
        || n.contains("oauthbearer.config")
        || n.contains("private")
}

/// Serialize a map of client properties (`[kafka.properties]`) with secret values masked.
pub fn serialize_properties<S: Serializer>(
    props: &std::collections::BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(props.len()))?;
    for (k, v) in props {
        if is_secret_name(k) && !v.is_empty() {
            m.serialize_entry(k, MASK)?;
        } else {
            m.serialize_entry(k, v)?;
        }
    }
    m.end()
}

/// Mask every occurrence of `secrets` in `text` (for messages that may quote a server's
/// answer or a driver's error verbatim).
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 3) {
        out = out.replace(*s, MASK);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uris_password_is_masked_and_nothing_else() {
        let cases = [
            ("mysql://u:hunter2@db:3306/x", "mysql://u:***@db:3306/x"),
            ("mysql://u@db:3306", "mysql://u@db:3306"),
            ("mysql://db:3306", "mysql://db:3306"),
            // Unencoded '@', ':' and '/' in the password: still all masked.
            ("mysql://u:p@ss:w/rd@db:3306", "mysql://u:***@db:3306"),
            (
                "mongodb://app:s3cr%40t@a:27017,b:27017/?replicaSet=rs0&authSource=admin",
                "mongodb://app:***@a:27017,b:27017/?replicaSet=rs0&authSource=admin",
            ),
            (
                "mongodb://a:27017/?tls=true&tlsCertificateKeyFilePassword=pw",
                "mongodb://a:27017/?tls=true&tlsCertificateKeyFilePassword=***",
            ),
            ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
            (
                "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok3n,SERVICE_NAME:svc",
                "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:***,SERVICE_NAME:svc",
            ),
            (
                "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN%3Atok3n",
                "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN%3A***",
            ),
            (
                "https://u:pw@ch.example:8443/?x=1",
                "https://u:***@ch.example:8443/?x=1",
            ),
        ];
        for (uri, want) in cases {
            assert_eq!(redact_uri(uri), want, "{uri}");
            assert_eq!(format!("{}", Uri::new(uri)), want);
            assert_eq!(format!("{:?}", Uri::new(uri)), format!("{want:?}"));
        }
    }

    #[test]
    fn a_secret_shows_only_whether_it_is_set() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{}", Secret::default()), "");
        #[derive(Serialize)]
        struct C {
            password: Secret,
            url: Uri,
            #[serde(serialize_with = "serialize_properties")]
            properties: std::collections::BTreeMap<String, String>,
        }
        let c = C {
            password: s,
            url: Uri::new("mysql://u:hunter3@h"),
            properties: [
                ("sasl.password".to_string(), "hunter4".to_string()),
                ("sasl.username".to_string(), "alice".to_string()),
                ("ssl.key.pem".to_string(), "-----BEGIN".to_string()),
            ]
            .into(),
        };
        let text = toml::to_string(&c).unwrap();
        for leaked in ["hunter2", "hunter3", "hunter4", "BEGIN"] {
            assert!(!text.contains(leaked), "{text}");
        }
        assert!(text.contains("alice"), "{text}");
    }

    #[test]
    fn scrub_masks_every_occurrence() {
        assert_eq!(
            scrub("auth failed for pw hunter2 (hunter2)", &["hunter2", ""]),
            "auth failed for pw *** (***)"
        );
    }
}
