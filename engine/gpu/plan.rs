//! The matmul plan: which kernel a linear layer of `n` tokens runs, the form it reads its
//! input in, and the tiles and splits of its launch. `Pass::plan` decides it once per
//! matrix and token count; the kernel before the matmul makes the input the plan names
//! (a norm rounds to bf16 or makes 8-bit codes, `forward.rs`), and `matmul.rs` runs it.
//!
//! The rules, in the order they are asked (`Pass::plan`), each with the measurement behind
//! it in `docs/lessons.md`:
//!
//! 1. GGUF blocks, more tokens than the integer GEMV takes and up to
//!    `BLOCKS_MMA_MAX_TOKENS`: `gemm_<type>`, the tensor cores fed from the blocks.
//! 2. GGUF blocks, more, where every run of rows has `gemm_wgmma_<type>`: up to
//!    `WGMMA_BLOCKS_MAX_TOKENS`, or any number through a matrix larger than the dequantizing
//!    scratch (a batched step's output head).
//! 3. Blocks (GGUF or fp8), up to `QUANT_MAX_TOKENS` tokens, in the batch-invariant mode,
//!    or too large for the scratch: the quantized GEMV, `QUANT_MAX_TOKENS` tokens a launch.
//! 4. bf16, tokens kept in f32 this pass (one, or a few over GGUF blocks): `gemv_bf16`.
//! 5. fp8 on a GPU with fp8 tensor cores: `gemm_wgmma_fp8`.
//! 6. Otherwise bf16 on the tensor cores (a matrix of blocks dequantized to bf16 first):
//!    the skinny GEMM for a few tokens, the warpgroup (or `mma`) GEMM for more.

use std::sync::{Arc, RwLock};

use super::gemm_plan::{self, GemmPlan};
use super::kernels::gemm_blocks::{blocks_mma_splits, wgmma_blocks_fit};
use super::kernels::gemm_skinny::{SKINNY_MAX_TOKENS, skinny_splits};
use super::kernels::table::GemmSlots;
use super::matrix::{GpuMatrix, MatrixData};
use super::tuned_plans::TunedPlans;
use crate::tiles::{BLOCKS_MMA_MAX_TOKENS, BLOCKS_MMA_STAGE_K, QUANT_MAX_TOKENS};
use crate::weights::blocks::BlockType;

/// Most tokens a matmul over GGUF blocks takes through `gemm_wgmma_<type>` (where the type
/// has it): past them, dequantizing the matrix to bf16 once for `gemm_wgmma_bf16` costs
/// less than decoding the blocks in every tile of tokens (Q8_0 on the H200: 128 tokens 12.5
/// ms against 14.1, 192 tokens 16.8 against 15.4; `docs/lessons.md#prefill-on-tensor-cores`).
pub const WGMMA_BLOCKS_MAX_TOKENS: usize = 128;

/// Where `gemm_wgmma_bf16` exists, the skinny matmul takes at most this many tokens: at 16
/// tokens the two are even on Llama 3 8B's matrices, at 64 the warpgroup GEMM is a third
/// faster (H200, `docs/lessons.md#batched-decode-and-the-gemm`).
pub const SKINNY_OVER_WGMMA_TOKENS: usize = 16;

/// What this GPU and this model's scratch let the plans choose from.
#[derive(Clone, Debug)]
pub struct Caps {
    /// `gemm_wgmma_bf16` (Hopper's warpgroup tensor cores).
    pub wgmma: bool,
    /// `gemm_wgmma_fp8`, with the scratch for its e4m3 activations (some matrix is fp8).
    pub fp8_cores: bool,
    /// The GGUF types whose `gemm_wgmma_<type>` this build has.
    pub wgmma_blocks: Vec<BlockType>,
    pub sm_count: usize,
    /// Blocks of each tensor-core GEMM that run at once.
    pub slots: GemmSlots,
    /// The warpgroup GEMM's plans measured on this GPU (`Gpu::tuned_plans`).
    pub tuned: Arc<RwLock<TunedPlans>>,
    /// Elements of the bf16 scratch a matrix of blocks is dequantized into for the bf16
    /// GEMMs (the largest layer matrix held in blocks; 0 where there is none).
    pub dequant_room: usize,
}

