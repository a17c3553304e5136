//! A GGUF reader: the header, the metadata table and the tensor table, every length and
//! offset checked against the file before it is used, so a truncated or corrupt file is an
//! error that names the problem, never a panic.
//!
//! Layout (little-endian): magic `GGUF`, version u32 (2 or 3), tensor count u64, metadata
//! count u64, the metadata (key string, value type u32, value), the tensor infos (name string,
//! n_dims u32, dims u64 fastest first, ggml type u32, offset u64 from the data section), then
//! the data section at the next multiple of `general.alignment` (default 32). Every tensor's
//! data starts at a multiple of the alignment, and no two tensors share a byte.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::dtype::DType;
use crate::error::{Error, Result};

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::UInt(v) => Some(v),
            MetaValue::Int(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::Float(v) => Some(v),
            MetaValue::UInt(v) => Some(v as f64),
            MetaValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for messages: a value, never a whole array.
    pub fn brief(&self) -> String {
        match self {
            MetaValue::Int(v) => format!("the integer {v}"),
            MetaValue::UInt(v) => format!("the integer {v}"),
            MetaValue::Float(v) => format!("the number {v}"),
            MetaValue::Bool(v) => format!("the boolean {v}"),
            MetaValue::Str(s) if s.chars().count() > 40 => {
                format!("a string ({:?}...)", s.chars().take(40).collect::<String>())
            }
            MetaValue::Str(s) => format!("the string {s:?}"),
            MetaValue::Array(a) => format!("an array of {}", a.len()),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions as GGUF lists them: fastest-varying first (reverse for `[out, in]`).
    pub dims: Vec<usize>,
    pub dtype: DType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

pub struct GgufFile {
    /// Where it was read from, for messages.
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, MetaValue>,
    pub tensors: Vec<GgufTensor>,
    pub mmap: Mmap,
}

/// GGML's own limit on tensor rank.
const MAX_DIMS: usize = 4;

/// Tables are preallocated at most this long: a count is only a claim until the entries
/// behind it have been read.
const PREALLOCATE: usize = 1024;

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only and rustle never writes it; as with any mmap,
        // another process truncating it while we run is outside our control.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (version, metadata, tensors) = parse(&mmap).map_err(|reason| Error::Format {
            path: path.to_owned(),
            format: "GGUF",
            reason,
        })?;
        Ok(GgufFile {
            path: path.to_owned(),
            version,
            metadata,
            tensors,
            mmap,
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn data(&self, t: &GgufTensor) -> &[u8] {
        &self.mmap[t.offset..t.offset + t.n_bytes]
    }
}

type Parsed = (u32, HashMap<String, MetaValue>, Vec<GgufTensor>);

/// Parses the header and tables of a GGUF file held in `buf`.
pub fn parse(buf: &[u8]) -> std::result::Result<Parsed, String> {
    let mut r = Reader { buf, pos: 0 };
    if r.bytes(4).ok() != Some(b"GGUF".as_slice()) {
        return Err("does not start with the magic bytes GGUF".into());
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (2 and 3 are)"
        ));
    }
    let n_tensors = r.count("tensor count", 8)?;
    let n_meta = r.count("metadata count", 12)?;
    let mut metadata = HashMap::with_capacity(n_meta.min(PREALLOCATE));
    for _ in 0..n_meta {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty).map_err(|e| format!("metadata {key:?}: {e}"))?;
        if metadata.contains_key(&key) {
            return Err(format!("metadata key {key:?} appears twice"));
        }
        metadata.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a as usize,
            _ => return Err(format!("general.alignment {v:?} is not a power of two")),
        },
    };
    let mut infos = Vec::with_capacity(n_tensors.min(PREALLOCATE));
    let mut names = std::collections::HashSet::with_capacity(n_tensors.min(PREALLOCATE));
    for _ in 0..n_tensors {
        let name = r.string()?;
        if !names.insert(name.clone()) {
            return Err(format!("tensor {name:?} appears twice in the tensor table"));
        }
        let n_dims = r.u32()? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name:?}: {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = usize::try_from(r.u64()?)
                .map_err(|_| format!("tensor {name:?}: dimension too large"))?;
            if d == 0 {
                return Err(format!("tensor {name:?}: a dimension of 0"));
            }
            dims.push(d);
        }
        let type_id = r.u32()?;
        let dtype = DType::from_ggml(type_id)
            .ok_or_else(|| format!("tensor {name:?}: unknown ggml type {type_id}"))?;
        let rel = r.u64()?;
        infos.push((name, dims, dtype, rel));
    }
    let data_start = r.pos.div_ceil(alignment) * alignment;
    let mut tensors: Vec<GgufTensor> = Vec::with_capacity(infos.len());
    for (name, dims, dtype, rel) in infos {
        let n: usize = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| format!("tensor {name:?}: element count overflows"))?;
        if dims[0] % dtype.block_len() != 0 {
            return Err(format!(
                "tensor {name:?}: row of {} elements is not a whole number of {dtype} blocks of {}",
                dims[0],
                dtype.block_len()
            ));
        }
        let n_bytes = (n / dtype.block_len())
            .checked_mul(dtype.block_bytes())
            .ok_or_else(|| format!("tensor {name:?}: byte count overflows"))?;
        if rel % alignment as u64 != 0 {
            return Err(format!(
                "tensor {name:?}: data offset {rel} is not a multiple of the alignment {alignment}"
            ));
        }
        let offset = usize::try_from(rel)
            .ok()
            .and_then(|rel| data_start.checked_add(rel))
            .ok_or_else(|| format!("tensor {name:?}: offset {rel} overflows"))?;
        if offset
            .checked_add(n_bytes)
            .is_none_or(|end| end > buf.len())
        {
            return Err(format!(
                "tensor {name:?}: data at {offset}..{} runs past the end of the file ({} bytes): truncated?",
                offset as u128 + n_bytes as u128,
                buf.len()
            ));
        }
        tensors.push(GgufTensor {
            name,
            dims,
            dtype,
            offset,
            n_bytes,
        });
    }
    // Two tensors reading the same bytes is a corrupt table (a writer never shares data).
    let mut by_offset: Vec<&GgufTensor> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(format!(
                "tensors {:?} (bytes {}..{}) and {:?} (from byte {}) overlap",
                a.name,
                a.offset,
                a.offset + a.n_bytes,
                b.name,
                b.offset
            ));
        }
    }
    Ok((version, metadata, tensors))
}

