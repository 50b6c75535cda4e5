//! `sluice mongo` (also `sluice-mongo`): run one database command on a MongoDB server and print
//! the reply as relaxed extended JSON (documents of a `find` one per line). For operators and
//! the demo, where no MongoDB shell is installed.
//!
//! ```text
//! sluice mongo --uri mongodb://127.0.0.1:27017 --db shop '{"insert": "orders", "documents": [{"_id": 1}]}'
//! sluice mongo --uri mongodb://127.0.0.1:27017 --db shop '{"find": "orders"}'
//! ```

use clap::Parser;
use mongodb::bson::Bson;

/// Run a MongoDB database command, given as (extended) JSON.
#[derive(Parser, Debug)]
#[command(name = "sluice-mongo", version)]
pub struct Args {
    /// Connection string.
    #[arg(long, default_value = "mongodb://127.0.0.1:27017")]
    pub uri: String,
    /// The database the command runs on.
    #[arg(long)]
    pub db: String,
    /// The command document, e.g. '{"find": "orders", "filter": {"_id": 1}}'.
    pub command: String,
}

/// Run the command and print the reply.
pub async fn run(args: &Args) -> Result<(), String> {
    let json: serde_json::Value =
        serde_json::from_str(&args.command).map_err(|e| format!("the command is not JSON: {e}"))?;
    let command = match Bson::try_from(json) {
        Ok(Bson::Document(d)) => d,
        Ok(_) => return Err("the command must be a JSON object".into()),
        Err(e) => return Err(format!("the command is not extended JSON: {e}")),
    };
    let client = mongodb::Client::with_uri_str(&args.uri)
        .await
        .map_err(|e| {
            sluice_common::mongo::scrubbed(
                &args.uri,
                format!("{}: {e}", sluice_common::secret::redact_uri(&args.uri)),
            )
        })?;
    let reply = client
        .database(&args.db)
        .run_command(command)
        .await
        .map_err(|e| sluice_common::mongo::scrubbed(&args.uri, e.to_string()))?;
    // A find's documents one per line; any other reply whole.
    match reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
    {
        Ok(docs) => {
            for d in docs {
                println!("{}", d.clone().into_relaxed_extjson());
            }
        }
        Err(_) => println!("{}", Bson::Document(reply).into_relaxed_extjson()),
    }
    Ok(())
}
