//! The operator's tools (`sluice`) against running pipelines, one file per tool. One test
//! binary: `cargo test -p sluice-tests --test tools verify::` runs one file's tests.

mod dead_letters;
mod position;
mod status;
mod verify;
mod verify_mongo;
