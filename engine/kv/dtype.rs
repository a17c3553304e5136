//! How the GPU's KV cache holds keys and values (`--kv-dtype`).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::tiles::{ATTN_SPLIT_MMA_MAX_GROUP, BLOCK_SIZE};

/// The element of the GPU's KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KvDtype {
    /// bf16: keys and values as the projections made them, rounded to 8 significant bits.
    #[default]
    Bf16,
    /// fp8 e4m3 with a power-of-two scale per token and KV head (`kv::fp8`): about half the
    /// bytes a token, so twice the tokens resident and half the attention's reading, for 4
    /// significant bits a value.
    Fp8,
}

impl KvDtype {
    /// Bytes of KV cache one token holds on the GPU: every layer's key and value rows (and,
    /// in fp8, a scale byte a head row).
    pub fn bytes_per_token(self, c: &Config) -> usize {
        match self {
            KvDtype::Bf16 => 2 * c.n_layers * c.kv_dim() * 2,
            KvDtype::Fp8 => 2 * c.n_layers * (c.kv_dim() + c.n_kv_heads),
        }
    }

    /// Refuses a model whose heads the fp8 cache's attention kernels do not take: they stage
    /// 16 bytes of a head at a time through the tensor-core kernels, which take heads of 64,
    /// 128 or 256 and at most `ATTN_SPLIT_MMA_MAX_GROUP` query heads per KV head.
    pub fn check(self, c: &Config) -> Result<()> {
        let group = c.n_heads / c.n_kv_heads.max(1);
        match self {
            KvDtype::Fp8
                if !matches!(c.head_dim, 64 | 128 | 256) || group > ATTN_SPLIT_MMA_MAX_GROUP =>
            {
                Err(Error::Usage(format!(
                    "--kv-dtype fp8 takes heads 64, 128 or 256 wide with at most \
                     {ATTN_SPLIT_MMA_MAX_GROUP} query heads per KV head; this model's are {} wide, {group} per KV \
                     head (use --kv-dtype bf16)",
                    c.head_dim
                )))
            }
            _ => Ok(()),
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
        }
    }
}

/// Bytes of one block of `BLOCK_SIZE` tokens.
pub fn block_bytes(dtype: KvDtype, c: &Config) -> usize {
    dtype.bytes_per_token(c) * BLOCK_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fp8 cache holds a token in a little more than half the bf16 cache's bytes (a
    /// scale byte a head row of 128), so a pool of the same memory holds 1.98 times the
    /// tokens.
    #[test]
    fn fp8_holds_about_twice_the_tokens() {
        let c = crate::shapes::shape_config("llama3-8b").unwrap();
        let (bf16, fp8) = (
            KvDtype::Bf16.bytes_per_token(&c),
            KvDtype::Fp8.bytes_per_token(&c),
        );
        assert_eq!(bf16, 2 * 32 * 1024 * 2);
        assert_eq!(fp8, 2 * 32 * (1024 + 8));
        let ratio = bf16 as f64 / fp8 as f64;
        assert!(ratio > 1.98 && ratio < 2.0, "{ratio}");
    }

    /// Heads the fp8 cache's kernels do not take are refused before anything is allocated,
    /// with the reason and the way out.
    #[test]
    fn fp8_refuses_heads_its_kernels_do_not_take() {
        let mut c = crate::shapes::shape_config("llama3-8b").unwrap();
        assert!(KvDtype::Fp8.check(&c).is_ok());
        c.head_dim = 96;
        let e = KvDtype::Fp8.check(&c).unwrap_err().to_string();
        assert!(
            e.contains("96 wide") && e.contains("--kv-dtype bf16"),
            "{e}"
        );
        assert!(KvDtype::Bf16.check(&c).is_ok());
        c.head_dim = 128;
        c.n_kv_heads = 2; // 16 query heads a KV head
        assert!(KvDtype::Fp8.check(&c).is_err());
    }
}
