//! The twins of the integer GEMV on the tensor cores (`gemv_mma_<type>`,
//! `gemv_swiglu_mma_<type>`, `gpu-kernels/src/gemv_mma.rs`): the same sums as `gemv_<type>`'s
//! (`quant::gemv_codes`), which the GPU adds up in another order, 16 weights an integer sum.

use super::quant::{gemv_codes, gemv_swiglu_codes};
use super::twins::gemv_twins;
use crate::kernel_args::{Blocks, MatmulShape};
use crate::weights::blocks::BlockType;

gemv_twins! {
    Q4_1 => gemv_mma_q4_1, gemv_swiglu_mma_q4_1;
    Q8_0 => gemv_mma_q8_0, gemv_swiglu_mma_q8_0;
    Q4K => gemv_mma_q4_k, gemv_swiglu_mma_q4_k;
    Q6K => gemv_mma_q6_k, gemv_swiglu_mma_q6_k;
}