/// A cursor over the file that never reads past its end.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(format!(
                "unexpected end of file at byte {} (wanted {n} more of {}): truncated?",
                self.pos,
                self.buf.len()
            )),
        }
    }
    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        Ok(self.bytes(N)?.try_into().unwrap())
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A count of items each at least `min_item_bytes` long: a count the rest of the file
    /// cannot hold is corruption, caught before it sizes an allocation.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> std::result::Result<usize, String> {
        let n = self.u64()?;
        let room = (self.buf.len() - self.pos) / min_item_bytes.max(1);
        if n > room as u64 {
            return Err(format!(
                "{what} {n} is more than the file can hold: corrupt or truncated"
            ));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let len = self.count("string length", 1)?;
        let at = self.pos;
        let b = self.bytes(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("string at byte {at} is not UTF-8"))
    }
    fn value(&mut self, ty: u32) -> std::result::Result<MetaValue, String> {
        Ok(match ty {
            0 => MetaValue::UInt(self.array::<1>()?[0] as u64),
            1 => MetaValue::Int(self.array::<1>()?[0] as i8 as i64),
            2 => MetaValue::UInt(u16::from_le_bytes(self.array()?) as u64),
            3 => MetaValue::Int(i16::from_le_bytes(self.array()?) as i64),
            4 => MetaValue::UInt(self.u32()? as u64),
            5 => MetaValue::Int(i32::from_le_bytes(self.array()?) as i64),
            6 => MetaValue::Float(f32::from_le_bytes(self.array()?) as f64),
            7 => MetaValue::Bool(self.array::<1>()?[0] != 0),
            8 => MetaValue::Str(self.string()?),
            9 => {
                let item_ty = self.u32()?;
                if item_ty == 9 {
                    return Err("nested arrays are not supported".into());
                }
                let n = self.count("array length", item_bytes(item_ty))?;
                let mut items = Vec::with_capacity(n.min(PREALLOCATE));
                for _ in 0..n {
                    items.push(self.value(item_ty)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::UInt(self.u64()?),
            11 => MetaValue::Int(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown value type {other}")),
        })
    }
}

/// The fewest bytes one metadata value of type `ty` takes: a string is at least its 8-byte
/// length.
fn item_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => 1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a GGUF file in memory: enough of the format to test the reader against.
    pub struct Writer {
        meta: Vec<u8>,
        n_meta: u64,
        infos: Vec<u8>,
        data: Vec<u8>,
        n_tensors: u64,
    }

    impl Writer {
        pub fn new() -> Self {
            Writer {
                meta: vec![],
                n_meta: 0,
                infos: vec![],
                data: vec![],
                n_tensors: 0,
            }
        }
        fn str(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        pub fn meta_u32(&mut self, k: &str, v: u32) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(4u32.to_le_bytes());
            self.meta.extend(v.to_le_bytes());
            self.n_meta += 1;
            self
        }
        pub fn meta_f32(&mut self, k: &str, v: f32) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(6u32.to_le_bytes());
            self.meta.extend(v.to_le_bytes());
            self.n_meta += 1;
            self
        }
        pub fn meta_bool(&mut self, k: &str, v: bool) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(7u32.to_le_bytes());
            self.meta.push(v as u8);
            self.n_meta += 1;
            self
        }
        pub fn meta_str(&mut self, k: &str, v: &str) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(8u32.to_le_bytes());
            Self::str(&mut self.meta, v);
            self.n_meta += 1;
            self
        }
        pub fn meta_strs(&mut self, k: &str, v: &[&str]) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(9u32.to_le_bytes());
            self.meta.extend(8u32.to_le_bytes());
            self.meta.extend((v.len() as u64).to_le_bytes());
            for s in v {
                Self::str(&mut self.meta, s);
            }
            self.n_meta += 1;
            self
        }
        pub fn meta_i32s(&mut self, k: &str, v: &[i32]) -> &mut Self {
            Self::str(&mut self.meta, k);
            self.meta.extend(9u32.to_le_bytes());
            self.meta.extend(5u32.to_le_bytes());
            self.meta.extend((v.len() as u64).to_le_bytes());
            for x in v {
                self.meta.extend(x.to_le_bytes());
            }
            self.n_meta += 1;
            self
        }
        /// A tensor of f32 values; `dims` fastest first, as GGUF lists them.
        pub fn tensor_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.tensor_raw(name, dims, 0, &bytes)
        }
        pub fn tensor_raw(&mut self, name: &str, dims: &[u64], ty: u32, bytes: &[u8]) -> &mut Self {
            while !self.data.len().is_multiple_of(32) {
                self.data.push(0);
            }
            Self::str(&mut self.infos, name);
            self.infos.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                self.infos.extend(d.to_le_bytes());
            }
            self.infos.extend(ty.to_le_bytes());
            self.infos.extend((self.data.len() as u64).to_le_bytes());
            self.data.extend(bytes);
            self.n_tensors += 1;
            self
        }
        pub fn finish(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend(self.n_tensors.to_le_bytes());
            out.extend(self.n_meta.to_le_bytes());
            out.extend(&self.meta);
            out.extend(&self.infos);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
            out.extend(&self.data);
            out
        }
    }

    fn sample() -> Vec<u8> {
        Writer::new()
            .meta_str("general.architecture", "llama")
            .meta_u32("llama.block_count", 2)
            .meta_f32("llama.rope.freq_base", 10000.0)
            .meta_strs("tokenizer.ggml.tokens", &["a", "b"])
            .tensor_f32("w", &[3, 2], &[1., 2., 3., 4., 5., 6.])
            .tensor_f32("n", &[3], &[7., 8., 9.])
            .finish()
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let buf = sample();
        let (version, meta, tensors) = parse(&buf).unwrap();
        assert_eq!(version, 3);
        assert_eq!(meta["general.architecture"].as_str(), Some("llama"));
        assert_eq!(meta["llama.block_count"].as_u64(), Some(2));
        assert_eq!(meta["llama.rope.freq_base"].as_f64(), Some(10000.0));
        assert_eq!(meta["tokenizer.ggml.tokens"].as_array().unwrap().len(), 2);
        assert_eq!(tensors[0].dims, vec![3, 2]);
        assert_eq!(tensors[0].n_bytes, 24);
        let t = &tensors[1];
        let v: Vec<f32> = buf[t.offset..t.offset + t.n_bytes]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, vec![7., 8., 9.]);
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let good = sample();
        assert!(parse(b"GGML").unwrap_err().contains("magic"));
        let mut bad_version = good.clone();
        bad_version[4] = 9;
        assert!(parse(&bad_version).unwrap_err().contains("version 9"));
        // Every truncation point is an error, whichever field it cuts.
        for len in 0..good.len() {
            assert!(parse(&good[..len]).is_err(), "truncated at {len} parsed");
        }
        // An absurd string length in the first key.
        let mut huge = good.clone();
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            parse(&huge)
                .unwrap_err()
                .contains("more than the file can hold")
        );
        // A tensor offset past the end.
        let mut past = Writer::new().tensor_raw("x", &[4], 0, &[0; 16]).finish();
        assert!(parse(&past).is_ok());
        // The one tensor info ends with its offset field: magic, version, two counts, then
        // name (8-byte length + "x"), n_dims, one dim, type, offset.
        let infos_end = 4 + 4 + 8 + 8 + (8 + 1) + 4 + 8 + 4 + 8;
        past[infos_end - 8..infos_end].copy_from_slice(&4096u64.to_le_bytes());
        assert!(parse(&past).unwrap_err().contains("past the end"));
    }

    #[test]
    fn duplicates_misalignment_overlap_and_empty_tensors_are_errors() {
        let twice = Writer::new()
            .meta_u32("a", 1)
            .meta_u32("a", 2)
            .tensor_f32("x", &[1], &[0.0])
            .finish();
        assert_eq!(
            parse(&twice).unwrap_err(),
            "metadata key \"a\" appears twice"
        );
        let twice = Writer::new()
            .tensor_f32("x", &[1], &[0.0])
            .tensor_f32("x", &[1], &[0.0])
            .finish();
        assert_eq!(
            parse(&twice).unwrap_err(),
            "tensor \"x\" appears twice in the tensor table"
        );
        let empty = Writer::new().tensor_raw("x", &[4, 0], 0, &[]).finish();
        assert_eq!(parse(&empty).unwrap_err(), "tensor \"x\": a dimension of 0");

        // Two tensors; the second's offset (the last 8 bytes of the tensor infos) moved.
        let two = || {
            Writer::new()
                .tensor_f32("x", &[8], &[0.0; 8])
                .tensor_f32("y", &[8], &[0.0; 8])
                .finish()
        };
        let infos_end = 4 + 4 + 8 + 8 + 2 * ((8 + 1) + 4 + 8 + 4 + 8);
        let mut moved = two();
        moved[infos_end - 8..infos_end].copy_from_slice(&4u64.to_le_bytes());
        assert_eq!(
            parse(&moved).unwrap_err(),
            "tensor \"y\": data offset 4 is not a multiple of the alignment 32"
        );
        let mut onto = two();
        onto[infos_end - 8..infos_end].copy_from_slice(&0u64.to_le_bytes());
        let err = parse(&onto).unwrap_err();
        assert!(
            err.starts_with("tensors \"x\"") && err.ends_with("overlap"),
            "{err}"
        );
        assert!(parse(&two()).is_ok());
    }

    #[test]
    fn types_rustle_does_not_read_are_indexed_by_name_and_undefined_ids_refused() {
        // IQ2_XXS (ggml type 16): 256 values in 66 bytes, placed in the file like any other.
        let buf = Writer::new()
            .tensor_raw("q", &[256, 2], 16, &[0; 132])
            .tensor_f32("n", &[2], &[1.0, 2.0])
            .finish();
        let (_, _, tensors) = parse(&buf).unwrap();
        assert_eq!(tensors[0].dtype.to_string(), "iq2_xxs");
        assert_eq!(tensors[0].n_bytes, 132);
        assert!(!tensors[0].dtype.is_loadable());
        // Type 4 was Q4_2, long removed from ggml: no type at all.
        let buf = Writer::new().tensor_raw("q", &[32], 4, &[0; 20]).finish();
        assert_eq!(
            parse(&buf).unwrap_err(),
            "tensor \"q\": unknown ggml type 4"
        );
    }

    #[test]
    fn counts_of_huge_arrays_are_checked_against_their_item_size() {
        // An array of 2^20 u64 values claimed in a file far too short to hold them.
        let mut w = Writer::new();
        w.meta_i32s("a", &[1]);
        let mut buf = w.finish();
        // magic, version, two counts, key ("a": 8 + 1), type, item type: then the length.
        let at = 4 + 4 + 8 + 8 + 9 + 4;
        buf[at..at + 4].copy_from_slice(&10u32.to_le_bytes());
        buf[at + 4..at + 12].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let err = parse(&buf).unwrap_err();
        assert!(err.contains("more than the file can hold"), "{err}");
    }
}
