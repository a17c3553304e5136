//! Weights from disk, taken by name, dtype and shape.
//!
//! Both formats reduce to the same thing: memory-mapped files and a table from Hugging Face
//! tensor names to (file, byte range, dtype, shape). GGUF names are translated to Hugging Face
//! names when the table is built, so the model asks for `model.layers.3.mlp.down_proj.weight`
//! whatever the file.

pub mod blocks;
pub mod dequant;
pub(crate) mod dequant_k;
pub mod dtype;
pub mod fused;
pub mod gguf;
pub mod safetensors;

use std::collections::HashMap;

use memmap2::Mmap;

pub use dtype::DType;

use crate::error::{Error, Result};

/// Where one tensor's bytes are, and what they hold.
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// Index into `Weights::files`.
    pub file: usize,
    pub offset: usize,
    pub n_bytes: usize,
    pub dtype: DType,
    /// Outermost dimension first, as Hugging Face and PyTorch write it: `[out, in]`.
    pub shape: Vec<usize>,
}

pub struct Weights {
    pub files: Vec<Mmap>,
    pub tensors: HashMap<String, RawTensor>,
}

impl Weights {
    /// The tensors by type: (dtype, how many, bytes in the files), the most bytes first.
    pub fn by_type(&self) -> Vec<(DType, usize, usize)> {
        let mut types: Vec<(DType, usize, usize)> = vec![];
        for t in self.tensors.values() {
            match types.iter_mut().find(|(d, _, _)| *d == t.dtype) {
                Some((_, n, bytes)) => {
                    *n += 1;
                    *bytes += t.n_bytes;
                }
                None => types.push((t.dtype, 1, t.n_bytes)),
            }
        }
        types.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.cmp(&b.1)));
        types
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name` as f32, checked to have exactly `shape`.
    pub fn take(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.take_optional(name, shape)?
            .ok_or_else(|| Error::MissingWeight {
                name: name.to_owned(),
            })
    }

    /// Checks that `name` is there (or, unless `required`, absent) with exactly `shape` and a
    /// dtype rustle reads, without reading it: the whole model is checked this way before
    /// anything is allocated.
    pub fn check(&self, name: &str, shape: &[usize], required: bool) -> Result<()> {
        match self.tensors.get(name) {
            None if required => Err(Error::MissingWeight {
                name: name.to_owned(),
            }),
            None => Ok(()),
            Some(t) if t.shape != shape || !t.dtype.is_loadable() => Err(mismatch(name, shape, t)),
            Some(_) => Ok(()),
        }
    }

    /// As `take`, but a tensor the files do not have is `None` (biases, an untied head).
    pub fn take_optional(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.tensors.get(name) else {
            return Ok(None);
        };
        if t.shape != shape || !t.dtype.is_loadable() {
            return Err(mismatch(name, shape, t));
        }
        let bytes = self
            .files
            .get(t.file)
            .and_then(|f| f.get(t.offset..t.offset.checked_add(t.n_bytes)?))
            .ok_or_else(|| Error::WeightMismatch {
                name: name.to_owned(),
                want: format!("{shape:?}"),
                found: format!("bytes {}.. outside its file", t.offset),
            })?;
        let n = shape.iter().product();
        dequant::to_f32(t.dtype, bytes, n)
            .map(Some)
            .map_err(|reason| Error::WeightMismatch {
                name: name.to_owned(),
                want: format!("{shape:?}"),
                found: reason,
            })
    }
}

fn mismatch(name: &str, shape: &[usize], t: &RawTensor) -> Error {
    let mut found = format!("{:?} {}", t.shape, t.dtype);
    if !t.dtype.is_loadable() {
        let reads: Vec<String> = DType::LOADABLE.iter().map(|d| d.to_string()).collect();
        found += &format!(
            ", which rustle does not read (it reads: {})",
            reads.join(", ")
        );
    }
    Error::WeightMismatch {
        name: name.to_owned(),
        want: format!("{shape:?}"),
        found,
    }
}
