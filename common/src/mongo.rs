//! MongoDB helpers both stages use (connection string checks, server description).

use mongodb::bson::{doc, Document};

/// A connection string must at least have the right scheme; the driver parses the rest when
/// it connects (its parser is async, since `mongodb+srv://` asks DNS).
pub fn check_uri(key: &str, uri: &str) -> Result<(), (String, String)> {
    if uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://") {
        Ok(())
    } else {
        Err((
            key.to_string(),
            format!(
                "expected a mongodb:// or mongodb+srv:// connection string, got {:?}",
                crate::secret::redact_uri(uri)
            ),
        ))
    }
}

/// `message` with the password of `uri` masked wherever it appears (a driver's error may
/// quote the connection string or its parts).
pub fn scrubbed(uri: &str, message: String) -> String {
    let password = mongodb::options::ConnectionString::parse(uri)
        .ok()
        .and_then(|c| c.credential.and_then(|c| c.password));
    match password {
        Some(p) => crate::secret::scrub(&message, &[&p]),
        None => message,
    }
}

/// Connect and describe the server: "MongoDB x.y (wire n), replica set S" or why not.
pub async fn describe_server(uri: &str) -> Result<(String, Document), String> {
    let shown = crate::secret::redact_uri(uri);
    let client = mongodb::Client::with_uri_str(uri)
        .await
        .map_err(|e| scrubbed(uri, format!("bad connection string {shown}: {e}")))?;
    let admin = client.database("admin");
    // `hello` is MongoDB 4.4.2+; older servers (and some wire-compatible ones) know only the
    // legacy `isMaster`, which answers the same fields.
    let hello = match admin.run_command(doc! { "hello": 1 }).await {
        Ok(h) => h,
        Err(e) if command_not_found(&e) => admin
            .run_command(doc! { "isMaster": 1 })
            .await
            .map_err(|e| scrubbed(uri, format!("cannot reach {shown}: {e}")))?,
        Err(e) => return Err(scrubbed(uri, format!("cannot reach {shown}: {e}"))),
    };
    let info = admin
        .run_command(doc! { "buildInfo": 1 })
        .await
        .map_err(|e| format!("buildInfo failed: {e}"))?;
    let version = info.get_str("version").unwrap_or("?").to_string();
    let wire = hello.get_i32("maxWireVersion").unwrap_or(0);
    Ok((format!("MongoDB {version} (wire version {wire})"), hello))
}

fn command_not_found(e: &mongodb::error::Error) -> bool {
    matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 59)
}

/// MongoDB server codes that say "try again later", not "this request is wrong": the host
/// is unreachable or shutting down, the primary stepped down or is not writable, a time limit
/// or a network timeout ran out, a cursor was lost in a fail-over, a write conflict, a
/// sharded cluster's routing table being refreshed.
/// (MongoDB's `error_codes.yml`.)
pub const TRANSIENT_CODES: &[i32] = &[
    6,     // HostUnreachable
    7,     // HostNotFound
    43,    // CursorNotFound (a tailing cursor killed in a fail-over: reopened from the position)
    50,    // MaxTimeMSExpired
    63,    // StaleShardVersion (sharded clusters: mongos refreshes and the retry goes through)
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    112,   // WriteConflict
    133,   // FailedToSatisfyReadPreference
    134,   // ReadConcernMajorityNotAvailableYet
    150,   // StaleEpoch
    189,   // PrimarySteppedDown
    202,   // NetworkInterfaceExceededTimeLimit
    262,   // ExceededTimeLimit
    9001,  // SocketException
    10058, // LegacyNotPrimary
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13388, // StaleConfig
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// A server code of [`TRANSIENT_CODES`].
pub fn transient_code(code: i32) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// Whether a driver error is worth retrying: by the labels the server and the driver attach
/// (`RetryableWriteError`, `ResumableChangeStreamError`, `TransientTransactionError`), by the
/// kind of failure (network, pool cleared, no server selectable) and by the server's code,
/// never by its message.
pub fn transient(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    if [
        "RetryableWriteError",
        "ResumableChangeStreamError",
        "TransientTransactionError",
    ]
    .iter()
    .any(|l| e.contains_label(l))
    {
        return true;
    }
    match &*e.kind {
        ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. } => true,
        ErrorKind::ServerSelection { .. } => true,
        ErrorKind::Command(c) => transient_code(c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(w)) => {
            transient_code(w.code)
        }
        _ => false,
    }
}

/// The first segment of a dotted update path that an update operator cannot name as a field:
/// the positional operators `$`, `$[]` and `$[<identifier>]`, or any other name beginning with
/// `$` (a field MongoDB 5.0+ stores, which `$set` and `$unset` refuse to name).
///
/// MongoDB resolves positional paths before they reach its oplog or a change stream (`arr.$`
/// becomes `arr.3`), so a replica set never describes an update with one; a wire-compatible
/// server (mongo-java-server) logs the client's update as written. Replayed on a target with
/// only the document key as the query, `arr.$` is refused ("the positional operator did not
/// find the match needed from the query"), `arr.$[e]` lacks its `arrayFilters`, and `arr.$[]`
/// would touch the target's elements rather than the source's: such an update is applied from
/// the whole document, never from its description.
pub fn operator_segment(path: &str) -> Option<&str> {
    path.split('.').find(|s| s.starts_with('$'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::error::{Error, ErrorKind};

    fn command(code: i32) -> Error {
        // The driver's own shape of a server's command error.
        let reply = doc! { "ok": 0, "code": code, "codeName": "X", "errmsg": "m" };
        let c: mongodb::error::CommandError =
            mongodb::bson::from_document(reply).expect("a command error");
        Error::from(ErrorKind::Command(c))
    }

    #[test]
    fn positional_and_dollar_segments_are_found() {
        for (path, seg) in [
            ("arr.$", Some("$")),
            ("arr.$.v", Some("$")),
            ("a.arr.$[].v", Some("$[]")),
            ("objs.$[e].v", Some("$[e]")),
            ("objs.$[outer].inner.$[i]", Some("$[outer]")),
            ("a.$price", Some("$price")),
            ("$top", Some("$top")),
            ("arr.3", None),
            ("a.b$", None),
            ("price", None),
            ("a.b[0]", None),
        ] {
            assert_eq!(operator_segment(path), seg, "{path}");
        }
    }

    #[test]
    fn codes_and_kinds_decide_not_messages() {
        for code in [91, 189, 10107, 11602, 43] {
            assert!(transient(&command(code)), "{code}");
        }
        // Duplicate key, bad value, unauthorized, document too large: definite.
        for code in [11000, 2, 13, 10334] {
            assert!(!transient(&command(code)), "{code}");
        }
        let io = Error::from(ErrorKind::Io(std::sync::Arc::new(std::io::Error::other(
            "x",
        ))));
        assert!(transient(&io));
        let custom = Error::custom("ShutdownInProgress NotWritablePrimary");
        assert!(!transient(&custom), "the text of a message says nothing");
    }
}
