//! The fast backend's steps timed for `rustle profile --device cpu`, as `cpu::timed` times the
//! reference's: while a profile is recorded, each step of the forward is timed by the clock
//! and counted in bytes and FLOPs, under a name that says what ran (`matmul_q4_1` is a
//! matmul over Q4_1 weights, the kernel chosen by the number of tokens).

use std::time::Instant;

use super::weights::Matrix;
use crate::traffic::{KernelTime, Traffic};
use crate::weights::DType;

#[derive(Default)]
pub struct Recorder {
    /// Every step since `start`, while profiling.
    record: Option<Vec<KernelTime>>,
}

impl Recorder {
    pub fn start(&mut self) {
        self.record = Some(vec![]);
    }

    pub fn recording(&self) -> bool {
        self.record.is_some()
    }

    pub fn stop(&mut self) -> Vec<KernelTime> {
        self.record.take().unwrap_or_default()
    }

    /// Runs `op`; while profiling, records its time under `kernel` with `traffic` (worked
    /// out only then).
    pub fn time<R>(
        &mut self,
        kernel: &'static str,
        traffic: impl FnOnce() -> Traffic,
        op: impl FnOnce() -> R,
    ) -> R {
        let Some(record) = self.record.as_mut() else {
            return op();
        };
        let start = Instant::now();
        let r = op();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        record.push(KernelTime {
            kernel,
            ms,
            traffic: traffic(),
        });
        r
    }
}

/// A matmul's name: the stored type of its (first) matrix.
pub fn matmul_name(w: &Matrix) -> &'static str {
    match w.dtype {
        DType::F32 => "matmul_f32",
        DType::F16 => "matmul_f16",
        DType::BF16 => "matmul_bf16",
        DType::Q4_0 => "matmul_q4_0",
        DType::Q4_1 => "matmul_q4_1",
        DType::Q5_0 => "matmul_q5_0",
        DType::Q5_1 => "matmul_q5_1",
        DType::Q8_0 => "matmul_q8_0",
        DType::Q2K => "matmul_q2_k",
        DType::Q3K => "matmul_q3_k",
        DType::Q4K => "matmul_q4_k",
        DType::Q5K => "matmul_q5_k",
        DType::Q6K => "matmul_q6_k",
        DType::IQ4NL => "matmul_iq4_nl",
        DType::IQ4XS => "matmul_iq4_xs",
        DType::Ggml(_) | DType::Other(_) => "matmul",
    }
}

/// Matrices as stored, each read once; `n` rows of the input read and of each output
/// written, in f32; two FLOPs per weight per token.
pub fn matmul(n: usize, n_in: usize, matrices: &[&Matrix]) -> Traffic {
    let n = n as u64;
    let outs: u64 = matrices.iter().map(|m| m.rows as u64).sum();
    let weights: u64 = matrices.iter().map(|m| m.bytes.len() as u64).sum();
    Traffic {
        bytes: weights + 4 * n * (n_in as u64 + outs),
        flops: 2 * n * n_in as u64 * outs,
    }
}

/// Each token's row of the embedding as stored, read, and written in f32.
pub fn embedding(w: &Matrix, n: usize) -> Traffic {
    Traffic {
        bytes: n as u64 * (w.row_bytes as u64 + 4 * w.cols as u64),
        flops: 0,
    }
}

/// Keys and values read in f32, written in bf16.
pub fn kv_write_bf16(n: usize, kv_dim: usize) -> Traffic {
    Traffic {
        bytes: 2 * (n * kv_dim) as u64 * (4 + 2),
        flops: 0,
    }
}
