//! Compiles `proto/sluice/v1/*.proto` with protox (a pure-Rust protobuf compiler), so no system
//! `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/sluice/v1/event.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
