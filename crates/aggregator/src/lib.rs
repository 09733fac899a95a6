//! tessera-aggregator: not yet built (see the project's issues).
