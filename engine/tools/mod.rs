//! The measuring tools: `rustle bench` and `rustle profile`. They observe the engine from
//! outside, through the runner's public API (`Runner::set_graphs`, `solo_at`,
//! `profile_start` / `profile_stop`, ...), and nothing in the engine imports them: only
//! `main.rs` and the tests do (a test in this module checks it).
//!
//! - `bench`: decode and prefill speed at batch 1, beside the bandwidth ceiling
//! - `batch_bench`: batched decode, as llama.cpp's `llama-batched-bench` measures it
//! - `serve_bench`: serving throughput through the engine loop, beside the roofline
//! - `profile/`: every kernel of a prefill and decode steps against the roofline
//! - `decode_matmuls`, `prefill_matmuls`: the matmuls alone, rustle against cuBLAS
//! - `ceilings`: bandwidth, matrix throughput and the tensor instruction's peak, measured
//! - `cublas`: the reference matmuls; `timing`: event timing, launches summed by kernel
//! - `setup`: a runner over a real model or a named shape's synthetic weights

pub mod batch_bench;
pub mod bench;
pub mod ceilings;
pub mod cublas;
pub mod decode_matmuls;
pub mod prefill_matmuls;
pub mod profile;
pub mod serve_bench;
pub mod setup;
pub mod timing;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Arrows point one way: the tools import the engine, never the other way. Only
    /// `main.rs` (the CLI), `lib.rs` (which declares the module) and the files under
    /// `engine/tools/` may name `tools`.
    #[test]
    fn nothing_in_the_engine_imports_the_tools() {
        let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine");
        let mut files = vec![];
        rust_files(&engine, &mut files);
        assert!(files.len() > 20, "found only {files:?}");
        let allowed = [engine.join("main.rs"), engine.join("lib.rs")];
        let mut offenders = vec![];
        for f in files {
            if f.starts_with(engine.join("tools")) || allowed.contains(&f) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                // The code before any comment, as words: `crate::tools::bench`, `use
                // crate::{tools, ..}` and `mod tools` all hold the word `tools`.
                let code = line.split("//").next().unwrap_or("");
                let mut words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
                if words.any(|w| w == "tools") {
                    offenders.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "the engine must not import tools:\n{}",
            offenders.join("\n")
        );
    }
}
