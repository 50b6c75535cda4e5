//! The apply stage's one error model.
//!
//! A failure to write is one of two kinds, decided once, where the error is made:
//! - **transient**: the target is unreachable, overloaded, electing or shutting down. The
//!   batch is written again with backoff while nothing more is read, and no offset moves.
//! - **definite**: the same write would be refused again. The sink stops (nothing after the
//!   last written batch is stored, so it is all read again after the fix), and the message
//!   names the target and the server's reason.
//!
//! An *event* that can never be written (as opposed to a target that cannot be written now)
//! is not an error of the sink: it is a [`BadEvent`], dead-lettered with its [`Reason`] (or
//! stopping the sink, as `errors.on_bad_event` says) while the rest flows.
//!
//! The decision comes from the server's code (ClickHouse exception codes, MongoDB codes and
//! labels) or the kind of client failure (network, timeout), never from message text; metric
//! labels come from [`Origin`] and [`Reason`], never from the text either.

/// Where an error comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Kafka,
    ClickHouse,
    Mongo,
    /// The stage's own state or configuration (a dead-letter topic refused, a stop asked by
    /// `errors.on_bad_event = "stop"`).
    Sink,
}

impl Origin {
    pub fn label(self) -> &'static str {
        match self {
            Origin::Kafka => "kafka",
            Origin::ClickHouse => "clickhouse",
            Origin::Mongo => "mongodb",
            Origin::Sink => "sink",
        }
    }
}

/// A failure of the sink: transient (write again), definite (stop and say why), or a target
/// another instance changed under the batch in hand (read the events not yet committed again,
/// with the target as it is now).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{1}")]
    Transient(Origin, String),
    #[error("{1}")]
    Definite(Origin, String),
    #[error("{1}")]
    ReadAgain(Origin, String),
}

impl ApplyError {
    pub fn definite(origin: Origin, message: impl Into<String>) -> Self {
        ApplyError::Definite(origin, message.into())
    }

    pub fn transient(origin: Origin, message: impl Into<String>) -> Self {
        ApplyError::Transient(origin, message.into())
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, ApplyError::Transient(..))
    }

    /// The events not yet committed are to be read again (see [`ApplyError::ReadAgain`]).
    pub fn is_read_again(&self) -> bool {
        matches!(self, ApplyError::ReadAgain(..))
    }

    pub fn origin(&self) -> Origin {
        match self {
            ApplyError::Transient(o, _)
            | ApplyError::Definite(o, _)
            | ApplyError::ReadAgain(o, _) => *o,
        }
    }

    /// The same error with `context` before its message (what was being done).
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        match self {
            ApplyError::Transient(o, m) => ApplyError::Transient(o, format!("{context}: {m}")),
            ApplyError::Definite(o, m) => ApplyError::Definite(o, format!("{context}: {m}")),
            ApplyError::ReadAgain(o, m) => ApplyError::ReadAgain(o, format!("{context}: {m}")),
        }
    }
}

/// Kafka failures of the consumer stop the sink: librdkafka retries the broker connection
/// itself, so what reaches the sink is not worth a retry of its own.
impl From<rdkafka::error::KafkaError> for ApplyError {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        ApplyError::Definite(Origin::Kafka, format!("Kafka: {e}"))
    }
}

impl From<clickhouse::error::Error> for ApplyError {
    fn from(e: clickhouse::error::Error) -> Self {
        let message = format!("ClickHouse: {e}");
        if clickhouse_transient(&e) {
            ApplyError::Transient(Origin::ClickHouse, message)
        } else {
            ApplyError::Definite(Origin::ClickHouse, message)
        }
    }
}

impl From<mongodb::error::Error> for ApplyError {
    fn from(e: mongodb::error::Error) -> Self {
        let message = format!("MongoDB: {e}");
        if sluice_common::mongo::transient(&e) {
            ApplyError::Transient(Origin::Mongo, message)
        } else {
            ApplyError::Definite(Origin::Mongo, message)
        }
    }
}

/// ClickHouse exception codes that say "try again later" (`src/Common/ErrorCodes.cpp`):
/// timeouts, too many queries or connections, the network, memory, too many parts, a
/// read-only replica (TABLE_IS_READ_ONLY: its Keeper session lost), too few live replicas, an
/// insert of unknown status, an ALTER a replica has not done yet, a query cancelled or aborted
/// by the server, Keeper. (READONLY,
/// 164, is a read-only *user* or profile: definite, so that a wrong grant stops the stage
/// instead of stalling it.)
pub const CLICKHOUSE_TRANSIENT_CODES: &[i32] = &[
    159, // TIMEOUT_EXCEEDED
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    203, // NO_FREE_CONNECTION
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    236, // ABORTED
    241, // MEMORY_LIMIT_EXCEEDED
    242, // TABLE_IS_READ_ONLY
    252, // TOO_MANY_PARTS
    285, // TOO_FEW_LIVE_REPLICAS
    319, // UNKNOWN_STATUS_OF_INSERT
    // An ALTER of a Replicated table while a replica is inactive (18.16: "Alter is not
    // finished because some replicas are inactive right now"). The ALTER is in Keeper and done
    // on the live replicas; tried again, it finds its change made (the column there or gone),
    // which counts as done, and the inactive replica applies it when it is back.
    341, // UNFINISHED
    394, // QUERY_WAS_CANCELLED
    425, // SYSTEM_ERROR
    999, // KEEPER_EXCEPTION
];

