//! Hugging Face model folders: `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. The `safetensors` crate validates each header (its length,
//! its JSON, every tensor's byte range); we keep only where each tensor lives.

use std::collections::HashMap;
use std::path::Path;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::{DType, RawTensor, Weights};
use crate::error::{Error, Result};

#[derive(Deserialize)]
struct Index {
    weight_map: HashMap<String, String>,
}

/// Opens the safetensors files of the model folder `dir`.
pub fn open_folder(dir: &Path) -> Result<Weights> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<String> = if single.is_file() {
        vec!["model.safetensors".into()]
    } else if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let idx: Index = serde_json::from_str(&text).map_err(|e| Error::Format {
            path: index.clone(),
            format: "safetensors index",
            reason: e.to_string(),
        })?;
        let mut names: Vec<String> = idx.weight_map.into_values().collect();
        names.sort();
        names.dedup();
        // Shards live beside the index: a path that leaves the folder is not one of them.
        if let Some(bad) = names.iter().find(|n| {
            let p = Path::new(n.as_str());
            n.is_empty()
                || p.is_absolute()
                || p.components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
        }) {
            return Err(Error::Format {
                path: index.clone(),
                format: "safetensors index",
                reason: format!("shard {bad:?} is not a file name in the model's folder"),
            });
        }
        names
    } else {
        return Err(Error::Usage(format!(
            "{}: no model.safetensors or model.safetensors.index.json in this folder",
            dir.display()
        )));
    };

    let mut weights = Weights {
        files: vec![],
        tensors: HashMap::new(),
    };
    let mut shard_names: Vec<String> = vec![];
    for name in files {
        let path = dir.join(&name);
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: opened read-only, never written by rustle.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let st = SafeTensors::deserialize(&mmap).map_err(|e| Error::Format {
            path: path.clone(),
            format: "safetensors",
            reason: e.to_string(),
        })?;
        let file_index = weights.files.len();
        for (tensor_name, view) in st.tensors() {
            let Some(tensor_name) = language_model_name(&tensor_name) else {
                continue;
            };
            // The view borrows the mmap: its distance from the start is the file offset.
            let offset = view.data().as_ptr() as usize - mmap.as_ptr() as usize;
            let raw = RawTensor {
                file: file_index,
                offset,
                n_bytes: view.data().len(),
                dtype: dtype(view.dtype()),
                shape: view.shape().to_vec(),
            };
            if let Some(first) = weights.tensors.insert(tensor_name.clone(), raw) {
                return Err(Error::Format {
                    path: path.clone(),
                    format: "safetensors",
                    reason: format!(
                        "tensor {tensor_name:?} is also in {}: which one is meant?",
                        shard_names[first.file]
                    ),
                });
            }
        }
        shard_names.push(name);
        drop(st);
        weights.files.push(mmap);
    }
    Ok(weights)
}

