//! Hugging Face folders: the safetensors shards (header JSON, header length, bytes) and
//! their index, and config.json.

use std::path::{Path, PathBuf};
use std::time::Instant;

use libtest_mimic::Failed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::tiny;
use crate::tally::{Tally, load_and_run};
use crate::values::{
    flip, interesting, json_value, mutate_text, mutate_tree, pick, read_le, truncate,
};

/// A folder holding the valid tiny model; each case replaces one file and puts it back.
pub(crate) struct Folder {
    dir: PathBuf,
    files: Vec<(String, Vec<u8>)>,
}

impl Folder {
    pub(crate) fn new(tag: &str) -> Folder {
        let dir = tiny::scratch_dir(tag);
        let files = tiny::hf_files();
        for (name, bytes) in &files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        Folder { dir, files }
    }

    pub(crate) fn original(&self, name: &str) -> &[u8] {
        &self.files.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Runs `case` with `name` holding `bytes` (or removed, for `None`), then restores it.
    pub(crate) fn with<T>(
        &self,
        name: &str,
        bytes: Option<&[u8]>,
        case: impl FnOnce(&Path) -> T,
    ) -> T {
        let path = self.dir.join(name);
        match bytes {
            Some(b) => std::fs::write(&path, b).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        let out = case(&self.dir);
        std::fs::write(&path, self.original(name)).unwrap();
        out
    }
}

pub(crate) fn safetensors_cases(n: usize) -> Result<(), Failed> {
    let started = Instant::now();
    let folder = Folder::new("mutation-st");
    let shards = tiny::hf_shards();
    let mut tally = Tally::default();
    for case in 0..n {
        let seed = 2_000_000 + case as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let s = rng.random_range(0..2);
        let shard_name = tiny::SHARDS[s];
        let shard = &shards[s];
        let (file, bytes, what): (&str, Option<Vec<u8>>, String) = match rng.random_range(0..12) {
            // The header as JSON: dtypes, shapes, offsets, entries.
            0..=4 => {
                let mut header = tiny::st_header(shard);
                let names: Vec<String> = shard.iter().map(|t| t.name.clone()).collect();
                let t = pick(&mut rng, &names).clone();
                let what = match rng.random_range(0..7) {
                    0 => {
                        let d = *pick(
                            &mut rng,
                            &[
                                "F64", "I64", "I8", "U8", "BOOL", "F8_E4M3", "XX", "F32", "F16",
                            ],
                        );
                        header[&t]["dtype"] = json!(d);
                        format!("{t}: dtype {d}")
                    }
                    1 => {
                        let shape = header[&t]["shape"].as_array().unwrap().clone();
                        let mut shape: Vec<u64> =
                            shape.iter().map(|v| v.as_u64().unwrap()).collect();
                        match rng.random_range(0..4) {
                            0 => shape.reverse(),
                            1 => shape.push(1),
                            2 => shape.clear(),
                            _ => {
                                let k = rng.random_range(0..shape.len());
                                shape[k] = interesting(&mut rng, shape[k]);
                            }
                        }
                        header[&t]["shape"] = json!(shape);
                        format!("{t}: shape {shape:?}")
                    }
                    2 => {
                        let k = rng.random_range(0..2);
                        let v = header[&t]["data_offsets"][k].as_u64().unwrap();
                        let new = interesting(&mut rng, v);
                        header[&t]["data_offsets"][k] = json!(new);
                        format!("{t}: data_offsets[{k}] {v} -> {new}")
                    }
                    3 => {
                        header.as_object_mut().unwrap().remove(&t);
                        format!("{t} removed")
                    }
                    4 => {
                        // A name the other shard has: the same weight in two files.
                        let other = &shards[1 - s];
                        let o = pick(&mut rng, other).name.clone();
                        let entry = header.as_object_mut().unwrap().remove(&t).unwrap();
                        header[&o] = entry;
                        format!("{t} renamed {o}, which the other shard holds")
                    }
                    5 => {
                        header["__metadata__"] = json_value(&mut rng, &Value::Null);
                        "__metadata__ replaced".into()
                    }
                    _ => {
                        let d = mutate_tree(&mut rng, &mut header, &[]);
                        format!("header: {d}")
                    }
                };
                let bytes = tiny::st_file(&header.to_string(), shard);
                (shard_name, Some(bytes), what)
            }
            // The header length.
            5 => {
                let mut bytes = folder.original(shard_name).to_vec();
                let v = interesting(&mut rng, read_le(&bytes[..8]));
                bytes[..8].copy_from_slice(&v.to_le_bytes());
                (shard_name, Some(bytes), format!("header length {v}"))
            }
            6..=8 => {
                let mut bytes = folder.original(shard_name).to_vec();
                let header = read_le(&bytes[..8]) as usize + 8;
                let what = if rng.random_bool(0.5) {
                    truncate(&mut rng, &mut bytes)
                } else {
                    flip(&mut rng, &mut bytes, header)
                };
                (shard_name, Some(bytes), what)
            }
            // The index.
            _ => {
                let name = "model.safetensors.index.json";
                let mut idx: Value = serde_json::from_slice(folder.original(name)).unwrap();
                let what = match rng.random_range(0..6) {
                    0 => {
                        let paths = [
                            "missing.safetensors",
                            "../model.safetensors",
                            "/etc/hostname",
                            "",
                            ".",
                            tiny::SHARDS[0],
                        ];
                        let p = *pick(&mut rng, &paths);
                        let keys: Vec<String> = idx["weight_map"]
                            .as_object()
                            .unwrap()
                            .keys()
                            .cloned()
                            .collect();
                        let k = pick(&mut rng, &keys).clone();
                        idx["weight_map"][&k] = json!(p);
                        format!("index: {k} in {p:?}")
                    }
                    1 => {
                        idx["weight_map"] = json_value(&mut rng, &Value::Null);
                        format!("index: weight_map = {}", idx["weight_map"])
                    }
                    2 => {
                        idx.as_object_mut().unwrap().remove("weight_map");
                        "index: no weight_map".into()
                    }
                    3 => {
                        let mut bytes = idx.to_string().into_bytes();
                        let d = mutate_text(&mut rng, &mut bytes);
                        return_case(&mut tally, &folder, seed, name, Some(bytes), d);
                        continue;
                    }
                    4 => {
                        return_case(
                            &mut tally,
                            &folder,
                            seed,
                            name,
                            None,
                            "index removed".into(),
                        );
                        continue;
                    }
                    _ => format!("index: {}", mutate_tree(&mut rng, &mut idx, &[])),
                };
                (name, Some(idx.to_string().into_bytes()), what)
            }
        };
        return_case(&mut tally, &folder, seed, file, bytes, what);
    }
    tally.finish("safetensors", started)
}

/// Runs one folder case: `file` replaced by `bytes` (or removed), the folder loaded and run.
pub(crate) fn return_case(
    tally: &mut Tally,
    folder: &Folder,
    seed: u64,
    file: &str,
    bytes: Option<Vec<u8>>,
    what: String,
) {
    let name = format!("{file} seed {seed}: {what}");
    folder.with(file, bytes.as_deref(), |dir| {
        tally.run(name, || load_and_run(dir));
    });
}

pub(crate) const CONFIG_FIELDS: [&str; 28] = [
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "attention_bias",
    "sliding_window",
    "use_sliding_window",
    "bos_token_id",
    "eos_token_id",
    "torch_dtype",
    "layer_types",
    "sliding_window_pattern",
    "query_pre_attn_scalar",
    "rope_local_base_freq",
    "hidden_activation",
    "final_logit_softcapping",
    "text_config",
];

pub(crate) fn config_cases(n: usize) -> Result<(), Failed> {
    let started = Instant::now();
    let folder = Folder::new("mutation-config");
    let mut tally = Tally::default();
    let rope_parts = [
        json!({"rope_type": "linear", "factor": 0.5}),
        json!({"rope_type": "linear", "factor": 4.0}),
        json!({"type": "linear"}),
        json!({"rope_type": "yarn", "factor": 4.0}),
        json!({"rope_type": "dynamic", "factor": 2.0}),
        json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 16}),
        json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 0}),
        json!({"rope_type": "default", "rope_theta": 0.0}),
        json!({"rope_type": "default", "rope_theta": -1.0}),
    ];
    for case in 0..n {
        let seed = 3_000_000 + case as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cfg = tiny::hf_config();
        let mut what = vec![];
        let mut bytes = None;
        for _ in 0..rng.random_range(1..=3) {
            let field = *pick(&mut rng, &CONFIG_FIELDS);
            what.push(match rng.random_range(0..11) {
                10 => {
                    // Every head count and the head width at once: products that wrap
                    // to zero or to the real widths.
                    let v = *pick(&mut rng, &[1u64 << 32, 1 << 62, (1 << 62) + 4, 1 << 63]);
                    for f in ["num_attention_heads", "num_key_value_heads", "head_dim"] {
                        cfg[f] = json!(v);
                    }
                    format!("heads, kv heads and head_dim = {v}")
                }
                0..=4 => {
                    let v = json_value(&mut rng, &cfg[field]);
                    let d = format!("{field} = {v}");
                    cfg[field] = v;
                    d
                }
                5 => {
                    cfg.as_object_mut().unwrap().remove(field);
                    format!("{field} removed")
                }
                6 => {
                    let key = *pick(&mut rng, &["rope_scaling", "rope_parameters"]);
                    let p = pick(&mut rng, &rope_parts).clone();
                    let d = format!("{key} = {p}");
                    cfg[key] = p;
                    d
                }
                7 => {
                    let v = pick(
                        &mut rng,
                        &[
                            json!(["MistralForCausalLM"]),
                            json!(["Qwen2ForCausalLM"]),
                            json!(["GPT2LMHeadModel"]),
                            json!(["Gemma3ForCausalLM"]),
                            json!(["Gemma3ForConditionalGeneration"]),
                            json!([]),
                            json!([""]),
                            json!("LlamaForCausalLM"),
                        ],
                    )
                    .clone();
                    let d = format!("architectures = {v}");
                    cfg["architectures"] = v;
                    d
                }
                8 => format!("tree: {}", mutate_tree(&mut rng, &mut cfg, &rope_parts)),
                _ => {
                    let mut b = cfg.to_string().into_bytes();
                    let d = mutate_text(&mut rng, &mut b);
                    bytes = Some(b);
                    d
                }
            });
            if bytes.is_some() {
                break;
            }
        }
        let bytes = bytes.unwrap_or_else(|| cfg.to_string().into_bytes());
        return_case(
            &mut tally,
            &folder,
            seed,
            "config.json",
            Some(bytes),
            what.join("; "),
        );
    }
    tally.finish("config", started)
}