/// What one forward pass decides for all its matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Every matmul through the skinny kernel or the quantized GEMV, whose sums for a token
    /// do not depend on the other tokens of the launch (`GpuBackend::set_batch_invariant`).
    pub invariant: bool,
    /// Most tokens a matmul over GGUF blocks takes through the integer GEMV rather than
    /// `gemm_<type>`: a decode step's `Gpu::decode_gemv_tokens`, else `QUANT_MAX_TOKENS`
    /// (a short prompt keeps the GEMV for its accuracy: the golden 5-token prompt's first
    /// logit came out 25.48 through `gemm_q4_1`'s bf16 activations against transformers'
    /// 24.91, and within 0.3 through the GEMV's codes).
    pub blocks_gemv_tokens: usize,
    /// Every matrix is GGUF blocks (`GpuWeights::all_codes`): the pass keeps up to
    /// `blocks_gemv_tokens` tokens in f32 for the integer GEMV and its fusions.
    pub all_codes: bool,
}

impl Rules {
    /// Most tokens this pass keeps in f32 for the GEMVs: one, or `blocks_gemv_tokens` where
    /// every matrix is GGUF blocks, whose GEMV takes that many tokens' codes at once.
    pub fn gemv_tokens(&self) -> usize {
        match self.all_codes {
            true => self.blocks_gemv_tokens,
            false => 1,
        }
    }

    /// Whether `n` tokens go to the tensor cores, their activations rounded to bf16 (by the
    /// kernel that makes them: a norm, the attention's combine, the SwiGLU), rather than to
    /// the GEMVs in f32.
    pub fn rounds(&self, n: usize) -> bool {
        n > self.gemv_tokens() || self.invariant
    }
}

/// The form a matmul's kernel reads its input in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// f32 rows: the GEMVs of bf16 and fp8 weights.
    F32,
    /// bf16 rows: the tensor-core GEMMs.
    Bf16,
    /// 8-bit codes with a scale per 32 (`quantize_q8_f32`): the integer GEMV over GGUF
    /// blocks.
    Codes,
    /// e4m3 with a scale per token (`quantize_fp8_f32`): fp8's tensor-core GEMM.
    E4m3,
}

/// The kernel a matmul runs, with its launch's tiles and splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `gemv_bf16`: one token.
    GemvBf16,
    /// `gemv_<type>` over codes, or `gemv_fp8` over f32: `QUANT_MAX_TOKENS` tokens a launch.
    GemvBlocks,
    /// `gemm_<type>`, its reduction split this many ways (`blocks_mma_splits`).
    GemmBlocks { splits: usize },
    /// `gemm_wgmma_<type>` on this plan.
    WgmmaBlocks(GemmPlan),
    /// `gemm_wgmma_fp8` on this plan.
    WgmmaFp8(GemmPlan),
    /// `gemm_skinny_bf16`, its reduction split this many ways (`skinny_splits`),
    /// `SKINNY_MAX_TOKENS` tokens a launch.
    Skinny { splits: usize },
    /// `gemm_wgmma_bf16` on this plan.
    WgmmaBf16(GemmPlan),
    /// `gemm_mma_bf16` on this plan (a GPU without `wgmma`).
    MmaBf16(GemmPlan),
}

/// How a matmul of `n` tokens runs: one decision that the kernel before it (which makes its
/// input) and the matmul itself both follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kernel: Kernel,
    /// The form the kernel reads `x` in.
    pub input: Form,
    /// The matrix is held in blocks and this bf16 kernel reads it dequantized into the
    /// scratch first.
    pub dequantize: bool,
}

impl Plan {
    /// Whether the kernel adds its result into the output itself (in its epilogue, or in
    /// the in-order sum of a split reduction), so that a residual add costs no launch. The
    /// others write a scratch buffer that `residual_add_f32` adds.
    pub fn adds_in_place(&self) -> bool {
        match self.kernel {
            Kernel::WgmmaBf16(p) | Kernel::WgmmaFp8(p) => p.k_splits > 1,
            Kernel::MmaBf16(_) => false,
            _ => true,
        }
    }
}

