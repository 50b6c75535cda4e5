//! The capture stage's one error model.
//!
//! Every failure is one of two kinds, decided once, where the error is made (as Materialize's
//! `TransientError` / `DefiniteError`):
//! - **transient**: the connection or the server went away, or the server asked to try again
//!   later. The run loop reconnects with backoff and resumes from the last commit; nothing is
//!   surfaced as data.
//! - **definite**: the same request would fail the same way again (a purged binlog, another
//!   server behind the same connector, a value that cannot be decoded, a refused
//!   configuration). The capture stops, and the message says what is wrong and what to do.
//!
//! The decision comes from the server's own error code (MySQL error numbers, MongoDB codes and
//! labels) or from the kind of client failure (I/O, a closed connection), never from the text
//! of a message: message text is for people. The `error_type` label of
//! `sluice_capture_errors_total` is the error's [`Origin`].

/// Where an error comes from: the `error_type` label of the error counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The MySQL/MariaDB server or its client.
    Mysql,
    /// The MongoDB server or its driver.
    Mongo,
    /// Kafka: producing, creating topics, reading or storing checkpoints.
    Kafka,
    /// A binlog event or row image that cannot be decoded.
    Decode,
    /// The source's history or identity: a purged position, another server, a lost resume
    /// point, a compressed or unparsable event.
    Source,
    /// The configuration, found wrong only once running (a topic template that gives no valid
    /// name for a table).
    Config,
}

impl Origin {
    /// Every origin: their error counters exist (at 0) from the start.
    pub const ALL: [Origin; 6] = [
        Origin::Mysql,
        Origin::Mongo,
        Origin::Kafka,
        Origin::Decode,
        Origin::Source,
        Origin::Config,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Mysql => "mysql",
            Origin::Mongo => "mongodb",
            Origin::Kafka => "kafka",
            Origin::Decode => "decode",
            Origin::Source => "source",
            Origin::Config => "config",
        }
    }
}

/// A capture failure: transient (retry) or definite (stop and say why).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{1}")]
    Transient(Origin, String),
    #[error("{1}")]
    Definite(Origin, String),
}

impl CaptureError {
    pub fn definite(origin: Origin, message: impl Into<String>) -> Self {
        CaptureError::Definite(origin, message.into())
    }

    pub fn transient(origin: Origin, message: impl Into<String>) -> Self {
        CaptureError::Transient(origin, message.into())
    }

    /// The source's history or identity forbids going on ([`Origin::Source`]).
    pub fn source(message: impl Into<String>) -> Self {
        Self::definite(Origin::Source, message)
    }

    /// A value or event that cannot be decoded, with the table and position.
    pub fn decode(table: &str, pos: &str, reason: impl std::fmt::Display) -> Self {
        Self::definite(
            Origin::Decode,
            format!("decoding {table} at {pos}: {reason}"),
        )
    }

    /// Worth reconnecting for.
    pub fn is_transient(&self) -> bool {
        matches!(self, CaptureError::Transient(..))
    }

    pub fn origin(&self) -> Origin {
        match self {
            CaptureError::Transient(o, _) | CaptureError::Definite(o, _) => *o,
        }
    }

    /// The `error_type` label.
    pub fn label(&self) -> &'static str {
        self.origin().label()
    }
}

/// MySQL/MariaDB server error numbers that say "try again" (the server's error reference):
/// too many connections (1040), shutdown in progress (1053), a connection aborted or its
/// network read/write failing or timing out (1152, 1153, 1158-1161), a query interrupted
/// (1317), a lock wait timeout or deadlock (1205, 1213: a snapshot read), a connection or
/// session killed (1927 MariaDB, 3169 MySQL), an idle connection closed after `wait_timeout`
/// (4031, MySQL 8.0.24+), and the client's "server has gone away" / "lost connection" (2006,
/// 2013), which servers also relay.
pub const MYSQL_TRANSIENT_CODES: &[u16] = &[
    1040, 1053, 1152, 1153, 1158, 1159, 1160, 1161, 1205, 1213, 1317, 1927, 2006, 2013, 3169, 4031,
];

/// Whether a MySQL client error is worth retrying: I/O, a closed connection or pool, or a
/// server error number of [`MYSQL_TRANSIENT_CODES`].
pub fn mysql_transient(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(_) => true,
        mysql_async::Error::Driver(d) => matches!(
            d,
            mysql_async::DriverError::ConnectionClosed | mysql_async::DriverError::PoolDisconnected
        ),
        mysql_async::Error::Server(s) => MYSQL_TRANSIENT_CODES.contains(&s.code),
        _ => false,
    }
}

impl From<mysql_async::Error> for CaptureError {
    fn from(e: mysql_async::Error) -> Self {
        let message = format!("MySQL: {e}");
        if mysql_transient(&e) {
            CaptureError::Transient(Origin::Mysql, message)
        } else {
            CaptureError::Definite(Origin::Mysql, message)
        }
    }
}

impl From<mongodb::error::Error> for CaptureError {
    fn from(e: mongodb::error::Error) -> Self {
        let message = format!("MongoDB: {e}");
        if sluice_common::mongo::transient(&e) {
            CaptureError::Transient(Origin::Mongo, message)
        } else {
            CaptureError::Definite(Origin::Mongo, message)
        }
    }
}

/// The contract's helpers refuse only what retrying cannot mend: a topic template that gives
/// no valid topic name, a binlog file name without a number, a position beyond the version
/// layout.
impl From<sluice_proto::ContractError> for CaptureError {
    fn from(e: sluice_proto::ContractError) -> Self {
        let origin = match e {
            sluice_proto::ContractError::BadTemplate { .. }
            | sluice_proto::ContractError::BadTopic { .. } => Origin::Config,
            _ => Origin::Source,
        };
        CaptureError::Definite(origin, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "Lost connection".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn mysql_errors_are_classified_by_number() {
        for code in [1053, 2013, 2006, 1205, 1213, 1927, 4031] {
            let e = CaptureError::from(server(code));
            assert!(e.is_transient(), "{code}");
            assert_eq!(e.label(), "mysql");
        }
        // Access denied, unknown table, binlog purged (1236): definite, whatever the text.
        for code in [1045, 1146, 1236] {
            assert!(!CaptureError::from(server(code)).is_transient(), "{code}");
        }
        let closed = mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed);
        assert!(CaptureError::from(closed).is_transient());
        let io = mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::other("reset")));
        assert!(CaptureError::from(io).is_transient());
        let e = CaptureError::from(server(1236));
        assert!(e.to_string().starts_with("MySQL: "), "{e}");
    }

    #[test]
    fn kafka_and_contract_errors_are_definite_with_their_origin() {
        let e = CaptureError::from(crate::publish::PublishError::AckerGone);
        assert!(!e.is_transient());
        assert_eq!(e.label(), "kafka");
        let e = CaptureError::from(sluice_proto::ContractError::BadBinlogFile("x".into()));
        assert_eq!(e.origin(), Origin::Source);
        let e = CaptureError::decode("db.t", "mysql-bin.000001:4", "short row");
        assert_eq!(
            e.to_string(),
            "decoding db.t at mysql-bin.000001:4: short row"
        );
        assert_eq!(e.label(), "decode");
    }
}
