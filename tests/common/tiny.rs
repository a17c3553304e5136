//! Tiny models built in code, for tests that break them on purpose: a Llama GGUF file (its
//! vocabulary, byte-level BPE or SentencePiece, in the metadata) and a Hugging Face folder
//! (config.json, tokenizer.json, tokenizer_config.json, two safetensors shards and their
//! index). Everything is small (hidden 32, 2 layers, about 260 tokens) so that a test can
//! write and load thousands of variants.
//!
//! The GGUF writer records where it put each header field (counts, lengths, types, dims,
//! offsets), so that a mutation can change exactly one of them.

use half::{bf16, f16};
use serde_json::{Value, json};

pub const DIM: usize = 32;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 8;
pub const KV_DIM: usize = KV_HEADS * HEAD_DIM;
pub const FFN: usize = 48;
pub const LAYERS: usize = 2;
pub const CONTEXT: usize = 64;

/// GGML type ids.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q8_0: u32 = 8;

/// A GGUF metadata value.
#[derive(Clone, Debug)]
pub enum Meta {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// Item type id, items (all of that type).
    Array(u32, Vec<Meta>),
}

impl Meta {
    pub fn type_id(&self) -> u32 {
        match self {
            Meta::U8(_) => 0,
            Meta::U32(_) => 4,
            Meta::I32(_) => 5,
            Meta::F32(_) => 6,
            Meta::Bool(_) => 7,
            Meta::Str(_) => 8,
            Meta::Array(..) => 9,
            Meta::U64(_) => 10,
            Meta::F64(_) => 12,
        }
    }

    pub fn strs(items: &[&str]) -> Meta {
        Meta::Array(8, items.iter().map(|s| Meta::Str(s.to_string())).collect())
    }
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    /// Fastest first, as GGUF lists them.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
    /// Written in place of the offset the writer would choose.
    pub offset: Option<u64>,
}

/// A GGUF file as its parts, to be changed before it is written.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub meta: Vec<(String, Meta)>,
    pub tensors: Vec<Tensor>,
    /// The alignment the writer pads to (what `general.alignment` should say).
    pub alignment: usize,
}

/// What a header field is, for mutations that pick values it could plausibly hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    Count,
    StrLen,
    ValueType,
    ArrayLen,
    Value,
    NDims,
    Dim,
    TensorType,
    Offset,
}

/// A header field where the writer put it.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub at: usize,
    pub width: usize,
    pub kind: FieldKind,
}

struct Out {
    bytes: Vec<u8>,
    fields: Vec<Field>,
}