/// The exception code of a ClickHouse error: the server's `X-ClickHouse-Exception-Code`,
/// which the client crate returns as the body's leading `Code: N.` (`Code: N,` on 18.16).
/// Anything else (a proxy's page, or the bare HTTP status the crate gives when the answer has
/// neither) has no code.
pub fn clickhouse_code(e: &clickhouse::error::Error) -> Option<i32> {
    let clickhouse::error::Error::BadResponse(text) = e else {
        return None;
    };
    let digits = text.trim_start().strip_prefix("Code:")?.trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// HTTP statuses of a gateway in front of ClickHouse that say "not now" (bad gateway, service
/// unavailable, gateway time-out): the server behind it is restarting or overloaded. The crate
/// gives them as the answer's text when the answer carries no exception code.
const GATEWAY_STATUSES: &[&str] = &["502", "503", "504"];

/// Whether a ClickHouse client error is worth writing again: a network failure or time-out of
/// the client, a server exception whose code is in [`CLICKHOUSE_TRANSIENT_CODES`], or a
/// gateway's 502/503/504 without a code. Any other refusal without a code is definite: it
/// names itself in the message.
pub fn clickhouse_transient(e: &clickhouse::error::Error) -> bool {
    use clickhouse::error::Error;
    match e {
        Error::Network(_) | Error::TimedOut => true,
        Error::BadResponse(text) => match clickhouse_code(e) {
            Some(c) => CLICKHOUSE_TRANSIENT_CODES.contains(&c),
            None => GATEWAY_STATUSES
                .iter()
                .any(|s| text.trim_start().starts_with(s)),
        },
        _ => false,
    }
}

/// Why an event can never be written: the `reason` label of
/// `sluice_apply_dead_letters_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not a change event of the contract (protobuf refused it).
    Undecodable,
    /// A contract version this stage does not read.
    Contract,
    /// Its schema is not on the schema topic.
    UnknownSchema,
    /// Its table is stopped by an earlier DDL that could not be applied.
    TableStopped,
    /// A value the target column cannot hold, or parts that do not fit the target.
    Value,
    /// A DDL event that could not be applied.
    Ddl,
    /// MongoDB refused the write for a duplicate key (a secondary unique index).
    DuplicateKey,
    /// MongoDB refused the write for its document alone (validation, size).
    Refused,
}

impl Reason {
    /// Every reason: their counters exist (at 0) from the start, for rate() and alerts.
    pub const ALL: [Reason; 8] = [
        Reason::Undecodable,
        Reason::Contract,
        Reason::UnknownSchema,
        Reason::TableStopped,
        Reason::Value,
        Reason::Ddl,
        Reason::DuplicateKey,
        Reason::Refused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Undecodable => "undecodable",
            Reason::Contract => "contract",
            Reason::UnknownSchema => "unknown_schema",
            Reason::TableStopped => "table_stopped",
            Reason::Value => "value",
            Reason::Ddl => "ddl",
            Reason::DuplicateKey => "duplicate_key",
            Reason::Refused => "refused",
        }
    }
}

/// An event that can never be written, with why (for the dead-letter header and the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadEvent {
    pub reason: Reason,
    pub message: String,
}

impl BadEvent {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse::error::Error;

    #[test]
    fn clickhouse_errors_are_classified_by_code() {
        let bad = |t: &str| Error::BadResponse(t.to_string());
        let e = bad("Code: 252. DB::Exception: Too many parts (300). (TOO_MANY_PARTS)");
        assert_eq!(clickhouse_code(&e), Some(252));
        assert!(ApplyError::from(e).is_transient());
        // The code decides, not the words: a data error that mentions a timeout is definite.
        let e = bad("Code: 53. DB::Exception: Type mismatch: TIMEOUT in column. (TYPE_MISMATCH)");
        assert!(!clickhouse_transient(&e));
        let e = bad("Code: 60. DB::Exception: Table db.t does not exist. (UNKNOWN_TABLE)");
        assert_eq!(ApplyError::from(e).origin(), Origin::ClickHouse);
        // 18.16 writes `Code: 47, e.displayText() = ...`.
        let e = bad("Code: 241, e.displayText() = DB::Exception: Memory limit exceeded");
        assert_eq!(clickhouse_code(&e), Some(241));
        assert!(clickhouse_transient(&e));
        // A read-only user: definite (a wrong grant must not stall the stage).
        assert!(!clickhouse_transient(&bad(
            "Code: 164. DB::Exception: Cannot execute query in readonly mode. (READONLY)"
        )));
        // No code: a gateway's "not now" is retried, anything else is definite.
        assert_eq!(clickhouse_code(&bad("503 Service Unavailable")), None);
        assert!(clickhouse_transient(&bad("503 Service Unavailable")));
        assert!(clickhouse_transient(&bad("502 Bad Gateway")));
        assert_eq!(clickhouse_code(&bad("<html>502 Bad Gateway</html>")), None);
        assert!(!clickhouse_transient(&bad("425 Too Early")));
        assert!(!clickhouse_transient(&bad("bad gateway")));
        assert!(clickhouse_transient(&Error::TimedOut));
    }

    #[test]
    fn labels_are_fixed_words() {
        assert_eq!(Reason::UnknownSchema.label(), "unknown_schema");
        assert_eq!(Origin::Mongo.label(), "mongodb");
        let e = ApplyError::definite(Origin::Sink, "x").context("writing");
        assert_eq!(e.to_string(), "writing: x");
        assert!(!e.is_transient());
    }
}