/// A tensor's name as the language model's loader asks for it: a multimodal Gemma 3's
/// language model is under `language_model.model.` (or `model.language_model.` from
/// transformers 4.52) and its head under `language_model.lm_head.`; its vision tower and
/// projector (`None`) are not read. Other names are kept.
fn language_model_name(name: &str) -> Option<String> {
    const VISION: [&str; 4] = [
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    ];
    if VISION.iter().any(|p| name.starts_with(p)) {
        return None;
    }
    for (from, to) in [
        ("language_model.model.", "model."),
        ("model.language_model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    ] {
        if let Some(rest) = name.strip_prefix(from) {
            return Some(format!("{to}{rest}"));
        }
    }
    Some(name.to_owned())
}

fn dtype(d: Dtype) -> DType {
    match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F64 => DType::Other("f64"),
        Dtype::I64 => DType::Other("i64"),
        Dtype::I32 => DType::Other("i32"),
        Dtype::I16 => DType::Other("i16"),
        Dtype::I8 => DType::Other("i8"),
        Dtype::U8 => DType::Other("u8"),
        Dtype::BOOL => DType::Other("bool"),
        _ => DType::Other("an unsupported dtype"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn write(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    /// A safetensors file by hand: 8-byte header length, JSON header, data.
    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rustle-st-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_single_and_sharded_and_checks_shape() {
        let d = tmpdir("ok");
        let vals = [1.5f32, -2.0, 0.25, 8.0];
        let data: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        write(
            &d,
            "model.safetensors",
            &file(
                r#"{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#,
                &data,
            ),
        );
        let w = open_folder(&d).unwrap();
        assert_eq!(w.take("a", &[2, 2]).unwrap(), vals);
        let e = w.take("a", &[4, 1]).unwrap_err().to_string();
        assert!(
            e.contains("want [4, 1]") && e.contains("found [2, 2] bf16"),
            "{e}"
        );
        assert!(
            w.take("b", &[1])
                .unwrap_err()
                .to_string()
                .contains("missing")
        );

        let d2 = tmpdir("shards");
        let f32s: Vec<u8> = [3.0f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(
            &d2,
            "s1.safetensors",
            &file(
                r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &f32s,
            ),
        );
        write(
            &d2,
            "s2.safetensors",
            &file(
                r#"{"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &f32s,
            ),
        );
        write(
            &d2,
            "model.safetensors.index.json",
            r#"{"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}}"#.as_bytes(),
        );
        let w = open_folder(&d2).unwrap();
        assert_eq!(w.take("y", &[1]).unwrap(), vec![3.0]);
    }

    #[test]
    fn corrupt_files_are_errors() {
        let d = tmpdir("bad");
        // Header length larger than the file.
        let mut bad = file(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            &[0; 4],
        );
        bad[0..8].copy_from_slice(&1_000_000u64.to_le_bytes());
        write(&d, "model.safetensors", &bad);
        let e = open_folder(&d).err().unwrap().to_string();
        assert!(e.contains("not a valid safetensors file"), "{e}");
        // Offsets past the end of the data.
        write(
            &d,
            "model.safetensors",
            &file(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                &[0; 4],
            ),
        );
        assert!(open_folder(&d).is_err());
        // Too short to hold a header length.
        write(&d, "model.safetensors", &[1, 2, 3]);
        assert!(open_folder(&d).is_err());
        // An integer tensor is named with its dtype.
        write(
            &d,
            "model.safetensors",
            &file(
                r#"{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        );
        let e = open_folder(&d)
            .unwrap()
            .take("a", &[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("i64"), "{e}");
    }

    #[test]
    fn shards_must_not_share_tensors_or_leave_the_folder() {
        let d = tmpdir("dup");
        let f32s: Vec<u8> = [3.0f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let one = file(
            r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            &f32s,
        );
        write(&d, "s1.safetensors", &one);
        write(&d, "s2.safetensors", &one);
        write(
            &d,
            "model.safetensors.index.json",
            r#"{"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}}"#.as_bytes(),
        );
        let e = open_folder(&d).err().unwrap().to_string();
        assert!(
            e.ends_with("s2.safetensors: not a valid safetensors file: tensor \"x\" is also in s1.safetensors: which one is meant?"),
            "{e}"
        );
        for shard in ["../s1.safetensors", "/etc/hostname", ""] {
            write(
                &d,
                "model.safetensors.index.json",
                format!(r#"{{"weight_map":{{"x":"{shard}"}}}}"#).as_bytes(),
            );
            let e = open_folder(&d).err().unwrap().to_string();
            assert!(
                e.ends_with(&format!(
                    "shard {shard:?} is not a file name in the model's folder"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_multimodal_gemma3_reads_as_its_language_model() {
        let name = |n: &str| language_model_name(n);
        assert_eq!(
            name("language_model.model.layers.0.mlp.up_proj.weight").as_deref(),
            Some("model.layers.0.mlp.up_proj.weight")
        );
        assert_eq!(
            name("model.language_model.embed_tokens.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(
            name("language_model.lm_head.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(
            name("vision_tower.vision_model.post_layernorm.weight"),
            None
        );
        assert_eq!(
            name("model.multi_modal_projector.mm_input_projection_weight"),
            None
        );
        assert_eq!(
            name("model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("model.layers.3.self_attn.q_proj.weight")
        );
    }
}
