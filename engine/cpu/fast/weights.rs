//! The fast backend's weights: every matrix as the file stores it (GGUF blocks stay
//! quantized, bf16 and f16 stay 16-bit), norms and biases in f32. Memory is the file's
//! tensor bytes, give or take the f32 copies of the small vectors.

use crate::error::{Error, Result};
use crate::model::{HeadOrder, MatrixFormat, ModelWeights, reorder_rows};
use crate::weights::{DType, Weights};

/// One matrix `[rows, cols]` in its stored type: each row is `cols / block_len` blocks back
/// to back, `row_bytes` bytes (GGUF's blocks run along a row, so a row stands alone).
pub struct Matrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// `[rows, row_bytes]`
    pub bytes: Vec<u8>,
}

impl Matrix {
    /// Row `r`'s stored bytes.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// A matrix over `bytes`, checked: the type must be one rustle reads, and the bytes must
    /// be exactly `rows` rows of whole blocks.
    pub fn new(name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        let bad = |found: String| Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}] in whole blocks"),
            found,
        };
        if !dtype.is_loadable() {
            return Err(bad(format!("{dtype}, which rustle does not read")));
        }
        if !cols.is_multiple_of(dtype.block_len()) {
            return Err(bad(format!(
                "{dtype} rows of {cols}, not a multiple of its block of {}",
                dtype.block_len()
            )));
        }
        let row_bytes = cols / dtype.block_len() * dtype.block_bytes();
        if bytes.len() != rows * row_bytes {
            return Err(bad(format!("{} bytes of {dtype}", bytes.len())));
        }
        Ok(Matrix {
            dtype,
            rows,
            cols,
            row_bytes,
            bytes,
        })
    }
}

/// One transformer block, its matrices as stored.
pub type LayerWeights = crate::model::LayerWeights<Matrix>;

/// The model, its matrices as stored (`ModelWeights::load` takes them).
pub type FastWeights = ModelWeights<Matrix>;

/// The fast backend's matrices: the stored bytes, checked to be whole rows of blocks.
impl MatrixFormat for Matrix {
    fn take(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        matrix(w, name, rows, cols)
    }

    fn reorder_heads(mut self, n_heads: usize, order: &HeadOrder) -> Matrix {
        // A row of stored bytes moves as a row of floats does.
        self.bytes = reorder_rows(&self.bytes, n_heads, order);
        self
    }
}

impl ModelWeights<Matrix> {
    fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let layers = self.layers.iter().flat_map(|l| l.matrices());
        std::iter::once(&self.embed)
            .chain(self.lm_head.as_ref())
            .chain(layers)
    }

    fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        let layers = self.layers.iter().flat_map(|l| l.vectors());
        std::iter::once(&self.final_norm)
            .chain(self.rope_freq_factors.as_ref())
            .chain(layers)
    }

    /// Bytes this backend holds for the weights: every matrix as stored, every vector in f32.
    pub fn held_bytes(&self) -> usize {
        self.matrices().map(|m| m.bytes.len()).sum::<usize>()
            + self.vectors().map(|v| 4 * v.len()).sum::<usize>()
    }

    /// Bytes a forward pass reads from the weights: every matrix and vector once, the head
    /// once; the embedding only for the rows it looks up, counted as none (unless tied).
    pub fn bytes_per_step(&self) -> usize {
        let embed = if self.lm_head.is_none() {
            0 // read as the head, counted there
        } else {
            self.embed.bytes.len()
        };
        self.held_bytes() - embed - 4 * self.rope_freq_factors.as_ref().map_or(0, |f| f.len())
    }
}

/// The tensor `name`, `[rows, cols]`, its bytes copied as stored.
fn matrix(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
    let t = w.tensors.get(name).ok_or_else(|| Error::MissingWeight {
        name: name.to_owned(),
    })?;
    if t.shape != [rows, cols] {
        return Err(Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}]"),
            found: format!("{:?} {}", t.shape, t.dtype),
        });
    }
    let bytes = w
        .files
        .get(t.file)
        .and_then(|f| f.get(t.offset..t.offset.checked_add(t.n_bytes)?))
        .ok_or_else(|| Error::WeightMismatch {
            name: name.to_owned(),
            want: format!("[{rows}, {cols}]"),
            found: format!("bytes {}.. outside its file", t.offset),
        })?;
    Matrix::new(name, t.dtype, rows, cols, bytes.to_vec())
}
