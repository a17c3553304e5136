//! A weight matrix on the device: bf16, or quantized blocks as the file stores them (or as
//! `--weights fp8` makes them), and how the model's matrices get there.

use cudarc::driver::CudaSlice;

use super::context::Gpu;
use super::kernels::gemv_quant::BlocksIn;
use crate::cpu::quant::random_blocks;
use crate::error::Result;
use crate::kernel_args::Blocks;
use crate::model::Stored;
use crate::weights::blocks::{BlockType, quantize_fp8};

/// How `GpuWeights::upload` holds the matrices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightFormat {
    /// As the files store them: GGUF blocks the kernels read stay blocks; 16- and 32-bit
    /// weights, and blocks they do not read, become bf16.
    #[default]
    Stored,
    /// Every matrix in bf16 (quantized ones dequantized at load).
    Bf16,
    /// Every matrix in fp8 e4m3 with a scale per row, quantized at load.
    Fp8,
}

/// Rows of one block type, `[rows, row_bytes]`.
pub struct BlockPart {
    pub ty: BlockType,
    pub rows: usize,
    pub bytes: CudaSlice<u8>,
    /// `[rows]` fp8's scales.
    pub scales: Option<CudaSlice<f32>>,
}

impl BlockPart {
    /// The part as a matmul's wrapper takes it: its type, bytes and scales.
    pub fn view(&self) -> BlocksIn<'_> {
        Blocks {
            ty: self.ty,
            bytes: self.bytes.as_view(),
            row_scales: self.scales.as_ref().map(|s| s.as_view()),
        }
    }
}

/// bf16 bits of each value, rounded to nearest even.
pub fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

/// A `[n_out, n_in]` matrix on the device.
pub struct GpuMatrix {
    /// Output features: rows.
    pub n_out: usize,
    /// Input features: the weights of a row.
    pub n_in: usize,
    pub data: MatrixData,
}

/// How a matrix's weights are held.
pub enum MatrixData {
    /// bf16 bits.
    Bf16(CudaSlice<u16>),
    /// Runs of rows, each of one block type (a fused q/k/v whose v is stored in more bits
    /// than q and k is two or three).
    Blocks(Vec<BlockPart>),
}

impl GpuMatrix {
    /// Bytes on the device (scales included).
    pub fn bytes(&self) -> usize {
        match &self.data {
            MatrixData::Bf16(w) => 2 * w.len(),
            MatrixData::Blocks(parts) => parts
                .iter()
                .map(|p| p.bytes.len() + 4 * p.scales.as_ref().map_or(0, |s| s.len()))
                .sum(),
        }
    }

    /// The bf16 buffer, if the matrix is one.
    pub fn as_bf16(&self) -> Option<&CudaSlice<u16>> {
        match &self.data {
            MatrixData::Bf16(w) => Some(w),
            MatrixData::Blocks(_) => None,
        }
    }

    /// The matrix's one run of rows, if it is fp8 (`--weights fp8`) through and through.
    pub fn as_fp8(&self) -> Option<&BlockPart> {
        match &self.data {
            MatrixData::Blocks(parts) => match parts.as_slice() {
                [p] if p.ty == BlockType::Fp8 => Some(p),
                _ => None,
            },
            MatrixData::Bf16(_) => None,
        }
    }

    /// Whether the matrix is GGUF blocks through and through (no fp8 rows, no bf16): its
    /// GEMV reads its input as 8-bit codes alone.
    pub fn is_gguf(&self) -> bool {
        match &self.data {
            MatrixData::Blocks(parts) => parts.iter().all(|p| p.ty != BlockType::Fp8),
            MatrixData::Bf16(_) => false,
        }
    }
}

/// A matrix's runs of rows of one block type, each with its first row: where its outputs
/// start in a token's row of `n_out`.
pub fn row_runs(parts: &[BlockPart]) -> impl Iterator<Item = (usize, &BlockPart)> {
    parts.iter().scan(0, |row, p| {
        let first = *row;
        *row += p.rows;
        Some((first, p))
    })
}

/// One piece of a stacked matrix: its tensor's name, its values as the CPU holds them (each
/// head's rows already in the kernels' order), and for Q and K the number of heads whose
/// stored rows move to that order (`model::HeadOrder`).
pub struct Piece<'a> {
    pub name: String,
    pub values: &'a [f32],
    pub heads: Option<usize>,
}

