//! The macro that writes the GGUF types' GEMV twins by kernel name: `quant.rs`'s
//! (`gemv_q4_k`, `gemv_swiglu_q4_k`, ...) and `quant_mma.rs`'s (`gemv_mma_q4_k`, ...), whose
//! kernels compute the same sums. It names `Blocks`, `BlockType`, `MatmulShape`, `gemv_codes`
//! and `gemv_swiglu_codes`, which the file that calls it brings into scope.

/// GEMV twins by kernel name, each `gemv_codes` or `gemv_swiglu_codes` of its type.
macro_rules! gemv_twins {
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

pub(crate) use gemv_twins;