/// A matrix as the plans see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held<'a> {
    Bf16,
    /// One run of fp8 rows (`--weights fp8`).
    Fp8,
    /// Runs of GGUF blocks, one type each.
    Gguf(&'a [BlockType]),
}

impl Caps {
    /// The plan for `n` tokens through `w` under this pass's `rules`.
    pub fn plan(&self, rules: &Rules, w: &GpuMatrix, n: usize) -> Plan {
        let types: Vec<BlockType> = match &w.data {
            MatrixData::Bf16(_) => vec![],
            MatrixData::Blocks(parts) => parts.iter().map(|p| p.ty).collect(),
        };
        let held = match (&w.data, types.as_slice()) {
            (MatrixData::Bf16(_), _) => Held::Bf16,
            (_, [BlockType::Fp8]) => Held::Fp8,
            (_, types) => Held::Gguf(types),
        };
        self.plan_for(rules, held, n, w.n_in, w.n_out)
    }

    fn plan_for(&self, rules: &Rules, w: Held, n: usize, n_in: usize, n_out: usize) -> Plan {
        let plan = |kernel, input| Plan {
            kernel,
            input,
            dequantize: false,
        };
        let fits_scratch = self.dequant_room >= n_in * n_out;
        if let Held::Gguf(types) = w
            && !rules.invariant
        {
            let few = (rules.blocks_gemv_tokens + 1..=BLOCKS_MMA_MAX_TOKENS).contains(&n);
            if few && n_in.is_multiple_of(BLOCKS_MMA_STAGE_K) {
                let splits = blocks_mma_splits(n_in, n_out, self.sm_count);
                return plan(Kernel::GemmBlocks { splits }, Form::Bf16);
            }
            let warpgroup = types.iter().all(|&ty| self.has_wgmma_blocks(ty, n_in));
            let many = n > BLOCKS_MMA_MAX_TOKENS && (n <= WGMMA_BLOCKS_MAX_TOKENS || !fits_scratch);
            if many && warpgroup {
                let tiles = gemm_plan::wgmma_blocks(n, n_in, n_out, self.sm_count);
                return plan(Kernel::WgmmaBlocks(tiles), Form::Bf16);
            }
        }
        let fp8_cores = w == Held::Fp8 && self.fp8_cores && !rules.invariant;
        if w != Held::Bf16 {
            let gemv = n <= QUANT_MAX_TOKENS || rules.invariant || !(fp8_cores || fits_scratch);
            // The GGUF types' GEMV reads codes; chunks past the first `QUANT_MAX_TOKENS` are
            // made into codes from f32 inside it.
            let input = match w {
                Held::Gguf(_) if n <= QUANT_MAX_TOKENS => Form::Codes,
                _ => Form::F32,
            };
            if gemv {
                return plan(Kernel::GemvBlocks, input);
            }
        }
        if !rules.rounds(n) {
            assert!(
                w == Held::Bf16,
                "a matrix of blocks takes the quantized GEMV"
            );
            return plan(Kernel::GemvBf16, Form::F32);
        }
        if fp8_cores {
            let tiles = self.wgmma_plan(n, n_in, n_out);
            return plan(Kernel::WgmmaFp8(tiles), Form::E4m3);
        }
        let skinny = match self.wgmma && !rules.invariant {
            true => n <= SKINNY_OVER_WGMMA_TOKENS,
            false => rules.invariant || n <= SKINNY_MAX_TOKENS,
        };
        let kernel = if skinny {
            Kernel::Skinny {
                splits: skinny_splits(n_in, n_out, self.sm_count),
            }
        } else if self.wgmma {
            Kernel::WgmmaBf16(self.wgmma_plan(n, n_in, n_out))
        } else {
            Kernel::MmaBf16(gemm_plan::mma(n, n_in, n_out, self.slots.mma))
        };
        Plan {
            kernel,
            input: Form::Bf16,
            dequantize: w != Held::Bf16,
        }
    }

    /// The warpgroup GEMM's plan: measured where the table has the shape, else estimated
    /// (`Gpu::wgmma_plan` looks up the same table).
    fn wgmma_plan(&self, n: usize, n_in: usize, n_out: usize) -> GemmPlan {
        let tuned = self.tuned.read().expect("the plan table's lock");
        tuned.wgmma(n, n_in, n_out, self.slots.wgmma)
    }

