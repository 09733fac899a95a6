//! TLS for the wire links: [`tessera_runtime::tls`] (the files, the rustls configurations
//! built from them, their reload), re-exported here where the wire's users look for it,
//! and tested here over real wire connections.

pub use tessera_runtime::tls::*;

#[cfg(test)]
mod tests;
