//! Generates the Rust types of the wire contract from `proto/`.
//!
//! Needs a `protoc` binary (Debian's `protobuf-compiler`), or `PROTOC` set.
fn main() {
    println!("cargo:rerun-if-changed=proto");
    prost_build::Config::new()
        .compile_protos(&["proto/tessera/v1/tessera.proto"], &["proto"])
        .expect("compiling proto/tessera/v1/tessera.proto (is protoc installed? apt-get install protobuf-compiler)");
}