/// Builds the device matrices, remembering the quantized tensors it turned into bf16.
pub struct Uploader<'a> {
    pub gpu: &'a Gpu,
    pub format: WeightFormat,
    pub stored: Option<&'a Stored>,
    /// Names and types of stored blocks the kernels do not read (held in bf16).
    pub fallbacks: Vec<String>,
}

impl Uploader<'_> {
    /// `pieces` stacked by rows into one `[sum of rows, n_in]` matrix.
    pub fn matrix(&mut self, pieces: &[Piece], n_in: usize, what: &str) -> Result<GpuMatrix> {
        let n_out = pieces.iter().map(|p| p.values.len()).sum::<usize>() / n_in;
        let data = self.data(pieces, n_in, what)?;
        Ok(GpuMatrix { n_out, n_in, data })
    }

    fn data(&mut self, pieces: &[Piece], n_in: usize, what: &str) -> Result<MatrixData> {
        let bf16 = |gpu: &Gpu| {
            let all: Vec<f32> = pieces
                .iter()
                .flat_map(|p| p.values.iter().copied())
                .collect();
            Ok(MatrixData::Bf16(gpu.upload(&to_bf16(&all), what)?))
        };
        match self.format {
            WeightFormat::Bf16 => bf16(self.gpu),
            WeightFormat::Fp8 => {
                let all: Vec<f32> = pieces
                    .iter()
                    .flat_map(|p| p.values.iter().copied())
                    .collect();
                let (bytes, scales) = quantize_fp8(&all, n_in);
                let part = self.part(BlockType::Fp8, &bytes, Some(&scales), n_in, what)?;
                Ok(MatrixData::Blocks(vec![part]))
            }
            WeightFormat::Stored => {
                let Some(blocks) = self.stored_blocks(pieces, n_in) else {
                    return bf16(self.gpu);
                };
                // Consecutive pieces of one type share a part.
                let mut runs: Vec<(BlockType, Vec<u8>)> = vec![];
                for (ty, bytes) in blocks {
                    match runs.last_mut() {
                        Some((t, b)) if *t == ty => b.extend_from_slice(&bytes),
                        _ => runs.push((ty, bytes)),
                    }
                }
                let parts = runs
                    .iter()
                    .map(|(ty, bytes)| self.part(*ty, bytes, None, n_in, what))
                    .collect::<Result<_>>()?;
                Ok(MatrixData::Blocks(parts))
            }
        }
    }

    /// Each piece's stored bytes (heads' rows reordered where asked) if every piece is blocks the
    /// kernels read; `None` otherwise (noting quantized pieces that will be bf16).
    fn stored_blocks(
        &mut self,
        pieces: &[Piece],
        n_in: usize,
    ) -> Option<Vec<(BlockType, Vec<u8>)>> {
        let stored = self.stored?;
        let mut out = vec![];
        for p in pieces {
            let t = stored.weights.tensors.get(&p.name)?;
            let ty = BlockType::of(t.dtype).filter(|ty| ty.fits(n_in));
            let Some(ty) = ty else {
                if t.dtype.block_len() > 1 {
                    self.fallbacks.push(format!("{} ({})", p.name, t.dtype));
                }
                return None;
            };
            let bytes = stored
                .weights
                .files
                .get(t.file)?
                .get(t.offset..t.offset + t.n_bytes)?;
            let bytes = match p.heads {
                Some(heads) if !stored.head_order.is_identity() => {
                    crate::model::reorder_rows(bytes, heads, &stored.head_order)
                }
                _ => bytes.to_vec(),
            };
            out.push((ty, bytes));
        }
        Some(out)
    }

    fn part(
        &self,
        ty: BlockType,
        bytes: &[u8],
        scales: Option<&[f32]>,
        n_in: usize,
        what: &str,
    ) -> Result<BlockPart> {
        Ok(BlockPart {
            ty,
            rows: bytes.len() / ty.row_bytes(n_in),
            bytes: self.gpu.upload(bytes, what)?,
            scales: scales.map(|s| self.gpu.upload(s, what)).transpose()?,
        })
    }
}

/// A random `[rows, n_in]` matrix of `ty` (benchmarks), weights about ±1/sqrt(n_in).
pub fn random_matrix(
    gpu: &Gpu,
    ty: BlockType,
    rows: usize,
    n_in: usize,
    seed: u32,
    what: &str,
) -> Result<GpuMatrix> {
    let (bytes, scales) = random_blocks(ty, rows, n_in, 1.0 / (n_in as f32).sqrt(), seed);
    let part = BlockPart {
        ty,
        rows,
        bytes: gpu.upload(&bytes, what)?,
        scales: scales.map(|s| gpu.upload(&s, what)).transpose()?,
    };
    Ok(GpuMatrix {
        n_out: rows,
        n_in,
        data: MatrixData::Blocks(vec![part]),
    })
}

