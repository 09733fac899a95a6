//! tessera-ingester: not yet built (see the project's issues).