    /// Whether `gemm_wgmma_<ty>` runs here for rows of `n_in` weights.
    fn has_wgmma_blocks(&self, ty: BlockType, n_in: usize) -> bool {
        self.wgmma_blocks.contains(&ty) && wgmma_blocks_fit(ty, n_in)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: usize = 132;

    fn hopper() -> Caps {
        Caps {
            wgmma: true,
            fp8_cores: true,
            wgmma_blocks: BlockType::ALL
                .into_iter()
                .filter(|&t| t != BlockType::Fp8)
                .collect(),
            sm_count: H100,
            slots: GemmSlots {
                mma: 2 * H100,
                wgmma: H100,
            },
            tuned: Arc::default(),
            dequant_room: 14336 * 4096,
        }
    }

    fn ampere() -> Caps {
        Caps {
            wgmma: false,
            fp8_cores: false,
            wgmma_blocks: vec![],
            ..hopper()
        }
    }

    const DECODE: Rules = Rules {
        invariant: false,
        blocks_gemv_tokens: 2,
        all_codes: true,
    };
    const PROMPT: Rules = Rules {
        invariant: false,
        blocks_gemv_tokens: QUANT_MAX_TOKENS,
        all_codes: true,
    };

    fn kernel(caps: &Caps, rules: &Rules, w: Held, n: usize) -> Kernel {
        caps.plan_for(rules, w, n, 4096, 4096).kernel
    }

    fn name(k: Kernel) -> &'static str {
        match k {
            Kernel::GemvBf16 => "gemv_bf16",
            Kernel::GemvBlocks => "gemv",
            Kernel::GemmBlocks { .. } => "gemm_<type>",
            Kernel::WgmmaBlocks(_) => "gemm_wgmma_<type>",
            Kernel::WgmmaFp8(_) => "gemm_wgmma_fp8",
            Kernel::Skinny { .. } => "skinny",
            Kernel::WgmmaBf16(_) => "gemm_wgmma_bf16",
            Kernel::MmaBf16(_) => "gemm_mma_bf16",
        }
    }

    /// A Q4_K matrix across the token counts of decode steps and prompts.
    #[test]
    fn gguf_blocks_take_the_gemv_then_their_tensor_core_kernels() {
        let (h, q4k) = (hopper(), Held::Gguf(&[BlockType::Q4K]));
        let at = |rules, n| name(kernel(&h, &rules, q4k, n));
        assert_eq!(at(DECODE, 1), "gemv");
        assert_eq!(at(DECODE, 2), "gemv");
        assert_eq!(at(DECODE, 3), "gemm_<type>");
        assert_eq!(at(DECODE, 64), "gemm_<type>");
        assert_eq!(at(DECODE, 65), "gemm_wgmma_<type>");
        assert_eq!(at(DECODE, 128), "gemm_wgmma_<type>");
        // Past 128 tokens the matrix is dequantized for the bf16 GEMM.
        let big = h.plan_for(&DECODE, q4k, 129, 4096, 4096);
        assert_eq!(name(big.kernel), "gemm_wgmma_bf16");
        assert!(big.dequantize && big.input == Form::Bf16);
        // A short prompt keeps the GEMV (its codes) up to 8 tokens.
        assert_eq!(at(PROMPT, 8), "gemv");
        assert_eq!(at(PROMPT, 9), "gemm_<type>");
        // An output head larger than the dequantizing scratch never dequantizes.
        let head = h.plan_for(&DECODE, q4k, 512, 4096, 128_256);
        assert_eq!(name(head.kernel), "gemm_wgmma_<type>");
        // Without the warpgroup kernel, the head takes the GEMV in launches of 8.
        let head = ampere().plan_for(&DECODE, q4k, 512, 4096, 128_256);
        assert_eq!((name(head.kernel), head.input), ("gemv", Form::F32));
    }

