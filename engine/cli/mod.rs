//! The binary's own modules: `rustle`'s flags, and the commands that are not the library's.

pub mod args;
pub mod chat;
pub mod generate;
pub mod grammar;
pub mod measure;
pub mod perplexity;