impl Out {
    fn put(&mut self, kind: FieldKind, bytes: &[u8]) {
        self.fields.push(Field {
            at: self.bytes.len(),
            width: bytes.len(),
            kind,
        });
        self.bytes.extend_from_slice(bytes);
    }
    fn str(&mut self, s: &str) {
        self.put(FieldKind::StrLen, &(s.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(s.as_bytes());
    }
    fn value(&mut self, m: &Meta) {
        use FieldKind::Value;
        match m {
            Meta::U8(v) => self.put(Value, &[*v]),
            Meta::U32(v) => self.put(Value, &v.to_le_bytes()),
            Meta::I32(v) => self.put(Value, &v.to_le_bytes()),
            Meta::U64(v) => self.put(Value, &v.to_le_bytes()),
            Meta::F32(v) => self.put(Value, &v.to_le_bytes()),
            Meta::F64(v) => self.put(Value, &v.to_le_bytes()),
            Meta::Bool(v) => self.put(Value, &[*v as u8]),
            Meta::Str(s) => self.str(s),
            Meta::Array(ty, items) => {
                self.put(FieldKind::ValueType, &ty.to_le_bytes());
                self.put(FieldKind::ArrayLen, &(items.len() as u64).to_le_bytes());
                for item in items {
                    self.value(item);
                }
            }
        }
    }
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Meta> {
        self.meta.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Replaces `key`'s value, or adds it.
    pub fn set(&mut self, key: &str, value: Meta) -> &mut Self {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.meta.push((key.to_owned(), value)),
        }
        self
    }

    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.meta.retain(|(k, _)| k != key);
        self
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut Tensor {
        self.tensors.iter_mut().find(|t| t.name == name).unwrap()
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.write().0
    }

    /// The file, and where each header field is in it.
    pub fn write(&self) -> (Vec<u8>, Vec<Field>) {
        let mut o = Out {
            bytes: b"GGUF".to_vec(),
            fields: vec![],
        };
        o.put(FieldKind::Value, &self.version.to_le_bytes());
        o.put(FieldKind::Count, &(self.tensors.len() as u64).to_le_bytes());
        o.put(FieldKind::Count, &(self.meta.len() as u64).to_le_bytes());
        for (k, v) in &self.meta {
            o.str(k);
            o.put(FieldKind::ValueType, &v.type_id().to_le_bytes());
            o.value(v);
        }
        let align = self.alignment.max(1);
        let mut data: Vec<u8> = vec![];
        for t in &self.tensors {
            while !data.len().is_multiple_of(align) {
                data.push(0);
            }
            o.str(&t.name);
            o.put(FieldKind::NDims, &(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                o.put(FieldKind::Dim, &d.to_le_bytes());
            }
            o.put(FieldKind::TensorType, &t.ggml_type.to_le_bytes());
            let offset = t.offset.unwrap_or(data.len() as u64);
            o.put(FieldKind::Offset, &offset.to_le_bytes());
            data.extend_from_slice(&t.data);
        }
        while !o.bytes.len().is_multiple_of(align) {
            o.bytes.push(0);
        }
        o.bytes.extend_from_slice(&data);
        (o.bytes, o.fields)
    }
}

/// Deterministic values in about ±0.5: the same model every run.
pub fn values(seed: u32, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

pub fn encode(ggml_type: u32, v: &[f32]) -> Vec<u8> {
    match ggml_type {
        F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        F16 => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        Q8_0 => v
            .chunks(32)
            .flat_map(|block| {
                let max = block.iter().fold(0f32, |m, x| m.max(x.abs()));
                let d = max / 127.0;
                let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                out.extend(block.iter().map(|x| {
                    if d == 0.0 {
                        0
                    } else {
                        (x / d).round() as i8 as u8
                    }
                }));
                out
            })
            .collect(),
        other => panic!("no encoder for ggml type {other}"),
    }
}

/// GPT-2's byte-level alphabet: the printable byte values stand for themselves, the rest are
/// moved past 255 in order (so a space is 'Ġ').
pub fn byte_level_alphabet() -> Vec<String> {
    let mut next = 256;
    (0..=255u32)
        .map(|b| {
            let printable =
                (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

pub const MERGES: [&str; 4] = ["Ġ t", "h e", "l l", "Ġt he"];
pub const END: &str = "<|end|>";

/// The byte-level BPE vocabulary: 256 bytes, one token per merge, then `<|end|>`.
pub fn bpe_tokens() -> Vec<String> {
    let mut t = byte_level_alphabet();
    t.extend(MERGES.iter().map(|m| m.replace(' ', "")));
    t.push(END.into());
    t
}

pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// One Llama model's tensors, GGUF-named; `vocab` rows in the embedding and head.
fn gguf_tensors(vocab: usize, untied: bool, rope_freqs: bool) -> Vec<Tensor> {
    let mut seed = 0;
    let mut t = |name: &str, dims: &[usize], ty: u32| {
        seed += 1;
        let n = dims.iter().product();
        let v = if dims.len() == 1 {
            vec![1.0; n] // norms
        } else {
            values(seed, n)
        };
        Tensor {
            name: name.into(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            ggml_type: ty,
            data: encode(ty, &v),
            offset: None,
        }
    };
    let mut out = vec![t("token_embd.weight", &[DIM, vocab], Q8_0)];
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        out.extend([
            t(&n("attn_norm"), &[DIM], F32),
            t(&n("attn_q"), &[DIM, HEADS * HEAD_DIM], F16),
            t(&n("attn_k"), &[DIM, KV_DIM], Q8_0),
            t(&n("attn_v"), &[DIM, KV_DIM], F32),
            t(&n("attn_output"), &[HEADS * HEAD_DIM, DIM], F16),
            t(&n("ffn_norm"), &[DIM], F32),
            t(&n("ffn_gate"), &[DIM, FFN], Q8_0),
            t(&n("ffn_up"), &[DIM, FFN], F16),
            t(&n("ffn_down"), &[FFN, DIM], F32),
        ]);
    }
    out.push(t("output_norm.weight", &[DIM], F32));
    if untied {
        out.push(t("output.weight", &[DIM, vocab], F16));
    }
    if rope_freqs {
        out.push(t("rope_freqs.weight", &[HEAD_DIM / 2], F32));
    }
    out
}

fn llama_meta(g: &mut Gguf) {
    for (k, v) in [
        ("general.architecture", Meta::Str("llama".into())),
        ("general.alignment", Meta::U32(32)),
        ("llama.block_count", Meta::U32(LAYERS as u32)),
        ("llama.context_length", Meta::U32(CONTEXT as u32)),
        ("llama.embedding_length", Meta::U32(DIM as u32)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.attention.head_count", Meta::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Meta::U32(KV_HEADS as u32)),
        ("llama.attention.key_length", Meta::U32(HEAD_DIM as u32)),
        ("llama.attention.value_length", Meta::U32(HEAD_DIM as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
    ] {
        g.set(k, v);
    }
}

/// A Llama GGUF with a byte-level BPE vocabulary (GGUF tokenizer model `gpt2`), an untied
/// head, `rope_freqs.weight` and a chat template.
pub fn gguf_bpe() -> Gguf {
    let tokens = bpe_tokens();
    let mut g = Gguf {
        version: 3,
        meta: vec![],
        tensors: gguf_tensors(tokens.len(), true, true),
        alignment: 32,
    };
    llama_meta(&mut g);
    let types = (0..tokens.len())
        .map(|i| Meta::I32(if i + 1 == tokens.len() { 3 } else { 1 }))
        .collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    g.set("tokenizer.ggml.model", Meta::Str("gpt2".into()))
        .set("tokenizer.ggml.pre", Meta::Str("smollm".into()))
        .set("tokenizer.ggml.tokens", Meta::strs(&tokens))
        .set("tokenizer.ggml.token_type", Meta::Array(5, types))
        .set("tokenizer.ggml.merges", Meta::strs(&MERGES))
        .set(
            "tokenizer.ggml.eos_token_id",
            Meta::U32(tokens.len() as u32 - 1),
        )
        .set("tokenizer.ggml.add_bos_token", Meta::Bool(false))
        .set("tokenizer.chat_template", Meta::Str(CHAT_TEMPLATE.into()));
    g
}

/// A Llama GGUF with a SentencePiece vocabulary (GGUF tokenizer model `llama`: scores, byte
/// tokens) and a head tied to the embedding.
pub fn gguf_spm() -> Gguf {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    let pieces = [
        "\u{2581}",
        "h",
        "e",
        "l",
        "o",
        "\u{2581}h",
        "he",
        "ll",
        "\u{2581}he",
        "llo",
    ];
    tokens.extend(pieces.iter().map(|p| p.to_string()));
    let types: Vec<Meta> = (0..tokens.len())
        .map(|i| {
            Meta::I32(match i {
                0 => 2,
                1 | 2 => 3,
                3..=258 => 6,
                _ => 1,
            })
        })
        .collect();
    let scores: Vec<Meta> = (0..tokens.len())
        .map(|i| Meta::F32(if i < 259 { 0.0 } else { -(i as f32) }))
        .collect();
    let mut g = Gguf {
        version: 3,
        meta: vec![],
        tensors: gguf_tensors(tokens.len(), false, false),
        alignment: 32,
    };
    llama_meta(&mut g);
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    g.set("tokenizer.ggml.model", Meta::Str("llama".into()))
        .set("tokenizer.ggml.tokens", Meta::strs(&tokens))
        .set("tokenizer.ggml.token_type", Meta::Array(5, types))
        .set("tokenizer.ggml.scores", Meta::Array(6, scores))
        .set("tokenizer.ggml.bos_token_id", Meta::U32(1))
        .set("tokenizer.ggml.eos_token_id", Meta::U32(2))
        .set("tokenizer.ggml.unknown_token_id", Meta::U32(0));
    g
}

/// One safetensors tensor: name, dtype as the header spells it, shape, data.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// The header of a safetensors file as JSON, offsets laid out back to back.
pub fn st_header(tensors: &[StTensor]) -> Value {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, at + t.data.len()]}),
        );
        at += t.data.len();
    }
    Value::Object(header)
}

/// A safetensors file: 8-byte header length, the header (padded to 8 bytes), the data.
pub fn st_file(header: &str, tensors: &[StTensor]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    for t in tensors {
        out.extend(&t.data);
    }
    out
}

fn st_tensor(name: &str, dtype: &str, shape: &[usize], seed: u32) -> StTensor {
    let n = shape.iter().product();
    let v = if shape.len() == 1 && !name.ends_with("bias") {
        vec![1.0; n]
    } else {
        values(seed, n)
    };
    let data = match dtype {
        "BF16" => v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        "F16" => encode(F16, &v),
        _ => encode(F32, &v),
    };
    StTensor {
        name: name.into(),
        dtype: dtype.into(),
        shape: shape.to_vec(),
        data,
    }
}

/// The two shards of the Hugging Face model: the embedding and layer 0, then layer 1, the
/// final norm and the head.
pub fn hf_shards() -> [Vec<StTensor>; 2] {
    let vocab = bpe_tokens().len();
    let mut seed = 100;
    let mut shards = [vec![], vec![]];
    let mut add = |shard: usize, name: String, dtype: &str, shape: &[usize]| {
        seed += 1;
        shards[shard].push(st_tensor(&name, dtype, shape, seed));
    };
    add(0, "model.embed_tokens.weight".into(), "BF16", &[vocab, DIM]);
    for l in 0..LAYERS {
        let n = |s: &str| format!("model.layers.{l}.{s}");
        let q = HEADS * HEAD_DIM;
        add(l, n("input_layernorm.weight"), "F32", &[DIM]);
        add(l, n("self_attn.q_proj.weight"), "BF16", &[q, DIM]);
        add(l, n("self_attn.q_proj.bias"), "F32", &[q]);
        add(l, n("self_attn.k_proj.weight"), "F16", &[KV_DIM, DIM]);
        add(l, n("self_attn.k_proj.bias"), "F32", &[KV_DIM]);
        add(l, n("self_attn.v_proj.weight"), "F32", &[KV_DIM, DIM]);
        add(l, n("self_attn.v_proj.bias"), "BF16", &[KV_DIM]);
        add(l, n("self_attn.o_proj.weight"), "BF16", &[DIM, q]);
        add(l, n("post_attention_layernorm.weight"), "F32", &[DIM]);
        add(l, n("mlp.gate_proj.weight"), "BF16", &[FFN, DIM]);
        add(l, n("mlp.up_proj.weight"), "F16", &[FFN, DIM]);
        add(l, n("mlp.down_proj.weight"), "BF16", &[DIM, FFN]);
    }
    add(1, "model.norm.weight".into(), "F32", &[DIM]);
    add(1, "lm_head.weight".into(), "BF16", &[vocab, DIM]);
    shards
}

pub const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

pub fn hf_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": DIM, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": bpe_tokens().len(), "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5, "attention_bias": true, "tie_word_embeddings": false,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16},
        "bos_token_id": null, "eos_token_id": bpe_tokens().len() - 1
    })
}

/// A byte-level BPE `tokenizer.json` over `bpe_tokens()`.
pub fn hf_tokenizer() -> Value {
    let tokens = bpe_tokens();
    let vocab: serde_json::Map<String, Value> = tokens[..tokens.len() - 1]
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": tokens.len() - 1, "content": END, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": MERGES}
    })
}