    #[test]
    fn the_gemv_over_gguf_blocks_reads_codes_up_to_its_tokens() {
        let h = hopper();
        let plan = h.plan_for(&DECODE, Held::Gguf(&[BlockType::Q8_0]), 2, 4096, 4096);
        assert_eq!(plan.input, Form::Codes);
        let fp8 = h.plan_for(&DECODE, Held::Fp8, 1, 4096, 4096);
        assert_eq!((fp8.kernel, fp8.input), (Kernel::GemvBlocks, Form::F32));
    }

    #[test]
    fn a_mix_takes_the_warpgroup_kernel_only_if_every_type_has_it() {
        let mut h = hopper();
        let mix = Held::Gguf(&[BlockType::Q4K, BlockType::Q6K]);
        assert_eq!(name(kernel(&h, &DECODE, mix, 100)), "gemm_wgmma_<type>");
        h.wgmma_blocks.retain(|&t| t != BlockType::Q6K);
        assert_eq!(name(kernel(&h, &DECODE, mix, 100)), "gemm_wgmma_bf16");
    }

    #[test]
    fn bf16_takes_the_gemv_then_skinny_then_the_prompt_gemm() {
        let (h, a) = (hopper(), ampere());
        let bf16 = Rules {
            all_codes: false,
            ..DECODE
        };
        assert_eq!(name(kernel(&h, &bf16, Held::Bf16, 1)), "gemv_bf16");
        assert_eq!(name(kernel(&h, &bf16, Held::Bf16, 2)), "skinny");
        assert_eq!(name(kernel(&h, &bf16, Held::Bf16, 16)), "skinny");
        assert_eq!(name(kernel(&h, &bf16, Held::Bf16, 17)), "gemm_wgmma_bf16");
        // Without wgmma the skinny kernel takes up to 128 tokens, then `mma`.
        assert_eq!(name(kernel(&a, &bf16, Held::Bf16, 128)), "skinny");
        assert_eq!(name(kernel(&a, &bf16, Held::Bf16, 129)), "gemm_mma_bf16");
    }

    #[test]
    fn fp8_takes_its_tensor_cores_past_the_gemv() {
        let (h, a) = (hopper(), ampere());
        let fp8 = Rules {
            all_codes: false,
            ..DECODE
        };
        let plan = h.plan_for(&fp8, Held::Fp8, 9, 4096, 4096);
        assert_eq!(
            (name(plan.kernel), plan.input),
            ("gemm_wgmma_fp8", Form::E4m3)
        );
        // No fp8 tensor cores: dequantized for the bf16 kernels.
        let plan = a.plan_for(&fp8, Held::Fp8, 9, 4096, 4096);
        assert_eq!(name(plan.kernel), "skinny");
        assert!(plan.dequantize);
    }

    /// The batch-invariant mode: a token's sums never depend on its neighbours, so every
    /// matmul takes the GEMV (blocks) or the skinny kernel (bf16), whatever the count.
    #[test]
    fn the_batch_invariant_mode_takes_only_per_token_kernels() {
        let rules = Rules {
            invariant: true,
            ..DECODE
        };
        for caps in [hopper(), ampere()] {
            for n in [1, 2, 9, 100, 1000] {
                let q4k = Held::Gguf(&[BlockType::Q4K]);
                assert_eq!(kernel(&caps, &rules, q4k, n), Kernel::GemvBlocks);
                assert_eq!(kernel(&caps, &rules, Held::Fp8, n), Kernel::GemvBlocks);
                assert_eq!(name(kernel(&caps, &rules, Held::Bf16, n)), "skinny");
            }
        }
    }

    #[test]
    fn only_the_split_warpgroup_gemms_and_the_mma_gemm_add_apart() {
        let (h, a) = (hopper(), ampere());
        let bf16 = Rules {
            all_codes: false,
            ..PROMPT
        };
        // o_proj at 512 tokens is unsplit, down (14336 deep) split in two.
        let o = h.plan_for(&bf16, Held::Bf16, 512, 4096, 4096);
        let down = h.plan_for(&bf16, Held::Bf16, 512, 14336, 4096);
        assert!(!o.adds_in_place() && down.adds_in_place());
        assert!(
            !a.plan_for(&bf16, Held::Bf16, 512, 14336, 4096)
                .adds_in_place()
        );
        assert!(h.plan_for(&bf16, Held::Bf16, 8, 4096, 4096).adds_in_place());
    }
}
