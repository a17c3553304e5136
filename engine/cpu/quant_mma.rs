//! The twins of the integer GEMV on the tensor cores (`gemv_mma_<type>`,
//! `gemv_swiglu_mma_<type>`, `gpu-kernels/src/gemv_mma.rs`): the same sums as `gemv_<type>`'s
//! (`quant::gemv_codes`), which the GPU adds up in another order, 16 weights an integer sum.

use super::quant::{gemv_codes, gemv_swiglu_codes};
use crate::kernel_args::{Blocks, MatmulShape};
use crate::weights::blocks::BlockType;

/// `gemv_mma_<type>` and `gemv_swiglu_mma_<type>`, each `gemv_codes` or `gemv_swiglu_codes`
/// of its type.
macro_rules! mma_twins {
    ($($ty:ident => $gemv:ident, $swiglu:ident;)*) => {$(
        #[doc = concat!("`gemv_codes` over `", stringify!($ty), "` weights.")]
        pub fn $gemv(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w: &[u8],
            bias: Option<&[f32]>,
            shape: MatmulShape,
        ) {
            let w = Blocks { ty: BlockType::$ty, bytes: w, row_scales: None };
            gemv_codes(out, codes, scales, w, bias, shape)
        }

        #[doc = concat!("`gemv_swiglu_codes` over `", stringify!($ty), "` weights.")]
        pub fn $swiglu(
            out: &mut [f32],
            codes: &[u8],
            scales: &[f32],
            w_gate: &[u8],
            w_up: &[u8],
            shape: MatmulShape,
        ) {
            let [w_gate, w_up] =
                [w_gate, w_up].map(|bytes| Blocks { ty: BlockType::$ty, bytes, row_scales: None });
            gemv_swiglu_codes(out, codes, scales, w_gate, w_up, shape)
        }
    )*};
}

mma_twins! {
    Q4K => gemv_mma_q4_k, gemv_swiglu_mma_q4_k;
    Q6K => gemv_mma_q6_k, gemv_swiglu_mma_q6_k;
}