/// Every file of the Hugging Face folder, by name.
pub fn hf_files() -> Vec<(String, Vec<u8>)> {
    let shards = hf_shards();
    let mut weight_map = serde_json::Map::new();
    for (shard, name) in shards.iter().zip(SHARDS) {
        for t in shard {
            weight_map.insert(t.name.clone(), json!(name));
        }
    }
    let mut files = vec![
        (
            "config.json".to_owned(),
            hf_config().to_string().into_bytes(),
        ),
        (
            "tokenizer.json".to_owned(),
            hf_tokenizer().to_string().into_bytes(),
        ),
        (
            "tokenizer_config.json".to_owned(),
            json!({"bos_token": null, "eos_token": END, "chat_template": CHAT_TEMPLATE})
                .to_string()
                .into_bytes(),
        ),
        (
            "model.safetensors.index.json".to_owned(),
            json!({"metadata": {}, "weight_map": weight_map})
                .to_string()
                .into_bytes(),
        ),
    ];
    for (shard, name) in shards.iter().zip(SHARDS) {
        files.push((
            name.to_owned(),
            st_file(&st_header(shard).to_string(), shard),
        ));
    }
    files
}

/// A fresh empty folder under the temporary directory.
pub fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rustle-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes the Hugging Face folder into `dir`.
pub fn write_hf_folder(dir: &std::path::Path) {
    for (name, bytes) in hf_files() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