/// The matrix types of synthetic weights (`rustle bench --weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Synthetic {
    #[default]
    Bf16,
    /// Every matrix in one block type.
    Blocks(BlockType),
    /// A Q4_K_M (`Q4K`) or Q5_K_M (`Q5K`) file's mix, as llama.cpp's quantizer makes it:
    /// that type, with attn_v and ffn_down in Q6_K in a layer that gets more bits (the first
    /// and last eighth of the layers and every third between) and the output head in Q6_K.
    KMix(BlockType),
}

impl Synthetic {
    pub const NAMES: &str =
        "bf16, fp8, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";
    /// The k-quants that have a `_m` mix.
    const MIXES: [BlockType; 2] = [BlockType::Q4K, BlockType::Q5K];

    pub fn parse(s: &str) -> Option<Synthetic> {
        if s == "bf16" {
            return Some(Synthetic::Bf16);
        }
        if let Some(t) = Self::MIXES.into_iter().find(|t| format!("{t}_m") == s) {
            return Some(Synthetic::KMix(t));
        }
        BlockType::ALL
            .into_iter()
            .find(|t| t.to_string() == s)
            .map(Synthetic::Blocks)
    }

    /// The name `--weights` takes.
    pub fn name(self) -> String {
        match self {
            Synthetic::Bf16 => "bf16".into(),
            Synthetic::Blocks(t) => t.to_string(),
            Synthetic::KMix(t) => format!("{t}_m"),
        }
    }

    /// Most matrices' type (`None`: bf16).
    pub fn ty(self) -> Option<BlockType> {
        match self {
            Synthetic::Bf16 => None,
            Synthetic::Blocks(t) | Synthetic::KMix(t) => Some(t),
        }
    }

    /// Layer `l`'s type for v and down.
    pub fn wider(self, l: usize, n_layers: usize) -> Option<BlockType> {
        let eighth = n_layers / 8;
        let more_bits = l < eighth || l >= 7 * n_layers / 8 || (l - eighth) % 3 == 2;
        match self {
            Synthetic::KMix(_) if more_bits => Some(BlockType::Q6K),
            _ => self.ty(),
        }
    }

    /// The output head's type.
    pub fn head(self) -> Option<BlockType> {
        match self {
            Synthetic::KMix(_) => Some(BlockType::Q6K),
            _ => self.ty(),
        }
    }
}

/// `--weights`: for a model file, `stored` (the default), `bf16` or `fp8`; for a synthetic
/// shape, `bf16` (the default), `fp8`, a GGUF block type, `q4_k_m` or `q5_k_m`.
pub fn parse_weights(s: &str, model: bool) -> Result<(WeightFormat, Synthetic), String> {
    match (s, model) {
        ("stored", true) => Ok((WeightFormat::Stored, Synthetic::Bf16)),
        ("bf16", true) => Ok((WeightFormat::Bf16, Synthetic::Bf16)),
        ("fp8", true) => Ok((WeightFormat::Fp8, Synthetic::Bf16)),
        (s, true) => Err(format!(
            "--weights {s}: a model's matrices are held as stored, in bf16 or in fp8"
        )),
        (s, false) => Synthetic::parse(s)
            .map(|k| (WeightFormat::Stored, k))
            .ok_or_else(|| {
                format!(
                    "--weights {s}: synthetic weights are one of {}",
                    Synthetic::NAMES
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_argument_depends_on_model_or_shape() {
        assert_eq!(parse_weights("fp8", true).unwrap().0, WeightFormat::Fp8);
        assert!(
            parse_weights("q4_k", true)
                .unwrap_err()
                .contains("as stored")
        );
        assert_eq!(
            parse_weights("q4_k_m", false).unwrap().1,
            Synthetic::KMix(BlockType::Q4K)
        );
        let q5_k_m = parse_weights("q5_k_m", false).unwrap().1;
        assert_eq!(q5_k_m, Synthetic::KMix(BlockType::Q5K));
        assert_eq!(q5_k_m.name(), "q5_k_m");
        assert!(parse_weights("q6_k_m", false).is_err());
        assert_eq!(
            parse_weights("q6_k", false).unwrap().1,
            Synthetic::Blocks(BlockType::Q6K)
        );
        assert!(parse_weights("q3_k", false).unwrap_err().contains("q4_k_m"));
    }
}
