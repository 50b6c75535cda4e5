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
            format!("expected a mongodb:// or mongodb+srv:// connection string, got {uri:?}"),
        ))
    }
}

/// Connect and describe the server: "MongoDB x.y (wire n), replica set S" or why not.
pub async fn describe_server(uri: &str) -> Result<(String, Document), String> {
    let client = mongodb::Client::with_uri_str(uri)
        .await
        .map_err(|e| format!("bad connection string: {e}"))?;
    let admin = client.database("admin");
    // `hello` is MongoDB 4.4.2+; older servers (and some wire-compatible ones) know only the
    // legacy `isMaster`, which answers the same fields.
    let hello = match admin.run_command(doc! { "hello": 1 }).await {
        Ok(h) => h,
        Err(e) if command_not_found(&e) => admin
            .run_command(doc! { "isMaster": 1 })
            .await
            .map_err(|e| format!("cannot reach {uri}: {e}"))?,
        Err(e) => return Err(format!("cannot reach {uri}: {e}")),
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
