//! Paged KV-cache bookkeeping (see issue "Paged KV blocks in Rust").
