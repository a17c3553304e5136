//! The paged KV cache's bookkeeping: which blocks each sequence holds (`block_manager`) and
//! which full blocks can be found again by their tokens (`prefix_cache`). The storage itself
//! is `crate::kv_cache`.

pub mod block_manager;
pub mod dtype;
pub mod fp8;
pub mod prefix_cache;
